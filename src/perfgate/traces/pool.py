"""Analyze the trace files of several ranks in parallel: one worker process per core, memory bounded.

Each worker reads and analyzes one file at a time (`analyze_trace`, streamed) and sends back only its
small `RankProfile`. How many files are in flight at once is the smaller of the usable cores and what
the available memory holds at the estimated peak of the largest file (`worker_count`), so a set of
huge traces runs fewer at a time instead of exhausting memory. Workers come from a ``forkserver`` that
has already imported the trace modules (a fork, not a fresh interpreter, per worker; no fork of a
multi-threaded server), and the pool is closed after the call, so an idle server holds no worker's
memory. Small sets (where starting workers costs more than it saves) are read in this process.
"""

from __future__ import annotations

import math
import multiprocessing
import os
import sys
import types
from collections.abc import Callable, Generator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache
from multiprocessing.context import BaseContext
from multiprocessing.synchronize import Event
from pathlib import Path

from perfgate._deadline import checkpoint, deadline
from perfgate.traces.analyze import AnalysisOptions, analyze_trace
from perfgate.traces.errors import TraceError
from perfgate.traces.models import RankProfile

__all__ = [
    "PARALLEL_MIN_BYTES",
    "Deadline",
    "analyze_many",
    "estimated_peak_bytes",
    "usable_cpus",
    "worker_count",
]

PARALLEL_MIN_BYTES = 24 << 20
"""Below this much JSON in all (estimated, see `estimated_peak_bytes`), files are read in this process:
starting workers (~0.1-0.3 s) would cost more than a second core saves."""
PEAK_PER_JSON_BYTE = 0.6
"""Peak resident memory of one analysis per byte of decompressed JSON (measured: ~0.55 at 1 GB)."""
GZIP_RATIO = 12
"""Assumed decompressed/compressed size of a ``.json.gz`` trace (Kineto JSON compresses 8-15x)."""
_WORKER_BASE_BYTES = 120 << 20
"""A worker's interpreter with numpy and msgspec loaded."""

_GRACE_S = 5.0
Progress = Callable[[int, int, str], None]

_worker_stop: Event | None = None
"""In a worker process: set by the caller when it gives up on the call (a failed file, the deadline, a
cancel), so a file still being read stops at its next block instead of running on to the deadline."""


@dataclass(frozen=True)
class Deadline:
    """A parsing deadline shared by every file of a call (`perfgate._deadline`): ``seconds`` allowed,
    ending at ``ends_at`` on `time.monotonic` (system-wide on Linux, so worker processes share it)."""

    seconds: float
    ends_at: float


def usable_cpus() -> int:
    """Cores this process may run on (its affinity mask), at least 1."""
    try:
        return max(len(os.sched_getaffinity(0)), 1)
    except AttributeError:  # not Linux
        return max(os.cpu_count() or 1, 1)


def _json_bytes(path: Path) -> int:
    size = path.stat().st_size
    return size * GZIP_RATIO if path.name.lower().endswith(".gz") else size


def estimated_peak_bytes(path: Path) -> int:
    """Estimated peak memory of a worker analyzing ``path``."""
    return _WORKER_BASE_BYTES + int(_json_bytes(path) * PEAK_PER_JSON_BYTE)


