"""Ledger writes from async code: one long-lived thread per process, handed work without a worker pool.

`Ledger.append` blocks (a WAL commit with fsync, SQLite's and the anchor's locks: tens of milliseconds under
I/O load), so async code never runs it on the event loop. ``anyio.to_thread.run_sync`` would do, but for a
cheap tool call its hop (a checkpoint, the capacity limiter, a cancel scope, a copied context, a worker
pool's queue) costs about as much as the append's own Python code. `run_in_ledger_thread` hands the call
to a thread kept for ledger writes through a plain queue, and wakes the loop when it is done: the same
two thread switches, a third of the instructions.

What stays as with ``run_sync``: the caller waits until the call has finished, even when it is cancelled
meanwhile (a committed record is never abandoned halfway, and the cancellation is delivered after); the
call's exception is raised in the caller; the thread is a daemon (a process that exits mid-append is a
kill -9, which the ledger survives). A call made while the thread is still busy with another (concurrent
tool calls), from a process forked since the thread started, or outside an asyncio event loop (trio),
goes to ``anyio.to_thread.run_sync`` instead: one slow append never queues the others behind it, which
still serialize on the ledger's locks as before.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import queue
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import anyio
import anyio.to_thread

__all__ = ["run_in_ledger_thread"]

T = TypeVar("T")

_Job = tuple[Callable[..., Any], tuple[Any, ...], asyncio.AbstractEventLoop, "asyncio.Future[Any]"]


def _settle(future: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    """On the loop: hand the outcome to the waiting caller (unless its future was cancelled outright)."""
    if future.cancelled():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)


class _Thread:
    """The ledger thread of one process and its queue; ``free`` is held while it runs a call."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.jobs: queue.SimpleQueue[_Job] = queue.SimpleQueue()
        self.free = threading.Lock()
        self.thread = threading.Thread(target=self._serve, name="perfgate-ledger", daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            fn, args, loop, future = self.jobs.get()
            result: Any = None
            error: BaseException | None = None
            try:
                result = fn(*args)
            except BaseException as exc:  # noqa: BLE001  # handed to the caller, as run_sync does
                error = exc
            # Free before the loop learns the outcome: its next call finds the thread free.
            self.free.release()
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile: nobody is waiting
                loop.call_soon_threadsafe(_settle, future, result, error)
            del fn, args, loop, future, result, error


_current: _Thread | None = None
_start_lock = threading.Lock()


def _ledger_thread() -> _Thread:
    """This process's ledger thread (a forked child starts its own: threads do not survive a fork)."""
    global _current
    found = _current
    if found is not None and found.pid == os.getpid():
        return found
    with _start_lock:
        found = _current
        if found is None or found.pid != os.getpid():
            found = _current = _Thread()
        return found


async def run_in_ledger_thread(fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` off the event loop, as ``anyio.to_thread.run_sync(fn, *args)`` (not abandoned on
    cancellation), through this process's ledger thread when it is free."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:  # not asyncio (trio): the portable way
        return await anyio.to_thread.run_sync(fn, *args)
    writer = _ledger_thread()
    if not writer.free.acquire(blocking=False):  # busy with another call: do not queue behind it
        return await anyio.to_thread.run_sync(fn, *args)
    future: asyncio.Future[T] = loop.create_future()
    try:
        writer.jobs.put((fn, args, loop, future))
    except BaseException:
        writer.free.release()
        raise
    with anyio.CancelScope(shield=True):  # as run_sync: wait for the call, cancelled or not
        await future
    return future.result()
