"""CPU operators: inclusive and self time per name, and profiler-attributed FLOPs."""

from __future__ import annotations

from itertools import pairwise

import numpy as np
import numpy.typing as npt

from perfgate.harness.line_ranges import LINE_PREFIX
from perfgate.traces.models import FlopsSummary, OpStats
from perfgate.traces.reading._group import unique_values
from perfgate.traces.reading._memory import release_for
from perfgate.traces.reading._np import int_list
from perfgate.traces.reading.prepare import Prepared
from perfgate.traces.reading.table import Columns, Ints

__all__ = [
    "FLOPS_BASIS",
    "PARENT_CHUNK",
    "cpu_parents",
    "cpu_self_times",
    "flops_summary",
    "parent_rows",
    "self_times",
    "top_ops",
]

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]

FLOPS_BASIS = (
    "profiler-attributed: torch.profiler with_flops estimates, counted only for the ops it has formulas "
    "for (matmul, 2D convolution and a few elementwise ops); not model FLOPs, never MFU by itself"
)


PARENT_CHUNK = 1 << 16
"""Events whose parents are worked out together: bounds the temporaries of `parent_rows`."""


def parent_rows(ts: F64, dur: F64, tid: Ints) -> Ints:
    """Row of each event's direct parent on its thread (-1 for top-level and zero-length events).

    Events of one thread nest (Chrome trace semantics). The parent of an event is found without a
    Python loop over events: walking the starts and ends of one thread in time order (at equal times
    ends first, and among starts the longer event first), an event opened at depth ``d`` belongs to the
    latest event opened at depth ``d - 1`` before it. Zero-length events have no children and no parent.

    The walk is cut where a thread has nothing open (every event of the thread that started earlier
    has ended): no event after such a point has a parent before it, so the pieces are walked one at a
    time, about `PARENT_CHUNK` events each, and the temporaries stay that small whatever the trace size.
    The result is int32 (rows of a trace fit; int64 beyond 2**31 rows).
    """
    index = np.int32 if dur.size < 2**31 else np.int64
    out = np.full(dur.size, -1, index)
    rows = np.flatnonzero(dur > 0).astype(index)
    if rows.size < 2:
        return out
    # Thread, then start, the longer first at equal starts (it is the parent), then row: the order in
    # which the walk opens events. Profilers write each thread's events in that order, so the rows are
    # sorted only when they are not in it already (a stable sort keeps rows in order within ties).
    if not _in_walk_order(ts, dur, tid, rows):
        longer_first = dur[rows]
        np.negative(longer_first, out=longer_first)
        order = np.lexsort((longer_first, ts[rows], tid[rows]))
        del longer_first
        rows = rows[order]
        del order
    for lo, hi in _pieces(ts, dur, tid, rows):
        piece = rows[lo:hi]
        parent = _walk(ts[piece], dur[piece], tid[piece])
        has = parent >= 0
        out[piece[has]] = piece[parent[has]]
    return out


def _in_walk_order(ts: F64, dur: F64, tid: Ints, rows: Ints) -> bool:
    """Whether ``rows`` are sorted by thread, then start, then the longer first (equal keys keep their
    order either way), `PARENT_CHUNK` rows at a time; False where a start or duration is not a number."""
    for lo in range(0, rows.size - 1, PARENT_CHUNK):
        part = rows[lo : lo + PARENT_CHUNK + 1]
        t, s, d = tid[part], ts[part], dur[part]
        same_thread = t[1:] == t[:-1]
        if not (t[1:] >= t[:-1]).all():
            return False
        same_start = s[1:] == s[:-1]
        # Within a thread: later starts, or equal starts with no longer event after a shorter one.
        ok = (s[1:] > s[:-1]) | (same_start & (d[1:] <= d[:-1]))
        if not (ok | ~same_thread).all():
            return False
    return True


def _pieces(ts: F64, dur: F64, tid: Ints, rows: Ints) -> list[tuple[int, int]]:
    """Consecutive ranges of ``rows`` (in walk order) of about `PARENT_CHUNK` events, cut only where
    the walk has nothing open."""
    m = rows.size
    threads = tid[rows]
    # A new thread starts with nothing open.
    cuts = [np.flatnonzero(threads[1:] != threads[:-1]) + 1]
    bounds = [0, *cuts[0].tolist(), m]
    del threads
    for a, b in pairwise(bounds):
        if b - a <= PARENT_CHUNK:
            continue
        # Inside a long thread: before event i nothing is open when every earlier event ended by its
        # start (ends equal to the start close first).
        seg = rows[a:b]
        starts = ts[seg]
        ends = dur[seg]
        ends += starts
        np.maximum.accumulate(ends, out=ends)
        cuts.append(np.flatnonzero(starts[1:] >= ends[:-1]) + 1 + a)
        del seg, starts, ends
    points = np.unique(np.concatenate([np.zeros(1, np.int64), *cuts, np.array([m])]))
    # Greedy: each piece ends at the last cut point within PARENT_CHUNK of its start (or the next one).
    out: list[tuple[int, int]] = []
    start = 0
    while start < m:
        k = int(np.searchsorted(points, start + PARENT_CHUNK, side="right")) - 1
        stop = int(points[k])
        if stop <= start:
            stop = int(points[np.searchsorted(points, start, side="right")])
        out.append((start, stop))
        start = stop
    return out


