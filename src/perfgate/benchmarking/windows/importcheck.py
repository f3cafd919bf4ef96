"""What an imported run shows: its pooled summary, where it contradicts its contract (a world-size
contradiction fails it), the warnings it carries, its peak memory and each rank's figures."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from perfgate.benchmarking.comparing.aggregate import RunSummary, WindowSummary, summarize_run
from perfgate.benchmarking.comparing.stats import NOISY_IQR_RATIO, step_stats
from perfgate.benchmarking.windows.imported import ImportedRun
from perfgate.benchmarking.workload.contract import check_observed

__all__ = ["ImportAssessment", "RankFigures", "assess_import", "peak_memory", "rank_figures"]

PeakKind = Literal["device_allocated", "device_reserved"]


@dataclass(frozen=True)
class RankFigures:
    """One rank over every window. Times in milliseconds (elapsed in seconds), memory in bytes."""

    rank: int
    median_step_ms: float
    p95_step_ms: float
    iqr_ratio: float
    steps_measured: int
    elapsed_s: float
    peak_allocated_bytes: int | None
    peak_reserved_bytes: int | None


@dataclass(frozen=True)
class ImportAssessment:
    summary: RunSummary
    contract_problems: list[str]
    failure: str | None
    """Why the evidence fails (the log contradicts the contract's world size); None: it stands."""
    warnings: list[str]
    peak_memory_bytes: int | None
    peak_memory_kind: PeakKind | None
    ranks: list[RankFigures]


def peak_memory(windows: Sequence[WindowSummary]) -> tuple[int | None, PeakKind | None]:
    """The largest allocated device memory any rank logged, else the largest reserved; (None, None) when
    the logs show neither."""
    allocated = [r.peak_allocated_bytes for w in windows for r in w.ranks if r.peak_allocated_bytes]
    if allocated:
        return max(allocated), "device_allocated"
    reserved = [r.peak_reserved_bytes for w in windows for r in w.ranks if r.peak_reserved_bytes]
    if reserved:
        return max(reserved), "device_reserved"
    return None, None


def rank_figures(windows: Sequence[WindowSummary]) -> list[RankFigures]:
    """Each rank's step statistics pooled over ``windows``, by rank."""
    out: list[RankFigures] = []
    for rank in sorted({r.rank for w in windows for r in w.ranks}):
        rows = [r for w in windows for r in w.ranks if r.rank == rank]
        stats = step_stats([v for r in rows for v in r.step_ms])
        out.append(
            RankFigures(
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


def assess_import(run: ImportedRun, *, environment_known: bool) -> ImportAssessment:
    """Judge an imported run against its contract and say what limits it as evidence.

    Raises:
        BenchmarkError: no window was measured.
    """
    summary = summarize_run(run.windows)
    warnings = list(run.warnings)
    contract_problems: list[str] = []
    failure: str | None = None
    if run.world.ranks is not None:
        per_step = {w.samples // w.steps for w in run.windows if w.samples is not None}
        contract_problems = check_observed(
            run.contract, run.world.ranks, per_step.pop() if len(per_step) == 1 else None
        )
    for problem in contract_problems:
        if "world_size" in problem:
            failure = f"the log contradicts the contract: {problem}"
        else:
            warnings.append(problem)
    if summary.stats.noisy:
        warnings.append(f"noisy windows (IQR/median {summary.stats.iqr_ratio:.2f} >= {NOISY_IQR_RATIO:.2f})")
    if not environment_known:
        warnings.append("no environment_id: this evidence is bound to no collected environment")
    job = run.health.job if run.health is not None else None
    if job is not None and job.job_verdict == "unhealthy":
        warnings.append("training health (whole log): " + "; ".join(job.findings[:3]))
    peak, kind = peak_memory(run.windows)
    return ImportAssessment(
        summary=summary,
        contract_problems=contract_problems,
        failure=failure,
        warnings=warnings,
        peak_memory_bytes=peak,
        peak_memory_kind=kind,
        ranks=rank_figures(run.windows),
    )
