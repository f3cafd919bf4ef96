"""Host drift between the two sides of an A/B comparison: measured from the launches, folded into the interval.

A comparison's interval counts launch-to-launch and step-to-step variation. It cannot see a change of
the host's speed that falls *between* the sides: baseline launches measured in one call, the candidate's
in a later call, after another job started on the machine. Each launch carries when it started (server
clock), how fast the host ran a fixed CPU probe at its edges (`host_speed_probe`, run by the server
just before and just after the launch), and how much of the CPUs the job and other processes used
(`perfgate.traces.diagnosis.hostload`); from those:

- **interleaved**: the sides' launches alternate in time (A B B A, or baseline calls before *and* after
  the candidate's). Slow drift then hits both sides and shows as launch-to-launch variance, which the
  interval already counts; a residual linear trend is still measured (below) and folded in.
- **blocks**: one side ran wholly before the other. Drift between them is estimated, in log throughput,
  as the largest of
  - *trend*: the within-side slope of log launch throughput over time (one slope, each side its own
    level), when it is significant at 95% and each side's own slope points the same way (bursty load
    tilts the sides at random), times the gap between the sides' mean launch times;
  - *A/A across calls*: where a side holds launches of several calls (evidence records), the largest
    log ratio between those calls' throughputs: the same code measured at two times;
  - *host speed*: the same fixed probe, A/A across time: ``w * |log(speed_baseline / speed_candidate)|``
    (each side's geometric mean over its launches). ``w = min(1, 2 * u)``, where ``u`` is the largest
    share of the CPUs left free by other processes that the job itself used: a job that used half of
    what was left or more counts as fully exposed to the host's speed, a job that mostly waits (on a
    device, a sleep) as little exposed.
- **unknown**: launch times are not recorded (imported evidence, detached or older records): the host
  speed and A/A measures still apply where recorded; the trend cannot be estimated.

The drift widens the interval on both sides (``low * e^-d``, ``high * e^d``), and an effect no larger
than it is ``within_noise``: no change of that size can be told from the host's own drift.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, cast

import numpy as np

from perfgate.benchmarking.comparing.stats import t975

__all__ = [
    "PROBE_OPS",
    "PROBE_REPEATS",
    "Design",
    "Drift",
    "LaunchInfo",
    "LaunchRate",
    "bracketing_plan",
    "fold",
    "host_speed_probe",
    "interleaved_plan",
    "launch_infos",
    "measure_drift",
]

Design = Literal["interleaved", "blocks", "unknown"]
PROBE_OPS = 100_000
"""Additions per probe round (about 5 ms of one core of a current server CPU)."""
PROBE_REPEATS = 4
"""Rounds per probe: its wall time spans ~20 ms, long enough to see other processes take the core."""


def host_speed_probe(ops: int = PROBE_OPS, repeats: int = PROBE_REPEATS) -> float:
    """Additions per second of a fixed pure-Python loop on this host now (higher: faster). One thread, no
    memory traffic to speak of: it measures how much of a core the host gives, not the job's workload."""
    start = time.perf_counter()
    for _ in range(repeats):
        total = 0
        for i in range(ops):
            total += i
    elapsed = time.perf_counter() - start
    return ops * repeats / elapsed if elapsed > 0 else math.inf


@dataclass(frozen=True)
class LaunchInfo:
    """What the server recorded about one launch: when it started (Unix seconds, server clock; None when
    unknown), the call (evidence id) it belongs to, and other processes' share of its CPUs (None when
    unmeasured)."""

    call: str
    started_s: float | None = None
    other_share: float | None = None
    host_speed: float | None = None
    """`host_speed_probe` at the launch's edges (geometric mean of before and after)."""
    exposure: float | None = None
    """The job's CPU use over the CPUs other processes left free (1: it used all of them)."""


@dataclass(frozen=True)
class LaunchRate:
    """One launch of one side: its pooled throughput (units per second) and what the server recorded."""

    side: Literal["baseline", "candidate"]
    throughput: float
    info: LaunchInfo


