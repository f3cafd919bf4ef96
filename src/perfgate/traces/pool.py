"""Analyze the trace files of several ranks in parallel: one reader per core, memory bounded.

Each reader reads and analyzes one file at a time (`analyze_trace`, streamed); a worker process sends
back only its small `RankProfile`. How many files are in flight at once is the smaller of the usable
cores and what the available memory holds at the estimated peak of the largest file (`worker_count`),
so a set of huge traces runs fewer at a time instead of exhausting memory. One of the readers is a
thread of this process, which would otherwise only wait: it starts at once, while the worker
processes are forked (`_in_pool`). Workers come from a ``forkserver`` that has already imported the
trace modules (a fork, not a fresh interpreter, per worker; no fork of a multi-threaded server), and
the pool is closed after the call, so an idle server holds no worker's memory (the one worker of a
split read, below, is kept a little while, `KEEP_WORKER_S`). Small sets (where starting workers costs
more than it saves) are read in this process alone.

A single large trace is read in parts on two cores (`analyze_split`) when a core is idle now
(`idle_core`): a worker decodes the events after `SPLIT_AT` of the JSON while this process decodes the
ones before. This process gets there first (the worker starts later and first decompresses the part
before its own); it then takes the end of what the worker has left (`steal_point`: about as much as the
worker will still read by then, batch by batch), tells the worker where to stop through shared memory,
skips to there and reads to the end. Which part of a trace holds the most work varies from trace to
trace; deciding while both read, from how far each has got, keeps either from waiting long for the
other. The parts' tables are joined into exactly the table one reader builds (`TableBuilder.extend`).
Each skipping reader decompresses the part before its own and guesses, without decoding, where one
reader would cut its batches; this process checks that each part began exactly where the one before it
ended, in the same file, and otherwise reads the file again in one piece, so the answer is always one
reader's. The split costs ~5-10% more CPU in all (that decompression) and the start of a worker
process, for a shorter wall time; on a busy machine the trace is read in one process. This needs the
forkserver already running, so the first such call in a process reads alone and starts it in the
background. The worker is kept idle for the next split read (an agent analyzes a baseline, then a
candidate) and shut down after `KEEP_WORKER_S`.
"""

from __future__ import annotations

import math
import multiprocessing
import multiprocessing.forkserver
import os
import sys
import threading
import time
import types
from collections import deque
from collections.abc import Callable, Generator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache
from multiprocessing.context import BaseContext
from multiprocessing.synchronize import Event
from pathlib import Path
from typing import Any, TypeVar, cast

from perfgate.helpers.cpus import usable_cpus
from perfgate.helpers.deadline import checkpoint, deadline
from perfgate.helpers.safeopen import open_file
from perfgate.traces.analyze import (
    AnalysisOptions,
    analyze_table,
    analyze_trace,
    load_part,
    load_parts,
    load_table,
    part_stream,
)
from perfgate.traces.errors import TraceError, TraceTooLargeError
from perfgate.traces.models import RankProfile
from perfgate.traces.reading._events import Header
from perfgate.traces.reading._memory import TRIM_EVERY_BYTES, release_free_memory
from perfgate.traces.reading.parsecache import Parsed, file_stamp, parse_cache
from perfgate.traces.reading.reader import TraceStream, isal_available
from perfgate.traces.reading.table import EventTable, TableBuilder

__all__ = [
    "PARALLEL_MIN_BYTES",
    "SPLIT_AT",
    "SPLIT_MAX_BYTES",
    "SPLIT_MIN_BYTES",
    "Deadline",
    "analyze_many",
    "analyze_split",
    "estimated_peak_bytes",
    "idle_core",
    "load_split",
    "release_workers",
    "steal_point",
    "worker_count",
]

