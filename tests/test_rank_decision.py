"""Issue 46 item 3: a few wild launches do not hide a clear speedup, and do not invent one.

The pooled interval (Welch over launches, two-level bootstrap) is as wide as its wildest launch. When it
crosses 1, a Mann-Whitney rank test over launches with its Hodges-Lehmann interval decides instead, if the
pooled and median-step figures point the same way; a wild launch then counts by its rank, not its size.
"""

from __future__ import annotations

import numpy as np
import pytest

from perfgate.benchmarking import WindowSample, compare_windows
from perfgate.benchmarking.comparing.drift import LaunchInfo
from perfgate.benchmarking.comparing.robust import _critical, rank_shift


def _side(step_ms: list[float], tag: str, steps: int = 20, seed: int = 0) -> list[WindowSample]:
    """One window per launch, each launch steady around its own step time."""
    rng = np.random.default_rng(seed)
    return [
        WindowSample(
            step_s=list(ms / 1e3 * (1 + 0.01 * rng.standard_normal(steps))),
            samples_per_step=[16.0] * steps,
            launch=f"{tag}:{k}",
        )
        for k, ms in enumerate(step_ms)
    ]


def test_the_critical_counts_are_the_published_rank_sum_table() -> None:
    # two-sided 5%: m = n = 4 -> 0, 5 -> 2, 8 -> 13, 10 -> 23 (Mann-Whitney U tables)
    assert [_critical(n, n, 0.025) for n in (3, 4, 5, 8, 10)] == [-1, 0, 2, 13, 23]


def test_complete_separation_of_five_launches_a_side_has_the_exact_p() -> None:
    shift = rank_shift([10.0, 10.2, 9.9, 10.1, 10.05], [13.0, 13.1, 12.9, 13.2, 13.05])
    assert shift is not None
    assert shift.u == 25 and shift.p_faster == pytest.approx(1 / 252)
    assert shift.low > 1.2 and shift.estimate == pytest.approx(1.3, rel=0.02)


def test_three_launches_a_side_cannot_reach_five_percent_so_no_interval_excludes_one() -> None:
    shift = rank_shift([10.0, 10.1, 9.9], [20.0, 20.1, 19.9])
    assert shift is not None and shift.low == 0.0 and shift.high == float("inf")


def test_a_baseline_launch_slowed_by_a_neighbour_no_longer_hides_a_clear_speedup() -> None:
    base = _side([10.0, 10.2, 9.9, 10.1, 60.0], "a")  # the last launch ran beside a CPU hog
    cand = _side([7.7, 7.8, 7.6, 7.7, 7.75], "b", seed=1)
    c = compare_windows(base, cand)
    assert c.ci_low < 1.0, "the pooled interval alone is swamped by the wild launch"
    assert c.verdict == "improved" and c.decided_by_rank
    assert c.rank is not None and c.rank.estimate == pytest.approx(10.05 / 7.7, rel=0.03)
    assert c.warnings[0].startswith("decided by a rank test over launches")
    assert "baseline launch(es) 4 ran >10% from their side's median" in c.warnings[0]


def test_a_wild_candidate_launch_that_overtakes_the_baseline_keeps_it_within_noise() -> None:
    base = _side([10.0, 10.2, 9.9, 10.1, 10.05], "a")
    cand = _side([5.0, 5.1, 4.9, 5.0, 14.0], "b", seed=1)  # one launch slower than every baseline launch
    c = compare_windows(base, cand)
    assert c.verdict == "within_noise" and not c.decided_by_rank


def test_the_same_code_twice_with_wild_launches_stays_within_noise() -> None:
    base = _side([10.0, 10.2, 9.9, 10.1, 60.0], "a")
    cand = _side([10.1, 9.8, 10.0, 45.0, 10.2], "b", seed=1)
    assert compare_windows(base, cand).verdict == "within_noise"


def test_the_rank_interval_is_widened_by_the_drift_between_the_sides() -> None:
    base = _side([10.0, 10.2, 9.9, 10.1, 60.0], "a")
    cand = _side([7.7, 7.8, 7.6, 7.7, 7.75], "b", seed=1)
    # the candidate's block ran while the host ran 1.4x faster (a fixed probe, a job using all it was given)
    launches = {
        **{f"a:{k}": LaunchInfo(call="A", host_speed=1.0, exposure=1.0) for k in range(5)},
        **{f"b:{k}": LaunchInfo(call="B", host_speed=1.4, exposure=1.0) for k in range(5)},
    }
    c = compare_windows(base, cand, launches=launches)
    assert c.drift is not None and c.drift.factor == pytest.approx(1.4, rel=0.01)
    assert c.verdict == "within_noise" and not c.decided_by_rank
