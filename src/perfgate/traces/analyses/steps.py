"""Per-step times from ProfilerStep annotations, and how ranks differ."""

from __future__ import annotations

import numpy as np

from perfgate.benchmarking.comparing.stragglers import busy_times, slowest_rank
from perfgate.traces.models import RankProfile, RankSkew, RankStepMean, StepStats, StepSummary
from perfgate.traces.reading._group import unique_values
from perfgate.traces.reading._np import bool_list, float_list, int_list
from perfgate.traces.reading.prepare import Prepared

__all__ = ["collective_wait_us", "rank_skew", "step_summary"]


def collective_wait_us(prof: RankProfile) -> float:
    """Per step: the larger of host collective wait and device communication not hidden by compute."""
    host = 0.0
    if prof.host is not None:
        host = next((ph.per_step_us for ph in prof.host.phases if ph.phase == "collectives"), 0.0)
    steps = prof.steps.count if prof.steps is not None and prof.steps.count else 1
    device = max(prof.communication_us - prof.comm_compute_overlap_us, 0.0) / steps
    return max(host, device)


def step_summary(p: Prepared) -> StepSummary | None:
    """Every ProfilerStep of the trace; the statistics cover the steps inside the analysis window."""
    if p.step_numbers.size == 0:
        return None
    rows = p.device.i("launch")
    launches = np.sort(p.host.f("ts")[unique_values(rows[rows >= 0])])
    steps: list[StepStats] = []
    for number, start, dur, inside in zip(
        int_list(p.step_numbers),
        float_list(p.step_start),
        float_list(p.step_dur),
        bool_list(p.step_in_window),
        strict=True,
    ):
        n = int(np.searchsorted(launches, start + dur)) - int(np.searchsorted(launches, start))
        steps.append(
            StepStats(step=number, start_us=start - p.origin, duration_us=dur, launches=n, in_window=inside)
        )
    durations = p.step_dur[p.step_in_window]
    if durations.size == 0:
        durations = p.step_dur
    return StepSummary(
        count=int(durations.size),
        mean_us=float(durations.mean()),
        p50_us=float(np.median(durations)),
        min_us=float(durations.min()),
        max_us=float(durations.max()),
        steps=steps,
    )


def rank_skew(profiles: list[RankProfile]) -> RankSkew | None:
    """Compare ranks: per-step spread on shared step numbers, and spread of the temporal breakdown.

    Returns None for fewer than two ranks.
    """
    if len(profiles) < 2:
        return None
    per_rank: dict[int, dict[int, float]] = {}
    for prof in profiles:
        if prof.steps is not None:
            per_rank[prof.rank] = {s.step: s.duration_us for s in prof.steps.steps if s.in_window}
    common: set[int] = set()
    if len(per_rank) == len(profiles) and per_rank:
        step_sets = [set(v) for v in per_rank.values()]
        common = step_sets[0].intersection(*step_sets[1:])
    worst_step: int | None = None
    max_skew: float | None = None
    mean_skew: float | None = None
    if common:
        ordered = sorted(common)
        matrix = np.array([[per_rank[r][s] for s in ordered] for r in per_rank])
        spread = matrix.max(axis=0) - matrix.min(axis=0)
        worst = int(np.argmax(spread))
        worst_step, max_skew, mean_skew = ordered[worst], float(spread[worst]), float(spread.mean())
    by_rank = {prof.rank: prof for prof in profiles}
    timed = [(r, float(np.mean(list(v.values())))) for r, v in per_rank.items() if v]
    waits = [collective_wait_us(by_rank[r]) for r, _ in timed]
    busy = busy_times([m for _, m in timed], [[w] for w in waits])
    means = [
        RankStepMean(rank=r, mean_step_us=m, collective_wait_us=w, busy_us=b)
        for (r, m), w, b in zip(timed, waits, busy, strict=True)
    ]
    slowest = slowest_rank([m.rank for m in means], busy) if means else None
    spans = [p.span_us for p in profiles]
    computes = [p.compute_us for p in profiles]
    idles = [p.idle_us for p in profiles]
    return RankSkew(
        ranks=len(profiles),
        common_steps=len(common),
        max_step_skew_us=max_skew,
        mean_step_skew_us=mean_skew,
        worst_step=worst_step,
        slowest_rank=slowest,
        busy_spread_us=max(busy) - min(busy) if busy else None,
        per_rank_mean_step_us=sorted(means, key=lambda m: m.rank),
        span_spread_us=max(spans) - min(spans),
        compute_spread_us=max(computes) - min(computes),
        idle_spread_us=max(idles) - min(idles),
        most_idle_rank=profiles[int(np.argmax(idles))].rank,
    )
