"""The gates a `keep` must pass, evaluated from ledger evidence only (never from what the agent says)."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from typing import Any, Literal

from pydantic import BaseModel

from perfgate.decisions.binding import TOPOLOGY
from perfgate.decisions.experiments import Experiment, load_experiments
from perfgate.decisions.verdict import OK_STATES, Check
from perfgate.evidence import EvidenceRecord, Ledger, canonical_json
from perfgate.evidence.access import as_dict, as_list, str_list

__all__ = [
    "MIN_WINDOWS",
    "Gate",
    "GateStatus",
    "evaluate_keep",
    "next_step",
    "summarize",
    "window_fingerprint",
]

MIN_WINDOWS = 3
GateStatus = Literal["passed", "failed", "not_applicable", "unavailable"]
"""``unavailable``: the figure the gate reads could not be observed here (a peak memory counter the device
lacks); it does not block a keep, and it is reported as unmeasured, never as passed."""


class Gate(BaseModel):
    name: str
    status: GateStatus
    reason: str
    evidence_ids: list[str]
    satisfy_with: str | None


def _gate(name: str, ok: bool, reason: str, ids: Iterable[str] = (), fix: str | None = None) -> Gate:
    return Gate(
        name=name,
        status="passed" if ok else "failed",
        reason=reason,
        evidence_ids=list(ids),
        satisfy_with=None if ok else fix,
    )


def _na(name: str, reason: str) -> Gate:
    return Gate(name=name, status="not_applicable", reason=reason, evidence_ids=[], satisfy_with=None)


def _from_check(name: str, check: Check) -> Gate:
    """The `Gate` of a verdict a gate's own module returned."""
    return (
        _gate(name, check.ok, check.reason, check.ids, check.fix)
        if check.applies
        else _na(name, check.reason)
    )


def _unavailable(name: str, reason: str, ids: Iterable[str] = ()) -> Gate:
    return Gate(name=name, status="unavailable", reason=reason, evidence_ids=list(ids), satisfy_with=None)


def _attach(exp: Experiment, role: str) -> str:
    return f"record_decision(action='attach', experiment_id='{exp.id}', evidence=[{{'id': ..., 'role': '{role}'}}])"


class _Evidence:
    """Records looked up once per evaluation."""

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger
        self.cache: dict[str, EvidenceRecord | None] = {}

    def get(self, evidence_id: str) -> EvidenceRecord | None:
        if evidence_id not in self.cache:
            self.cache[evidence_id] = self.ledger.get(evidence_id)
        return self.cache[evidence_id]


def _environment_gate(exp: Experiment, ev: _Evidence) -> Gate:
    ids = exp.ids("environment")
    good = [i for i in ids if (r := ev.get(i)) and r.tool == "collect_env" and r.state.value in OK_STATES]
    if good:
        return _gate("environment", True, "environment recorded by collect_env", good)
    return _gate(
        "environment",
        False,
        "no collect_env record is attached"
        if not ids
        else "attached environment evidence is not a usable collect_env record",
        ids,
        "collect_env(), then " + _attach(exp, "environment"),
    )


def window_fingerprint(
    record: EvidenceRecord, lookup: Callable[[str], EvidenceRecord | None]
) -> dict[str, Any] | None:
    """The measured environment of a benchmark window: its own fingerprint, else its collect_env record's."""
    value = as_dict(record.result.get("environment_fingerprint"))
    if any(v is not None for v in value.values()):  # an all-null fingerprint knows nothing: never "same"
        return value
    if record.tool == "import_benchmark":
        # imported, not launched by perfgate: an attached environment_id is the caller's word, not a
        # measurement of the run, so two imported sides are never "the same environment"
        return None
    if record.environment_id and (env := lookup(record.environment_id)) is not None:
        return as_dict(env.result.get("fingerprint")) or None
    return None


def _declared_contract(record: EvidenceRecord) -> Any:
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


