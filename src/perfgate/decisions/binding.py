"""What binds a comparison and its quality evidence to their experiment: the declared change, candidate
windows measured after open and not reused, the topology, and task quality.

Each is evaluated from the ledger: the experiment (opened before its candidate evidence), the comparison
it rests on, and every other experiment that tried the same changed variable. Tensor checks are bound to
their runs in `perfgate.decisions.tensor_binding`.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from perfgate.decisions.experiments import Experiment
from perfgate.evidence import EvidenceRecord
from perfgate.evidence.access import as_dict, str_list

__all__ = [
    "EVAL_PREFIX",
    "QUALITY_KINDS",
    "QUALITY_METRICS",
    "TOPOLOGY",
    "Lookup",
    "candidate_after_open_problems",
    "canonical_name",
    "declaration_for",
    "declared_change_problems",
    "declared_for_experiment",
    "named_changes",
    "quality_problems",
    "reused_candidate_problems",
]

Lookup = Callable[[str], EvidenceRecord | None]

QUALITY_KINDS: dict[str, str] = {"training_health": "check_training_health"}
"""Task-quality evidence the gate accepts: ``result.quality_kind`` -> the tool that produces it."""

EVAL_PREFIX = "eval:"
"""Quality metrics reported by the run itself (perfgate.harness.report_metric) carry this prefix."""

QUALITY_METRICS: dict[str, str] = {
    "loss_last": "the candidate's final loss (mean of the last quarter of its measured losses)",
    "loss_last_ratio": "the candidate's final loss over the baseline's (check_training_health with baseline_id)",
    "loss_trend": "loss_last / loss_first - 1 over the candidate's measured steps (negative: the loss falls)",
    "eval:<name>": "a metric the launched candidate run reported with perfgate.harness.report_metric(name, "
    "value), e.g. eval:accuracy",
}
"""Metrics a quality record reports in ``result.metrics``: what a training change may declare at open."""

_DEGREES = ("tensor_parallel", "pipeline_parallel", "context_parallel", "expert_parallel")
_IMPLIED: dict[str, set[str]] = {
    "microbatch": {"accumulation"},
    "accumulation": {"microbatch"},
    # at a fixed world size and global batch, another parallel degree changes the data-parallel size, and
    # with it the microbatch or the accumulation
    **{d: {"data_parallel", "microbatch", "accumulation"} for d in _DEGREES},
    "world_size": {"data_parallel", "microbatch", "accumulation"},
}
TOPOLOGY = ("world_size", "data_parallel", *_DEGREES)
"""Execution settings whose change is a topology change: kept only on a per-device comparison."""
_GENERIC = {"code", "argv"}


def canonical_name(name: str) -> str:
    """A change's vocabulary name (``env:`` dropped, synonyms resolved), else its canonical key."""
    from perfgate.benchmarking.workload.vocabulary import VOCABULARY, canonical_key

    key = canonical_key(name[4:] if name.lower().startswith("env:") else name)
    term = VOCABULARY.get(key)
    return term.name if term is not None else key


def _mentioned(changed_variable: str) -> set[str]:
    """Names the changed variable mentions: each token canonical, and its vocabulary entry."""
    tokens = [t for t in re.split(r"[^A-Za-z0-9_:.]+", changed_variable) if t]
    names = {canonical_name(t) for t in [changed_variable, *tokens]}
    return names | {n for name in names for n in _IMPLIED.get(name, set())}


def declared_for_experiment(exp: Experiment, comparison: EvidenceRecord) -> list[str]:
    """The comparison's declared changes that are the experiment's changed variable (or what it implies):
    only these may explain a difference between the sides at keep."""
    allowed = _mentioned(exp.changed_variable)
    return [d for d in str_list(comparison.inputs.get("declared_changes")) if canonical_name(d) in allowed]


def named_changes(exp: Experiment, comparison: EvidenceRecord) -> set[str]:
    """Vocabulary names (or names as written) of what the experiment's changed variable and the comparison's
    declared changes name."""
    return _mentioned(exp.changed_variable) | {
        canonical_name(d) for d in str_list(comparison.inputs.get("declared_changes"))
    }


def declaration_for(changed_variable: str) -> list[str]:
    """What a comparison declares for this changed variable: the vocabulary names and kinds ('code',
    'argv') it mentions, else the variable as written."""
    from perfgate.benchmarking.workload.vocabulary import VOCABULARY

    tokens = [t for t in re.split(r"[^A-Za-z0-9_:.]+", changed_variable) if t]
    known = {VOCABULARY[t].name for t in map(canonical_name, [changed_variable, *tokens]) if t in VOCABULARY}
    known |= {t for t in map(canonical_name, [changed_variable, *tokens]) if t in _GENERIC}
    return sorted(known) or [changed_variable]