@dataclass(frozen=True)
class Drift:
    """The drift measured between the sides, in log throughput (0: none measured or none to fold).

    ``order`` is the launches by start time, ``A`` baseline and ``B`` candidate (empty when a time is
    unknown); ``sources`` say what was measured, each with its size; ``unmeasured`` what could not be.
    """

    design: Design
    order: str
    log_drift: float
    sources: list[str] = field(default_factory=list[str])
    unmeasured: list[str] = field(default_factory=list[str])

    @property
    def factor(self) -> float:
        """The drift as a throughput ratio (1.0: none)."""
        return math.exp(self.log_drift)

    def describe(self) -> str:
        """One sentence: how the sides were laid out in time and what was folded into the interval."""
        if self.design == "interleaved":
            head = f"interleaved launches ({self.order}): drift of the host hits both sides"
        elif self.design == "blocks":
            head = f"not interleaved (launch order {self.order}): each side ran in its own block"
        else:
            head = "launch times unknown (imported or older evidence): interleaving cannot be shown"
        measured = "; ".join(self.sources) if self.sources else "no drift measured"
        folded = (
            f"; folded into the interval: x/÷ {self.factor:.3f}"
            if self.log_drift > 0
            else "; nothing to fold"
        )
        missing = f"; not measured: {', '.join(self.unmeasured)}" if self.unmeasured else ""
        return f"{head}; {measured}{folded}{missing}"


def fold(speedup: float, low: float, high: float, drift: Drift) -> tuple[float, float]:
    """The interval widened by the drift on both sides; it still contains ``speedup``."""
    factor = drift.factor
    return min(low / factor, speedup), max(high * factor, speedup)


def _trend(rates: Sequence[LaunchRate]) -> tuple[float, float, int] | None:
    """(slope of log throughput per second, its standard error, degrees of freedom): one slope for both
    sides, each side its own level; None without two timed launches on a side or without residual
    degrees of freedom."""
    xs: list[float] = []
    ys: list[float] = []
    for side in ("baseline", "candidate"):
        pts = [(r.info.started_s, r.throughput) for r in rates if r.side == side]
        if any(t is None for t, _ in pts) or not pts:
            return None
        t = np.asarray([p[0] for p in pts], dtype=np.float64)
        y = np.log(np.asarray([p[1] for p in pts], dtype=np.float64))
        xs.extend(t - t.mean())
        ys.extend(y - y.mean())
    x, y = np.asarray(xs), np.asarray(ys)
    if not _sides_agree(rates, xs, ys):
        return None
    sxx = float(np.dot(x, x))
    df = x.size - 3  # two levels and one slope
    if sxx <= 0 or df < 1:
        return None
    slope = float(np.dot(x, y)) / sxx
    resid = y - slope * x
    se = math.sqrt(float(np.dot(resid, resid)) / df / sxx)
    return slope, se, df


def _sides_agree(rates: Sequence[LaunchRate], xs: Sequence[float], ys: Sequence[float]) -> bool:
    """Whether each side's own slope points the pooled slope's way. A steady drift (a ramping load, a
    cooling or heating part) moves both sides alike; load that comes and goes in bursts tilts each side at
    random, and a line through it, extrapolated across the gap between the sides, is no measurement."""
    n_a = sum(1 for r in rates if r.side == "baseline")
    x, y = np.asarray(xs), np.asarray(ys)
    slopes: list[float] = []
    for part in (slice(0, n_a), slice(n_a, None)):
        sxx = float(np.dot(x[part], x[part]))
        if sxx <= 0:
            return False
        slopes.append(float(np.dot(x[part], y[part])) / sxx)
    return slopes[0] * slopes[1] > 0


