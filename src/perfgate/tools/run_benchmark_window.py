"""run_benchmark_window: launch the training command and time steady-state windows per rank.

The measurement is `perfgate.benchmarking`'s: the launch (`window_launch`), the windows and what they
measured (`window_run`, `measured`, `results`). This module turns the call into a `WindowPlan`, runs the
launches with the server's runtime (approval, host load, the tick FIFO) and commits the answer.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio.to_thread
from pydantic import ValidationError

from perfgate.benchmarking import BenchmarkError
from perfgate.benchmarking.comparing.drift import host_speed_probe
from perfgate.benchmarking.comparing.results import (
    attach_nodes,
    model_facts,
    rank_results,
    run_throughput,
    window_result,
)
from perfgate.benchmarking.comparing.sides import rank0_records
from perfgate.benchmarking.errors import RecordError
from perfgate.benchmarking.reading.records import RankRecord, read_record
from perfgate.benchmarking.runs.checkpoint_resume import ResumeCheck, check_resume
from perfgate.benchmarking.runs.dumps import TensorDump
from perfgate.benchmarking.runs.health import HARNESS_COVERS, health_model, job_health_model
from perfgate.benchmarking.runs.job import summarize_jobs
from perfgate.benchmarking.runs.measured import measured_environment
from perfgate.benchmarking.runs.saved_state import saved_states
from perfgate.benchmarking.windows.collect import launch_failure
from perfgate.benchmarking.windows.launch import harness_pythonpath, prepare_harness_path
from perfgate.benchmarking.windows.window_launch import record_dir, window_launch
from perfgate.benchmarking.windows.window_plan import Capture, WindowPlan
from perfgate.benchmarking.windows.window_run import Launched, LaunchFn, WindowRun, measure_windows
from perfgate.benchmarking.workload.provenance import RunProvenance, run_provenance
from perfgate.errors import ToolError
from perfgate.evidence import EvidenceRecord, EvidenceState
from perfgate.evidence.access import as_dict, as_list, str_list
from perfgate.execution.hang import HangDiagnosis, HangWatch
from perfgate.execution.request import CommandRequest
from perfgate.execution.rundir import input_run_dir, one_run
from perfgate.execution.slurm import SlurmResources, time_limit_minutes
from perfgate.execution.ticks import LaunchTicks, TickListener, ticks_path
from perfgate.harness.ticks import TICKS_ENV
from perfgate.helpers.statefs import fresh_dir, remove_tree
from perfgate.report.plots import step_times_png
from perfgate.serving.runtime import EvidenceBuilder, ToolRuntime
from perfgate.serving.spec import ToolSpec
from perfgate.tools.run_benchmark_window_models import (
    RunBenchmarkWindowInput,
    RunBenchmarkWindowOutput,
    SlurmLaunch,
)
from perfgate.traces.diagnosis.hostload import HostLoadSampler, busy_neighbour
from perfgate.traces.models import HostLoad

__all__ = [
    "SPEC",
    "BlockingLaunches",
    "command",
    "plan",
    "record_windows",
    "run",
    "window_provenance",
    "window_run_dir",
]


# --------------------------------------------------------------------------- the command


def plan(inp: RunBenchmarkWindowInput) -> WindowPlan:
    """What the call measures, in the domain's terms."""
    capture = inp.capture
    return WindowPlan(
        warmup_steps=inp.warmup_steps,
        measure_steps=inp.measure_steps,
        repeats=inp.repeats,
        same_process=inp.same_process,
        timing=inp.timing,
        log_pattern=inp.log_pattern,
        samples_per_step=inp.samples_per_step,
        tokens_per_step=inp.tokens_per_step,
        label=inp.label,
        contract=inp.contract.contract(),
        job=inp.job,
        capture=Capture(capture.step, tuple(capture.what), capture.path) if capture is not None else None,
    )


