"""import_benchmark: window evidence from a training log or a benchmark file that perfgate did not launch.

The evidence is labelled ``provenance: "imported"`` (not launched by perfgate): nothing binds it to an
environment unless ``environment_id`` is attached, and its step times are what the trainer printed.
compare_benchmarks and the keep gates accept it as windows and say it is imported.
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

import anyio.to_thread
from pydantic import BaseModel, ConfigDict, Field, model_validator

from perfgate._loglines import capped_lines
from perfgate._safeopen import open_file
from perfgate.benchmarking import BenchmarkError, Contract, check_contract
from perfgate.benchmarking.contract import BenchmarkContract, check_observed
from perfgate.benchmarking.logformats import FORMATS, LogFormat, compile_user_pattern, parse_log
from perfgate.benchmarking.results import Throughput, WindowResult, window_result
from perfgate.errors import ToolError
from perfgate.evidence import EvidenceState, file_digest
from perfgate.tools._glob import GlobRefused, expand, has_magic, shown
from perfgate.tools._health import TrainingHealth, health_model
from perfgate.tools._runtime import EvidenceBuilder, ToolRuntime
from perfgate.tools._spec import ToolSpec

if TYPE_CHECKING:
    from perfgate.benchmarking.aggregate import WindowSummary
    from perfgate.benchmarking.importing import RankSteps

__all__ = ["SPEC", "ImportBenchmarkInput", "ImportBenchmarkOutput", "run"]

ImportFormat = Literal["megatron", "nanogpt", "torchtitan", "regex", "benchmark_json"]
PROVENANCE_NOTE = "imported, not launched by perfgate: step times are what the source recorded"
MAX_FILES = 1024
COPY_LIMIT_BYTES = 8 << 20
_RANK_IN_NAME = re.compile(r"rank[_-]?(\d+)", re.IGNORECASE)
_NUMBER = re.compile(r"(\d+)")


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
    slowest_rank: int | None
    rank_skew: float | None = Field(
        description="Elapsed time of the slowest rank over the fastest's, minus 1."
    )
    ranks: list[ImportedRankResult]
    windows: list[WindowResult]
    health: TrainingHealth | None = Field(description="Loss and iteration health read from the log.")
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


def _ranks(paths: list[Path]) -> list[int]:
    if len(paths) == 1:
        return [0]
    ranks: list[int | None] = []
    for p in paths:
        m = _RANK_IN_NAME.search(str(p))
        if m is None:
            numbers = _NUMBER.findall(str(p))
            ranks.append(int(numbers[-1]) if numbers else None)
        else:
            ranks.append(int(m.group(1)))
    if None in ranks or len(set(ranks)) != len(ranks):
        return list(range(len(paths)))
    return [r for r in ranks if r is not None]


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


# --------------------------------------------------------------------------- reading


@dataclasses.dataclass
class _Read:
    windows: list[WindowSummary]
    world: int | None
    world_source: str | None
    samples_per_step: int | None
    tokens_per_step: int | None
    health: TrainingHealth | None
    contract: Contract
    warnings: list[str]
    ranks: list[int] | None


def _read_logs(inp: ImportBenchmarkInput, paths: list[Path]) -> _Read:
    from perfgate.benchmarking.importing import RankSteps, expand_steps, health_of, windows_from_ranks

    fmt: LogFormat = inp.format  # type: ignore[assignment]  # benchmark_json is handled elsewhere
    assert fmt in FORMATS
    pattern = compile_user_pattern(inp.pattern) if inp.pattern is not None else None
    ranks = _ranks(paths)
    warnings: list[str] = []
    parsed_by_rank: list[tuple[int, Any]] = []
    for rank, path in sorted(zip(ranks, paths, strict=True)):
        with path.open(encoding="utf-8", errors="replace") as fh:
            parsed = parse_log(
                capped_lines(fh),
                fmt,
                pattern=pattern,
                mean_since_previous=inp.interval_mean,
                tokens_per_step=inp.tokens_per_step,
                world_size=inp.world_size,
            )
        warnings += [f"rank {rank}: {n}" for n in parsed.notes]
        parsed_by_rank.append((rank, parsed))

    # world size: the log's statement, the caller's value, or the number of per-rank files
    stated = {p.world_size for _, p in parsed_by_rank if p.world_size is not None}
    if len(stated) > 1:
        raise BenchmarkError(f"the logs state different world sizes {sorted(stated)}: are they from one run?")
    world: int | None = stated.pop() if stated else None
    source = next((p.world_size_evidence for _, p in parsed_by_rank if p.world_size_evidence), None)
    if world is not None and inp.world_size is not None and inp.world_size != world:
        raise BenchmarkError(
            f"world_size {inp.world_size} contradicts the log ({source}); drop world_size or import the right log"
        )
    if world is None and inp.world_size is not None:
        world, source = inp.world_size, "given by the caller"
    if world is None and len(paths) > 1:
        world, source = len(paths), f"{len(paths)} per-rank log files"
    declared = inp.contract.execution.get("world_size")
    if world is None and isinstance(declared, int) and not isinstance(declared, bool) and declared >= 1:
        # the contract's word, not an observation: the source says so
        world, source = declared, "declared in the contract (execution.world_size); the log does not say"
    if world is not None and len(paths) > 1 and len(paths) > world:
        raise BenchmarkError(f"{len(paths)} per-rank files but the world size is {world}")
    if world is None:
        warnings.append(
            "the world size is unknown (the log does not say): pass world_size or declare execution.world_size"
        )

    def first(attr: str) -> int | None:
        return next((getattr(p, attr) for _, p in parsed_by_rank if getattr(p, attr) is not None), None)

    samples = inp.samples_per_step or first("global_batch")
    tokens = inp.tokens_per_step or first("tokens_per_step")
    # ranks that print no step lines (Megatron logs iterations on the last rank only) give memory only
    timed = [(rank, p) for rank, p in parsed_by_rank if p.entries] or parsed_by_rank[:1]
    silent = [rank for rank, p in parsed_by_rank if not p.entries]
    if silent and len(timed) < len(parsed_by_rank):
        warnings.append(f"rank(s) {silent[:10]} log no step lines: their memory is read, not their timing")
    mem_alloc = max((p.peak_allocated_bytes or 0 for _, p in parsed_by_rank), default=0) or None
    mem_reserved = max((p.peak_reserved_bytes or 0 for _, p in parsed_by_rank), default=0) or None
    rank_steps: list[RankSteps] = []
    for rank, parsed in timed:
        steps = expand_steps(parsed, inp.warmup_steps)
        alloc = parsed.peak_allocated_bytes if len(timed) > 1 else mem_alloc
        reserved = parsed.peak_reserved_bytes if len(timed) > 1 else mem_reserved
        rank_steps.append(RankSteps(rank, steps, alloc, reserved))
    parsed_by_rank = timed
    # the rank whose log shows losses carries the health (Megatron prints on the last rank)
    health_rank = next(
        (i for i, (_, p) in enumerate(parsed_by_rank) if any(e.loss is not None for e in p.entries)), 0
    )
    # the window is cut on that rank's steps so a rank that logs every line leads
    order = [rank_steps[health_rank]] + [r for i, r in enumerate(rank_steps) if i != health_rank]
    cut = windows_from_ranks(order, inp.windows, inp.measure_steps, samples, tokens)
    summaries = [w for _, w in cut]
    parsed_ref = parsed_by_rank[health_rank][1]
    used_steps = {s for steps, _ in cut for s in steps}
    window_entries = [e for e in parsed_ref.entries if e.step in used_steps]
    h = health_of(window_entries)
    health = health_model(
        h,
        sum(e.nan for e in parsed_ref.entries),
        sum(e.skipped for e in parsed_ref.entries),
        min(used_steps),
        max(used_steps),
    )
    if len(paths) > 1 and len(paths) < (world or 0):
        warnings.append(f"logs of {len(paths)} of {world} ranks: the slowest rank is among those only")
    return _Read(summaries, world, source, samples, tokens, health, _contract(inp), warnings, ranks)


def _contract(inp: ImportBenchmarkInput) -> Contract:
    return Contract(dict(inp.contract.invariants), dict(inp.contract.execution), dict(inp.contract.classes))


def _read_json(inp: ImportBenchmarkInput, paths: list[Path]) -> _Read:
    from perfgate.benchmarking.aggregate import windows_from_series
    from perfgate.benchmarking.importing import BenchmarkJson, read_benchmark_json

    if inp.contract.invariants or inp.contract.execution:
        raise BenchmarkError("benchmark_json files carry their own contract: leave contract empty")
    docs: list[BenchmarkJson] = []
    for p in paths:
        try:
            raw = json.loads(p.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            raise BenchmarkError(f"{p.name} is not readable JSON: {exc}") from exc
        docs.append(read_benchmark_json(raw, p.name))
    first = docs[0]
    for d in docs[1:]:
        if (d.invariants, d.execution, d.unit) != (first.invariants, first.execution, first.unit):
            raise BenchmarkError(
                "the benchmark files differ in contract or unit: import each side (baseline, candidate) separately"
            )
    windows: list[WindowSummary] = []
    warnings = ["benchmark files give run totals only: step statistics are per-run means, not step series"]
    for d in docs:
        for seconds, units, steps in d.runs:
            n = steps or 1
            w = windows_from_series([seconds * 1e3 / n] * n, index=len(windows))
            per = units / n
            if d.unit == "samples":
                w = dataclasses.replace(w, samples=round(units), samples_per_step=[per] * n)
            elif d.unit == "tokens":
                w = dataclasses.replace(w, tokens=round(units), tokens_per_step=[per] * n)
            windows.append(w)
    contract = Contract(first.invariants, first.execution)
    world = contract.execution.get("world_size")
    world_ok = isinstance(world, int) and not isinstance(world, bool) and world >= 1
    if inp.world_size is not None and world_ok and world != inp.world_size:
        raise BenchmarkError(
            f"world_size {inp.world_size} contradicts the file's execution.world_size {world}"
        )
    if not world_ok:
        world = inp.world_size
    return _Read(
        windows,
        world if isinstance(world, int) else None,
        "the file's execution.world_size" if world_ok else ("given by the caller" if world else None),
        None,
        None,
        None,
        contract,
        warnings,
        None,
    )


# --------------------------------------------------------------------------- the tool


async def run(inp: ImportBenchmarkInput, rt: ToolRuntime) -> ImportBenchmarkOutput:
    from perfgate.benchmarking import summarize_run
    from perfgate.benchmarking.series import SERIES_NAME, series_document

    paths = await anyio.to_thread.run_sync(_expand, rt, inp.paths)  # a walk of the workspace: off the loop
    if inp.environment_id is not None:
        env = await rt.load(inp.environment_id)
        if env.tool != "collect_env":
            raise ToolError(f"environment_id {inp.environment_id} is a {env.tool} record, not collect_env")
    try:
        problems = check_contract(_contract(inp))
        if problems:
            raise BenchmarkError("the contract is inconsistent: " + "; ".join(problems))
        reader = _read_json if inp.format == "benchmark_json" else _read_logs
        got = await anyio.to_thread.run_sync(reader, inp, paths)
        summary = summarize_run(got.windows)
    except BenchmarkError as exc:
        raise ToolError(str(exc)) from exc

    ev = rt.evidence()
    sources = await anyio.to_thread.run_sync(_sources, ev, rt, paths, got.ranks)
    ev.write_json(SERIES_NAME, series_document([(0, w) for w in got.windows]))
    warnings = list(got.warnings)
    contract_problems: list[str] = []
    failure: str | None = None
    if got.world is not None:
        per_step = {w.samples // w.steps for w in got.windows if w.samples is not None}
        contract_problems = check_observed(
            got.contract, got.world, per_step.pop() if len(per_step) == 1 else None
        )
    for problem in contract_problems:
        if "world_size" in problem:
            failure = f"the log contradicts the contract: {problem}"
        else:
            warnings.append(problem)
    if summary.stats.noisy:
        warnings.append(f"noisy windows (IQR/median {summary.stats.iqr_ratio:.2f} >= 0.10)")
    if inp.environment_id is None:
        warnings.append("no environment_id: this evidence is bound to no collected environment")
    if got.health is not None and got.health.verdict == "unhealthy":
        warnings.append("training health: " + "; ".join(got.health.findings[:3]))
    s = summary.stats
    allocated = [r.peak_allocated_bytes for w in got.windows for r in w.ranks if r.peak_allocated_bytes]
    reserved = [r.peak_reserved_bytes for w in got.windows for r in w.ranks if r.peak_reserved_bytes]
    peak, kind = (
        (max(allocated), "device_allocated")
        if allocated
        else ((max(reserved), "device_reserved") if reserved else (None, None))
    )
    ok = failure is None
    out = ImportBenchmarkOutput(
        evidence_id=ev.id,
        state=EvidenceState.EXECUTED if ok else EvidenceState.FAILED,
        provenance="imported",
        provenance_note=PROVENANCE_NOTE + (f" ({inp.source_note})" if inp.source_note else ""),
        origin=ImportedOrigin(files={src.path: src.sha256 for src in sources}),
        failure_reason=failure,
        format=inp.format,
        label=inp.label,
        sources=sources,
        world_size=got.world,
        world_size_source=got.world_source,
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
        peak_memory_bytes=peak,
        peak_memory_kind=kind,  # type: ignore[arg-type]  # one of the two literals or None
        slowest_rank=summary.slowest_rank if ok else None,
        rank_skew=summary.rank_skew if ok else None,
        ranks=_rank_results(got.windows) if ok else [],
        windows=[window_result(0, w) for w in got.windows] if ok else [],
        health=got.health,
        contract=BenchmarkContract(
            invariants=got.contract.invariants,
            execution=got.contract.execution,
            classes={k: v for k, v in got.contract.classes.items() if v in ("semantic", "execution")},  # type: ignore[misc]
        ),
        contract_problems=contract_problems,
        environment_fingerprint={},
        step_series_artifact=SERIES_NAME,
        artifacts=[],
        warnings=warnings,
    )
    out.artifacts = [rt.relative(ev.dir / name) for name in ev.artifact_names]
    return await rt.commit(ev, out, environment_id=inp.environment_id)


def _rank_results(windows: list[WindowSummary]) -> list[ImportedRankResult]:
    from perfgate.benchmarking import step_stats

    out: list[ImportedRankResult] = []
    for rank in sorted({r.rank for w in windows for r in w.ranks}):
        rows = [r for w in windows for r in w.ranks if r.rank == rank]
        stats = step_stats([v for r in rows for v in r.step_ms])
        out.append(
            ImportedRankResult(
                rank=rank,
                median_step_ms=stats.median_ms,
                p95_step_ms=stats.p95_ms,
                iqr_ratio=stats.iqr_ratio,
                steps_measured=sum(r.steps_measured for r in rows),
                elapsed_s=sum(r.elapsed_ms for r in rows) / 1e3,
                peak_allocated_bytes=rows[0].peak_allocated_bytes,
                peak_reserved_bytes=rows[0].peak_reserved_bytes,
            )
        )
    return out


def _brief(out: ImportBenchmarkOutput) -> list[str]:
    lines = [f"imported ({out.format}), not launched by perfgate; world size {out.world_size or 'unknown'}"]
    if out.median_step_ms is not None:
        lines.append(
            f"median step {out.median_step_ms:.4g} ms over {out.steps_measured} steps in {out.windows_measured} "
            f"window(s), slowest rank {out.slowest_rank}"
        )
    if out.health is not None:
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
        "training health (non-finite loss/grad norm, NaN and skipped iterations, loss scale, loss trend). "
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
