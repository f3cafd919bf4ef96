"""The compared windows themselves: executed and unprofiled, enough separate launches per side, and every
window declaring the same required invariants."""

from __future__ import annotations

from typing import Any

from perfgate.decisions.gates.base import Keep, verdict
from perfgate.decisions.verdict import OK_STATES, Check
from perfgate.evidence import EvidenceRecord, canonical_json
from perfgate.evidence.access import as_dict, as_list, str_list

__all__ = [
    "MIN_WINDOWS",
    "RERUN",
    "compared_windows",
    "declared_contract",
    "invariants_match",
    "required_invariants",
    "semantic_changes",
    "sides",
    "window_count",
    "windows_valid",
]

MIN_WINDOWS = 3

RERUN = "run_benchmark_window(..., repeats=3) without profiling, then compare_benchmarks(...)"


def declared_contract(record: EvidenceRecord) -> Any:
    """A window's contract, every key under its vocabulary name (records written before contracts were
    stored that way say a synonym): imported evidence keeps the one it was read with in its result."""
    from perfgate.benchmarking import Contract, ContractError

    raw = (
        record.result.get("contract") if record.tool == "import_benchmark" else record.inputs.get("contract")
    )
    try:
        contract = Contract.from_mapping(as_dict(raw))
    except ContractError:
        return raw  # it contradicts itself: its comparison was refused as incomparable
    return {"invariants": contract.invariants, "execution": contract.execution, "classes": contract.classes}


def sides(comparison: EvidenceRecord) -> tuple[list[str], list[str]]:
    """The comparison's baseline and candidate window ids."""
    return str_list(comparison.inputs.get("baseline")), str_list(comparison.inputs.get("candidate"))


def _window_problems(keep: Keep) -> tuple[list[str], list[EvidenceRecord]]:
    """(what disqualifies a compared window, the windows that qualify)."""
    problems: list[str] = []
    windows: list[EvidenceRecord] = []
    for side, ids in zip(("baseline", "candidate"), sides(keep.compared), strict=True):
        for wid in ids:
            record = keep.get(wid)
            if record is None:
                problems.append(f"{side} window {wid} is not in the ledger")
            elif record.tool not in ("run_benchmark_window", "import_benchmark"):
                problems.append(f"{side} evidence {wid} is a {record.tool} record, not a benchmark window")
            elif record.profiled:
                problems.append(
                    f"{side} window {wid} was profiled: profiled runs are never throughput evidence"
                )
            elif record.state.value not in OK_STATES:
                problems.append(f"{side} window {wid} is {record.state.value}, not executed")
            else:
                windows.append(record)
    return problems, windows


def compared_windows(keep: Keep) -> list[EvidenceRecord]:
    """The compared windows that are executed, unprofiled benchmark records."""
    return _window_problems(keep)[1]


def windows_valid(keep: Keep) -> Check:
    baseline, candidate = sides(keep.compared)
    problems, _ = _window_problems(keep)
    return verdict(
        not problems,
        "; ".join(problems) or "all windows executed, none profiled",
        baseline + candidate,
        RERUN,
    )


def _launch_count(ids: list[str], keep: Keep) -> int:
    """Separate launches behind window records: each record's distinct ``windows[].launch`` values."""
    total = 0
    for wid in set(ids):
        record = keep.get(wid)
        windows = [as_dict(w) for w in as_list(record.result.get("windows"))] if record else []
        launches = {w.get("launch") for w in windows}
        total += max(1, len(launches))
    return total


def window_count(keep: Keep) -> Check:
    """Independent evidence is a launch: windows of one process (same_process repeats) count once."""
    baseline, candidate = sides(keep.compared)
    counts = {"baseline": _launch_count(baseline, keep), "candidate": _launch_count(candidate, keep)}
    few = [f"{side} ({n})" for side, n in counts.items() if n < MIN_WINDOWS]
    if not few:
        return verdict(True, f"at least {MIN_WINDOWS} separate launches per side", baseline + candidate)
    if keep.fewer_windows_reason:
        return verdict(
            True,
            f"fewer than {MIN_WINDOWS} launches on {', '.join(few)}: stated reason: {keep.fewer_windows_reason}",
        )
    more = (
        f"run_benchmark_window(..., repeats={MIN_WINDOWS}) (separate launches, not same_process) for the "
        "short side, then compare_benchmarks(...) with all its windows"
    )
    return verdict(
        False,
        f"fewer than {MIN_WINDOWS} separate launches on {', '.join(few)} and no reason stated "
        "(windows of one launch count once)",
        baseline + candidate,
        more + ", or decide with fewer_windows_reason",
    )


def required_invariants(keep: Keep) -> Check:
    from perfgate.benchmarking.workload.vocabulary import REQUIRED_INVARIANTS, VOCABULARY, canonical_key

    windows = compared_windows(keep)
    lacking: dict[str, list[str]] = {}
    for w in windows:
        declared = {
            term.name
            for key in as_dict(as_dict(declared_contract(w)).get("invariants"))
            if (term := VOCABULARY.get(canonical_key(key))) is not None
        }
        missing_keys = [k for k in REQUIRED_INVARIANTS if k not in declared]
        if missing_keys:
            lacking[w.id] = missing_keys
    return verdict(
        not lacking,
        "every window declares " + ", ".join(REQUIRED_INVARIANTS)
        if not lacking
        else "; ".join(f"{wid} does not declare {', '.join(keys)}" for wid, keys in lacking.items()),
        list(lacking) or [w.id for w in windows],
        "re-run the windows with contract.invariants naming "
        + ", ".join(REQUIRED_INVARIANTS)
        + ", then compare_benchmarks(...) again",
    )


def semantic_changes(comparison: EvidenceRecord) -> list[str]:
    """The fields the comparison classified as declared semantic differences (a training change's)."""
    return [
        str(d.get("field"))
        for d in map(as_dict, as_list(comparison.result.get("differences")))
        if d.get("classification") == "declared_semantic"
    ]


def invariants_match(keep: Keep) -> Check:
    """Invariants agree, except the semantic changes the comparison declared (a training change)."""
    comparison = keep.compared
    windows = compared_windows(keep)
    declared = set(str_list(comparison.inputs.get("declared_changes")))
    semantic = {f.removeprefix("contract.invariants.") for f in semantic_changes(comparison)} & declared

    def invariants_of(w: EvidenceRecord) -> str:
        inv = as_dict(as_dict(declared_contract(w)).get("invariants"))
        return canonical_json({k: v for k, v in inv.items() if k not in semantic})

    invariants = {invariants_of(w) for w in windows}
    per_side = [
        {canonical_json(as_dict(declared_contract(w)).get("invariants")) for w in windows if w.id in ids}
        for ids in map(set, sides(comparison))
    ]
    same = len(invariants) <= 1 and all(len(side) <= 1 for side in per_side)
    return verdict(
        same,
        (
            "every window declares the same invariants"
            if not semantic
            else f"invariants match except the declared semantic change ({', '.join(sorted(semantic))})"
        )
        if same
        else "windows declare different invariants",
        [w.id for w in windows],
        "re-run the candidate with the baseline's contract invariants (only execution settings may change)",
    )
