"""Experiments are folded from the ledger: each open/attach/decide is an append-only record."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from perfgate.evidence import EvidenceRecord, Ledger
from perfgate.evidence.access import as_dict, as_list

__all__ = [
    "BIT_EXACT",
    "TOOL_NAME",
    "Classification",
    "Decision",
    "DecisionEntry",
    "Experiment",
    "Link",
    "QualityCriteria",
    "Role",
    "Tolerance",
    "load_experiment",
    "load_experiments",
]

TOOL_NAME = "record_decision"
Classification = Literal["correctness_repair", "system_optimization", "training_change"]
Decision = Literal["keep", "revert", "inconclusive", "blocked"]
Role = Literal[
    "environment", "baseline", "candidate", "comparison", "correctness", "profile", "audit", "quality", "note"
]


@dataclass(frozen=True)
class Tolerance:
    """Correctness tolerances fixed at open: every attached tensor comparison must be this strict or stricter."""

    atol: float = 0.0
    rtol: float = 0.0
    allow_nonfinite: bool = False
    groups: tuple[tuple[str, float, float], ...] = ()
    """(key glob, atol, rtol) per group of tensors (e.g. ``grad/*``), first match wins over atol/rtol."""

    @classmethod
    def from_input(cls, raw: Mapping[str, Any]) -> Tolerance:
        """The tolerance an open call declared (its ``tolerance`` input, as recorded)."""
        groups = tuple(
            (str(g.get("pattern")), float(g.get("atol") or 0.0), float(g.get("rtol") or 0.0))
            for g in map(as_dict, as_list(raw.get("groups")))
        )
        return cls(
            atol=float(raw.get("atol") or 0.0),
            rtol=float(raw.get("rtol") or 0.0),
            allow_nonfinite=bool(raw.get("allow_nonfinite")),
            groups=groups,
        )

    def for_pattern(self, pattern: str) -> tuple[float, float] | None:
        """The (atol, rtol) declared for exactly this group pattern; None when no group has it."""
        return next(((a, r) for p, a, r in self.groups if p == pattern), None)

    def describe(self) -> str:
        text = (
            "bit-exact (atol=0, rtol=0)"
            if self.atol == 0 and self.rtol == 0
            else (f"atol={self.atol:g}, rtol={self.rtol:g}")
        )
        text += "".join(f"; {p}: atol={a:g}, rtol={r:g}" for p, a, r in self.groups)
        return text + (", matching non-finite values allowed" if self.allow_nonfinite else "")


BIT_EXACT = Tolerance()


@dataclass(frozen=True)
class QualityCriteria:
    """Task-quality acceptance fixed at open for a training change: ``metric`` must be ``direction``-is-better
    than ``threshold`` (``lower``: value <= threshold; ``higher``: value >= threshold)."""

    metric: str
    direction: Literal["lower", "higher"]
    threshold: float

    def met_by(self, value: float) -> bool:
        return value <= self.threshold if self.direction == "lower" else value >= self.threshold

    def describe(self) -> str:
        op = "<=" if self.direction == "lower" else ">="
        return f"{self.metric} {op} {self.threshold:g} ({self.direction} is better)"


@dataclass(frozen=True)
class Link:
    """Evidence attached to an experiment in a role, by the record that attached it."""

    evidence_id: str
    role: Role
    attached_by: str


@dataclass(frozen=True)
class DecisionEntry:
    """One decide call: accepted decisions and refused keep attempts alike."""

    decision: str
    rationale: str
    accepted: bool
    gates: list[dict[str, Any]]
    label: str | None
    evidence_id: str
    at: str
    rollback: str | None = None
    """How to undo the change (a command or a revert commit), as the decide call gave it."""


@dataclass
class Experiment:
    """The current view of one experiment (derived, never stored mutable)."""

    id: str
    hypothesis: str
    classification: Classification
    changed_variable: str
    touches_data: bool
    memory_budget_bytes: int | None
    opened_at: str
    opened_seq: int = 0
    """Ledger position of the open record: evidence recorded after it has a larger ``seq``."""
    tolerance: Tolerance = BIT_EXACT
    """Correctness tolerances declared at open (bit-exact when none were declared)."""
    quality: QualityCriteria | None = None
    """Task-quality acceptance declared at open (a training change needs one)."""
    validation_steps: int | None = None
    """Healthy steps a candidate run must train before a keep (the winner's validation), when asked at open."""
    links: list[Link] = field(default_factory=list[Link])
    decisions: list[DecisionEntry] = field(default_factory=list[DecisionEntry])
    attempts: list[DecisionEntry] = field(default_factory=list[DecisionEntry])

    def criteria(self) -> str:
        """What open fixed before any candidate evidence: the tolerance, or a training change's quality."""
        if self.classification == "training_change":
            return "task quality: " + (self.quality.describe() if self.quality else "none declared")
        from perfgate.decisions.equivalence import label_note

        tol = self.tolerance
        note = label_note(tol.atol, tol.rtol, tol.groups)
        return "correctness tolerance: " + tol.describe() + (f"; {note}" if note else "")

    def ids(self, role: Role) -> list[str]:
        return [link.evidence_id for link in self.links if link.role == role]

    @property
    def decision(self) -> DecisionEntry | None:
        return self.decisions[-1] if self.decisions else None


def _apply(experiments: dict[str, Experiment], record: EvidenceRecord) -> None:
    action = record.inputs.get("action")
    result = record.result
    exp_id = result.get("experiment_id")
    if not isinstance(exp_id, str):
        return
    if action == "open":
        tol = as_dict(record.inputs.get("tolerance"))
        quality = as_dict(record.inputs.get("quality"))
        experiments[exp_id] = Experiment(
            id=exp_id,
            hypothesis=record.inputs["hypothesis"],
            classification=record.inputs["classification"],
            changed_variable=record.inputs["changed_variable"],
            touches_data=bool(record.inputs.get("touches_data")),
            memory_budget_bytes=record.inputs.get("memory_budget_bytes"),
            opened_at=record.created_at,
            opened_seq=record.seq,
            tolerance=Tolerance.from_input(tol) if tol else BIT_EXACT,
            quality=QualityCriteria(
                metric=str(quality["metric"]),
                direction="higher" if quality.get("direction") == "higher" else "lower",
                threshold=float(quality["threshold"]),
            )
            if quality.get("metric") is not None and quality.get("threshold") is not None
            else None,
            validation_steps=v if isinstance(v := record.inputs.get("validation_steps"), int) else None,
        )
    exp = experiments.get(exp_id)
    if exp is None:
        return
    if action in {"open", "attach", "decide"}:
        for item in map(as_dict, as_list(record.inputs.get("evidence"))):
            link = Link(evidence_id=str(item["id"]), role=item["role"], attached_by=record.id)
            if all((x.evidence_id, x.role) != (link.evidence_id, link.role) for x in exp.links):
                exp.links.append(link)
    if action == "decide":
        entry = DecisionEntry(
            decision=str(record.inputs.get("decision")),
            rationale=str(record.inputs.get("rationale")),
            accepted=bool(result.get("accepted")),
            gates=[as_dict(g) for g in as_list(result.get("gates"))],
            label=result.get("label"),
            evidence_id=record.id,
            at=record.created_at,
            rollback=record.inputs.get("rollback") or None,
        )
        (exp.decisions if entry.accepted else exp.attempts).append(entry)


def load_experiments(ledger: Ledger) -> dict[str, Experiment]:
    """Every experiment in the ledger, in the order they were opened."""
    experiments: dict[str, Experiment] = {}
    for record in ledger.records(tool=TOOL_NAME):
        _apply(experiments, record)
    return experiments


def load_experiment(ledger: Ledger, experiment_id: str) -> Experiment | None:
    return load_experiments(ledger).get(experiment_id)
