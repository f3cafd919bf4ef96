"""The server's stamps on a launch's output as it arrives: by when each byte of stdout had reached it.

A log-timed launch (``timing='log'``) reports its step times in lines the training process prints, on the
process's own clock. The server reads the process's stdout through a pipe and stamps every read that holds a
line end with ``time.monotonic_ns()``, a clock the process cannot rebind, as the read happens. A step line's
arrival is the stamp of the first read that reached the line's end; lines that arrive in one read share it.
`perfgate.benchmarking.windows.corroborate.corroborate_log` then holds the reported step times against the time
that passed between the lines on the server's clock.

What it holds is bounded (`MAX_STAMPS` reads); a launch with more keeps the first ones and counts the rest.
"""

from __future__ import annotations

import bisect
import contextlib
import itertools
import json
import time
from array import array
from pathlib import Path

__all__ = ["LOG_PATTERN_ENV", "MAX_STAMPS", "OutputStamps", "stamps_path"]

LOG_PATTERN_ENV = "PERFGATE_LOG_PATTERN"
"""Set in a log-timed launch's environment (to the pattern that reads its step lines): the launch's stdout
is stamped, and the approval shows which lines will be read as step times."""

MAX_STAMPS = 1_000_000
"""Reads stamped per stream (16 bytes each: 16 MB at most)."""


def stamps_path(log: Path) -> Path:
    """Where the stamps of the output log ``log`` are kept (beside it, in the server's run folder)."""
    return log.with_name(log.name + ".stamps.json")


class OutputStamps:
    """Cumulative byte counts of a stream, each with the server's time of the read that reached it."""

    def __init__(self) -> None:
        self.ends = array("q")
        """Bytes received up to and including each stamped read."""
        self.ns = array("q")
        self.started_ns = time.monotonic_ns()
        self.ended_ns = 0
        self.dropped = 0
        """Reads with a line end beyond `MAX_STAMPS`."""

    def feed(self, end: int, chunk: bytes, now_ns: int | None = None) -> None:
        """Stamp a read of ``chunk`` that brought the stream to ``end`` bytes, when it ends a line."""
        if b"\n" not in chunk and b"\r" not in chunk:
            return
        if len(self.ends) >= MAX_STAMPS:
            self.dropped += 1
            return
        self.ends.append(end)
        self.ns.append(time.monotonic_ns() if now_ns is None else now_ns)

    def arrival(self, offset: int) -> int | None:
        """When the byte before ``offset`` had arrived (the read that brought the stream to ``offset`` or
        beyond); None when no stamped read did."""
        i = bisect.bisect_left(self.ends, offset)
        return self.ns[i] if i < len(self.ends) else None

    def save(self, path: Path) -> None:
        self.ended_ns = self.ended_ns or time.monotonic_ns()
        doc = {
            "started_ns": self.started_ns,
            "ended_ns": self.ended_ns,
            "dropped": self.dropped,
            "ends": self.ends.tolist(),
            "ns": self.ns.tolist(),
        }
        path.write_text(json.dumps(doc, separators=(",", ":")), encoding="utf-8")

    @classmethod
    def load(cls, path: Path) -> OutputStamps | None:
        """What `save` wrote at ``path``; None when there is none or it is not that shape."""
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        out = cls()
        with contextlib.suppress(KeyError, TypeError, ValueError, OverflowError):
            ends, ns = array("q", doc["ends"]), array("q", doc["ns"])
            if len(ends) == len(ns) and all(a <= b for a, b in itertools.pairwise(ends)):
                out.ends, out.ns = ends, ns
                out.started_ns, out.ended_ns = int(doc["started_ns"]), int(doc["ended_ns"])
                out.dropped = int(doc["dropped"])
                return out
        return None
