"""Tensor checks bound to the runs they speak for: each side's file dumped by a run of that side, after a
change could act on it, at the tolerance fixed at open, and never looser than a failed check of the same
change or candidate.

The correctness gate (`perfgate.decisions.gates.tensors`) and the checkpoint-resume gate read these; the
bindings of the comparison itself are in `perfgate.decisions.binding`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from perfgate.decisions.binding import Lookup, canonical_name
from perfgate.decisions.experiments import Experiment
from perfgate.evidence import EvidenceRecord
from perfgate.evidence.access import as_dict, as_list, str_list
from perfgate.security.digests import KNOWN_ALGORITHMS, entry_digest, format_digest, parse

__all__ = [
    "before_change_problems",
    "binds_files",
    "correctness_binding_problems",
    "looser_than_declared",
    "producer_problems",
    "untouched_problems",
]


def _tolerance(record: EvidenceRecord) -> tuple[float, float] | None:
    atol, rtol = record.inputs.get("atol"), record.inputs.get("rtol")
    if isinstance(atol, (int, float)) and isinstance(rtol, (int, float)):
        return float(atol), float(rtol)
    return None


def looser_than_declared(exp: Experiment, record: EvidenceRecord) -> list[str]:
    """How a compare_tensors call was looser than the tolerances the experiment declared at open."""
    declared = exp.tolerance
    inputs = record.inputs
    loose: list[str] = []
    tol = _tolerance(record)
    if tol is None:
        loose.append("no recorded atol/rtol")
    else:
        if tol[0] > declared.atol:
            loose.append(f"atol={tol[0]:g}")
        if tol[1] > declared.rtol:
            loose.append(f"rtol={tol[1]:g}")
    for override in map(as_dict, as_list(inputs.get("overrides"))):
        o_atol, o_rtol = override.get("atol"), override.get("rtol")
        # an override may use the tolerance open declared for exactly its group, else the global one
        atol, rtol = declared.for_pattern(str(override.get("pattern"))) or (declared.atol, declared.rtol)
        if (isinstance(o_atol, (int, float)) and o_atol > atol) or (
            isinstance(o_rtol, (int, float)) and o_rtol > rtol
        ):
            loose.append(f"override {override.get('pattern')!r} atol={o_atol:g}, rtol={o_rtol:g}")
    order = [p for p, _, _ in declared.groups]
    placed = [
        order.index(p)
        for o in map(as_dict, as_list(inputs.get("overrides")))
        if (p := o.get("pattern")) in order
    ]
    if placed != sorted(placed):
        # first match wins: a group moved ahead of one declared before it takes that one's tensors
        loose.append("overrides in another order than the groups declared at open")
    if inputs.get("allow_nonfinite") and not declared.allow_nonfinite:
        loose.append("allow_nonfinite=true")
    if as_list(inputs.get("keys")):
        loose.append("keys=" + ",".join(map(str, as_list(inputs.get("keys")))) + " (a subset of the tensors)")
    if inputs.get("integers_exact") is False:
        loose.append("integers_exact=false")
    if inputs.get("allow_dtype_change"):
        loose.append("allow_dtype_change=true (a dtype change is a precision change)")
    return loose


def _code_key(record: EvidenceRecord | None) -> str | None:
    """A launched run's code state (git commit and dirty-diff digest), when known."""
    code = as_dict(as_dict(record.result.get("provenance")).get("code")) if record else {}
    if not code.get("commit"):
        return None
    return f"{code.get('commit')}+{code.get('diff_sha256') or 'clean'}"