THREADS_LOOPED = 64
"""Threads of a piece up to which each thread's depths are counted on its own (else all at once)."""


def _walk(ts: F64, dur: F64, tid: Ints) -> Ints:
    """`parent_rows` of events that all have a positive duration, in walk order (see `parent_rows`), as
    indexes into the arguments.

    The depth at which an event opens is the events the walk opened so far, itself included, less the
    ends it passed; its parent is the latest event before it opened one level up.
    """
    m = dur.size
    index = np.int32 if m < 2**31 else np.int64
    level = np.arange(1, m + 1, dtype=np.int64)
    level -= _ends_before(ts, dur, tid)
    lowest, highest = int(level.min()), int(level.max())
    narrow = level.astype(np.int16) if lowest > -(2**15) and highest < 2**15 else level
    # Rows by level, in row order within a level (a stable sort; radix for 16-bit levels): the key
    # level * (m + 1) + row is then ascending, and the latest event one level up opened before row r
    # is the last key below (level - 1) * (m + 1) + r.
    by_level = np.argsort(narrow, kind="stable")
    del narrow
    lev = level[by_level]
    del level
    keys = lev * (m + 1)
    above = keys - (m + 1)  # where the level above starts
    keys += by_level
    j = np.searchsorted(keys, above + by_level)  # ascending needles: one pass
    j -= 1
    found = (lev > 1) & (j >= 0)
    del lev
    j[~found] = 0
    found &= keys[j] >= above
    del keys, above
    parent = np.full(m, -1, index)
    parent[by_level[found]] = by_level[j[found]]
    return parent


def _ends_before(ts: F64, dur: F64, tid: Ints) -> I64:
    """For each event (in walk order), the ends the walk passes before it opens the event: those of the
    earlier threads, and those of its own thread at or before its start (ends first at equal times)."""
    m = dur.size
    ends = ts + dur
    starts_of_threads = np.flatnonzero(tid[1:] != tid[:-1]) + 1
    if starts_of_threads.size <= THREADS_LOOPED:
        # Each thread's starts are ascending: a search of its sorted ends, one pass per thread.
        out = np.empty(m, np.int64)
        for lo, hi in pairwise([0, *starts_of_threads.tolist(), m]):
            thread_ends = np.sort(ends[lo:hi])
            out[lo:hi] = np.searchsorted(thread_ends, ts[lo:hi], side="right")
            out[lo:hi] += lo
        return out
    # Many threads at once: times replaced by their ranks among all the piece's times (equal times,
    # equal ranks), offset per thread, so one sorted array of ends serves every thread.
    every = np.concatenate([ts, ends])
    every.sort()
    # Thread k's keys lie in [k * (2m + 1), (k + 1) * (2m + 1)): above every key of the threads before.
    offset = np.zeros(m, np.int64)
    np.cumsum(tid[1:] != tid[:-1], out=offset[1:])
    offset *= 2 * m + 1
    start_key = np.searchsorted(every, ts)
    start_key += offset
    end_key = np.searchsorted(every, ends)
    end_key += offset
    del every, ends
    end_key.sort()
    return np.searchsorted(end_key, start_key, side="right")


def cpu_parents(p: Prepared) -> Ints:
    """`parent_rows` of the prepared CPU ops, computed once per trace."""
    if "cpu_parent" not in p.cache:
        cpu = p.cpu
        p.cache["cpu_parent"] = parent_rows(cpu.f("ts"), cpu.f("dur"), cpu.i("tid"))
    out: Ints = p.cache["cpu_parent"]  # pyright: ignore[reportAssignmentType]
    return out


def cpu_self_times(p: Prepared) -> F64:
    """`self_times` of the prepared CPU ops, computed once per trace."""
    if "cpu_self" not in p.cache:
        cpu = p.cpu
        parent = cpu_parents(p)
        release_for(len(cpu))  # the parent walk's temporaries
        p.cache["cpu_self"] = self_times(cpu.f("ts"), cpu.f("dur"), cpu.i("tid"), parent)
    out: F64 = p.cache["cpu_self"]  # pyright: ignore[reportAssignmentType]
    return out