PARALLEL_MIN_BYTES = 24 << 20
"""Below this much JSON in all (estimated, see `estimated_peak_bytes`), files are read in this process:
starting workers (~0.1-0.3 s) would cost more than a second core saves."""
PEAK_PER_JSON_BYTE = 0.6
"""Peak resident memory of one analysis per byte of decompressed JSON (measured: ~0.55 at 1 GB)."""
GZIP_RATIO = 12
"""Assumed decompressed/compressed size of a ``.json.gz`` trace (Kineto JSON compresses 8-15x)."""
SPLIT_MIN_BYTES = 12 << 20
"""A single trace with at least this much JSON (estimated) is read in two halves on two cores: ~0.1 s
of decoding, against ~0.03 s to start a worker from a running forkserver."""
SPLIT_MAX_BYTES = 256 << 20
"""Larger single traces are read in this process alone: the halves' tables are joined in this process,
so its peak memory would not shrink, and the worker's would add to it."""
SPLIT_AT = 0.3
"""Where this process's first part ends, as a fraction of the JSON: well before the middle, so that this
process almost always gets there before the worker (which starts later and first decompresses the part
before its own) is done; it then takes the end of what the worker has left (`steal_point`)."""
SKIP_COST = {"isal": 0.06, "zlib": 0.15, "plain": 0.02}
"""CPU to skip a byte of JSON (decompress it and find where batches end) per CPU to read it (decode it
into the table): gzip files with python-isal (measured on the shared traces: 0.05-0.08) or zlib, and
plain JSON."""
_NEVER = 1 << 62
_WORKER_AT, _HALT_AT = 0, 1
_WORKER_BASE_BYTES = 120 << 20
"""A worker's interpreter with numpy and msgspec loaded."""

KEEP_WORKER_S = 30.0
"""Seconds the worker of a split read (`load_split`) is kept after its part came back, for the next split
read of this process: that read's worker starts at once instead of ~20-30 ms later (a fork from the
forkserver, the pool's pipes and threads), which is a tenth of a warm call on a 15 MB trace. An idle
kept worker holds its interpreter (~`_WORKER_BASE_BYTES`) and trims its heap; it is shut down when the
time is up, when a call did not end cleanly, and at exit."""
_GRACE_S = 5.0
_JOIN_S = 0.01
"""Seconds from the worker's last batch to its part joined here (sent, unpickled, renumbered)."""
Progress = Callable[[int, int, str], None]

_T = TypeVar("_T")

_worker_stop: Event | None = None
"""In a worker process: set by the caller when it gives up on the call (a failed file, the deadline, a
cancel), so a file still being read stops at its next block instead of running on to the deadline."""
_worker_share: _Share | None = None
"""In a worker reading the later part of a split file: what it shares with the caller (`_Share`)."""


@dataclass(frozen=True)
class Deadline:
    """A parsing deadline shared by every file of a call (`perfgate.helpers.deadline`): ``seconds`` allowed,
    ending at ``ends_at`` on `time.monotonic` (system-wide on Linux, so worker processes share it)."""

    seconds: float
    ends_at: float


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


@dataclass(frozen=True)
class _Share:
    """Shared by `load_split` and its worker under ``lock``: ``cells[_WORKER_AT]``, the offset of the batch
    the worker decodes now (-1 before its first, `_NEVER` once it is done), and ``cells[_HALT_AT]``, where
    the caller decided the worker's part ends (the worker stops before its first batch at or after it)."""

    lock: Any
    cells: Any

    @staticmethod
    def make(ctx: BaseContext) -> _Share:
        cells = ctx.RawArray("q", 2)
        cells[_WORKER_AT], cells[_HALT_AT] = -1, _NEVER
        return _Share(ctx.Lock(), cells)


def _init_worker(stop: Event, share: _Share | None = None) -> None:
    global _worker_stop, _worker_share
    _worker_stop, _worker_share = stop, share


