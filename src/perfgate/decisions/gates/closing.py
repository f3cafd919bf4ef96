"""What every keep needs last, whatever its kind: its data audited where the data path changed, no failed
check left unread, the validation run open asked for, a rollback that undoes it, every cited run finished,
and a ledger nobody edited."""

from __future__ import annotations

from perfgate.decisions.gates.base import Keep, not_applicable, passed_by, verdict
from perfgate.decisions.verdict import Check
from perfgate.evidence.access import str_list

__all__ = ["failed_checks", "ledger_integrity", "rollback", "runs_finished", "sample_audit", "validation_run"]

_CHECK_TOOLS = {
    "compare_tensors": "correctness",
    "audit_samples": "audit",
    "check_training_health": "quality",
    "compare_benchmarks": "comparison",
}
"""Tools whose failed record is a failed check, and the role whose gate reads it."""


def sample_audit(keep: Keep) -> Check:
    """Where the change touches data (declared, or shown by the comparison): a passed audit of the
    candidate's own launches (`decisions.audits`), none failed."""
    from perfgate.decisions.audits import RECORD_HOW, audit_binding

    exp = keep.exp
    if not keep.audit_gated:
        return not_applicable("the change does not touch data loading or sharding (declared and measured)")
    implied = keep.implied_data_change
    # measured, not declared: the reason says why the audit applies
    why = (
        f" (required: {'; '.join(implied)}; touches_data was not declared)"
        if implied and not exp.touches_data
        else ""
    )
    base = passed_by(keep, "audit", "audit_samples", RECORD_HOW)
    if not base.ok:
        if any((r := keep.get(i)) is not None and r.state.value == "failed" for i in exp.ids("audit")):
            # a failed audit stays with this experiment: the repaired change is a new one
            base.fix = (
                "fix the sampling the audit names, then record_decision(action='open', ...) a new experiment "
                "for the repaired change with its own runs and audit; or decide 'revert'"
            )
        base.reason += why
        return base
    binding = audit_binding(exp, keep.comparison, keep.get)
    if binding.good:
        return verdict(
            True,
            "a passed audit of the candidate's own launches"
            + (f"; {'; '.join(binding.notes)}" if binding.notes else "")
            + (f" (not counted: {'; '.join(binding.problems)})" if binding.problems else "")
            + why,
            binding.good,
        )
    return verdict(False, "; ".join(binding.problems) + why, exp.ids("audit"), binding.fix)


def failed_checks(keep: Keep) -> Check:
    """A failed check attached in any role blocks: one no other gate reads (under ``note``, ``profile``,
    another check's role, or a role whose gate does not apply to this experiment) is named here.

    A comparison is read at its latest; a training change's failed tensor check is what changed numerics
    look like (its keep rests on task quality), so neither blocks here."""
    exp = keep.exp
    read_by_gate = {
        "correctness": exp.classification != "training_change",
        "audit": keep.audit_gated,
        "quality": exp.classification == "training_change",
        "comparison": exp.classification != "correctness_repair",
    }
    blocking: list[str] = []
    for link in exp.links:
        record = keep.get(link.evidence_id)
        if record is None or record.state.value != "failed" or record.tool not in _CHECK_TOOLS:
            continue
        home = _CHECK_TOOLS[record.tool]
        if record.tool == "compare_benchmarks" and link.role == "comparison":
            continue  # the comparison gate reads the latest comparison; a superseded one is history
        if record.tool == "compare_tensors" and exp.classification == "training_change":
            continue
        if link.role == home and read_by_gate[home]:
            continue  # its own gate reads it
        blocking.append(f"{record.id} ({record.tool}, failed) attached as {link.role!r}")
    if not blocking:
        return verdict(True, "no failed check is attached in a role its gate does not read")
    return verdict(
        False,
        "a failed check blocks a keep in any role: " + "; ".join(blocking[:5]),
        [b.split(" ", 1)[0] for b in blocking],
        "a failed check stays with the experiment: fix what it found, then record_decision(action='open', ...) "
        "a new experiment for the repaired change with its own evidence; or decide 'revert' or 'inconclusive'",
    )


def validation_run(keep: Keep) -> Check:
    from perfgate.decisions.validation import validation_verdict

    steps = keep.exp.validation_steps
    if steps is None:
        return not_applicable("the experiment asked for no validation run at open (validation_steps)")
    said = validation_verdict(keep.exp, steps, keep.comparison, keep.get)
    if said.unhealthy:
        fix = "fix what makes the candidate's training unhealthy and re-run it, or decide 'revert'"
    else:
        fix = (
            f"run_benchmark_window(command=<the candidate's command>, contract=<its contract>, warmup_steps=5, "
            f"measure_steps={steps}, repeats=1), then decide keep again with evidence=[{{'id': <that window>, "
            "'role': 'candidate'}]"
        )
    return verdict(said.ok, said.reason, said.ids, fix)


def rollback(keep: Keep) -> Check:
    """The keep's rollback undoes what the candidate changed (`perfgate.decisions.rollback`)."""
    from perfgate.decisions.rollback import rollback_check

    if keep.rollback is None:
        return not_applicable("named by the keep itself (decide's rollback), checked then")
    comparison = keep.comparison
    sides = (
        [str_list(comparison.inputs.get(side)) for side in ("baseline", "candidate")]
        if comparison is not None
        else [keep.exp.ids("baseline"), keep.exp.ids("candidate")]
    )
    baseline, candidate = ([r for i in ids if (r := keep.get(i)) is not None] for ids in sides)
    return rollback_check(keep.rollback, keep.ledger.workspace, baseline, candidate)


def runs_finished(keep: Keep) -> Check:
    """Every detached run the keep cites (attached, or named by what is attached) has a recorded result."""
    from perfgate.decisions.runs import unfinished_run_problems

    cited = [link.evidence_id for link in keep.exp.links]
    problems = unfinished_run_problems(cited, keep.ledger, keep.get)
    return verdict(
        not problems,
        "; ".join(problems) or "no cited run is unfinished: every detached run's result is recorded",
        cited,
        "benchmark_run(action='wait', run_id=...) until the run ends, then benchmark_run(action='result', "
        "run_id=...); cite the record it returns, not the start record",
    )


def ledger_integrity(keep: Keep) -> Check:
    report = keep.ledger.verify()
    return verdict(
        report.ok,
        "the ledger verifies: no record or artifact was edited"
        if report.ok
        else "; ".join(report.errors[:5]),
        [],
        report.next_step
        or "restore the edited evidence or re-measure; an edited ledger cannot support a keep",
    )
