"""Where host time goes in a training step: data loading, forward, backward, optimizer, no-grad passes,
collectives, synchronization.

Every trace has this view, CPU-only ones included. Phases come from torch's own annotations and
autograd events, not from guesses about op names:

- ``data_loading``: ``enumerate(DataLoader)#...__next__`` annotations;
- ``optimizer``: ``Optimizer.step#...`` / ``Optimizer.zero_grad#...`` annotations;
- ``grad_clipping``: the Python frames of ``clip_grad_norm_`` / ``clip_grad_value_`` (and their helpers,
  FSDP's included: traces recorded with_stack) and ``aten::_foreach_norm`` ops (the foreach norm that
  ``clip_grad_norm_`` runs; without stacks the rest of the clip, the scaling, stays in no_grad);
  clipping called inside an optimizer's step counts as optimizer;
- ``collectives``: collective calls (``gloo:*``, ``nccl:*``, ``c10d::*``, ``record_param_comms``,
  MPI/UCC/MCCL/HCCL) on any thread, minus the time an ``aten::`` op runs at the same time: what is
  left is time the step spends waiting for communication (gloo runs on its own threads);
- ``sync``: ops that wait for a device value (``.item()`` → ``_local_scalar_dense``, ``nonzero``) and
  blocking host synchronization calls;
- ``recompute``: ops recorded with grad mode on *inside* a backward event (on its thread): the forward
  that activation checkpointing (``torch.utils.checkpoint``, reentrant or not) runs again during
  backward. A double backward (``create_graph=True``) also runs grad-mode ops there and counts here too;
- ``backward``: ``autograd::engine::evaluate_function`` events (and ``*Backward*`` nodes, and C++ nodes:
  ``torch::autograd::CppNode<...>``, ``AccumulateGrad``);
- ``forward``: ops recorded with grad mode on (torch gives them an autograd ``Sequence number``),
  and ``DistributedDataParallel.forward``;
- ``no_grad``: ops recorded with grad mode off: evaluation passes, ``torch.no_grad`` blocks;
- ``other``: step time no op or annotation covers: Python between ops, sleeps, unrecorded waits.

Time is assigned in that order (a moment covered by a DataLoader annotation and a forward op counts as
data loading), over the union of all threads, inside the analysis window's ProfilerSteps (or the whole
trace without steps). Phases therefore partition step time: their sum is the step time.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from functools import lru_cache

import numpy as np
import numpy.typing as npt

from perfgate.traces.analyses.intervals import clip, difference_merged, merge, merge_merged, union_length
from perfgate.traces.analyses.ops import cpu_parents, cpu_self_times
from perfgate.traces.classify import IMPLICIT_SYNC_OPS, host_call_role, is_polling_call
from perfgate.traces.models import HostBreakdown, HostPhase, PhaseName
from perfgate.traces.reading._group import unique_values
from perfgate.traces.reading._memory import release_for
from perfgate.traces.reading._np import int_list
from perfgate.traces.reading.prepare import Prepared

__all__ = [
    "COLLECTIVE_NAME",
    "PHASE_ORDER",
    "analysis_window",
    "host_breakdown",
    "is_collective_name",
    "phase_of_name",
]

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]

PHASE_ORDER: tuple[PhaseName, ...] = (
    "data_loading",
    "optimizer",
    "grad_clipping",
    "collectives",
    "sync",
    "recompute",
    "backward",
    "forward",
    "no_grad",
)
COLLECTIVE_NAME = re.compile(
    r"^(gloo|nccl|rccl|mccl|hccl|mpi|ucc|xccl):|^c10d::|record_param_comms|ProcessGroup\w*::", re.IGNORECASE
)
_CLIP_FRAME = re.compile(
    r"\(\d+\): (clip_grad_norm_?|clip_grad_value_|_clip_grads_with_norm_|_get_total_norm|clip_grads_with_norm_"
    r"|get_total_norm)$"
)
"""A Python frame (python_function event, ``file.py(line): name``) of gradient clipping."""
_CLIP_OPS = frozenset({"aten::_foreach_norm"})
_SYNC_WRAPPERS = frozenset({"aten::item", "aten::is_nonzero", "aten::equal", "aten::allclose"})
SHORT_OP_US = 20.0
"""CPU ops shorter than this (inclusive time) count as tiny: dispatch costs rival their work."""


def is_collective_name(name: str) -> bool:
    """A CPU-side collective call or its annotation (any backend, gloo included)."""
    return bool(COLLECTIVE_NAME.search(name))


@lru_cache(maxsize=1 << 15)
def phase_of_name(name: str) -> PhaseName | None:
    """The host phase an op or range of this name belongs to, by name alone (None: not one of them).
    Kept per name, as `perfgate.traces.classify.classify_device` is: one analysis asks about each name
    several times, and a baseline's and a candidate's traces share most of their names."""
    if name.startswith("enumerate(DataLoader)") or ("DataLoader" in name and "__next__" in name):
        return "data_loading"
    if name.startswith("Optimizer.") or name.startswith("Optimizer#"):
        return "optimizer"
    if name in _CLIP_OPS or (name.endswith(("_", "norm")) and _CLIP_FRAME.search(name)):
        return "grad_clipping"
    if is_collective_name(name):
        return "collectives"
    if name in IMPLICIT_SYNC_OPS or name in _SYNC_WRAPPERS:
        return "sync"
    if name.startswith(("autograd::engine::evaluate_function", "torch::autograd::")) or re.search(
        r"Backward\d*$", name
    ):
        return "backward"
    if name.endswith(".forward") and "DistributedDataParallel" in name:
        return "forward"
    return None


def analysis_window(p: Prepared) -> tuple[float, float, int]:
    """The time range the phases cover and the number of steps in it."""
    inside = p.step_in_window
    if p.step_numbers.size and inside.any():
        starts = p.step_start[inside]
        ends = starts + p.step_dur[inside]
        return float(starts.min()), float(ends.max()), int(inside.sum())
    cpu = p.cpu
    if len(cpu) == 0:
        return 0.0, 0.0, 0
    return float(cpu.f("ts").min()), float(cpu.f("end").max()), 0


def host_breakdown(p: Prepared, short_op_us: float = SHORT_OP_US) -> HostBreakdown | None:
    """The phase breakdown of host time per step (None for a trace without CPU ops)."""
    cpu, host = p.cpu, p.host
    if len(cpu) == 0:
        return None
    lo, hi, steps = analysis_window(p)
    if hi <= lo:
        return None
    names = p.table.names
    name_ids = cpu.i("name")
    present = int_list(unique_values(name_ids))
    phase_of_id: dict[int, PhaseName | None] = {i: phase_of_name(names[i]) for i in present}
    op_cats = np.array([i for i, c in enumerate(p.table.cats) if c in ("cpu_op", "Operator")], np.int64)
    is_cpu_op = np.isin(cpu.i("cat"), op_cats)
    # Per-name lookups, indexed by the name ids: no Python loop over events.
    aten_of_id = np.zeros(len(names), bool)
    code_of_id = np.zeros(len(names), np.int8)  # 0: no phase by name, else 1 + PHASE_ORDER index
    for i in present:
        aten_of_id[i] = names[i].startswith("aten::")
        ph = phase_of_id[i]
        code_of_id[i] = 0 if ph is None else 1 + PHASE_ORDER.index(ph)
    is_aten = aten_of_id[name_ids]
    # One phase code per op (0: none, else 1 + PHASE_ORDER index) instead of a mask per phase: each
    # phase's mask exists only while that phase is worked out.
    code = code_of_id[name_ids]
    unnamed_op = code == 0
    unnamed_op &= is_cpu_op
    grad = cpu.i("grad") == 1
    code[unnamed_op & grad] = _CODE["forward"]
    # Grad-mode ops inside a backward event ran the forward again: activation checkpointing.
    in_backward = _below(code == _CODE["backward"], cpu_parents(p))
    code[unnamed_op & grad & in_backward] = _CODE["recompute"]
    unnamed_op &= ~grad
    code[unnamed_op] = _CODE["no_grad"]
    del unnamed_op, grad, in_backward

    extra: dict[PhaseName, tuple[F64, F64]] = {}
    blocking: tuple[F64, F64] = (np.empty(0, np.float64), np.empty(0, np.float64))
    if len(host):
        h_names = host.i("name")
        sync_ids = [
            i
            for i in int_list(unique_values(h_names))
            if host_call_role(names[i]) == "sync" and not is_polling_call(names[i])
        ]
        sync_rows = np.flatnonzero(np.isin(h_names, np.array(sync_ids, np.int64)))
        h_ts = host.f("ts")[sync_rows]
        extra["sync"] = (h_ts, h_ts + host.f("dur")[sync_rows])
        copy_ids = [
            i for i in int_list(unique_values(h_names)) if host_call_role(names[i]) == "blocking_copy"
        ]
        copy_rows = np.flatnonzero(np.isin(h_names, np.array(copy_ids, np.int64)))
        c_ts = host.f("ts")[copy_rows]
        blocking = (
            np.concatenate([h_ts, c_ts]),
            np.concatenate([h_ts + host.f("dur")[sync_rows], c_ts + host.f("dur")[copy_rows]]),
        )

    # End times are ts + dur, formed a chunk at a time where needed (the same values as the derived
    # ``end`` column, never the whole column).
    ts, dur = cpu.f("ts"), cpu.f("dur")
    # An op inside its parent adds nothing to a union that holds the parent: each phase's union is
    # taken over the outermost of its ops only (the same union, far fewer intervals to sort).
    parent = cpu_parents(p)
    safe = np.maximum(parent, 0)
    inside = _inside_parent(ts, dur, parent, safe)

    def outermost(mask: npt.NDArray[np.bool_]) -> npt.NDArray[np.bool_]:
        nested = mask[safe]
        nested &= inside
        np.logical_not(nested, out=nested)
        nested &= mask
        return nested

    covered_s, covered_e = np.empty(0, np.float64), np.empty(0, np.float64)
    total = hi - lo
    per_step = max(steps, 1)
    self_us = cpu_self_times(p)
    phases: list[HostPhase] = []
    accounted = 0.0
    for ph in PHASE_ORDER:
        # Each phase's intervals are merged on their own first (a phase of nested ops merges into few
        # intervals), so the whole trace's ops are never copied twice at once. Unions do not depend
        # on the grouping: the merged intervals, and so the sums, are the same.
        release_for(ts.size)  # the previous phase's temporaries
        mask = code == _CODE[ph]
        s, e = _union(ts, dur, outermost(mask), lo, hi)
        if ph in extra:
            xs, xe = clip(extra[ph][0], extra[ph][1], lo, hi)
            s, e = merge(np.concatenate([s, xs]), np.concatenate([e, xe]))
        if ph == "collectives" and s.size:
            # Communication running while an op computes is hidden; only the rest is waited for.
            s, e = _uncovered_by_ops(s, e, ts, dur, outermost(is_aten & ~mask), lo, hi)
        before = union_length(covered_s, covered_e)
        covered_s, covered_e = merge_merged(covered_s, covered_e, s, e)
        time_us = union_length(covered_s, covered_e) - before
        accounted += time_us
        release_for(ts.size)  # the union's sort
        phases.append(_phase(ph, time_us, total, per_step, _top_names(p, mask, self_us)))
        del mask, s, e
    phases.append(_phase("other", max(total - accounted, 0.0), total, per_step, []))

    in_window = (ts >= lo) & (ts < hi)
    implicit = np.isin(name_ids, np.array(p.table.name_ids(IMPLICIT_SYNC_OPS), np.int64))
    ops = is_cpu_op & in_window
    top_level = ops & ((parent < 0) | ~is_cpu_op[np.maximum(parent, 0)])
    durations = dur[top_level]
    short = durations < short_op_us
    return HostBreakdown(
        sync_wait_us_per_step=_sync_wait(p, ts, dur, blocking, lo, hi) / per_step,
        basis=(
            f"{steps} ProfilerStep(s) of the analysis window"
            if steps
            else "the whole trace (no ProfilerStep)"
        ),
        steps=steps,
        step_us=total / per_step,
        phases=phases,
        ops_per_step=float(ops.sum()) / per_step,
        top_level_ops_per_step=float(top_level.sum()) / per_step,
        top_level_op_p50_us=float(np.median(durations)) if durations.size else None,
        short_op_threshold_us=short_op_us,
        # The union of the short ops' intervals: short ops of two threads at once count their time once.
        short_top_level_op_us_per_step=union_length(
            *clip(ts[top_level][short], ts[top_level][short] + durations[short], lo, hi)
        )
        / per_step,
        implicit_syncs_per_step=float(np.sum(implicit & in_window)) / per_step,
    )


_CODE: dict[PhaseName, int] = {ph: 1 + k for k, ph in enumerate(PHASE_ORDER)}


def _below(mask: npt.NDArray[np.bool_], parent: npt.NDArray[np.signedinteger]) -> npt.NDArray[np.bool_]:
    """Rows that have an ancestor in ``mask`` (its parent, its parent's parent, ...; same thread)."""
    has = parent >= 0
    safe = np.maximum(parent, 0)
    out = has & mask[safe]
    # One level more per pass: as many passes as the deepest nesting under a masked row.
    while True:
        grown = out | (has & out[safe])
        if np.array_equal(grown, out):
            return out
        out = grown


def _inside_parent(
    ts: F64, dur: F64, parent: npt.NDArray[np.signedinteger], safe: npt.NDArray[np.signedinteger]
) -> npt.NDArray[np.bool_]:
    """Ops that lie within their parent's interval, a `UNION_CHUNK` of rows at a time."""
    out = parent >= 0
    for a in range(0, ts.size, UNION_CHUNK):
        b = a + UNION_CHUNK
        up = safe[a:b]
        t, up_t = ts[a:b], ts[up]
        part = out[a:b]
        part &= t >= up_t
        part &= t + dur[a:b] <= up_t + dur[up]
    return out


UNION_CHUNK = 1 << 18
"""Ops whose intervals are clipped and merged together before joining the union of the rest."""


def _union(ts: F64, dur: F64, mask: npt.NDArray[np.bool_], lo: float, hi: float) -> tuple[F64, F64]:
    """`merge` of the masked intervals clipped to ``[lo, hi)``, built `UNION_CHUNK` rows at a time.

    Each chunk's ends are formed as ts + dur, the values of the derived ``end`` column: the whole column
    is never held.
    A union is the same however its parts are grouped, and `merge` returns it in one canonical form
    (its boundaries are input values), so the result equals one merge over all rows; only one chunk's
    copies are held at a time.
    """
    parts_s: list[F64] = []
    parts_e: list[F64] = []
    for a in range(0, ts.size, UNION_CHUNK):
        b = a + UNION_CHUNK
        t = ts[a:b]
        chunk_end = t + dur[a:b]
        s, e = merge(*_clipped(t, chunk_end, mask[a:b], lo, hi))
        del chunk_end
        parts_s.append(s)
        parts_e.append(e)
    if len(parts_s) == 1:
        return parts_s[0], parts_e[0]
    return merge(np.concatenate(parts_s), np.concatenate(parts_e))


def _uncovered_by_ops(
    a_s: F64, a_e: F64, ts: F64, dur: F64, mask: npt.NDArray[np.bool_], lo: float, hi: float
) -> tuple[F64, F64]:
    """`difference` of the merged, non-empty A (inside ``[lo, hi)``) and the union of the masked ops
    clipped to ``[lo, hi)``, merging only the ops that reach some A interval.

    An op counts when it touches the closed range from one float below an A start to that interval's
    end. The union of those ops equals the union of all of them on every such range, bounds included,
    and `difference` decides each piece by its midpoint, which lies in such a range whenever A covers
    it: the result is the same as with every op, while an A of a few collectives no longer merges
    every op of the trace.
    """
    reach = np.nextafter(a_s, -np.inf)
    near = np.zeros(ts.size, bool)
    any_op = False  # whether the union of all the masked ops is empty (then A is returned as is)
    for a in range(0, ts.size, UNION_CHUNK):
        b = a + UNION_CHUNK
        t, m = ts[a:b], mask[a:b]
        end = t + dur[a:b]
        any_op = any_op or bool(np.any(m & (end > t) & (end > lo) & (t < hi)))
        k = np.searchsorted(reach, end, side="right") - 1
        part = near[a:b]
        part[:] = m
        part &= k >= 0
        part &= t <= a_e[np.maximum(k, 0)]
        del end, k
    if not any_op:
        return a_s, a_e
    return difference_merged(a_s, a_e, *_union(ts, dur, near, lo, hi))


def _clipped(ts: F64, end: F64, mask: npt.NDArray[np.bool_], lo: float, hi: float) -> tuple[F64, F64]:
    """`clip` of the masked intervals, copying only the ones that survive the cut."""
    # min(end, hi) > max(ts, lo) exactly when each of end, hi exceeds each of ts, lo (hi > lo here).
    keep = mask & (end > ts) & (end > lo) & (ts < hi)
    s, e = ts[keep], end[keep]
    del keep
    np.maximum(s, lo, out=s)
    np.minimum(e, hi, out=e)
    return s, e


_WAITING_OPS = IMPLICIT_SYNC_OPS | {"aten::item", "aten::is_nonzero"}
"""CPU ops that only fetch a device value (``.item()``, ``bool(t)``, ``nonzero``'s size): their own
time is the host's wait. ``aten::equal`` / ``allclose`` also compute, so they are not counted."""


def _sync_wait(p: Prepared, ts: F64, dur: F64, blocking: tuple[F64, F64], lo: float, hi: float) -> float:
    """The time the host waits in syncs inside ``[lo, hi)``: the union of the sync calls' own intervals
    (the value-fetching ops, blocking runtime syncs and blocking copies), never the span from the
    first to the last (which holds the work between them)."""
    waiting = np.isin(p.cpu.i("name"), np.array(p.table.name_ids(_WAITING_OPS), np.int64))
    s, e = _clipped(ts, ts + dur, waiting, lo, hi)
    bs, be = clip(blocking[0], blocking[1], lo, hi)
    return union_length(np.concatenate([s, bs]), np.concatenate([e, be]))


def _phase(ph: PhaseName, time_us: float, total: float, per_step: int, top: Sequence[str]) -> HostPhase:
    return HostPhase(
        phase=ph,
        per_step_us=time_us / per_step,
        share=time_us / total if total > 0 else 0.0,
        top_events=list(top),
    )


def _top_names(p: Prepared, mask: npt.NDArray[np.bool_], self_us: F64, k: int = 3) -> list[str]:
    """The names with the most self time among the events that define a phase."""
    if not mask.any():
        return []
    ids = p.cpu.i("name")[mask]
    sums = np.bincount(ids, weights=self_us[mask])
    best = np.argsort(-sums, kind="stable")[:k]
    return [p.table.names[i] for i in int_list(best) if sums[i] > 0]
