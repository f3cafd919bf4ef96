"""The approved launch of a window run: harness in front, its settings in the environment, the tick FIFO,
the log pattern, a Slurm submission (`perfgate.benchmarking.windows.window_launch`)."""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

import pytest

from perfgate.benchmarking import BenchmarkError, Contract
from perfgate.benchmarking.windows.window_launch import (
    LOG_PATTERN_ENV,
    WindowLaunch,
    record_dir,
    window_launch,
)
from perfgate.benchmarking.windows.window_plan import Capture, WindowPlan
from perfgate.execution.slurm import SUBMIT_PROGRAMS, SlurmResources, missing_programs, steering_env
from perfgate.harness import HarnessConfig
from perfgate.harness.ticks import TICKS_ENV


def _launch(
    plan: WindowPlan,
    tmp: Path,
    env: dict[str, str] | None = None,
    harness_on_path: bool = False,
    slurm: SlurmResources | None = None,
) -> WindowLaunch:
    return window_launch(
        plan,
        ["python", "train.py", "--steps", "40"],
        env or {},
        harness_copy=tmp / "copy",
        pycache=tmp / "pycache",
        run_dir=tmp / "run",
        harness_on_path=harness_on_path,
        slurm=slurm,
    )


def test_a_plan_counts_launches_and_windows_per_launch() -> None:
    apart = WindowPlan(warmup_steps=5, measure_steps=20, repeats=3)
    together = WindowPlan(warmup_steps=5, measure_steps=20, repeats=3, same_process=True)
    assert (apart.launches, apart.windows_per_launch) == (3, 1)
    assert (together.launches, together.windows_per_launch) == (1, 3)
    assert apart.describe() == (
        "run_benchmark_window: 3 launch(es), 3 window(s) of 20 steps after 5 warm-up steps (harness timing)"
    )


def test_harness_timing_puts_the_harness_first_and_its_settings_in_the_environment(tmp_path: Path) -> None:
    plan = WindowPlan(warmup_steps=5, measure_steps=20, repeats=3, same_process=True, label="base")
    launch = _launch(plan, tmp_path, env={"OMP_NUM_THREADS": "4"})
    entry = launch.argv.index("--")
    assert launch.argv[0] == "python" and launch.argv[entry + 1 :] == ["train.py", "--steps", "40"]
    assert launch.argv[1].startswith(str(tmp_path / "copy"))
    cfg = HarnessConfig.from_env(launch.env)
    assert cfg.record_dir == str(record_dir(tmp_path / "run"))
    assert (cfg.warmup_steps, cfg.measure_steps, cfg.windows, cfg.timing) == (5, 20, 3, "optimizer")
    assert (cfg.progress_every, cfg.guard_steps, cfg.label) == (5, 5, "base")
    assert launch.env[TICKS_ENV] == str(tmp_path / "run" / "ticks")
    assert launch.env["PYTHONPYCACHEPREFIX"] == str(tmp_path / "pycache")
    assert launch.env["OMP_NUM_THREADS"] == "4" and "PYTHONPATH" not in launch.env


def test_explicit_timing_runs_the_command_as_given_and_can_put_perfgate_on_the_path(tmp_path: Path) -> None:
    plan = WindowPlan(warmup_steps=1, measure_steps=4, timing="explicit")
    launch = _launch(plan, tmp_path, harness_on_path=True, env={"PYTHONPATH": "lib"})
    assert launch.argv == ["python", "train.py", "--steps", "40"]
    assert HarnessConfig.from_env(launch.env).timing == "explicit"
    assert launch.env["PYTHONPATH"] == f"{tmp_path / 'copy'}{os.pathsep}lib"


def test_a_capture_is_asked_of_the_harness(tmp_path: Path) -> None:
    plan = WindowPlan(
        warmup_steps=5, measure_steps=4, capture=Capture(3, ("parameters", "gradients"), "c/{label}.st")
    )
    cfg = HarnessConfig.from_env(_launch(plan, tmp_path).env)
    assert (cfg.capture_step, cfg.capture_what, cfg.capture_path) == (
        3,
        ("parameters", "gradients"),
        "c/{label}.st",
    )