def _aa_across_calls(rates: Sequence[LaunchRate]) -> tuple[float, str] | None:
    """The largest log ratio between two calls' pooled throughputs within one side, with a sentence."""
    best: tuple[float, str] | None = None
    for side in ("baseline", "candidate"):
        by_call: dict[str, list[float]] = {}
        for r in rates:
            if r.side == side:
                by_call.setdefault(r.info.call, []).append(r.throughput)
        if len(by_call) < 2:
            continue
        means = {call: float(np.exp(np.mean(np.log(v)))) for call, v in by_call.items()}
        hi = max(means, key=means.__getitem__)
        lo = min(means, key=means.__getitem__)
        d = math.log(means[hi] / means[lo])
        if best is None or d > best[0]:
            best = (
                d,
                f"A/A across calls: the {side}'s own calls {lo} and {hi} differ by {math.exp(d):.3f}x",
            )
    return best


def _share(rates: Sequence[LaunchRate], side: str) -> str:
    shares = [r.info.other_share for r in rates if r.side == side and r.info.other_share is not None]
    return f"{float(np.mean(shares)):.0%}" if shares else "unknown"


def _host_speed(rates: Sequence[LaunchRate]) -> tuple[float, str] | str:
    """The host-speed drift (log) with a sentence; a string naming what is missing when a launch has no
    probe."""
    speeds: dict[str, float] = {}
    for side in ("baseline", "candidate"):
        values = [r.info.host_speed for r in rates if r.side == side]
        known = [v for v in values if v is not None and v > 0 and math.isfinite(v)]
        if not known or len(known) < len(values):
            return "host speed (a launch has no probe: detached, imported or older evidence)"
        speeds[side] = float(np.exp(np.mean(np.log(known))))
    used = [r.info.exposure for r in rates if r.info.exposure is not None]
    weight = min(1.0, 2.0 * max(used)) if used else 1.0
    ratio = speeds["candidate"] / speeds["baseline"]
    d = weight * abs(math.log(ratio))
    return (
        d,
        f"host speed: a fixed CPU probe ran {ratio:.3f}x as fast around the candidate's launches as around the "
        f"baseline's (other processes took {_share(rates, 'baseline')} and {_share(rates, 'candidate')} of the "
        f"CPUs), up to {math.exp(d):.3f}x for this job"
        + (f" (it used up to {max(used):.0%} of the CPUs left to it)" if used else ""),
    )


def measure_drift(rates: Sequence[LaunchRate]) -> Drift:
    """The drift between the sides of ``rates`` (every launch of both sides), as the module docstring says."""
    timed = all(r.info.started_s is not None for r in rates)
    order = ""
    design: Design = "unknown"
    if timed and rates:
        ordered = sorted(rates, key=lambda r: r.info.started_s or 0.0)
        order = "".join("A" if r.side == "baseline" else "B" for r in ordered)
        a = [r.info.started_s or 0.0 for r in rates if r.side == "baseline"]
        b = [r.info.started_s or 0.0 for r in rates if r.side == "candidate"]
        overlap = min(b) < max(a) and min(a) < max(b)
        design = "interleaved" if overlap else "blocks"
    sources: list[str] = []
    unmeasured: list[str] = []
    drifts: list[float] = [0.0]
    trend = _trend(rates) if timed else None
    if timed and trend is None:
        unmeasured.append(
            "trend (fewer than four launches, a side with one, or the sides tilting opposite ways: load in "
            "bursts, not a steady drift)"
        )
    if trend is not None:
        slope, se, df = trend
        mean_a = float(np.mean([r.info.started_s or 0.0 for r in rates if r.side == "baseline"]))
        mean_b = float(np.mean([r.info.started_s or 0.0 for r in rates if r.side == "candidate"]))
        gap = abs(mean_b - mean_a)
        if abs(slope) > t975(float(df)) * se and gap > 0:
            d = abs(slope) * gap
            drifts.append(d)
            sources.append(
                f"trend: throughput moved {math.expm1(abs(slope) * 60):.1%} per minute within the sides, "
                f"{math.exp(d):.3f}x over the {gap:.0f} s between their mean launch times"
            )
    if design != "interleaved":
        aa = _aa_across_calls(rates)
        if aa is not None:
            drifts.append(aa[0])
            sources.append(aa[1])
        speed = _host_speed(rates)
        if isinstance(speed, str):
            unmeasured.append(speed)
        else:
            drifts.append(speed[0])
            sources.append(speed[1])
    return Drift(design, order, max(drifts), sources, unmeasured)


