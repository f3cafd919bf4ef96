"""The tensors say the change computes the same thing: a passed tensor check of each side's own dump at the
tolerance fixed at open (`perfgate.decisions.tensor_binding`), within the per-dtype equivalence ceiling the
baseline's own spread may raise (`perfgate.decisions.spread`)."""

from __future__ import annotations

from perfgate.decisions.gates.base import Keep, not_applicable, passed_by, verdict
from perfgate.decisions.verdict import Check

__all__ = ["correctness", "equivalence"]


def _failed_tensor_checks(keep: Keep) -> Check | None:
    """With no passed check attached: the tensor checks of the experiment (attached, or run with its
    experiment_id) that failed, each named with its figures; None when none failed."""
    exp = keep.exp
    attached = set(exp.ids("correctness"))
    failed = [
        r
        for r in keep.ledger.records(tool="compare_tensors")
        if r.state.value == "failed" and (r.id in attached or r.inputs.get("experiment_id") == exp.id)
    ]
    if not failed:
        return None
    return verdict(
        False,
        "; ".join(
            f"tensor check {r.id} failed ({r.result.get('summary') or 'no summary recorded'})" for r in failed
        ),
        [r.id for r in failed],
        "repair the candidate, compare_tensors(...) its own new dump at the same tolerance and give that check "
        "in the next keep's evidence (role 'correctness'); or, if the numerics changed on purpose, record_decision(action='open', hypothesis=..., "
        f"classification='training_change', changed_variable={exp.changed_variable!r}, quality={{...}})",
    )


def correctness(keep: Keep) -> Check:
    from perfgate.decisions.tensor_binding import correctness_binding_problems, looser_than_declared

    exp = keep.exp
    if exp.classification == "training_change":
        return not_applicable("a training change alters numerics by design; task quality decides")
    declared = exp.tolerance
    fix = (
        "compare_tensors(reference=..., candidate=..., experiment_id=...)"
        + (" with allow_nonfinite=True" if declared.allow_nonfinite else "")
        + ", then "
        + keep.attach("correctness")
    )
    base = passed_by(keep, "correctness", "compare_tensors", fix)
    if not base.ok:
        return _failed_tensor_checks(keep) or base
    loose = [
        f"{cid} compared with {', '.join(why)}, looser than the experiment's declared tolerance "
        f"({declared.describe()}, fixed at open)"
        for cid in exp.ids("correctness")
        if (record := keep.get(cid)) is not None
        and record.tool == "compare_tensors"
        and (why := looser_than_declared(exp, record))
    ]
    problems, ids = correctness_binding_problems(
        exp,
        keep.experiments,
        keep.get,
        keep.comparison if exp.classification != "correctness_repair" else None,
        keep.ledger.records(tool="compare_tensors"),
    )
    if not loose and not problems:
        return verdict(
            True,
            f"tensors match within the declared tolerance ({declared.describe()}); each side's file was "
            "dumped by a run of that side",
            base.ids,
        )
    failed = [r for i in ids if (r := keep.get(i)) is not None and r.state.value == "failed"]
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
            + keep.attach("correctness")
        )
    elif strictest is not None and only_failed:
        # a failed check binds: only a pass as strict as it (a repaired change) clears this gate, else the
        # change is not equivalent and is kept, if at all, as a training change
        next_call = (
            f"compare_tensors(reference=..., candidate=..., atol={strictest[0]:g}, rtol={strictest[1]:g}) on the "
            "repaired candidate's own dump, then " + keep.attach("correctness") + "; or, if the numerics "
            "changed on purpose, record_decision(action='open', hypothesis=..., classification='training_change', "
            f"changed_variable={exp.changed_variable!r}, quality={{...}})"
        )
    else:
        next_call = (
            "compare_tensors on the baseline's and the candidate's own tensor files at the declared "
            f"tolerance ({declared.describe()}) or stricter, then " + keep.attach("correctness")
        )
    return verdict(
        False,
        "; ".join(loose + problems),
        list(dict.fromkeys(exp.ids("correctness") + ids)),
        next_call,
    )


def equivalence(keep: Keep) -> Check:
    """An equivalent change's passed tensor checks stay within the per-dtype equivalence ceiling, which the
    baseline's own run-to-run spread may raise up to the table's maximum (`perfgate.decisions.spread`): a
    looser tolerance may pass, but then the numerics changed and only a training change can be kept on it."""
    from perfgate.decisions.equivalence import Limit, applied_tolerances, beyond_ceiling
    from perfgate.decisions.spread import BaselineSpread, baseline_spread, ceiling_for, check_step

    exp = keep.exp
    checks = [
        r
        for i in exp.ids("correctness")
        if (r := keep.get(i)) is not None and r.tool == "compare_tensors" and r.state.value == "passed"
    ]
    if not checks:
        return not_applicable("no passed tensor check is attached yet (the correctness gate asks for one)")
    unknown = [r.id for r in checks if applied_tolerances(r) is None]
    if unknown:
        return verdict(
            False,
            f"{', '.join(unknown)} does not record the dtypes it compared, so its tolerance cannot be held to "
            "the per-dtype equivalence ceiling",
            unknown,
            "compare_tensors(...) again on the same files, then " + keep.attach("correctness"),
        )
    comparison = keep.comparison if exp.classification != "correctness_repair" else None
    problems: list[str] = []
    sources: dict[str, str] = {}
    unmeasured: list[BaselineSpread] = []
    all_checks = list(keep.ledger.records(tool="compare_tensors"))
    for r in checks:
        step = check_step(r, keep.get)
        spread = (
            baseline_spread(comparison, step, keep.get, all_checks)
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
    return verdict(
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