def producer_problems(
    exp: Experiment, check: EvidenceRecord, comparison: EvidenceRecord | None, lookup: Lookup
) -> list[str]:
    """Each side's tensor file was produced by a run of that side: the baseline's from the baseline's runs,
    the candidate's from the candidate's, after the experiment was opened.

    A producer is the window record whose launched process dumped exactly those bytes at that path
    (compare_tensors records it). It belongs to a side when it is one of that side's windows in the
    comparison, or when it ran that side's code state and the two sides' code states differ (a separate
    parity run); with the same code on both sides (an argv or environment change) only the compared
    windows themselves tell the sides apart. Binding is by producer, not by content: a bit-exact change
    legitimately produces identical bytes on both sides.
    """
    producers = [as_dict(p) for p in as_list(check.result.get("producers"))]
    if not producers:
        return [
            f"{check.id} records no producer for its files (compared before perfgate bound tensor files to "
            "runs): compare_tensors(...) again on the runs' own dumps"
        ]
    sides: dict[str, list[str]] = {}
    problems: list[str] = []
    launch_call = {
        "reference": "the baseline's run_benchmark_window(...)",
        "candidate": "run_benchmark_window(...) for the candidate",
    }
    files = [as_dict(f) for f in as_list(check.result.get("files"))]
    for p in producers:
        role, path, eid = str(p.get("role")), p.get("path"), p.get("evidence_id")
        if not isinstance(eid, str):
            problems.append(
                f"{check.id}: the {role} file {path} is unbound: no perfgate-launched run dumped these bytes there "
                f"(a copied or edited file proves nothing about a run): dump it with perfgate.harness.dump_tensors "
                f"inside {launch_call.get(role, 'its run')}, then compare_tensors(...) again"
            )
            continue
        mismatch = _digest_problem(check, p, files, lookup(eid))
        if mismatch is not None:
            problems.append(
                f"{check.id}: the {role} file {path} is not bound to {eid}: {mismatch}; compare_tensors(...) again on "
                f"the file {launch_call.get(role, 'its run')} dumped"
            )
            continue
        sides.setdefault(role, []).append(eid)
    if problems:
        return problems
    ref_ids, cand_ids = set(sides.get("reference", [])), set(sides.get("candidate", []))
    if ref_ids & cand_ids:
        problems.append(
            f"{check.id}: both sides' files come from the same run ({', '.join(sorted(ref_ids & cand_ids))}): the "
            "reference must come from the baseline's run, the candidate from the candidate's"
        )
    for eid in sorted(cand_ids):
        record = lookup(eid)
        if record is not None and record.seq < exp.opened_seq:
            problems.append(
                f"{check.id}: the candidate file was produced by {eid}, before the experiment was opened: run "
                "the candidate after open (run_benchmark_window(...)) and compare its own dump"
            )
    if comparison is None:
        return problems
    windows = {
        "reference": str_list(comparison.inputs.get("baseline")),
        "candidate": str_list(comparison.inputs.get("candidate")),
    }
    codes = {side: {_code_key(lookup(w)) for w in ids} - {None} for side, ids in windows.items()}
    distinct = (
        bool(codes["reference"])
        and bool(codes["candidate"])
        and not (codes["reference"] & codes["candidate"])
    )
    names = {"reference": "baseline", "candidate": "candidate"}
    for role, ids in (("reference", ref_ids), ("candidate", cand_ids)):
        for eid in sorted(ids):
            if eid in windows[role]:
                continue
            code = _code_key(lookup(eid))
            if distinct and code is not None and code in codes[role]:
                continue
            why = (
                f"its code state ({code or 'unknown'}) is not the {names[role]}'s"
                if distinct
                else "the two sides ran the same code state, so only the compared windows tell them apart"
            )
            problems.append(
                f"{check.id}: the {role} file comes from {eid}, which is not one of the comparison's "
                f"{names[role]} windows and {why}: dump the {role} file in the {names[role]}'s own "
                "run_benchmark_window launches, then compare_tensors(...) again"
            )
    return problems


_COMPUTED = ("grad/", "optimizer/")
"""Tensor names (as the harness's capture writes them) that only the training's own computation fills."""