class _SplitWorker:
    """The one worker process of `load_split`, with the stop event and the cells it was started with
    (shared objects pass to a process only when it starts, so they last as long as it does)."""

    def __init__(self, ctx: BaseContext) -> None:
        self.pid = os.getpid()
        self.stop = _stop_event(ctx)
        self.share = _Share.make(ctx)
        self.pool = ProcessPoolExecutor(
            max_workers=1, mp_context=ctx, initializer=_init_worker, initargs=(self.stop, self.share)
        )
        self.timer: threading.Timer | None = None

    def alive(self) -> bool:
        """Whether its process still runs and the pool can take work (the executor keeps both private)."""
        processes = cast("dict[int, Any]", getattr(self.pool, "_processes", None) or {})
        return not getattr(self.pool, "_broken", False) and all(p.is_alive() for p in processes.values())

    def ready(self, halt_at: int) -> None:
        """Before a part is submitted: the worker has not begun, and stops at ``halt_at``."""
        with self.share.lock:
            self.share.cells[_WORKER_AT], self.share.cells[_HALT_AT] = -1, halt_at


_kept: _SplitWorker | None = None
_kept_lock = threading.Lock()


def _claim_kept() -> _SplitWorker | None:
    """The kept split worker, taken out of keeping (its timer stopped), when this process has one. One
    kept by the process this one was forked from is forgotten: its pool is that process's to shut down."""
    global _kept
    with _kept_lock:
        worker, _kept = _kept, None
    if worker is None:
        return None
    if worker.timer is not None:
        worker.timer.cancel()
    return worker if worker.pid == os.getpid() else None


def _take_worker(ctx: BaseContext) -> _SplitWorker:
    """The kept split worker when there is one (idle: no other call holds it), else a new one."""
    worker = _claim_kept()
    if worker is not None:
        if worker.alive():
            return worker
        worker.pool.shutdown(wait=False)  # its process died while idle (killed for memory, say)
    return _SplitWorker(ctx)


def _keep_worker(worker: _SplitWorker) -> None:
    """After a split read whose worker's part came back: keep its worker, idle, for `KEEP_WORKER_S`."""
    global _kept
    worker.pool.submit(release_free_memory)  # its part's memory back to the OS while it waits
    with _kept_lock:
        other, _kept = _kept, worker
    if other is not None:  # two split reads ended together: one worker is enough
        other.pool.shutdown(wait=False)
    timer = threading.Timer(KEEP_WORKER_S, _expire, (worker,))
    timer.daemon = True
    worker.timer = timer
    timer.start()


def _expire(worker: _SplitWorker) -> None:
    global _kept
    with _kept_lock:
        if _kept is not worker:  # taken by a call meanwhile
            return
        _kept = None
    worker.pool.shutdown(wait=True)


def release_workers() -> None:
    """Shut down the kept split worker now (a server closing, a test that counts processes)."""
    worker = _claim_kept()
    if worker is not None:
        worker.pool.shutdown(wait=True)


def _worker_halts(at: int) -> bool:
    """In the worker, before each batch of its part: stop here (the caller took the rest), or go on."""
    assert _worker_share is not None
    with _worker_share.lock:
        if at >= _worker_share.cells[_HALT_AT]:
            return True
        _worker_share.cells[_WORKER_AT] = at
        return False


def _skipping(stream: TraceStream, options: AnalysisOptions) -> str:
    """How an open stream decompresses (a key of `SKIP_COST`), as `TraceStream` chose when it opened."""
    if not stream.compressed:
        return "plain"
    return "isal" if options.decompressor != "zlib" and isal_available() else "zlib"


