"""Several trace files, one per rank: read them (in parallel when large) and compare the ranks."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path

from perfgate.traces.analyses.steps import rank_skew
from perfgate.traces.analyze import UNHELD, AnalysisOptions
from perfgate.traces.diagnosis.diagnose import diagnose
from perfgate.traces.models import RankProfile, TraceSetReport
from perfgate.traces.pool import analyze_many

__all__ = ["ProgressCallback", "analyze_traces", "combine"]

ProgressCallback = Callable[[int, int, str], None]
_DEFAULTS = AnalysisOptions()


def analyze_traces(
    paths: Sequence[Path],
    options: AnalysisOptions = _DEFAULTS,
    progress: ProgressCallback | None = None,
) -> TraceSetReport:
    """Analyze several trace files (one per rank) and compare the ranks.

    Large sets are read in parallel (a thread and worker processes), one file per reader at a
    time (`perfgate.traces.pool`), so memory holds a few traces' columns at a time plus the small per-rank
    results.

    Raises:
        TraceError: as `analyze_trace`, with the offending file named in the message.
    """
    profiles = analyze_many(paths, options, progress)
    if progress is not None:
        progress(len(paths), len(paths), "done")
    return combine(profiles)


def combine(profiles: Sequence[RankProfile]) -> TraceSetReport:
    """Sort per-rank profiles by rank, compare them (rank skew, duplicate ranks) and diagnose the walls."""
    warnings: list[str] = []
    ranks = Counter(p.rank for p in profiles)
    duplicated = sorted(r for r, c in ranks.items() if c > 1)
    if duplicated:
        warnings.append(
            f"several files claim rank(s) {duplicated}: the rank comparison treats them as separate entries; "
            "pass one trace per rank"
        )
    ordered = sorted(profiles, key=lambda p: p.rank)
    # Ids read as absent change what every rank's launch figures mean: said first, for the whole set.
    unheld = [
        f"rank {p.rank}: {w}" for p in ordered for w in p.warnings if w.startswith("args.") and UNHELD in w
    ]
    warnings[:0] = unheld
    skew = rank_skew(ordered)
    return TraceSetReport(ranks=ordered, rank_skew=skew, warnings=warnings, findings=diagnose(ordered, skew))