def _available_memory() -> int | None:
    try:
        with open("/proc/meminfo", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def worker_count(paths: Sequence[Path], cpus: int | None = None, available: int | None = None) -> int:
    """Files to analyze at once: one per usable core, no more than there are files, and no more than
    three quarters of the available memory holds at the largest file's estimated peak (at least 1)."""
    if not paths:
        return 1
    cpus = usable_cpus() if cpus is None else cpus
    available = _available_memory() if available is None else available
    count = min(len(paths), cpus)
    if available is not None:
        peak = max(estimated_peak_bytes(p) for p in paths)
        count = min(count, max(int(available * 0.75) // peak, 1))
    return max(count, 1)


@cache
def _context() -> BaseContext:
    """A forkserver that preloads the trace modules (spawn where there is no forkserver)."""
    if sys.platform.startswith("linux"):
        ctx = multiprocessing.get_context("forkserver")
        # Replaces the default preload of __main__: a worker never re-runs the caller's script.
        ctx.set_forkserver_preload(["perfgate.traces.pool"])
        return ctx
    return multiprocessing.get_context("spawn")


@contextmanager
def _main_not_inherited() -> Generator[None]:
    """Start workers without the caller's main module: multiprocessing would re-run its script (or
    module) in each worker, which fails in a script without a ``__main__`` guard and costs an import
    everywhere else. Workers are started inside ``submit``, so this wraps the submits."""
    saved = sys.modules["__main__"]
    stub = types.ModuleType("__main__")
    stub.__spec__ = None
    sys.modules["__main__"] = stub
    try:
        yield
    finally:
        sys.modules["__main__"] = saved


def _init_worker(stop: Event) -> None:
    global _worker_stop
    _worker_stop = stop


def _stop_event(ctx: BaseContext) -> Event:
    return ctx.Event()


def _analyze_one(
    path: Path, options: AnalysisOptions, limit: Deadline | None, label: str, cancellable: bool = False
) -> RankProfile:
    stop = _worker_stop
    if limit is None and stop is None:
        return analyze_trace(path, options)
    seconds, ends_at = (math.inf, math.inf) if limit is None else (limit.seconds, limit.ends_at)
    stopped = None if stop is None else stop.is_set
    with deadline(seconds, label, ends_at=ends_at, cancellable=cancellable, stopped=stopped):
        checkpoint()
        return analyze_trace(path, options)


def analyze_many(
    paths: Sequence[Path],
    options: AnalysisOptions | None = None,
    progress: Progress | None = None,
    workers: int | None = None,
    *,
    limit: Deadline | None = None,
    labels: Sequence[str] | None = None,
    cancellable: bool = False,
) -> list[RankProfile]:
    """One `RankProfile` per file, in the order of ``paths``; in parallel where it pays (see the module).

    ``workers`` overrides `worker_count` (1: read in this process). ``progress(done, total, message)``
    is called as files finish. ``limit``: every file is read under this deadline (`checkpoint` at each
    block, in the workers too), ``labels`` name the files in its message. ``cancellable`` (only from a
    worker thread of `anyio.to_thread.run_sync`, with a ``limit``): a cancelled call stops at the next
    block (here) or the next wait (parallel: queued files are dropped, running workers stop at their
    next block, as on any failure).

    Raises:
        TraceError: as `analyze_trace` (the first failure seen; files still queued are not read), or a
            worker died (killed for memory): the message says so.
        DeadlineExceeded: the deadline passed.
        OSError: a file cannot be read.
    """
    options = AnalysisOptions() if options is None else options
    labels = list(labels) if labels is not None else [f"reading trace {p}" for p in paths]
    total = len(paths)
    if workers is None:
        workers = worker_count(paths)
        if sum(_json_bytes(p) for p in paths) < PARALLEL_MIN_BYTES:
            workers = 1
    if workers <= 1 or total <= 1:
        out: list[RankProfile] = []
        for i, path in enumerate(paths):
            if progress is not None:
                progress(i, total, f"analyzing {path.name}")
            out.append(_analyze_one(path, options, limit, labels[i], cancellable=cancellable))
        return out
    if limit is None:
        return _in_pool(paths, options, progress, workers, None, labels)
    # The workers enforce the deadline and name their file; this process waits a little longer, in case
    # a worker is stuck between two checkpoints.
    what = "; ".join(labels) if len(labels) <= 3 else f"{labels[0]} and {len(labels) - 1} more traces"
    with deadline(limit.seconds, what, ends_at=limit.ends_at + _GRACE_S, cancellable=cancellable):
        return _in_pool(paths, options, progress, workers, limit, labels)


def _in_pool(
    paths: Sequence[Path],
    options: AnalysisOptions,
    progress: Progress | None,
    workers: int,
    limit: Deadline | None,
    labels: Sequence[str],
) -> list[RankProfile]:
    total = len(paths)
    results: dict[int, RankProfile] = {}
    pending: dict[Future[RankProfile], int] = {}
    queue = list(enumerate(paths))[::-1]
    ctx = _context()
    stop = _stop_event(ctx)
    pool = ProcessPoolExecutor(
        max_workers=workers, mp_context=ctx, initializer=_init_worker, initargs=(stop,)
    )
    finished = False
    try:
        while queue or pending:
            # At most `workers` files in flight: memory holds that many analyses, never the whole set.
            while queue and len(pending) < workers:
                i, path = queue.pop()
                with _main_not_inherited():
                    pending[pool.submit(_analyze_one, path, options, limit, labels[i])] = i
            done, _ = wait(pending, timeout=0.25, return_when=FIRST_COMPLETED)
            checkpoint()  # the deadline, or the tool call was cancelled
            for future in sorted(done, key=pending.__getitem__):
                i = pending.pop(future)
                try:
                    results[i] = future.result()
                except BrokenProcessPool as exc:
                    raise TraceError(
                        f"{paths[i]}: the worker analyzing it died (killed for memory?); analyze fewer or "
                        "smaller traces at once, or capture a shorter window"
                    ) from exc
                if progress is not None:
                    progress(len(results), total, f"analyzed {paths[i].name}")
        finished = True
    finally:
        # On failure, return at once: queued files are dropped, running workers stop at their next block.
        if not finished:
            stop.set()
        pool.shutdown(wait=finished, cancel_futures=True)
    return [results[i] for i in range(total)]
