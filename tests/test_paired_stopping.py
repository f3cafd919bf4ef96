"""The paired run's stopping rule by simulation: many seeded synthetic runs of step times shaped like a busy
host's (log-normal steps, rare 5x stalls, a launch-to-launch spread and a slow drift of the host), stopped
as `run_benchmark_pair` stops them (a look after each pair from the third, Bonferroni across the looks).

With no true change, the share of runs that settle a change stays at or under the stated alpha; a 3x
change settles at the first look; the t quantile matches the table the comparison's intervals use."""

from __future__ import annotations

import math

import numpy as np
import pytest

from perfgate.benchmarking.comparing.sequential import MIN_PAIRS, look, t_quantile
from perfgate.benchmarking.comparing.stats import t975


def _launch_median(rng: np.random.Generator, step_ms: float, steps: int = 20) -> float:
    """One launch's median step: log-normal steps around the launch's level, 3% of them 5x stalls."""
    times = step_ms * rng.lognormal(0.0, 0.08, steps)
    times[rng.random(steps) < 0.03] *= 5.0
    return float(np.median(times))


def _run(seed: int, speedup: float, max_pairs: int, alpha: float) -> tuple[str | None, int]:
    """One paired run (A B B A ...): the settled verdict (None: the budget ran out) and the pairs it took."""
    rng = np.random.default_rng(seed)
    drift = rng.normal(0.0, 0.02)  # per launch, the host's speed wanders
    level = 0.0
    ratios: list[float] = []
    for _ in range(max_pairs):
        medians = []
        for side in (0, 1):
            level += drift + rng.normal(0.0, 0.03)
            spread = math.exp(level + rng.normal(0.0, 0.06))  # launch-to-launch variation
            medians.append(_launch_median(rng, 50.0 * spread / (speedup if side else 1.0)))
        ratios.append(math.log(medians[0] / medians[1]))
        if len(ratios) >= MIN_PAIRS:
            got = look(ratios, max_pairs=max_pairs, alpha=alpha)
            if got.settled is not None:
                return got.settled, len(ratios)
    return None, max_pairs


@pytest.mark.parametrize(("alpha", "max_pairs"), [(0.05, 8), (0.10, 12)])
def test_with_no_change_the_false_verdict_rate_stays_under_alpha(alpha: float, max_pairs: int) -> None:
    runs = 3000
    false = sum(_run(seed, 1.0, max_pairs, alpha)[0] is not None for seed in range(runs))
    assert false / runs <= alpha, (false, runs)


def test_a_3x_change_settles_at_the_first_look() -> None:
    """At the first look (three launches a side) in nearly every run, the next look at the latest, on a host
    this noisy (the first look's critical t has 2 degrees of freedom)."""
    for speedup, verdict in ((3.0, "improved"), (1 / 3.0, "regressed")):
        got = [_run(seed, speedup, 8, 0.05) for seed in range(400)]
        assert all(v == verdict and pairs <= MIN_PAIRS + 1 for v, pairs in got)
        assert sum(pairs == MIN_PAIRS for _, pairs in got) >= 0.9 * len(got)


def test_a_small_effect_is_not_settled_below_min_effect() -> None:
    ratios = [math.log(1.005) + d for d in (0.0001, -0.0001, 0.0002, -0.0002)]
    assert look(ratios, max_pairs=8, min_effect=0.01).settled is None
    assert look(ratios, max_pairs=8, min_effect=0.001).settled == "improved"


def test_no_look_before_three_pairs() -> None:
    assert look([1.0, 1.0], max_pairs=8).settled is None


@pytest.mark.parametrize("df", [1, 2, 3, 4, 5, 7, 10, 20])
def test_the_t_quantile_agrees_with_the_table(df: int) -> None:
    assert t_quantile(0.95, df) == pytest.approx(t975(df), abs=2e-3)
    assert t_quantile(0.99, df) > t_quantile(0.95, df)
