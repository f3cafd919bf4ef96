"""Per-rank records -> window summaries: the slowest rank, rank skew, global throughput."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from perfgate.benchmarking import (
    BenchmarkError,
    RecordError,
    load_records,
    read_record,
    summarize_run,
    summarize_window,
)
from perfgate.benchmarking.comparing.aggregate import windows_from_series
from perfgate.harness import HarnessConfig, Window
from perfgate.harness import window as window_mod


class _Clock:
    def __init__(self) -> None:
        self.ns = 10**9

    def __call__(self) -> int:
        return self.ns


def _rank_record(
    tmp: Path,
    monkeypatch: pytest.MonkeyPatch,
    rank: int,
    step_ms: list[float],
    backward_ms: list[float],
    world: int = 2,
    warmup: int = 2,
    samples: int | None = 16,
) -> None:
    """Write rank ``rank``'s record through the real harness, with a fake clock."""
    clock = _Clock()
    monkeypatch.setattr(window_mod, "_now", clock)
    monkeypatch.setenv("RANK", str(rank))
    monkeypatch.setenv("WORLD_SIZE", str(world))
    cfg = HarnessConfig(record_dir=str(tmp), warmup_steps=warmup, measure_steps=len(step_ms) - warmup)
    w = Window(config=cfg, instrument=False)
    w.begin()
    for ms, bwd in zip(step_ms, backward_ms, strict=True):
        clock.ns += int(ms * 1e6)
        w.add_backward(int(bwd * 1e6))
        w.add_data_wait(int(ms * 0.1 * 1e6), samples)
        w.mark_step()
    w.close()


def test_in_lockstep_the_rank_that_waited_least_is_the_slowest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Both ranks take 20 ms per step; rank 0 spends 10 ms more inside backward waiting for rank 1.
    _rank_record(tmp_path, monkeypatch, 0, [50, 50] + [20] * 6, [2] * 2 + [12] * 6)
    _rank_record(tmp_path, monkeypatch, 1, [50, 50] + [20] * 6, [2] * 2 + [2] * 6)
    records = load_records(tmp_path)
    assert not records.problems
    s = summarize_window(records.records, 0)
    assert s.slowest_rank == 1
    r0, r1 = s.ranks
    assert r0.collective_wait_ms == pytest.approx(60) and r1.collective_wait_ms == 0
    assert (r0.busy_ms, r1.busy_ms) == (pytest.approx(60), pytest.approx(120))
    assert s.rank_skew == pytest.approx(1.0)  # 120 / 60 - 1
    assert s.steps == 6 and s.elapsed_s == pytest.approx(0.120)
    assert s.samples == 2 * 16 * 6
    assert s.samples_per_s == pytest.approx(192 / 0.120)
    assert s.stats.median_ms == pytest.approx(20)
    assert s.data_wait_fraction == pytest.approx(0.1)


def test_independent_ranks_use_the_longest_elapsed_for_throughput(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _rank_record(tmp_path, monkeypatch, 0, [5, 5, 10, 10, 10, 10], [1] * 6)
    _rank_record(tmp_path, monkeypatch, 1, [5, 5, 15, 15, 15, 15], [1] * 6)
    s = summarize_window(load_records(tmp_path).records, 0)
    assert s.slowest_rank == 1
    assert s.elapsed_s == pytest.approx(0.060)  # rank 1's window, not the sum of both
    assert s.samples_per_s == pytest.approx(2 * 16 * 4 / 0.060)
    assert s.host_step_s == pytest.approx([0.015] * 4)
    assert s.rank_skew == pytest.approx(0.5)


def test_global_samples_per_step_overrides_what_ranks_recorded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _rank_record(tmp_path, monkeypatch, 0, [10] * 5, [1] * 5, world=1, samples=None)
    (rec,) = load_records(tmp_path).records
    assert summarize_window([rec], 0).samples is None
    s = summarize_window([rec], 0, samples_per_step=64, tokens_per_step=64 * 128)
    assert s.samples == 64 * 3 and s.tokens == 64 * 128 * 3


def test_windows_covering_different_steps_cannot_be_aligned(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _rank_record(tmp_path, monkeypatch, 0, [10] * 6, [1] * 6, warmup=2)
    _rank_record(tmp_path, monkeypatch, 1, [10] * 6, [1] * 6, warmup=3)
    with pytest.raises(BenchmarkError, match="same warmup/measure"):
        summarize_window(load_records(tmp_path).records, 0)


def test_a_missing_window_is_an_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _rank_record(tmp_path, monkeypatch, 0, [10] * 4, [1] * 4, world=1)
    with pytest.raises(BenchmarkError, match="not window 1"):
        summarize_window(load_records(tmp_path).records, 1)


def test_missing_ranks_are_reported(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _rank_record(tmp_path, monkeypatch, 1, [10] * 4, [1] * 4, world=3)
    assert load_records(tmp_path).problems == ["no record from rank(s) [0, 2] of world size 3"]
    assert load_records(tmp_path / "nothing").problems[0].startswith("no harness record")


def test_unreadable_or_foreign_records_are_refused(tmp_path: Path) -> None:
    (tmp_path / "rank0.json").write_text("{not json")
    with pytest.raises(RecordError, match="not a valid harness record"):
        read_record(tmp_path / "rank0.json")
    (tmp_path / "rank0.json").write_text(json.dumps({"schema": "other"}))
    with pytest.raises(RecordError):
        read_record(tmp_path / "rank0.json")


def test_runs_pool_windows_as_total_work_over_total_time() -> None:
    a = windows_from_series([10.0] * 10, samples_per_step=8)
    b = windows_from_series([30.0] * 10, samples_per_step=8, index=1)
    run = summarize_run([a, b])
    assert run.samples_per_s == pytest.approx(160 / 0.4)  # not the mean of 800/s and 266.7/s
    assert run.steps == 20 and run.stats.median_ms == pytest.approx(20)
    with pytest.raises(BenchmarkError):
        summarize_run([])


@pytest.mark.parametrize("bad", [-1.0, float("nan"), float("inf")])
def test_log_parsed_negative_or_non_finite_step_times_are_invalid(bad: float) -> None:
    from perfgate.benchmarking.comparing.aggregate import windows_from_series

    with pytest.raises(BenchmarkError, match="invalid step time"):
        windows_from_series([10.0, bad, 10.0])