def window_run_dir(inp: RunBenchmarkWindowInput, rt: ToolRuntime) -> Path:
    # In the trust root: the harness writes its records where only the operator can write, so the agent
    # cannot replace them while the run goes on (nor plant links that the run's cleanup would follow).
    return input_run_dir(rt.private_dir / "bench-runs", inp.model_dump(mode="json"))


def _slurm(inp: RunBenchmarkWindowInput) -> SlurmResources | None:
    if inp.launcher != "slurm":
        return None
    s = inp.slurm or SlurmLaunch()
    return SlurmResources(
        nodes=s.nodes,
        ntasks_per_node=s.ntasks_per_node,
        cpus_per_task=s.cpus_per_task,
        gres=s.gres,
        partition=s.partition,
        time_minutes=time_limit_minutes(inp.timeout_s),
    )


def command(inp: RunBenchmarkWindowInput, rt: ToolRuntime) -> CommandRequest:
    """The launch this call runs (once per launch, identically); validates the contract first.

    Raises:
        ToolError: an inconsistent contract, or a command the harness cannot be inserted into.
    """
    trust = rt.ledger.trust
    p = plan(inp)
    try:
        launch = window_launch(
            p,
            inp.command,
            inp.env,
            harness_copy=harness_pythonpath(trust.state_dir),
            pycache=trust.pycache_dir,
            run_dir=window_run_dir(inp, rt),
            harness_on_path=inp.harness_on_path,
            slurm=_slurm(inp),
        )
    except BenchmarkError as exc:
        raise ToolError(str(exc)) from exc
    return CommandRequest(
        argv=tuple(launch.argv),
        cwd=rt.resolve_path(inp.cwd, kind="dir"),
        env=launch.env,
        timeout_s=inp.timeout_s,
        reason=inp.reason or p.describe(),
    )


# --------------------------------------------------------------------------- the run


def _resume_target(inp: RunBenchmarkWindowInput, rt: ToolRuntime) -> EvidenceRecord | None:
    """The uninterrupted run a resume launch names (``resume_of``), checked before anything runs.

    Raises:
        ToolError: not a job=true window record of this ledger, or another command, cwd or env.
    """
    if inp.resume_of is None:
        return None
    first = (
        "run_benchmark_window(command=<the candidate's command>, job=true, ...) first (its checkpoint saves and "
        "every step's loss are kept), then this call with resume_of=<its evidence_id>"
    )
    target = rt.ledger.get(inp.resume_of)
    if target is None or target.tool != "run_benchmark_window":
        raise ToolError(
            f"resume_of={inp.resume_of!r} is no run_benchmark_window record of this ledger: {first}"
        )
    if target.state.value != "executed" or not target.inputs.get("job") or target.inputs.get("resume_of"):
        raise ToolError(
            f"resume_of={inp.resume_of!r} is not an executed, uninterrupted job=true run (state "
            f"{target.state.value}, job={target.inputs.get('job')!r}, resume_of={target.inputs.get('resume_of')!r})"
            f": {first}"
        )
    command_was = str_list(target.inputs.get("command"))
    env_was = {k: str(v) for k, v in as_dict(target.inputs.get("env")).items()}
    same = (
        f"command={command_was!r} plus the resume option, cwd={target.inputs.get('cwd')!r}, env={env_was!r}"
    )
    if inp.command[: len(command_was)] != command_was:
        raise ToolError(
            f"a resume launch runs the command of {inp.resume_of} with its resume option added at the end: "
            f"call again with {same}"
        )
    if inp.cwd != target.inputs.get("cwd") or any(inp.env.get(k) != v for k, v in env_was.items()):
        raise ToolError(
            f"a resume launch keeps the cwd and env of {inp.resume_of} (it may add variables): call again with "
            f"{same}"
        )
    return target


