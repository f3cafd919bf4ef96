"""A run perfgate did not launch, read from its files: per-rank training logs or benchmark JSON become
windows, a world size that says where it came from, the work per step, and the log's training health (over
the measured windows, and over every line of the log). Lines not known whole are never read, and said."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from perfgate.benchmarking.comparing.aggregate import WindowSummary, windows_from_series
from perfgate.benchmarking.errors import BenchmarkError
from perfgate.benchmarking.reading.logformats import (
    FORMATS,
    MEGATRON_INITIAL_LOSS_SCALE,
    ParsedLog,
    compile_user_pattern,
    parse_log,
)
from perfgate.benchmarking.reading.loglines import read_log_lines
from perfgate.benchmarking.windows.importing import (
    BenchmarkJson,
    HealthSummary,
    RankSteps,
    expand_steps,
    health_of,
    read_benchmark_json,
    windows_from_ranks,
)
from perfgate.benchmarking.workload.contract import Contract, check_contract
from perfgate.helpers.deadline import past_memory_budget

__all__ = [
    "BENCHMARK_JSON",
    "ImportRequest",
    "ImportedRun",
    "LogHealth",
    "WorldSize",
    "ranks_from_paths",
    "read_benchmark_files",
    "read_import",
    "read_logs",
    "unread_lines",
    "world_size_of_logs",
]

BENCHMARK_JSON = "benchmark_json"
_RANK_IN_NAME = re.compile(r"rank[_-]?(\d+)", re.IGNORECASE)
_NUMBER = re.compile(r"(\d+)")
_JSON_HELD_PER_BYTE = 16
"""Server memory per byte of a benchmark JSON file read whole (its text and the parsed objects)."""


@dataclass(frozen=True)
class ImportRequest:
    """How to read the files: a log format (or ``benchmark_json``) and what the caller adds to them."""

    format: str
    contract: Contract
    pattern: str | None = None
    interval_mean: bool = True
    warmup_steps: int = 5
    measure_steps: int | None = None
    windows: int = 3
    world_size: int | None = None
    samples_per_step: int | None = None
    tokens_per_step: int | None = None


@dataclass(frozen=True)
class LogHealth:
    """Training health over the measured steps, with whole-log NaN and skipped counts, and over every line of
    the log (``job``: what check_training_health judges)."""

    summary: HealthSummary
    whole_log_nan_iterations: int
    whole_log_skipped_iterations: int
    first_step: int
    last_step: int
    job: HealthSummary | None = None
    job_covers: str = ""


@dataclass(frozen=True)
class WorldSize:
    ranks: int | None
    source: str | None
    """Where ``ranks`` came from (the log line, the caller, the file count, the contract); None: unknown."""


@dataclass
class ImportedRun:
    windows: list[WindowSummary]
    world: WorldSize
    samples_per_step: int | None
    tokens_per_step: int | None
    health: LogHealth | None
    contract: Contract
    warnings: list[str]
    ranks: list[int] | None
    """The rank each file was read as (logs only), in the order the files were given."""


def read_import(request: ImportRequest, paths: list[Path]) -> ImportedRun:
    """Check the request's contract, then read ``paths`` as its format says.

    Raises:
        BenchmarkError: the contract is inconsistent, or the files cannot make windows (the message says why).
    """
    problems = check_contract(request.contract)
    if problems:
        raise BenchmarkError("the contract is inconsistent: " + "; ".join(problems))
    if request.format == BENCHMARK_JSON:
        return read_benchmark_files(request, paths)
    return read_logs(request, paths)


def ranks_from_paths(paths: Sequence[Path]) -> list[int]:
    """The rank of each log file: 'rank<N>' in its path, else the last number in it; when any path has
    neither or two paths give the same rank, the files' order."""
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


_UNREAD_SHOWN = 3


