"""Windows and training health from what other tools wrote: parsed logs (one per rank) and benchmark JSON.

Steps are counted from the first logged step ``s0``. A line that reports the mean since the previous
line covers the steps ``(previous, step]`` and is used only when all of them lie past the warm-up; the
first such line is never used (its interval starts before the log). A line that times one step is used
when ``step - s0 >= warmup_steps``. Used steps are cut into ``windows`` consecutive windows.

Health (`perfgate.benchmarking.runs.health`, re-exported here) is read twice with the same rules: from the lines
inside the measured windows (the loss level and trend a baseline comparison reads), and from every line of
the log (what check_training_health judges: a NaN after the last window fails it).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

from perfgate.benchmarking.comparing.aggregate import RankWindow, WindowSummary
from perfgate.benchmarking.comparing.stats import step_stats
from perfgate.benchmarking.errors import BenchmarkError
from perfgate.benchmarking.reading.logformats import LogEntry, ParsedLog
from perfgate.benchmarking.runs.health import HealthSummary, health_from_windows, health_of

__all__ = [
    "BenchmarkJson",
    "HealthSummary",
    "RankSteps",
    "expand_steps",
    "health_from_windows",
    "health_of",
    "read_benchmark_json",
    "windows_from_ranks",
]


@dataclass(frozen=True)
class RankSteps:
    """One rank's used steps: step index -> (time in ms, the line that reported it)."""

    rank: int
    steps: dict[int, tuple[float, LogEntry]]
    peak_allocated_bytes: int | None = None
    peak_reserved_bytes: int | None = None


def expand_steps(parsed: ParsedLog, warmup_steps: int) -> dict[int, tuple[float, LogEntry]]:
    """The steps past the warm-up with their time, in order (see the module docstring).

    Raises:
        BenchmarkError: no line matched, or steps go backwards (a restart or two runs in one file).
    """
    entries = parsed.entries
    if not entries:
        raise BenchmarkError(
            f"no {parsed.format} step line found in {parsed.lines_read} line(s): check the format (or the "
            "pattern) against the log"
        )
    s0 = entries[0].step
    out: dict[int, tuple[float, LogEntry]] = {}
    prev: int | None = None
    for e in entries:
        if prev is not None and e.step <= prev:
            raise BenchmarkError(
                f"log steps go backwards at line {e.line} ({prev} then {e.step}): the file holds a restart or "
                "more than one run; pass only the part (or file) of the run to measure"
            )
        covered_from = prev
        prev = e.step
        if e.excluded is not None or e.step_ms is None or not math.isfinite(e.step_ms):
            continue
        if parsed.mean_since_previous:
            if covered_from is None or covered_from - s0 < warmup_steps:
                continue
            for s in range(covered_from + 1, e.step + 1):
                out[s] = (e.step_ms, e)
        elif e.step - s0 >= warmup_steps:
            out[e.step] = (e.step_ms, e)
    if not out:
        raise BenchmarkError(
            f"the log has {len(entries)} step line(s) but none after the {warmup_steps} warm-up steps "
            f"(steps {entries[0].step}..{entries[-1].step}): lower warmup_steps or import a longer log"
        )
    return out


def _window_steps(reference: Sequence[int], windows: int, measure_steps: int | None) -> list[list[int]]:
    if measure_steps is None:
        per = len(reference) // windows
        if per < 1:
            raise BenchmarkError(
                f"{len(reference)} usable step(s) cannot make {windows} windows: lower windows"
            )
    else:
        per = measure_steps
        if per * windows > len(reference):
            raise BenchmarkError(
                f"the log holds {len(reference)} usable step(s) after warm-up, fewer than {windows} x "
                f"{measure_steps}: lower measure_steps or windows, or import a longer log"
            )
    return [list(reference[k * per : (k + 1) * per]) for k in range(windows)]


def windows_from_ranks(
    ranks: Sequence[RankSteps],
    windows: int,
    measure_steps: int | None,
    samples_per_step: int | None,
    tokens_per_step: int | None,
) -> list[tuple[list[int], WindowSummary]]:
    """Aligned windows over every rank's log: each window's step indices and its summary.

    Elapsed time per rank is the sum of its step times; the slowest rank is the one with the most.
    There is no data-wait or collective-wait split in a log: those are reported as zero in the
    summary and unknown by the tool.

    Raises:
        BenchmarkError: too few steps, or a rank lacks steps the first rank has.
    """
    reference = list(ranks[0].steps)
    cut = _window_steps(reference, windows, measure_steps)
    out: list[tuple[list[int], WindowSummary]] = []
    for k, steps in enumerate(cut):
        rank_windows: list[RankWindow] = []
        for r in ranks:
            missing = [s for s in steps if s not in r.steps]
            if missing:
                raise BenchmarkError(
                    f"rank {r.rank}'s log lacks step(s) {missing[:5]} that rank {ranks[0].rank} logged: give "
                    "every rank's file of the same run (same log interval)"
                )
            ms = [r.steps[s][0] for s in steps]
            elapsed = math.fsum(ms)
            n = len(ms)
            rank_windows.append(
                RankWindow(
                    rank=r.rank,
                    steps_measured=n,
                    step_ms=ms,
                    step_time_source="log",
                    stats=step_stats(ms),
                    elapsed_ms=elapsed,
                    data_wait_ms=0.0,
                    backward_ms=0.0,
                    collective_wait_ms=0.0,
                    busy_ms=elapsed,
                    samples=None if samples_per_step is None else samples_per_step * n,
                    tokens=None if tokens_per_step is None else tokens_per_step * n,
                    peak_allocated_bytes=r.peak_allocated_bytes,
                    peak_reserved_bytes=r.peak_reserved_bytes,
                    host_peak_rss_bytes=None,
                )
            )
        slowest = max(rank_windows, key=lambda w: w.elapsed_ms)
        fastest = min(w.elapsed_ms for w in rank_windows)
        n = len(steps)
        out.append(
            (
                steps,
                WindowSummary(
                    index=k,
                    ranks=rank_windows,
                    slowest_rank=slowest.rank,
                    rank_skew=slowest.elapsed_ms / fastest - 1.0 if fastest > 0 else 0.0,
                    elapsed_s=slowest.elapsed_ms / 1e3,
                    steps=n,
                    samples=None if samples_per_step is None else samples_per_step * n,
                    tokens=None if tokens_per_step is None else tokens_per_step * n,
                    host_step_s=[v / 1e3 for v in slowest.step_ms],
                    samples_per_step=None if samples_per_step is None else [float(samples_per_step)] * n,
                    tokens_per_step=None if tokens_per_step is None else [float(tokens_per_step)] * n,
                ),
            )
        )
    return out