def _other_code(ran: RunProvenance, target: EvidenceRecord) -> str | None:
    """How the code ``ran`` differs from the code ``target`` recorded: the commit, the uncommitted diff, or a
    file both commands name; None where they agree."""
    was = as_dict(target.result.get("provenance"))
    code = as_dict(was.get("code"))
    if (code.get("commit"), code.get("diff_sha256")) != (ran.code.commit, ran.code.diff_sha256):
        return f"commit {ran.code.commit} and diff {ran.code.diff_sha256} against {code.get('commit')} and {code.get('diff_sha256')}"
    files = as_dict(was.get("files"))
    changed = sorted(p for p, digest in ran.files.items() if p in files and files[p] != digest)
    return f"changed since: {', '.join(changed[:3])}" if changed else None


def _launch_records(ev: EvidenceBuilder) -> list[RankRecord]:
    """Rank 0's record of each launch of this run, in launch order (one that does not decode is left out)."""
    found: list[RankRecord] = []
    for path in sorted(ev.dir.glob("launch*_rank0.json"), key=lambda p: int(p.name[6:].split("_")[0])):
        with contextlib.suppress(RecordError):
            found.append(read_record(path))
    return found


def _resume_check(
    inp: RunBenchmarkWindowInput,
    rt: ToolRuntime,
    ev: EvidenceBuilder,
    dumps: list[TensorDump],
    provenance: RunProvenance | None,
) -> ResumeCheck | None:
    """The resumed launches (this record's rank 0 copies) against the run ``resume_of`` names; ``dumps``:
    this run's tensor files, paired with that run's recorded ones at the aligned step; ``provenance``: the
    code this run ran, held to the code that run ran."""
    target = rt.ledger.get(inp.resume_of) if inp.resume_of is not None else None
    if target is None:
        return None
    resumed = _launch_records(ev)
    theirs: list[TensorDump] = []
    for raw in as_list(target.result.get("tensor_dumps")):
        with contextlib.suppress(ValidationError):
            theirs.append(TensorDump.model_validate(raw))
    return check_resume(
        rank0_records(rt.workspace, target),
        resumed,
        resume_of=target.id,
        workspace=rt.workspace,
        dumps=(theirs, dumps),
        other_code=_other_code(provenance, target) if provenance is not None else None,
    )


async def run(inp: RunBenchmarkWindowInput, rt: ToolRuntime) -> RunBenchmarkWindowOutput:
    request = command(inp, rt)
    await anyio.to_thread.run_sync(_resume_target, inp, rt)
    if inp.timing == "harness" or inp.harness_on_path:
        await anyio.to_thread.run_sync(prepare_harness_path, harness_pythonpath(rt.ledger.trust.state_dir))
    run_dir = window_run_dir(inp, rt)
    if inp.detach:
        return await _start_detached(inp, rt, request, run_dir)
    with one_run(run_dir, rt.tool, rt.relative(run_dir)):
        return await _run_blocking(inp, rt, request, run_dir)


def window_provenance(inp: RunBenchmarkWindowInput, rt: ToolRuntime, ev: EvidenceBuilder) -> RunProvenance:
    cwd = rt.resolve_path(inp.cwd, kind="dir")
    return run_provenance(inp.command, inp.cwd, cwd, inp.env, rt.workspace, ev)


async def _start_detached(
    inp: RunBenchmarkWindowInput, rt: ToolRuntime, request: CommandRequest, run_dir: Path
) -> RunBenchmarkWindowOutput:
    """Start the approved launches under a detached supervisor; the record says where to follow them."""
    launches = plan(inp).launches
    records = None if inp.timing == "log" else str(record_dir(run_dir))
    if records is not None:  # refused now when a run of this input holds it; the supervisor then waits
        with one_run(run_dir, rt.tool, rt.relative(run_dir)):
            pass
    ev = rt.evidence()
    # what ran is captured now, at launch (the code may change while the run goes on)
    provenance = await anyio.to_thread.run_sync(window_provenance, inp, rt, ev)
    meta = {"inputs": inp.model_dump(mode="json"), "provenance": provenance.model_dump(mode="json")}
    run_id, _ = await rt.start_detached(request, launches=launches, record_dir=records, meta=meta)
    out = _render(inp, ev, rt, WindowRun())
    out.state = EvidenceState.PLANNED
    out.failure_reason = None
    out.run_id = run_id
    out.provenance = provenance
    out.warnings = [
        f"detached run {run_id} started ({launches} launch(es)); nothing is measured yet: follow it with "
        f"benchmark_run(action='wait', run_id='{run_id}'), then benchmark_run(action='result', run_id='{run_id}')"
    ]
    return await rt.commit(ev, out, command=list(request.argv), environment_id=inp.environment_id)


