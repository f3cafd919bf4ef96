"""run_benchmark_window: launch the training command and time steady-state windows per rank.

The record reader, the window summaries (numpy, msgspec) and the harness are imported where they are
used, to keep server start-up fast.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import shutil
import time
from collections.abc import Awaitable, Callable, Generator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

import anyio.from_thread
import anyio.to_thread
from pydantic import BaseModel, ConfigDict, Field, model_validator

from perfgate._loglines import capped_lines
from perfgate._statefs import fresh_dir, remove_tree
from perfgate.benchmarking import BenchmarkError, Contract, RecordError, check_contract
from perfgate.benchmarking.contract import check_observed
from perfgate.benchmarking.corroborate import TimingCheck, corroborate_launch
from perfgate.benchmarking.drift import host_speed_probe
from perfgate.benchmarking.launch import (
    harness_entry,
    harness_pythonpath,
    launch_env,
    prepare_harness_path,
    wrap_command,
)
from perfgate.benchmarking.logparse import compile_pattern, log_window, parse_step_log
from perfgate.errors import ToolError
from perfgate.evidence import EvidenceState
from perfgate.execution.executor import CommandResult
from perfgate.execution.request import CommandRequest
from perfgate.execution.slurm import SlurmResources, submission_argv, time_limit_minutes
from perfgate.execution.ticks import LaunchTicks, TickListener
from perfgate.harness.ticks import TICKS_ENV
from perfgate.quoting import file_text
from perfgate.report.plots import step_times_png
from perfgate.tools._health import TrainingHealth, health_model
from perfgate.tools._runtime import EvidenceBuilder, ToolRuntime
from perfgate.tools._spec import ToolSpec
from perfgate.traces.hostload import HostLoadSampler, busy_neighbour
from perfgate.traces.models import HostLoad

if TYPE_CHECKING:
    from perfgate.benchmarking.aggregate import RunSummary, WindowSummary
    from perfgate.benchmarking.records import RankRecord

__all__ = [
    "SPEC",
    "BenchmarkContract",
    "RunBenchmarkWindowInput",
    "RunBenchmarkWindowOutput",
    "command",
    "run",
]

Timing = Literal["harness", "explicit", "log"]
Launcher = Literal["local", "slurm"]
_SLURM_NAME = r"^[A-Za-z0-9_][A-Za-z0-9_.:,=+-]{0,127}$"


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
    gres: Annotated[
        str | None, Field(pattern=_SLURM_NAME, description="Generic resources per node, e.g. 'gpu:8'.")
    ] = None
    partition: Annotated[
        str | None, Field(pattern=_SLURM_NAME, description="Partition; default: the cluster's default.")
    ] = None


class TensorCapture(BaseModel):
    """Tensors the harness writes itself at one step, as a dump_tensors call in the script would."""

    model_config = ConfigDict(extra="forbid")

    step: Annotated[
        int,
        Field(
            ge=1,
            description="Optimizer steps completed when the file is written (right after that update). Below "
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
            description="safetensors file relative to cwd; {label}, {launch}, {rank} are filled in as dump_tensors "
            "does.",
        ),
    ] = "captures/{label}.safetensors"

    @model_validator(mode="after")
    def _inside(self) -> TensorCapture:
        if os.path.isabs(self.path) or ".." in Path(self.path).parts:
            raise ValueError(f"capture path {self.path!r} must be relative to cwd, without '..'")
        return self


class BenchmarkContract(BaseModel):
    model_config = ConfigDict(extra="forbid")

    invariants: dict[str, Any] = Field(
        default_factory=dict[str, Any],
        description="Semantic settings that must stay fixed between baseline and candidate: model, dataset, "
        "precision, global_batch (these four are required for a keep), seq_len, loss, optimizer, "
        "optimizer_hparams, sampling, seed, ... (vocabulary keys, JSON values).",
    )
    execution: dict[str, Any] = Field(
        default_factory=dict[str, Any],
        description="Execution settings an optimization may change: microbatch, accumulation, world_size, "
        "data_parallel, tensor_parallel, pipeline_parallel, compile, workers, pin_memory, fused_kernels, "
        "attention_backend, threads, ... A semantic key here is refused. Checked: global_batch = microbatch "
        "x accumulation x data_parallel.",
    )
    classes: dict[str, Literal["semantic", "execution"]] = Field(
        default_factory=dict[str, Literal["semantic", "execution"]],
        description="Class of each key outside the vocabulary: 'semantic' (changes what is computed or "
        "learned) or 'execution' (only how it runs). Unclassified unknown keys are refused.",
    )

    @model_validator(mode="after")
    def _canonical(self) -> BenchmarkContract:
        """Keys under their vocabulary names from here on: what is recorded, compared and gated."""
        try:
            contract = Contract(self.invariants, self.execution, dict(self.classes))
        except BenchmarkError as exc:
            raise ValueError(str(exc)) from exc
        self.invariants, self.execution = contract.invariants, contract.execution
        self.classes = {k: v for k, v in contract.classes.items() if v in ("semantic", "execution")}  # type: ignore[misc]  # values validated above
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
    timeout_s: Annotated[float, Field(gt=0, description="Wall-clock limit per launch, seconds.")] = 600.0
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
            "with it, so the two sides' runs write a file each from one line of code."
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
        if self.slurm is not None and self.launcher != "slurm":
            raise ValueError("slurm resources are only used with launcher='slurm'")
        if self.capture is not None:
            if self.timing != "harness":
                raise ValueError(
                    "capture needs timing='harness' (its optimizer hook finds the model); with explicit timing "
                    "call perfgate.harness.dump_tensors in the script"
                )
            last = self.warmup_steps + self.measure_steps * (self.repeats if self.same_process else 1)
            if self.capture.step >= last:
                raise ValueError(
                    f"capture step {self.capture.step} is never reached: the harness ends the script after step "
                    f"{last}; capture before step {self.warmup_steps} to keep the windows as planned"
                )
        return self


class Throughput(BaseModel):
    samples_per_s: float | None = Field(description="Global samples per second; null when not counted.")
    tokens_per_s: float | None = Field(description="Global tokens per second; null when not given.")
    steps_per_s: float = Field(description="Optimizer steps per second.")
    basis: str = Field(description="How it was computed.")


class NodeFacts(BaseModel):
    """What a rank saw of its node (read by the harness before its first window)."""

    hostname: str | None = None
    slurm_job_id: str | None = None
    slurm_node: str | None = None
    device: str | None = Field(default=None, description="Device kind and name this rank timed on.")
    cpus: int | None = Field(default=None, description="CPUs this rank may run on.")
    visible_devices: dict[str, str] = Field(
        default_factory=dict[str, str], description="Device visibility variables (CUDA_VISIBLE_DEVICES, ...)."
    )
    interconnect: list[str] = Field(
        default_factory=list[str], description="RDMA devices visible (/sys/class/infiniband); [] = none seen."
    )
    network: list[str] = Field(default_factory=list[str], description="Non-loopback network interfaces.")
    comm_env: dict[str, str] = Field(
        default_factory=dict[str, str], description="NCCL/Gloo interface settings in the rank's environment."
    )


class RankResult(BaseModel):
    rank: int
    median_step_ms: float
    p95_step_ms: float
    iqr_ratio: float
    steps_measured: int
    elapsed_s: float
    data_wait_fraction: float = Field(
        description="Share of the rank's window spent blocked on the DataLoader."
    )
    collective_wait_fraction: float = Field(
        description="Estimated share spent waiting for other ranks (backward time above the fastest rank's)."
    )
    peak_allocated_bytes: int | None
    peak_reserved_bytes: int | None
    host_peak_rss_bytes: int | None
    step_time_source: str = Field(description="'device_events', 'host' or 'log'.")
    hostname: str | None = Field(default=None, description="Host the rank ran on (first launch).")
    node: NodeFacts | None = Field(default=None, description="The rank's node as it saw it (first launch).")


class WindowResult(BaseModel):
    launch: int
    index: int
    median_step_ms: float
    p95_step_ms: float
    iqr_ratio: float
    noisy: bool
    steps: int
    elapsed_s: float
    samples_per_s: float | None
    tokens_per_s: float | None
    steps_per_s: float
    slowest_rank: int
    rank_skew: float


class CodeState(BaseModel):
    commit: str | None = Field(description="git commit of the workspace at launch; null when unknown.")
    dirty: bool | None = Field(
        description="Uncommitted changes to tracked files, untracked files, or files the run can import or "
        "execute that no commit holds (ignored ones included)."
    )
    diff_sha256: str | None = Field(
        description="sha256 of the diff against HEAD, read without running git; files that can run and no "
        "commit holds appear in it as new files."
    )
    diff_files: dict[str, str] = Field(description="Path -> sha256 of that path's section of the diff.")
    diff_artifact: str | None = Field(description="The dirty diff itself, as an artifact of this evidence.")
    unknown_reason: str | None = Field(
        description="Why the code state is unknown (no git, not a repository)."
    )


class TensorDump(BaseModel):
    path: str = Field(description="The file dump_tensors wrote, relative to the workspace when inside it.")
    digest: str = Field(
        description="Its content digest with the algorithm's name (hashed as it was written): 'blake3:<hex>', or "
        "'sha256:<hex>' in a run record written before BLAKE3."
    )
    size_bytes: int
    launch: int = Field(description="The launch (0-based) whose process wrote it.")
    rank: int
    step: int = Field(description="Steps completed in that process when it was written.")


class ModelFacts(BaseModel):
    name: str = Field(description="Class of the top-level module that trained (module.qualname).")
    parameters: int = Field(description="Its parameter count (elements).")
    trainable_parameters: int = Field(description="Parameters with requires_grad.")
    structure: str = Field(description="Digest of every parameter's name, shape and dtype.")


class RunProvenance(BaseModel):
    argv: list[str] = Field(description="The training command as given (before the harness wrapper).")
    cwd: str
    env_changes: list[str] = Field(description="Names of the environment variables this run set.")
    code: CodeState
    files: dict[str, str] = Field(
        description="sha256 of each workspace file the argv names (script, configs; untracked included)."
    )


class RunBenchmarkWindowOutput(BaseModel):
    evidence_id: str
    state: EvidenceState
    exit_code: int | None = Field(
        description="Exit status of the last launch (0 when the harness stopped it)."
    )
    failure_reason: str | None = Field(description="Why the evidence is failed, when it is.")
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
    reported_metrics: dict[str, float] = Field(
        default_factory=dict[str, float],
        description="Task-quality metrics the run reported with perfgate.harness.report_metric (rank 0 of the "
        "last launch): check_training_health offers them as eval:<name>.",
    )
    timing_checks: list[TimingCheck] = Field(
        default_factory=list[TimingCheck],
        description="Per launch: the harness's figures checked against the server's own observation (its "
        "clock on each step boundary as it arrived, the launch's duration) and the windows against the steady "
        "steps around them. A launch that is untrusted or measurement_dependent supports no keep.",
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


# --------------------------------------------------------------------------- the command


def tensor_dumps(rt: ToolRuntime, launch: int, records: list[RankRecord]) -> list[TensorDump]:
    """The dumps each rank's record names, with paths relative to the workspace where inside it."""
    return [
        TensorDump(
            path=rt.relative(Path(d.path)),
            digest=digest,
            size_bytes=d.size_bytes,
            launch=launch,
            rank=r.rank,
            step=d.step,
        )
        for r in records
        for d in r.tensor_dumps
        if (digest := d.named_digest) is not None
    ]