def test_log_timing_binds_the_pattern_to_the_approval_and_sets_no_harness(tmp_path: Path) -> None:
    pattern = r"step (?P<step>\d+) (?P<step_time_ms>[\d.]+)ms"
    launch = _launch(WindowPlan(warmup_steps=1, measure_steps=4, timing="log", log_pattern=pattern), tmp_path)
    assert launch.argv == ["python", "train.py", "--steps", "40"]
    assert launch.env[LOG_PATTERN_ENV] == pattern
    assert TICKS_ENV not in launch.env and "PERFGATE_MEASURE_STEPS" not in launch.env


def test_a_log_pattern_without_its_groups_is_refused(tmp_path: Path) -> None:
    with pytest.raises(BenchmarkError):
        _launch(WindowPlan(warmup_steps=1, measure_steps=4, timing="log", log_pattern=r"step \d+"), tmp_path)


def test_an_inconsistent_contract_is_refused_before_anything_runs(tmp_path: Path) -> None:
    bad = Contract({"global_batch": 256}, {"microbatch": 16, "accumulation": 2, "world_size": 4})
    with pytest.raises(BenchmarkError, match="the contract is inconsistent"):
        _launch(WindowPlan(warmup_steps=1, measure_steps=4, contract=bad), tmp_path)
    declared = WindowPlan(
        warmup_steps=1, measure_steps=4, samples_per_step=32, contract=Contract({"global_batch": 64})
    )
    with pytest.raises(BenchmarkError, match="samples_per_step 32 != contract global_batch 64"):
        _launch(declared, tmp_path)


def _fake_slurm(tmp: Path) -> str:
    bin_dir = tmp / "bin"
    bin_dir.mkdir()
    for name in SUBMIT_PROGRAMS:
        p = bin_dir / name
        p.write_text("#!/bin/sh\n")
        p.chmod(p.stat().st_mode | stat.S_IXUSR)
    return str(bin_dir)


def test_a_slurm_launch_submits_the_wrapped_command_with_its_resources_and_no_fifo(tmp_path: Path) -> None:
    res = SlurmResources(nodes=2, ntasks_per_node=4, gres="gpu:4", time_minutes=7)
    plan = WindowPlan(warmup_steps=1, measure_steps=4)
    launch = _launch(plan, tmp_path, slurm=res, env={"PATH": _fake_slurm(tmp_path)})
    assert launch.argv[:4] == [sys.executable, launch.argv[1], "-m", "perfgate.execution.slurm"]
    assert launch.argv[4:8] == ["--nodes=2", "--ntasks-per-node=4", "--gres=gpu:4", "--time=7"]
    assert launch.argv[8] == "--" and launch.argv[-3:] == ["train.py", "--steps", "40"]
    assert TICKS_ENV not in launch.env  # srun's nodes cannot reach this machine's FIFO


def test_a_slurm_launch_refuses_job_options_in_env_and_missing_commands(tmp_path: Path) -> None:
    plan = WindowPlan(warmup_steps=1, measure_steps=4)
    with pytest.raises(BenchmarkError, match="SLURM_NNODES"):
        _launch(plan, tmp_path, slurm=SlurmResources(), env={"SLURM_NNODES": "2"})
    with pytest.raises(BenchmarkError, match="needs salloc, srun, scancel, squeue"):
        _launch(plan, tmp_path, slurm=SlurmResources(), env={"PATH": str(tmp_path)})


def test_slurm_steering_variables_and_missing_programs_are_named() -> None:
    env = {"PET_NNODES": "2", "SBATCH_TIMELIMIT": "9", "HOME": "/root", "SLURM_X": "1"}
    assert steering_env(env) == ["PET_NNODES", "SBATCH_TIMELIMIT", "SLURM_X"]
    assert missing_programs("/nonexistent") == list(SUBMIT_PROGRAMS)
