"""Screens: several short candidates compared with one baseline in one call, the winner picked, and its
longer validation asked for before any keep.

The seeds' tuning loop runs matched short screens (a sweep of microbatch sizes, a few kernel options), then
runs the winner for at least 50 healthy steps before trusting it. A candidate list that holds the windows of
more than one candidate (they differ among themselves in what ran, `benchmarking.comparing.identity`: argv less the
paths the run wrote, env values, contract execution settings, code state) is such a screen; windows of one
candidate measured in several calls are not: each candidate is compared with the baseline on its own, under the
same declared changes, and ranked. The winner is the improved candidate whose interval's lower end is
highest; a screen is never kept itself (pooling different candidates would measure none of them).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from pydantic import BaseModel, Field

from perfgate.benchmarking.comparing.identity import identity_differences, identity_key, record_identity

if TYPE_CHECKING:
    from perfgate.benchmarking.comparing.ab import EvidenceComparison
    from perfgate.evidence import EvidenceRecord

__all__ = [
    "VALIDATION_STEPS",
    "Screen",
    "ScreenEntry",
    "candidate_groups",
    "rank_screen",
    "screen_differences",
]

VALIDATION_STEPS = 50
"""Healthy steps a screen's winner runs before it can be kept (the seeds' rule)."""


class ScreenEntry(BaseModel):
    candidate: list[str] = Field(description="The candidate's window evidence ids.")
    label: str | None = Field(description="Its windows' label, when they share one.")
    changes: list[str] = Field(description="What differs from the baseline (execution settings, env, code).")
    status: str
    verdict: str
    speedup: float | None
    ci_low: float | None
    ci_high: float | None
    median_step_speedup: float | None
    reasons: list[str] = Field(description="Why it is incomparable, when it is.")


class Screen(BaseModel):
    """Each candidate against the baseline, the winner first."""

    entries: list[ScreenEntry]
    differs: list[str] = Field(
        default_factory=list[str],
        description="What differs among the candidates (each against the first): 'argv --opt', 'env.NAME', "
        "'execution.KEY', 'code PATH', 'file PATH'.",
    )
    winner: list[str] | None = Field(
        description="The winner's window evidence ids: improved, with the highest lower interval end; None when "
        "no candidate improved beyond noise."
    )
    next: str = Field(
        description="What to run before a keep: the winner's validation, then its own comparison."
    )

    def headline(self) -> str:
        """The ranking in one line, for the answer's lead."""
        ranked = "; ".join(
            f"{e.label or e.candidate[0]}: {e.verdict}"
            + (
                f" {e.speedup:.3f}x ({e.ci_low:.3f}-{e.ci_high:.3f})"
                if e.speedup and e.ci_low and e.ci_high
                else ""
            )
            for e in self.entries
        )
        shown = "winner's" if self.winner else "best candidate's"
        differ = f"; they differ in {', '.join(self.differs[:8])}" if self.differs else ""
        return (
            f"screen of {len(self.entries)} candidates, best first: {ranked}{differ}; the figures below are the "
            f"{shown}"
        )


def candidate_groups(records: Sequence[EvidenceRecord]) -> list[list[EvidenceRecord]]:
    """The candidate windows grouped by what ran (`identity.record_identity`), in first-seen order (one
    group: no screen, whatever calls measured them)."""
    groups: dict[str, list[EvidenceRecord]] = {}
    for r in records:
        groups.setdefault(identity_key(r), []).append(r)
    return list(groups.values())


def screen_differences(groups: Sequence[Sequence[EvidenceRecord]]) -> list[str]:
    """What differs among the candidates (each against the first), by name (`identity.identity_differences`)."""
    first = record_identity(groups[0][0])
    found: dict[str, None] = {}
    for g in groups[1:]:
        found.update(dict.fromkeys(identity_differences(first, record_identity(g[0]))))
    return list(found)


def _entry(group: Sequence[EvidenceRecord], ab: EvidenceComparison) -> ScreenEntry:
    labels = {r.inputs.get("label") for r in group}
    label = labels.pop() if len(labels) == 1 else None
    c, judged = ab.comparison, ab.comparability
    changes = [*judged.actual_changes]
    changes += [
        d.field
        for d in judged.differences
        if d.kind in ("env", "code", "file", "argv") and d.field not in changes
    ]
    return ScreenEntry(
        candidate=[r.id for r in group],
        label=label if isinstance(label, str) else None,
        changes=changes,
        status="incomparable" if c is None else "comparable",
        verdict="incomparable" if c is None else c.verdict,
        speedup=None if c is None else c.speedup,
        ci_low=None if c is None else c.ci_low,
        ci_high=None if c is None else c.ci_high,
        median_step_speedup=None if c is None else c.median_step_speedup,
        reasons=list(judged.reasons),
    )


def rank_screen(
    groups: Sequence[Sequence[EvidenceRecord]],
    comparisons: Sequence[EvidenceComparison],
    baseline: Sequence[str],
) -> tuple[Screen, int]:
    """The screen and the index of the group whose figures the answer shows: the winner's, else the best
    ranked candidate's."""
    entries = [_entry(g, ab) for g, ab in zip(groups, comparisons, strict=True)]

    def order(i: int) -> tuple[int, float, float]:
        e = entries[i]
        improved = e.verdict == "improved"
        return (
            0 if improved else 1 if e.status == "comparable" else 2,
            -(e.ci_low or 0.0),
            -(e.speedup or 0.0),
        )

    ranked = sorted(range(len(entries)), key=order)
    best = ranked[0] if entries[ranked[0]].verdict == "improved" else None
    if best is None:
        step = (
            "no candidate is faster beyond noise: screen longer windows or more launches (repeats>=3), or decide "
            "'revert'; nothing here can be kept"
        )
    else:
        ids = entries[best].candidate
        step = (
            f"validate the winner ({', '.join(ids)}) before any keep: record_decision(action='open', ..., "
            f"validation_steps={VALIDATION_STEPS}) for its change, then run_benchmark_window with the inputs of "
            f"{ids[0]} plus job=true (each launch runs to its end, so its health covers at least "
            f"{VALIDATION_STEPS} steps of a long enough job), then compare_benchmarks(baseline={list(baseline)}, "
            "candidate=[<those windows>]): the keep rests on that comparison and the winner's own healthy steps, "
            "never on this screen"
        )
    screen = Screen(
        entries=[entries[i] for i in ranked],
        differs=screen_differences(groups),
        winner=None if best is None else entries[best].candidate,
        next=f"next: {step}",
    )
    return screen, ranked[0]
