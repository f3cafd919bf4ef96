"""Whether the candidate may train differently from the baseline, from what the harness recorded.

A speedup is only an equivalent one when the candidate learns what the baseline learns. The comparison
cannot prove that (tensor parity and sample audits do), but the records can show that it is *not* so:

- **model**: the top-level training module's class, parameter count or structure (every parameter's name,
  shape and dtype) differs: a smaller model is faster and is another model;
- **data**: the digest of the first training inputs (the sample stream) differs while each side's own
  launches agree on theirs;
- **loss**: the loss of the same optimizer step (each side's median over its launches) differs beyond
  `LOSS_RTOL` and beyond twice the baseline launches' own spread at that step (a nondeterministic
  baseline widens the margin by what it moves by itself).

Each finding is a sentence that leads the comparison's answer ("training may differ: ..."); what could not
be checked is said too, never counted as the same.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

__all__ = [
    "LOSS_RTOL",
    "ModelShape",
    "SideTraining",
    "TrainingCheck",
    "caution",
    "losses_apart",
    "training_differences",
]

LOSS_RTOL = 1e-3
"""Relative difference of one step's loss beyond which the sides train differently: above what a reordered
floating-point reduction (another thread count, a fused kernel) moves a loss over a few hundred steps."""
_MAX_STEPS_NAMED = 3


@dataclass(frozen=True)
class ModelShape:
    """The top-level module as the harness recorded it."""

    name: str
    parameters: int
    structure: str


@dataclass(frozen=True)
class SideTraining:
    """One side's facts: the model per record (None: not recorded), the sample stream per launch, and each
    launch's losses by optimizer step (rank 0)."""

    models: Sequence[ModelShape | None] = ()
    streams: Sequence[str | None] = ()
    losses: Sequence[Mapping[int, float]] = ()


@dataclass(frozen=True)
class TrainingCheck:
    """``differs``: a sentence per way the training may differ; ``unchecked``: what could not be compared."""

    differs: list[str] = field(default_factory=list[str])
    unchecked: list[str] = field(default_factory=list[str])


def _one(values: Sequence[str | None]) -> str | bool | None:
    """The side's single value; None when any is unknown; False when its launches disagree."""
    if not values or any(v is None for v in values):
        return None
    return values[0] if len(set(values)) == 1 else False


def _model(base: SideTraining, cand: SideTraining, out: TrainingCheck) -> None:
    shapes: list[ModelShape] = []
    for side, facts in (("baseline", base), ("candidate", cand)):
        known = [m for m in facts.models if m is not None]
        if not known or len(known) < len(facts.models):
            out.unchecked.append(f"model size ({side}: no top-level module recorded)")
            return
        if len({(m.name, m.parameters, m.structure) for m in known}) > 1:
            out.differs.append(f"model: the {side}'s own runs trained different modules")
            return
        shapes.append(known[0])
    b, c = shapes
    if b.parameters != c.parameters:
        ratio = c.parameters / b.parameters if b.parameters else math.inf
        out.differs.append(
            f"model size: {b.parameters:,} -> {c.parameters:,} parameters ({ratio:.2f}x, {c.name})"
        )
    elif b.name != c.name:
        out.differs.append(f"model: the top-level module is {b.name} -> {c.name}")
    elif b.structure != c.structure:
        out.differs.append(
            f"model structure: {c.name} has the same parameter count but other parameter names, shapes or dtypes"
        )


def _data(base: SideTraining, cand: SideTraining, out: TrainingCheck) -> None:
    b, c = _one(base.streams), _one(cand.streams)
    if b is None or c is None:
        out.unchecked.append("data (a launch has no sample-stream digest)")
    elif b is False or c is False:
        out.unchecked.append("data (a side's own launches read different first samples)")
    elif b != c:
        out.differs.append("data: the first training inputs differ (sample-stream digest)")


def _side_losses(losses: Sequence[Mapping[int, float]]) -> dict[int, list[float]] | None:
    """Step -> the finite losses the side's launches recorded for it; None when none were recorded."""
    if not losses or not any(losses):
        return None
    merged: dict[int, list[float]] = {}
    for launch in losses:
        for step, value in launch.items():
            if math.isfinite(value):
                merged.setdefault(step, []).append(value)
    return merged


def losses_apart(b: list[float], c: list[float]) -> bool:
    """Whether the candidate's loss at one step (median of its launches) lies beyond the baseline's (their
    median): more than `LOSS_RTOL` of it, and more than twice the baseline launches' own spread (a
    nondeterministic baseline widens the margin by what it moves by itself; the candidate's spread never
    does, so a candidate cannot loosen its own check)."""
    mid_b, mid_c = statistics.median(b), statistics.median(c)
    allowed = max(LOSS_RTOL * abs(mid_b), 1e-12, 2 * (max(b) - min(b)))
    return abs(mid_c - mid_b) > allowed


def _loss(base: SideTraining, cand: SideTraining, out: TrainingCheck) -> None:
    sides = {"baseline": _side_losses(base.losses), "candidate": _side_losses(cand.losses)}
    for side, value in sides.items():
        if value is None:
            out.unchecked.append(f"loss ({side}: no loss recorded)")
            return
    b, c = sides["baseline"], sides["candidate"]
    assert b is not None and c is not None
    common = sorted(set(b) & set(c))
    if not common:
        out.unchecked.append("loss (the sides recorded no step in common)")
        return
    apart = [s for s in common if losses_apart(b[s], c[s])]
    if apart:
        shown = ", ".join(
            f"step {s} {statistics.median(b[s]):.6g} -> {statistics.median(c[s]):.6g}"
            for s in apart[:_MAX_STEPS_NAMED]
        )
        more = f" (+{len(apart) - _MAX_STEPS_NAMED} more)" if len(apart) > _MAX_STEPS_NAMED else ""
        out.differs.append(f"loss: {len(apart)} of {len(common)} common steps differ ({shown}{more})")


def training_differences(base: SideTraining, cand: SideTraining) -> TrainingCheck:
    """How the candidate's training may differ from the baseline's (model, data, loss)."""
    out = TrainingCheck()
    _model(base, cand, out)
    _data(base, cand, out)
    _loss(base, cand, out)
    return out


def caution(differs: Sequence[str], verdict: str) -> str | None:
    """The comparison's first line when the candidate may train differently (``differs``: the ways it may);
    None when nothing shows it does."""
    if not differs:
        return None
    return (
        "training may differ: "
        + "; ".join(differs)
        + f". The '{verdict}' verdict is not an equivalent speedup until correctness evidence (compare_tensors, "
        "audit_samples, check_training_health) shows the candidate trains the same; a keep needs it, or "
        "classification 'training_change'"
    )