def declared_change_problems(exp: Experiment, comparison: EvidenceRecord) -> list[str]:
    """The comparison must declare exactly the experiment's changed variable (and what it implies).

    The changed variable may be prose ("DataLoader num_workers 0 -> 2"): every declared name must be what
    it names (a token or its vocabulary entry).
    """
    names = str_list(comparison.inputs.get("declared_changes"))
    declared = [d for d in names if canonical_name(d) not in _GENERIC]
    allowed = _mentioned(exp.changed_variable)
    if not declared:
        # A code or command-line change is declared by its kind ('code', 'argv'): compare_benchmarks refuses
        # the comparison unless that difference is what it measured, so the declaration is checked there.
        generic = {canonical_name(d) for d in names} & _GENERIC & allowed
        if generic:
            return []
        wanted = declaration_for(exp.changed_variable)
        return [
            f"the comparison declares no change that is the experiment's {exp.changed_variable!r}: compare "
            f"windows that differ in it, with declared_changes={wanted!r}"
        ]
    extra = [d for d in declared if canonical_name(d) not in allowed]
    if extra:
        return [
            f"the comparison declared {sorted(declared)}, but the experiment's one changed variable is "
            f"{exp.changed_variable!r} ({sorted(extra)} is another change)"
        ]
    return []


def candidate_after_open_problems(exp: Experiment, comparison: EvidenceRecord, lookup: Lookup) -> list[str]:
    """Candidate windows must be measured after the experiment was opened."""
    problems: list[str] = []
    for wid in str_list(comparison.inputs.get("candidate")):
        record = lookup(wid)
        if record is None:
            continue
        started = record.started_at or record.created_at
        if record.seq < exp.opened_seq or started < exp.opened_at:
            problems.append(
                f"candidate window {wid} was measured at {started}, before the experiment was opened "
                f"({exp.opened_at})"
            )
    return problems


def reused_candidate_problems(
    exp: Experiment, comparison: EvidenceRecord, experiments: dict[str, Experiment], lookup: Lookup
) -> list[str]:
    """Candidate windows already kept as another experiment's candidate evidence."""
    mine = set(str_list(comparison.inputs.get("candidate")))
    problems: list[str] = []
    for other in experiments.values():
        if other.id == exp.id or not any(d.decision == "keep" for d in other.decisions):
            continue
        for cid in other.ids("comparison"):
            record = lookup(cid)
            theirs: set[str] = set(str_list(record.inputs.get("candidate"))) if record else set()
            shared = sorted(mine & theirs)
            if shared:
                problems.append(f"candidate windows {shared} already support the kept experiment {other.id}")
    return problems


def quality_problems(
    exp: Experiment, comparison: EvidenceRecord | None, lookup: Lookup
) -> tuple[list[str], list[str]]:
    """Task quality is its own evidence: a passed record of a known quality kind, from the tool that makes
    it, about this comparison's candidate windows, whose metric meets the criteria declared at open."""
    candidates: set[str] = set(str_list(comparison.inputs.get("candidate"))) if comparison else set()
    criteria = exp.quality
    good: list[str] = []
    problems: list[str] = []
    failed: list[str] = []
    for qid in exp.ids("quality"):
        record = lookup(qid)
        if record is None:
            continue
        kind: Any = record.result.get("quality_kind")
        metrics = as_dict(record.result.get("metrics"))
        value = metrics.get(criteria.metric) if criteria is not None else None
        if kind not in QUALITY_KINDS or QUALITY_KINDS[kind] != record.tool:
            problems.append(
                f"{qid} ({record.tool}) is not task-quality evidence: attach a {', '.join(QUALITY_KINDS.values())} "
                "result"
            )
        elif record.state.value != "passed":
            failed.append(f"quality evidence {qid} is {record.state.value}")
        elif candidates and record.inputs.get("evidence_id") not in candidates:
            problems.append(
                f"quality evidence {qid} checks {record.inputs.get('evidence_id')}, not a candidate window of the comparison"
            )
        elif criteria is None:
            problems.append(
                f"the experiment declared no task-quality criteria at open, so {qid} cannot be judged: open the "
                "training change again with quality={'metric': ..., 'direction': ..., 'threshold': ...}"
            )
        elif not isinstance(value, (int, float)) or isinstance(value, bool):
            have = ", ".join(sorted(metrics)) or "none"
            problems.append(
                f"quality evidence {qid} does not report {criteria.metric!r}, the metric declared at open "
                f"(it reports: {have})"
            )
        elif not criteria.met_by(float(value)):
            failed.append(
                f"quality evidence {qid}: {criteria.metric} = {float(value):.6g} misses the criterion declared at "
                f"open ({criteria.describe()})"
            )
        else:
            good.append(qid)
    if failed:
        return failed, good
    if good:
        return [], good
    return problems or ["no task-quality result is attached in role quality"], good
