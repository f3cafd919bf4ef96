"""Reading and judging a run perfgate did not launch, without the tool: ranks, world size, windows, verdict."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from perfgate.benchmarking import BenchmarkError, Contract
from perfgate.benchmarking.comparing.aggregate import windows_from_series
from perfgate.benchmarking.reading.logformats import ParsedLog
from perfgate.benchmarking.windows.importcheck import assess_import, peak_memory, rank_figures
from perfgate.benchmarking.windows.imported import (
    ImportedRun,
    ImportRequest,
    WorldSize,
    ranks_from_paths,
    read_import,
    world_size_of_logs,
)

EMPTY = Contract({}, {})


def _log(text: str, tmp_path: Path, name: str = "train.log") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def _nanogpt(steps: int, ms: float = 100.0, loss: float = 3.0) -> str:
    return "".join(
        f"iter {i}: loss {loss - i * 0.01:.4f}, time {ms + (i % 3):.2f}ms, mfu 40.00%\n" for i in range(steps)
    )


# ----------------------------------------------------------------------------- ranks and world size


def test_ranks_come_from_the_paths_or_else_from_the_order_given() -> None:
    assert ranks_from_paths([Path("any.log")]) == [0]
    assert ranks_from_paths([Path("a/rank3.log"), Path("a/rank_1.log")]) == [3, 1]
    assert ranks_from_paths([Path("attempt_0/2/stdout.log"), Path("attempt_0/0/stdout.log")]) == [2, 0]
    assert ranks_from_paths([Path("x/rank1.log"), Path("y/rank1.log")]) == [0, 1], "a repeated rank: order"
    assert ranks_from_paths([Path("a.log"), Path("b.log")]) == [0, 1], "no number: order"


def _parsed(world: int | None = None, evidence: str | None = None) -> ParsedLog:
    return ParsedLog(
        format="megatron",
        entries=[],
        mean_since_previous=True,
        world_size=world,
        world_size_evidence=evidence,
    )


def test_the_logs_world_size_wins_and_says_where_it_was_read() -> None:
    world, warnings = world_size_of_logs([_parsed(8, "line 3")], 1, None, EMPTY)
    assert world == WorldSize(8, "line 3") and warnings == []
    with pytest.raises(BenchmarkError, match=r"world_size 4 contradicts the log \(line 3\)"):
        world_size_of_logs([_parsed(8, "line 3")], 1, 4, EMPTY)
    with pytest.raises(BenchmarkError, match=r"different world sizes \[4, 8\]"):
        world_size_of_logs([_parsed(8), _parsed(4)], 2, None, EMPTY)
    with pytest.raises(BenchmarkError, match="3 per-rank files but the world size is 2"):
        world_size_of_logs([_parsed(2), _parsed(2), _parsed(2)], 3, None, EMPTY)


def test_without_the_log_the_world_size_is_the_callers_then_the_file_count_then_the_contracts() -> None:
    declared = Contract({}, {"world_size": 16})
    assert world_size_of_logs([_parsed()], 1, 2, declared)[0] == WorldSize(2, "given by the caller")
    assert world_size_of_logs([_parsed(), _parsed()], 2, None, declared)[0] == WorldSize(
        2, "2 per-rank log files"
    )
    world, warnings = world_size_of_logs([_parsed()], 1, None, declared)
    assert (
        world.ranks == 16 and world.source is not None and world.source.startswith("declared in the contract")
    )
    assert warnings == []
    world, warnings = world_size_of_logs([_parsed()], 1, None, Contract({}, {"world_size": True}))
    assert world == WorldSize(None, None)
    assert warnings and "world size is unknown" in warnings[0]


# ----------------------------------------------------------------------------- reading


def test_a_log_is_cut_into_windows_past_the_warm_up_with_its_health(tmp_path: Path) -> None:
    path = _log(_nanogpt(35), tmp_path)
    request = ImportRequest(format="nanogpt", contract=EMPTY, warmup_steps=5, windows=3, world_size=1)
    run = read_import(request, [path])
    assert [w.steps for w in run.windows] == [10, 10, 10]
    assert run.world == WorldSize(1, "given by the caller")
    assert run.ranks == [0]
    assert run.health is not None
    assert (run.health.first_step, run.health.last_step) == (5, 34)
    assert run.health.summary.verdict == "healthy"
    assert run.health.summary.loss_first is not None and run.health.summary.loss_last is not None
    assert run.health.summary.loss_last < run.health.summary.loss_first


def test_an_inconsistent_contract_is_refused_before_any_file_is_read(tmp_path: Path) -> None:
    bad = Contract({"global_batch": 64}, {"microbatch": 8, "accumulation": 1, "world_size": 4})
    with pytest.raises(BenchmarkError, match="the contract is inconsistent"):
        read_import(ImportRequest(format="nanogpt", contract=bad), [tmp_path / "never-read.log"])


def test_benchmark_files_give_one_window_per_run_and_their_own_world_size(tmp_path: Path) -> None:
    doc = {
        "schema_version": 2,
        "invariants": {"model": "m"},
        "execution": {"world_size": 2},
        "unit": "samples",
        "runs": [{"seconds": 2.0, "units": 640, "steps": 10}, {"seconds": 2.2, "units": 640, "steps": 10}],
    }
    path = tmp_path / "bench.json"
    path.write_text(json.dumps(doc))
    run = read_import(ImportRequest(format="benchmark_json", contract=EMPTY), [path])
    assert len(run.windows) == 2 and run.windows[0].samples == 640
    assert run.world == WorldSize(2, "the file's execution.world_size")
    assert run.health is None and run.ranks is None
    with pytest.raises(BenchmarkError, match=r"contradicts the file's execution\.world_size 2"):
        read_import(ImportRequest(format="benchmark_json", contract=EMPTY, world_size=4), [path])
    with pytest.raises(BenchmarkError, match="carry their own contract"):
        read_import(ImportRequest(format="benchmark_json", contract=Contract({"model": "m"}, {})), [path])


# ----------------------------------------------------------------------------- judging


def _run(world: int | None, contract: Contract, step_ms: list[float]) -> ImportedRun:
    window = windows_from_series(step_ms, index=0, samples_per_step=64)
    return ImportedRun([window], WorldSize(world, "x"), 64, None, None, contract, ["read"], [0])


def test_a_world_size_the_contract_contradicts_fails_the_import_and_other_problems_warn() -> None:
    contract = Contract({"global_batch": 64}, {"world_size": 8, "microbatch": 8, "accumulation": 1})
    steady = [100.0] * 20
    verdict = assess_import(_run(8, contract, steady), environment_known=True)
    assert verdict.failure is None and verdict.contract_problems == [] and verdict.warnings == ["read"]
    verdict = assess_import(_run(4, contract, steady), environment_known=False)
    assert verdict.failure is not None and verdict.failure.startswith("the log contradicts the contract:")
    assert "world_size" in verdict.failure
    assert verdict.warnings[0] == "read"
    assert verdict.warnings[-1] == "no environment_id: this evidence is bound to no collected environment"


def test_noisy_windows_are_named_with_their_spread() -> None:
    verdict = assess_import(_run(1, EMPTY, [100.0, 200.0] * 10), environment_known=True)
    assert any(w.startswith("noisy windows (IQR/median") and w.endswith(">= 0.10)") for w in verdict.warnings)


def test_peak_memory_prefers_allocated_and_each_rank_has_its_figures() -> None:
    window = windows_from_series([10.0, 12.0, 14.0], index=0)
    assert peak_memory([window]) == (None, None)
    rank = window.ranks[0]
    reserved = dataclasses.replace(window, ranks=[dataclasses.replace(rank, peak_reserved_bytes=300)])
    both = dataclasses.replace(
        window, ranks=[dataclasses.replace(rank, peak_allocated_bytes=100, peak_reserved_bytes=300)]
    )
    assert peak_memory([reserved]) == (300, "device_reserved")
    assert peak_memory([reserved, both]) == (100, "device_allocated")
    (figures,) = rank_figures([window, window])
    assert (figures.rank, figures.steps_measured, figures.median_step_ms) == (0, 6, 12.0)
    assert figures.elapsed_s == pytest.approx(0.072)
