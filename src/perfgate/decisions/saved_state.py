"""Does the change alter what a checkpoint holds, and does a checkpoint the baseline saved still load?

Read from the states the windows' checkpoint writers were handed (`perfgate.benchmarking.runs.saved_state`, the
``saved_states`` of each window record, as the ledger holds them): a side's saved state is every key, with
its shapes and dtypes, over the distinct states its windows saved. Where both sides saved, the states are
equal (the change needs no resume on their account) or they differ: then a checkpoint the baseline saved
must load into the candidate strictly, as ``load_state_dict(strict=True)`` would take it: no key of the
baseline's missing from the candidate's, none of the candidate's unexpected, and each shared tensor of the
same shape and dtype.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from perfgate.evidence import EvidenceRecord
from perfgate.evidence.access import as_dict, as_list, str_list

__all__ = ["SHOWN_KEYS", "SideState", "StateDifference", "saved_state_difference"]

SHOWN_KEYS = 5
"""Keys a refusal names of each kind (missing, unexpected, mismatched); the counts cover them all."""

Lookup = Callable[[str], EvidenceRecord | None]
Layout = tuple[tuple[int, ...] | None, str]


@dataclass
class SideState:
    """What one side's windows saved: digests of the distinct states, key -> its layouts, the windows."""

    digests: set[str] = field(default_factory=set[str])
    keys: dict[str, set[Layout]] = field(default_factory=dict[str, set[Layout]])
    windows: list[str] = field(default_factory=list[str])
    complete: bool = True


@dataclass(frozen=True)
class StateDifference:
    """The two sides' saved states compared (``observed``: both sides saved one)."""

    observed: bool
    differs: bool = False
    missing: list[str] = field(default_factory=list[str])
    unexpected: list[str] = field(default_factory=list[str])
    mismatched: list[str] = field(default_factory=list[str])
    evidence: list[str] = field(default_factory=list[str])
    complete: bool = True

    @property
    def loads(self) -> bool:
        """A checkpoint the baseline saved loads into the candidate strictly (as far as the keys were read)."""
        return not (self.missing or self.unexpected or self.mismatched)

    def describe(self) -> str:
        """The keys that keep a baseline checkpoint from loading: the first `SHOWN_KEYS` of each kind, counted."""
        parts = [
            f"{len(keys)} {what} ({', '.join(keys[:SHOWN_KEYS])}{', ...' if len(keys) > SHOWN_KEYS else ''})"
            for what, keys in (
                ("missing from the candidate's", self.missing),
                ("unexpected in the candidate's", self.unexpected),
                ("of another shape or dtype", self.mismatched),
            )
            if keys
        ]
        return "; ".join(parts)


def _side(ids: Sequence[str], lookup: Lookup) -> SideState:
    side = SideState()
    for wid in ids:
        record = lookup(wid)
        if record is None:
            continue
        states = [as_dict(s) for s in as_list(record.result.get("saved_states"))]
        if not states:
            continue
        side.windows.append(wid)
        for state in states:
            side.digests.add(str(state.get("digest")))
            entries = as_list(state.get("entries"))
            if state.get("complete") is False or len(entries) < int(state.get("keys") or 0):
                side.complete = False
            for entry in entries:
                row = as_list(entry)
                if len(row) != 3:
                    continue
                shape = as_list(row[1]) if row[1] is not None else None
                dims = tuple(int(d) for d in shape) if shape is not None else None
                side.keys.setdefault(str(row[0]), set()).add((dims, str(row[2])))
    return side


def saved_state_difference(comparison: EvidenceRecord, lookup: Lookup) -> StateDifference:
    """The baseline's saved state against the candidate's, over the windows the comparison compared."""
    base = _side(str_list(comparison.inputs.get("baseline")), lookup)
    cand = _side(str_list(comparison.inputs.get("candidate")), lookup)
    if not (base.windows and cand.windows):
        return StateDifference(observed=False)
    evidence = [*base.windows[:1], *cand.windows[:1]]
    if base.digests == cand.digests:
        return StateDifference(observed=True, evidence=evidence)
    shared = sorted(set(base.keys) & set(cand.keys))
    mismatched = [k for k in shared if base.keys[k] != cand.keys[k]]
    return StateDifference(
        observed=True,
        differs=True,
        missing=sorted(set(base.keys) - set(cand.keys)),
        unexpected=sorted(set(cand.keys) - set(base.keys)),
        mismatched=mismatched,
        evidence=evidence,
        complete=base.complete and cand.complete,
    )
