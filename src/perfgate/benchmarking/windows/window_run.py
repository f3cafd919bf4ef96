"""A window run from its launches to its figures: each launch's windows, the measured batch checked against
the contract, the server's corroboration of the timing, and the warnings a reader of the figures needs.

The launches themselves are the caller's (`LaunchFn`): a blocking call runs them, a detached run's
result reads what its supervisor left, and both end in `measure_windows`, so their evidence has one form.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import anyio.to_thread
from pydantic import BaseModel, Field

from perfgate.benchmarking.errors import BenchmarkError
from perfgate.benchmarking.reading.logsettings import read_logged_settings
from perfgate.benchmarking.runs.dumps import TensorDump, tensor_dumps, unreached_dump_warning
from perfgate.benchmarking.runs.health import job_health_of_launches
from perfgate.benchmarking.runs.job import JobTiming, job_timing
from perfgate.benchmarking.runs.measured import ObservedBatch, launch_stream, observe_batch, window_health
from perfgate.benchmarking.runs.replicas import ReplicaCheck, replica_check
from perfgate.benchmarking.windows.collect import (
    WindowFailure,
    collect_records,
    harness_windows,
    log_windows,
    no_step_failure,
)
from perfgate.benchmarking.windows.corroborate import TimingCheck, corroborate_launch
from perfgate.benchmarking.windows.window_plan import WindowPlan
from perfgate.benchmarking.workload.outputs import RunOutput, written_outputs
from perfgate.benchmarking.workload.provenance import RunProvenance

if TYPE_CHECKING:
    from perfgate.benchmarking.comparing.aggregate import RunSummary, WindowSummary
    from perfgate.benchmarking.reading.records import RankRecord
    from perfgate.benchmarking.runs.health import HealthSummary
    from perfgate.execution.service import ArtifactWriter
    from perfgate.execution.ticks import LaunchTicks

__all__ = [
    "OWN_SHARE_WARN",
    "HarnessOverhead",
    "LaunchFn",
    "Launched",
    "WindowRun",
    "harness_overhead",
    "measure_windows",
]

OWN_SHARE_WARN = 0.03
"""perfgate's own share of the median step above which the answer warns that the step time includes it."""


class HarnessOverhead(BaseModel):
    """What perfgate's own code took of the launches, as the harness timed itself: a figure it reports about
    itself, not a measurement of the script, and no gate reads it."""

    step_us: float = Field(
        description="Median over launches and ranks of each one's median time inside perfgate's own probes "
        "per step after warm-up (step boundaries, forward and backward probes, pipe writes), microseconds."
    )
    share: float = Field(description="step_us over the run's median step time (0.02 = 2%).")
    startup_ms: float | None = Field(
        default=None,
        description="The launcher's own start-up: importing perfgate.harness to the script's first line, "
        "torch's import left out (median over launches; None where the launcher did not run the script).",
    )
    note: str = Field(description="The figure in one line, labelled as the harness's own account.")


def harness_overhead(records: Sequence[RankRecord], median_step_ms: float) -> HarnessOverhead | None:
    """perfgate's own time per step and at start-up from the records' self-timing (None: none reported)."""
    own = [r.harness_own for r in records if r.harness_own is not None]
    steps = [o.median_step_ns for o in own if o.median_step_ns is not None]
    if not steps or median_step_ms <= 0:
        return None
    step_us = statistics.median(steps) / 1e3
    share = step_us / (median_step_ms * 1e3)
    starts = [o.startup_ns for o in own if o.startup_ns is not None]
    startup_ms = statistics.median(starts) / 1e6 if starts else None
    note = (
        f"perfgate's own code took {step_us:.1f} µs of each step ({share:.1%} of the median step), "
        "as the harness timed itself"
    )
    if startup_ms is not None:
        note += f"; its start-up added {startup_ms:.0f} ms before the script's first line"
    return HarnessOverhead(step_us=step_us, share=share, startup_ms=startup_ms, note=note)


def _overhead_warning(overhead: HarnessOverhead) -> str:
    return (
        f"the step time includes perfgate: its own code took {overhead.step_us:.1f} µs of each step "
        f"({overhead.share:.1%} > {OWN_SHARE_WARN:.0%}), as the harness timed itself. Its probes cost a fixed "
        "few µs per step (the model's forward hook, the backward wrapper, the optimizer hook, the boundary "
        "write), so steps this short carry a visible share of it, on both sides of a comparison; for a "
        "figure closer to the script alone, give each step more work (a larger batch or more micro-batches "
        "per step)"
    )