def steal_point(
    at: int, worker_at: int, end: int, chunk: int, block: int, skip_cost: float, lag: int = 0
) -> int | None:
    """Where the worker's part should end when this process has read its own part up to ``at`` and the
    worker decodes the batch that begins at ``worker_at`` (-1: not begun, `_NEVER`: done), in a file of
    ``end`` bytes of JSON read in batches of ``chunk`` bytes (plus up to a ``block``). None when the rest
    is not worth sharing (under one batch for this process).

    The worker is taken to be half a chunk into its batch; ``lag``: the bytes this process reads while
    the worker's part travels back and is joined. This process skips from ``at`` to the returned offset
    (``skip_cost`` of the CPU reading costs, per byte) and reads from there to the end, in about the time
    the worker reads up to it and hands its part over: ``s - now + lag = skip_cost * (s - at) + end - s``.
    The worker stops before its first batch at or after the offset, where this process begins again.
    """
    begun = max(worker_at, at)
    now = begun + chunk // 2
    cut = int((end + now - lag - skip_cost * at) / (2 - skip_cost))
    if cut <= begun or end - cut < chunk:
        return None
    return cut


def _stop_event(ctx: BaseContext) -> Event:
    return ctx.Event()


def _under_limit(limit: Deadline | None, label: str, cancellable: bool, fn: Callable[[], _T]) -> _T:
    """``fn()`` under the call's deadline; in a worker, also stopped when the caller gives up."""
    stop = _worker_stop
    if limit is None and stop is None:
        return fn()
    seconds, ends_at = (math.inf, math.inf) if limit is None else (limit.seconds, limit.ends_at)
    stopped = None if stop is None else stop.is_set
    with deadline(seconds, label, ends_at=ends_at, cancellable=cancellable, stopped=stopped):
        checkpoint()
        return fn()


def _analyze_one(
    path: Path, options: AnalysisOptions, limit: Deadline | None, label: str, cancellable: bool = False
) -> RankProfile:
    return _under_limit(limit, label, cancellable, lambda: analyze_trace(path, options))


def _decompressed_bytes(path: Path) -> int:
    """Size of the JSON: the file's, or a gzip file's recorded size (modulo 4 GiB; a wrong figure only
    moves where `analyze_split` cuts)."""
    with open_file(path) as fh:
        if fh.peek(2)[:2] != b"\x1f\x8b":
            return path.stat().st_size
        fh.seek(-4, os.SEEK_END)
        return int.from_bytes(fh.read(4), "little")


@dataclass
class _Later:
    """What a worker read of the part of a file after ``skip_before``: where its part began
    (`TraceStream.meet`), then its events, or the error that stopped it."""

    meet: tuple[int, int, bool] | None
    identity: tuple[int, ...]
    halt_meet: tuple[int, int, bool] | None = None
    """Where the worker stopped because the caller took the rest (`TraceStream.halt_meet`)."""
    builder: TableBuilder | None = None
    header: Header | None = None
    decoded_bytes: int = 0
    lenient_skipped: int = 0
    error: TraceError | None = None


def _load_later(
    path: Path, options: AnalysisOptions, skip_before: int, limit: Deadline | None, label: str
) -> _Later:
    """In a worker: the batches of ``path`` from ``skip_before`` on (up to where the caller takes over)."""
    stream = part_stream(path, options, skip_before)
    if _worker_share is not None:
        stream.halt = _worker_halts
    try:
        builder = _under_limit(limit, label, False, lambda: load_part(stream, options))
    except TraceError as exc:
        return _Later(stream.meet, stream.identity, error=exc)
    finally:
        if _worker_share is not None:
            with _worker_share.lock:
                _worker_share.cells[_WORKER_AT] = _NEVER  # nothing left to take
    return _Later(
        stream.meet,
        stream.identity,
        stream.halt_meet,
        builder,
        stream.header,
        stream.decoded_bytes,
        stream.lenient_skipped,
    )


_forkserver_started = threading.Event()


def _start_forkserver() -> None:
    _context()
    if sys.platform.startswith("linux"):
        multiprocessing.forkserver.ensure_running()
    _forkserver_started.set()


def _cpu_quota() -> float | None:
    """CPUs the cgroup (v2) of this process may use, None when unlimited or unknown."""
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text(encoding="ascii").split()[:2]
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        return None


_LOAD_SAMPLES = 3
_LOAD_SAMPLE_GAP_S = 0.001


