"""Result models of the trace analyses (pydantic, so tools can return them as structured output).

Every duration is in microseconds (``_us``), every size in bytes; fractions are in [0, 1].
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from perfgate.traces.classify import Category, Kind

__all__ = [
    "AnalysisWindow",
    "Backends",
    "CategoryStats",
    "CodeSite",
    "CodeView",
    "DiffRow",
    "Distribution",
    "ExchangeKernels",
    "Finding",
    "FlopsSummary",
    "HostBreakdown",
    "HostPhase",
    "IdleBreakdown",
    "KernelSequence",
    "KernelStats",
    "LaunchStats",
    "OpLoop",
    "OpStats",
    "PhaseName",
    "ProfileDiff",
    "RankProfile",
    "RankSkew",
    "RankStepMean",
    "StepStats",
    "StepSummary",
    "SyncCall",
    "SyncStats",
    "TraceSetReport",
    "Wall",
]

Backend = Literal["cuda", "rocm", "musa", "privateuse1", "mtia", "xpu", "cpu", "unknown"]
RankSource = Literal["distributedInfo", "file_name", "default"]
TimeBasis = Literal["exact", "hta_rounded"]


class Distribution(BaseModel):
    """Summary of a sample of durations, microseconds."""

    count: int
    mean_us: float
    p50_us: float
    p90_us: float
    max_us: float


class CategoryStats(BaseModel):
    """Device work of one category (kernels, copies, ...) inside the analysis window."""

    category: Category
    kind: Kind = Field(description="Temporal class: compute, communication, memory or sync.")
    count: int
    total_us: float = Field(description="Sum of event durations (overlaps counted twice).")
    mean_us: float
    p50_us: float
    max_us: float
    share: float = Field(description="total_us / sum of all device event durations.")
    bytes: float | None = Field(default=None, description="Bytes moved (copies, memsets) when recorded.")
    bandwidth_gb_per_s: float | None = Field(
        default=None, description="bytes / total time of the events that recorded bytes, GB/s (1e9 B/s)."
    )


class KernelStats(BaseModel):
    """One device kernel (or copy) name, aggregated."""

    name: str
    category: Category
    count: int
    total_us: float
    mean_us: float
    p50_us: float
    max_us: float
    share: float = Field(description="total_us / sum of all device event durations.")


class OpStats(BaseModel):
    """One CPU operator or annotation name, aggregated over its calls."""

    name: str
    count: int
    total_us: float = Field(description="Inclusive time (children included).")
    self_us: float = Field(description="Exclusive time: inclusive minus direct children on the same thread.")
    mean_us: float
    max_us: float
    flops: float | None = Field(
        default=None, description="Profiler-attributed FLOPs (with_flops), when the trace has them."
    )


class LaunchStats(BaseModel):
    """How the host feeds the device."""

    launches: int = Field(description="Host calls matched (by correlation id) to device work.")
    launches_per_step: float | None = Field(description="Mean launches per ProfilerStep, when steps exist.")
    api_counts: dict[str, int] = Field(description="Matched host calls by API name (top names).")
    unmatched_device_events: int = Field(
        description="Device events whose launching call is not in the trace (or the window)."
    )
    launch_delay_us: Distribution | None = Field(
        description="Device start minus host call start, per matched event."
    )
    launch_bound_kernels: int = Field(
        description="Kernels that ran for less time than the host spent launching them."
    )
    launch_bound_fraction: float | None
    short_kernel_threshold_us: float
    short_kernels: int = Field(description="Kernels shorter than short_kernel_threshold_us.")
    short_kernel_time_us: float
    queue_depth_max: int = Field(description="Most launched-but-unfinished device events at once.")
    queue_depth_mean: float = Field(description="Time-weighted mean of that depth over the device span.")
    queue_empty_fraction: float | None = Field(
        description="Fraction of the device span with nothing launched and unfinished (host-starved)."
    )


class SyncCall(BaseModel):
    name: str
    count: int
    total_us: float
    max_us: float


class SyncStats(BaseModel):
    """Where the host waits for the device."""

    host_sync_us: float = Field(description="Time in blocking synchronization calls on the host.")
    host_sync_calls: int
    blocking_copy_calls: int = Field(
        description="Synchronous copy calls (cudaMemcpy, hipMemcpyWithStream, ...)."
    )
    blocking_copy_us: float
    implicit_sync_ops: int = Field(description="CPU ops that wait for a device value (.item(), nonzero).")
    implicit_sync_us: float
    device_sync_events: int = Field(description="Stream-level waits on the device timeline (cuda_sync).")
    calls: list[SyncCall] = Field(description="Sync-related calls by name, longest total first.")


class StepStats(BaseModel):
    step: int
    start_us: float = Field(description="Start relative to the first event of the trace.")
    duration_us: float = Field(description="Host-side ProfilerStep annotation duration.")
    launches: int
    in_window: bool = Field(description="Whether the step is inside the analysis window.")


class StepSummary(BaseModel):
    count: int
    mean_us: float
    p50_us: float
    min_us: float
    max_us: float
    steps: list[StepStats]


class FlopsSummary(BaseModel):
    """FLOPs that torch.profiler attributed to ops (with_flops=True): matmul and conv estimates only."""

    basis: str
    profiler_attributed_flops: float = Field(description="Sum over ops inside the analysis window.")
    ops_with_flops: int
    flops_per_step: float | None = Field(description="Per ProfilerStep inside the window, when steps exist.")
    mean_step_time_us: float | None


PhaseName = Literal[
    "data_loading",
    "optimizer",
    "grad_clipping",
    "collectives",
    "sync",
    "recompute",
    "backward",
    "forward",
    "no_grad",
    "other",
]


class HostPhase(BaseModel):
    """One phase of the host-side step (see `HostBreakdown`)."""

    phase: PhaseName
    per_step_us: float = Field(description="Mean time per step assigned to this phase.")
    share: float = Field(description="Fraction of step time.")
    top_events: list[str] = Field(description="Events that define the phase, most self time first.")


class HostBreakdown(BaseModel):
    """Host step time split into phases from torch's annotations, autograd and grad-mode events.

    Phases partition step time in the order data_loading, optimizer, grad_clipping (clip_grad_norm_ /
    clip_grad_value_ frames, _foreach_norm), collectives (gloo and other CPU collectives count; only the
    part not overlapped by an aten op), sync, recompute (grad-mode forward ops run inside backward:
    activation checkpointing), backward, forward (grad mode on), no_grad (evaluation passes), other
    (Python between ops, sleeps, unrecorded waits).
    """

    basis: str
    steps: int
    step_us: float = Field(description="Mean step time the phases partition.")
    phases: list[HostPhase]
    ops_per_step: float = Field(description="CPU ops (cpu_op events, all depths) per step.")
    top_level_ops_per_step: float = Field(description="CPU ops not nested in another op, per step.")
    top_level_op_p50_us: float | None
    short_op_threshold_us: float
    short_top_level_op_us_per_step: float = Field(
        description="Time per step in top-level ops shorter than the threshold (dispatch-dominated), the "
        "union of their intervals."
    )
    implicit_syncs_per_step: float = Field(description=".item()/nonzero-style device waits per step.")
    sync_wait_us_per_step: float = Field(
        default=0.0,
        description="Per step: the time the host waits in syncs, the union of the sync calls' own intervals "
        "(.item()/nonzero value fetches, blocking runtime syncs and copies), not the span between them.",
    )


class IdleBreakdown(BaseModel):
    """Why the device sat idle between kernels, per stream (HTA's idle-time breakdown)."""

    basis: str
    consecutive_kernel_delay_us: float
    idle_us: float = Field(description="Sum of the gaps between consecutive events of each stream.")
    host_wait_us: float = Field(
        description="Gaps where the launching call started after the previous event ended."
    )
    kernel_wait_us: float = Field(description="Other gaps shorter than consecutive_kernel_delay_us.")
    other_us: float
    host_wait_fraction: float | None
    steps_checked: int
    host_bound_steps: int = Field(
        description="Steps whose host-wait idle exceeds half their device span: paced by the host."
    )
    steps_span_us: float = Field(
        0.0, description="Lightweight critical path: summed device span of the checked steps."
    )
    device_bound_us: float = Field(0.0, description="Of steps_span_us: the device was busy (device-bound).")
    host_bound_us: float = Field(
        0.0, description="Of steps_span_us: idle until the host launched the next kernel (host-bound)."
    )
    other_wait_us: float = Field(0.0, description="Of steps_span_us: launch latency, event waits and syncs.")
    bound: Literal["host", "device", "mixed"] | None = Field(
        None, description="The side on the critical path for more than half of steps_span_us; null: no steps."
    )


class KernelSequence(BaseModel):
    """Kernels that run back to back on one stream, repeatedly: a fusion candidate."""

    kernels: list[str]
    count: int = Field(description="Occurrences in the window.")
    time_us: float = Field(description="Device time of the member kernels over all occurrences.")
    share: float = Field(description="time_us / all device time.")


class OpEfficiency(BaseModel):
    """One op (and precision) with recorded shapes: the work it did and how fast."""

    op: str
    kind: Literal["gemm", "attention", "copy"]
    precision: str = Field(description="From the first operand's type: fp32, bf16, fp16, fp8, int8, other.")
    count: int
    time_us: float = Field(description="Device time of its kernels (CPU-only traces: the op's duration).")
    flops: float
    bytes: float = Field(description="Operand bytes (GEMM/attention) or bytes read + written (copies).")
    achieved_tflops: float | None
    achieved_gbps: float | None
    intensity: float | None = Field(description="FLOPs per operand byte: low = memory-bound shapes.")
    peak_tflops: float | None = Field(description="Dense peak of this device and precision; null: unknown.")
    efficiency: float | None = Field(description="achieved_tflops / peak_tflops.")


class OpEfficiencySummary(BaseModel):
    """Per-op efficiency where the trace recorded shapes (see traces/analyses/efficiency.py)."""

    basis: str
    device: str
    ops: list[OpEfficiency] = Field(description="Most time first.")
    peak_unknown: list[str] = Field(description="Why a peak is null (never borrowed from another device).")


class AnalysisWindow(BaseModel):
    """Which part of the trace the breakdowns cover."""

    basis: str
    end_us: float | None = Field(
        description="Host events at or after this time are excluded (relative time)."
    )
    excluded_last_step: bool


class OtherProcess(BaseModel):
    """A process outside the job that used CPU during the capture."""

    pid: int
    name: str = Field(description="Short command name (/proc/<pid>/stat), not the argv.")
    cpus: float = Field(description="Mean CPUs it used over the capture window.")


_UNKNOWN_LOAD = "not captured by profile_segment mode='run': the host's load during the capture is unknown"


class HostLoad(BaseModel):
    """How busy the host was with other processes while the profile was captured (see traces/diagnosis/hostload.py)."""

    measured: bool = Field(description="False: the load is unknown (not zero); unknown_reason says why.")
    unknown_reason: str | None = None
    basis: str = (
        "/proc over the whole launch: busy time of the CPUs the job may run on minus the job's own CPU time "
        "(server and reaped children)"
    )
    window_s: float | None = None
    cpus: int | None = Field(default=None, description="CPUs the job may run on (affinity set).")
    job_cpus: float | None = Field(default=None, description="Mean CPUs the job used.")
    other_cpus: float | None = Field(default=None, description="Mean CPUs other processes used.")
    other_share: float | None = Field(default=None, description="other_cpus / cpus.")
    load_avg_1m: float | None = None
    top_other: list[OtherProcess] = Field(default_factory=list[OtherProcess])


def _unknown_load() -> HostLoad:
    return HostLoad(measured=False, unknown_reason=_UNKNOWN_LOAD)


class CodeSite(BaseModel):
    """The code that owns time in a step: the nn.Module, the Python source line, the record_function range."""

    label: str = Field(description="Module.function (file:line), as the findings quote it.")
    module: str | None = Field(
        default=None,
        description="Class of the innermost nn.Module around the owning line (profiler instance names, "
        "outermost first, in module_path).",
    )
    module_path: str | None = Field(default=None, description="e.g. Net_0.PerSample_0: modules as called.")
    location: str | None = Field(default=None, description="file:line function of the innermost user frame.")
    call_site: str | None = Field(
        default=None, description="file:line function of the innermost user frame outside every module."
    )
    region: str | None = Field(default=None, description="Innermost record_function range of the user's.")
    us_per_step: float
    share: float = Field(description="Of the time attributed (the finding's time when it quotes this site).")


class OpLoop(BaseModel):
    """A run of identical op sequences in a step: a Python loop over the batch, over layers, over micro-batches."""

    ops: list[str] = Field(description="The body's first distinct top-level ops.")
    ops_per_iteration: int
    iterations: float = Field(description="Repetitions of the body per step.")
    us_per_step: float = Field(description="First op start to last op end of the loop, per step.")
    op_p50_us: float = Field(description="Median duration of the body's top-level ops.")
    backward: bool = Field(description="The body is autograd backward nodes only (a loop's gradient side).")
    owner: CodeSite | None = Field(description="The innermost user frame enclosing the whole loop.")


class CodeView(BaseModel):
    """Where the step's time lives in the code: modules and lines from Python stacks, loops, backward passes."""

    stacks: bool = Field(description="The trace holds Python frames (with_stack=True).")
    modules: bool = Field(description="The trace holds nn.Module calls (Python tracer of with_stack).")
    missing: str | None = Field(description="What capture option would add the module and line, when absent.")
    phases: dict[str, list[CodeSite]] = Field(
        description="Per host phase (data_loading, forward, no_grad, backward, optimizer, sync): its owning "
        "code, most time first; each site carries the training loop's line that runs it."
    )
    short_ops: list[CodeSite] = Field(
        description="Owners of the top-level ops shorter than the tiny-op bound."
    )
    loops: list[OpLoop] = Field(description="Repeated op sequences of one step, most time first.")
    backward_passes_per_step: float | None = Field(
        description="backward() calls per optimizer step, from runs of autograd nodes between forward ops."
    )
    backward_site: CodeSite | None = Field(description="The user line that calls backward().")
    samples_per_step: float | None = Field(
        default=None,
        description="Samples per optimizer step from the harness's DataLoader counter (profile_segment runs).",
    )
    no_grad_call_us_per_step: float | None = Field(
        default=None,
        description="Per step: time inside the calls that run only no-grad ops (an evaluation function), "
        "Python included.",
    )


class RankProfile(BaseModel):
    """Analysis of one trace file (one rank)."""

    rank: int
    rank_source: RankSource
    path: str
    world_size: int | None
    backend: Backend
    device: str = Field(description="Device name from deviceProperties, or the backend when unnamed.")
    time_basis: TimeBasis
    window: AnalysisWindow
    span_us: float = Field(description="First device activity start to last device activity end.")
    busy_us: float = Field(description="Time with at least one device activity.")
    idle_us: float
    compute_us: float = Field(description="Time with compute running (overlapping comm/memory counted here).")
    non_compute_us: float = Field(
        description="Busy time without compute: communication, memory, stream waits."
    )
    communication_us: float = Field(description="Time with communication running (overlap included).")
    memory_us: float = Field(description="Time with copies or memsets running (overlap included).")
    memory_like_us: float = Field(
        default=0.0,
        description="Time with copies, memsets, elementwise or reduction kernels running (union of their "
        "intervals): what a memory_bound finding can account for.",
    )
    sync_us: float = Field(description="Time with stream waits on the device timeline.")
    idle_fraction: float | None
    compute_fraction: float | None
    non_compute_fraction: float | None
    comm_compute_overlap_us: float
    comm_compute_overlap_fraction: float | None = Field(
        description="Share of communication time hidden under compute; null without communication."
    )
    streams: int
    categories: list[CategoryStats]
    top_kernels: list[KernelStats]
    top_ops: list[OpStats]
    launch: LaunchStats
    sync: SyncStats
    steps: StepSummary | None
    flops: FlopsSummary | None
    flops_unavailable: str | None = Field(
        default=None, description="Why `flops` is null: what torch did not export."
    )
    top_self_ops: list[OpStats] = Field(
        default_factory=list[OpStats], description="CPU ops by exclusive (self) time, largest first."
    )
    host: HostBreakdown | None = Field(
        default=None, description="Host step time by phase (every trace, CPU-only ones included)."
    )
    idle: IdleBreakdown | None = Field(default=None, description="Device idle time by cause.")
    kernel_sequences: list[KernelSequence] = Field(
        default_factory=list[KernelSequence],
        description="Frequent 2-3 kernel sequences on a stream with the most device time (fusion candidates).",
    )
    event_counts: dict[str, int]
    warnings: list[str]
    op_efficiency: OpEfficiencySummary | None = Field(
        default=None,
        description="Achieved TFLOP/s and GB/s of GEMM/attention/copy ops from recorded shapes; null "
        "when the trace has no shapes (record_shapes=False).",
    )
    host_load: HostLoad = Field(
        default_factory=_unknown_load,
        description="Other processes' CPU use during the capture; measured only for profile_segment runs.",
    )
    code: CodeView | None = Field(
        default=None, description="Owning modules, source lines and loops (null for a trace without CPU ops)."
    )
    backends: Backends | None = Field(
        default=None,
        description="Graph replays and the MoE token-exchange backend the trace shows (the backend gate reads "
        "it); null only in results written before it was recorded.",
    )


class ExchangeKernels(BaseModel):
    """Device kernels of one token-exchange family."""

    backend: Literal["deepep", "hybridep", "alltoall", "allgather"] = Field(
        description="deepep/hybridep: kernels in the deep_ep:: / hybrid_ep:: namespaces; alltoall: the "
        "collective library's all-to-all or send/receive kernels (pipeline traffic too); allgather: its "
        "all-gather kernels (FSDP too)."
    )
    kernels: int = Field(description="Kernel executions of this family in the trace.")
    names: list[str] = Field(description="Up to 3 kernel names that show it (truncated).")


class Backends(BaseModel):
    """What the trace shows ran, as the server reads it: graph replays and the token-exchange backend."""

    graph_launches: int = Field(
        description="Host graph-launch calls (cudaGraphLaunch, hipGraphLaunch, musaGraphLaunch): 0 means no "
        "CUDA/MUSA graph was replayed in the traced steps."
    )
    graph_launch_calls: list[str] = Field(description="The launch call names counted.")
    token_exchange: list[ExchangeKernels] = Field(
        description="Token-exchange kernel families present, most specific first."
    )
    dispatcher: Literal["deepep", "hybridep", "alltoall", "allgather"] | None = Field(
        description="The first family of token_exchange (the MoE dispatcher's backend the kernels show); null "
        "when no exchange kernel ran."
    )


class RankStepMean(BaseModel):
    """One rank's step time and how much of it was waiting for the others."""

    rank: int
    mean_step_us: float
    collective_wait_us: float = Field(
        default=0.0,
        description="Per step: host time in collectives not covered by an op, or device communication "
        "not overlapped with compute, whichever is larger.",
    )
    busy_us: float = Field(
        default=0.0, description="mean_step_us minus the wait beyond the rank that waited least."
    )


class RankSkew(BaseModel):
    """How ranks differ (per-step times compared on the step numbers all ranks share)."""

    ranks: int
    common_steps: int
    max_step_skew_us: float | None = Field(
        description="Largest (slowest - fastest) rank step time on one step."
    )
    mean_step_skew_us: float | None
    worst_step: int | None
    slowest_rank: int | None = Field(
        description="The rank with the most busy time (step time minus excess collective wait): the same "
        "definition as run_benchmark_window."
    )
    busy_spread_us: float | None = Field(
        default=None, description="Per step: slowest rank's busy time minus the fastest rank's."
    )
    per_rank_mean_step_us: list[RankStepMean]
    span_spread_us: float = Field(description="max - min of span_us across ranks.")
    compute_spread_us: float
    idle_spread_us: float
    most_idle_rank: int


Wall = Literal[
    "input_pipeline",
    "host_overhead",
    "synchronization",
    "exposed_communication",
    "memory_bound",
    "compute_efficiency",
    "rank_imbalance",
    "evaluation_in_step",
    "profiler_artefact",
    "host_contention",
    "small_micro_batch",
]
Confidence = Literal["high", "medium", "low"]


class Finding(BaseModel):
    """One wall the step runs into, with the figures that show it and what to try first."""

    wall: Wall
    rank: int | None = Field(description="The rank it was found on; null for a finding across ranks.")
    summary: str = Field(description="One line with the deciding figures.")
    figures: dict[str, float] = Field(description="The evidence figures (us per step, shares, counts).")
    events: list[str] = Field(description="Trace events that show it (op, annotation or kernel names).")
    time_at_stake_us: float = Field(
        description="Upper bound of the step time this wall can cost, us per step: fixing it cannot save more."
    )
    share_of_step: float = Field(description="time_at_stake_us / step time.")
    candidate: str = Field(description="The first change to try.")
    guard: str = Field(description="What must be checked so the change is not a regression in disguise.")
    confidence: Confidence
    confidence_reason: str
    code: list[CodeSite] = Field(
        default_factory=list[CodeSite],
        description="The code that owns the time at stake (module, file:line), most time first; empty when "
        "the trace has no Python stacks.",
    )


class DiffRow(BaseModel):
    """One quantity, per step (mean over ranks): baseline, candidate and the change."""

    name: str
    baseline: float
    candidate: float
    delta: float = Field(description="candidate - baseline (negative: less time or fewer events).")
    ratio: float | None = Field(description="candidate / baseline; null when the baseline is 0.")


class ProfileDiff(BaseModel):
    """What changed between two profiles, per step: did the change do what it was meant to?

    Times are microseconds per step, means over ranks; kernels and ops compare each side's top lists
    (so a name outside both lists is not seen). ``new_*`` are in the candidate only, ``vanished_*`` in
    the baseline only.
    """

    basis: str
    step: DiffRow
    phases: list[DiffRow] = Field(description="Host phases, largest absolute change first.")
    device: list[DiffRow] = Field(description="Device idle / compute / communication / memory time.")
    categories: list[DiffRow]
    kernels: list[DiffRow] = Field(description="Kernels present on both sides, largest change first.")
    ops: list[DiffRow] = Field(description="CPU ops (inclusive time) on both sides, largest change first.")
    new_kernels: list[str]
    vanished_kernels: list[str]
    new_ops: list[str]
    vanished_ops: list[str]
    counts: list[DiffRow] = Field(description="Launches, implicit syncs, host sync calls, CPU ops per step.")
    walls: list[DiffRow] = Field(description="Time at stake per wall (0 when it did not fire on a side).")
    summary: list[str] = Field(description="The largest changes in words.")


class TraceSetReport(BaseModel):
    ranks: list[RankProfile]
    rank_skew: RankSkew | None
    warnings: list[str]
    findings: list[Finding] = Field(default_factory=list[Finding])
