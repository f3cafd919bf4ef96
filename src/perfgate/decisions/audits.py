"""Sample audits bound to the runs they speak for, as tensor files are (`perfgate.decisions.binding`).

An audit counts the records of some launches: its ``launches`` are the ``session`` of those records, which
the harness recorders take from the launch id the server gave the process (``PERFGATE_LAUNCH_ID``). A
window record lists the ids its launches were given (``launch_ids``). The keep accepts an audit only when
every launch it counted is one of the candidate's: an audit of the baseline, of another experiment's run
or of records written outside perfgate's launches speaks for another run. Repeats are the contract's to
allow: an audit that allowed them (``allow_repeats``) counts only where the candidate's contract declares
sampling with replacement. What an audit covers partially (a run ended part-way through an epoch) is
accepted for what it read, and said.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from perfgate.decisions.experiments import Experiment
from perfgate.evidence import EvidenceRecord
from perfgate.evidence.access import as_dict, as_list, str_list

__all__ = ["REPLACEMENT_KEY", "AuditBinding", "audit_binding", "declares_replacement"]

Lookup = Callable[[str], EvidenceRecord | None]

REPLACEMENT_KEY = "replacement"
"""The contract invariant (a member of `sampling`) that declares sampling with replacement: true."""

RECORD_HOW = (
    "audit_samples(observed=<the folder the candidate's own run_benchmark_window launches wrote with "
    "perfgate.harness.RecordingSampler, RecordingDataset or SampleLog>, expected_range=[...]), then decide keep "
    "again with evidence=[{'id': <the audit>, 'role': 'audit'}]"
)


@dataclass
class AuditBinding:
    problems: list[str] = field(default_factory=list[str])
    good: list[str] = field(default_factory=list[str])
    notes: list[str] = field(default_factory=list[str])
    fix: str = RECORD_HOW


def _launch_ids(ids: list[str], lookup: Lookup) -> set[int]:
    out: set[int] = set()
    for wid in ids:
        record = lookup(wid)
        if record is not None:
            out.update(i for i in as_list(record.result.get("launch_ids")) if isinstance(i, int))
    return out


def declares_replacement(record: EvidenceRecord) -> bool:
    """The window's contract declares sampling with replacement (invariant ``replacement`` true, or
    ``sampling`` naming it)."""
    from perfgate.benchmarking.workload.vocabulary import vocabulary_name

    raw = (
        record.result.get("contract") if record.tool == "import_benchmark" else record.inputs.get("contract")
    )
    invariants = {vocabulary_name(str(k)): v for k, v in as_dict(as_dict(raw).get("invariants")).items()}
    value = invariants.get(REPLACEMENT_KEY)
    if value is True or (
        isinstance(value, str) and value.strip().lower() in ("true", "yes", "with_replacement")
    ):
        return True
    sampling = invariants.get("sampling")
    return (
        isinstance(sampling, str) and "replacement" in sampling.lower() and "without" not in sampling.lower()
    )


def audit_binding(exp: Experiment, comparison: EvidenceRecord | None, lookup: Lookup) -> AuditBinding:
    """Which passed audits attached in role ``audit`` speak for the candidate's own launches, and why the
    others do not."""
    out = AuditBinding()
    candidate = str_list(comparison.inputs.get("candidate")) if comparison is not None else []
    candidate += [i for i in exp.ids("candidate") if i not in candidate]
    baseline = str_list(comparison.inputs.get("baseline")) if comparison is not None else []
    mine, theirs = _launch_ids(candidate, lookup), _launch_ids(baseline, lookup)
    windows = [r for i in candidate if (r := lookup(i)) is not None]
    for aid in exp.ids("audit"):
        record = lookup(aid)
        if record is None or record.tool != "audit_samples" or record.state.value != "passed":
            continue
        launches = {i for i in as_list(record.result.get("launches")) if isinstance(i, int)}
        if not launches:
            out.problems.append(
                f"{aid} names no launch: its records carry no session, so nothing ties them to the candidate's "
                "runs"
            )
            continue
        if not mine:
            out.problems.append(
                f"{aid} audits launches {sorted(launches)[:6]}, but the candidate windows record no launch ids "
                "(measured before perfgate recorded them, or imported): nothing shows these are the candidate's"
            )
            out.fix = (
                "run_benchmark_window(...) for the candidate with the sample recorders in its script, then "
                "compare_benchmarks(...) on those windows and audit_samples on the folder they wrote"
            )
            continue
        foreign = sorted(launches - mine)
        if foreign:
            whose = (
                "the baseline's runs"
                if set(foreign) <= theirs
                else "no candidate window of the comparison (another run or experiment)"
            )
            out.problems.append(
                f"{aid} audits launches {foreign[:6]} of {whose}; the candidate's launches are {sorted(mine)[:6]}"
            )
            continue
        if record.inputs.get("allow_repeats") is True and not any(declares_replacement(w) for w in windows):
            out.problems.append(
                f"{aid} allowed repeats (allow_repeats=true) but the candidate's contract does not declare "
                f"sampling with replacement (contract.invariants.{REPLACEMENT_KEY}=true): repeats are the "
                "contract's to allow"
            )
            out.fix = (
                "audit_samples(observed=..., expected_range=[...]) on the same folder without allow_repeats, then "
                "decide keep again with it in role 'audit'; a sampler that draws with replacement is declared "
                f"by contract.invariants.{REPLACEMENT_KEY}=true on both sides' windows"
            )
            continue
        out.good.append(aid)
        partial = [e for e in as_list(record.result.get("partial_epochs")) if isinstance(e, int)]
        if partial:
            out.notes.append(
                f"{aid} covers epoch(s) {partial[:6]} part-way (the run ended inside them): accepted for the "
                "ids it read"
            )
    return out
