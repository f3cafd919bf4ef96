"""The A/B comparison: pooled throughput, bootstrap interval, verdicts."""

from __future__ import annotations

import numpy as np
import pytest

from perfgate.benchmarking import BenchmarkError, WindowSample, compare_windows, decide
from perfgate.benchmarking.comparing.compare import bootstrap_interval, choose_unit, pooled_throughput


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


def test_fewer_than_three_launches_per_side_warn_and_one_launch_gives_no_verdict() -> None:
    c = compare_windows(_windows(10, n_windows=1), _windows(5, n_windows=2))
    assert len(c.warnings) == 2
    assert "baseline has 1 launch(es)" in c.warnings[0]
    assert "candidate has 2 launches" in c.warnings[1]
    assert c.verdict == "insufficient_launches"  # 2x faster, but launch variation is unknown


def _launches(
    step_ms: float, launches: int, rng: np.random.Generator, *, windows: int = 1, tag: str = ""
) -> list[WindowSample]:
    """Windows of ``launches`` processes: each launch runs at its own speed (launch-to-launch variation)."""
    out: list[WindowSample] = []
    for k in range(launches):
        speed = 1 + 0.03 * rng.standard_normal()
        for _ in range(windows):
            s = step_ms / 1e3 * speed * (1 + 0.05 * rng.standard_normal(20))
            out.append(WindowSample(step_s=list(s), samples_per_step=[32.0] * 20, launch=f"{tag}{k}"))
    return out


def test_same_process_windows_are_one_launch_and_decide_nothing() -> None:
    # The example: one launch against two launches of the same code, windows resampled as if
    # independent, read as "regressed 0.978x". Launch-level evidence gives no verdict from one launch.
    rng = np.random.default_rng(3)
    base = _launches(10, 1, rng, windows=3, tag="b")
    cand = _launches(10, 2, rng, windows=3, tag="c")
    c = compare_windows(base, cand)
    assert (c.baseline_windows, c.baseline_launches, c.candidate_launches) == (3, 1, 2)
    assert c.verdict == "insufficient_launches"


def test_a_vs_a_false_verdicts_stay_near_the_stated_confidence() -> None:
    # Many identical-code pairs with realistic launch-to-launch variation (3% per launch, 5% per step):
    # improved/regressed verdicts must be rare (at most the 5% a 95% interval allows, plus sampling slack).
    rng = np.random.default_rng(2026)
    pairs = 200
    false = sum(
        compare_windows(_launches(10, 3, rng, tag="b"), _launches(10, 3, rng, tag="c"), resamples=400).verdict
        in ("improved", "regressed")
        for _ in range(pairs)
    )
    assert false / pairs <= 0.08, false
    # The old method (each window its own launch, steps resampled within it) on the same kind of data
    # says "changed" far more often: what made ordinary variation read as a real effect.
    rng = np.random.default_rng(2026)
    steps_only = 0
    for _ in range(pairs):
        base = [WindowSample(w.step_s, w.samples_per_step) for w in _launches(10, 1, rng, windows=3)]
        cand = [WindowSample(w.step_s, w.samples_per_step) for w in _launches(10, 1, rng, windows=3)]
        low, high = bootstrap_interval(base, cand, "samples", resamples=400)
        speedup = pooled_throughput(cand, "samples") / pooled_throughput(base, "samples")
        steps_only += decide(speedup, low, high) != "within_noise"
    assert steps_only / pairs > 0.3, steps_only


def test_a_real_difference_is_still_found_with_three_launches() -> None:
    rng = np.random.default_rng(5)
    c = compare_windows(_launches(20, 3, rng, tag="b"), _launches(10, 3, rng, tag="c"))
    assert c.verdict == "improved" and c.speedup == pytest.approx(2.0, rel=0.1)


@pytest.mark.parametrize("seed", range(20))
def test_the_interval_always_contains_the_speedup(seed: int) -> None:
    rng = np.random.default_rng(seed)
    base = _launches(10, 2 + seed % 3, rng, tag="b")
    # skewed candidates: a few very long steps pull the pooled figure away from the bootstrap's centre
    cand = _launches(9, 2, rng, tag="c")
    cand[0] = WindowSample([*cand[0].step_s[:-1], 0.5], cand[0].samples_per_step, launch=cand[0].launch)
    c = compare_windows(base, cand, resamples=300)
    assert c.ci_low <= c.speedup <= c.ci_high


def test_stall_steps_are_named_when_pooled_and_median_speedups_disagree() -> None:
    steady = [WindowSample([0.01] * 20, [8.0] * 20, launch=f"b{k}") for k in range(3)]
    stalls = [WindowSample([0.008] * 19 + [0.2], [8.0] * 20, launch=f"c{k}") for k in range(3)]
    c = compare_windows(steady, stalls)
    assert c.median_step_speedup == pytest.approx(1.25)
    assert c.speedup < 0.6
    assert any("stalls" in w and "median-step speedup 1.250x" in w for w in c.warnings)


@pytest.mark.parametrize("bad", [-0.01, float("nan"), float("inf")])
def test_negative_or_non_finite_durations_are_invalid(bad: float) -> None:
    good = _windows(10)
    broken = [WindowSample([0.01, bad, 0.01], [1.0] * 3)]
    with pytest.raises(BenchmarkError, match="invalid step duration"):
        compare_windows(good, broken)


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
