"""What a parity check concludes beyond the per-key figures: the order problems are listed in, the summary
line, and the notes that limit what the check can support."""

from __future__ import annotations

from collections.abc import Sequence

from perfgate.tensors.compare import ComparisonReport, TensorComparison

__all__ = ["check_notes", "problems_first", "summary"]

_SEVERITY = {"value_mismatch": 0, "shape_mismatch": 1, "dtype_mismatch": 2, "match": 3}


def problems_first(tensors: Sequence[TensorComparison]) -> list[int]:
    """Indices of ``tensors``, problems first (value mismatches, then shape, then dtype; within each, the
    worst fraction of mismatched elements first); a stable order otherwise."""
    return sorted(
        range(len(tensors)),
        key=lambda i: (_SEVERITY[tensors[i].status], -(tensors[i].mismatched_fraction or 0.0)),
    )


def summary(report: ComparisonReport) -> str:
    """The report's summary, saying how many names the key mapping changed."""
    mapped = len(report.mapped_keys)
    return report.summary + (f"; {mapped} keys renamed by key_map" if mapped else "")


def check_notes(
    report: ComparisonReport, *, unbound: Sequence[str], allow_nonfinite: bool, beyond_ceiling: Sequence[str]
) -> list[str]:
    """The comparison's notes, then what limits the check as evidence: ``unbound`` files (no launched run
    dumped them), the non-finite opt-in, and the dtypes compared ``beyond_ceiling``."""
    notes = list(report.notes)
    if unbound:
        notes.append(
            f"unbound (no perfgate-launched run dumped these bytes): {', '.join(unbound)}; a keep needs each side "
            "dumped by perfgate.harness.dump_tensors inside the run_benchmark_window launch of its own side"
        )
    if allow_nonfinite:
        notes.append(
            "allow_nonfinite: matching non-finite values were accepted as agreement (explicit opt-in)"
        )
    if beyond_ceiling:
        notes.append(
            f"{', '.join(beyond_ceiling)} compared beyond the equivalence ceiling (see tolerance_by_dtype): this "
            "check cannot carry an equivalent speedup, only a training_change with task-quality evidence"
        )
    return notes