def _read_loadavg(fewer_than: float | None = None) -> str:
    """``/proc/loadavg`` sampled up to `_LOAD_SAMPLES` times a millisecond apart: the sample that shows the
    fewest runnable threads (a thread of this process that has just answered a progress message may
    still count as runnable at one instant; a busy machine shows its load in every sample). Sampling stops
    at the first sample showing fewer than ``fewer_than`` runnable threads: later ones could show fewer
    still, which decides nothing more (an idle machine's first sample costs no wait)."""
    texts: list[str] = []
    for k in range(_LOAD_SAMPLES):
        if k:
            time.sleep(_LOAD_SAMPLE_GAP_S)
        texts.append(Path("/proc/loadavg").read_text(encoding="ascii"))
        if fewer_than is not None and _running(texts[-1]) < fewer_than:
            break
    return min(texts, key=_running)


def _running(loadavg: str) -> int:
    return int(loadavg.split()[3].split("/")[0])


def idle_core(cpus: float | None = None, loadavg: str | None = None) -> bool:
    """Whether a second core is free now: at least two usable cores (affinity and cgroup quota), fewer
    threads runnable right now than cores (this one included) and a one-minute load average below the
    cores (``loadavg``: the text of ``/proc/loadavg``, sampled when not given, see `_read_loadavg`). A
    second process only shortens the wall time on a core that would otherwise idle; on a busy machine it
    competes for the same cores and costs more CPU in all. The load average (which lags) only guards
    against a moment that happens to look idle on a machine kept busy."""
    if cpus is None:
        cpus = float(usable_cpus())
        quota = _cpu_quota()
        if quota is not None:
            cpus = min(cpus, quota)
    if cpus < 2:
        return False
    try:
        if loadavg is None:
            loadavg = _read_loadavg(fewer_than=cpus)
        load1, running = float(loadavg.split()[0]), _running(loadavg)
    except (OSError, ValueError, IndexError):
        return False
    return running < cpus and load1 < cpus


def _split_pays(path: Path) -> bool:
    """Whether `analyze_split` should read ``path`` (see the module); starts the forkserver if not yet."""
    if not SPLIT_MIN_BYTES <= _json_bytes(path) <= SPLIT_MAX_BYTES or not idle_core():
        return False
    available = _available_memory()
    if available is not None and available * 0.75 < 2 * estimated_peak_bytes(path):
        return False
    if not _forkserver_started.is_set():
        threading.Thread(target=_start_forkserver, name="perfgate-forkserver", daemon=True).start()
        return False
    return True


def _wait(future: Future[_T], limit: Deadline | None, label: str, cancellable: bool) -> None:
    """Wait for a worker that enforces the deadline itself; this process waits a little longer, in case
    it is stuck between two checkpoints."""
    if limit is None:
        wait([future])
        return
    with deadline(limit.seconds, label, ends_at=limit.ends_at + _GRACE_S, cancellable=cancellable):
        while not wait([future], timeout=0.25)[0]:
            checkpoint()  # the deadline, or the tool call was cancelled


def analyze_split(
    path: Path,
    options: AnalysisOptions,
    limit: Deadline | None = None,
    label: str = "",
    cancellable: bool = False,
) -> RankProfile:
    """`analyze_trace` of one file read in two or three parts: this process decodes the events before
    `SPLIT_AT` of the JSON, a worker process those after it, up to where this process, done first, takes
    over the end (see `load_split`); the result is the same.

    Raises as `analyze_trace` (the first failure in file order).
    """
    label = label or f"reading trace {path}"
    read = load_split(path, options, limit, label, cancellable=cancellable)
    if read is None:
        return _analyze_one(path, options, limit, label, cancellable)
    table, stream, _ = read
    return _under_limit(
        limit, label, cancellable, lambda: analyze_table(table, stream.header, stream, path, options)
    )