def before_change_problems(check: EvidenceRecord, lookup: Lookup) -> list[str]:
    """A passed check whose candidate file was written before the first optimizer update (its dump's
    ``step`` is 0) and holds no gradients or optimizer state compares what no change could have touched
    yet: the initial weights (both sides start from the same seed) or the data. Such a check proves nothing
    about the candidate's computation. A dump whose step is not recorded is not judged here."""
    keys = [str(as_dict(t).get("key", "")) for t in as_list(check.result.get("tensors"))]
    if any(k.startswith(_COMPUTED) for k in keys):
        return []
    for p in (as_dict(x) for x in as_list(check.result.get("producers"))):
        if p.get("role") != "candidate" or not isinstance(eid := p.get("evidence_id"), str):
            continue
        record = lookup(eid)
        named = entry_digest(p)
        steps = [
            d.get("step")
            for d in (as_dict(x) for x in as_list(record.result.get("tensor_dumps") if record else []))
            if d.get("path") == p.get("path") and entry_digest(d) == named
        ]
        if 0 in steps:
            return [
                f"{check.id} compares a candidate file written before the first optimizer update (step 0) with "
                "no gradients or optimizer state in it: the initial weights and the data are the same whatever "
                "the candidate computes. Capture after an update on both sides: run_benchmark_window(..., "
                "capture={'step': 1, 'what': ['parameters', 'gradients']}), then compare_tensors on those dumps"
            ]
    return []


_COMPUTED_KINDS = (
    "a trainable parameter after an update, a gradient, optimizer state, the loss or an activation"
)


def untouched_problems(check: EvidenceRecord, lookup: Lookup) -> list[str]:
    """A passed check whose file (either side) holds no tensor the training computes, as the harness told
    by value when it was dumped (`perfgate.harness.computed`, the dump's ``computed`` counts): only inputs,
    labels, frozen weights or copies from before training acted, which match whatever the candidate
    computes. A dump the harness could not classify is not judged here."""
    producers = [as_dict(x) for x in as_list(check.result.get("producers"))]
    for p in sorted(producers, key=lambda p: p.get("role") != "candidate"):  # the candidate's file first
        if not isinstance(eid := p.get("evidence_id"), str) or (record := lookup(eid)) is None:
            continue
        named = entry_digest(p)
        for d in (as_dict(x) for x in as_list(record.result.get("tensor_dumps"))):
            if d.get("path") != p.get("path") or entry_digest(d) != named or d.get("computed") is None:
                continue
            counts = as_dict(d.get("computed"))
            if any(n for k, n in counts.items() if k != "none" and isinstance(n, int)):
                continue
            return [
                f"{check.id} compares tensors the training does not compute: the {p.get('role')} file "
                f"{p.get('path')} (step {d.get('step')}) holds {counts.get('none', 0)} tensor(s) and none is "
                f"{_COMPUTED_KINDS} (the harness matched each by value, whatever its name): inputs, labels, "
                "frozen weights or copies from before training acted match whatever the candidate computes. "
                "Capture what the training computes on both sides: run_benchmark_window(..., capture={'step': 1, "
                "'what': ['parameters', 'gradients']}), then compare_tensors on those dumps"
            ]
    return []


def _digest_problem(
    check: EvidenceRecord,
    producer: dict[str, Any],
    files: list[dict[str, Any]],
    record: EvidenceRecord | None,
) -> str | None:
    """Why a producer entry does not bind its file, or None when it does: the digest it names (algorithm
    and hex) must be one the check took of that file, and the producer record must name a dump at that
    path with that same digest, under the same algorithm. A digest under another algorithm, or an
    unknown or malformed one, binds nothing."""
    path = producer.get("path")
    named = entry_digest(producer)
    if named is None:
        shown = str(producer.get("digest", producer.get("sha256")))[:80]
        return f"its digest {shown!r} names no known algorithm ({', '.join(KNOWN_ALGORITHMS)}) with 64 hex digits"
    digest = format_digest(*named)
    taken: set[str] = set()
    for f in files:
        if f.get("role") == producer.get("role") and f.get("path") == path:
            own = entry_digest(f)
            if own is not None:
                taken.add(format_digest(*own))
            taken.update(d for d in str_list(f.get("other_digests")) if parse(d) is not None)
    if digest not in taken:
        return f"{check.id} took no {named[0]} digest {named[1][:16]}... of that file"
    if record is None:
        return "that record is not in the ledger"
    dumped = [
        as_dict(d) for d in as_list(record.result.get("tensor_dumps")) if as_dict(d).get("path") == path
    ]
    if any(entry_digest(d) == named for d in dumped):
        return None
    algorithms = sorted({n[0] for n in map(entry_digest, dumped) if n is not None})
    if dumped and named[0] not in algorithms:
        return (
            f"the check's {named[0]} digest cannot be compared with the record's {'/'.join(algorithms) or 'unnamed'} "
            "digest of that dump (like is compared with like only)"
        )
    return f"the record names no dump at that path with {digest[:24]}..."


