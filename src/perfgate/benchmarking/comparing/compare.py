"""A/B comparison of benchmark windows: pooled throughput ratio, launch-aware interval, verdict.

Each side is a list of windows, each tagged with the launch (process) it was measured in. Throughput
pools windows as total work / total time, never as a mean of ratios.

The unit of independent evidence is a *launch*: windows of one process share its compilation, memory
layout, clocks and neighbours, so they vary together. The 95% interval is the union of two intervals
around the pooled speedup:

- a Welch interval on the log of each launch's throughput (Student t, Welch-Satterthwaite degrees of
  freedom), which is what keeps a handful of launches honest: few launches give a wide interval;
- a two-level bootstrap with a fixed seed: launches are resampled, then steps within each chosen launch.

No improved/regressed verdict is given with fewer than two launches on a side (launch-to-launch variation
is then unknown), and the interval always contains the speedup.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from perfgate.benchmarking.comparing.drift import (
    Drift,
    LaunchInfo,
    LaunchRate,
    fold,
    interleaved_plan,
    measure_drift,
)
from perfgate.benchmarking.comparing.robust import RankShift, rank_shift
from perfgate.benchmarking.comparing.stats import t975
from perfgate.benchmarking.comparing.verdict import DEFAULT_MIN_EFFECT, Verdict, decide
from perfgate.benchmarking.errors import BenchmarkError

__all__ = [
    "DEFAULT_MIN_EFFECT",
    "MIN_LAUNCHES_FOR_VERDICT",
    "MIN_WINDOWS",
    "STALL_DISAGREEMENT",
    "Comparison",
    "Unit",
    "Verdict",
    "WindowSample",
    "bootstrap_interval",
    "choose_unit",
    "compare_windows",
    "decide",
    "launch_count",
    "launch_interval",
    "launch_throughputs",
    "pooled_throughput",
]

Unit = Literal["samples", "tokens", "steps"]
MIN_WINDOWS = 3
"""Launches per side a decision should rest on (the keep gate asks for them)."""
MIN_LAUNCHES_FOR_VERDICT = 2
"""Below this many launches on a side, the comparison gives no improved/regressed verdict."""
STALL_DISAGREEMENT = 0.10
"""Relative gap between the pooled and the median-step speedup above which the comparison warns."""
_UNITS: tuple[Unit, ...] = ("samples", "tokens", "steps")
_CHUNK_ELEMENTS = 4_000_000  # bounds the bootstrap's index arrays (~32 MB of int64)


@dataclass(frozen=True)
class WindowSample:
    """One window as the comparison sees it: host seconds per step, global work per step, its launch.

    ``launch`` names the process the window was measured in (windows of one launch are one unit of
    evidence); ``None`` makes the window its own launch.
    """

    step_s: Sequence[float]
    samples_per_step: Sequence[float] | None = None
    tokens_per_step: Sequence[float] | None = None
    launch: str | None = None

    def work(self, unit: Unit) -> np.ndarray:
        column = {"samples": self.samples_per_step, "tokens": self.tokens_per_step}.get(unit)
        if unit == "steps":
            return np.ones(len(self.step_s))
        assert column is not None, f"window lacks {unit}"
        return np.asarray(column, dtype=np.float64)

    def has(self, unit: Unit) -> bool:
        if unit == "steps":
            return True
        column = self.samples_per_step if unit == "samples" else self.tokens_per_step
        return column is not None and len(column) == len(self.step_s)


def _check_finite(side: str, windows: Sequence[WindowSample]) -> None:
    """Durations and work must be finite and non-negative: anything else is corrupt input."""
    for i, w in enumerate(windows):
        for name, column in (
            ("step duration", w.step_s),
            ("samples per step", w.samples_per_step),
            ("tokens per step", w.tokens_per_step),
        ):
            if column is None or len(column) == 0:
                continue
            values = np.asarray(column, dtype=np.float64)
            bad = ~np.isfinite(values) | (values < 0)
            if bad.any():
                at = int(np.argmax(bad))
                raise BenchmarkError(
                    f"{side} window {i} has an invalid {name} {float(values[at])!r} at step {at}: durations "
                    "and work must be finite and non-negative; re-measure or fix the log pattern"
                )


def choose_unit(baseline: Sequence[WindowSample], candidate: Sequence[WindowSample]) -> Unit:
    """Samples if every window has them, else tokens, else optimizer steps."""
    windows = [*baseline, *candidate]
    return next(u for u in _UNITS if all(w.has(u) for w in windows))


def pooled_throughput(windows: Sequence[WindowSample], unit: Unit) -> float:
    """Total work / total seconds over ``windows`` (units per second).

    Raises:
        BenchmarkError: no windows, or zero total time.
    """
    seconds = sum(float(np.sum(w.step_s)) for w in windows)
    if not windows or seconds <= 0:
        raise BenchmarkError("no measured time to compute a throughput from")
    return sum(float(w.work(unit).sum()) for w in windows) / seconds


def _launches(windows: Sequence[WindowSample], unit: Unit) -> list[tuple[np.ndarray, np.ndarray]]:
    """(step seconds, work per step) per launch, the launch's windows concatenated, in first-seen order."""
    return list(_tagged_launches(windows, unit).values())