@dataclass
class BlockingLaunches:
    """Runs one launch at a time of a blocking run, here, watched from outside, and keeps what the server
    saw of each (host load, start time, host speed, step stamps, hangs) for `record_windows`.

    ``request`` is what this call's approval covers; ``side`` which of a pair's sides runs (0: the
    request itself, or a pair's baseline; 1: a pair's candidate); ``around`` puts that side's code in place
    for each launch (a baseline at a git ref). ``run_dir`` is held by the caller.
    """

    inp: RunBenchmarkWindowInput
    rt: ToolRuntime
    request: CommandRequest
    ev: EvidenceBuilder
    run_dir: Path
    side: int = 0
    around: Callable[[], contextlib.AbstractContextManager[object]] | None = None
    host_loads: list[HostLoad] = field(default_factory=list[HostLoad])
    starts: list[float] = field(default_factory=list[float])
    speeds: list[float] = field(default_factory=list[float])
    observed: dict[int, LaunchTicks] = field(default_factory=dict[int, LaunchTicks])
    hangs: list[HangDiagnosis] = field(default_factory=list[HangDiagnosis])

    async def __call__(self, launch: int, label: str) -> Launched:
        inp, rt, ev, run_dir = self.inp, self.rt, self.ev, self.run_dir
        records = record_dir(run_dir)
        fresh_dir(records)
        sampler = HostLoadSampler()
        sampler.start()
        before = await anyio.to_thread.run_sync(host_speed_probe)
        self.starts.append(time.time())
        listen = TICKS_ENV in self.request.sides[self.side].env
        with TickListener(ticks_path(run_dir)) if listen else contextlib.nullcontext() as listener:
            ticks = listener.ticks if listener is not None else None
            watch = HangWatch(inp.stall_s, None if inp.timing == "log" else records, ticks)
            result = await rt.run_command(
                self.request,
                ev,
                label=label,
                log_dir=run_dir,
                watch=watch,
                side=self.side,
                around=self.around,
            )
        if listener is not None:
            self.observed[launch] = listener.ticks
        for diagnosis in watch.diagnoses:
            if watch.dumps:
                ev.write_text(f"{label}hang_stacks.txt", watch.dumps_text())
                diagnosis.stacks_artifact = rt.relative(ev.dir / f"{label}hang_stacks.txt")
            self.hangs.append(diagnosis)
        load = sampler.stop()
        self.host_loads.append(load)
        self.speeds.append(math.sqrt(before * await anyio.to_thread.run_sync(host_speed_probe)))
        failure = None if result.succeeded else launch_failure(result)
        if result.stalled and watch.ended is not None:
            failure = f"it made no progress and was stopped: {watch.ended.summary}"
        return Launched(
            result.exit_code,
            failure,
            records,
            Path(result.stdout.path),
            busy_neighbour(load),
            result.launch_id,
        )

    async def record(
        self,
        provenance: RunProvenance | None,
        launch_once: LaunchFn | None = None,
        inp: RunBenchmarkWindowInput | None = None,
    ) -> RunBenchmarkWindowOutput:
        """`record_windows` with what these launches kept; ``launch_once`` (default: run them) and
        ``inp`` (default: this run's) where the launches already ran."""
        return await record_windows(
            inp or self.inp,
            self.rt,
            self.request.sides[self.side],
            self.ev,
            launch_once or self,
            provenance,
            host_loads=self.host_loads,
            observed=self.observed,
            launch_starts=self.starts,
            launch_speeds=self.speeds,
            hangs=self.hangs,
        )


