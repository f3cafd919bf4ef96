"""Host drift between A/B sides: interleaved launches hit both sides; blocks get the drift measured and folded."""

from __future__ import annotations

import math

import numpy as np

from perfgate.benchmarking.comparing.compare import WindowSample, compare_windows
from perfgate.benchmarking.comparing.drift import LaunchInfo, LaunchRate, bracketing_plan, fold, measure_drift


def _side(
    name: str,
    call: str,
    times: list[float],
    step_s: list[float],
    speeds: list[float] | None = None,
    exposure: float | None = 1.0,
) -> tuple[list[WindowSample], dict[str, LaunchInfo]]:
    """One window of 20 steps per launch, each launch at its time, step time as given (+-0.3% jitter), the
    host probe's speed at its edges as given (a steady host by default)."""
    rng = np.random.default_rng(sum(map(ord, name)))
    windows: list[WindowSample] = []
    infos: dict[str, LaunchInfo] = {}
    for k, (t, s) in enumerate(zip(times, step_s, strict=True)):
        tag = f"{name}:{k}"
        windows.append(WindowSample(list(s * (1 + 0.003 * rng.standard_normal(20))), launch=tag))
        speed = speeds[k] if speeds is not None else 2e7
        infos[tag] = LaunchInfo(call=call, started_s=t, other_share=0.1, host_speed=speed, exposure=exposure)
    return windows, infos


def _ramp(t: float) -> float:
    """Step time of an unchanged job on a host that slows down steadily (+30% over 100 s)."""
    return 0.010 * (1 + 0.003 * t)


def test_the_same_job_in_interleaved_launches_under_a_ramping_load_is_within_noise() -> None:
    order = "ABBAABBA"
    times = [10.0 * i for i in range(len(order))]
    a_t = [t for t, s in zip(times, order, strict=True) if s == "A"]
    b_t = [t for t, s in zip(times, order, strict=True) if s == "B"]
    base, bi = _side("a", "call-a", a_t, [_ramp(t) for t in a_t])
    cand, ci = _side("b", "call-b", b_t, [_ramp(t) for t in b_t])
    result = compare_windows(base, cand, launches={**bi, **ci})
    assert result.drift is not None and result.drift.design == "interleaved"
    assert result.drift.order == order
    assert result.verdict == "within_noise"


def test_the_same_job_in_two_blocks_under_a_ramping_load_is_within_noise_with_the_trend_named() -> None:
    a_t, b_t = [0.0, 10.0, 20.0, 30.0], [40.0, 50.0, 60.0, 70.0]
    base, bi = _side("a", "call-a", a_t, [_ramp(t) for t in a_t])
    cand, ci = _side("b", "call-b", b_t, [_ramp(t) for t in b_t])
    blind = compare_windows(base, cand)
    assert blind.verdict == "regressed"  # what the interval alone says: the drift reads as a slowdown
    result = compare_windows(base, cand, launches={**bi, **ci}, settle="SETTLE-CALLS")
    assert result.drift is not None and result.drift.design == "blocks" and result.drift.order == "AAAABBBB"
    assert result.verdict == "within_noise"
    assert any(s.startswith("trend:") for s in result.drift.sources)
    assert result.warnings[0].startswith("drift: ") and "SETTLE-CALLS" in result.warnings[0]
    assert result.ci_low <= result.speedup <= result.ci_high


def test_bursty_load_that_tilts_the_sides_opposite_ways_is_not_extrapolated_as_a_trend() -> None:
    """A busy 2-core host: the baseline slowing, the candidate speeding up as a burst ends; a line through
    each side points another way, so no trend is carried across the gap and a 4x speedup stays improved."""
    base, bi = _side("a", "call-a", [0.0, 5.0, 10.0, 15.0], [0.020, 0.026, 0.030, 0.021])
    cand, ci = _side("b", "call-b", [60.0, 65.0, 70.0, 75.0], [0.0075, 0.0071, 0.0052, 0.005])
    rates_result = compare_windows(base, cand, launches={**bi, **ci})
    assert rates_result.drift is not None
    assert not any(s.startswith("trend:") for s in rates_result.drift.sources)
    assert any("tilting opposite ways" in u for u in rates_result.drift.unmeasured)
    assert rates_result.verdict == "improved"


def test_a_load_started_between_two_calls_is_caught_by_the_host_speed_probe() -> None:
    """A burner between the calls: each side steady, the candidate (the same job) 25% slower, and the
    probe 30% slower around its launches."""
    base, bi = _side("a", "call-a", [0.0, 10.0, 20.0], [0.010] * 3, [2.0e7, 2.1e7, 2.0e7])
    cand, ci = _side("b", "call-b", [60.0, 70.0, 80.0], [0.0125] * 3, [1.4e7, 1.5e7, 1.4e7])
    assert compare_windows(base, cand).verdict == "regressed"
    result = compare_windows(base, cand, launches={**bi, **ci})
    assert result.verdict == "within_noise"
    assert result.drift is not None and any(s.startswith("host speed:") for s in result.drift.sources)
    assert "drift" in result.warnings[0]


def test_a_job_that_mostly_waits_is_little_exposed_to_the_host_speed() -> None:
    """A job that used 5% of the free CPUs (it waits on a device or a sleep): a slower host moves it little."""
    base, bi = _side("a", "call-a", [0.0, 10.0, 20.0], [0.010] * 3, [2.0e7] * 3, exposure=0.05)
    cand, ci = _side("b", "call-b", [60.0, 70.0, 80.0], [0.0125] * 3, [1.4e7] * 3, exposure=0.05)
    result = compare_windows(base, cand, launches={**bi, **ci})
    assert result.drift is not None and result.drift.factor < 1.04
    assert result.verdict == "regressed"