def binds_files(check: EvidenceRecord, wanted: dict[str, tuple[str, str, str]], lookup: Lookup) -> bool:
    """Whether a tensor check compared exactly the files ``wanted`` names: per role ('reference',
    'candidate') one file, at that path, with that digest, bound to the run that recorded it (evidence id,
    path, digest) as the correctness gate binds its files (:func:`_digest_problem`)."""
    files = [as_dict(f) for f in as_list(check.result.get("files"))]
    if sorted(str(f.get("role")) for f in files) != sorted(wanted):
        return False
    producers = [as_dict(p) for p in as_list(check.result.get("producers"))]
    for role, (eid, path, digest) in wanted.items():
        named = parse(digest)
        if named is None or not any(
            p.get("role") == role
            and p.get("evidence_id") == eid
            and p.get("path") == path
            and entry_digest(p) == named
            and _digest_problem(check, p, files, lookup(eid)) is None
            for p in producers
        ):
            return False
    return True


def _looser_than(good: EvidenceRecord, bad: EvidenceRecord) -> list[str]:
    """How a passed check was looser than a failed one (empty: as strict or stricter)."""
    loose: list[str] = []
    g_tol, b_tol = _tolerance(good), _tolerance(bad)
    if g_tol is not None and b_tol is not None:
        if g_tol[0] > b_tol[0]:
            loose.append(f"atol={g_tol[0]:g}")
        if g_tol[1] > b_tol[1]:
            loose.append(f"rtol={g_tol[1]:g}")
    g_in, b_in = good.inputs, bad.inputs
    if as_list(g_in.get("keys")) and not as_list(b_in.get("keys")):
        loose.append("keys=" + ",".join(map(str, as_list(g_in.get("keys")))) + " (a subset of the tensors)")
    for flag in ("allow_nonfinite", "allow_dtype_change"):
        if g_in.get(flag) and not b_in.get(flag):
            loose.append(f"{flag}=true")
    if g_in.get("integers_exact") is False and b_in.get("integers_exact") is not False:
        loose.append("integers_exact=false")
    if b_tol is not None and not as_list(b_in.get("overrides")):
        for o in map(as_dict, as_list(g_in.get("overrides"))):
            o_atol, o_rtol = o.get("atol"), o.get("rtol")
            if (isinstance(o_atol, (int, float)) and o_atol > b_tol[0]) or (
                isinstance(o_rtol, (int, float)) and o_rtol > b_tol[1]
            ):
                loose.append(f"override {o.get('pattern')!r} atol={o_atol}, rtol={o_rtol}")
    return loose


def _candidate_marks(check: EvidenceRecord, lookup: Lookup) -> dict[str, str]:
    """What identifies the candidate a tensor check examined: its file's digests, the run that dumped it,
    and that run's code state (git commit and diff, else the digests of the files its command names)."""
    marks: dict[str, str] = {}
    for f in map(as_dict, as_list(check.result.get("files"))):
        if f.get("role") == "candidate":
            for digest in [f.get("digest"), f.get("sha256"), *str_list(f.get("other_digests"))]:
                if isinstance(digest, str) and digest:
                    marks[f"file:{digest}"] = f"the same candidate file ({f.get('path')})"
    for p in map(as_dict, as_list(check.result.get("producers"))):
        eid = p.get("evidence_id")
        if p.get("role") != "candidate" or not isinstance(eid, str):
            continue
        marks[f"run:{eid}"] = f"the same candidate run {eid}"
        record = lookup(eid)
        code = _code_key(record)
        if code is not None:
            marks[f"code:{code}"] = f"the same candidate code state ({code[:20]}...)"
        files = as_dict(as_dict(record.result.get("provenance")).get("files")) if record else {}
        if files:
            from perfgate.evidence import canonical_json

            marks[f"files:{canonical_json(files)}"] = "a candidate run of the same code files"
    return marks


