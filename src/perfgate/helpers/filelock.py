"""Exclusive advisory locks (``flock``) on lock files, across threads and processes.

A lock is held for the block and released when it ends, or by the kernel when the holding process dies
(also under kill -9), so a crash never leaves one behind. Each use opens its own descriptor, so two
threads of one process exclude each other as two processes do. A lock file is never a link: its own name
is opened with ``O_NOFOLLOW``, and ``confined=True`` (lock files in the agent-writable ``.perfgate/``) opens
the whole resolved path following no link and makes sure the file is the server's own
(`perfgate.helpers.statefs.open_lock`). Stdlib only: the detached supervisor imports it (`held`; `held_async`
imports anyio when called).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import AsyncGenerator, Generator
from pathlib import Path

from perfgate.helpers.statefs import open_lock

__all__ = ["held", "held_async"]

_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)


def _open(path: Path, confined: bool) -> int:
    """A descriptor on ``path``, created (mode 0600, empty) if missing."""
    if confined:
        return open_lock(path)
    return os.open(path, os.O_RDWR | os.O_CREAT | _NOFOLLOW | _CLOEXEC, 0o600)


@contextlib.contextmanager
def held(path: Path, *, wait: bool = True, confined: bool = False) -> Generator[None]:
    """Hold the lock on ``path`` for the block, waiting for it (or, ``wait=False``, failing at once).

    Raises:
        BlockingIOError: ``wait`` is false and another holder has it.
        perfgate.helpers.safeopen.UnsafeFileError: ``confined`` and a folder on ``path`` is a link.
    """
    fd = _open(path, confined)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        yield
    finally:
        os.close(fd)  # releases the lock


@contextlib.asynccontextmanager
async def held_async(path: Path, *, confined: bool = False) -> AsyncGenerator[None]:
    """`held` in async code: the wait for the lock runs on a worker thread, never on the event loop."""
    import anyio

    fd = _open(path, confined)
    try:
        await anyio.to_thread.run_sync(fcntl.flock, fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock
