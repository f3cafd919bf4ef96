"""The comparison a keep rests on: the latest attached ``compare_benchmarks``, not overruled by a later one
over the same windows, not a screen of several candidates, comparable and ``improved``."""

from __future__ import annotations

from perfgate.decisions.gates.base import Keep, verdict
from perfgate.decisions.verdict import Check
from perfgate.evidence import EvidenceRecord
from perfgate.evidence.access import as_dict, as_list, str_list

__all__ = ["comparison", "stands"]


def stands(keep: Keep) -> bool:
    """A comparison the window, binding and launch gates read: attached last, not overruled, not a screen."""
    latest = keep.comparison
    return latest is not None and keep.overruled_by is None and not as_dict(latest.result.get("screen"))


def _verdict_text(record: EvidenceRecord) -> str:
    speedup = record.result.get("speedup")
    figure = f" at {speedup:.3f}x" if isinstance(speedup, float) else ""
    if record.result.get("status") == "incomparable" or record.state.value == "failed":
        return "incomparable"
    return f"{record.result.get('verdict')}{figure}"


def _contradicted(keep: Keep, older: EvidenceRecord, newer: EvidenceRecord) -> Check:
    more = sum(
        len(str_list(newer.inputs.get(k))) - len(str_list(older.inputs.get(k)))
        for k in ("baseline", "candidate")
    )
    return verdict(
        False,
        f"comparison {older.id} ({_verdict_text(older)}) is overruled by {newer.id}, a later comparison over the "
        f"same windows"
        + (f" plus {more} more" if more else "")
        + f" that says {_verdict_text(newer)}: a keep "
        "rests on the latest comparison that covers its windows",
        [older.id, newer.id],
        f"{keep.attach('comparison').replace('...', repr(newer.id), 1)} and decide on what it says (more separate "
        "launches per side and a new compare_benchmarks over all of them if it is within_noise), or decide "
        "'revert'/'inconclusive'",
    )


def comparison(keep: Keep) -> Check:
    fix = "compare_benchmarks(baseline=[...], candidate=[...]), then " + keep.attach("comparison")
    latest = keep.comparison
    if latest is None:
        return verdict(False, "no compare_benchmarks evidence is attached", keep.exp.ids("comparison"), fix)
    if (newer := keep.overruled_by) is not None:
        return _contradicted(keep, latest, newer)
    screen = as_dict(latest.result.get("screen"))
    if screen:
        return verdict(
            False,
            f"{latest.id} screened {len(as_list(screen.get('entries')))} candidates: a keep rests on one "
            "candidate's own comparison, after the winner's validation",
            [latest.id],
            str(screen.get("next", "")).removeprefix("next: "),
        )
    result = latest.result
    speedup, low, high = (result.get(k) for k in ("speedup", "ci_low", "ci_high"))
    figure = f"{speedup:.3f}x" if isinstance(speedup, float) else str(speedup)
    if isinstance(low, float) and isinstance(high, float):
        figure += f" (95% interval {low:.3f}-{high:.3f})"
    contradicted = as_dict(result.get("job")).get("headline_contradicted")
    # the pooled figure alone would mislead: the contradiction follows it as a clause of its own
    also = f"; {contradicted}" if isinstance(contradicted, str) else ""
    more = (
        "more separate launches per side (run_benchmark_window repeats>=3, not same_process), then a new "
        "compare_benchmarks(...) over all of them and "
        + keep.attach("comparison")
        + "; or decide 'revert'/'inconclusive'"
    )
    said = result.get("verdict")
    if result.get("status") == "incomparable" or latest.state.value == "failed":
        reasons = str_list(result.get("reasons"))
        why = "the comparison is incomparable" + (f": {'; '.join(reasons)}" if reasons else "")
        return verdict(
            False, why, [latest.id], "re-run the candidate so that only declared changes differ, then " + fix
        )
    if said == "within_noise":
        return verdict(
            False,
            f"verdict is within_noise: {latest.id} measured speedup {figure}, not beyond noise{also}",
            [latest.id],
            more,
        )
    if said == "insufficient_launches":
        return verdict(
            False,
            "verdict is insufficient_launches: fewer than 2 separate launches on a side, so "
            "launch-to-launch variation is unknown",
            [latest.id],
            more,
        )
    if said != "improved":
        return verdict(
            False,
            f"verdict is {said}: {latest.id} measured speedup {figure}{also}",
            [latest.id],
            "decide 'revert' (the candidate is not faster)",
        )
    return verdict(True, f"improved: speedup {figure}{also}", [latest.id])
