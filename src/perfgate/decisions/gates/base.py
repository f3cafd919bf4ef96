"""What every gate reads and returns: the keep being judged (the experiment, its evidence looked up once, the
decide call's own words) and the verdict builders. Gates judge ledger evidence only, never what the agent
says."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import cached_property
from typing import Literal

from pydantic import BaseModel

from perfgate.decisions.experiments import Experiment, Role, load_experiments
from perfgate.decisions.verdict import OK_STATES, Check
from perfgate.evidence import EvidenceRecord, Ledger
from perfgate.evidence.access import as_dict, str_list

__all__ = [
    "Gate",
    "GateStatus",
    "Keep",
    "gate_of",
    "not_applicable",
    "passed_by",
    "unavailable",
    "verdict",
]

GateStatus = Literal["passed", "failed", "not_applicable", "unavailable"]
"""``unavailable``: the figure the gate reads could not be observed here (a peak memory counter the device
lacks); it does not block a keep, and it is reported as unmeasured, never as passed."""


class Gate(BaseModel):
    name: str
    status: GateStatus
    reason: str
    evidence_ids: list[str]
    satisfy_with: str | None


def verdict(ok: bool, reason: str, ids: Iterable[str] = (), fix: str | None = None) -> Check:
    """A gate that applies: passed or failed, with the call that satisfies it when failed."""
    return Check(True, ok, reason, list(ids), None if ok else fix)


def not_applicable(reason: str) -> Check:
    return Check(False, True, reason, [])


def unavailable(reason: str, ids: Iterable[str] = ()) -> Check:
    return Check(True, True, reason, list(ids), observed=False)


def gate_of(name: str, check: Check) -> Gate:
    """The named ``Gate`` of a gate's verdict."""
    if not check.applies:
        return Gate(
            name=name, status="not_applicable", reason=check.reason, evidence_ids=[], satisfy_with=None
        )
    if not check.observed:
        return Gate(
            name=name, status="unavailable", reason=check.reason, evidence_ids=check.ids, satisfy_with=None
        )
    return Gate(
        name=name,
        status="passed" if check.ok else "failed",
        reason=check.reason,
        evidence_ids=check.ids,
        satisfy_with=None if check.ok else check.fix,
    )


@dataclass
class Keep:
    """One keep being judged: the experiment, the ledger its evidence is read from (each record looked up
    once), and what the decide call gave (None for ``show``)."""

    exp: Experiment
    ledger: Ledger
    fewer_windows_reason: str | None = None
    rollback: str | None = None
    memory_growth_reason: str | None = None
    _records: dict[str, EvidenceRecord | None] = field(default_factory=dict[str, "EvidenceRecord | None"])

    def get(self, evidence_id: str) -> EvidenceRecord | None:
        if evidence_id not in self._records:
            self._records[evidence_id] = self.ledger.get(evidence_id)
        return self._records[evidence_id]

    @cached_property
    def comparison(self) -> EvidenceRecord | None:
        """The comparison attached last (`overruled_by` finds a later one in the ledger that overrules it)."""
        attached = [
            r
            for i in self.exp.ids("comparison")
            if (r := self.get(i)) is not None and r.tool == "compare_benchmarks"
        ]
        return attached[-1] if attached else None

    @cached_property
    def overruled_by(self) -> EvidenceRecord | None:
        """The newest later comparison over the latest one's windows (plus any more), when it does not say
        improved: a keep rests on the latest comparison that covers its windows, never on one it overrules."""
        latest = self.comparison
        if (
            latest is None
            or latest.result.get("verdict") != "improved"
            or as_dict(latest.result.get("screen"))
        ):
            return None
        base, cand = (set(str_list(latest.inputs.get(k))) for k in ("baseline", "candidate"))
        covering = [
            r
            for r in self.ledger.records(tool="compare_benchmarks")
            if r.seq > latest.seq
            and not as_dict(r.result.get("screen"))
            and base <= set(str_list(r.inputs.get("baseline")))
            and cand <= set(str_list(r.inputs.get("candidate")))
        ]
        if not covering:
            return None
        newest = covering[-1]
        improved = newest.result.get("verdict") == "improved" and newest.state.value in OK_STATES
        return None if improved else newest

    @property
    def compared(self) -> EvidenceRecord:
        """The comparison a gate that applies only where one stands reads (the registry's condition)."""
        assert self.comparison is not None, "this gate applies only where a comparison stands"
        return self.comparison

    @cached_property
    def experiments(self) -> dict[str, Experiment]:
        return load_experiments(self.ledger)

    @cached_property
    def implied_data_change(self) -> list[str]:
        """Why the latest attached comparison shows a data-path change, whatever the experiment declared."""
        from perfgate.decisions.data_path import data_path_changes

        if self.comparison is None:
            return []
        return data_path_changes(self.comparison, self.get, self.ledger.workspace)

    @property
    def audit_gated(self) -> bool:
        """The sample audit applies: the change touches data, declared or measured."""
        return bool(self.exp.touches_data or self.implied_data_change)

    def attach(self, role: Role) -> str:
        """The call that attaches evidence in ``role`` to this experiment."""
        return (
            f"record_decision(action='attach', experiment_id='{self.exp.id}', evidence=[{{'id': ..., "
            f"'role': '{role}'}}])"
        )


def passed_by(keep: Keep, role: Role, tool: str | None, fix: str) -> Check:
    """Passed evidence (of ``tool``, when given) attached in ``role``, none failed."""
    ids = keep.exp.ids(role)
    records = [(i, keep.get(i)) for i in ids]
    failed = [i for i, r in records if r is not None and r.state.value == "failed"]
    good = [
        i
        for i, r in records
        if r is not None and r.state.value == "passed" and (tool is None or r.tool == tool)
    ]
    if failed:
        return verdict(False, f"attached {role} evidence failed: {', '.join(failed)}", failed, fix)
    if not good:
        what = f"passed {tool} evidence" if tool else f"passed {role} evidence"
        return verdict(False, f"no {what} is attached in role {role}", ids, fix)
    return verdict(True, f"{role} evidence passed", good)
