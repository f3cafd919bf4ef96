"""A window run from its launches to its figures, without the MCP layer: launches are faked by writing
what a launch leaves (rank records, a stdout log) (`perfgate.benchmarking.windows.window_run`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from _window_records import Artifacts, rank_record, write_records
from perfgate.benchmarking import Contract
from perfgate.benchmarking.reading.records import RankRecord
from perfgate.benchmarking.windows.window_plan import WindowPlan
from perfgate.benchmarking.windows.window_run import Launched, LaunchFn, measure_windows

pytestmark = pytest.mark.anyio


def _launches(tmp: Path, per_launch: list[list[RankRecord]], **launched: Any) -> LaunchFn:
    async def launch_once(launch: int, label: str) -> Launched:
        records = write_records(tmp / f"launch{launch}", per_launch[launch])
        return Launched(
            launched.get("exit_code", 0),
            launched.get("failure"),
            records,
            tmp / "none.log",
            launched.get("busy_neighbour"),
        )

    return launch_once


async def test_each_launch_adds_its_windows_and_the_records_become_artifacts(tmp_path: Path) -> None:
    plan = WindowPlan(warmup_steps=2, measure_steps=4, repeats=2)
    art = Artifacts(tmp_path / "ev")
    ranks = [rank_record(r, world=2, samples=8, backward_calls=4, sample_stream=f"{r}" * 32) for r in (0, 1)]
    got = await measure_windows(plan, art, _launches(tmp_path, [ranks, ranks]), workspace=tmp_path)
    assert got.failure is None and got.summary is not None
    assert [launch for launch, _ in got.windows] == [0, 1]
    assert got.world_size == 2 and got.summary.steps == 8
    assert got.batch is not None and (got.batch.batch, got.batch.source) == (16, "data_loader")
    assert got.contract_problems == [] and len(got.timing_checks) == 2
    assert len(got.sample_streams) == 2 and got.sample_streams[0] == got.sample_streams[1] is not None
    assert {"launch0_rank0.json", "launch0_rank1.json", "launch1_rank1.json", got.series_artifact} <= set(
        art.names
    )
    assert got.first_record is not None and got.first_record.rank == 0


async def test_a_failed_launch_fails_the_run_and_says_what_kept_the_host_busy(tmp_path: Path) -> None:
    plan = WindowPlan(warmup_steps=2, measure_steps=4, repeats=3)
    launch_once = _launches(
        tmp_path,
        [[rank_record()]],
        exit_code=1,
        failure="exited with status 1",
        busy_neighbour="pid 7 (make) used 3.5 CPUs",
    )
    got = await measure_windows(plan, Artifacts(tmp_path / "ev"), launch_once, workspace=tmp_path)
    assert got.failure == "launch 0: exited with status 1"
    assert got.exit_code == 1 and got.summary is None and got.windows == [] and got.series_artifact is None
    assert got.warnings == [
        "launch 0: pid 7 (make) used 3.5 CPUs: its windows may be slowed; re-measure on a quiet host"
    ]


async def test_a_rank_that_measured_too_few_steps_fails_the_run_with_what_to_change(tmp_path: Path) -> None:
    plan = WindowPlan(warmup_steps=2, measure_steps=4, repeats=2, same_process=True)
    short = rank_record(windows=1, stop_reason="script_ended")
    got = await measure_windows(
        plan, Artifacts(tmp_path / "ev"), _launches(tmp_path, [[short]]), workspace=tmp_path
    )
    assert got.failure is not None and got.summary is None
    assert "rank 0 measured 4 of 8 steps after warm-up (the script ended: script_ended)" in got.failure


async def test_a_run_that_contradicts_its_contract_is_failed_though_its_windows_were_measured(
    tmp_path: Path,
) -> None:
    plan = WindowPlan(
        warmup_steps=2, measure_steps=4, contract=Contract({"global_batch": 8}, {"accumulation": 4})
    )
    ranks = [rank_record(samples=8, backward_calls=4)]  # one backward pass per step
    got = await measure_windows(
        plan, Artifacts(tmp_path / "ev"), _launches(tmp_path, [ranks]), workspace=tmp_path
    )
    assert got.summary is not None and got.failure is not None
    assert got.failure.startswith("the run contradicts its contract: contract declares accumulation 4")
    assert got.contract_problems and "1 backward" in got.contract_problems[0]


async def test_an_uncounted_batch_is_named_unverified(tmp_path: Path) -> None:
    plan = WindowPlan(warmup_steps=2, measure_steps=4)
    ranks = [rank_record(samples=None)]
    got = await measure_windows(
        plan, Artifacts(tmp_path / "ev"), _launches(tmp_path, [ranks]), workspace=tmp_path
    )
    assert got.failure is None and got.batch is not None and got.batch.source == "unverified"
    assert any(w.startswith("global batch unverified") for w in got.warnings)


async def test_log_timing_reads_the_windows_from_the_launchs_stdout(tmp_path: Path) -> None:
    log = tmp_path / "stdout.log"
    log.write_text("".join(f"step {i} took {10 + i % 2}.0 ms\n" for i in range(1, 20)))
    plan = WindowPlan(
        warmup_steps=2,
        measure_steps=5,
        repeats=2,
        same_process=True,
        timing="log",
        log_pattern=r"step (?P<step>\d+) took (?P<step_time_ms>[\d.]+) ms",
    )

    async def launch_once(launch: int, label: str) -> Launched:
        return Launched(0, None, tmp_path / "no-records", log)

    got = await measure_windows(plan, Artifacts(tmp_path / "ev"), launch_once, workspace=tmp_path)
    assert got.failure is None and got.world_size == 1 and len(got.windows) == 2
    assert all(w.steps == 5 for _, w in got.windows)
    assert got.first_launch == [] and got.batch is not None and got.batch.source == "unverified"

    short = WindowPlan(warmup_steps=2, measure_steps=50, timing="log", log_pattern=plan.log_pattern)
    got = await measure_windows(short, Artifacts(tmp_path / "ev2"), launch_once, workspace=tmp_path)
    assert got.failure is not None and "steps for window 0: run more steps" in got.failure