def test_a_large_real_speedup_survives_a_small_measured_drift() -> None:
    base, bi = _side("a", "call-a", [0.0, 10.0, 20.0], [0.020] * 3, [2.0e7, 2.1e7, 2.0e7])
    cand, ci = _side("b", "call-b", [60.0, 70.0, 80.0], [0.010] * 3, [1.9e7, 1.8e7, 1.9e7])
    result = compare_windows(base, cand, launches={**bi, **ci})
    assert result.verdict == "improved"
    assert result.drift is not None and result.drift.log_drift > 0  # folded, yet far smaller than 2x
    assert result.ci_low < 2.0 / result.drift.factor * 1.01


def test_the_baseline_measured_in_two_calls_measures_a_drift_across_calls() -> None:
    a1, i1 = _side("a1", "call-a1", [0.0, 10.0], [0.010] * 2)
    a2, i2 = _side("a2", "call-a2", [100.0, 110.0], [0.011] * 2)
    cand, ci = _side("b", "call-b", [200.0, 210.0], [0.0105] * 2)
    result = compare_windows([*a1, *a2], cand, launches={**i1, **i2, **ci})
    assert result.drift is not None and result.drift.design == "blocks"
    assert any("A/A across calls" in s for s in result.drift.sources)
    assert result.verdict == "within_noise"


def test_the_baseline_before_and_after_the_candidate_is_interleaved() -> None:
    a1, i1 = _side("a1", "call-a1", [0.0, 10.0], [0.010] * 2)
    cand, ci = _side("b", "call-b", [20.0, 30.0, 40.0, 50.0], [0.005] * 4)
    a2, i2 = _side("a2", "call-a2", [60.0, 70.0], [0.010] * 2)
    result = compare_windows([*a1, *a2], cand, launches={**i1, **i2, **ci})
    assert result.drift is not None and result.drift.design == "interleaved"
    assert result.drift.order == "AABBBBAA"
    assert result.verdict == "improved"


def test_unknown_launch_times_and_loads_are_said_never_taken_as_no_drift() -> None:
    rates = [
        LaunchRate("baseline", 100.0, LaunchInfo(call="x")),
        LaunchRate("candidate", 110.0, LaunchInfo(call="y")),
    ]
    drift = measure_drift(rates)
    assert drift.design == "unknown"
    assert any("host speed" in u for u in drift.unmeasured)
    assert "launch times unknown" in drift.describe()


def test_folding_widens_both_ends_by_the_drift_and_keeps_the_speedup_inside() -> None:
    drift = measure_drift(
        [
            LaunchRate("baseline", 100.0, LaunchInfo("x", 0.0, host_speed=2e7)),
            LaunchRate("candidate", 100.0, LaunchInfo("y", 50.0, host_speed=1e7)),
        ]
    )
    assert math.isclose(drift.factor, 2.0)
    low, high = fold(1.0, 0.9, 1.1, drift)
    assert math.isclose(low, 0.45) and math.isclose(high, 2.2)


def test_a_decisive_verdict_on_sides_whose_drift_was_not_measured_says_so() -> None:
    """Evidence without launch times or probes (detached, imported): no drift is invented, none is hidden."""
    base = [WindowSample([0.020] * 20, launch=f"a:{k}") for k in range(3)]
    cand = [WindowSample([0.010] * 20, launch=f"b:{k}") for k in range(3)]
    infos = {w.launch: LaunchInfo(call=(w.launch or "")[0]) for w in [*base, *cand] if w.launch}
    result = compare_windows(base, cand, launches=infos)
    assert result.verdict == "improved"
    assert result.drift is not None and result.drift.design == "unknown"
    (line,) = [w for w in result.warnings if w.startswith("drift between the sides not measured")]
    assert "host speed" in line and "interleaved" in line


def test_one_call_a_side_one_after_the_other_is_bracketed_by_two_more_calls() -> None:
    """Issue 59 item 7: the calls already made are the first half of A B B A, so settling a drift question
    takes two more window calls, not four; the plan names the ids to compare, the earlier side first and
    last. Where the calls cannot be reused (overlapping launches, a launch without its start, fewer than
    three launches a call) there is no such plan and the four-call `interleaved_plan` stands."""
    base, cand = ("ev-a", [0.0, 10.0, 20.0]), ("ev-b", [30.0, 40.0, 50.0])
    plan = bracketing_plan(base, cand)
    assert plan is not None and plan.startswith(
        "run_benchmark_window(the inputs of ev-b, repeats=3), then run_benchmark_window(the inputs of ev-a"
    )
    assert "compare_benchmarks(baseline=[ev-a, 2nd id], candidate=[ev-b, 1st id])" in plan
    assert "the baseline brackets the candidate" in plan
    # the candidate measured first: the candidate brackets the baseline
    flipped = bracketing_plan(("ev-a", [30.0, 40.0, 50.0]), ("ev-b", [0.0, 10.0, 20.0]))
    assert flipped is not None and "baseline=[ev-a, 1st id], candidate=[ev-b, 2nd id]" in flipped
    assert "the candidate brackets the baseline" in flipped
    assert bracketing_plan(base, ("ev-b", [15.0, 40.0, 50.0])) is None
    assert bracketing_plan(base, ("ev-b", [30.0, None, 50.0])) is None
    assert bracketing_plan(base, ("ev-b", [30.0, 40.0])) is None
