"""The slice of a Kineto event that the analyses read, as msgspec Structs.

Decoding into these Structs skips every other field while parsing, which is several times faster than
building Python dicts for whole events. Numeric fields accept strings as well: some producers write
``"stream": "0x0"`` or ``"size": "2560"``, and a type mismatch would otherwise fail a whole batch.
"""

from __future__ import annotations

from typing import Any

import msgspec

__all__ = ["EMPTY_ARGS", "Event", "EventArgs", "Header", "Scalar", "decode_args"]

Scalar = int | float | str | None


class EventArgs(msgspec.Struct, gc=False):
    """``args`` of an event: only the keys the analyses use."""

    stream: Scalar = None
    correlation: Scalar = None
    device: Scalar = None
    nbytes: Scalar = msgspec.field(default=None, name="bytes")
    size: Scalar = None
    kind: Scalar = None
    direction: Scalar = None
    flops: Scalar = None


class Event(msgspec.Struct, gc=False):
    """One trace event. ``ts`` and ``dur`` are microseconds (Chrome trace convention).

    ``args`` stays raw JSON: most events' args are never read (CPU ops, metadata), and building a
    Struct for each costs a quarter of the decode time. The args of the events that need them are
    decoded later, in one call per batch (see `decode_args`).
    """

    ph: str = ""
    cat: str = ""
    name: str = ""
    ts: int | float | None = None
    dur: int | float | None = None
    tid: int | str | None = None
    args: msgspec.Raw = msgspec.Raw(b"")


class Header(msgspec.Struct):
    """Top-level keys other than ``traceEvents`` (found before or after it in the file)."""

    schema_version: Any = msgspec.field(default=None, name="schemaVersion")
    distributed_info: Any = msgspec.field(default=None, name="distributedInfo")
    device_properties: Any = msgspec.field(default=None, name="deviceProperties")
    base_time_ns: Any = msgspec.field(default=None, name="baseTimeNanoseconds")
    trace_name: Any = msgspec.field(default=None, name="traceName")


EMPTY_ARGS = EventArgs()
_ARGS_LIST = msgspec.json.Decoder(list[EventArgs])
_ARGS_ONE = msgspec.json.Decoder(EventArgs)


def decode_args(raws: list[msgspec.Raw]) -> list[EventArgs]:
    """Decode many raw ``args`` objects in one call; missing or unusable args become empty."""
    parts = [r if r else b"{}" for r in raws]
    try:
        return _ARGS_LIST.decode(b"[" + b",".join(parts) + b"]")
    except msgspec.DecodeError:
        # One event has args of an unexpected shape (a list, a nested value for a scalar key):
        # decode one by one and keep the rest.
        out: list[EventArgs] = []
        for part in parts:
            try:
                out.append(_ARGS_ONE.decode(part))
            except msgspec.DecodeError:
                out.append(EMPTY_ARGS)
        return out
