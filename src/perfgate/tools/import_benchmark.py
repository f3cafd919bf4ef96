"""import_benchmark: window evidence from a training log or a benchmark file that perfgate did not launch.

The evidence is labelled ``provenance: "imported"`` (not launched by perfgate): nothing binds it to an
environment unless ``environment_id`` is attached, and its step times are what the trainer printed.
compare_benchmarks and the keep gates accept it as windows and say it is imported.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Literal

import anyio.to_thread
from pydantic import BaseModel, ConfigDict, Field, model_validator

from perfgate.benchmarking import BenchmarkError, Contract
from perfgate.benchmarking.comparing.results import Throughput, WindowResult, window_result
from perfgate.benchmarking.runs.health import JobHealth, TrainingHealth, health_model, job_health_model
from perfgate.benchmarking.workload.contract import BenchmarkContract
from perfgate.errors import ToolError
from perfgate.evidence import EvidenceState, file_digest
from perfgate.helpers.safeopen import open_file
from perfgate.serving.globs import GlobRefused, expand, has_magic, shown
from perfgate.serving.runtime import EvidenceBuilder, ToolRuntime
from perfgate.serving.spec import ToolSpec

if TYPE_CHECKING:
    from perfgate.benchmarking.windows.imported import ImportRequest

__all__ = ["SPEC", "ImportBenchmarkInput", "ImportBenchmarkOutput", "run"]

ImportFormat = Literal["megatron", "nanogpt", "torchtitan", "regex", "benchmark_json"]
PROVENANCE_NOTE = "imported, not launched by perfgate: step times are what the source recorded"
MAX_FILES = 1024
COPY_LIMIT_BYTES = 8 << 20


class ImportBenchmarkInput(BaseModel):
    model_config = ConfigDict(extra="forbid")

    paths: Annotated[
        list[str],
        Field(
            min_length=1,
            max_length=MAX_FILES,
            description="Log or benchmark files (relative to the workspace); glob patterns allowed. Several log "
            "files are several ranks of one run (rank from 'rank<N>' or the last number in the path, e.g. "
            "torchrun --log-dir .../attempt_0/<rank>/stdout.log); several benchmark files are several runs.",
        ),
    ]
    format: Annotated[
        ImportFormat,
        Field(
            description="'megatron' (iteration lines: mean time per log interval, loss, loss scale, grad norm, "
            "skipped/NaN iterations, world size, memory), 'nanogpt' (iter lines: one iteration's time; eval and "
            "checkpoint iterations excluded), 'torchtitan' (step lines: time from tps), 'regex' (your pattern), "
            "'benchmark_json' (seed benchmark files, schema 1 or 2)."
        ),
    ]
    pattern: Annotated[
        str | None,
        Field(
            description="format='regex': named groups `step` and `step_time_ms` (required), optionally `loss`, "
            "`grad_norm`, `loss_scale`, `skipped`, `nan`; searched per line."
        ),
    ] = None
    interval_mean: Annotated[
        bool,
        Field(
            description="format='regex': a line's time is the mean since the previous matched line (true) or "
            "the time of that one step (false)."
        ),
    ] = True
    warmup_steps: Annotated[
        int,
        Field(
            ge=0,
            description="Steps at the start of the log excluded (skip-first): start-up, compile, warm-up.",
        ),
    ] = 5
    measure_steps: Annotated[
        int | None,
        Field(ge=1, description="Steps per window; default: all usable steps split evenly into `windows`."),
    ] = None
    windows: Annotated[
        int, Field(ge=1, le=50, description="Consecutive windows to cut the usable steps into (logs).")
    ] = 3
    world_size: Annotated[
        int | None,
        Field(
            ge=1,
            description="Ranks of the run, when the log does not say (Megatron and torchtitan logs do; nanoGPT's "
            "do not). Refused when it contradicts the log.",
        ),
    ] = None
    samples_per_step: Annotated[
        int | None, Field(ge=1, description="Global samples per optimizer step, when the log does not say.")
    ] = None
    tokens_per_step: Annotated[
        int | None, Field(ge=1, description="Global tokens per optimizer step, when the log does not say.")
    ] = None
    label: Annotated[str | None, Field(description="Free-form label, e.g. 'baseline'.")] = None
    contract: Annotated[
        BenchmarkContract,
        Field(
            description="Declared invariants and execution settings (benchmark_json files carry their own; "
            "a contract given here must then be empty)."
        ),
    ] = Field(default_factory=BenchmarkContract)
    environment_id: Annotated[
        str | None,
        Field(description="collect_env evidence id of the machine the run happened on, when known."),
    ] = None
    source_note: Annotated[
        str, Field(max_length=2000, description="Where the files come from (job id, cluster, date).")
    ] = ""

    @model_validator(mode="after")
    def _pattern_for_regex(self) -> ImportBenchmarkInput:
        if (self.format == "regex") != (self.pattern is not None):
            raise ValueError("pattern is required with format='regex' and only used with it")
        return self


class SourceFile(BaseModel):
    path: str
    sha256: str
    bytes: int
    rank: int | None = Field(description="Rank this log was read as (logs only).")
    copied: bool = Field(description="Whether the file was copied into the evidence (up to 8 MiB).")


class ImportedOrigin(BaseModel):
    """The provenance block of an imported run: what launched windows record, with what is unknown said so."""

    launched: Literal[False] = False
    label: Literal["imported, not launched by perfgate"] = "imported, not launched by perfgate"
    argv: None = Field(default=None, description="Unknown: perfgate did not launch the run.")
    env_changes: None = Field(default=None, description="Unknown: perfgate did not launch the run.")
    code: None = Field(
        default=None, description="Unknown: the run's code state was not recorded by perfgate."
    )
    measured_environment: None = Field(
        default=None,
        description="Unknown: no harness measured the training process; an attached environment_id is what "
        "the caller says, so imported windows never count as the same measured environment.",
    )
    files: dict[str, str] = Field(description="sha256 of each source file read (path -> digest).")
    unknown: list[str] = Field(
        default=["argv", "env changes", "code state", "measured environment"],
        description="What this evidence cannot tell: never compared as 'same'.",
    )


class ImportedRankResult(BaseModel):
    rank: int
    median_step_ms: float
    p95_step_ms: float
    iqr_ratio: float
    steps_measured: int
    elapsed_s: float
    peak_allocated_bytes: int | None
    peak_reserved_bytes: int | None


class ImportBenchmarkOutput(BaseModel):
    evidence_id: str
    state: EvidenceState
    provenance: Literal["imported"] = Field(description="Imported: perfgate did not launch this run.")
    provenance_note: str
    origin: ImportedOrigin = Field(
        description="The provenance block launched windows carry, for an imported run: the source files' "
        "digests, and argv, env changes, code state and measured environment unknown."
    )
    failure_reason: str | None
    format: ImportFormat
    label: str | None
    sources: list[SourceFile]
    world_size: int | None = Field(
        description="Ranks of the run; null when neither the log nor the call says."
    )
    world_size_source: str | None
    windows_measured: int
    steps_measured: int
    median_step_ms: float | None = Field(description="Median step time of the slowest rank, pooled.")
    p95_step_ms: float | None
    iqr_ratio: float | None
    noisy: bool | None
    throughput: Throughput | None
    peak_memory_bytes: int | None
    peak_memory_kind: Literal["device_allocated", "device_reserved"] | None
    peak_memory_unavailable: str | None = Field(
        default=None,
        description="Why peak memory is null: the log reports none (the keep's gate is unavailable).",
    )
    slowest_rank: int | None
    rank_skew: float | None = Field(
        description="Elapsed time of the slowest rank over the fastest's, minus 1."
    )
    ranks: list[ImportedRankResult]
    windows: list[WindowResult]
    health: TrainingHealth | None = Field(
        description="Loss and iteration health over the measured windows (the loss level and trend a baseline "
        "comparison reads)."
    )
    job_health: JobHealth | None = Field(
        default=None,
        description="Health over every step line of the log (warm-up and after the windows too): what "
        "check_training_health judges.",
    )
    contract: BenchmarkContract = Field(description="The contract this evidence is compared under.")
    contract_problems: list[str]
    environment_fingerprint: dict[str, str | None]
    step_series_artifact: str | None
    artifacts: list[str]
    warnings: list[str]
    profiled: bool = False


# --------------------------------------------------------------------------- files


def _expand(rt: ToolRuntime, raw: list[str]) -> list[Path]:
    found: list[Path] = []
    for item in raw:
        if has_magic(item):
            try:
                matches = expand(item, rt.workspace, (rt.workspace, *rt.config.read_roots), limit=MAX_FILES)
            except GlobRefused as exc:
                raise ToolError(str(exc)) from exc
            if not matches:
                raise ToolError(f"no file matches {shown(item)} (relative to the workspace {rt.workspace})")
            found += [rt.resolve_path(str(m), kind="file") for m in matches if m.is_file()]
        else:
            found.append(rt.resolve_path(item, kind="file"))
        if len(found) > MAX_FILES:
            raise ToolError(f"more than {MAX_FILES} files match: narrow the paths")
    unique = list(dict.fromkeys(found))
    if not unique:
        raise ToolError("no regular file among the paths")
    return unique


def _sources(
    ev: EvidenceBuilder, rt: ToolRuntime, paths: list[Path], ranks: list[int] | None
) -> list[SourceFile]:
    out: list[SourceFile] = []
    for i, p in enumerate(paths):
        digest, size = file_digest(p)
        copied = size <= COPY_LIMIT_BYTES and len(paths) <= 64
        if copied:
            with open_file(p) as source:  # the confined path, no link followed: what was checked is copied
                ev.copy_in(f"source{i}_{re.sub(r'[^A-Za-z0-9._-]', '_', p.name)}", source)
        out.append(
            SourceFile(
                path=rt.relative(p),
                sha256=digest,
                bytes=size,
                rank=None if ranks is None else ranks[i],
                copied=copied,
            )
        )
    return out


# --------------------------------------------------------------------------- the tool


def _request(inp: ImportBenchmarkInput) -> ImportRequest:
    from perfgate.benchmarking.windows.imported import ImportRequest

    return ImportRequest(
        format=inp.format,
        contract=Contract(
            dict(inp.contract.invariants), dict(inp.contract.execution), dict(inp.contract.classes)
        ),
        pattern=inp.pattern,
        interval_mean=inp.interval_mean,
        warmup_steps=inp.warmup_steps,
        measure_steps=inp.measure_steps,
        windows=inp.windows,
        world_size=inp.world_size,
        samples_per_step=inp.samples_per_step,
        tokens_per_step=inp.tokens_per_step,
    )


async def run(inp: ImportBenchmarkInput, rt: ToolRuntime) -> ImportBenchmarkOutput:
    from perfgate.benchmarking.comparing.series import SERIES_NAME, series_document
    from perfgate.benchmarking.windows.importcheck import assess_import
    from perfgate.benchmarking.windows.imported import read_import

    paths = await anyio.to_thread.run_sync(_expand, rt, inp.paths)  # a walk of the workspace: off the loop
    if inp.environment_id is not None:
        env = await rt.load(inp.environment_id)
        if env.tool != "collect_env":
            raise ToolError(f"environment_id {inp.environment_id} is a {env.tool} record, not collect_env")
    try:
        got = await anyio.to_thread.run_sync(read_import, _request(inp), paths)
        found = assess_import(got, environment_known=inp.environment_id is not None)
    except BenchmarkError as exc:
        raise ToolError(str(exc)) from exc

    ev = rt.evidence()
    sources = await anyio.to_thread.run_sync(_sources, ev, rt, paths, got.ranks)
    ev.write_json(SERIES_NAME, series_document([(0, w) for w in got.windows]))
    summary, s = found.summary, found.summary.stats
    health = got.health
    ok = found.failure is None
    out = ImportBenchmarkOutput(
        evidence_id=ev.id,
        state=EvidenceState.EXECUTED if ok else EvidenceState.FAILED,
        provenance="imported",
        provenance_note=PROVENANCE_NOTE + (f" ({inp.source_note})" if inp.source_note else ""),
        origin=ImportedOrigin(files={src.path: src.sha256 for src in sources}),
        failure_reason=found.failure,
        format=inp.format,
        label=inp.label,
        sources=sources,
        world_size=got.world.ranks,
        world_size_source=got.world.source,
        windows_measured=len(got.windows) if ok else 0,
        steps_measured=summary.steps if ok else 0,
        median_step_ms=s.median_ms if ok else None,
        p95_step_ms=s.p95_ms if ok else None,
        iqr_ratio=s.iqr_ratio if ok else None,
        noisy=s.noisy if ok else None,
        throughput=Throughput(
            samples_per_s=summary.samples_per_s,
            tokens_per_s=summary.tokens_per_s,
            steps_per_s=summary.steps_per_s,
            basis="global work per step x steps / the slowest rank's summed logged step times, over windows",
        )
        if ok
        else None,
        peak_memory_bytes=found.peak_memory_bytes,
        peak_memory_kind=found.peak_memory_kind,
        peak_memory_unavailable=None
        if found.peak_memory_bytes is not None
        else "the log reports no memory figure: peak memory was not observed",
        slowest_rank=summary.slowest_rank if ok else None,
        rank_skew=summary.rank_skew if ok else None,
        ranks=[ImportedRankResult.model_validate(dataclasses.asdict(r)) for r in found.ranks] if ok else [],
        windows=[window_result(0, w) for w in got.windows] if ok else [],
        health=None
        if health is None
        else health_model(
            health.summary,
            health.whole_log_nan_iterations,
            health.whole_log_skipped_iterations,
            health.first_step,
            health.last_step,
        ),
        job_health=None
        if health is None or health.job is None
        else job_health_model(health.job, health.job_covers),
        contract=BenchmarkContract(
            invariants=got.contract.invariants,
            execution=got.contract.execution,
            classes={k: v for k, v in got.contract.classes.items() if v in ("semantic", "execution")},  # type: ignore[misc]
        ),
        contract_problems=found.contract_problems,
        environment_fingerprint={},
        step_series_artifact=SERIES_NAME,
        artifacts=[],
        warnings=found.warnings,
    )
    out.artifacts = [rt.relative(ev.dir / name) for name in ev.artifact_names]
    return await rt.commit(ev, out, environment_id=inp.environment_id)


def _brief(out: ImportBenchmarkOutput) -> list[str]:
    lines = [f"imported ({out.format}), not launched by perfgate; world size {out.world_size or 'unknown'}"]
    if out.median_step_ms is not None:
        lines.append(
            f"median step {out.median_step_ms:.4g} ms over {out.steps_measured} steps in {out.windows_measured} "
            f"window(s), slowest rank {out.slowest_rank}"
        )
    job = out.job_health
    if job is not None:
        lines.append(
            f"health over the whole log {job.verdict}" + (f": {job.findings[0]}" if job.findings else "")
        )
    elif out.health is not None:
        lines.append(
            f"health {out.health.verdict}" + (f": {out.health.findings[0]}" if out.health.findings else "")
        )
    return lines


SPEC = ToolSpec(
    name="import_benchmark",
    title="Import windows from an existing log or benchmark file",
    description=(
        "Turn an existing training log or benchmark JSON into window evidence without re-running: step times, "
        "memory, training health. Contract keys: skill://perfgate/references/vocabulary.md"
    ),
    details=(
        "Turn a training log perfgate did not launch (Megatron, nanoGPT, torchtitan, or your regex; one file per "
        "rank allowed) or seed benchmark JSON (schema 1/2) into window evidence labelled 'imported', without "
        "re-running anything: warm-up skipped, steps cut into windows, world size and memory from the log, and "
        "training health over every logged step (non-finite loss/grad norm, NaN and skipped iterations, loss "
        "scale, loss spikes, loss trend). Lines not known whole (a last line without its newline, torn UTF-8, a "
        "cut number) are never read and are named with their line numbers; timestamp, logger and rank "
        "prefixes are recognised for every format. "
        "compare_benchmarks accepts it like run_benchmark_window evidence. Attach environment_id when known. "
        "Contract keys: skill://perfgate/references/vocabulary.md."
    ),
    input_model=ImportBenchmarkInput,
    output_model=ImportBenchmarkOutput,
    run=run,
    read_only=True,
    destructive=False,
    idempotent=True,
    open_world=False,
    brief=_brief,
)