def unread_lines(rank: int, name: str, parsed: ParsedLog) -> str:
    """One warning for the lines of a log that were not read because they are not known whole."""
    shown = "; ".join(f"line {no}: {why}" for no, why in parsed.refused[:_UNREAD_SHOWN])
    more = len(parsed.refused) - _UNREAD_SHOWN
    steps = f", {parsed.refused_steps} of them step lines" if parsed.refused_steps else ""
    return f"rank {rank} ({name}): {len(parsed.refused)} line(s) not read{steps}: {shown}" + (
        f" (+{more} more)" if more > 0 else ""
    )


def world_size_of_logs(
    parsed: Sequence[ParsedLog], files: int, given: int | None, contract: Contract
) -> tuple[WorldSize, list[str]]:
    """The world size of a run read from ``files`` logs: the logs' statement, else the caller's ``given``,
    else the number of per-rank files, else the contract's declaration; with a warning when unknown.

    Raises:
        BenchmarkError: the logs disagree, ``given`` contradicts them, or there are more files than ranks.
    """
    stated = {p.world_size for p in parsed if p.world_size is not None}
    if len(stated) > 1:
        raise BenchmarkError(f"the logs state different world sizes {sorted(stated)}: are they from one run?")
    world: int | None = stated.pop() if stated else None
    source = next((p.world_size_evidence for p in parsed if p.world_size_evidence), None)
    if world is not None and given is not None and given != world:
        raise BenchmarkError(
            f"world_size {given} contradicts the log ({source}); drop world_size or import the right log"
        )
    if world is None and given is not None:
        world, source = given, "given by the caller"
    if world is None and files > 1:
        world, source = files, f"{files} per-rank log files"
    declared = contract.execution.get("world_size")
    if world is None and isinstance(declared, int) and not isinstance(declared, bool) and declared >= 1:
        # the contract's word, not an observation: the source says so
        world, source = declared, "declared in the contract (execution.world_size); the log does not say"
    if world is not None and files > 1 and files > world:
        raise BenchmarkError(f"{files} per-rank files but the world size is {world}")
    warnings: list[str] = []
    if world is None:
        warnings.append(
            "the world size is unknown (the log does not say): pass world_size or declare execution.world_size"
        )
    return WorldSize(world, source), warnings


