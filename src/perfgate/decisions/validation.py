"""The winner's validation run: where the experiment asks for it (``validation_steps`` at open), a keep
needs a candidate run that trained at least that many steps, healthily (finite losses and gradient norms,
no unexplained skipped iteration, no loss spike, no loss-scale collapse: ``job_health``).

Any candidate window counts: one of the comparison's, or a run of the same command (less the output paths it wrote) measured after open and
attached in role ``candidate``. A passed ``check_training_health`` of a candidate window with ``min_steps``
at least the number asked counts too.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from perfgate.decisions.experiments import Experiment
from perfgate.evidence import EvidenceRecord
from perfgate.evidence.access import as_dict, str_list

__all__ = ["ValidationVerdict", "validation_verdict"]

Lookup = Callable[[str], EvidenceRecord | None]


@dataclass(frozen=True)
class ValidationVerdict:
    ok: bool
    reason: str
    ids: list[str]
    unhealthy: bool = False


def _command(record: EvidenceRecord) -> tuple[str, ...]:
    """The command as it ran, less the output paths the run wrote (`benchmarking.comparing.identity.ran_argv`): a
    validation run may write its dump or log elsewhere."""
    from perfgate.benchmarking.comparing.identity import ran_argv

    return tuple(ran_argv(record) or str_list(record.inputs.get("command")))


def _span(record: EvidenceRecord) -> tuple[int, str]:
    """Steps the run's job health covers (the longest launch), and its verdict."""
    job = as_dict(record.result.get("job_health"))
    first, last = job.get("first_step"), job.get("last_step")
    steps = last - first + 1 if isinstance(first, int) and isinstance(last, int) else 0
    return steps, str(job.get("verdict") or "unknown")


def validation_verdict(
    exp: Experiment, steps: int, comparison: EvidenceRecord | None, lookup: Lookup
) -> ValidationVerdict:
    compared = str_list(comparison.inputs.get("candidate")) if comparison is not None else []
    commands = {_command(r) for i in compared if (r := lookup(i)) is not None}
    windows: list[EvidenceRecord] = [r for i in compared if (r := lookup(i)) is not None]
    for wid in exp.ids("candidate"):
        record = lookup(wid)
        if (
            record is not None
            and record.tool == "run_benchmark_window"
            and record.seq > exp.opened_seq
            and (not commands or _command(record) in commands)
        ):
            windows.append(record)
    seen: list[str] = []
    for w in windows:
        span, verdict = _span(w)
        seen.append(f"{w.id}: {span} step(s), {verdict}")
        if verdict == "healthy" and span >= steps:
            return ValidationVerdict(True, f"{w.id} trained {span} healthy steps (>= {steps} asked)", [w.id])
        if verdict == "unhealthy":
            findings = "; ".join(str_list(as_dict(w.result.get("job_health")).get("findings"))[:2])
            return ValidationVerdict(
                False,
                f"the candidate run {w.id} is unhealthy: {findings or 'see its job_health'}",
                [w.id],
                True,
            )
    ids = {w.id for w in windows}
    for link in exp.links:
        record = lookup(link.evidence_id)
        if (
            record is not None
            and record.tool == "check_training_health"
            and record.state.value == "passed"
            and record.inputs.get("evidence_id") in ids
            and isinstance(record.inputs.get("min_steps"), int)
            and record.inputs["min_steps"] >= steps
        ):
            return ValidationVerdict(
                True, f"{record.id} passed with min_steps={record.inputs['min_steps']}", [record.id]
            )
    return ValidationVerdict(
        False,
        f"no candidate run trained {steps} healthy steps ("
        + ("; ".join(seen[:4]) or "no candidate window")
        + ")",
        [w.id for w in windows],
    )