def interleaved_plan(baseline_call: str, candidate_call: str, repeats: int = 3) -> str:
    """The calls that settle a drift question: A B B A at the call level (launches AAA BBB BBB AAA), every
    call with the same repeats, compared as one comparison (`bracketing_plan` reuses a side's call already
    made, where it can). Six
    launches a side let the rank test over launches decide with up to 5 of its 36 pairs out of order
    (four would need every pair in order)."""
    return (
        f"run_benchmark_window({baseline_call}, repeats={repeats}), then run_benchmark_window({candidate_call}, "
        f"repeats={repeats}) twice, then the baseline's call again; compare_benchmarks(baseline=[1st id, 4th id], "
        "candidate=[2nd id, 3rd id]): the baseline brackets the candidate, so drift hits both sides"
    )


def bracketing_plan(
    baseline: tuple[str, Sequence[float | None]], candidate: tuple[str, Sequence[float | None]]
) -> str | None:
    """The two calls that turn one baseline call and one candidate call, measured one after the other, into
    A B B A: the later side's call again, then the earlier side's; compared with the two calls already made,
    the earlier side brackets the later. None when that does not hold: a side of several calls, a launch
    without its start time, the sides' launches overlapping in time, or fewer than three launches a call
    (six a side is what `interleaved_plan` asks for).

    ``baseline``, ``candidate``: (evidence id, start time of each launch, server clock)."""
    sides = {"baseline": baseline, "candidate": candidate}
    for _, starts in sides.values():
        if len(starts) < 3 or any(t is None for t in starts):
            return None
    (first, (first_id, first_starts)), (second, (second_id, _)) = sorted(
        sides.items(), key=lambda kv: min(t or 0.0 for t in kv[1][1])
    )
    if max(t or 0.0 for t in first_starts) >= min(t or 0.0 for t in sides[second][1]):
        return None
    ids = {first: f"{first_id}, 2nd id", second: f"{second_id}, 1st id"}
    return (
        f"run_benchmark_window(the inputs of {second_id}, repeats=3), then run_benchmark_window(the inputs of "
        f"{first_id}, repeats=3); compare_benchmarks(baseline=[{ids['baseline']}], candidate="
        f"[{ids['candidate']}]): with the two calls already made the {first} brackets the {second} (A B B A), "
        "so drift hits both sides"
    )


def launch_infos(call: str, result: Mapping[str, Any]) -> dict[str, LaunchInfo]:
    """Launch tag (``<call>:<index>``, as the series samples carry it) -> when the server started it and its
    host load, from a window record's result (``call``: its evidence id)."""

    def column(name: str) -> list[Any]:
        value = result.get(name)
        return list(cast("list[Any]", value)) if isinstance(value, list) else []

    def number(values: list[Any], k: int) -> float | None:
        v = values[k] if k < len(values) else None
        return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None

    starts, speeds = column("launch_started_unix_s"), column("launch_host_speed")
    loads = [cast("dict[str, Any]", x) if isinstance(x, dict) else {} for x in column("host_load")]
    out: dict[str, LaunchInfo] = {}
    for k in range(max(len(starts), len(speeds), len(loads), 1)):
        load = loads[k] if k < len(loads) and loads[k].get("measured") else {}
        share, job, other, cpus = (
            number([load.get(f)], 0) for f in ("other_share", "job_cpus", "other_cpus", "cpus")
        )
        free = (cpus - other) if cpus is not None and other is not None else None
        out[f"{call}:{k}"] = LaunchInfo(
            call=call,
            started_s=number(starts, k),
            other_share=share,
            host_speed=number(speeds, k),
            exposure=min(1.0, job / free) if job is not None and free is not None and free > 0 else None,
        )
    return out
