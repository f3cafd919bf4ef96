"""The approved launch of a window run: the harness in front of the command, its settings (and the tick
FIFO) or the log pattern in the environment, a Slurm submission around it."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from perfgate.benchmarking.errors import BenchmarkError
from perfgate.benchmarking.reading.logparse import compile_pattern
from perfgate.benchmarking.windows.launch import harness_entry, launch_env, wrap_command
from perfgate.benchmarking.windows.window_plan import WindowPlan
from perfgate.benchmarking.workload.contract import check_contract
from perfgate.execution.linestamps import LOG_PATTERN_ENV
from perfgate.execution.slurm import SlurmResources, missing_programs, steering_env, submission_argv
from perfgate.execution.ticks import ticks_path

__all__ = ["LOG_PATTERN_ENV", "WindowLaunch", "record_dir", "window_launch"]


@dataclass(frozen=True)
class WindowLaunch:
    """The argv and environment changes of each launch of a window run."""

    argv: list[str]
    env: dict[str, str]


def record_dir(run_dir: Path) -> Path:
    """Where the ranks of a run in ``run_dir`` write their records."""
    return run_dir / "records"


def window_launch(
    plan: WindowPlan,
    argv: Sequence[str],
    env: Mapping[str, str],
    *,
    harness_copy: Path,
    pycache: Path,
    run_dir: Path,
    harness_on_path: bool = False,
    slurm: SlurmResources | None = None,
) -> WindowLaunch:
    """The launch ``plan`` runs (once per launch, identically); checks the contract first.

    ``harness_copy`` is the trust root's copy of perfgate (`perfgate.benchmarking.windows.launch.harness_pythonpath`),
    ``pycache`` its bytecode folder, ``run_dir`` the run's private folder; ``slurm`` submits each launch
    as a Slurm job.

    Raises:
        BenchmarkError: an inconsistent contract, a command the harness cannot be inserted into, a log
            pattern that does not compile, an environment that would steer the launch unseen, or Slurm's
            commands missing on this machine.
    """
    from perfgate.harness import HarnessConfig
    from perfgate.harness.config import default_guard_steps
    from perfgate.harness.ticks import TICKS_ENV

    if slurm is not None:
        # Said before launch_env's refusal of PET_* (which names no Slurm way to give them).
        steering = steering_env(env)
        if steering:
            raise BenchmarkError(
                f"env sets {', '.join(steering)}: Slurm and torchrun read these as job options; give resources "
                "through slurm={nodes, ntasks_per_node, cpus_per_task, gres, partition} and the time limit "
                "through timeout_s, so the approval shows them as the submission"
            )
    problems = check_contract(plan.contract)
    out = wrap_command(argv, harness_entry(harness_copy)) if plan.timing == "harness" else list(argv)
    if plan.timing == "log":
        compile_pattern(plan.log_pattern or "")
    out_env = launch_env(dict(env), pycache, harness_copy if harness_on_path else None)
    global_batch = plan.contract.invariants.get("global_batch")
    if (
        plan.samples_per_step is not None
        and isinstance(global_batch, int)
        and plan.samples_per_step != global_batch
    ):
        problems.append(f"samples_per_step {plan.samples_per_step} != contract global_batch {global_batch}")
    if problems:
        raise BenchmarkError(
            "the contract is inconsistent: " + "; ".join(problems) + ". Fix the contract and call again."
        )
    if plan.timing != "log":
        cfg = HarnessConfig(
            record_dir=str(record_dir(run_dir)),
            warmup_steps=plan.warmup_steps,
            measure_steps=plan.measure_steps,
            windows=plan.windows_per_launch,
            timing="optimizer" if plan.timing == "harness" else "explicit",
            progress_every=max(1, (plan.warmup_steps + plan.measure_steps) // 5),
            guard_steps=default_guard_steps(plan.measure_steps),
            label=plan.label,
            job=plan.job,
        )
        if plan.capture is not None:
            cfg = cfg.with_overrides(
                capture_step=plan.capture.step,
                capture_what=plan.capture.what,
                capture_path=plan.capture.path,
            )
        out_env.update(cfg.to_env())
        if slurm is None:  # srun's nodes cannot reach this machine's FIFO
            out_env[TICKS_ENV] = str(ticks_path(run_dir))
    else:
        # Bound to the approval: the human sees which lines will be read as step times, and a changed
        # pattern needs a new approval. The launched program ignores this variable.
        out_env[LOG_PATTERN_ENV] = plan.log_pattern or ""
        # Lines reach the server as they are printed, so it can stamp them (`perfgate.execution.linestamps`);
        # Python block-buffers a piped stdout otherwise.
        out_env.setdefault("PYTHONUNBUFFERED", "1")
    if slurm is not None:
        missing = missing_programs(env.get("PATH", os.environ.get("PATH", os.defpath)))
        if missing:
            raise BenchmarkError(
                f"launcher='slurm' needs {', '.join(missing)} on this machine's PATH: run the perfgate server on "
                "a login node of the cluster, or use launcher='local'"
            )
        out = submission_argv(slurm, out)
    return WindowLaunch(argv=out, env=out_env)