def load_split(
    path: Path,
    options: AnalysisOptions,
    limit: Deadline | None = None,
    label: str = "",
    cancellable: bool = False,
    at: float = SPLIT_AT,
    then: float | None = None,
) -> tuple[EventTable, TraceStream, bool] | None:
    """`load_table` of one file read in two or three parts (see `analyze_split`): this process reads up to
    near ``at`` (a fraction of the JSON), a worker from there; when this process gets there first and the
    worker has enough left, it takes the end of the worker's part (`steal_point`) and reads it itself.

    Returns (the table, the stream, whether the worker's part was used: False when this process read
    every batch itself). ``then`` (a fraction of the JSON) fixes where the worker's part ends instead
    (1 or more: it reads to the end), whatever either process has read by then. None when the file must
    be read in one piece for an exact answer: the worker began, or stopped, elsewhere than where this
    process's parts end or begin (see `TraceStream`), more than ``options.max_events`` events, or an
    error in this process's last part (one reader might have met another one first, in the worker's)."""
    label = label or f"reading trace {path}"
    end = _decompressed_bytes(path)
    cut = int(end * at)
    fixed = None if then is None else int(end * then)
    worker = _take_worker(_context())
    stop, share, pool = worker.stop, worker.share, worker.pool
    worker.ready(fixed if fixed is not None and fixed < end else _NEVER)
    finished = used = False
    stream = part_stream(path, options, 0, cut)
    stolen: list[int] = []
    skipped_before: list[int] = []
    started = time.monotonic()

    def resume(reached: int) -> int | None:
        skipped_before.append(stream.lenient_skipped)
        if fixed is not None:
            if fixed >= end:
                return None
            stolen.append(fixed)
            return fixed
        with share.lock:
            cut_at = steal_point(
                reached,
                int(share.cells[_WORKER_AT]),
                end,
                options.chunk_bytes,
                options.read_block_bytes,
                SKIP_COST[_skipping(stream, options)],
                int(_JOIN_S * reached / max(time.monotonic() - started, 1e-3)),
            )
            if cut_at is not None:
                share.cells[_HALT_AT] = cut_at
                stolen.append(cut_at)
        return cut_at

    stream.resume = resume
    try:
        try:
            with _main_not_inherited():
                later = pool.submit(_load_later, path, options, cut, limit, label)
        except BrokenProcessPool:  # the kept worker died after it was looked at: read in one piece
            return None
        builders: list[TableBuilder] = []
        last_failed = False
        try:
            _under_limit(limit, label, cancellable, lambda: load_parts(stream, options, builders))
        except TraceError:
            if not stolen:
                raise
            # In the part after the worker's: one reader may have failed earlier, in the worker's part,
            # or the worker, which read to the end, holds this part too (the offset to skip to lay past
            # the last event, say). Decided with the worker's part in hand.
            last_failed = True
        used = stream.meet is not None
        if used:
            _wait(later, limit, label, cancellable)
            try:
                part = later.result()
            except BrokenProcessPool as exc:
                if share.cells[_WORKER_AT] == -1:
                    # It died before it began its part: a kept worker that died while idle, in the moment
                    # before its pool noticed (alive() passed). Nothing of the read is lost: read in one piece.
                    return None
                raise TraceError(
                    f"{path}: the worker reading its second half died (killed for memory?); capture a "
                    "shorter window"
                ) from exc
            finished = True
            to_end = part.error is None and part.halt_meet is None
            if last_failed and not to_end and part.error is None:
                return None  # the failure is this process's only: read again in one piece, as one reader
            if stolen and (to_end or last_failed):
                # The worker's last batch began before the offset it was told to stop at: it read to the
                # end, this process's last part is already in its part (or the worker failed before it).
                del builders[1:]
                stream.lenient_skipped = skipped_before[0]
            if (
                part.meet != stream.meet
                or part.identity != stream.identity
                or isinstance(part.error, TraceTooLargeError)
                or (stolen and not to_end and part.error is None and part.halt_meet != stream.resume_meet)
            ):
                # The worker began elsewhere than where this part ended, or stopped elsewhere than where
                # this process's last part began (a guessed cut was wrong), opened another file (the path
                # was replaced meanwhile), or counted the events of its part only: read again in one
                # piece, for the exact answer about one file.
                return None
            if part.error is not None:
                raise part.error  # where one reader fails too: it reads the same batches from there
            assert part.builder is not None and part.header is not None
            if sum(b.event_count for b in builders) + part.builder.event_count > options.max_events:
                return None
            builder = builders[0]
            builder.extend(part.builder)
            for more in builders[1:]:
                builder.extend(more)
            if len(builders) == 1:  # the worker read the end of the file, and the keys after the events
                stream.header, stream.decoded_bytes = part.header, part.decoded_bytes
            stream.lenient_skipped += part.lenient_skipped
        else:
            (builder,) = builders
    finally:
        if finished:  # the worker's part came back: it waits for the next split read
            _keep_worker(worker)
        else:
            # This process read every batch (a short file), or failed: the worker stops at its next block
            # (waited for: it is one process, and it must not outlive the stop event it was given).
            stop.set()
            pool.shutdown(wait=True, cancel_futures=True)
    table = builder.build()
    del builder
    if stream.decoded_bytes >= TRIM_EVERY_BYTES:
        release_free_memory()
    return table, stream, used


