"""Step statistics and log-parsed timing."""

from __future__ import annotations

import numpy as np
import pytest

from perfgate.benchmarking import BenchmarkError, step_stats
from perfgate.benchmarking.reading.logparse import compile_pattern, log_window, parse_step_log


def test_median_p95_and_iqr_follow_linear_interpolation() -> None:
    s = step_stats([10, 11, 12, 13, 100])
    assert s.median_ms == 12
    assert (s.q1_ms, s.q3_ms) == (11, 13)
    assert s.p95_ms == pytest.approx(np.percentile([10, 11, 12, 13, 100], 95))
    assert s.iqr_ratio == pytest.approx(2 / 12)
    assert s.noisy  # 0.167 >= 0.10


def test_a_steady_series_is_not_noisy_and_the_threshold_is_inclusive() -> None:
    assert not step_stats([10.0] * 8).noisy
    # q1 = 9.5, q3 = 10.5, median 10: IQR/median = 0.10 exactly
    edge = step_stats([9, 9.5, 10, 10.5, 11])
    assert edge.iqr_ratio == 0.10
    assert edge.noisy


def test_an_empty_series_is_an_error() -> None:
    with pytest.raises(ValueError, match="no step times"):
        step_stats([])


PATTERN = r"step (?P<step>\d+) .*step_time_ms (?P<step_time_ms>[0-9.]+)"


def test_log_lines_give_steps_after_warmup() -> None:
    lines = [f"step {i} loss 1.0 step_time_ms {100 if i < 2 else 10 + i}" for i in range(8)] + ["done"]
    entries = parse_step_log(lines, compile_pattern(PATTERN))
    window = log_window(entries, warmup_steps=2, measure_steps=4)
    assert window.step_ms == [12, 13, 14, 15]
    assert (window.first_step, window.last_step) == (2, 5)


def test_a_line_logged_every_n_steps_stands_for_n_steps() -> None:
    lines = [f"step {i} step_time_ms 20" for i in (0, 10, 20, 30)]
    window = log_window(parse_step_log(lines, compile_pattern(PATTERN)), warmup_steps=10, measure_steps=15)
    assert window.step_ms == [20.0] * 15
    assert window.lines_used == 2


def test_a_pattern_without_the_named_groups_is_refused() -> None:
    with pytest.raises(BenchmarkError, match="step_time_ms"):
        compile_pattern(r"step (?P<step>\d+)")
    with pytest.raises(BenchmarkError, match="not a usable regular expression"):
        compile_pattern(r"step (")


def test_logs_from_two_runs_are_refused() -> None:
    entries = [(0, 1.0), (1, 1.0), (0, 1.0)]
    with pytest.raises(BenchmarkError, match="backwards"):
        log_window(entries, 0, 3)


def test_no_matching_line_is_an_error_that_says_so() -> None:
    with pytest.raises(BenchmarkError, match="no log line matched"):
        log_window([], 0, 3)