def _tagged_launches(windows: Sequence[WindowSample], unit: Unit) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """`_launches` keyed by launch tag (a window without one is its own launch)."""
    groups: dict[str, list[WindowSample]] = {}
    for i, w in enumerate(windows):
        groups.setdefault(w.launch if w.launch is not None else f"\0window{i}", []).append(w)
    return {
        tag: (
            np.concatenate([np.asarray(w.step_s, dtype=np.float64) for w in ws]),
            np.concatenate([w.work(unit) for w in ws]),
        )
        for tag, ws in groups.items()
    }


def launch_count(windows: Sequence[WindowSample]) -> int:
    """Distinct launches among ``windows`` (a window without a launch counts as its own)."""
    named = {w.launch for w in windows if w.launch is not None}
    return len(named) + sum(1 for w in windows if w.launch is None)


def _side_draws(
    launches: list[tuple[np.ndarray, np.ndarray]], resamples: int, rng: np.random.Generator
) -> np.ndarray:
    """Bootstrap replicates of one side's pooled throughput, shape ``(resamples,)``.

    Launches are drawn with replacement, then steps within each drawn launch.
    """
    n = len(launches)
    chosen = rng.integers(0, n, size=(resamples, n))
    time_tot = np.zeros(resamples)
    work_tot = np.zeros(resamples)
    for l_idx, (step_s, work) in enumerate(launches):
        m = step_s.size
        rows, _cols = np.nonzero(chosen == l_idx)
        per_chunk = max(1, _CHUNK_ELEMENTS // max(m, 1))
        for start in range(0, rows.size, per_chunk):
            r = rows[start : start + per_chunk]
            idx = rng.integers(0, m, size=(r.size, m))
            np.add.at(time_tot, r, step_s[idx].sum(axis=1))
            np.add.at(work_tot, r, work[idx].sum(axis=1))
    return work_tot / time_tot


def bootstrap_interval(
    baseline: Sequence[WindowSample],
    candidate: Sequence[WindowSample],
    unit: Unit,
    *,
    resamples: int = 2000,
    confidence: float = 0.95,
    seed: int = 0,
) -> tuple[float, float]:
    """Percentile interval of candidate/baseline pooled throughput, resampling launches then steps."""
    rng = np.random.default_rng(seed)
    cand = _side_draws(_launches(candidate, unit), resamples, rng)
    base = _side_draws(_launches(baseline, unit), resamples, rng)
    ratio = cand / base
    tail = (1.0 - confidence) / 2.0 * 100.0
    low, high = np.percentile(ratio, [tail, 100.0 - tail])
    return float(low), float(high)


def launch_interval(
    baseline: Sequence[WindowSample], candidate: Sequence[WindowSample], unit: Unit, speedup: float
) -> tuple[float, float] | None:
    """Welch 95% interval of the speedup from per-launch log throughputs, centred on ``speedup``.

    ``None`` with fewer than two launches on a side (no launch-to-launch variance to estimate).
    """
    sides: list[np.ndarray] = []
    for windows in (baseline, candidate):
        rates = [float(work.sum() / step_s.sum()) for step_s, work in _launches(windows, unit)]
        if len(rates) < MIN_LAUNCHES_FOR_VERDICT or min(rates) <= 0:
            return None
        sides.append(np.log(np.asarray(rates)))
    terms = [float(np.var(s, ddof=1)) / s.size for s in sides]
    se = math.sqrt(sum(terms))
    if se == 0.0:
        return speedup, speedup
    df = se**4 / sum(t * t / (s.size - 1) for t, s in zip(terms, sides, strict=True) if t > 0)
    half = t975(df) * se
    centre = math.log(speedup)
    return math.exp(centre - half), math.exp(centre + half)


def _median_step_speedup(
    baseline: Sequence[WindowSample], candidate: Sequence[WindowSample], unit: Unit
) -> float | None:
    """Candidate / baseline throughput from each side's median step (stalls ignored)."""
    rates: list[float] = []
    for windows in (baseline, candidate):
        step = np.concatenate([np.asarray(w.step_s, dtype=np.float64) for w in windows])
        work = np.concatenate([w.work(unit) for w in windows])
        median = float(np.median(step))
        if median <= 0:
            return None
        rates.append(float(np.mean(work)) / median)
    return rates[1] / rates[0]


@dataclass(frozen=True)
class Comparison:
    unit: Unit
    baseline_throughput: float
    candidate_throughput: float
    speedup: float
    ci_low: float
    ci_high: float
    verdict: Verdict
    baseline_windows: int
    candidate_windows: int
    baseline_launches: int
    candidate_launches: int
    median_step_speedup: float | None
    warnings: list[str]
    drift: Drift | None = None
    """How the sides lay in time and the drift folded into the interval (None: no launch facts given)."""
    rank: RankShift | None = None
    """The rank test over launches (`perfgate.benchmarking.comparing.robust`); None under two launches a side."""
    decided_by_rank: bool = False
    """The verdict is the rank test's: the pooled interval was swamped by a few wild launches."""


def _launch_rates(
    baseline: Sequence[WindowSample],
    candidate: Sequence[WindowSample],
    unit: Unit,
    launches: Mapping[str, LaunchInfo],
) -> list[LaunchRate]:
    """Each launch's throughput with what the server recorded about it (a launch it knows nothing about
    is its own call, time and load unknown)."""
    rates: list[LaunchRate] = []
    sides: tuple[tuple[Literal["baseline", "candidate"], Sequence[WindowSample]], ...] = (
        ("baseline", baseline),
        ("candidate", candidate),
    )
    for side, windows in sides:
        for tag, (step_s, work) in _tagged_launches(windows, unit).items():
            seconds = float(step_s.sum())
            if seconds <= 0:
                continue
            info = launches.get(tag, LaunchInfo(call=tag))
            rates.append(LaunchRate(side, float(work.sum()) / seconds, info))
    return rates


def compare_windows(
    baseline: Sequence[WindowSample],
    candidate: Sequence[WindowSample],
    *,
    min_effect: float = DEFAULT_MIN_EFFECT,
    resamples: int = 2000,
    seed: int = 0,
    launches: Mapping[str, LaunchInfo] | None = None,
    settle: str | None = None,
) -> Comparison:
    """Speedup of ``candidate`` over ``baseline`` with a launch-aware interval and a verdict.

    With ``launches`` (launch tag -> when it started, its call, its host load), the drift between the
    sides is measured (`perfgate.benchmarking.comparing.drift`) and folded into the interval; an effect no larger
    than it is ``within_noise``, with a warning naming the drift and ``settle`` (the calls that would
    settle it; a generic interleaved plan when None).

    Raises:
        BenchmarkError: a side has no windows, a window has no steps, or a duration or work figure is
            negative or not finite.
    """
    for side, windows in (("baseline", baseline), ("candidate", candidate)):
        if not windows:
            raise BenchmarkError(f"the {side} side has no windows")
        if any(len(w.step_s) == 0 for w in windows):
            raise BenchmarkError(f"a {side} window has no steps")
        _check_finite(side, windows)
    unit = choose_unit(baseline, candidate)
    base = pooled_throughput(baseline, unit)
    cand = pooled_throughput(candidate, unit)
    if base <= 0 or cand <= 0:
        raise BenchmarkError("a side did no work in its windows (zero samples/tokens): nothing to compare")
    speedup = cand / base
    low, high = bootstrap_interval(baseline, candidate, unit, resamples=resamples, seed=seed)
    welch = launch_interval(baseline, candidate, unit, speedup)
    if welch is not None:
        low, high = min(low, welch[0]), max(high, welch[1])
    low, high = min(low, speedup), max(high, speedup)
    drift: Drift | None = None
    unfolded = decide(speedup, low, high, min_effect)
    if launches is not None:
        drift = measure_drift(_launch_rates(baseline, candidate, unit, launches))
        low, high = fold(speedup, low, high, drift)
    counts = {"baseline": launch_count(baseline), "candidate": launch_count(candidate)}
    warnings: list[str] = []
    for side, n in counts.items():
        if n < MIN_LAUNCHES_FOR_VERDICT:
            warnings.append(
                f"{side} has {n} launch(es): launch-to-launch variation is unknown, so no improved/regressed "
                f"verdict is given; measure at least {MIN_WINDOWS} separate launches (repeats without "
                "same_process)"
            )
        elif n < MIN_WINDOWS:
            warnings.append(
                f"{side} has {n} launches; with fewer than {MIN_WINDOWS} the interval is wide and a keep needs "
                "a stated reason: measure more launches before deciding"
            )
    median_speedup = _median_step_speedup(baseline, candidate, unit)
    if median_speedup is not None and abs(math.log(speedup / median_speedup)) > math.log1p(
        STALL_DISAGREEMENT
    ):
        warnings.append(
            f"the pooled speedup {speedup:.3f}x and the median-step speedup {median_speedup:.3f}x disagree: a "
            "few long steps (stalls: data loading, checkpoints, garbage collection, recompilation) dominate "
            "one side's total time; pooled throughput counts them, the median step ignores them"
        )
    if unit == "steps":
        warnings.append(
            "no samples or tokens were recorded on every window: throughput is optimizer steps per second, "
            "valid only because the contract keeps the global batch fixed"
        )
    enough = min(counts.values()) >= MIN_LAUNCHES_FOR_VERDICT
    verdict: Verdict = decide(speedup, low, high, min_effect) if enough else "insufficient_launches"
    swamped = drift is not None and drift.log_drift > 0 and abs(math.log(speedup)) <= drift.log_drift
    if drift is not None and enough and (swamped or (unfolded != verdict)):
        verdict = "within_noise"
        warnings.insert(
            0,
            f"drift: the effect ({speedup:.3f}x) is "
            + ("no larger than" if swamped else "not clear of")
            + f" the drift measured between the sides (up to {drift.factor:.3f}x: {'; '.join(drift.sources)}), "
            "so it cannot be told from the host changing speed. Settle it with interleaved launches: "
            + (settle or interleaved_plan("the baseline's inputs", "the candidate's inputs")),
        )
    rates = [launch_throughputs(w, unit) for w in (baseline, candidate)]
    rank = rank_shift(rates[0], rates[1])
    decided_by_rank = False
    if enough and verdict == "within_noise" and rank is not None and not swamped:
        by_rank = _rank_verdict(rank, speedup, median_speedup, drift, min_effect)
        if by_rank is not None:
            verdict, decided_by_rank = by_rank, True
            warnings.insert(0, _rank_note(rank, by_rank, speedup, low, high, rates, drift))
    if (
        drift is not None
        and drift.design != "interleaved"
        and drift.unmeasured
        and verdict in ("improved", "regressed")
    ):
        warnings.append(
            f"drift between the sides not measured ({', '.join(drift.unmeasured)}): the interval does not "
            "cover a change of the host's speed between them; interleaved launches would: "
            + (settle or interleaved_plan("the baseline's inputs", "the candidate's inputs"))
        )
    return Comparison(
        unit=unit,
        baseline_throughput=base,
        candidate_throughput=cand,
        speedup=speedup,
        ci_low=low,
        ci_high=high,
        verdict=verdict,
        baseline_windows=len(baseline),
        candidate_windows=len(candidate),
        baseline_launches=counts["baseline"],
        candidate_launches=counts["candidate"],
        median_step_speedup=median_speedup,
        warnings=warnings,
        drift=drift,
        rank=rank,
        decided_by_rank=decided_by_rank,
    )


def launch_throughputs(windows: Sequence[WindowSample], unit: Unit) -> list[float]:
    """Each launch's pooled throughput."""
    return [float(work.sum() / step_s.sum()) for step_s, work in _launches(windows, unit) if step_s.sum() > 0]


def _rank_verdict(
    rank: RankShift, speedup: float, median_speedup: float | None, drift: Drift | None, min_effect: float
) -> Verdict | None:
    """improved/regressed when the rank test's interval, widened by the drift, excludes no change, and the
    pooled and median-step figures point the same way by at least ``min_effect``; else None."""
    factor = drift.factor if drift is not None else 1.0
    said = decide(rank.estimate, rank.low / factor, rank.high * factor, min_effect)
    if said == "within_noise":
        return None
    agree = [decide(x, x, x, min_effect) for x in (speedup, median_speedup) if x is not None]
    return said if all(a == said for a in agree) else None


def _rank_note(
    rank: RankShift,
    verdict: Verdict,
    speedup: float,
    low: float,
    high: float,
    rates: Sequence[Sequence[float]],
    drift: Drift | None,
) -> str:
    """Why the verdict is the rank test's, naming the launches that widened the pooled interval."""
    wild: list[str] = []
    for side, values in zip(("baseline", "candidate"), rates, strict=True):
        centre = float(np.median(values))
        far = [k for k, v in enumerate(values) if abs(math.log(v / centre)) > 0.1]
        if far:
            wild.append(f"{side} launch(es) {', '.join(map(str, far))} ran >10% from their side's median")
    factor = drift.factor if drift is not None else 1.0
    faster = verdict == "improved"
    ahead, way = (rank.u, "ahead") if faster else (rank.pairs - rank.u, "behind")
    p = rank.p_faster if faster else rank.p_slower
    return (
        f"decided by a rank test over launches: the pooled interval {low:.3f}-{high:.3f} crosses 1 because "
        + ("; ".join(wild) if wild else "the launches spread widely")
        + f", but {ahead:g} of {rank.pairs} baseline/candidate launch pairs put the candidate {way} (Mann-Whitney, "
        f"one-sided p={p:.3g}); Hodges-Lehmann speedup {rank.estimate:.3f}x, "
        f"95% {rank.low / factor:.3f}-{rank.high * factor:.3f}"
        + (f" with the drift x/÷ {factor:.3f} folded in" if factor > 1 else "")
        + f"; the pooled speedup {speedup:.3f}x points the same way"
    )