def self_times(ts: F64, dur: F64, tid: Ints, parent: Ints | None = None) -> F64:
    """Exclusive time of each event: its duration minus that of its direct children on its thread.

    Imperfect nesting never yields a negative result (see `parent_rows`; pass its result as ``parent``
    when it is already known).
    """
    out = dur.astype(np.float64, copy=True)
    if parent is None:
        parent = parent_rows(ts, dur, tid)
    has = parent >= 0
    if not has.any():
        return out
    child_time = np.bincount(parent[has], weights=dur[has], minlength=dur.size)
    del has
    # max(dur - child time, 0) where dur > 0, computed in place (no masked copies of whole columns).
    np.subtract(dur, child_time, out=child_time)
    np.maximum(child_time, 0.0, out=child_time)
    np.copyto(out, child_time, where=dur > 0)
    return out


def top_ops(p: Prepared, k: int, *, by: str = "total") -> list[OpStats]:
    """The ``k`` CPU op/annotation names with the largest inclusive time (``by="total"``) or exclusive
    time (``by="self"``); ProfilerStep annotations are left out."""
    cpu = p.cpu
    if len(cpu) == 0 or k <= 0:
        return []
    names, dur = cpu.i("name"), cpu.f("dur")
    self_us = cpu_self_times(p)
    # Names are dense ids: bincount groups them without sorting.
    n_names = len(p.table.names)
    totals = np.bincount(names, weights=dur, minlength=n_names)
    selfs = np.bincount(names, weights=self_us, minlength=n_names)
    counts = np.bincount(names, minlength=n_names)
    # Only the rows that hold FLOPs: each sum starts at 0.0 and adds the same values in the same order
    # as a sum over the whole column with 0.0 elsewhere.
    flop_rows, flop_values = _held(cpu, "flops")
    flop_totals = np.bincount(names[flop_rows], weights=flop_values, minlength=n_names)
    flop_counts = np.bincount(names[flop_rows], minlength=n_names)
    ranked = np.where(counts > 0, totals if by == "total" else selfs, -1.0)
    for step_id in int_list(np.flatnonzero(counts > 0)):
        name = p.table.names[step_id]
        # The harness's loop-line ranges (profiles with stacks) are callers too, as Python frames are.
        if "ProfilerStep" in name or name.startswith(LINE_PREFIX):
            ranked[step_id] = -1.0
    if "python_function" in p.table.cats:
        # Python frames (with_stack) are callers, not ops: perfgate.traces.analyses.code attributes ops to them.
        python = cpu.i("cat") == p.table.cats.index("python_function")
        ranked[unique_values(names[python])] = -1.0
    out: list[OpStats] = []
    for u in int_list(np.argsort(-ranked, kind="stable")[:k]):
        if ranked[u] < 0:
            break
        out.append(
            OpStats(
                name=p.table.names[u],
                count=int(counts[u]),
                total_us=float(totals[u]),
                self_us=float(selfs[u]),
                mean_us=float(totals[u] / counts[u]),
                max_us=float(dur[names == u].max()),
                flops=float(flop_totals[u]) if flop_counts[u] > 0 else None,
            )
        )
    return out


def _held(cols: Columns, name: str) -> tuple[Ints, F64]:
    """The rows of a float column that hold a value (not NaN) and those values, in row order."""
    sparse = cols.sparse.get(name)
    if sparse is not None and sparse.values.dtype == np.float64 and np.isnan(sparse.fill):
        held = ~np.isnan(sparse.values)
        return sparse.rows[held], sparse.values[held]  # pyright: ignore[reportReturnType]
    column = cols.f(name)
    rows = np.flatnonzero(~np.isnan(column))
    return rows, column[rows]


def flops_summary(p: Prepared) -> FlopsSummary | None:
    """Total profiler-attributed FLOPs in the window, per step when ProfilerStep annotations exist."""
    flops = p.cpu.f("flops") if len(p.cpu) else np.empty(0, np.float64)
    has = ~np.isnan(flops)
    if not has.any():
        return None
    total = float(flops[has].sum())
    steps = p.step_dur[p.step_in_window]
    per_step = total / steps.size if steps.size else None
    return FlopsSummary(
        basis=FLOPS_BASIS,
        profiler_attributed_flops=total,
        ops_with_flops=int(has.sum()),
        flops_per_step=per_step,
        mean_step_time_us=float(steps.mean()) if steps.size else None,
    )
