"""The comparison is about this experiment: it declares the experiment's change, its candidate windows were
measured after open for this experiment alone, a topology change is compared per device, and a semantic
change is kept only as a training change (`perfgate.decisions.binding` reads the evidence)."""

from __future__ import annotations

from perfgate.decisions.binding import (
    TOPOLOGY,
    candidate_after_open_problems,
    declaration_for,
    declared_change_problems,
    reused_candidate_problems,
)
from perfgate.decisions.gates.base import Keep, not_applicable, verdict
from perfgate.decisions.gates.windows import semantic_changes
from perfgate.decisions.verdict import Check
from perfgate.evidence.access import str_list

__all__ = [
    "candidate_after_open",
    "classification",
    "declared_change",
    "declares_semantic",
    "evidence_not_reused",
    "topology",
]


def _compare_fix(keep: Keep) -> str:
    declared = declaration_for(keep.exp.changed_variable)
    return (
        f"compare_benchmarks(baseline=[...], candidate=[...], declared_changes={declared!r}) on "
        "candidate windows measured for this experiment, then " + keep.attach("comparison")
    )


def declared_change(keep: Keep) -> Check:
    problems = declared_change_problems(keep.exp, keep.compared)
    return verdict(
        not problems,
        "; ".join(problems)
        or f"the comparison declares the experiment's change ({keep.exp.changed_variable})",
        [keep.compared.id],
        _compare_fix(keep),
    )


def candidate_after_open(keep: Keep) -> Check:
    late = candidate_after_open_problems(keep.exp, keep.compared, keep.get)
    return verdict(
        not late,
        "; ".join(late) or "the candidate windows were measured after the experiment was opened",
        [keep.compared.id],
        "run_benchmark_window(...) for the candidate now, then " + _compare_fix(keep),
    )


def evidence_not_reused(keep: Keep) -> Check:
    reused = reused_candidate_problems(keep.exp, keep.compared, keep.experiments, keep.get)
    return verdict(
        not reused,
        "; ".join(reused) or "the candidate windows support no other kept experiment",
        [keep.compared.id],
        "measure new candidate windows for this experiment, then " + _compare_fix(keep),
    )


def topology(keep: Keep) -> Check:
    comparison = keep.compared
    changed = sorted(set(str_list(comparison.result.get("actual_changes"))) & set(TOPOLOGY))
    if not changed:
        return not_applicable("no world size or parallel degree changed")
    per_device = comparison.inputs.get("per_device") is True
    return verdict(
        per_device,
        f"the topology changed ({', '.join(changed)}): compared per device-second (per_device=true)"
        if per_device
        else f"the topology changed ({', '.join(changed)}) but the comparison is of total throughput: "
        "a topology change is never an equivalent speedup",
        [comparison.id],
        "compare_benchmarks(..., declared_changes=[...], per_device=true), then " + keep.attach("comparison"),
    )


def declares_semantic(keep: Keep) -> bool:
    """The standing comparison declares a semantic change, and the experiment is no training change."""
    return bool(semantic_changes(keep.compared)) and keep.exp.classification != "training_change"


def classification(keep: Keep) -> Check:
    semantic = semantic_changes(keep.compared)
    return verdict(
        False,
        f"the comparison declares semantic changes ({', '.join(semantic)}): it changes what the model "
        f"learns, which a {keep.exp.classification} cannot keep",
        [keep.compared.id],
        "record_decision(action='open', classification='training_change', ...) for this change, with a "
        "task-quality result",
    )