# --------------------------------------------------------------------------- benchmark JSON


@dataclass(frozen=True)
class BenchmarkJson:
    """A benchmark file of schema 1 (``protocol`` + ``measurement``) or 2 (``invariants`` + ``execution``)."""

    schema_version: int
    invariants: dict[str, Any]
    execution: dict[str, Any]
    unit: str
    runs: list[tuple[float, float, int | None]]
    """(seconds, units of work, optimizer steps or None) per run."""


_UNITS = ("samples", "tokens", "steps")


def _mapping(value: Any, where: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise BenchmarkError(f"{where} must be a JSON object")
    return dict(cast(Mapping[str, Any], value))


def _positive(value: Any, where: str) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value <= 0
    ):
        raise BenchmarkError(f"{where} must be a positive finite number, got {value!r}")
    return float(value)


def read_benchmark_json(doc: Any, source: str) -> BenchmarkJson:
    """Validate a benchmark document.

    Accepted: ``schema_version`` 1 with ``protocol`` and ``measurement`` objects (both become invariants:
    schema 1 knows no execution settings), or 2 with ``invariants`` and ``execution``; ``unit`` (top level or
    in ``measurement``): samples, tokens or steps; ``runs``: a list of ``{"seconds": s, "units": n}`` (or
    ``"samples"`` / ``"tokens"`` naming the unit), optionally ``"steps"``.

    Raises:
        BenchmarkError: anything else, with what is wrong.
    """
    if not isinstance(doc, Mapping):
        raise BenchmarkError(f"{source}: a benchmark file is a JSON object")
    d = cast(Mapping[str, Any], doc)
    version = d.get("schema_version", d.get("schema"))
    if version not in (1, 2):
        raise BenchmarkError(f"{source}: schema_version must be 1 or 2, got {version!r}")
    if version == 1:
        protocol = _mapping(d.get("protocol"), f"{source}: protocol")
        measurement = _mapping(d.get("measurement"), f"{source}: measurement")
        if not protocol and not measurement:
            raise BenchmarkError(f"{source}: schema 1 needs its protocol and measurement objects")
        invariants = {**{f"protocol.{k}": v for k, v in protocol.items()}}
        invariants.update({f"measurement.{k}": v for k, v in measurement.items()})
        execution: dict[str, Any] = {}
    else:
        invariants = _mapping(d.get("invariants"), f"{source}: invariants")
        execution = _mapping(d.get("execution"), f"{source}: execution")
        if not invariants:
            raise BenchmarkError(f"{source}: schema 2 needs a non-empty invariants object")
        measurement = _mapping(d.get("measurement"), f"{source}: measurement")
    unit = d.get("unit", measurement.get("unit"))
    runs_raw = d.get("runs")
    if not isinstance(runs_raw, list) or not runs_raw:
        raise BenchmarkError(f"{source}: runs must be a non-empty list of {{seconds, units}} objects")
    runs: list[tuple[float, float, int | None]] = []
    for i, raw in enumerate(cast(list[Any], runs_raw)):
        run = _mapping(raw, f"{source}: runs[{i}]")
        named = [u for u in ("samples", "tokens") if u in run]
        if "units" in run:
            work = run["units"]
        elif len(named) == 1:
            work = run[named[0]]
            if unit is None:
                unit = named[0]
            elif unit != named[0]:
                raise BenchmarkError(f"{source}: runs[{i}] gives {named[0]} but the unit is {unit!r}")
        else:
            raise BenchmarkError(f"{source}: runs[{i}] needs 'units' (or exactly one of samples/tokens)")
        steps = run.get("steps")
        if steps is not None and (isinstance(steps, bool) or not isinstance(steps, int) or steps < 1):
            raise BenchmarkError(f"{source}: runs[{i}].steps must be a positive integer")
        runs.append(
            (
                _positive(run.get("seconds"), f"{source}: runs[{i}].seconds"),
                _positive(work, f"{source}: runs[{i}] work"),
                steps,
            )
        )
    if unit not in _UNITS:
        raise BenchmarkError(f"{source}: unit must be one of {list(_UNITS)}, got {unit!r}")
    return BenchmarkJson(int(version), invariants, execution, str(unit), runs)
