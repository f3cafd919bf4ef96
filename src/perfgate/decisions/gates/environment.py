"""Where the windows ran: an environment recorded by ``collect_env``, and baseline and candidate measured in
the same hardware and software environment, except where the experiment's declared change shows."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from perfgate.decisions.gates.base import Keep, verdict
from perfgate.decisions.gates.windows import RERUN, compared_windows, sides
from perfgate.decisions.verdict import OK_STATES, Check
from perfgate.evidence import EvidenceRecord, canonical_json
from perfgate.evidence.access import as_dict

__all__ = ["environment", "same_environment", "window_fingerprint"]

_SAME_MACHINE = "re-run baseline and candidate windows on the same machine and software stack"


def environment(keep: Keep) -> Check:
    ids = keep.exp.ids("environment")
    good = [i for i in ids if (r := keep.get(i)) and r.tool == "collect_env" and r.state.value in OK_STATES]
    if good:
        return verdict(True, "environment recorded by collect_env", good)
    return verdict(
        False,
        "no collect_env record is attached"
        if not ids
        else "attached environment evidence is not a usable collect_env record",
        ids,
        "collect_env(), then " + keep.attach("environment"),
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


def same_environment(keep: Keep) -> Check:
    windows = compared_windows(keep)
    prints = {w.id: window_fingerprint(w, keep.get) for w in windows}
    missing = [wid for wid, fp in prints.items() if fp is None]
    distinct = {canonical_json(fp) for fp in prints.values() if fp is not None}
    if missing:
        imported = [w for w in missing if (r := keep.get(w)) and r.tool == "import_benchmark"]
        return verdict(
            False,
            f"windows without an environment fingerprint: {', '.join(missing)}"
            + (
                f" ({', '.join(imported)} imported, not launched by perfgate: the run's measured environment "
                "is unknown, and unknown is never the same)"
                if imported
                else ""
            ),
            missing,
            RERUN,
        )
    if len(distinct) <= 1:
        return verdict(
            True, "baseline and candidate ran in the same hardware/software environment", list(prints)
        )
    return _difference(keep, windows, set(sides(keep.compared)[0]), prints)


def _changed_fields(prints: list[dict[str, Any]]) -> list[str]:
    keys = sorted({k for fp in prints for k in fp})
    return [k for k in keys if len({canonical_json(fp.get(k)) for fp in prints}) > 1]


def _difference(
    keep: Keep,
    windows: list[EvidenceRecord],
    baseline: set[str],
    prints: dict[str, dict[str, Any] | None],
) -> Check:
    """same_environment when the fingerprints differ: each side's windows must agree entirely, and between
    the sides only the fields the experiment's declared change shows in (benchmarking.workload.observed) may
    differ. A semantic entry (precision) is exempt only for a training_change."""
    from perfgate.benchmarking.workload.observed import entries_showing, explains
    from perfgate.benchmarking.workload.vocabulary import VOCABULARY, canonical_key
    from perfgate.decisions.binding import declared_for_experiment

    exp = keep.exp
    ids = list(prints)
    by_side = {
        side: [fp for w in windows if (w.id in baseline) == (side == "baseline") and (fp := prints[w.id])]
        for side in ("baseline", "candidate")
    }
    for side, fps in by_side.items():
        if inside := _changed_fields(fps):
            return verdict(
                False,
                f"the {side} windows ran in different environments (differs in {', '.join(inside)}): one side "
                "is one environment, whatever was declared",
                ids,
                _SAME_MACHINE,
            )
    named = declared_for_experiment(exp, keep.compared)
    declared = [
        d
        for d in named
        if exp.classification == "training_change"
        or (term := VOCABULARY.get(canonical_key(d.removeprefix("env:")))) is None
        or term.cls == "execution"
    ]
    assert by_side["baseline"] and by_side["candidate"], (
        "distinct fingerprints, each side uniform: both sides"
    )
    base, cand = by_side["baseline"][0], by_side["candidate"][0]
    explained: list[str] = []
    unexplained: list[str] = []
    for field in _changed_fields([base, cand]):
        shown = f"{field} {base.get(field)!r} -> {cand.get(field)!r}"
        if (by := explains(declared, "fingerprint", field)) is not None:
            explained.append(f"{shown} ({by})")
        else:
            unexplained.append(field)
    if not unexplained:
        return verdict(
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
    return verdict(
        False,
        f"windows ran in different environments (differs in {', '.join(unexplained)}): {what}; {because}"
        + (f" (explained by the declared change: {'; '.join(explained)})" if explained else ""),
        ids,
        "; ".join(fixes),
    )