def _same_candidate(a: EvidenceRecord, b: EvidenceRecord, lookup: Lookup) -> str | None:
    """How two tensor checks examined the same candidate, or None."""
    mine = _candidate_marks(a, lookup)
    theirs = _candidate_marks(b, lookup)
    shared = [k for k in mine if k in theirs]
    return mine[shared[0]] if shared else None


def _failed_checks(
    exp: Experiment,
    experiments: dict[str, Experiment],
    passed: list[EvidenceRecord],
    lookup: Lookup,
    checks: Iterable[EvidenceRecord],
) -> list[EvidenceRecord]:
    """Failed tensor checks that bind this experiment's passed ones: attached (in any role) to an experiment
    of the same changed variable, or anywhere in the ledger (attached or not) about the same candidate: its
    file, its run or its code state. A check tighter than the torch defaults (bit-exact, say) is left out:
    an equivalent change may fail it, so it shows nothing a looser check could hide."""
    from perfgate.decisions.equivalence import stricter_than_defaults

    variable = canonical_name(exp.changed_variable)
    failed: dict[str, EvidenceRecord] = {}
    for other in [exp, *(e for e in experiments.values() if e.id != exp.id)]:  # exp: with this call's links
        if other.id != exp.id and canonical_name(other.changed_variable) != variable:
            continue
        for link in other.links:
            record = lookup(link.evidence_id)
            if record is not None and record.tool == "compare_tensors" and record.state.value == "failed":
                failed[record.id] = record
    for record in checks:
        if (
            record.id in failed
            or record.tool != "compare_tensors"
            or record.result.get("status") != "mismatch"
        ):
            continue
        if any(_same_candidate(record, good, lookup) for good in passed) and not stricter_than_defaults(
            record
        ):
            failed[record.id] = record
    return list(failed.values())


def correctness_binding_problems(
    exp: Experiment,
    experiments: dict[str, Experiment],
    lookup: Lookup,
    comparison: EvidenceRecord | None = None,
    checks: Iterable[EvidenceRecord] = (),
) -> tuple[list[str], list[str]]:
    """(problems, ids): the passed tensor checks compare two different files, each produced by a run of its
    own side (see :func:`producer_problems`), and no failed check is superseded by a looser one: one for this
    changed variable (in any role, in this or an earlier experiment), or any in the ledger about the same
    candidate (see :func:`_failed_checks`)."""
    problems: list[str] = []
    passed: list[EvidenceRecord] = []
    for cid in exp.ids("correctness"):
        record = lookup(cid)
        if record is None or record.tool != "compare_tensors" or record.state.value != "passed":
            continue
        passed.append(record)
        problems.extend(producer_problems(exp, record, comparison, lookup))
        problems.extend(before_change_problems(record, lookup) or untouched_problems(record, lookup))
        files = [as_dict(f) for f in as_list(record.result.get("files"))]
        # The same file on both sides proves nothing. Two files with identical bytes are fine: that is what
        # a bit-exact change produces (the runs' own dumps), so only the paths are compared here.
        ref = {f.get("path") for f in files if f.get("role") == "reference"}
        cand = {f.get("path") for f in files if f.get("role") == "candidate"}
        if ref and ref & cand:
            problems.append(
                f"{cid} compares a file with itself: the candidate's tensors must come from the "
                "candidate run, the reference's from the baseline run"
            )
    failed = _failed_checks(exp, experiments, passed, lookup, checks)
    for bad in failed:
        strict = _tolerance(bad)
        for good in passed:
            loose = _looser_than(good, bad)
            if loose:
                problems.append(
                    f"{good.id} passed with {', '.join(loose)}, looser than the failed check {bad.id} "
                    + (f"(atol={strict[0]:g}, rtol={strict[1]:g}) " if strict else "")
                    + f"of {_same_candidate(bad, good, lookup) or 'the same change'}: a failed correctness check "
                    "is not superseded by a looser one"
                )
    if failed and not passed:
        problems.append(
            f"correctness checks for {exp.changed_variable!r} failed ({', '.join(r.id for r in failed)}) and no "
            "check at the same or stricter tolerances passed"
        )
    return problems, [r.id for r in failed + passed]
