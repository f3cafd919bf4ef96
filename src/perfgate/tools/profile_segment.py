"""profile_segment: capture a short profiler segment (gated) and analyze the traces it writes, per rank.

The analysis lives in `perfgate.traces` and is shared with `analyze_trace` (the read-only tool for
traces that already exist; ``mode="analyze"`` here does the same for callers that use it). This module
runs the capture through the approval gate and records the evidence. A captured run is flagged ``profiled``:
its step times are inflated by the profiler and can never serve as throughput evidence.

The trace analysis (numpy, msgspec) and the harness are imported where they are used, to keep server
start-up fast.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

import anyio.to_thread
from pydantic import BaseModel, Field, model_validator

from perfgate.benchmarking import BenchmarkError
from perfgate.benchmarking.runs.measured import measured_environment
from perfgate.benchmarking.windows.launch import (
    harness_entry,
    harness_pythonpath,
    launch_env,
    prepare_harness_path,
    wrap_command,
)
from perfgate.benchmarking.workload.provenance import RunProvenance, run_provenance
from perfgate.errors import ToolError
from perfgate.evidence import EvidenceState
from perfgate.execution.request import CommandRequest
from perfgate.execution.rundir import input_run_dir, one_run
from perfgate.harness.config import ProfileConfig
from perfgate.helpers.statefs import fresh_dir, make_dirs, remove_tree
from perfgate.serving.runtime import EvidenceBuilder, ToolRuntime
from perfgate.serving.spec import ToolSpec
from perfgate.tools.trace_analysis import (
    TraceAnalysisFields,
    TraceFile,
    analyze_paths,
    import_counters,
    key_plot,
    resolve_traces,
    trace_brief,
    trace_files,
    with_counters,
)
from perfgate.traces import Finding, RankProfile, RankSkew, TraceError
from perfgate.traces.diagnosis.segment import (
    TRACE_GLOB,
    annotate_profiles,
    capture_failure,
    keep_trace,
    kept_name,
    samples_per_step_by_rank,
    segment_harness,
    segment_reason,
    segment_state,
    segment_warnings,
)
from perfgate.traces.reading.counters import KernelCounterTable
from perfgate.traces.reading.external import (
    ExternalCapture,
    Layer,
    SummaryTable,
    Vendor,
    capture_plans,
    import_summary_csv,
)

__all__ = ["SPEC", "ProfileSegmentInput", "ProfileSegmentOutput", "TraceFile", "command", "run"]

Mode = Literal["run", "analyze"]


class ProfileSegmentInput(TraceAnalysisFields):
    mode: Annotated[
        Mode,
        Field(
            description="'analyze': read existing Kineto traces (trace_paths). 'run': launch the training "
            "command under the harness with torch.profiler on a short schedule (needs approval), then analyze "
            "the traces it wrote."
        ),
    ]
    trace_paths: Annotated[
        list[str],
        Field(
            description="analyze: trace files (.json / .json.gz) or folders of per-rank traces, relative to "
            "the workspace."
        ),
    ] = Field(default_factory=list[str])
    command: Annotated[
        list[str] | None,
        Field(
            description="run: the training command as an argv list, e.g. ['python', 'train.py'] or "
            "['torchrun', '--nproc-per-node', '8', 'train.py']; also the command wrapped by external captures."
        ),
    ] = None
    cwd: Annotated[str, Field(description="run: working directory, relative to the workspace.")] = "."
    env: Annotated[dict[str, str], Field(description="run: environment variables to set (changes only).")] = (
        Field(default_factory=dict[str, str])
    )
    timeout_s: Annotated[float, Field(gt=0, description="run: wall-clock limit for the launch, seconds.")] = (
        600.0
    )
    skip_first: Annotated[
        int, Field(ge=0, description="run: optimizer steps ignored before the schedule.")
    ] = 1
    wait: Annotated[int, Field(ge=0, description="run: steps idle after skip_first.")] = 0
    warmup: Annotated[
        int, Field(ge=1, description="run: profiler warm-up steps (>= 1: the first traced steps are skewed).")
    ] = 1
    active: Annotated[int, Field(ge=1, le=20, description="run: steps recorded in the trace.")] = 2
    record_shapes: Annotated[bool, Field(description="run: record operator input shapes.")] = False
    with_flops: Annotated[bool, Field(description="run: profiler-attributed FLOPs for matmul/conv.")] = False
    profile_memory: Annotated[bool, Field(description="run: record allocator events.")] = False
    with_stack: Annotated[
        bool,
        Field(
            description="run: record Python stacks: findings then name the module and file:line that own the "
            "time (with with_modules: profiled steps ~1.25x slower, traces 1.4-3.9x larger on tiny CPU jobs)."
        ),
    ] = True
    with_modules: Annotated[
        bool,
        Field(
            description="run: name every nn.Module call by its qualified name (a profiler range per call; "
            "compiled regions stay unnamed)."
        ),
    ] = True
    harness_on_path: Annotated[
        bool,
        Field(
            description="run: also put perfgate's copy on PYTHONPATH (for a script that imports perfgate "
            "itself); the harness always starts from that copy."
        ),
    ] = False
    external_layers: Annotated[
        list[Layer],
        Field(
            description="Also prepare exact capture commands for the 'system' (nsys/msys) and/or 'kernel' "
            "(ncu/mcu) layers around `command` (not run: evidence 'scaffolded' when nothing else is analyzed)."
        ),
    ] = Field(default_factory=list[Layer])
    external_vendor: Annotated[
        Vendor,
        Field(description="Which vendor's profilers to prepare: 'auto' (those installed, else both)."),
    ] = "auto"
    summary_paths: Annotated[
        list[str],
        Field(
            description="CSV summaries exported by `nsys stats --format csv` / `msys stats`, and kernel counter "
            "exports of ncu / mcu (`--csv --page details` or `--page raw`: per-kernel verdicts joined to the "
            "traces' kernels), to import."
        ),
    ] = Field(default_factory=list[str])
    reason: Annotated[str, Field(max_length=2000, description="run: why this capture is needed.")] = ""
    environment_id: Annotated[
        str | None, Field(description="collect_env evidence id of this environment.")
    ] = None

    @model_validator(mode="after")
    def _mode_inputs(self) -> ProfileSegmentInput:
        if self.mode == "run" and not self.command:
            raise ValueError("mode='run' needs `command` (an argv list)")
        if self.mode == "analyze" and not (self.trace_paths or self.summary_paths or self.external_layers):
            raise ValueError("mode='analyze' needs trace_paths, summary_paths or external_layers")
        if self.external_layers and not self.command:
            raise ValueError("external_layers needs `command`: the captures wrap the training command")
        return self


class ProfileSegmentOutput(BaseModel):
    evidence_id: str
    state: EvidenceState
    mode: Mode
    profiled: bool = Field(description="True for captured runs: never usable as throughput evidence.")
    time_basis: Literal["exact", "hta_rounded"]
    ranks: list[RankProfile] = Field(description="One entry per trace file, sorted by rank.")
    rank_skew: RankSkew | None = Field(description="Cross-rank comparison; null for a single rank.")
    findings: list[Finding] = Field(
        description="The walls, ranked: figures, events, time at stake per step (an upper bound), the first "
        "candidate and its guard, confidence."
    )
    trace_files: list[TraceFile]
    trace_artifacts: list[str] = Field(description="run: the captured traces, kept as evidence artifacts.")
    external_captures: list[ExternalCapture]
    imported_summaries: list[SummaryTable]
    kernel_counters: list[KernelCounterTable] = Field(
        default_factory=list[KernelCounterTable],
        description="The ncu/mcu exports among summary_paths, read: per-kernel verdicts, ranked by trace time.",
    )
    exit_code: int | None
    failure_reason: str | None
    warnings: list[str]
    provenance: RunProvenance | None = Field(
        default=None,
        description="run: what ran, as for benchmark windows: argv, env changes, code state, digests of files "
        "argv names; null when nothing was launched.",
    )
    environment_fingerprint: dict[str, str | None] = Field(
        default_factory=dict[str, str | None],
        description="run: the environment the training process measured (device, torch, threads, precision "
        "switches; rank 0's harness record); empty when nothing was launched or no record was written.",
    )


# --------------------------------------------------------------------------- the command


def _run_dir(inp: ProfileSegmentInput, rt: ToolRuntime) -> Path:
    # In the trust root: the harness writes its records and traces where the agent cannot replace them.
    return input_run_dir(rt.private_dir / "profile-runs", inp.model_dump(mode="json"))


def command(inp: ProfileSegmentInput, rt: ToolRuntime) -> CommandRequest | None:
    """The launch of a ``run`` call (None for ``analyze``).

    Raises:
        ToolError: a command the harness cannot be inserted into, or a cwd outside the workspace.
    """
    if inp.mode != "run":
        return None
    assert inp.command is not None
    state = rt.ledger.trust.state_dir
    copy = harness_pythonpath(state)
    try:
        argv = wrap_command(inp.command, harness_entry(copy))
        env = launch_env(dict(inp.env), rt.ledger.trust.pycache_dir, copy if inp.harness_on_path else None)
    except BenchmarkError as exc:
        raise ToolError(str(exc)) from exc
    cwd = rt.resolve_path(inp.cwd, kind="dir")
    run_dir = _run_dir(inp, rt)
    profile = ProfileConfig(
        trace_dir=str(run_dir / "traces"),
        skip_first=inp.skip_first,
        wait=inp.wait,
        warmup=inp.warmup,
        active=inp.active,
        record_shapes=inp.record_shapes,
        with_flops=inp.with_flops,
        profile_memory=inp.profile_memory,
        with_stack=inp.with_stack,
        with_modules=inp.with_modules,
    )
    env.update(segment_harness(run_dir, profile).to_env())
    return CommandRequest(
        argv=tuple(argv),
        cwd=cwd,
        env=env,
        timeout_s=inp.timeout_s,
        reason=inp.reason or segment_reason(profile),
    )


# --------------------------------------------------------------------------- helpers


def _externals(inp: ProfileSegmentInput, rt: ToolRuntime) -> list[ExternalCapture]:
    if not inp.external_layers:
        return []
    assert inp.command is not None
    return capture_plans(
        inp.external_layers, inp.external_vendor, inp.command, rt.ledger.state_dir / "captures"
    )


def _summaries(inp: ProfileSegmentInput, rt: ToolRuntime) -> tuple[list[SummaryTable], list[str]]:
    """The nsys/msys summaries, read, and the kernel counter exports (read once the traces are)."""
    from perfgate.traces.reading.counters import is_counter_csv

    out: list[SummaryTable] = []
    counters: list[str] = []
    for raw in inp.summary_paths:
        path = rt.resolve_path(raw, kind="file")
        if is_counter_csv(path):
            counters.append(raw)
            continue
        try:
            table = import_summary_csv(path)
        except TraceError as exc:
            raise ToolError(str(exc)) from exc
        table.path = rt.relative(path)
        out.append(table)
    return out, counters


async def _keep_traces(ev: EvidenceBuilder, traces: list[Path], rt: ToolRuntime) -> list[str]:
    kept: list[str] = []
    for path in traces:
        dst = ev.path(kept_name(path))
        await anyio.to_thread.run_sync(keep_trace, path, dst)
        kept.append(rt.relative(dst))
    return kept


# --------------------------------------------------------------------------- the run


async def run(inp: ProfileSegmentInput, rt: ToolRuntime) -> ProfileSegmentOutput:
    from perfgate.traces import combine

    request = command(inp, rt)
    externals = _externals(inp, rt)
    summaries, counter_paths = _summaries(inp, rt)
    ev = rt.evidence()
    exit_code: int | None = None
    failure: str | None = None
    trace_artifacts: list[str] = []
    provenance: RunProvenance | None = None
    fingerprint: dict[str, str | None] = {}

    if request is None:
        paths = resolve_traces(inp.trace_paths, rt) if inp.trace_paths else []
        profiles = await analyze_paths(paths, inp, rt)
        files = trace_files(paths, profiles, rt)
        profiled = False
    else:
        run_dir = _run_dir(inp, rt)
        with one_run(
            run_dir, rt.tool, rt.relative(run_dir)
        ):  # refused when a run of this same input holds its folder
            fresh_dir(run_dir)  # what the agent planted there (a link, say) is removed, never followed
            make_dirs(run_dir / "traces")
            profiles = []
            files = []
            profiled = True
            try:
                await anyio.to_thread.run_sync(
                    prepare_harness_path, harness_pythonpath(rt.ledger.trust.state_dir)
                )
                from perfgate.traces.diagnosis.hostload import HostLoadSampler

                assert inp.command is not None
                argv, cwd = inp.command, rt.resolve_path(inp.cwd, kind="dir")
                provenance = await anyio.to_thread.run_sync(
                    run_provenance, argv, inp.cwd, cwd, inp.env, rt.workspace, ev
                )
                sampler = HostLoadSampler()
                sampler.start()
                result = await rt.run_command(request, ev, log_dir=run_dir)
                host_load = sampler.stop()
                exit_code = result.exit_code
                fingerprint, samples = await anyio.to_thread.run_sync(_measured, run_dir / "records")
                traces = sorted((run_dir / "traces").glob(TRACE_GLOB))
                failure = capture_failure(result.succeeded, result.summary(), len(traces))
                if traces:
                    profiles = await analyze_paths(traces, inp, rt)
                    annotate_profiles(profiles, host_load, samples)
                    trace_artifacts = await _keep_traces(ev, traces, rt)
                    files = [
                        TraceFile(path=a, bytes=(rt.workspace / a).stat().st_size, rank=p.rank)
                        for a, p in zip(trace_artifacts, profiles, strict=True)
                    ]
                    for p, a in zip(profiles, trace_artifacts, strict=True):
                        p.path = a
            finally:
                remove_tree(run_dir)

    report = combine(profiles)
    counters = import_counters(counter_paths, report.ranks, rt)
    out = ProfileSegmentOutput(
        evidence_id=ev.id,
        state=EvidenceState(segment_state(failure, bool(profiles or summaries or counters))),
        mode=inp.mode,
        profiled=profiled,
        time_basis="hta_rounded" if inp.hta_compatible else "exact",
        ranks=report.ranks,
        rank_skew=report.rank_skew,
        findings=report.findings,
        trace_files=files,
        trace_artifacts=trace_artifacts,
        external_captures=externals,
        imported_summaries=summaries,
        kernel_counters=counters,
        exit_code=exit_code,
        failure_reason=failure,
        warnings=segment_warnings(report.warnings, profiles, profiled=profiled, with_flops=inp.with_flops),
        provenance=provenance,
        environment_fingerprint=fingerprint,
    )
    await key_plot(ev, report.ranks, rt)
    return await rt.commit(
        ev,
        out,
        profiled=profiled,
        command=list(request.argv) if request is not None else None,
        exit_code=exit_code,
        environment_id=inp.environment_id,
    )


def _measured(record_dir: Path) -> tuple[dict[str, str | None], dict[int, float]]:
    """Rank 0's measured environment from the harness records of the profiled run, when it wrote one, and
    each rank's samples per step (the harness's DataLoader counter: the median over steps that counted)."""
    from perfgate.benchmarking import load_records
    from perfgate.benchmarking.errors import RecordError

    try:
        found = load_records(record_dir)
    except (RecordError, OSError):
        return {}, {}
    environment = measured_environment(found.records[0]) if found.records else {}
    return environment, samples_per_step_by_rank(found.records)


SPEC = ToolSpec(
    name="profile_segment",
    title="Profile a training segment / analyze traces",
    description=(
        "Profile a short segment of the training command with torch.profiler (needs approval; never "
        "throughput evidence): findings name the module and file:line owning step time."
    ),
    details=(
        "Capture where step time goes, per rank. For traces that already exist use analyze_trace (read-only; "
        "mode='analyze' here does the same). mode='run' launches the training command under the harness with torch.profiler "
        "on a short schedule (needs approval) and analyzes the traces it writes; that evidence is flagged "
        "profiled and never counts as throughput. Per rank: device span, idle / compute / non-compute time "
        "(HTA's definitions), communication and memory time, comm/compute overlap, kernel categories (GEMM, "
        "attention, collectives, copies by direction with bandwidth, ...), top kernels and CPU ops, launch "
        "delay, launch-bound kernels, queue depth, synchronization, per-step times; rank skew across ranks. "
        "external_layers prepares exact nsys/ncu (or msys/mcu) capture commands; summary_paths imports their "
        "CSV exports (ncu/mcu kernel counters: a verdict per kernel joined to the traces' kernels)."
    ),
    input_model=ProfileSegmentInput,
    output_model=ProfileSegmentOutput,
    run=run,
    read_only=False,
    destructive=False,
    idempotent=False,
    open_world=True,
    runs_commands=True,
    command=command,
    brief=lambda out: with_counters(
        trace_brief(out.ranks, out.rank_skew, out.findings, out.evidence_id),
        bool(out.ranks),
        out.kernel_counters,
    ),
)
