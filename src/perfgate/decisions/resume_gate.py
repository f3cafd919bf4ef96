"""The keep's ``checkpoint_resume`` gate: a parallel layout or checkpointing change resumes from its own
checkpoint and trains on as the uninterrupted run does.

First, where both sides' windows saved a checkpoint, what they saved is compared (`perfgate.decisions
.saved_state`): a checkpoint the baseline saved must load into the candidate strictly, or the keep is refused
naming the keys. A resume is then needed only when the change declares a layout entry (`LAYOUT_TERMS`), its
changed variable names checkpointing, the saved state differs between the sides, or the change's own changed
lines save or load checkpoints (`perfgate.decisions.checkpoint_code`); a saving line the change left alone is
never enough. Where no save was observed on both sides, a changed file whose changed lines cannot be read and
which saves or loads counts too, and measuring both sides with job=true settles it. It reads the latest
resume launch of a candidate window (`run_benchmark_window(resume_of=...)`, judged by
`perfgate.benchmarking.runs.checkpoint_resume`) and, where both runs captured tensors at one aligned step, a
tensor check of exactly that pair.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from perfgate.benchmarking.workload.vocabulary import VOCABULARY, canonical_key
from perfgate.decisions.binding import TOPOLOGY, declaration_for, declared_for_experiment
from perfgate.decisions.checkpoint_code import saving_files, touched_checkpointing
from perfgate.decisions.equivalence import stricter_than_defaults
from perfgate.decisions.experiments import Experiment
from perfgate.decisions.saved_state import StateDifference, saved_state_difference
from perfgate.decisions.tensor_binding import binds_files, looser_than_declared
from perfgate.decisions.verdict import OK_STATES, Check
from perfgate.evidence import EvidenceRecord, Ledger, canonical_json
from perfgate.evidence.access import as_dict, as_list, str_list

__all__ = ["LAYOUT_TERMS", "resume_check"]

Lookup = Callable[[str], EvidenceRecord | None]


LAYOUT_TERMS = (*TOPOLOGY, "sharding")
"""Vocabulary entries of a parallel layout: the topology settings and the sharding strategy. A change of any
of them moves what each rank's checkpoint holds (the number of ranks too: it sets how many shards a
checkpoint is saved in)."""
_CHECKPOINT_WORD = re.compile(r"checkpoint|ckpt", re.IGNORECASE)


def _why(
    exp: Experiment, comparison: EvidenceRecord, state: StateDifference, lookup: Lookup, workspace: Path
) -> tuple[str | None, bool]:
    """Why the change must show that checkpoints still resume: a layout entry it declares, checkpointing
    named by its changed variable, a saved state that differs between the sides, or changed lines that save
    or load checkpoints (`perfgate.decisions.checkpoint_code`); where the saved state was not observed on
    both sides, also a change whose lines cannot be read in a file that saves or loads. None: none of these.
    The flag: the reason is one that observing both sides' saves (job=true) would settle."""
    named = {*declaration_for(exp.changed_variable), *declared_for_experiment(exp, comparison)}
    layout = sorted(
        term.name
        for d in named
        if (term := VOCABULARY.get(canonical_key(d.removeprefix("env:")))) is not None
        and term.name in LAYOUT_TERMS
    )
    if layout:
        return f"the change declares the parallel layout ({', '.join(layout)})", False
    if _CHECKPOINT_WORD.search(exp.changed_variable):
        return f"the changed variable names checkpointing ({exp.changed_variable!r})", False
    if state.differs:
        return (
            f"the state the candidate saves differs from the baseline's ({', '.join(state.evidence)}), though "
            "the keys, shapes and dtypes read of it load strictly",
            False,
        )
    touched, unread = touched_checkpointing(comparison, lookup, workspace)
    if touched:
        return f"the code change's own lines touch checkpointing: {'; '.join(touched[:3])}", False
    if not state.observed and (moved := _structure_moved(comparison, lookup, workspace)):
        return moved, True
    if unread and not state.observed:
        return (
            f"the code change may touch checkpointing: {'; '.join(unread[:3])}, and no save was observed on "
            "both sides to compare what they hold",
            True,
        )
    return None, False


def _structure_moved(comparison: EvidenceRecord, lookup: Lookup, workspace: Path) -> str | None:
    """Where no save was observed: the model's parameters changed names, shapes or dtypes between the sides
    (the harness's structure digest) in a job whose code saves or loads checkpoints, so a checkpoint the
    baseline saved may no longer load; the sides' saves, once observed, settle it."""
    firsts = [
        next((r for i in str_list(comparison.inputs.get(side)) if (r := lookup(i)) is not None), None)
        for side in ("baseline", "candidate")
    ]
    base, cand = firsts
    if base is None or cand is None:
        return None
    digests = [as_dict(r.result.get("model")).get("structure") for r in (base, cand)]
    if not all(isinstance(d, str) for d in digests) or digests[0] == digests[1]:
        return None
    saving = saving_files(cand, workspace)
    if not saving:
        return None
    return (
        f"the model's parameters changed names, shapes or dtypes (structure {str(digests[0])[:8]} -> "
        f"{str(digests[1])[:8]}) and the job saves checkpoints ({'; '.join(saving[:2])}): a checkpoint the "
        "baseline saved may no longer load, and no save was observed on both sides to compare what they hold"
    )


