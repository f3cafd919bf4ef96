"""The server's ear on a launch's step boundaries: a FIFO read by a thread that stamps each line on arrival.

The harness writes ``<rank> <boundary>\\n`` to the FIFO named by ``PERFGATE_TICKS`` at every step
boundary (:mod:`perfgate.harness.ticks`). A thread of the server (or of a detached run's supervisor)
blocks on the FIFO and stamps each read with ``time.monotonic_ns()``: a clock the training process
cannot rebind, read as the boundary happens. Lines that arrive in one read share its stamp (they were
written no later than that).

The FIFO is opened read-write by the listener, so it never sees end-of-file between launches or ranks and
never blocks on open; ``stop`` ends the thread. What it holds is bounded (`MAX_TICKS`): a run with more
boundaries keeps the first ones and counts the rest as dropped.
"""

from __future__ import annotations

import contextlib
import os
import select
import stat
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["MAX_TICKS", "LaunchTicks", "TickListener", "ticks_path"]

MAX_TICKS = 1_000_000
"""Boundaries kept per launch (all ranks): ~24 MB of tuples at most."""
_MAX_LINE = 64
_POLL_S = 0.2


def ticks_path(run_dir: Path) -> Path:
    """The FIFO the harness of a run in ``run_dir`` sends step boundaries to (named in the request's env,
    so it is approved)."""
    return run_dir / "ticks"


@dataclass
class LaunchTicks:
    """What the server observed of one launch: boundary stamps per rank and the launch's own duration."""

    stamps: dict[int, dict[int, int]] = field(default_factory=dict[int, dict[int, int]])
    """rank -> boundary -> arrival (``time.monotonic_ns``); the first arrival of a boundary wins."""
    started_ns: int = 0
    ended_ns: int = 0
    dropped: int = 0
    """Lines beyond `MAX_TICKS`, or that were not ``<rank> <boundary>``."""
    duplicates: int = 0
    """Boundaries that arrived more than once for a rank (the harness sends each once)."""
    last_ns: int = 0
    """Arrival of the newest boundary of any rank (0: none yet): the hang watch's sign of progress."""
    slowest_step_ns: int = 0
    """Longest time between two consecutive boundaries of one rank (0: no step observed yet)."""

    @property
    def duration_ns(self) -> int:
        return max(0, self.ended_ns - self.started_ns)

    def to_json(self) -> dict[str, object]:
        return {
            "started_ns": self.started_ns,
            "ended_ns": self.ended_ns,
            "dropped": self.dropped,
            "duplicates": self.duplicates,
            "stamps": {str(r): [[b, t] for b, t in sorted(s.items())] for r, s in self.stamps.items()},
        }

    @classmethod
    def from_json(cls, raw: object) -> LaunchTicks | None:
        """Read back what `to_json` wrote (a detached run's supervisor); None when it is not that shape."""
        if not isinstance(raw, dict):
            return None
        doc: dict[str, object] = raw  # pyright: ignore[reportUnknownVariableType]
        try:
            stamps_raw = doc["stamps"]
            assert isinstance(stamps_raw, dict)
            stamps = {
                int(r): {int(b): int(t) for b, t in pairs}  # pyright: ignore[reportUnknownArgumentType, reportUnknownVariableType]
                for r, pairs in stamps_raw.items()  # pyright: ignore[reportUnknownVariableType]
            }
            return cls(
                stamps=stamps,
                started_ns=int(doc["started_ns"]),  # pyright: ignore[reportArgumentType]
                ended_ns=int(doc["ended_ns"]),  # pyright: ignore[reportArgumentType]
                dropped=int(doc["dropped"]),  # pyright: ignore[reportArgumentType]
                duplicates=int(doc.get("duplicates", 0)),  # pyright: ignore[reportArgumentType]
            )
        except (KeyError, TypeError, ValueError, AssertionError):
            return None


class TickListener:
    """Create the FIFO at ``path`` and stamp what arrives on it until `stop`.

    Use as a context manager around one launch; ``ticks`` holds the observation afterwards.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.ticks = LaunchTicks()
        self._fd: int | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._count = 0
        self._partial = b""
        """The start of a line whose end has not arrived yet."""

    def __enter__(self) -> TickListener:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        path = self.path
        with contextlib.suppress(FileNotFoundError):
            st = os.lstat(path)
            if stat.S_ISDIR(st.st_mode):
                raise IsADirectoryError(f"{path} is a folder where the tick FIFO goes")
            path.unlink()  # planted or left over: never read someone else's pipe
        path.parent.mkdir(parents=True, exist_ok=True)
        os.mkfifo(path, 0o600)
        self._fd = os.open(path, os.O_RDWR | os.O_NONBLOCK | os.O_CLOEXEC)
        self.ticks.started_ns = time.monotonic_ns()
        self._thread = threading.Thread(target=self._read, name="perfgate-ticks", daemon=True)
        self._thread.start()

    def stop(self) -> LaunchTicks:
        if self.ticks.ended_ns == 0:
            self.ticks.ended_ns = time.monotonic_ns()
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._fd is not None:
            self._drain(self._fd, time.monotonic_ns())
            os.close(self._fd)
            self._fd = None
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()
        return self.ticks

    def _read(self) -> None:
        fd = self._fd
        assert fd is not None
        while not self._stop.is_set():
            ready, _, _ = select.select([fd], [], [], _POLL_S)
            if ready:
                self._drain(fd, time.monotonic_ns())

    def _drain(self, fd: int, stamp: int) -> None:
        while True:
            try:
                chunk = os.read(fd, 65536)
            except BlockingIOError:
                return
            if not chunk:
                return
            data = self._partial + chunk
            lines = data.split(b"\n")
            self._partial = lines.pop()[-_MAX_LINE:]
            for line in lines:
                self._add(line, stamp)

    def _add(self, line: bytes, stamp: int) -> None:
        ticks = self.ticks
        parts = line.split()
        if len(parts) != 2 or self._count >= MAX_TICKS or len(line) > _MAX_LINE:
            ticks.dropped += 1
            return
        try:
            rank, boundary = int(parts[0]), int(parts[1])
        except ValueError:
            ticks.dropped += 1
            return
        self._count += 1
        seen = ticks.stamps.setdefault(rank, {})
        if boundary in seen:
            ticks.duplicates += 1
        else:
            seen[boundary] = stamp
            ticks.last_ns = stamp
            previous = seen.get(boundary - 1)
            if previous is not None:
                ticks.slowest_step_ns = max(ticks.slowest_step_ns, stamp - previous)
