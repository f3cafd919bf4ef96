"""run_benchmark_window's input and output models: the call's schema and the record it commits."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

from perfgate.benchmarking.comparing.results import ModelFacts, RankResult, Throughput, WindowResult
from perfgate.benchmarking.runs.checkpoint_resume import ResumeCheck
from perfgate.benchmarking.runs.dumps import TensorDump
from perfgate.benchmarking.runs.health import JobHealth, TrainingHealth
from perfgate.benchmarking.runs.job import JobSummary, JobTiming
from perfgate.benchmarking.runs.replicas import ReplicaCheck
from perfgate.benchmarking.runs.saved_state import SavedState
from perfgate.benchmarking.windows.corroborate import TimingCheck
from perfgate.benchmarking.windows.window_plan import Timing
from perfgate.benchmarking.windows.window_run import HarnessOverhead
from perfgate.benchmarking.workload.contract import BenchmarkContract
from perfgate.benchmarking.workload.outputs import RunOutput
from perfgate.benchmarking.workload.provenance import RunProvenance
from perfgate.evidence import EvidenceState
from perfgate.execution.hang import HangDiagnosis
from perfgate.traces.models import HostLoad

__all__ = ["Launcher", "RunBenchmarkWindowInput", "RunBenchmarkWindowOutput", "SlurmLaunch", "TensorCapture"]

Launcher = Literal["local", "slurm"]
_SLURM_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.:,=+-]{0,127}")


def _slurm_name(value: str | None) -> str | None:
    """A partition or GRES name as Slurm spells one (no spaces, shell or option characters)."""
    if value is not None and _SLURM_NAME.fullmatch(value) is None:
        raise ValueError(
            f"{value!r} does not match a Slurm name: letters, digits and _.:,=+- only, starting with a letter, "
            "digit or _"
        )
    return value


_SlurmName = Annotated[str | None, AfterValidator(_slurm_name)]


class SlurmLaunch(BaseModel):
    """Resources of a Slurm launch; all of them are in the approved argv."""

    model_config = ConfigDict(extra="forbid")

    nodes: Annotated[int, Field(ge=1, le=4096, description="Nodes to allocate.")] = 1
    ntasks_per_node: Annotated[
        int,
        Field(
            ge=1,
            le=1024,
            description="Tasks per node: one per rank for `python train.py` (srun numbers the ranks), or 1 "
            "with a `torchrun` command (torchrun starts the node's ranks; its rendezvous is set from the "
            "allocation).",
        ),
    ] = 1
    cpus_per_task: Annotated[int | None, Field(ge=1, le=4096, description="CPUs per task.")] = None
    gres: Annotated[_SlurmName, Field(description="Generic resources per node, e.g. 'gpu:8'.")] = None
    partition: Annotated[_SlurmName, Field(description="Partition; default: the cluster's default.")] = None


class TensorCapture(BaseModel):
    """Tensors the harness writes itself at one step, as a dump_tensors call in the script would."""

    model_config = ConfigDict(extra="forbid")

    step: Annotated[
        int,
        Field(
            ge=1,
            description="Steps completed when the file is written (right after that update: an optimizer's, or "
            "one by hand, whose gradients are written as the update left them). Below "
            "warmup_steps keeps the windows as planned; inside a window it discards that window, which restarts "
            "after a fresh warm-up.",
        ),
    ]
    what: Annotated[
        list[Literal["parameters", "gradients", "optimizer_state"]],
        Field(
            min_length=1,
            description="parameters (by name, e.g. 'fc.weight'), gradients (grad/<name>), optimizer_state "
            "(optimizer/<name>/<key>) of the top-level module and the optimizer that steps.",
        ),
    ] = Field(default_factory=lambda: ["parameters"])
    path: Annotated[
        str,
        Field(
            min_length=1,
            max_length=500,
            description="safetensors file relative to cwd; {label}, {launch} (the workspace's launch number, "
            "unique per launch), {rank} are filled in as dump_tensors does.",
        ),
    ] = "captures/{label}-{launch}.safetensors"

    @model_validator(mode="after")
    def _inside(self) -> TensorCapture:
        if os.path.isabs(self.path) or ".." in Path(self.path).parts:
            raise ValueError(f"capture path {self.path!r} must be relative to cwd, without '..'")
        return self


class RunBenchmarkWindowInput(BaseModel):
    model_config = ConfigDict(extra="forbid")

    command: Annotated[
        list[str],
        Field(
            min_length=1,
            description="Training command as an argv list, e.g. ['python', 'train.py', '--steps', '200'] or "
            "['torchrun', '--nproc-per-node', '8', 'train.py']. With timing='harness' perfgate puts its harness in "
            "front of the script (give the command alone); the script should run at least warmup + measure "
            "optimizer steps.",
        ),
    ]
    cwd: Annotated[str, Field(description="Working directory, relative to the workspace.")] = "."
    env: Annotated[
        dict[str, str], Field(description="Environment variables to set for the run (changes only).")
    ] = Field(default_factory=dict[str, str])
    warmup_steps: Annotated[int, Field(ge=0, description="Optimizer steps excluded before each window.")] = 5
    measure_steps: Annotated[int, Field(ge=1, description="Optimizer steps per measured window.")] = 20
    repeats: Annotated[
        int,
        Field(ge=1, le=50, description="Independent windows; each is a separate launch unless same_process."),
    ] = 3
    same_process: Annotated[
        bool,
        Field(
            description="Measure the repeats as consecutive windows of one launch (faster, but blind to "
            "launch-to-launch variation)."
        ),
    ] = False
    job: Annotated[
        bool,
        Field(
            description="Measure the whole job beside the windows: each launch runs to its own end (not stopped "
            "after the windows), and the answer's `job` splits the time to its last step into start-up, the first "
            "steps' compile/warm-up beyond the steady step, the steps, evaluation passes (forwards under no_grad), "
            "checkpoints (torch.save) and phases marked with `with perfgate.harness.phase(name):`, on the server's "
            "clock. compare_benchmarks then compares the jobs too. Not with timing='log'."
        ),
    ] = False
    resume_of: Annotated[
        str | None,
        Field(
            description="This launch resumes from a checkpoint: evidence id of the uninterrupted job=true run "
            "of the same command (this command is it plus the resume option, same cwd, its env kept). The "
            "answer's `checkpoint_resume` says whether a checkpoint that run saved was loaded and whether the "
            "loss matches that run's at the aligned steps; the keep's checkpoint_resume gate reads it. Needs "
            "job=true."
        ),
    ] = None
    timeout_s: Annotated[float, Field(gt=0, description="Wall-clock limit per launch, seconds.")] = 600.0
    stall_s: Annotated[
        float | None,
        Field(
            gt=0,
            description="End a launch that makes no progress (no step boundary, no output line) for this many "
            "seconds, start-up included, after capturing each rank's Python stack (and the flight recorder's "
            "last collective where TORCH_FR_BUFFER_SIZE is set): the answer's `hang` names the ranks and the "
            "collective that disagree. Default: once a step was observed, max(60 s, 20 x the slowest step), "
            "and only when every rank that answered waits in a torch.distributed call. Not with detach.",
        ),
    ] = None
    timing: Annotated[
        Timing,
        Field(
            description="'harness': optimizer updates are steps, no code change; 'explicit': the script "
            "times itself with perfgate.harness.Window; 'log': parse step times from stdout (last resort)."
        ),
    ] = "harness"
    log_pattern: Annotated[
        str | None,
        Field(
            description="timing='log': regex with named groups `step` and `step_time_ms`, searched per line."
        ),
    ] = None
    samples_per_step: Annotated[
        int | None,
        Field(
            ge=1, description="Global samples per optimizer step (all ranks); default: counted from batches."
        ),
    ] = None
    tokens_per_step: Annotated[
        int | None, Field(ge=1, description="Global tokens per optimizer step (all ranks).")
    ] = None
    label: Annotated[
        str | None,
        Field(
            description="Free-form label, e.g. 'baseline' or 'candidate'; dump_tensors fills {label} in its path "
            "with it (and {launch} with the launch's number), so every launch of each side writes a file of its "
            "own from one line of code."
        ),
    ] = None
    contract: Annotated[
        BenchmarkContract,
        Field(description="Declared invariants and execution settings; compare_benchmarks relies on them."),
    ] = Field(default_factory=BenchmarkContract)
    capture: Annotated[
        TensorCapture | None,
        Field(
            description="timing='harness': the harness writes the model's tensors at this step itself (no script "
            "edit), bound to the run like a dump_tensors file; compare_tensors reads it."
        ),
    ] = None
    environment_id: Annotated[
        str | None, Field(description="collect_env evidence id of the environment this runs in.")
    ] = None
    harness_on_path: Annotated[
        bool,
        Field(
            description="Put perfgate's copy on PYTHONPATH, for a script that imports perfgate itself "
            "(timing='explicit') in an interpreter that lacks it (otherwise `pip install perfgate` there). "
            "timing='harness' starts the harness from that copy anyway."
        ),
    ] = False
    reason: Annotated[
        str, Field(max_length=2000, description="Why this run is needed (shown to the approver).")
    ] = ""
    launcher: Annotated[
        Launcher,
        Field(
            description="'local': the command runs on the server's machine (a `torchrun` command included); "
            "'slurm': each launch is a Slurm job (salloc + srun from this machine, resources in `slurm`), "
            "every rank under the harness, records returned through srun's output (no shared filesystem "
            "needed); the time limit is timeout_s rounded up to minutes; cancel maps to scancel."
        ),
    ] = "local"
    slurm: Annotated[
        SlurmLaunch | None,
        Field(
            description="launcher='slurm': nodes, tasks per node, CPUs, GRES, partition (approved as a whole)."
        ),
    ] = None
    detach: Annotated[
        bool,
        Field(
            description="Start the run and return a run_id at once (same approval); the run outlives this call, "
            "a client disconnect and a server restart. Follow it with benchmark_run(action='status'|'wait'|"
            "'result'|'cancel', run_id=...); 'result' records the same evidence a blocking call would."
        ),
    ] = False

    @model_validator(mode="after")
    def _pattern_matches_timing(self) -> RunBenchmarkWindowInput:
        if (self.timing == "log") != (self.log_pattern is not None):
            raise ValueError("log_pattern is required with timing='log' and only used with it")
        if self.stall_s is not None and self.detach:
            raise ValueError("stall_s is watched by a blocking call only; leave it out with detach=true")
        if self.slurm is not None and self.launcher != "slurm":
            raise ValueError("slurm resources are only used with launcher='slurm'")
        if self.job and self.timing == "log":
            raise ValueError(
                "job=true needs the harness (timing='harness' or 'explicit'): a log-timed run already runs to its "
                "end, and its phases are not seen"
            )
        if self.resume_of is not None and not self.job:
            raise ValueError(
                "resume_of needs job=true: the checkpoint a launch loads and every step's loss are kept only in "
                "a whole-job run; call again with job=true"
            )
        if self.capture is not None:
            if self.timing != "harness":
                raise ValueError(
                    "capture needs timing='harness' (its optimizer hook finds the model); with explicit timing "
                    "call perfgate.harness.dump_tensors in the script"
                )
            last = self.warmup_steps + self.measure_steps * (self.repeats if self.same_process else 1)
            if self.capture.step >= last and not self.job:
                raise ValueError(
                    f"capture step {self.capture.step} is never reached: the harness ends the script after step "
                    f"{last}; capture before step {self.warmup_steps} to keep the windows as planned"
                )
        return self


class RunBenchmarkWindowOutput(BaseModel):
    summary: str | None = Field(
        default=None, description="job=true: the whole job in one line (the `job` field has its parts)."
    )
    evidence_id: str
    state: EvidenceState
    exit_code: int | None = Field(
        description="Exit status of the last launch (0 when the harness stopped it)."
    )
    failure_reason: str | None = Field(description="Why the evidence is failed, when it is.")
    hang: HangDiagnosis | None = Field(
        default=None,
        description="A launch stopped making progress: each rank's Python stack top, the collective it waits "
        "in, and the ranks that disagree (the run was ended when ended_run). Full dumps: stacks_artifact.",
    )
    label: str | None
    timing: Timing
    world_size: int | None
    device: str | None = Field(description="Device kind and name the ranks timed (rank 0).")
    windows_measured: int
    steps_measured: int = Field(description="Measured steps over all windows (warm-up excluded).")
    median_step_ms: float | None = Field(
        description="Median step time of the slowest rank, pooled over windows."
    )
    p95_step_ms: float | None
    iqr_ratio: float | None = Field(description="IQR / median of the pooled step times.")
    noisy: bool | None = Field(
        description="iqr_ratio >= 0.10: re-measure on a quieter machine or longer windows."
    )
    throughput: Throughput | None
    peak_memory_bytes: int | None = Field(description="Max over ranks of the window's peak memory.")
    peak_memory_kind: Literal["device_allocated", "host_rss"] | None
    peak_memory_unavailable: str | None = Field(
        default=None,
        description="Why peak memory is null for a measured run: it could not be observed here (the keep's "
        "peak_memory gate is then unavailable, never passed).",
    )
    data_wait_fraction: float | None = Field(
        description="Worst rank's share of time blocked on data loading."
    )
    slowest_rank: int | None
    rank_skew: float | None = Field(description="Busy time of the slowest rank over the fastest's, minus 1.")
    ranks: list[RankResult]
    windows: list[WindowResult]
    step_series_artifact: str | None = Field(description="Artifact with every window's per-step times.")
    artifacts: list[str]
    contract_problems: list[str] = Field(description="Where the run contradicted the declared contract.")
    measured_batch: int | None = Field(
        default=None,
        description="Global samples per optimizer step measured by the harness over the measured steps: the "
        "leading dimension of the top-level module's inputs (every micro-batch), else the DataLoader batches; "
        "null: unverified (see batch_source). compare_benchmarks refuses sides that differ in it.",
    )
    sample_streams: list[str | None] = Field(
        default_factory=list[str | None],
        description="Per launch: a digest of the inputs of the first training forwards of the warm-up, over "
        "all ranks (null: not read, e.g. no warm-up). Sides whose launches agree within each side but differ "
        "between them changed the data path: the keep then needs a sample audit.",
    )
    batch_source: Literal["model_inputs", "data_loader", "unverified"] | None = Field(
        default=None,
        description="Where measured_batch comes from; 'unverified': neither a top-level module's forward nor a "
        "DataLoader batch was seen on every measured step (the batch is only what was declared).",
    )
    environment_fingerprint: dict[str, str | None]
    provenance: RunProvenance | None = Field(
        default=None, description="What ran: argv, env changes, code state, digests of files argv names."
    )
    warnings: list[str]
    health: TrainingHealth | None = Field(
        default=None,
        description="Loss health over the measured steps (losses read at window edges only), non-finite "
        "losses on any rank, updates GradScaler skipped; null when no scalar loss went through backward().",
    )
    job: JobSummary | None = Field(
        default=None,
        description="job=true: the whole job, each figure the median over launches: wall time, time to the "
        "last step, and its parts (startup, warmup_excess, steps, eval, checkpoint, marked phases, "
        "after_last_step).",
    )
    checkpoint_resume: ResumeCheck | None = Field(
        default=None,
        description="resume_of: the resumed launches against the uninterrupted run (checkpoint loaded, the "
        "step it was saved at, loss agreement at the aligned steps).",
    )
    saved_states: list[SavedState] = Field(
        default_factory=list[SavedState],
        description="Each distinct state the run's checkpoint writers (torch.save, DCP save, safetensors "
        "save_file) were handed, rank 0: keys, shapes, dtypes and a digest. The keep's checkpoint_resume gate "
        "compares the baseline's with the candidate's: run a side with job=true for its end-of-run save to "
        "be seen.",
    )
    job_launches: list[JobTiming] = Field(
        default_factory=list[JobTiming], description="job=true: each launch's whole job."
    )
    job_health: JobHealth | None = Field(
        default=None,
        description="Health over every step the harness recorded (warm-up, windows, steps after them): what "
        "check_training_health judges; null when no scalar loss went through backward().",
    )
    host_load: list[HostLoad] = Field(
        default_factory=list[HostLoad],
        description="Per launch: other processes' CPU use on the host while it ran (/proc at its edges); "
        "measured=false means unknown, never idle.",
    )
    tensor_dumps: list[TensorDump] = Field(
        default_factory=list[TensorDump],
        description="Files perfgate.harness.dump_tensors wrote in the launched processes: they are this run's "
        "output, and compare_tensors binds a file with these bytes to this record (its launch and code state).",
    )
    outputs: list[RunOutput] = Field(
        default_factory=list[RunOutput],
        description="Option values of the command the launches wrote (created or changed on disk while they ran: "
        "dumps, checkpoints, logs, output folders): outputs of this run, not settings, so two calls that differ "
        "only there are one candidate. A value the run did not write stays a setting.",
    )
    launch_ids: list[int | None] = Field(
        default_factory=list[int | None],
        description="Per launch: the id the server gave it (PERFGATE_LAUNCH_ID, the `session` of the sample "
        "records perfgate.harness recorders wrote in it, and what {launch} in a dump path becomes); a keep "
        "binds a sample audit to these launches.",
    )
    reported_metrics: dict[str, float] = Field(
        default_factory=dict[str, float],
        description="Task-quality metrics the run reported with perfgate.harness.report_metric (rank 0 of the "
        "last launch): check_training_health offers them as eval:<name>.",
    )
    logged_settings: dict[str, str] = Field(
        default_factory=dict[str, str],
        description="MoE dispatcher and graph arguments the run's own stdout listed at start-up (Megatron's "
        "argument listing, e.g. moe_token_dispatcher_type: flex), read by the server: what the job was told, "
        "not what ran. The backend gate quotes it; only a trace passes it.",
    )
    timing_checks: list[TimingCheck] = Field(
        default_factory=list[TimingCheck],
        description="Per launch: the harness's figures checked against the server's own observation (its "
        "clock on each step boundary as it arrived, the launch's duration) and the windows against the steady "
        "steps around them. A launch that is untrusted or measurement_dependent supports no keep; a noisy one "
        "does, and its `next` says what settles it.",
    )
    harness_overhead: HarnessOverhead | None = Field(
        default=None,
        description="perfgate's own time per step and at start-up, as the harness timed itself (its `note` "
        "says it in one line): a figure the harness reports about itself, which no gate reads. Above 3% of "
        "the median step the warnings say so.",
    )
    replicas: list[ReplicaCheck] = Field(
        default_factory=list[ReplicaCheck],
        description="Per launch of a multi-rank run: whether the data-parallel replicas hold identical "
        "parameters after the last measured update. A launch whose replicas disagree supports no keep.",
    )
    model: ModelFacts | None = Field(
        default=None,
        description="The top-level training module the harness saw (first launch, rank 0): class, parameter "
        "counts and a structure digest; compare_benchmarks says 'training may differ' when the sides' differ.",
    )
    launch_started_unix_s: list[float] = Field(
        default_factory=list[float],
        description="Per launch: when it started, Unix seconds on the server's clock (empty for detached runs); "
        "compare_benchmarks reads the launch order and the drift of the host from them.",
    )
    launch_host_speed: list[float] = Field(
        default_factory=list[float],
        description="Per launch: the server's fixed CPU probe just before and after it (additions per second, "
        "geometric mean): the host's speed at the time, which compare_benchmarks compares across calls.",
    )
    profiled: bool = False
    run_id: str | None = Field(
        default=None, description="Detached runs: the id for benchmark_run (status, wait, result, cancel)."
    )