def _analyze_kept(
    path: Path, options: AnalysisOptions, limit: Deadline | None, label: str, cancellable: bool, split: bool
) -> RankProfile:
    """`analyze_trace` of one file in this process (in parts when ``split`` and it pays), its parse taken
    from this process's `parse_cache` when the same bytes were read before, and kept there for the next
    call otherwise (see `perfgate.traces.reading.parsecache`)."""
    cache = parse_cache()
    if not cache.enabled:
        if split and _split_pays(path):
            return analyze_split(path, options, limit, label, cancellable=cancellable)
        return _analyze_one(path, options, limit, label, cancellable=cancellable)
    stamp = file_stamp(path)
    key = _under_limit(
        limit, label, cancellable, lambda: cache.key(path, options.max_event_bytes, options.max_events)
    )
    parsed = cache.get(key)
    if parsed is None:
        read = (
            load_split(path, options, limit, label, cancellable=cancellable)
            if split and _split_pays(path)
            else None
        )
        if read is None:
            table, header, stream = _under_limit(limit, label, cancellable, lambda: load_table(path, options))
        else:
            table, stream, _ = read
            header = stream.header
        parsed = Parsed(table, header, stream.decoded_bytes, stream.lenient_skipped)
        # A file replaced or edited while it was hashed and read is analysed as read, and not kept.
        if file_stamp(path) != stamp or not cache.put(key, parsed):
            return _under_limit(
                limit, label, cancellable, lambda: analyze_table(table, header, parsed, path, options)
            )
    kept = parsed
    return _under_limit(
        limit,
        label,
        cancellable,
        lambda: analyze_table(kept.table, kept.header, kept, path, options, release=False),
    )


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
    split = workers is None and total == 1
    if workers is None:
        workers = worker_count(paths)
        if sum(_json_bytes(p) for p in paths) < PARALLEL_MIN_BYTES:
            workers = 1
    if workers <= 1 or total <= 1:
        out: list[RankProfile] = []
        for i, path in enumerate(paths):
            if progress is not None:
                progress(i, total, f"analyzing {path.name}")
            out.append(_analyze_kept(path, options, limit, labels[i], cancellable, split))
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
    """`analyze_many` on ``workers`` cores: ``workers - 1`` worker processes and a thread of this process
    (`_Here`) take the files one at a time from one queue. This process would otherwise only wait; its
    thread starts at once, while the worker processes are still being forked (or the forkserver still
    imports the trace modules: ~0.5-1 s the first time), and a file less crosses a pipe."""
    total = len(paths)
    results: dict[int, RankProfile] = {}
    pending: dict[Future[RankProfile], int] = {}
    queue = deque(enumerate(paths))
    ctx = _context()
    stop = _stop_event(ctx)
    here = _Here(queue, options, limit, labels, stop)
    pool = ProcessPoolExecutor(
        max_workers=max(workers - 1, 1), mp_context=ctx, initializer=_init_worker, initargs=(stop,)
    )
    finished = False
    try:
        here.start()
        while queue or pending or here.busy():
            # At most `workers` files read at once (memory holds that many analyses, never the whole set):
            # each worker process reads one, and one more waits for them (a path, not yet read), so a
            # worker never idles while this loop waits for the thread to let it run.
            while len(pending) < workers and (taken := here.take()) is not None:
                i, path = taken
                with _main_not_inherited():
                    pending[pool.submit(_analyze_one, path, options, limit, labels[i])] = i
            if pending:
                done, _ = wait(pending, timeout=0.25, return_when=FIRST_COMPLETED)
            else:
                done = set[Future[RankProfile]]()
                here.changed.wait(0.25)
            here.changed.clear()
            checkpoint()  # the deadline, or the tool call was cancelled
            for i, profile in here.results():
                results[i] = profile
                if progress is not None:
                    progress(len(results), total, f"analyzed {paths[i].name}")
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
        # On failure, return at once: queued files are dropped, running workers (and this process's
        # thread) stop at their next block.
        if not finished:
            stop.set()
            here.drop()
        here.join()
        pool.shutdown(wait=finished, cancel_futures=True)
    return [results[i] for i in range(total)]


