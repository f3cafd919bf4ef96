"""What the change trains: a system optimization trains what the baseline trains, a training change meets
the task-quality criterion declared at open, and a correctness repair's own windows become the new
baseline."""

from __future__ import annotations

from perfgate.decisions.gates.base import Keep, not_applicable, verdict
from perfgate.decisions.verdict import OK_STATES, Check
from perfgate.evidence.access import str_list

__all__ = ["new_baseline", "same_training", "task_quality"]


def same_training(keep: Keep) -> Check:
    """An equivalent speedup trains what the baseline trains: the comparison found no other model, first
    inputs or loss at the same optimizer steps (`perfgate.benchmarking.runs.training`, from what the harness
    recorded for every compared launch). What could not be checked (no loss recorded: a custom loop
    without ``backward()`` on a scalar) is named and left to the tensor and audit gates."""
    latest = keep.comparison
    if latest is None or latest.result.get("verdict") is None:
        return not_applicable("no comparison with a verdict is attached yet (the comparison gate asks)")
    differs = str_list(latest.result.get("training_may_differ"))
    unchecked = str_list(latest.result.get("training_unchecked"))
    if differs:
        return verdict(
            False,
            "the candidate trains differently: " + "; ".join(differs),
            [latest.id],
            "if that is the point, record_decision(action='open', classification='training_change', "
            f"changed_variable={keep.exp.changed_variable!r}, quality={{'metric': 'loss_last_ratio', "
            "'direction': 'lower', 'threshold': ...}) and keep that on task quality; otherwise find what "
            "moves it (the first step named: seed, data order, learning rate, loss scaling), re-run the "
            "candidate and compare_benchmarks again",
        )
    return verdict(
        True,
        "same model, first inputs and loss at every common step"
        + (f" (not checked: {'; '.join(unchecked)})" if unchecked else ""),
        [latest.id],
    )


def task_quality(keep: Keep) -> Check:
    from perfgate.decisions.binding import QUALITY_KINDS, quality_problems

    exp = keep.exp
    problems, good = quality_problems(exp, keep.comparison, keep.get)
    tool = ", ".join(QUALITY_KINDS.values())
    return verdict(
        not problems,
        "; ".join(problems)
        or "a passed task-quality result about the candidate windows meets "
        + (exp.quality.describe() if exp.quality else "its criteria"),
        good or exp.ids("quality"),
        f"{tool}(evidence_id=<candidate window>, baseline_id=<baseline window>, loss_tolerance=...), then "
        + keep.attach("quality"),
    )


def new_baseline(keep: Keep) -> Check:
    ids = keep.exp.ids("candidate") or keep.exp.ids("baseline")
    windows = [r for i in ids if (r := keep.get(i)) is not None and r.tool == "run_benchmark_window"]
    good = [w.id for w in windows if not w.profiled and w.state.value in OK_STATES]
    return verdict(
        bool(good),
        "the repaired run's windows become the new baseline"
        if good
        else "no executed, non-profiled windows of the repaired run",
        good or ids,
        "run_benchmark_window(...) on the repaired code, then " + keep.attach("candidate"),
    )
