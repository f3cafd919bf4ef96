"""The A/B comparison: pooled throughput, bootstrap interval, verdicts."""

from __future__ import annotations

import numpy as np
import pytest

from perfgate.benchmarking import BenchmarkError, WindowSample, compare_windows, decide
from perfgate.benchmarking.compare import bootstrap_interval, choose_unit, pooled_throughput


def _windows(
    step_ms: float,
    n_windows: int = 3,
    steps: int = 30,
    noise: float = 0.02,
    seed: int = 0,
    samples: float | None = 32.0,
) -> list[WindowSample]:
    rng = np.random.default_rng(seed)
    out: list[WindowSample] = []
    for _ in range(n_windows):
        s = step_ms / 1e3 * (1 + noise * rng.standard_normal(steps))
        out.append(
            WindowSample(step_s=list(s), samples_per_step=None if samples is None else [samples] * steps)
        )
    return out


def test_pooled_throughput_is_total_work_over_total_time_not_a_mean_of_rates() -> None:
    a = WindowSample(step_s=[1.0], samples_per_step=[10.0])
    b = WindowSample(step_s=[3.0, 3.0], samples_per_step=[10.0, 10.0])
    assert pooled_throughput([a, b], "samples") == pytest.approx(30 / 7)  # not (10 + 10/3) / 2


def test_a_two_times_faster_candidate_is_improved_with_speedup_near_two() -> None:
    c = compare_windows(_windows(20, seed=1), _windows(10, seed=2))
    assert c.verdict == "improved"
    assert c.speedup == pytest.approx(2.0, rel=0.05)
    assert c.ci_low < c.speedup < c.ci_high
    assert c.unit == "samples" and not c.warnings


def test_a_slower_candidate_is_regressed() -> None:
    assert compare_windows(_windows(10, seed=1), _windows(13, seed=2)).verdict == "regressed"


def test_the_same_workload_twice_is_within_noise() -> None:
    c = compare_windows(_windows(10, seed=1), _windows(10, seed=2))
    assert c.verdict == "within_noise"
    assert c.ci_low <= 1.0 <= c.ci_high or abs(c.speedup - 1) < 0.01


def test_the_interval_is_reproducible_for_a_fixed_seed() -> None:
    base, cand = _windows(10, seed=1), _windows(9, seed=2)
    assert bootstrap_interval(base, cand, "samples") == bootstrap_interval(base, cand, "samples")


def test_launch_to_launch_variation_widens_the_interval() -> None:
    # Each window is steady inside, but windows differ by +-5%: resampling windows must show it.
    def drifting(scale: list[float]) -> list[WindowSample]:
        return [WindowSample(step_s=[0.01 * k] * 30, samples_per_step=[1.0] * 30) for k in scale]

    steady = bootstrap_interval(drifting([1, 1, 1]), drifting([1, 1, 1]), "samples")
    varied = bootstrap_interval(drifting([0.95, 1, 1.05]), drifting([0.95, 1, 1.05]), "samples")
    assert varied[1] - varied[0] > 10 * (steady[1] - steady[0])


def test_a_tiny_but_significant_effect_is_still_within_noise() -> None:
    # 0.5% faster with a very tight interval: below the 1% minimum effect
    assert decide(1.005, 1.004, 1.006) == "within_noise"
    assert decide(1.05, 1.004, 1.09) == "improved"
    assert decide(0.9, 0.85, 0.95) == "regressed"
    assert decide(1.2, 0.98, 1.4) == "within_noise"


def test_fewer_than_three_windows_per_side_warn() -> None:
    c = compare_windows(_windows(10, n_windows=1), _windows(5, n_windows=2))
    assert len(c.warnings) == 2
    assert "baseline has 1 window" in c.warnings[0]


def test_the_unit_falls_back_to_steps_when_samples_are_missing_on_a_side() -> None:
    base = _windows(10, samples=None)
    cand = _windows(10)
    assert choose_unit(base, cand) == "steps"
    c = compare_windows(base, cand)
    assert any("optimizer steps per second" in w for w in c.warnings)


def test_tokens_are_used_when_samples_are_unknown() -> None:
    w = [WindowSample(step_s=[0.1] * 5, tokens_per_step=[100.0] * 5)]
    assert choose_unit(w, w) == "tokens"


def test_empty_sides_are_errors() -> None:
    with pytest.raises(BenchmarkError, match="baseline side has no windows"):
        compare_windows([], _windows(10))
    with pytest.raises(BenchmarkError, match="no steps"):
        compare_windows(_windows(10), [WindowSample(step_s=[])])