def read_logs(request: ImportRequest, paths: list[Path]) -> ImportedRun:
    """Windows cut from per-rank training logs (one file per rank), past the warm-up.

    Raises:
        BenchmarkError: see `world_size_of_logs`, `expand_steps` and `windows_from_ranks`.
    """
    fmt = request.format
    assert fmt in FORMATS, fmt
    pattern = compile_user_pattern(request.pattern) if request.pattern is not None else None
    ranks = ranks_from_paths(paths)
    warnings: list[str] = []
    parsed_by_rank: list[tuple[int, ParsedLog]] = []
    for rank, path in sorted(zip(ranks, paths, strict=True)):
        with path.open("rb") as fh:
            parsed = parse_log(
                read_log_lines(fh),
                fmt,
                pattern=pattern,
                mean_since_previous=request.interval_mean,
                tokens_per_step=request.tokens_per_step,
                world_size=request.world_size,
            )
        warnings += [f"rank {rank}: {n}" for n in parsed.notes]
        if parsed.refused:
            warnings.insert(0, unread_lines(rank, path.name, parsed))
        parsed_by_rank.append((rank, parsed))
    world, unknown = world_size_of_logs(
        [p for _, p in parsed_by_rank], len(paths), request.world_size, request.contract
    )
    warnings += unknown

    def first(attr: str) -> int | None:
        return next((getattr(p, attr) for _, p in parsed_by_rank if getattr(p, attr) is not None), None)

    samples = request.samples_per_step or first("global_batch")
    tokens = request.tokens_per_step or first("tokens_per_step")
    # ranks that print no step lines (Megatron logs iterations on the last rank only) give memory only
    timed = [(rank, p) for rank, p in parsed_by_rank if p.entries] or parsed_by_rank[:1]
    silent = [rank for rank, p in parsed_by_rank if not p.entries]
    if silent and len(timed) < len(parsed_by_rank):
        warnings.append(f"rank(s) {silent[:10]} log no step lines: their memory is read, not their timing")
    mem_alloc = max((p.peak_allocated_bytes or 0 for _, p in parsed_by_rank), default=0) or None
    mem_reserved = max((p.peak_reserved_bytes or 0 for _, p in parsed_by_rank), default=0) or None
    rank_steps: list[RankSteps] = []
    for rank, parsed in timed:
        steps = expand_steps(parsed, request.warmup_steps)
        alloc = parsed.peak_allocated_bytes if len(timed) > 1 else mem_alloc
        reserved = parsed.peak_reserved_bytes if len(timed) > 1 else mem_reserved
        rank_steps.append(RankSteps(rank, steps, alloc, reserved))
    # the rank whose log shows losses carries the health (Megatron prints on the last rank)
    health_rank = next((i for i, (_, p) in enumerate(timed) if any(e.loss is not None for e in p.entries)), 0)
    # the window is cut on that rank's steps so a rank that logs every line leads
    order = [rank_steps[health_rank]] + [r for i, r in enumerate(rank_steps) if i != health_rank]
    cut = windows_from_ranks(order, request.windows, request.measure_steps, samples, tokens)
    health_rank_no, parsed_ref = timed[health_rank]
    used_steps = {s for steps, _ in cut for s in steps}
    initial_scale = parsed_ref.initial_loss_scale
    if initial_scale is None and parsed_ref.format == "megatron":
        initial_scale = MEGATRON_INITIAL_LOSS_SCALE
    job = health_of(parsed_ref.entries, initial_scale)
    job.unread_step_lines = parsed_ref.refused_steps
    first_used, last_used = min(used_steps), max(used_steps)
    measured = [e for e in parsed_ref.entries if e.step in used_steps]
    before = [e.loss_scale for e in parsed_ref.entries if e.step < first_used and e.loss_scale is not None]
    health = LogHealth(
        health_of(measured, before[-1] if before else initial_scale),
        sum(e.nan for e in parsed_ref.entries),
        sum(e.skipped for e in parsed_ref.entries),
        first_used,
        last_used,
        job,
        f"every step line of rank {health_rank_no}'s log ({len(parsed_ref.entries)} lines, warm-up and steps "
        "after the windows included)",
    )
    if len(paths) > 1 and len(paths) < (world.ranks or 0):
        warnings.append(f"logs of {len(paths)} of {world.ranks} ranks: the slowest rank is among those only")
    return ImportedRun([w for _, w in cut], world, samples, tokens, health, request.contract, warnings, ranks)


def read_benchmark_files(request: ImportRequest, paths: list[Path]) -> ImportedRun:
    """One window per run recorded in benchmark JSON files (schema 1 or 2), each step at the run's mean.

    Raises:
        BenchmarkError: a contract was given (the files carry their own), a file is not a benchmark file,
            the files disagree in contract or unit, or ``world_size`` contradicts them.
    """
    if request.contract.invariants or request.contract.execution:
        raise BenchmarkError("benchmark_json files carry their own contract: leave contract empty")
    docs: list[BenchmarkJson] = []
    for p in paths:
        with contextlib.suppress(OSError):  # an unreadable file is named below
            if why := past_memory_budget(p.stat().st_size, _JSON_HELD_PER_BYTE, p.name):
                raise BenchmarkError(why)
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
    world: Any = contract.execution.get("world_size")
    world_ok = isinstance(world, int) and not isinstance(world, bool) and world >= 1
    if request.world_size is not None and world_ok and world != request.world_size:
        raise BenchmarkError(
            f"world_size {request.world_size} contradicts the file's execution.world_size {world}"
        )
    if not world_ok:
        world = request.world_size
    source = "the file's execution.world_size" if world_ok else ("given by the caller" if world else None)
    return ImportedRun(
        windows,
        WorldSize(world if isinstance(world, int) else None, source),
        None,
        None,
        None,
        contract,
        warnings,
        None,
    )