async def _run_blocking(
    inp: RunBenchmarkWindowInput, rt: ToolRuntime, request: CommandRequest, run_dir: Path
) -> RunBenchmarkWindowOutput:
    """`run` without detach, holding ``run_dir``: each launch runs here, watched from outside."""
    ev = rt.evidence()
    provenance = await anyio.to_thread.run_sync(window_provenance, inp, rt, ev)
    # The server's own folder: what the agent planted at its name is removed, never followed.
    fresh_dir(run_dir)
    try:
        return await BlockingLaunches(inp, rt, request, ev, run_dir).record(provenance)
    finally:
        remove_tree(run_dir)


async def record_windows(
    inp: RunBenchmarkWindowInput,
    rt: ToolRuntime,
    request: CommandRequest,
    ev: EvidenceBuilder,
    launch_once: LaunchFn,
    provenance: RunProvenance | None,
    *,
    run_id: str | None = None,
    host_loads: Sequence[HostLoad] = (),
    observed: Mapping[int, LaunchTicks] | None = None,
    launch_starts: Sequence[float] = (),
    launch_speeds: Sequence[float] = (),
    hangs: Sequence[HangDiagnosis] = (),
) -> RunBenchmarkWindowOutput:
    """Measure every launch (`perfgate.benchmarking.windows.window_run.measure_windows`), render the answer and commit
    it as this tool's record: the blocking call and a detached run's result both end here.

    ``host_loads``, ``launch_starts`` and ``launch_speeds`` (one per launch) are filled by ``launch_once``
    where the launches run here; ``observed`` too, where the request named a tick FIFO; ``hangs`` holds
    what the hang watch found (the one that ended a launch is the answer's ``hang``, others are warnings).
    """
    got = await measure_windows(
        plan(inp), ev, launch_once, workspace=rt.workspace, provenance=provenance, observed=observed
    )
    if got.first_launch:
        by_rank = {r.rank: [ns / 1e6 for ns in r.steps.step_time_ns] for r in got.first_launch}
        title = f"Step time per step ({inp.label or 'window'}, launch 0)"
        await rt.plot(
            ev, "step_times.png", lambda: step_times_png(by_rank, inp.warmup_steps, title), key=True
        )
    out = _render(inp, ev, rt, got)
    out.saved_states = saved_states(await anyio.to_thread.run_sync(_launch_records, ev))
    if got.failure is None and (
        resumed := await anyio.to_thread.run_sync(_resume_check, inp, rt, ev, got.tensor_dumps, provenance)
    ):
        out.checkpoint_resume = resumed
        out.summary = f"checkpoint resume {resumed.status}: {resumed.reason}" + (
            f"; {out.summary}" if out.summary else ""
        )
    out.provenance = provenance
    out.host_load = list(host_loads)
    out.launch_started_unix_s = list(launch_starts)
    out.launch_host_speed = list(launch_speeds)
    out.run_id = run_id
    out.hang = next((h for h in hangs if h.ended_run), None)
    out.warnings += [f"a launch stalled and went on: {h.summary}" for h in hangs if not h.ended_run]
    return await rt.commit(
        ev, out, command=list(request.argv), exit_code=got.exit_code, environment_id=inp.environment_id
    )


