"""A keep rests only on runs whose end was observed.

A detached ``run_benchmark_window`` records a start record (state ``planned``, its ``run_id``) at once and
its measurements only when ``benchmark_run(action='result')`` collects them, which it refuses while the run
is going on. So the ledger says whether the end of a run was observed: a run whose result is recorded
there ended and was read; one with only its start record may still be running, may have failed, or may
never finish. Citing such a run in a keep claims a completion nobody observed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from perfgate.evidence import EvidenceRecord, Ledger
from perfgate.evidence.access import str_list

__all__ = ["WINDOW_TOOL", "cited_ids", "unfinished_run_problems"]

WINDOW_TOOL = "run_benchmark_window"
_CITING_FIELDS = ("baseline", "candidate", "evidence_id", "baseline_id")
"""Inputs by which a cited record names the windows it is about (comparisons, health checks)."""

Lookup = Callable[[str], EvidenceRecord | None]


def _run_id(record: EvidenceRecord) -> str | None:
    value = record.result.get("run_id")
    return value if isinstance(value, str) and value else None


def cited_ids(ids: Iterable[str], lookup: Lookup) -> list[str]:
    """``ids`` and the records they name in turn (a comparison's windows, a health check's window)."""
    out = list(dict.fromkeys(ids))
    for evidence_id in list(out):
        record = lookup(evidence_id)
        if record is None:
            continue
        for name in _CITING_FIELDS:
            value = record.inputs.get(name)
            named = [value] if isinstance(value, str) else str_list(value)
            out += [i for i in named if i not in out]
    return out


def unfinished_run_problems(ids: Iterable[str], ledger: Ledger, lookup: Lookup) -> list[str]:
    """One sentence per cited detached run whose result the ledger does not hold."""
    starts = [
        (evidence_id, run_id)
        for evidence_id in cited_ids(ids, lookup)
        if (record := lookup(evidence_id)) is not None
        and record.tool == WINDOW_TOOL
        and record.state.value == "planned"
        and (run_id := _run_id(record)) is not None
    ]
    if not starts:
        return []
    collected = {
        run_id: r.id
        for r in ledger.records(tool=WINDOW_TOOL)
        if r.state.value != "planned" and (run_id := _run_id(r)) is not None
    }
    problems: list[str] = []
    for evidence_id, run_id in starts:
        if run_id in collected:
            continue
        problems.append(
            f"{evidence_id} is the start of detached run {run_id}, whose end was not observed: no result of it "
            "is recorded (it may still be running, have failed, or never finish)"
        )
    return problems