def _run_dir(inp: RunBenchmarkWindowInput, rt: ToolRuntime) -> Path:
    # Deterministic in the input: the approved request must be identical on every gate round.
    key = hashlib.sha256(json.dumps(inp.model_dump(mode="json"), sort_keys=True).encode()).hexdigest()[:16]
    # In the trust root: the harness writes its records where only the operator can write, so the agent
    # cannot replace them while the run goes on (nor plant links that the run's cleanup would follow).
    return rt.private_dir / "bench-runs" / key


def ticks_path(run_dir: Path) -> Path:
    """The FIFO the harness sends step boundaries to (named in the request's env, so it is approved)."""
    return run_dir / "ticks"


def _windows_per_launch(inp: RunBenchmarkWindowInput) -> int:
    return inp.repeats if inp.same_process else 1


LOG_PATTERN_ENV = "PERFGATE_LOG_PATTERN"
"""The request's environment carries the log pattern, so the approval digest covers it."""


def command(inp: RunBenchmarkWindowInput, rt: ToolRuntime) -> CommandRequest:
    """The launch this call runs (once per launch, identically); validates the contract first.

    Raises:
        ToolError: an inconsistent contract, or a command the harness cannot be inserted into.
    """
    from perfgate.harness import HarnessConfig
    from perfgate.harness.config import default_guard_steps

    state = rt.ledger.trust.state_dir
    copy = harness_pythonpath(state)
    if inp.launcher == "slurm":
        # Said before launch_env's refusal of PET_* (which names no Slurm way to give them).
        steering = sorted(k for k in inp.env if k.startswith(("SLURM_", "SALLOC_", "SBATCH_", "PET_")))
        if steering:
            raise ToolError(
                f"env sets {', '.join(steering)}: Slurm and torchrun read these as job options; give resources "
                "through slurm={nodes, ntasks_per_node, cpus_per_task, gres, partition} and the time limit "
                "through timeout_s, so the approval shows them as the submission"
            )
    try:
        contract = Contract(
            dict(inp.contract.invariants), dict(inp.contract.execution), dict(inp.contract.classes)
        )
        problems = check_contract(contract)
        argv = (
            wrap_command(inp.command, harness_entry(copy)) if inp.timing == "harness" else list(inp.command)
        )
        if inp.timing == "log":
            compile_pattern(inp.log_pattern or "")
        env = launch_env(dict(inp.env), rt.ledger.trust.pycache_dir, copy if inp.harness_on_path else None)
    except BenchmarkError as exc:
        raise ToolError(str(exc)) from exc
    global_batch = contract.invariants.get("global_batch")
    if (
        inp.samples_per_step is not None
        and isinstance(global_batch, int)
        and inp.samples_per_step != global_batch
    ):
        problems.append(f"samples_per_step {inp.samples_per_step} != contract global_batch {global_batch}")
    if problems:
        raise ToolError(
            "the contract is inconsistent: " + "; ".join(problems) + ". Fix the contract and call again."
        )
    cwd = rt.resolve_path(inp.cwd, kind="dir")
    if inp.timing != "log":
        cfg = HarnessConfig(
            record_dir=str(_run_dir(inp, rt) / "records"),
            warmup_steps=inp.warmup_steps,
            measure_steps=inp.measure_steps,
            windows=_windows_per_launch(inp),
            timing="optimizer" if inp.timing == "harness" else "explicit",
            progress_every=max(1, (inp.warmup_steps + inp.measure_steps) // 5),
            guard_steps=default_guard_steps(inp.measure_steps),
            label=inp.label,
        )
        if inp.capture is not None:
            cfg = cfg.with_overrides(
                capture_step=inp.capture.step,
                capture_what=tuple(inp.capture.what),
                capture_path=inp.capture.path,
            )
        env.update(cfg.to_env())
        if inp.launcher != "slurm":  # srun's nodes cannot reach this machine's FIFO
            env[TICKS_ENV] = str(ticks_path(_run_dir(inp, rt)))
    else:
        # Bound to the approval: the human sees which lines will be read as step times, and a changed
        # pattern needs a new approval. The launched program ignores this variable.
        env[LOG_PATTERN_ENV] = inp.log_pattern or ""
    launches = 1 if inp.same_process else inp.repeats
    if inp.launcher == "slurm":
        path = inp.env.get("PATH", os.environ.get("PATH", os.defpath))
        missing = [p for p in ("salloc", "srun", "scancel", "squeue") if shutil.which(p, path=path) is None]
        if missing:
            raise ToolError(
                f"launcher='slurm' needs {', '.join(missing)} on this machine's PATH: run the perfgate server on "
                "a login node of the cluster, or use launcher='local'"
            )
        argv = submission_argv(_slurm_resources(inp), argv)
    return CommandRequest(
        argv=tuple(argv),
        cwd=cwd,
        env=env,
        timeout_s=inp.timeout_s,
        reason=inp.reason
        or f"run_benchmark_window: {launches} launch(es), {inp.repeats} window(s) of {inp.measure_steps} steps "
        f"after {inp.warmup_steps} warm-up steps ({inp.timing} timing)",
    )


def _slurm_resources(inp: RunBenchmarkWindowInput) -> SlurmResources:
    s = inp.slurm or SlurmLaunch()
    return SlurmResources(
        nodes=s.nodes,
        ntasks_per_node=s.ntasks_per_node,
        cpus_per_task=s.cpus_per_task,
        gres=s.gres,
        partition=s.partition,
        time_minutes=time_limit_minutes(inp.timeout_s),
    )


# --------------------------------------------------------------------------- the run


class _Failure(Exception):
    """A launch did not yield the windows asked for; the evidence is recorded as failed."""


def _launch_failure(result: CommandResult) -> str:
    tail = result.stderr.tail
    if "No module named perfgate" in tail or "No module named 'perfgate'" in tail:
        return (
            "the training interpreter cannot import perfgate: `pip install perfgate` in that environment, or "
            "call again with harness_on_path=true"
        )
    last = tail.strip().splitlines()[-1] if tail.strip() else ""
    return f"{result.summary()}" + (f"; last stderr line: {file_text(last)}" if last else "")


def _harness_windows(
    inp: RunBenchmarkWindowInput, records: list[RankRecord], problems: list[str]
) -> list[WindowSummary]:
    from perfgate.benchmarking import summarize_window

    if problems:
        raise _Failure("; ".join(problems))
    want = _windows_per_launch(inp)
    for r in records:
        if r.profiled:
            raise _Failure(f"rank {r.rank} ran under the profiler: profiled runs are not throughput evidence")
        if len(r.windows) < want:
            measured = max(0, r.steps.count - r.warmup_steps)
            why = r.error or r.stop_reason or "unknown"
            restarted = [n for n in r.notes if "restarts at step" in n]
            raise _Failure(
                f"rank {r.rank} measured {measured} of {want * r.measure_steps} steps after warm-up "
                f"(the script ended: {why}); run more steps or lower warmup_steps/measure_steps"
                + (f"; {restarted[0]}" if restarted else "")
            )
    return [summarize_window(records, k, inp.samples_per_step, inp.tokens_per_step) for k in range(want)]


def _log_windows(inp: RunBenchmarkWindowInput, stdout: Path) -> list[WindowSummary]:
    from perfgate.benchmarking.aggregate import windows_from_series

    pattern = compile_pattern(inp.log_pattern or "")
    with stdout.open(encoding="utf-8", errors="replace") as fh:
        entries = parse_step_log(capped_lines(fh), pattern, check=anyio.from_thread.check_cancelled)
    out: list[WindowSummary] = []
    for k in range(_windows_per_launch(inp)):
        window = log_window(entries, inp.warmup_steps + k * inp.measure_steps, inp.measure_steps)
        if len(window.step_ms) < inp.measure_steps:
            raise _Failure(
                f"the log holds {len(window.step_ms)} of {inp.measure_steps} steps for window {k}: run more steps"
            )
        out.append(windows_from_series(window.step_ms, inp.samples_per_step, inp.tokens_per_step, index=k))
    return out


def _health(records: list[RankRecord]) -> TrainingHealth | None:
    from perfgate.benchmarking.importing import health_from_windows

    by_rank: dict[int, list[Any]] = {}
    for r in records:
        by_rank.setdefault(r.rank, []).extend(r.windows)
    h = health_from_windows(list(by_rank.items()))
    if h is None:
        return None
    steps = [s for r in records for w in r.windows for s in (w.first_step, w.last_step)]
    return health_model(h, None, None, min(steps), max(steps))


def _fingerprint(record: RankRecord | None) -> dict[str, str | None]:
    device = record.device if record is not None else None
    return {
        "device_kind": device.kind if device else None,
        "device_name": device.name if device else None,
        "device_runtime": device.runtime_version if device else None,
        "torch_version": record.torch_version if record else None,
        "python_version": record.python if record else None,
        **((record.runtime_env or {}) if record else {}),
    }


def _collect_records(
    ev: EvidenceBuilder, record_dir: Path, launch: int
) -> tuple[list[RankRecord], list[str]]:
    from perfgate.benchmarking import load_records

    try:
        found = load_records(record_dir)
    except RecordError as exc:
        raise _Failure(str(exc)) from exc
    for path in sorted(record_dir.glob("rank*.json")):
        with path.open("rb") as source:
            ev.copy_in(f"launch{launch}_{path.name}", source)
    return found.records, found.problems


LaunchFn = Callable[[int, str], Awaitable[tuple[int | None, str | None, Path, Path]]]
"""``(launch index, log label) -> (exit code, failure text or None, folder holding its rank records, its
stdout log)``: both in the trust root, where the agent cannot write; never the copies in the workspace."""


async def run(inp: RunBenchmarkWindowInput, rt: ToolRuntime) -> RunBenchmarkWindowOutput:
    request = command(inp, rt)
    if inp.timing == "harness" or inp.harness_on_path:
        await anyio.to_thread.run_sync(prepare_harness_path, harness_pythonpath(rt.ledger.trust.state_dir))
    if inp.detach:
        return await _start_detached(inp, rt, request)
    run_dir = _run_dir(inp, rt)
    with one_run(run_dir, rt):
        return await _run_blocking(inp, rt, request, run_dir)


@contextlib.contextmanager
def one_run(run_dir: Path, rt: ToolRuntime) -> Generator[None]:
    """Hold ``run_dir`` (named after the input) for this call's run, or refuse the call when a run of the
    same input holds it (see `perfgate.execution.rundir`)."""
    from perfgate.execution.rundir import RunDirBusyError, hold_run_dir

    with contextlib.ExitStack() as stack:
        try:
            stack.enter_context(hold_run_dir(run_dir, wait=False))
        except RunDirBusyError as exc:
            raise ToolError(
                f"a {rt.tool} run of this same input is in progress (detached, or another call) and uses "
                f"{rt.relative(run_dir)}: two at once would read each other's records. Wait for it to end "
                "(a detached run_benchmark_window: benchmark_run(action='wait')), then call again"
            ) from exc
        yield


async def _run_blocking(
    inp: RunBenchmarkWindowInput, rt: ToolRuntime, request: CommandRequest, run_dir: Path
) -> RunBenchmarkWindowOutput:
    """`run` without detach, holding ``run_dir``."""
    ev = rt.evidence()
    provenance = await anyio.to_thread.run_sync(_provenance, inp, rt, ev)
    record_dir = run_dir / "records"
    # The server's own folder: what the agent planted at its name is removed, never followed.
    fresh_dir(run_dir)

    host_loads: list[HostLoad] = []
    starts: list[float] = []
    speeds: list[float] = []
    observed: dict[int, LaunchTicks] = {}
    listen = TICKS_ENV in request.env

    async def launch_once(launch: int, label: str) -> tuple[int | None, str | None, Path, Path]:
        fresh_dir(record_dir)
        sampler = HostLoadSampler()
        sampler.start()
        before = await anyio.to_thread.run_sync(host_speed_probe)
        starts.append(time.time())
        with TickListener(ticks_path(run_dir)) if listen else contextlib.nullcontext() as listener:
            result = await rt.run_command(request, ev, label=label, log_dir=run_dir)
        if listener is not None:
            observed[launch] = listener.ticks
        host_loads.append(sampler.stop())
        speeds.append(math.sqrt(before * await anyio.to_thread.run_sync(host_speed_probe)))
        failure = None if result.succeeded else _launch_failure(result)
        return result.exit_code, failure, record_dir, Path(result.stdout.path)

    try:
        return await measure(
            inp,
            rt,
            request,
            ev,
            launch_once,
            provenance,
            host_loads=host_loads,
            observed=observed,
            launch_starts=starts,
            launch_speeds=speeds,
        )
    finally:
        remove_tree(run_dir)


async def measure(
    inp: RunBenchmarkWindowInput,
    rt: ToolRuntime,
    request: CommandRequest,
    ev: EvidenceBuilder,
    launch_once: LaunchFn,
    provenance: RunProvenance | None,
    run_id: str | None = None,
    host_loads: list[HostLoad] | None = None,
    launch_starts: list[float] | None = None,
    launch_speeds: list[float] | None = None,
    observed: dict[int, LaunchTicks] | None = None,
) -> RunBenchmarkWindowOutput:
    """Run (or collect) every launch through ``launch_once``, summarise the windows and commit the record.

    The blocking call and a detached run's result both end here, so their evidence has the same form.
    ``host_loads`` is filled by ``launch_once`` (one per launch) where the launches run here; ``observed``
    (launch -> the server's stamps of its step boundaries) too, where the request named a tick FIFO.
    """
    from perfgate.benchmarking import summarize_run
    from perfgate.benchmarking.series import SERIES_NAME, series_document

    launches = 1 if inp.same_process else inp.repeats
    windows: list[tuple[int, WindowSummary]] = []
    first_record: RankRecord | None = None
    first_launch: list[RankRecord] = []
    all_records: list[RankRecord] = []
    world: int | None = None
    exit_code: int | None = None
    failure: str | None = None
    warnings: list[str] = []
    contract = Contract(
        dict(inp.contract.invariants), dict(inp.contract.execution), dict(inp.contract.classes)
    )
    contract_problems: list[str] = []
    host_loads = [] if host_loads is None else host_loads
    dumps: list[TensorDump] = []
    streams: list[str | None] = []
    reported: dict[str, float] = {}
    checks: list[TimingCheck] = []
    try:
        for launch in range(launches):
            label = f"launch{launch}_" if launches > 1 else ""
            exit_code, launch_failure, record_dir, stdout_log = await launch_once(launch, label)
            if launch < len(host_loads):
                busy = busy_neighbour(host_loads[launch])
                if busy is not None:
                    warnings.append(
                        f"launch {launch}: {busy}: its windows may be slowed; re-measure on a quiet host"
                    )
            if launch_failure is not None:
                raise _Failure(f"launch {launch}: {launch_failure}")
            if inp.timing == "log":
                # Parsing and record reading are CPU-bound: off the event loop, cancellable.
                got = await anyio.to_thread.run_sync(_log_windows, inp, stdout_log)
                world = 1
            else:
                records, problems = await anyio.to_thread.run_sync(_collect_records, ev, record_dir, launch)
                got = _harness_windows(inp, records, problems)
                ticks = observed.get(launch) if observed is not None else None
                checks.append(corroborate_launch(launch, records, ticks))
                first_record = first_record or records[0]
                first_launch = first_launch or records
                all_records.extend(records)
                dumps.extend(tensor_dumps(rt, launch, records))
                streams.append(_launch_stream(records))
                reported = (
                    {k: v for k, v in records[0].metrics.items() if math.isfinite(v)} if records else {}
                )
                world = records[0].world_size
                warnings.extend(f"rank {r.rank}: {note}" for r in records for note in r.notes)
            windows.extend((launch, w) for w in got)
    except _Failure as exc:
        failure = str(exc)
    except BenchmarkError as exc:
        failure = str(exc)

    summary: RunSummary | None = (
        summarize_run([w for _, w in windows]) if windows and failure is None else None
    )
    batch: tuple[int | None, Literal["model_inputs", "data_loader", "unverified"]] | None = None
    if summary is not None and world is not None:
        measured = _measured_samples_per_step(first_launch, inp)
        batch = _measured_batch(first_launch, inp, measured)
        if measured is None:
            measured = batch[0]
        elif batch[0] is not None and batch[0] != measured:
            warnings.append(
                f"the top-level module's inputs held {batch[0]} samples per optimizer step, but the DataLoader "
                f"delivered {measured}: measured_batch is what reached the model"
            )
        device = first_record.device if first_record is not None else None
        contract_problems = check_observed(
            contract,
            world,
            measured,
            backward_per_step=_measured_backward_per_step(first_launch, inp),
            device_kind=device.kind if device else None,
            device_name=device.name if device else None,
        )
        if inp.samples_per_step is not None and measured is not None and measured != inp.samples_per_step:
            contract_problems.append(
                f"samples_per_step {inp.samples_per_step} was given, but the harness counted {measured} samples "
                "per optimizer step"
            )
        if contract_problems:
            # measured beats declared: a window whose run contradicts its contract is no evidence
            failure = "the run contradicts its contract: " + "; ".join(contract_problems)
        elif measured is None and inp.timing != "log":
            warnings.append(
                "global batch unverified: no DataLoader batch and no forward of a module with trainable "
                "parameters was seen on every measured step, so throughput and the global batch rest on what "
                "was declared; compare_benchmarks names it as unverified"
            )
    if inp.capture is not None and all_records:
        captured = {d.launch for d in dumps if d.step == inp.capture.step}
        absent = [n for n in range(launches) if n not in captured]
        if absent:
            warnings.append(
                f"capture at step {inp.capture.step} wrote no file in launch(es) {', '.join(map(str, absent))} "
                "(the rank notes say why): call perfgate.harness.dump_tensors in the script for what the "
                "harness cannot find"
            )
    if not dumps and provenance is not None and any(r.stop_reason == "window_complete" for r in all_records):
        from perfgate.benchmarking.dumps import unreached_dump_warning

        scripts = {name: rt.workspace / name for name in provenance.files}
        unreached = await anyio.to_thread.run_sync(unreached_dump_warning, scripts, inp.warmup_steps)
        if unreached is not None:
            warnings.append(unreached)
    series_name: str | None = None
    if windows:
        series_name = SERIES_NAME
        ev.write_json(series_name, series_document(windows))
    if summary is not None and summary.stats.noisy:
        warnings.append(
            f"noisy windows (IQR/median {summary.stats.iqr_ratio:.2f} >= 0.10): other load on the machine, "
            "too few steps, or periodic work (logging, checkpoints) inside the window"
        )
    if first_launch:
        by_rank = {r.rank: [ns / 1e6 for ns in r.steps.step_time_ns] for r in first_launch}
        title = f"Step time per step ({inp.label or 'window'}, launch 0)"
        await rt.plot(
            ev, "step_times.png", lambda: step_times_png(by_rank, inp.warmup_steps, title), key=True
        )
    distrusted = [
        f"launch {c.launch}: {c.status}, {c.consistency}: {'; '.join(c.reasons[:2])}"
        for c in checks
        if c.blocks_keep
    ]
    if distrusted:
        # first: these figures cannot support a keep, whatever else the answer says
        warnings.insert(0, "timing not corroborated, no keep can rest on this run: " + " | ".join(distrusted))
    out = _output(inp, ev, rt, summary, windows, world, first_record, exit_code, failure, warnings)
    out.timing_checks = checks
    out.health = _health(all_records) if summary is not None else None
    if out.health is not None and out.health.verdict == "unhealthy":
        out.warnings.append("training health: " + "; ".join(out.health.findings[:3]))
    _attach_nodes(out, first_launch)
    out.contract_problems = contract_problems
    out.sample_streams = streams
    if batch is not None:
        out.measured_batch, out.batch_source = batch
    out.provenance = provenance
    out.step_series_artifact = series_name
    out.host_load = host_loads
    out.launch_started_unix_s = list(launch_starts or [])
    out.launch_host_speed = list(launch_speeds or [])
    if first_record is not None and first_record.model is not None:
        m = first_record.model
        out.model = ModelFacts(
            name=m.name,
            parameters=m.parameters,
            trainable_parameters=m.trainable_parameters,
            structure=m.structure,
        )
    out.tensor_dumps = dumps
    out.reported_metrics = reported
    out.run_id = run_id
    return await rt.commit(
        ev, out, command=list(request.argv), exit_code=exit_code, environment_id=inp.environment_id
    )


def _attach_nodes(out: RunBenchmarkWindowOutput, records: list[RankRecord]) -> None:
    """Each rank's host and node facts (from the first launch's records) on its result row."""
    by_rank = {r.rank: r for r in records}
    for row in out.ranks:
        rec = by_rank.get(row.rank)
        if rec is None:
            continue
        row.hostname = rec.hostname or None
        if rec.node is not None:
            facts = {k: v for k, v in rec.node.items() if k in NodeFacts.model_fields and v is not None}
            if rec.device is not None:
                facts["device"] = f"{rec.device.kind} {rec.device.name or ''}".strip()
            row.node = NodeFacts.model_validate(facts)


def _measured_backward_per_step(records: list[RankRecord], inp: RunBenchmarkWindowInput) -> int | None:
    """backward() calls per optimizer step, counted by the harness over each measured window (host
    counter read at window edges), when every rank and window agrees on a whole number; else ``None``."""
    if not records or inp.timing == "log" or any(r.timing != "optimizer" for r in records):
        return None
    seen: set[float] = set()
    for r in records:
        for w in r.windows:
            if w.backward_calls is None or w.steps <= 0:
                return None
            seen.add(w.backward_calls / w.steps)
    if len(seen) != 1:
        return None
    value = seen.pop()
    return int(value) if value.is_integer() and value > 0 else None


async def _start_detached(
    inp: RunBenchmarkWindowInput, rt: ToolRuntime, request: CommandRequest
) -> RunBenchmarkWindowOutput:
    """Start the approved launches under a detached supervisor; the record says where to follow them."""
    launches = 1 if inp.same_process else inp.repeats
    record_dir = None if inp.timing == "log" else str(_run_dir(inp, rt) / "records")
    if record_dir is not None:  # refused now when a run of this input holds it; the supervisor then waits
        with one_run(_run_dir(inp, rt), rt):
            pass
    ev = rt.evidence()
    # what ran is captured now, at launch (the code may change while the run goes on)
    provenance = await anyio.to_thread.run_sync(_provenance, inp, rt, ev)
    meta = {"inputs": inp.model_dump(mode="json"), "provenance": provenance.model_dump(mode="json")}
    run_id, _ = await rt.start_detached(request, launches=launches, record_dir=record_dir, meta=meta)
    out = _output(inp, ev, rt, None, [], None, None, None, None, [])
    out.state = EvidenceState.PLANNED
    out.failure_reason = None
    out.run_id = run_id
    out.provenance = provenance
    out.warnings = [
        f"detached run {run_id} started ({launches} launch(es)); nothing is measured yet: follow it with "
        f"benchmark_run(action='wait', run_id='{run_id}'), then benchmark_run(action='result', run_id='{run_id}')"
    ]
    return await rt.commit(ev, out, command=list(request.argv), environment_id=inp.environment_id)


def _measured_samples_per_step(records: list[RankRecord], inp: RunBenchmarkWindowInput) -> int | None:
    """Global samples per optimizer step the ranks' DataLoaders delivered over the measured steps, when
    every rank counted every step and the count is constant; ``None`` otherwise."""
    if not records or inp.timing == "log":
        return None
    start = inp.warmup_steps
    totals: set[int] = set()
    steps = min(r.steps.count for r in records)
    for j in range(start, steps):
        column = [r.steps.samples[j] for r in records]
        if any(v is None for v in column):
            return None
        totals.add(sum(v or 0 for v in column))
    return totals.pop() if len(totals) == 1 else None


def _launch_stream(records: list[RankRecord]) -> str | None:
    """One launch's sample stream: every rank's digest in rank order, or None when a rank has none."""
    import hashlib

    ranks = sorted(records, key=lambda r: r.rank)
    if not ranks or any(r.sample_stream is None for r in ranks):
        return None
    if len(ranks) == 1:
        return ranks[0].sample_stream
    return hashlib.blake2b("|".join(str(r.sample_stream) for r in ranks).encode(), digest_size=16).hexdigest()


def _measured_batch(
    records: list[RankRecord], inp: RunBenchmarkWindowInput, loader: int | None
) -> tuple[int | None, Literal["model_inputs", "data_loader", "unverified"]]:
    """Global samples per optimizer step that reached the model (summed over ranks and micro-batches), when
    every rank counted every measured step alike; else the DataLoader's count; else unverified."""
    if records and inp.timing != "log":
        start = inp.warmup_steps
        steps = min(r.steps.count for r in records)
        columns = [r.steps.model_samples for r in records]
        if all(len(c) >= steps for c in columns) and steps > start:
            totals = {sum(c[j] or 0 for c in columns) for j in range(start, steps)}
            known = all(c[j] is not None for c in columns for j in range(start, steps))
            if known and len(totals) == 1 and (total := totals.pop()) > 0:
                return total, "model_inputs"
    if loader is not None:
        return loader, "data_loader"
    return None, "unverified"


def _provenance(inp: RunBenchmarkWindowInput, rt: ToolRuntime, ev: EvidenceBuilder) -> RunProvenance:
    return run_provenance(inp.command, inp.cwd, inp.env, rt, ev)


def run_provenance(
    command: list[str], cwd_name: str, env: dict[str, str], rt: ToolRuntime, ev: EvidenceBuilder
) -> RunProvenance:
    """A launched run's argv, env change names, code state (git; the dirty diff as the evidence's code.diff)
    and digests of the workspace files argv names: every run perfgate launches records this block."""
    from perfgate.benchmarking.provenance import argv_files, diff_sections, run_code_scope
    from perfgate.envprobe import git_snapshot

    cwd = rt.resolve_path(cwd_name, kind="dir")
    roots, programs = run_code_scope(command, cwd, env, rt.workspace)
    snapshot, reason = git_snapshot(rt.workspace, roots=roots, programs=programs)
    artifact: str | None = None
    if snapshot is not None and snapshot.diff:
        from perfgate.redaction import Scrubber, scrub_bytes

        # stored without the secrets it holds or the run was given (diff_sha256 binds the real bytes)
        scrubbed = scrub_bytes(snapshot.diff, Scrubber.for_values(env, command))
        artifact = rt.relative(ev.write_bytes("code.diff", scrubbed))
    code = CodeState(
        commit=snapshot.commit if snapshot else None,
        dirty=snapshot.dirty if snapshot else None,
        diff_sha256=snapshot.diff_sha256 if snapshot else None,
        diff_files=diff_sections(snapshot.diff) if snapshot else {},
        diff_artifact=artifact,
        unknown_reason=reason,
    )
    return RunProvenance(
        argv=list(command),
        cwd=cwd_name,
        env_changes=sorted(env),
        code=code,
        files=argv_files(command, cwd, rt.workspace),
    )


def measured_environment(record: RankRecord | None) -> dict[str, str | None]:
    """The environment the training process measured (rank 0's record): the window fingerprint."""
    return _fingerprint(record)


def _output(
    inp: RunBenchmarkWindowInput,
    ev: EvidenceBuilder,
    rt: ToolRuntime,
    summary: RunSummary | None,
    windows: list[tuple[int, WindowSummary]],
    world: int | None,
    first: RankRecord | None,
    exit_code: int | None,
    failure: str | None,
    warnings: list[str],
) -> RunBenchmarkWindowOutput:
    device = first.device if first is not None else None
    common: dict[str, Any] = {
        "evidence_id": ev.id,
        "exit_code": exit_code,
        "label": inp.label,
        "timing": inp.timing,
        "world_size": world,
        "device": f"{device.kind} {device.name or ''}".strip() if device else None,
        "step_series_artifact": None,
        "artifacts": [rt.relative(ev.dir / name) for name in ev.artifact_names],
        "contract_problems": [],
        "environment_fingerprint": _fingerprint(first),
        "warnings": warnings,
    }
    if summary is None or failure is not None:
        return RunBenchmarkWindowOutput(
            **common,
            state=EvidenceState.FAILED,
            failure_reason=failure or "no window was measured",
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
    has_device_peak = any(r.peak_allocated_bytes is not None for _, w in windows for r in w.ranks)
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
        throughput=Throughput(
            samples_per_s=summary.samples_per_s,
            tokens_per_s=summary.tokens_per_s,
            steps_per_s=summary.steps_per_s,
            basis="global work over the aligned steps / the longest rank's elapsed time, summed over windows",
        ),
        peak_memory_bytes=summary.peak_memory_bytes,
        peak_memory_kind=None
        if summary.peak_memory_bytes is None
        else ("device_allocated" if has_device_peak else "host_rss"),
        data_wait_fraction=summary.data_wait_fraction,
        slowest_rank=summary.slowest_rank,
        rank_skew=summary.rank_skew,
        ranks=_rank_results([w for _, w in windows]),
        windows=[window_result(launch, w) for launch, w in windows],
    )


def window_result(launch: int, w: WindowSummary) -> WindowResult:
    """One measured window as the tools report it (launched and imported alike)."""
    return WindowResult(
        launch=launch,
        index=w.index,
        median_step_ms=w.stats.median_ms,
        p95_step_ms=w.stats.p95_ms,
        iqr_ratio=w.stats.iqr_ratio,
        noisy=w.stats.noisy,
        steps=w.steps,
        elapsed_s=w.elapsed_s,
        samples_per_s=w.samples_per_s,
        tokens_per_s=w.tokens_per_s,
        steps_per_s=w.steps_per_s,
        slowest_rank=w.slowest_rank,
        rank_skew=w.rank_skew,
    )


def _rank_results(windows: list[WindowSummary]) -> list[RankResult]:
    from perfgate.benchmarking import step_stats

    ranks = sorted({r.rank for w in windows for r in w.ranks})
    out: list[RankResult] = []
    for rank in ranks:
        rows = [r for w in windows for r in w.ranks if r.rank == rank]
        stats = step_stats([v for r in rows for v in r.step_ms])
        elapsed_ms = sum(r.elapsed_ms for r in rows)

        def peak(values: list[int | None]) -> int | None:
            known = [v for v in values if v is not None]
            return max(known) if known else None

        out.append(
            RankResult(
                rank=rank,
                median_step_ms=stats.median_ms,
                p95_step_ms=stats.p95_ms,
                iqr_ratio=stats.iqr_ratio,
                steps_measured=sum(r.steps_measured for r in rows),
                elapsed_s=elapsed_ms / 1e3,
                data_wait_fraction=sum(r.data_wait_ms for r in rows) / elapsed_ms if elapsed_ms else 0.0,
                collective_wait_fraction=sum(r.collective_wait_ms for r in rows) / elapsed_ms
                if elapsed_ms
                else 0.0,
                peak_allocated_bytes=peak([r.peak_allocated_bytes for r in rows]),
                peak_reserved_bytes=peak([r.peak_reserved_bytes for r in rows]),
                host_peak_rss_bytes=peak([r.host_peak_rss_bytes for r in rows]),
                step_time_source=rows[0].step_time_source,
            )
        )
    return out


SPEC = ToolSpec(
    name="run_benchmark_window",
    title="Time steady-state training windows",
    description=(
        "Time steady-state training windows of a command (needs approval): step time, throughput, memory and "
        "noise per rank; repeats>=3 for a decision. Contract keys: skill://perfgate/references/vocabulary.md"
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