def _incompatible(state: StateDifference, command: list[str]) -> Check:
    """A checkpoint the baseline saved would not load into the candidate: the keep is refused, resume or no
    resume (a resume of the candidate's own checkpoint says nothing of the checkpoints already saved)."""
    read = "" if state.complete else " (among the keys the harness read of each state)"
    return Check(
        True,
        False,
        f"a checkpoint the baseline saved does not load into the candidate strictly{read}: {state.describe()}",
        state.evidence,
        "keep what the candidate saves loadable from the baseline's checkpoints: the same keys (module and "
        "parameter names), shapes and dtypes; then measure the candidate again with job=true"
        + (f" (run_benchmark_window(command={command!r}, job=true, ...))" if command else "")
        + " so its save is compared, and keep again",
    )


def resume_check(exp: Experiment, comparison: EvidenceRecord, ledger: Ledger, lookup: Lookup) -> Check:
    """A checkpoint the baseline saved loads into the candidate (`perfgate.decisions.saved_state`); and a
    layout or checkpointing change resumes from its own checkpoint: the latest resume launch of a candidate
    window (`run_benchmark_window(resume_of=...)`, `perfgate.benchmarking.runs.checkpoint_resume`) loaded a file
    that run saved and trained on as the uninterrupted run did."""
    state = saved_state_difference(comparison, lookup)
    windows = [r for i in str_list(comparison.inputs.get("candidate")) if (r := lookup(i)) is not None]
    target = next((r for r in windows if r.inputs.get("job")), None)
    command = str_list(target.inputs.get("command")) if target is not None else []
    if state.differs and not state.loads:
        return _incompatible(state, str_list(windows[0].inputs.get("command")) if windows else [])
    why, observable = _why(exp, comparison, state, lookup, ledger.workspace)
    if why is None:
        return Check(
            False,
            True,
            "the change declares no parallel layout entry, does not name checkpointing, and its changed lines "
            "save or load no checkpoint"
            + (
                f"; the state it saves is the baseline's (same keys, shapes and dtypes: {', '.join(state.evidence)})"
                if state.observed
                else ""
            ),
            state.evidence,
        )
    candidate = str_list(comparison.inputs.get("candidate"))
    baseline = set(str_list(comparison.inputs.get("baseline")))
    resumes = [
        r
        for r in ledger.records(tool="run_benchmark_window")
        if r.inputs.get("resume_of") in candidate or r.inputs.get("resume_of") in baseline
    ]
    own = [r for r in resumes if r.inputs.get("resume_of") in candidate]
    fix = (
        f"run_benchmark_window(command={[*command, '<resume option>', '<a checkpoint it saved>']!r}, "
        f"job=true, resume_of={target.id!r}, repeats=1, warmup_steps and measure_steps that fit the resumed "
        "steps), then keep again"
        if target is not None and command
        else "run_benchmark_window(command=<the candidate's command>, job=true, ...) as a candidate window with "
        "a checkpoint save inside the run, compare_benchmarks(...) with it, then run_benchmark_window(command="
        "<that command plus its resume option>, job=true, resume_of=<that window's evidence_id>)"
    )
    if observable:
        fix = (
            "measure each side once with job=true (its save then runs and what it holds is compared: the same "
            f"state needs no resume), or {fix}"
        )
    if not own:
        other = [r.id for r in resumes]
        return Check(
            True,
            False,
            f"{why}, and no resume launch of a candidate window is recorded"
            + (
                f" ({', '.join(other)} resumed the baseline's windows, which say nothing of the candidate's "
                "checkpoints)"
                if other
                else ""
            ),
            other or candidate,
            fix,
        )
    latest = own[-1]
    check = as_dict(latest.result.get("checkpoint_resume"))
    if latest.state.value not in OK_STATES or not check:
        return Check(
            True,
            False,
            f"{why}; the resume launch {latest.id} is {latest.state.value} with no resume result"
            + (f" ({latest.result.get('failure_reason')})" if latest.result.get("failure_reason") else ""),
            [latest.id],
            fix,
        )
    reason = f"{why}; {latest.id}: {check.get('reason')}"
    if check.get("status") != "passed":
        return Check(True, False, reason, [latest.id], fix)
    return _tensors_check(exp, latest, as_dict(check.get("tensors")), why, ledger, lookup)


