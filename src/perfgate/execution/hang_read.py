"""Read what a rank wrote when asked where it is: `faulthandler` stacks and a flight-recorder dump.

Pure functions over text the training process wrote (untrusted: sizes are capped by the caller, and a
line that is not a stack frame is ignored). Where a rank is comes from its Python stack: the innermost
frame of a ``torch.distributed`` collective names the operation, and the innermost frame outside torch
names the line of the script that called it. The flight recorder, where it was on, adds the sequence
number of the last collective each rank entered, which is what lines ranks up: rank 0 in all_reduce #8
while rank 1 is in barrier #8 disagree on the eighth collective.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

__all__ = ["COLLECTIVES", "FlightEntry", "Frame", "RankPlace", "last_flight_entry", "parse_stacks", "place"]

COLLECTIVES = frozenset(
    {
        "all_gather",
        "all_gather_coalesced",
        "all_gather_into_tensor",
        "all_gather_object",
        "all_reduce",
        "all_reduce_coalesced",
        "all_to_all",
        "all_to_all_single",
        "barrier",
        "batch_isend_irecv",
        "broadcast",
        "broadcast_object_list",
        "gather",
        "gather_object",
        "irecv",
        "isend",
        "monitored_barrier",
        "recv",
        "recv_object_list",
        "reduce",
        "reduce_scatter",
        "reduce_scatter_tensor",
        "scatter",
        "scatter_object_list",
        "send",
        "send_object_list",
    }
)
"""torch.distributed functions that wait for other ranks (``distributed_c10d``'s public operations)."""

_THREAD = re.compile(r"^(Current thread|Thread) (0x[0-9a-f]+)", re.IGNORECASE)
_FRAME = re.compile(r'^\s+File "(?P<file>.*)", line (?P<line>\d+) in (?P<func>\S+)\s*$')
_TORCH_DIST = re.compile(r"[/\\]torch[/\\]distributed[/\\]")
_TORCH = re.compile(r"[/\\](torch|perfgate)[/\\]")
STACK_TOP_LINES = 8
"""Frames kept per rank in the answer (innermost first); the whole dump stays an artifact."""


@dataclass(frozen=True)
class Frame:
    file: str
    line: int
    func: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line} in {self.func}"


@dataclass(frozen=True)
class RankPlace:
    """Where one rank's stack says it is: the collective it waits in (None: none), the script line."""

    collective: str | None
    call_site: str | None
    stack_top: tuple[str, ...]


@dataclass(frozen=True)
class FlightEntry:
    """The last collective the flight recorder holds for a rank."""

    seq: int | None
    op: str | None
    state: str | None


def parse_stacks(text: str) -> list[list[Frame]]:
    """The threads of one dump (faulthandler's format), each innermost frame first; lines that are
    neither a thread header nor a frame are skipped."""
    threads: list[list[Frame]] = []
    current: list[Frame] | None = None
    for line in text.splitlines():
        if _THREAD.match(line):
            current = []
            threads.append(current)
            continue
        m = _FRAME.match(line)
        if m and current is not None:
            current.append(Frame(m["file"], int(m["line"]), m["func"]))
    return threads


def _collective_frame(frames: list[Frame]) -> Frame | None:
    for f in frames:
        if _TORCH_DIST.search(f.file) and f.func in COLLECTIVES:
            return f
    return None


def place(threads: list[list[Frame]]) -> RankPlace | None:
    """Where a rank is: the thread inside a collective if one is, else the deepest stack. None: no stack."""
    if not threads or not any(threads):
        return None
    waiting = [t for t in threads if _collective_frame(t) is not None]
    thread = waiting[0] if waiting else max(threads, key=len)
    op = _collective_frame(thread)
    caller = next((f for f in thread if not _TORCH.search(f.file)), None)
    return RankPlace(
        collective=op.func if op is not None else None,
        call_site=str(caller) if caller is not None else None,
        stack_top=tuple(str(f) for f in thread[:STACK_TOP_LINES]),
    )


def last_flight_entry(raw: bytes) -> FlightEntry | None:
    """The newest entry of a flight-recorder JSON dump (``_dump_fr_trace_json``); None when unreadable."""
    try:
        doc = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        return None
    entries = doc.get("entries") if isinstance(doc, dict) else None  # pyright: ignore[reportUnknownMemberType, reportUnknownVariableType]
    if not isinstance(entries, list) or not entries:
        return None
    last = entries[-1]  # pyright: ignore[reportUnknownVariableType]
    if not isinstance(last, dict):
        return None
    seq = last.get("collective_seq_id")  # pyright: ignore[reportUnknownMemberType, reportUnknownVariableType]
    op = last.get("profiling_name")  # pyright: ignore[reportUnknownMemberType, reportUnknownVariableType]
    state = last.get("state")  # pyright: ignore[reportUnknownMemberType, reportUnknownVariableType]
    return FlightEntry(
        seq=seq if isinstance(seq, int) else None,
        op=op if isinstance(op, str) else None,
        state=state if isinstance(state, str) else None,
    )
