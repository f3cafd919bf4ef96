"""The slice of a Kineto event that the analyses read, as msgspec Structs.

Decoding into these Structs skips every other field while parsing, which is several times faster than
building Python dicts for whole events. Numeric fields accept strings as well: some producers write
``"stream": "0x0"`` or ``"size": "2560"``, and a type mismatch would otherwise fail a whole batch.
"""

from __future__ import annotations

from typing import Any, Union

import msgspec

__all__ = [
    "ANY_EVENT",
    "EMPTY_ARGS",
    "OTHER_EVENT",
    "Complete",
    "Event",
    "EventArgs",
    "Header",
    "Scalar",
    "decode_args",
]

Scalar = int | float | str | None


class EventArgs(msgspec.Struct, gc=False):
    """``args`` of an event: only the keys the analyses use."""

    # Absent ids read as -1, as the columns hold them: a batch's column is then all ints, converted in one
    # C pass (`perfgate.traces.reading.table._ints`).
    stream: Scalar = -1
    correlation: Scalar = -1
    device: Scalar = -1
    nbytes: Scalar = msgspec.field(default=None, name="bytes")
    size: Scalar = None
    kind: Scalar = None
    direction: Scalar = None
    flops: Scalar = None


class _Fields(msgspec.Struct, gc=False):
    """The fields read from a trace event. ``ts`` and ``dur`` are microseconds (Chrome trace convention).

    ``args`` stays raw JSON: most events' args are never read (CPU ops, metadata), and building a
    Struct for each costs a quarter of the decode time. The args of the events that need them are
    decoded later, in one call per batch (see `decode_args`).
    """

    cat: str = ""
    name: str = ""
    ts: int | float | None = None
    dur: int | float | None = None
    tid: int | str | None = None
    args: msgspec.Raw = msgspec.Raw(b"")


class Event(_Fields):
    """One trace event of any phase."""

    ph: str = ""


class Complete(_Fields, tag_field="ph", tag="X"):
    """A complete event (``"ph": "X"``), the only kind the tables keep: `Event`'s fields but ``ph``."""


_PHASES = "BEiICbneSTpFstfPNODMVvRc()"
"""The other event phases of the Chrome trace format. An event of each decodes to an empty Struct:
none of its fields is built (metadata, flow and instant events are most of some traces). A phase not
listed fails the typed decode, and its batch is read leniently (`perfgate.traces.reading.reader`)."""
_OTHERS: tuple[type[msgspec.Struct], ...] = tuple(
    msgspec.defstruct(f"Phase{i}", [], tag_field="ph", tag=ph, gc=False) for i, ph in enumerate(_PHASES)
)
ANY_EVENT: Any = Union[(Complete, *_OTHERS)]  # a union of types built at run time
"""Decodes an event as `Complete` or, for any other listed phase, an empty Struct."""
OTHER_EVENT = _OTHERS[0]()
"""Stands for an event that is not complete, where the events are read leniently."""


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