class _Here:
    """The thread of `_in_pool` that analyzes files in this process: it takes them from the queue it
    shares with the loop that feeds the worker processes, until the queue is empty or ``stop`` is set
    (which also stops the file it reads, at its next block). ``changed`` is set at each file it ends;
    `results` hands over the profiles read since, and raises the failure that stopped the thread."""

    def __init__(
        self,
        queue: deque[tuple[int, Path]],
        options: AnalysisOptions,
        limit: Deadline | None,
        labels: Sequence[str],
        stop: Event,
    ) -> None:
        self._queue, self._options, self._limit, self._labels, self._stop = (
            queue,
            options,
            limit,
            labels,
            stop,
        )
        self._lock = threading.Lock()
        self._done: list[tuple[int, RankProfile]] = []
        self._error: BaseException | None = None
        self._running = True
        self.changed = threading.Event()
        self._thread = threading.Thread(target=self._run, name="perfgate-trace-here", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def join(self) -> None:
        if self._thread.ident is not None:
            self._thread.join()

    def take(self) -> tuple[int, Path] | None:
        """The next file of the queue, None when it is empty."""
        with self._lock:
            return self._queue.popleft() if self._queue else None

    def drop(self) -> None:
        with self._lock:
            self._queue.clear()

    def busy(self) -> bool:
        """Whether the thread may still hand over a profile or a failure."""
        with self._lock:
            return self._running or bool(self._done) or self._error is not None

    def results(self) -> list[tuple[int, RankProfile]]:
        with self._lock:
            done, self._done = self._done, []
            error, self._error = self._error, None
        if error is not None:
            raise error
        return done

    def _run(self) -> None:
        try:
            self._read()
        finally:
            with self._lock:
                self._running = False
            self.changed.set()

    def _read(self) -> None:
        limit = self._limit
        seconds, ends_at = (math.inf, math.inf) if limit is None else (limit.seconds, limit.ends_at)
        while not self._stop.is_set() and (taken := self.take()) is not None:
            i, path = taken
            try:
                with deadline(
                    seconds, self._labels[i], ends_at=ends_at, cancellable=False, stopped=self._stop.is_set
                ):
                    checkpoint()
                    profile = analyze_trace(path, self._options)
            except BaseException as exc:  # noqa: BLE001  # raised in the caller's thread by `results`
                with self._lock:
                    self._error = exc
                return
            with self._lock:
                self._done.append((i, profile))
            self.changed.set()
