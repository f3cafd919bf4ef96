"""CPU operators: inclusive and self time per name, and profiler-attributed FLOPs."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from perfgate.traces._np import int_list
from perfgate.traces.models import FlopsSummary, OpStats
from perfgate.traces.prepare import Prepared

__all__ = [
    "FLOPS_BASIS",
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


def parent_rows(ts: F64, dur: F64, tid: I64) -> I64:
    """Row of each event's direct parent on its thread (-1 for top-level and zero-length events).

    Events of one thread nest (Chrome trace semantics). The parent of an event is found without a
    Python loop: walking the starts and ends of one thread in time order, an event opened at depth
    ``d`` belongs to the latest event opened at depth ``d - 1`` before it. Zero-length events have no
    children and no parent.
    """
    out = np.full(dur.size, -1, np.int64)
    rows = np.flatnonzero(dur > 0)
    m = rows.size
    if m < 2:
        return out
    d = dur[rows]
    t_open = ts[rows]
    threads = tid[rows]
    # Opens are rows [0, m) of the concatenation, closes [m, 2m). At equal times closes sort before
    # opens, and among opens the longer one first (it is the parent). Temporaries are dropped early:
    # this runs on millions of ops for a large trace.
    order = np.lexsort(
        (
            np.concatenate([-d, np.zeros(m)]),
            np.concatenate([np.ones(m, np.int8), np.zeros(m, np.int8)]),
            np.concatenate([t_open, t_open + d]),
            np.concatenate([threads, threads]),
        )
    )
    del t_open, threads, d
    opened = order < m
    depth = np.cumsum(np.where(opened, 1, -1), dtype=np.int32)
    pos = np.flatnonzero(opened)
    who = order[pos]
    level = depth[pos]
    del order, opened, depth
    by_level = np.lexsort((pos, level))
    width = 2 * m + 1
    keys = level[by_level].astype(np.int64) * width + pos[by_level]
    j = np.searchsorted(keys, (level.astype(np.int64) - 1) * width + pos) - 1
    del keys, pos
    has_parent = (level > 1) & (j >= 0)
    j_safe = np.where(has_parent, j, 0)
    has_parent &= level[by_level][j_safe] == level - 1
    parent = np.full(m, -1, np.int64)
    parent[who[has_parent]] = who[by_level][j_safe[has_parent]]
    out[rows] = np.where(parent >= 0, rows[np.maximum(parent, 0)], -1)
    return out


def cpu_parents(p: Prepared) -> I64:
    """`parent_rows` of the prepared CPU ops, computed once per trace."""
    if "cpu_parent" not in p.cache:
        cpu = p.cpu
        p.cache["cpu_parent"] = parent_rows(cpu.f("ts"), cpu.f("dur"), cpu.i("tid"))
    out: I64 = p.cache["cpu_parent"]  # pyright: ignore[reportAssignmentType]
    return out


def cpu_self_times(p: Prepared) -> F64:
    """`self_times` of the prepared CPU ops, computed once per trace."""
    if "cpu_self" not in p.cache:
        cpu = p.cpu
        p.cache["cpu_self"] = self_times(cpu.f("ts"), cpu.f("dur"), cpu.i("tid"), cpu_parents(p))
    out: F64 = p.cache["cpu_self"]  # pyright: ignore[reportAssignmentType]
    return out


def self_times(ts: F64, dur: F64, tid: I64, parent: I64 | None = None) -> F64:
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
    positive = dur > 0
    out[positive] = np.maximum(dur[positive] - child_time[positive], 0.0)
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
    flops = cpu.f("flops")
    has_flops = ~np.isnan(flops)
    flop_totals = np.bincount(names, weights=np.where(has_flops, flops, 0.0), minlength=n_names)
    flop_counts = np.bincount(names, weights=has_flops.astype(np.float64), minlength=n_names)
    ranked = np.where(counts > 0, totals if by == "total" else selfs, -1.0)
    for step_id in int_list(np.flatnonzero(counts > 0)):
        if "ProfilerStep" in p.table.names[step_id]:
            ranked[step_id] = -1.0
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
