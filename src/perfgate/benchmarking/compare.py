"""A/B comparison of benchmark windows: pooled throughput ratio, bootstrap interval, verdict.

Each side is a list of windows (repeats). Throughput pools windows as total work / total time, never
as a mean of ratios. The 95% interval comes from a two-level bootstrap with a fixed seed: windows are
resampled (launch-to-launch variation), then steps within each chosen window (within-run variation).
With fewer than 3 windows a side, the first level has little to resample and the interval is
optimistic: the comparison warns.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from perfgate.benchmarking.errors import BenchmarkError
from perfgate.benchmarking.verdict import DEFAULT_MIN_EFFECT, Verdict, decide

__all__ = [
    "DEFAULT_MIN_EFFECT",
    "MIN_WINDOWS",
    "Comparison",
    "Unit",
    "Verdict",
    "WindowSample",
    "bootstrap_interval",
    "choose_unit",
    "compare_windows",
    "decide",
    "pooled_throughput",
]

Unit = Literal["samples", "tokens", "steps"]
MIN_WINDOWS = 3
_UNITS: tuple[Unit, ...] = ("samples", "tokens", "steps")
_CHUNK_ELEMENTS = 4_000_000  # bounds the bootstrap's index arrays (~32 MB of int64)


@dataclass(frozen=True)
class WindowSample:
    """One window as the comparison sees it: host seconds per step and global work per step."""

    step_s: Sequence[float]
    samples_per_step: Sequence[float] | None = None
    tokens_per_step: Sequence[float] | None = None

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


def _side_draws(
    windows: Sequence[WindowSample], unit: Unit, resamples: int, rng: np.random.Generator
) -> np.ndarray:
    """Bootstrap replicates of one side's pooled throughput, shape ``(resamples,)``."""
    n_win = len(windows)
    chosen = rng.integers(0, n_win, size=(resamples, n_win))
    time_tot = np.zeros(resamples)
    work_tot = np.zeros(resamples)
    for w_idx, window in enumerate(windows):
        step_s = np.asarray(window.step_s, dtype=np.float64)
        work = window.work(unit)
        m = step_s.size
        rows, _cols = np.nonzero(chosen == w_idx)
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
    """Percentile interval of candidate/baseline pooled throughput (deterministic for a seed)."""
    rng = np.random.default_rng(seed)
    ratio = _side_draws(candidate, unit, resamples, rng) / _side_draws(baseline, unit, resamples, rng)
    tail = (1.0 - confidence) / 2.0 * 100.0
    low, high = np.percentile(ratio, [tail, 100.0 - tail])
    return float(low), float(high)


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
    warnings: list[str]


def compare_windows(
    baseline: Sequence[WindowSample],
    candidate: Sequence[WindowSample],
    *,
    min_effect: float = DEFAULT_MIN_EFFECT,
    resamples: int = 2000,
    seed: int = 0,
) -> Comparison:
    """Speedup of ``candidate`` over ``baseline`` with a bootstrap interval and a verdict.

    Raises:
        BenchmarkError: a side has no windows, or a window has no steps.
    """
    for side, windows in (("baseline", baseline), ("candidate", candidate)):
        if not windows:
            raise BenchmarkError(f"the {side} side has no windows")
        if any(len(w.step_s) == 0 for w in windows):
            raise BenchmarkError(f"a {side} window has no steps")
    unit = choose_unit(baseline, candidate)
    base = pooled_throughput(baseline, unit)
    cand = pooled_throughput(candidate, unit)
    speedup = cand / base
    low, high = bootstrap_interval(baseline, candidate, unit, resamples=resamples, seed=seed)
    warnings: list[str] = []
    for side, windows in (("baseline", baseline), ("candidate", candidate)):
        if len(windows) < MIN_WINDOWS:
            warnings.append(
                f"{side} has {len(windows)} window(s); with fewer than {MIN_WINDOWS} the interval cannot "
                "reflect run-to-run variation: measure more repeats before deciding"
            )
    if unit == "steps":
        warnings.append(
            "no samples or tokens were recorded on every window: throughput is optimizer steps per second, "
            "valid only because the contract keeps the global batch fixed"
        )
    return Comparison(
        unit=unit,
        baseline_throughput=base,
        candidate_throughput=cand,
        speedup=speedup,
        ci_low=low,
        ci_high=high,
        verdict=decide(speedup, low, high, min_effect),
        baseline_windows=len(baseline),
        candidate_windows=len(candidate),
        warnings=warnings,
    )