def _window_gates(
    exp: Experiment, comparison: EvidenceRecord, ev: _Evidence, fewer_reason: str | None
) -> list[Gate]:
    baseline = str_list(comparison.inputs.get("baseline"))
    candidate = str_list(comparison.inputs.get("candidate"))
    problems: list[str] = []
    windows: list[EvidenceRecord] = []
    for side, ids in (("baseline", baseline), ("candidate", candidate)):
        for wid in ids:
            record = ev.get(wid)
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
    rerun = "run_benchmark_window(..., repeats=3) without profiling, then compare_benchmarks(...)"
    gates = [
        _gate(
            "windows_valid",
            not problems,
            "; ".join(problems) or "all windows executed, none profiled",
            baseline + candidate,
            rerun,
        )
    ]

    # independent evidence is a launch: windows of one process (same_process repeats) count once
    counts = {"baseline": _launch_count(baseline, ev), "candidate": _launch_count(candidate, ev)}
    few = [f"{side} ({n})" for side, n in counts.items() if n < MIN_WINDOWS]
    more = (
        f"run_benchmark_window(..., repeats={MIN_WINDOWS}) (separate launches, not same_process) for the "
        "short side, then compare_benchmarks(...) with all its windows"
    )
    if not few:
        gates.append(
            _gate(
                "window_count",
                True,
                f"at least {MIN_WINDOWS} separate launches per side",
                baseline + candidate,
            )
        )
    elif fewer_reason:
        gates.append(
            _gate(
                "window_count",
                True,
                f"fewer than {MIN_WINDOWS} launches on {', '.join(few)}: stated reason: {fewer_reason}",
            )
        )
    else:
        gates.append(
            _gate(
                "window_count",
                False,
                f"fewer than {MIN_WINDOWS} separate launches on {', '.join(few)} and no reason stated "
                "(windows of one launch count once)",
                baseline + candidate,
                more + ", or decide with fewer_windows_reason",
            )
        )

    from perfgate.benchmarking.vocabulary import REQUIRED_INVARIANTS, VOCABULARY, canonical_key

    lacking: dict[str, list[str]] = {}
    for w in windows:
        declared = {
            term.name
            for key in as_dict(as_dict(_declared_contract(w)).get("invariants"))
            if (term := VOCABULARY.get(canonical_key(key))) is not None
        }
        missing_keys = [k for k in REQUIRED_INVARIANTS if k not in declared]
        if missing_keys:
            lacking[w.id] = missing_keys
    gates.append(
        _gate(
            "required_invariants",
            not lacking,
            "every window declares " + ", ".join(REQUIRED_INVARIANTS)
            if not lacking
            else "; ".join(f"{wid} does not declare {', '.join(keys)}" for wid, keys in lacking.items()),
            list(lacking) or [w.id for w in windows],
            "re-run the windows with contract.invariants naming "
            + ", ".join(REQUIRED_INVARIANTS)
            + ", then compare_benchmarks(...) again",
        )
    )

    # invariants agree, except the semantic changes the comparison declared (a training change)
    declared = set(str_list(comparison.inputs.get("declared_changes")))
    semantic = {
        str(d.get("field")).removeprefix("contract.invariants.")
        for d in map(as_dict, as_list(comparison.result.get("differences")))
        if d.get("classification") == "declared_semantic"
    } & declared

    def invariants_of(w: EvidenceRecord) -> str:
        inv = as_dict(as_dict(_declared_contract(w)).get("invariants"))
        return canonical_json({k: v for k, v in inv.items() if k not in semantic})

    invariants = {invariants_of(w) for w in windows}
    per_side = [
        {canonical_json(as_dict(_declared_contract(w)).get("invariants")) for w in windows if w.id in ids}
        for ids in (set(baseline), set(candidate))
    ]
    same = len(invariants) <= 1 and all(len(side) <= 1 for side in per_side)
    gates.append(
        _gate(
            "invariants_match",
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
    )

    prints = {w.id: window_fingerprint(w, ev.get) for w in windows}
    missing = [wid for wid, fp in prints.items() if fp is None]
    distinct = {canonical_json(fp) for fp in prints.values() if fp is not None}
    if missing:
        gates.append(
            _gate(
                "same_environment",
                False,
                f"windows without an environment fingerprint: {', '.join(missing)}"
                + (
                    f" ({', '.join(imported)} imported, not launched by perfgate: the run's measured environment "
                    "is unknown, and unknown is never the same)"
                    if (imported := [w for w in missing if (r := ev.get(w)) and r.tool == "import_benchmark"])
                    else ""
                ),
                missing,
                rerun,
            )
        )
    elif len(distinct) <= 1:
        gates.append(
            _gate(
                "same_environment",
                True,
                "baseline and candidate ran in the same hardware/software environment",
                list(prints),
            )
        )
    else:
        gates.append(_environment_difference_gate(exp, comparison, windows, set(baseline), prints))

    return gates


def _launch_count(ids: list[str], ev: _Evidence) -> int:
    """Separate launches behind window records: each record's distinct ``windows[].launch`` values."""
    total = 0
    for wid in set(ids):
        record = ev.get(wid)
        windows = [as_dict(w) for w in as_list(record.result.get("windows"))] if record else []
        launches = {w.get("launch") for w in windows}
        total += max(1, len(launches))
    return total


def _changed_fields(prints: list[dict[str, Any]]) -> list[str]:
    keys = sorted({k for fp in prints for k in fp})
    return [k for k in keys if len({canonical_json(fp.get(k)) for fp in prints}) > 1]


_SAME_MACHINE = "re-run baseline and candidate windows on the same machine and software stack"


def _environment_difference_gate(
    exp: Experiment,
    comparison: EvidenceRecord,
    windows: list[EvidenceRecord],
    baseline: set[str],
    prints: dict[str, dict[str, Any] | None],
) -> Gate:
    """same_environment when the fingerprints differ: each side's windows must agree entirely, and between
    the sides only the fields the experiment's declared change shows in (benchmarking.observed) may
    differ. A semantic entry (precision) is exempt only for a training_change."""
    from perfgate.benchmarking.observed import entries_showing, explains
    from perfgate.benchmarking.vocabulary import VOCABULARY, canonical_key
    from perfgate.decisions.binding import declared_for_experiment

    ids = list(prints)
    sides = {
        side: [fp for w in windows if (w.id in baseline) == (side == "baseline") and (fp := prints[w.id])]
        for side in ("baseline", "candidate")
    }
    for side, fps in sides.items():
        if inside := _changed_fields(fps):
            return _gate(
                "same_environment",
                False,
                f"the {side} windows ran in different environments (differs in {', '.join(inside)}): one side "
                "is one environment, whatever was declared",
                ids,
                _SAME_MACHINE,
            )
    named = declared_for_experiment(exp, comparison)
    declared = [
        d
        for d in named
        if exp.classification == "training_change"
        or (term := VOCABULARY.get(canonical_key(d.removeprefix("env:")))) is None
        or term.cls == "execution"
    ]
    assert sides["baseline"] and sides["candidate"], "distinct fingerprints, each side uniform: both sides"
    base, cand = sides["baseline"][0], sides["candidate"][0]
    explained: list[str] = []
    unexplained: list[str] = []
    for field in _changed_fields([base, cand]):
        shown = f"{field} {base.get(field)!r} -> {cand.get(field)!r}"
        if (by := explains(declared, "fingerprint", field)) is not None:
            explained.append(f"{shown} ({by})")
        else:
            unexplained.append(field)
    if not unexplained:
        return _gate(
            "same_environment",
            True,
            "baseline and candidate ran in the same environment except where the declared change shows: "
            + "; ".join(explained),
            ids,
        )
    settable = {f: keys for f in unexplained if (keys := entries_showing("fingerprint", f))}
    fixed = [f for f in unexplained if f not in settable]
    what = "; ".join(f"{f} {base.get(f)!r} vs {cand.get(f)!r}" for f in unexplained)
    them = "them" if len(unexplained) > 1 else "it"
    semantic = [d for d in named if d not in declared]
    because = (
        f"the experiment's declared change ({', '.join(declared)}) does not set {them}"
        if declared
        else f"nothing the experiment declared ({exp.changed_variable}) sets {them}"
    ) + (f"; {', '.join(semantic)} is semantic: it may differ only in a training_change" if semantic else "")
    fixes: list[str] = []
    if fixed:
        fixes.append(f"{_SAME_MACHINE} ({', '.join(fixed)} must match)")
    for f, keys in settable.items():
        key = keys[0]
        fixes.append(
            f"re-run the candidate with the baseline's {f}; or, if {f} changed on purpose, open an experiment "
            f"with changed_variable={key!r} and compare with declared_changes=[{key!r}]"
        )
    return _gate(
        "same_environment",
        False,
        f"windows ran in different environments (differs in {', '.join(unexplained)}): {what}; {because}"
        + (f" (explained by the declared change: {'; '.join(explained)})" if explained else ""),
        ids,
        "; ".join(fixes),
    )


def _memory_gate(exp: Experiment, comparison: EvidenceRecord, ev: _Evidence, accepted: str | None) -> Gate:
    """Peak memory may not grow beyond noise unless the ledger records its acceptance (`decisions.memory`)."""
    from perfgate.decisions.memory import peak_memory_verdict

    baseline = str_list(comparison.inputs.get("baseline"))
    candidate = str_list(comparison.inputs.get("candidate"))
    verdict = peak_memory_verdict(exp, baseline, candidate, ev.get, accepted)
    ids = baseline + candidate
    if verdict.status == "unavailable":
        return _unavailable("peak_memory", verdict.reason, ids)
    fix = (
        "reduce the candidate's memory and re-run it, or decide 'revert'"
        if exp.memory_budget_bytes is not None
        else "if the growth is acceptable, decide keep again with memory_growth_reason='<why it is acceptable>' "
        "(recorded with the keep); else reduce the candidate's memory and re-run it, or decide 'revert'"
    )
    return _gate("peak_memory", verdict.status == "passed", verdict.reason, ids, fix)


def _comparison_gates(
    exp: Experiment, ev: _Evidence, fewer_reason: str | None, memory_accepted: str | None = None
) -> list[Gate]:
    ids = exp.ids("comparison")
    fix = "compare_benchmarks(baseline=[...], candidate=[...]), then " + _attach(exp, "comparison")
    latest = _latest_comparison(exp, ev)
    if latest is None:
        return [_gate("comparison", False, "no compare_benchmarks evidence is attached", ids, fix)]
    if (newer := _contradicting(latest, ev)) is not None:
        return [_contradicted_gate(exp, latest, newer)]
    screen = as_dict(latest.result.get("screen"))
    if screen:
        return [
            _gate(
                "comparison",
                False,
                f"{latest.id} screened {len(as_list(screen.get('entries')))} candidates: a keep rests on one "
                "candidate's own comparison, after the winner's validation",
                [latest.id],
                str(screen.get("next", "")).removeprefix("next: "),
            )
        ]
    verdict = latest.result.get("verdict")
    status = latest.result.get("status")
    speedup, low, high = (latest.result.get(k) for k in ("speedup", "ci_low", "ci_high"))
    figure = f"{speedup:.3f}x" if isinstance(speedup, float) else str(speedup)
    if isinstance(low, float) and isinstance(high, float):
        figure += f" (95% interval {low:.3f}-{high:.3f})"
    contradicted = as_dict(latest.result.get("job")).get("headline_contradicted")
    # the pooled figure alone would mislead: the contradiction follows it as a clause of its own
    also = f"; {contradicted}" if isinstance(contradicted, str) else ""
    more = (
        "more separate launches per side (run_benchmark_window repeats>=3, not same_process), then a new "
        "compare_benchmarks(...) over all of them and "
        + _attach(exp, "comparison")
        + "; or decide 'revert'/'inconclusive'"
    )
    if status == "incomparable" or latest.state.value == "failed":
        reasons = str_list(latest.result.get("reasons"))
        why = "the comparison is incomparable" + (f": {'; '.join(reasons)}" if reasons else "")
        gates = [
            _gate(
                "comparison",
                False,
                why,
                [latest.id],
                "re-run the candidate so that only declared changes differ, then " + fix,
            )
        ]
    elif verdict == "within_noise":
        gates = [
            _gate(
                "comparison",
                False,
                f"verdict is within_noise: {latest.id} measured speedup {figure}, not beyond noise{also}",
                [latest.id],
                more,
            )
        ]
    elif verdict == "insufficient_launches":
        gates = [
            _gate(
                "comparison",
                False,
                "verdict is insufficient_launches: fewer than 2 separate launches on a side, so "
                "launch-to-launch variation is unknown",
                [latest.id],
                more,
            )
        ]
    elif verdict != "improved":
        gates = [
            _gate(
                "comparison",
                False,
                f"verdict is {verdict}: {latest.id} measured speedup {figure}{also}",
                [latest.id],
                "decide 'revert' (the candidate is not faster)",
            )
        ]
    else:
        gates = [_gate("comparison", True, f"improved: speedup {figure}{also}", [latest.id])]
    gates += _binding_gates(exp, latest, ev)
    return [
        *gates,
        *_window_gates(exp, latest, ev, fewer_reason),
        _memory_gate(exp, latest, ev, memory_accepted),
        _timing_gate(exp, latest, ev),
        _replica_gate(exp, latest, ev),
        _job_gate(latest, ev),
        _checkpoint_resume_gate(exp, latest, ev),
        _backend_gate(exp, latest, ev),
    ]


def _backend_gate(exp: Experiment, comparison: EvidenceRecord, ev: _Evidence) -> Gate:
    """A named dispatcher backend or CUDA/MUSA graphs ran in a trace of the candidate's own command
    (`perfgate.decisions.backends`)."""
    from perfgate.decisions.backends import backend_check

    return _from_check(
        "backend", backend_check(exp, comparison, ev.ledger.records(tool="profile_segment"), ev.get)
    )


def _job_gate(comparison: EvidenceRecord, ev: _Evidence) -> Gate:
    """A keep whose whole job got slower says so; refused where the contract's objective is time_to_train."""
    job = as_dict(comparison.result.get("job"))
    ids = [str(i) for i in as_list(comparison.inputs.get("candidate"))]
    objectives = {
        str(as_dict(as_dict(_declared_contract(r)).get("invariants")).get("objective"))
        for i in ids
        if (r := ev.get(i)) is not None
    }
    wanted = "time_to_train" in objectives
    remeasure = (
        "run_benchmark_window(..., job=true) for both sides (same inputs otherwise), then compare_benchmarks(...) "
        "and attach it as the comparison"
    )
    if not job:
        if wanted:
            return _gate(
                "job_time",
                False,
                "the contract's objective is time_to_train, but the sides were not measured as whole jobs",
                [comparison.id],
                remeasure,
            )
        return _na("job_time", "the whole job was not measured (run_benchmark_window job=true measures it)")
    summary = str(job.get("summary"))
    if job.get("verdict") != "slower":
        return _gate("job_time", True, summary, [comparison.id])
    if wanted:
        return _gate(
            "job_time",
            False,
            summary + "; the contract's objective is time_to_train",
            [comparison.id],
            "shrink the part that grew (the job's parts say which), re-measure the candidate with job=true and "
            "compare again; or decide 'revert'",
        )
    return _gate(
        "job_time",
        True,
        summary + " (said, not gated: declare invariants.objective='time_to_train' to gate the job)",
        [comparison.id],
    )


def _checkpoint_resume_gate(exp: Experiment, comparison: EvidenceRecord, ev: _Evidence) -> Gate:
    """A layout or checkpointing change resumes from its own checkpoint (`perfgate.decisions.resume_gate`)."""
    from perfgate.decisions.resume_gate import resume_check

    return _from_check("checkpoint_resume", resume_check(exp, comparison, ev.ledger, ev.get))


def _replica_gate(exp: Experiment, comparison: EvidenceRecord, ev: _Evidence) -> Gate:
    """The candidate's data-parallel replicas held identical parameters after their last measured update."""
    ids = str_list(comparison.inputs.get("candidate"))
    bad: list[str] = []
    agreed = 0
    for wid in ids:
        record = ev.get(wid)
        if record is None:
            continue
        for raw in as_list(record.result.get("replicas")):
            check = as_dict(raw)
            if check.get("status") == "disagree":
                bad.append(f"{wid} launch {check.get('launch')}: {check.get('reason')}")
            agreed += check.get("status") == "agree"
    if bad:
        return _gate(
            "replicas",
            False,
            "the candidate's data-parallel replicas drifted apart: " + " | ".join(bad),
            ids,
            "make every rank apply the same update (the gradient all-reduce on every step), re-run the candidate "
            "with run_benchmark_window, then compare_benchmarks again and " + _attach(exp, "comparison"),
        )
    if agreed:
        return _gate(
            "replicas", True, f"the replicas agreed after the last update ({agreed} launch(es))", ids
        )
    return _na("replicas", "no multi-rank data-parallel candidate launch to compare replicas in")


def _timing_gate(exp: Experiment, comparison: EvidenceRecord, ev: _Evidence) -> Gate:
    """Every compared window's launch was corroborated by the server's own observation (or not observed at
    all, as for a Slurm launch or imported log), and its windows ran like the steady steps around them."""
    ids = [*str_list(comparison.inputs.get("baseline")), *str_list(comparison.inputs.get("candidate"))]
    bad: list[str] = []
    unobserved: list[str] = []
    noisy: list[str] = []
    for wid in ids:
        record = ev.get(wid)
        if record is None or record.tool != "run_benchmark_window":
            continue
        for raw in as_list(record.result.get("timing_checks")):
            check = as_dict(raw)
            status, consistency = check.get("status"), check.get("consistency")
            if status == "untrusted" or consistency == "measurement_dependent":
                why = "; ".join(str_list(check.get("reasons"))[:2])
                bad.append(f"{wid} launch {check.get('launch')}: {status}, {consistency} ({why})")
            elif status == "unobserved":
                unobserved.append(wid)
            if consistency == "noisy":
                noisy.append(str(check.get("next") or "longer windows settle it"))
    if bad:
        return _gate(
            "trusted_timing",
            False,
            "the server's observation contradicts the harness: " + " | ".join(bad),
            ids,
            "remove what changes the harness's clock or works differently while measured (see the approval's "
            "diff), re-run the candidate with run_benchmark_window, then compare_benchmarks again and "
            + _attach(exp, "comparison"),
        )
    # noisy: uneven steps on one side of the windows (load, a warm-up transient, periodic work), not a
    # contradiction; said, with what settles it, but never a refusal
    said = (
        f"; {len(noisy)} launch(es) noisy around their windows, not a contradiction: {noisy[0]}"
        if noisy
        else ""
    )
    if unobserved:
        return _gate(
            "trusted_timing",
            True,
            f"no contradiction; {len(set(unobserved))} window record(s) were not observed by the server (Slurm "
            "launches): their times are the harness's word" + said,
            ids,
        )
    return _gate(
        "trusted_timing", True, "the server's own clock corroborates every compared launch" + said, ids
    )


def _binding_gates(exp: Experiment, comparison: EvidenceRecord, ev: _Evidence) -> list[Gate]:
    """The comparison is about this experiment: its declared change, fresh candidate windows, not reused."""
    from perfgate.decisions.binding import (
        candidate_after_open_problems,
        declaration_for,
        declared_change_problems,
        reused_candidate_problems,
    )

    experiments = load_experiments(ev.ledger)
    semantic = [
        str(d.get("field"))
        for d in map(as_dict, as_list(comparison.result.get("differences")))
        if d.get("classification") == "declared_semantic"
    ]
    cmp_fix = (
        f"compare_benchmarks(baseline=[...], candidate=[...], declared_changes={declaration_for(exp.changed_variable)!r}) on "
        "candidate windows measured for this experiment, then " + _attach(exp, "comparison")
    )
    gates = [
        _gate(
            "declared_change",
            not (problems := declared_change_problems(exp, comparison)),
            "; ".join(problems)
            or f"the comparison declares the experiment's change ({exp.changed_variable})",
            [comparison.id],
            cmp_fix,
        ),
        _gate(
            "candidate_after_open",
            not (late := candidate_after_open_problems(exp, comparison, ev.get)),
            "; ".join(late) or "the candidate windows were measured after the experiment was opened",
            [comparison.id],
            "run_benchmark_window(...) for the candidate now, then " + cmp_fix,
        ),
        _gate(
            "evidence_not_reused",
            not (reused := reused_candidate_problems(exp, comparison, experiments, ev.get)),
            "; ".join(reused) or "the candidate windows support no other kept experiment",
            [comparison.id],
            "measure new candidate windows for this experiment, then " + cmp_fix,
        ),
    ]

    topology = sorted(set(str_list(comparison.result.get("actual_changes"))) & set(TOPOLOGY))
    if not topology:
        gates.append(_na("topology", "no world size or parallel degree changed"))
    else:
        per_device = comparison.inputs.get("per_device") is True
        gates.append(
            _gate(
                "topology",
                per_device,
                f"the topology changed ({', '.join(topology)}): compared per device-second (per_device=true)"
                if per_device
                else f"the topology changed ({', '.join(topology)}) but the comparison is of total throughput: "
                "a topology change is never an equivalent speedup",
                [comparison.id],
                "compare_benchmarks(..., declared_changes=[...], per_device=true), then "
                + _attach(exp, "comparison"),
            )
        )
    if semantic and exp.classification != "training_change":
        gates.append(
            _gate(
                "classification",
                False,
                f"the comparison declares semantic changes ({', '.join(semantic)}): it changes what the model "
                f"learns, which a {exp.classification} cannot keep",
                [comparison.id],
                "record_decision(action='open', classification='training_change', ...) for this change, with a "
                "task-quality result",
            )
        )
    return gates


def _failed_tensor_checks(exp: Experiment, ev: _Evidence) -> Gate | None:
    """With no passed check attached: the tensor checks of ``exp`` (attached, or run with its
    experiment_id) that failed, each named with its figures; None when none failed."""
    attached = set(exp.ids("correctness"))
    failed = [
        r
        for r in ev.ledger.records(tool="compare_tensors")
        if r.state.value == "failed" and (r.id in attached or r.inputs.get("experiment_id") == exp.id)
    ]
    if not failed:
        return None
    return _gate(
        "correctness",
        False,
        "; ".join(
            f"tensor check {r.id} failed ({r.result.get('summary') or 'no summary recorded'})" for r in failed
        ),
        [r.id for r in failed],
        "repair the candidate, compare_tensors(...) its own new dump at the same tolerance and give that check "
        "in the next keep's evidence (role 'correctness'); or, if the numerics changed on purpose, record_decision(action='open', hypothesis=..., "
        f"classification='training_change', changed_variable={exp.changed_variable!r}, quality={{...}})",
    )


def _correctness_gate(exp: Experiment, ev: _Evidence) -> Gate:
    from perfgate.decisions.binding import correctness_binding_problems, looser_than_declared

    declared = exp.tolerance
    fix = (
        "compare_tensors(reference=..., candidate=..., experiment_id=...)"
        + (" with allow_nonfinite=True" if declared.allow_nonfinite else "")
        + ", then "
        + _attach(exp, "correctness")
    )
    base = _passed_by(exp, ev, "correctness", "compare_tensors", "correctness", fix)
    if base.status == "failed":
        return _failed_tensor_checks(exp, ev) or base
    loose = [
        f"{cid} compared with {', '.join(why)}, looser than the experiment's declared tolerance "
        f"({declared.describe()}, fixed at open)"
        for cid in exp.ids("correctness")
        if (record := ev.get(cid)) is not None
        and record.tool == "compare_tensors"
        and (why := looser_than_declared(exp, record))
    ]
    comparisons = [
        r for i in exp.ids("comparison") if (r := ev.get(i)) is not None and r.tool == "compare_benchmarks"
    ]
    problems, ids = correctness_binding_problems(
        exp,
        load_experiments(ev.ledger),
        ev.get,
        comparisons[-1] if comparisons and exp.classification != "correctness_repair" else None,
        ev.ledger.records(tool="compare_tensors"),
    )
    if not loose and not problems:
        return _gate(
            "correctness",
            True,
            f"tensors match within the declared tolerance ({declared.describe()}); each side's file was "
            "dumped by a run of that side",
            base.evidence_ids,
        )
    failed = [r for i in ids if (r := ev.get(i)) is not None and r.state.value == "failed"]
    tolerances = [(r.inputs.get("atol"), r.inputs.get("rtol")) for r in failed]
    numeric = [
        (float(a), float(r))
        for a, r in tolerances
        if isinstance(a, (int, float)) and isinstance(r, (int, float))
    ]
    strictest = (min(a for a, _ in numeric), min(r for _, r in numeric)) if numeric else None
    only_failed = all("failed check" in p or "no check at the same" in p for p in problems)
    irrelevant = [
        p for p in problems if "first optimizer update" in p or "the training does not compute" in p
    ]
    if loose:
        next_call = fix
    elif irrelevant and len(irrelevant) == len(problems):
        # the files hold nothing the change could act on: comparing them again cannot help, new captures can
        next_call = (
            "run_benchmark_window(..., capture={'step': 1, 'what': ['parameters', 'gradients']}) for the baseline "
            "and for the candidate (the windows the comparison compares), compare_tensors(reference=<baseline "
            f"capture>, candidate=<candidate capture>, experiment_id='{exp.id}'), then "
            + _attach(exp, "correctness")
        )
    elif strictest is not None and only_failed:
        # a failed check binds: only a pass as strict as it (a repaired change) clears this gate, else the
        # change is not equivalent and is kept, if at all, as a training change
        next_call = (
            f"compare_tensors(reference=..., candidate=..., atol={strictest[0]:g}, rtol={strictest[1]:g}) on the "
            "repaired candidate's own dump, then " + _attach(exp, "correctness") + "; or, if the numerics "
            "changed on purpose, record_decision(action='open', hypothesis=..., classification='training_change', "
            f"changed_variable={exp.changed_variable!r}, quality={{...}})"
        )
    else:
        next_call = (
            "compare_tensors on the baseline's and the candidate's own tensor files at the declared "
            f"tolerance ({declared.describe()}) or stricter, then " + _attach(exp, "correctness")
        )
    return _gate(
        "correctness",
        False,
        "; ".join(loose + problems),
        list(dict.fromkeys(exp.ids("correctness") + ids)),
        next_call,
    )


def _equivalence_gate(exp: Experiment, ev: _Evidence) -> Gate:
    """An equivalent change's passed tensor checks stay within the per-dtype equivalence ceiling, which the
    baseline's own run-to-run spread may raise up to the table's maximum (`perfgate.decisions.spread`): a
    looser tolerance may pass, but then the numerics changed and only a training change can be kept on it."""
    from perfgate.decisions.equivalence import applied_tolerances, beyond_ceiling
    from perfgate.decisions.spread import BaselineSpread, Limit, baseline_spread, ceiling_for, check_step

    checks = [
        r
        for i in exp.ids("correctness")
        if (r := ev.get(i)) is not None and r.tool == "compare_tensors" and r.state.value == "passed"
    ]
    if not checks:
        return _na(
            "equivalence", "no passed tensor check is attached yet (the correctness gate asks for one)"
        )
    unknown = [r.id for r in checks if applied_tolerances(r) is None]
    if unknown:
        return _gate(
            "equivalence",
            False,
            f"{', '.join(unknown)} does not record the dtypes it compared, so its tolerance cannot be held to "
            "the per-dtype equivalence ceiling",
            unknown,
            "compare_tensors(...) again on the same files, then " + _attach(exp, "correctness"),
        )
    comparison = _latest_comparison(exp, ev) if exp.classification != "correctness_repair" else None
    problems: list[str] = []
    sources: dict[str, str] = {}
    unmeasured: list[BaselineSpread] = []
    all_checks = list(ev.ledger.records(tool="compare_tensors"))
    for r in checks:
        step = check_step(r, ev.get)
        spread = (
            baseline_spread(comparison, step, ev.get, all_checks)
            if comparison is not None and step is not None
            else None
        )

        def limit(dtype: str, spread: BaselineSpread | None = spread) -> Limit:
            return ceiling_for(dtype, spread)

        found = beyond_ceiling(r, limit)
        problems += found
        for dtype in sorted(applied_tolerances(r) or {}):
            sources.setdefault(dtype, limit(dtype).source)
            if found and spread is not None and spread.pair and dtype not in spread.measured:
                unmeasured.append(spread)
    training = (
        "record_decision(action='open', hypothesis=..., classification='training_change', "
        f"changed_variable={exp.changed_variable!r}, quality={{'metric': 'loss_last_ratio', 'direction': 'lower', "
        "'threshold': ...}) and keep that on task quality"
    )
    fix = training
    if unmeasured and unmeasured[0].pair:
        a, b = unmeasured[0].pair
        fix = (
            f"measure the baseline's own spread in one call: compare_tensors(reference={a!r}, candidate={b!r}, "
            "atol=0, rtol=0) (two baseline launches' dumps at the same step; nothing to attach), then decide keep "
            "again; if the check stays beyond the ceiling, " + training
        )
    return _gate(
        "equivalence",
        not problems,
        "; ".join(problems)
        + ": other numerics, which only a training_change with task-quality evidence can keep"
        if problems
        else "tensor checks within the equivalence ceiling ("
        + "; ".join(sources.values() or ["bit-exact"])
        + ")",
        [r.id for r in checks],
        fix,
    )


def _same_training_gate(exp: Experiment, ev: _Evidence) -> Gate:
    """An equivalent speedup trains what the baseline trains: the comparison found no other model, first
    inputs or loss at the same optimizer steps (`perfgate.benchmarking.training`, from what the harness
    recorded for every compared launch). What could not be checked (no loss recorded: a custom loop
    without ``backward()`` on a scalar) is named and left to the tensor and audit gates."""
    comparisons = [
        r for i in exp.ids("comparison") if (r := ev.get(i)) is not None and r.tool == "compare_benchmarks"
    ]
    if not comparisons or comparisons[-1].result.get("verdict") is None:
        return _na("same_training", "no comparison with a verdict is attached yet (the comparison gate asks)")
    latest = comparisons[-1]
    differs = str_list(latest.result.get("training_may_differ"))
    unchecked = str_list(latest.result.get("training_unchecked"))
    if differs:
        return _gate(
            "same_training",
            False,
            "the candidate trains differently: " + "; ".join(differs),
            [latest.id],
            "if that is the point, record_decision(action='open', classification='training_change', "
            f"changed_variable={exp.changed_variable!r}, quality={{'metric': 'loss_last_ratio', "
            "'direction': 'lower', 'threshold': ...}) and keep that on task quality; otherwise find what "
            "moves it (the first step named: seed, data order, learning rate, loss scaling), re-run the "
            "candidate and compare_benchmarks again",
        )
    return _gate(
        "same_training",
        True,
        "same model, first inputs and loss at every common step"
        + (f" (not checked: {'; '.join(unchecked)})" if unchecked else ""),
        [latest.id],
    )


def _quality_gate(exp: Experiment, ev: _Evidence) -> Gate:
    from perfgate.decisions.binding import QUALITY_KINDS, quality_problems

    comparisons = [
        r for i in exp.ids("comparison") if (r := ev.get(i)) is not None and r.tool == "compare_benchmarks"
    ]
    problems, good = quality_problems(exp, comparisons[-1] if comparisons else None, ev.get)
    tool = ", ".join(QUALITY_KINDS.values())
    return _gate(
        "task_quality",
        not problems,
        "; ".join(problems)
        or "a passed task-quality result about the candidate windows meets "
        + (exp.quality.describe() if exp.quality else "its criteria"),
        good or exp.ids("quality"),
        f"{tool}(evidence_id=<candidate window>, baseline_id=<baseline window>, loss_tolerance=...), then "
        + _attach(exp, "quality"),
    )


def _passed_by(exp: Experiment, ev: _Evidence, role: str, tool: str | None, name: str, fix: str) -> Gate:
    ids = exp.ids(role)  # type: ignore[arg-type]  # role names are checked by the input model
    records = [(i, ev.get(i)) for i in ids]
    failed = [i for i, r in records if r is not None and r.state.value == "failed"]
    good = [
        i
        for i, r in records
        if r is not None and r.state.value == "passed" and (tool is None or r.tool == tool)
    ]
    if failed:
        return _gate(name, False, f"attached {role} evidence failed: {', '.join(failed)}", failed, fix)
    if not good:
        what = f"passed {tool} evidence" if tool else f"passed {role} evidence"
        return _gate(name, False, f"no {what} is attached in role {role}", ids, fix)
    return _gate(name, True, f"{role} evidence passed", good)


def evaluate_keep(
    exp: Experiment,
    ledger: Ledger,
    fewer_windows_reason: str | None = None,
    *,
    rollback: str | None = None,
    memory_growth_reason: str | None = None,
) -> list[Gate]:
    """Every gate for keeping ``exp``, each with its status; the keep is accepted when none failed
    (``unavailable`` and ``not_applicable`` do not block). ``rollback`` and ``memory_growth_reason`` are
    what the decide call gives (None for ``show``)."""
    ev = _Evidence(ledger)
    gates = [_environment_gate(exp, ev)]
    tensors = _correctness_gate(exp, ev)
    if exp.classification == "correctness_repair":
        gates.append(tensors)
        gates.append(_equivalence_gate(exp, ev))
        gates.append(_new_baseline_gate(exp, ev))
    else:
        gates.extend(_comparison_gates(exp, ev, fewer_windows_reason, memory_growth_reason))
        if exp.classification == "system_optimization":
            gates.append(tensors)
            gates.append(_equivalence_gate(exp, ev))
            gates.append(_same_training_gate(exp, ev))
        else:
            gates.append(
                _na("correctness", "a training change alters numerics by design; task quality decides")
            )
            gates.append(_quality_gate(exp, ev))
    implied = _implied_data_change(exp, ev)
    audit_gated = bool(exp.touches_data or implied)
    if audit_gated:
        audit = _audit_gate(exp, ev)
        if implied and not exp.touches_data:
            # measured, not declared: the reason says why the audit applies
            audit.reason = f"{audit.reason} (required: {'; '.join(implied)}; touches_data was not declared)"
        gates.append(audit)
    else:
        gates.append(
            _na("sample_audit", "the change does not touch data loading or sharding (declared and measured)")
        )
    gates.append(_failed_checks_gate(exp, ev, audit_gated))
    gates.append(_validation_gate(exp, ev))
    gates.append(_rollback_gate(exp, ev, rollback))
    gates.append(_runs_finished_gate(exp, ev))
    report = ledger.verify()
    gates.append(
        _gate(
            "ledger_integrity",
            report.ok,
            "the ledger verifies: no record or artifact was edited"
            if report.ok
            else "; ".join(report.errors[:5]),
            [],
            report.next_step
            or "restore the edited evidence or re-measure; an edited ledger cannot support a keep",
        )
    )
    return gates


def _latest_comparison(exp: Experiment, ev: _Evidence) -> EvidenceRecord | None:
    """The comparison attached last (`_contradicting` finds a later one in the ledger that overrules it)."""
    comparisons = [
        r for i in exp.ids("comparison") if (r := ev.get(i)) is not None and r.tool == "compare_benchmarks"
    ]
    return comparisons[-1] if comparisons else None


def _verdict_text(record: EvidenceRecord) -> str:
    speedup = record.result.get("speedup")
    figure = f" at {speedup:.3f}x" if isinstance(speedup, float) else ""
    if record.result.get("status") == "incomparable" or record.state.value == "failed":
        return "incomparable"
    return f"{record.result.get('verdict')}{figure}"


def _contradicting(comparison: EvidenceRecord, ev: _Evidence) -> EvidenceRecord | None:
    """The newest later comparison over the same windows (plus any more), when it does not say improved:
    a keep rests on the latest comparison that covers its windows, never on an earlier one it overrules."""
    if comparison.result.get("verdict") != "improved" or as_dict(comparison.result.get("screen")):
        return None
    base, cand = (set(str_list(comparison.inputs.get(k))) for k in ("baseline", "candidate"))
    covering = [
        r
        for r in ev.ledger.records(tool="compare_benchmarks")
        if r.seq > comparison.seq
        and not as_dict(r.result.get("screen"))
        and base <= set(str_list(r.inputs.get("baseline")))
        and cand <= set(str_list(r.inputs.get("candidate")))
    ]
    if not covering:
        return None
    newest = covering[-1]
    improved = newest.result.get("verdict") == "improved" and newest.state.value in OK_STATES
    return None if improved else newest


def _contradicted_gate(exp: Experiment, older: EvidenceRecord, newer: EvidenceRecord) -> Gate:
    more = sum(
        len(str_list(newer.inputs.get(k))) - len(str_list(older.inputs.get(k)))
        for k in ("baseline", "candidate")
    )
    return _gate(
        "comparison",
        False,
        f"comparison {older.id} ({_verdict_text(older)}) is overruled by {newer.id}, a later comparison over the "
        f"same windows"
        + (f" plus {more} more" if more else "")
        + f" that says {_verdict_text(newer)}: a keep "
        "rests on the latest comparison that covers its windows",
        [older.id, newer.id],
        f"{_attach(exp, 'comparison').replace('...', repr(newer.id), 1)} and decide on what it says (more separate "
        "launches per side and a new compare_benchmarks over all of them if it is within_noise), or decide "
        "'revert'/'inconclusive'",
    )


def _audit_gate(exp: Experiment, ev: _Evidence) -> Gate:
    """A passed audit of the candidate's own launches (`decisions.audits`), none failed."""
    from perfgate.decisions.audits import RECORD_HOW, audit_binding

    base = _passed_by(exp, ev, "audit", "audit_samples", "sample_audit", RECORD_HOW)
    if base.status == "failed":
        if any((r := ev.get(i)) is not None and r.state.value == "failed" for i in exp.ids("audit")):
            # a failed audit stays with this experiment: the repaired change is a new one
            base.satisfy_with = (
                "fix the sampling the audit names, then record_decision(action='open', ...) a new experiment "
                "for the repaired change with its own runs and audit; or decide 'revert'"
            )
        return base
    binding = audit_binding(exp, _latest_comparison(exp, ev), ev.get)
    if binding.good:
        return _gate(
            "sample_audit",
            True,
            "a passed audit of the candidate's own launches"
            + (f"; {'; '.join(binding.notes)}" if binding.notes else "")
            + (f" (not counted: {'; '.join(binding.problems)})" if binding.problems else ""),
            binding.good,
        )
    return _gate("sample_audit", False, "; ".join(binding.problems), exp.ids("audit"), binding.fix)


_CHECK_TOOLS = {
    "compare_tensors": "correctness",
    "audit_samples": "audit",
    "check_training_health": "quality",
    "compare_benchmarks": "comparison",
}
"""Tools whose failed record is a failed check, and the role whose gate reads it."""


def _failed_checks_gate(exp: Experiment, ev: _Evidence, audit_gated: bool) -> Gate:
    """A failed check attached in any role blocks: one no other gate reads (under ``note``, ``profile``,
    another check's role, or a role whose gate does not apply to this experiment) is named here.

    A comparison is read at its latest; a training change's failed tensor check is what changed numerics
    look like (its keep rests on task quality), so neither blocks here."""
    read_by_gate = {
        "correctness": exp.classification != "training_change",
        "audit": audit_gated,
        "quality": exp.classification == "training_change",
        "comparison": exp.classification != "correctness_repair",
    }
    blocking: list[str] = []
    for link in exp.links:
        record = ev.get(link.evidence_id)
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
        return _gate("failed_checks", True, "no failed check is attached in a role its gate does not read")
    return _gate(
        "failed_checks",
        False,
        "a failed check blocks a keep in any role: " + "; ".join(blocking[:5]),
        [b.split(" ", 1)[0] for b in blocking],
        "a failed check stays with the experiment: fix what it found, then record_decision(action='open', ...) "
        "a new experiment for the repaired change with its own evidence; or decide 'revert' or 'inconclusive'",
    )


def _validation_gate(exp: Experiment, ev: _Evidence) -> Gate:
    from perfgate.decisions.validation import validation_verdict

    steps = exp.validation_steps
    if steps is None:
        return _na("validation_run", "the experiment asked for no validation run at open (validation_steps)")
    verdict = validation_verdict(exp, steps, _latest_comparison(exp, ev), ev.get)
    if verdict.unhealthy:
        fix = "fix what makes the candidate's training unhealthy and re-run it, or decide 'revert'"
    else:
        fix = (
            f"run_benchmark_window(command=<the candidate's command>, contract=<its contract>, warmup_steps=5, "
            f"measure_steps={steps}, repeats=1), then decide keep again with evidence=[{{'id': <that window>, "
            "'role': 'candidate'}]"
        )
    return _gate("validation_run", verdict.ok, verdict.reason, verdict.ids, fix)


def _rollback_gate(exp: Experiment, ev: _Evidence, rollback: str | None) -> Gate:
    """The keep's rollback undoes what the candidate changed (`perfgate.decisions.rollback`)."""
    from perfgate.decisions.rollback import rollback_check

    if rollback is None:
        return _na("rollback", "named by the keep itself (decide's rollback), checked then")
    comparison = _latest_comparison(exp, ev)
    sides = (
        [str_list(comparison.inputs.get(side)) for side in ("baseline", "candidate")]
        if comparison is not None
        else [exp.ids("baseline"), exp.ids("candidate")]
    )
    baseline, candidate = ([r for i in ids if (r := ev.get(i)) is not None] for ids in sides)
    return _from_check("rollback", rollback_check(rollback, ev.ledger.workspace, baseline, candidate))


def _runs_finished_gate(exp: Experiment, ev: _Evidence) -> Gate:
    """Every detached run the keep cites (attached, or named by what is attached) has a recorded result."""
    from perfgate.decisions.runs import unfinished_run_problems

    problems = unfinished_run_problems([link.evidence_id for link in exp.links], ev.ledger, ev.get)
    return _gate(
        "runs_finished",
        not problems,
        "; ".join(problems) or "no cited run is unfinished: every detached run's result is recorded",
        [link.evidence_id for link in exp.links],
        "benchmark_run(action='wait', run_id=...) until the run ends, then benchmark_run(action='result', "
        "run_id=...); cite the record it returns, not the start record",
    )


def _implied_data_change(exp: Experiment, ev: _Evidence) -> list[str]:
    """Why the latest attached comparison shows a data-path change, whatever the experiment declared."""
    from perfgate.decisions.data_path import data_path_changes

    comparisons = [
        r for i in exp.ids("comparison") if (r := ev.get(i)) is not None and r.tool == "compare_benchmarks"
    ]
    return data_path_changes(comparisons[-1], ev.get, ev.ledger.workspace) if comparisons else []


def _new_baseline_gate(exp: Experiment, ev: _Evidence) -> Gate:
    ids = exp.ids("candidate") or exp.ids("baseline")
    windows = [r for i in ids if (r := ev.get(i)) is not None and r.tool == "run_benchmark_window"]
    good = [w.id for w in windows if not w.profiled and w.state.value in OK_STATES]
    return _gate(
        "new_baseline",
        bool(good),
        "the repaired run's windows become the new baseline"
        if good
        else "no executed, non-profiled windows of the repaired run",
        good or ids,
        "run_benchmark_window(...) on the repaired code, then " + _attach(exp, "candidate"),
    )


_CLOSE = "or decide 'revert', 'inconclusive' or 'blocked'"
"""The way out of every refused keep, offered once."""


def next_step(gates: list[Gate]) -> str:
    """The refusal's ``next:`` line: the first unmet gate's fix, then closing the experiment as the
    alternative unless that fix already offers a decision (never the same choice twice)."""
    first = next((g.satisfy_with for g in gates if g.status == "failed" and g.satisfy_with), None)
    if first is None:
        return f"next: add the evidence named below, {_CLOSE}"
    if re.search(r"\b(decide|revert)\b", first):
        return f"next: {first}"
    return f"next: {first}, {_CLOSE}"


def summarize(gates: list[Gate]) -> str:
    failed = [g for g in gates if g.status == "failed"]
    lines = [f"- {g.name}: {g.reason}" + (f" -> {g.satisfy_with}" if g.satisfy_with else "") for g in failed]
    return "\n".join(lines)