@dataclass(frozen=True)
class Launched:
    """What one launch left: its exit status, why it failed (None: it ran to the end), the folder holding
    its rank records and its stdout log (both in the trust root, where the agent cannot write; never the
    copies in the workspace), and another process that kept the host busy while it ran."""

    exit_code: int | None
    failure: str | None
    record_dir: Path
    stdout: Path
    busy_neighbour: str | None = None
    launch_id: int | None = None
    """The id the server gave the launch (the ``session`` of the sample records it wrote); None: unknown."""


LaunchFn = Callable[[int, str], Awaitable[Launched]]
"""``(launch index, log label) -> what the launch left``."""


@dataclass
class WindowRun:
    """What a window run measured, and why it failed when it did (``failure``)."""

    windows: list[tuple[int, WindowSummary]] = field(default_factory=list[tuple[int, "WindowSummary"]])
    """(launch, window) in launch order."""
    summary: RunSummary | None = None
    """The windows pooled; None when none was measured or a launch failed."""
    world_size: int | None = None
    first_launch: list[RankRecord] = field(default_factory=list["RankRecord"])
    exit_code: int | None = None
    failure: str | None = None
    warnings: list[str] = field(default_factory=list[str])
    batch: ObservedBatch | None = None
    sample_streams: list[str | None] = field(default_factory=list[str | None])
    health: tuple[HealthSummary, int, int] | None = None
    """Training health over the measured windows, with the first and last step it covers."""
    harness_overhead: HarnessOverhead | None = None
    """perfgate's own time per step and at start-up, as the harness timed itself (no gate reads it)."""
    job_health: HealthSummary | None = None
    """Training health over every step the launches recorded (warm-up and steps after the windows too)."""
    timing_checks: list[TimingCheck] = field(default_factory=list[TimingCheck])
    replicas: list[ReplicaCheck] = field(default_factory=list[ReplicaCheck])
    tensor_dumps: list[TensorDump] = field(default_factory=list[TensorDump])
    outputs: list[RunOutput] = field(default_factory=list[RunOutput])
    """The option values of the command line the launches wrote (`perfgate.benchmarking.workload.outputs`)."""
    launch_ids: list[int | None] = field(default_factory=list[int | None])
    """Per launch: the id the server gave it (None: unknown)."""
    reported_metrics: dict[str, float] = field(default_factory=dict[str, float])
    series_artifact: str | None = None
    jobs: list[JobTiming] = field(default_factory=list[JobTiming])
    """Per launch measured as a whole job (``plan.job``): its start-up, phases and wall time."""
    logged_settings: dict[str, str] = field(default_factory=dict[str, str])
    """The dispatcher and graph arguments the first launch that printed them listed in its stdout
    (`perfgate.benchmarking.reading.logsettings`): what the log says, not what ran."""

    @property
    def first_record(self) -> RankRecord | None:
        """Rank 0's record of the first launch: its device and environment stand for the run."""
        return self.first_launch[0] if self.first_launch else None

    @property
    def contract_problems(self) -> list[str]:
        return self.batch.problems if self.batch is not None else []