def _render(
    inp: RunBenchmarkWindowInput, ev: EvidenceBuilder, rt: ToolRuntime, got: WindowRun
) -> RunBenchmarkWindowOutput:
    first = got.first_record
    device = first.device if first is not None else None
    batch = got.batch
    health = got.health
    common: dict[str, Any] = {
        "evidence_id": ev.id,
        "exit_code": got.exit_code,
        "label": inp.label,
        "timing": inp.timing,
        "world_size": got.world_size,
        "device": f"{device.kind} {device.name or ''}".strip() if device else None,
        "step_series_artifact": got.series_artifact,
        "artifacts": [rt.relative(ev.dir / name) for name in ev.artifact_names],
        "contract_problems": got.contract_problems,
        "environment_fingerprint": measured_environment(first),
        "warnings": got.warnings,
        "timing_checks": got.timing_checks,
        "replicas": got.replicas,
        "harness_overhead": got.harness_overhead,
        "health": health_model(health[0], None, None, health[1], health[2]) if health is not None else None,
        "job_health": job_health_model(got.job_health, HARNESS_COVERS)
        if got.job_health is not None
        else None,
        "sample_streams": got.sample_streams,
        "measured_batch": batch.batch if batch is not None else None,
        "batch_source": batch.source if batch is not None else None,
        "model": model_facts(first),
        "tensor_dumps": got.tensor_dumps,
        "outputs": got.outputs,
        "launch_ids": got.launch_ids,
        "reported_metrics": got.reported_metrics,
        "logged_settings": got.logged_settings,
        "job": (job := summarize_jobs(got.jobs)),
        "job_launches": got.jobs,
        "summary": job.summary if job is not None else None,
    }
    summary = got.summary
    if summary is None or got.failure is not None:
        return RunBenchmarkWindowOutput(
            **common,
            state=EvidenceState.FAILED,
            failure_reason=got.failure or "no window was measured",
            windows_measured=0,
            steps_measured=0,
            median_step_ms=None,
            p95_step_ms=None,
            iqr_ratio=None,
            noisy=None,
            throughput=None,
            peak_memory_bytes=None,
            peak_memory_kind=None,
            data_wait_fraction=None,
            slowest_rank=None,
            rank_skew=None,
            ranks=[],
            windows=[],
        )
    s = summary.stats
    windows = [w for _, w in got.windows]
    has_device_peak = any(r.peak_allocated_bytes is not None for w in windows for r in w.ranks)
    ranks = rank_results(windows)
    attach_nodes(ranks, got.first_launch)
    return RunBenchmarkWindowOutput(
        **common,
        state=EvidenceState.EXECUTED,
        failure_reason=None,
        windows_measured=len(windows),
        steps_measured=summary.steps,
        median_step_ms=s.median_ms,
        p95_step_ms=s.p95_ms,
        iqr_ratio=s.iqr_ratio,
        noisy=s.noisy,
        throughput=run_throughput(summary),
        peak_memory_bytes=summary.peak_memory_bytes,
        peak_memory_kind=None
        if summary.peak_memory_bytes is None
        else ("device_allocated" if has_device_peak else "host_rss"),
        peak_memory_unavailable=None
        if summary.peak_memory_bytes is not None
        else "no rank reported a device allocator peak or a host peak RSS (no such counter where it ran)",
        data_wait_fraction=summary.data_wait_fraction,
        slowest_rank=summary.slowest_rank,
        rank_skew=summary.rank_skew,
        ranks=ranks,
        windows=[window_result(launch, w) for launch, w in got.windows],
    )


SPEC = ToolSpec(
    name="run_benchmark_window",
    title="Time steady-state training windows",
    description=(
        "Time steady-state training windows of a command (needs approval): step time, throughput and memory "
        "per rank; repeats>=3 to decide. Contract keys: skill://perfgate/references/vocabulary.md"
    ),
    details=(
        "Launch the training command (needs approval) and time steady-state windows of optimizer steps per "
        "rank: warm-up excluded, device synchronized only at window edges, one window per launch times "
        "`repeats`. Returns median/p95 step time, IQR noise, global throughput over the slowest rank's "
        "aligned window, peak memory, data-wait share, the slowest rank and rank skew, and the step series "
        "as an artifact. Declare a `contract` (invariants vs execution settings): compare_benchmarks refuses "
        "comparisons without one; its keys: skill://perfgate/references/vocabulary.md. Use repeats>=3 for "
        "evidence a decision can rest on; never profile here."
    ),
    input_model=RunBenchmarkWindowInput,
    output_model=RunBenchmarkWindowOutput,
    run=run,
    read_only=False,
    destructive=False,
    idempotent=False,
    open_world=True,
    runs_commands=True,
    command=command,
)
