"""Step boundaries sent to the server as they happen, for it to stamp on its own clock.

The harness shares its process with the code under test, so the step times it records are only as good
as that code lets them be: a candidate that rebinds the harness's clock, or skips work while it is
timed, reports what it likes. Each boundary therefore also goes, as it happens, to a FIFO the server
listens on (``PERFGATE_TICKS``): one line ``<rank> <boundary>\\n`` per step, where boundary ``n`` ends
step ``n - 1``. The server stamps each line when it arrives and checks the record's step and window
times against its own (see :mod:`perfgate.benchmarking.windows.corroborate`).

A line is one ``write`` far below ``PIPE_BUF``, so ranks sharing the FIFO never cut into each other's
lines. The FIFO is opened non-blocking: when the server is not listening (a script run by hand) nothing is
sent, and a full FIFO drops a line rather than stall the training step (the server counts what is
missing).
"""

from __future__ import annotations

import os

__all__ = ["TICKS_ENV", "TickWriter"]

TICKS_ENV = "PERFGATE_TICKS"


class TickWriter:
    """Writes this rank's step boundaries to the server's FIFO (a no-op without one)."""

    __slots__ = ("_fd", "_prefix")

    def __init__(self, rank: int) -> None:
        self._prefix = f"{rank} ".encode("ascii")
        self._fd: int | None = None
        path = os.environ.get(TICKS_ENV)
        if not path:
            return
        try:
            # O_NONBLOCK: ENXIO at once when no reader holds the FIFO, never a blocked step
            self._fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:
            self._fd = None

    def tick(self, boundary: int) -> None:
        fd = self._fd
        if fd is None:
            return
        try:
            os.write(fd, self._prefix + b"%d\n" % boundary)
        except (BlockingIOError, BrokenPipeError):
            pass  # the server sees the gap
        except OSError:
            self._fd = None

    def close(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)