async def measure_windows(
    plan: WindowPlan,
    artifacts: ArtifactWriter,
    launch_once: LaunchFn,
    *,
    workspace: Path,
    provenance: RunProvenance | None = None,
    observed: Mapping[int, LaunchTicks] | None = None,
) -> WindowRun:
    """Run (or collect) every launch of ``plan`` through ``launch_once`` and summarise its windows; the
    rank records and the step series become ``artifacts``.

    ``observed`` maps a launch to the server's stamps of its step boundaries, where it listened to them.
    """
    from perfgate.benchmarking.comparing.aggregate import summarize_run
    from perfgate.benchmarking.comparing.series import SERIES_NAME, series_document

    out = WindowRun()
    warnings = out.warnings
    all_records: list[RankRecord] = []
    launches: list[list[RankRecord]] = []
    try:
        for launch in range(plan.launches):
            label = f"launch{launch}_" if plan.launches > 1 else ""
            launched = await launch_once(launch, label)
            out.exit_code = launched.exit_code
            out.launch_ids.append(launched.launch_id)
            if not out.logged_settings:
                out.logged_settings = await anyio.to_thread.run_sync(read_logged_settings, launched.stdout)
            if launched.busy_neighbour is not None:
                warnings.append(
                    f"launch {launch}: {launched.busy_neighbour}: its windows may be slowed; re-measure on a "
                    "quiet host"
                )
            if launched.failure is not None:
                why = None
                if plan.timing != "log":
                    why = await anyio.to_thread.run_sync(no_step_failure, launched.record_dir)
                raise WindowFailure(f"launch {launch}: {why or launched.failure}")
            if plan.timing == "log":
                # Parsing and record reading are CPU-bound: off the event loop, cancellable.
                got, check = await anyio.to_thread.run_sync(log_windows, plan, launched.stdout, launch)
                out.timing_checks.append(check)
                out.world_size = 1
            else:
                records, problems = await anyio.to_thread.run_sync(
                    collect_records, artifacts, launched.record_dir, launch
                )
                got = harness_windows(plan, records, problems)
                ticks = observed.get(launch) if observed is not None else None
                out.timing_checks.append(corroborate_launch(launch, records, ticks, job=plan.job))
                out.replicas.append(replica_check(launch, records, plan.contract.execution))
                if plan.job and (timed := job_timing(launch, records, ticks)) is not None:
                    out.jobs.append(timed)
                out.first_launch = out.first_launch or records
                all_records.extend(records)
                launches.append(records)
                out.tensor_dumps.extend(tensor_dumps(workspace, launch, records, launched.launch_id))
                out.sample_streams.append(launch_stream(records))
                out.reported_metrics = (
                    {k: v for k, v in records[0].metrics.items() if math.isfinite(v)} if records else {}
                )
                out.world_size = records[0].world_size
                warnings.extend(f"rank {r.rank}: {note}" for r in records for note in r.notes)
            out.windows.extend((launch, w) for w in got)
    except BenchmarkError as exc:  # a WindowFailure among them
        out.failure = str(exc)
    if provenance is not None and provenance.argv_paths:
        dumped = [d.path for r in all_records for d in r.tensor_dumps]
        saved = [
            f.path for r in all_records if r.job is not None for f in r.job.checkpoint_files if f.op == "save"
        ]
        numbered = [i for i in out.launch_ids if i is not None]
        out.outputs = await anyio.to_thread.run_sync(
            written_outputs, provenance.argv_paths, dumped, saved, workspace, numbered
        )

    if out.windows and out.failure is None:
        out.summary = summarize_run([w for _, w in out.windows])
    if out.summary is not None and out.world_size is not None:
        out.batch = observe_batch(
            plan.contract, out.world_size, out.first_launch, plan.warmup_steps, plan.samples_per_step
        )
        warnings.extend(out.batch.warnings)
        if out.batch.problems:
            # measured beats declared: a window whose run contradicts its contract is no evidence
            out.failure = "the run contradicts its contract: " + "; ".join(out.batch.problems)
        elif out.batch.samples_per_step is None and plan.timing != "log":
            warnings.append(
                "global batch unverified: no DataLoader batch and no forward of a module with trainable "
                "parameters was seen on every measured step, so throughput and the global batch rest on what "
                "was declared; compare_benchmarks names it as unverified"
            )
    if plan.capture is not None and all_records:
        captured = {d.launch for d in out.tensor_dumps if d.step == plan.capture.step}
        absent = [n for n in range(plan.launches) if n not in captured]
        if absent:
            warnings.append(
                f"capture at step {plan.capture.step} wrote no file in launch(es) {', '.join(map(str, absent))} "
                "(the rank notes say why): call perfgate.harness.dump_tensors in the script for what the "
                "harness cannot find"
            )
    if (
        not out.tensor_dumps
        and provenance is not None
        and any(r.stop_reason == "window_complete" for r in all_records)
    ):
        scripts = {name: workspace / name for name in provenance.files}
        unreached = await anyio.to_thread.run_sync(unreached_dump_warning, scripts, plan.warmup_steps)
        if unreached is not None:
            warnings.append(unreached)
    if out.windows:
        out.series_artifact = SERIES_NAME
        artifacts.write_json(SERIES_NAME, series_document(out.windows))
    if out.summary is not None and out.summary.stats.noisy:
        warnings.append(
            f"noisy windows (IQR/median {out.summary.stats.iqr_ratio:.2f} >= 0.10): other load on the machine, "
            "too few steps, or periodic work (logging, checkpoints) inside the window"
        )
    distrusted = [
        f"launch {c.launch}: {c.status}, {c.consistency}: {'; '.join(c.reasons[:2])}"
        for c in out.timing_checks
        if c.blocks_keep
    ]
    for c in out.replicas:
        if c.status == "disagree":
            warnings.insert(0, f"launch {c.launch}: {c.reason}: no keep can rest on this run")
    if distrusted:
        # first: these figures cannot support a keep, whatever else the answer says
        warnings.insert(0, "timing not corroborated, no keep can rest on this run: " + " | ".join(distrusted))
    if out.summary is not None:
        out.harness_overhead = harness_overhead(all_records, out.summary.stats.median_ms)
        if out.harness_overhead is not None and out.harness_overhead.share > OWN_SHARE_WARN:
            warnings.append(_overhead_warning(out.harness_overhead))
        out.health = window_health(all_records)
        out.job_health = job_health_of_launches(launches)
    if out.job_health is not None and out.job_health.job_verdict == "unhealthy":
        warnings.append("training health (whole job): " + "; ".join(out.job_health.findings[:3]))
    return out
