"""The A/B of two sides' window evidence: comparability first; when comparable, the pooled speedup with the
host drift between the sides folded in, and whether the candidate may train differently."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from perfgate.benchmarking.comparing.comparability import Comparability, comparability
from perfgate.benchmarking.comparing.sides import per_device as per_device_samples
from perfgate.benchmarking.comparing.sides import read_samples, side_training
from perfgate.benchmarking.runs.training import TrainingCheck, training_differences

if TYPE_CHECKING:
    from perfgate.benchmarking.comparing.compare import Comparison, WindowSample
    from perfgate.benchmarking.comparing.drift import LaunchInfo
    from perfgate.evidence import EvidenceRecord

__all__ = ["EvidenceComparison", "compare_evidence"]


@dataclass(frozen=True)
class EvidenceComparison:
    """``comparison`` and ``training`` are None when the sides are incomparable (``comparability.reasons``);
    ``warnings`` are the answer's; the step times (milliseconds, per device when so compared) are what the
    A/B plot shows."""

    comparability: Comparability
    comparison: Comparison | None
    training: TrainingCheck | None
    warnings: list[str]
    baseline_step_ms: list[float] = field(default_factory=list[float])
    candidate_step_ms: list[float] = field(default_factory=list[float])
    noise: list[str] = field(default_factory=list[str])
    """Why the comparison could not tell and what settles it (`perfgate.benchmarking.comparing.noise`)."""


def _windows(workspace: Path, records: Sequence[EvidenceRecord], per_device: bool) -> list[WindowSample]:
    out: list[WindowSample] = []
    for r in records:
        samples = read_samples(workspace, r)
        out += per_device_samples(samples, r) if per_device else samples
    return out


def _settle_plans(
    base: Sequence[EvidenceRecord], cand: Sequence[EvidenceRecord], launches: Mapping[str, LaunchInfo]
) -> tuple[str, str]:
    """The calls that settle a drift question: (reusing what was measured, afresh). One call a side, one
    after the other, needs two more to make A B B A (`bracketing_plan`); anything else, or a question the
    calls made cannot answer (over-subscribed threads), four (`interleaved_plan`)."""
    from perfgate.benchmarking.comparing.drift import bracketing_plan, interleaved_plan

    afresh = interleaved_plan(f"the inputs of {base[0].id}", f"the inputs of {cand[0].id}")
    if len(base) == 1 and len(cand) == 1:

        def starts(record: EvidenceRecord) -> list[float | None]:
            return [info.started_s for info in launches.values() if info.call == record.id]

        plan = bracketing_plan((base[0].id, starts(base[0])), (cand[0].id, starts(cand[0])))
        if plan is not None:
            return plan, afresh
    return afresh, afresh


def compare_evidence(
    workspace: Path,
    base: Sequence[EvidenceRecord],
    cand: Sequence[EvidenceRecord],
    declared: Sequence[str],
    *,
    per_device: bool,
    min_effect: float,
    busy_share: float,
) -> EvidenceComparison:
    """Compare baseline and candidate window evidence (artifacts read under ``workspace``): incomparable
    with reasons, or the speedup of pooled throughput (per device-second with ``per_device``) with its
    interval and verdict (effects below ``min_effect`` are within noise).

    Raises:
        BenchmarkError: a stored contract names one entry twice, a window's step series is missing, changed
            or unreadable, or a side has no usable steps.
    """
    from perfgate.benchmarking.comparing.compare import compare_windows, launch_throughputs
    from perfgate.benchmarking.comparing.drift import launch_infos
    from perfgate.benchmarking.comparing.noise import explain_noise, thread_change

    judged = comparability(base, cand, declared, per_device=per_device, busy_share=busy_share)
    if judged.reasons:
        return EvidenceComparison(judged, None, None, judged.busy)
    base_windows = _windows(workspace, base, per_device)
    cand_windows = _windows(workspace, cand, per_device)
    launches = {tag: info for r in [*base, *cand] for tag, info in launch_infos(r.id, r.result).items()}
    settle, afresh = _settle_plans(base, cand, launches)
    if any(d.kind in ("code", "file") for d in judged.differences):
        switch = (
            "; the code differs, so put the baseline's code in place before each baseline call (e.g. git stash) "
            "and the candidate's before each candidate call (git stash pop)"
        )
        settle, afresh = settle + switch, afresh + switch
    result = compare_windows(
        base_windows, cand_windows, min_effect=min_effect, launches=launches, settle=settle
    )
    rates = (launch_throughputs(base_windows, result.unit), launch_throughputs(cand_windows, result.unit))
    noise = explain_noise(
        base, cand, result, rates, settle, thread_change(declared, judged.differences), afresh
    )
    training = training_differences(side_training(workspace, base), side_training(workspace, cand))
    imported = (
        [
            f"evidence {', '.join(judged.imported)} is imported, not launched by perfgate: the step times are what "
            "the trainer logged, bound to no environment unless one was attached"
        ]
        if judged.imported
        else []
    )
    return EvidenceComparison(
        judged,
        result,
        training,
        result.warnings + imported + judged.busy,
        [t * 1e3 for w in base_windows for t in w.step_s],
        [t * 1e3 for w in cand_windows for t in w.step_s],
        noise,
    )