def _tensors_check(
    exp: Experiment, resume: EvidenceRecord, pair: dict[str, Any], why: str, ledger: Ledger, lookup: Lookup
) -> Check:
    """The tensor half of a resume whose loss matched: a tensor check of exactly the two captures the resume
    check paired (the uninterrupted run's and the resumed launch's, at one training step, each bound to its
    run by digest). A failed one refuses the keep (a check tighter than the torch defaults is left out, as
    the correctness gate leaves it); a passed one at the experiment's declared tolerance or stricter
    strengthens it; without one the loss carries the gate alone, and the reason says so."""
    head, _, tail = str(as_dict(resume.result.get("checkpoint_resume")).get("reason")).partition("; ")
    loss = f"{why}; {resume.id}: {head}"
    if not pair:
        return Check(
            True,
            True,
            f"{loss}; the tensors were not compared ({tail or 'no capture of both runs at one aligned step'})",
            [resume.id],
        )
    reference, candidate, step = pair.get("reference"), pair.get("candidate"), pair.get("step")
    wanted = {
        "reference": (str(resume.inputs.get("resume_of")), str(reference), str(pair.get("reference_digest"))),
        "candidate": (resume.id, str(candidate), str(pair.get("candidate_digest"))),
    }
    checks = ledger.records(tool="compare_tensors")
    bound = [r for r in checks if binds_files(r, wanted, lookup)]
    earlier = _earlier_failures(resume, checks, ledger, lookup)
    call = f"compare_tensors(reference={reference!r}, candidate={candidate!r}, experiment_id={exp.id!r})"
    failed = [r for r in bound + earlier if r.state.value == "failed" and not stricter_than_defaults(r)]
    if failed:
        bad = failed[-1]
        what = (
            f"the tensors at step {step} differ after the resume"
            if bad in bound
            else "an earlier launch of this same resume (same command and code) failed its tensor check"
        )
        return Check(
            True,
            False,
            f"{why}; {resume.id}: the loss matches, but {what}: {bad.id}: {_tensor_figures(bad)}",
            [resume.id, bad.id],
            "restore everything the checkpoint should carry (optimizer state, learning-rate schedule, RNG and "
            "data position), run the resume again with the same capture, then compare_tensors(reference="
            f"{reference!r}, candidate=<its capture>)",
        )
    passed = [r for r in bound if r.state.value == "passed"]
    good = [r for r in passed if not looser_than_declared(exp, r)]
    if good:
        return Check(
            True,
            True,
            f"{loss}; the tensors at step {step} match too ({good[-1].id})",
            [resume.id, good[-1].id],
        )
    loose = (
        f" ({', '.join(r.id for r in passed)} compared them looser than the experiment's tolerance, "
        f"{exp.tolerance.describe()}: not counted)"
        if passed
        else ""
    )
    return Check(
        True,
        True,
        f"{loss}; the tensors at step {step} were not compared{loose}: {call} compares them",
        [resume.id],
    )


def _earlier_failures(
    resume: EvidenceRecord, checks: list[EvidenceRecord], ledger: Ledger, lookup: Lookup
) -> list[EvidenceRecord]:
    """Failed tensor checks of an earlier resume launch that ran what this one runs (the same command and
    recorded code) against the same uninterrupted run, each file bound to its run: launching the same
    resume again and leaving its capture uncompared does not clear them."""
    target = resume.inputs.get("resume_of")

    def ran(r: EvidenceRecord) -> tuple[str, str]:
        prov = as_dict(r.result.get("provenance"))
        return canonical_json(r.inputs.get("command")), canonical_json([prov.get("code"), prov.get("files")])

    same = {
        r.id
        for r in ledger.records(tool="run_benchmark_window")
        if r.id != resume.id and r.inputs.get("resume_of") == target and ran(r) == ran(resume)
    }
    found: list[EvidenceRecord] = []
    for check in checks:
        if check.state.value != "failed":
            continue
        by_role = {str(p.get("role")): p for p in map(as_dict, as_list(check.result.get("producers")))}
        ref, cand = by_role.get("reference", {}), by_role.get("candidate", {})
        if ref.get("evidence_id") != target or cand.get("evidence_id") not in same:
            continue
        wanted = {
            role: (str(p.get("evidence_id")), str(p.get("path")), str(p.get("digest")))
            for role, p in (("reference", ref), ("candidate", cand))
        }
        if binds_files(check, wanted, lookup):
            found.append(check)
    return found


def _tensor_figures(check: EvidenceRecord) -> str:
    """The first tensor outside tolerance in a failed check, with its figures (else the check's summary)."""
    for t in map(as_dict, as_list(check.result.get("tensors"))):
        if t.get("status") == "value_mismatch":
            return (
                f"{t.get('key')}: {t.get('mismatched')} of {t.get('elements')} elements beyond atol "
                f"{t.get('atol')}, rtol {t.get('rtol')} (largest absolute error {t.get('max_abs_error')})"
            )
    return str(check.result.get("summary"))
