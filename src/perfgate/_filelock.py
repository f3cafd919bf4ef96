"""Exclusive advisory locks (``flock``) on lock files, across threads and processes.

A lock is held for the block and released when it ends, or by the kernel when the holding process dies
(also under kill -9), so a crash never leaves one behind. Each use opens its own descriptor, so two
threads of one process exclude each other as two processes do. Stdlib only: the detached supervisor
imports it (`held`; `held_async` imports anyio when called).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import AsyncGenerator, Generator
from pathlib import Path

__all__ = ["held", "held_async"]

_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


def _open(path: Path) -> int:
    """A descriptor on ``path``, created (mode 0600, empty) if missing."""
    return os.open(path, os.O_RDWR | os.O_CREAT | _CLOEXEC, 0o600)


@contextlib.contextmanager
def held(path: Path, *, wait: bool = True) -> Generator[None]:
    """Hold the lock on ``path`` for the block, waiting for it (or, ``wait=False``, failing at once).

    Raises:
        BlockingIOError: ``wait`` is false and another holder has it.
    """
    fd = _open(path)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        yield
    finally:
        os.close(fd)  # releases the lock


@contextlib.asynccontextmanager
async def held_async(path: Path) -> AsyncGenerator[None]:
    """`held` in async code: the wait for the lock runs on a worker thread, never on the event loop."""
    import anyio

    fd = _open(path)
    try:
        await anyio.to_thread.run_sync(fcntl.flock, fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock
