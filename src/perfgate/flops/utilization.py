"""MFU, HFU or profiler-attributed utilization: total FLOPs over total time of a mixture of step shapes,
against a per-device peak, and the cautions that say when the figure cannot be read as MFU."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

__all__ = [
    "PRECISION_BITS",
    "BucketFigures",
    "BucketInput",
    "FlopsKind",
    "Utilization",
    "Verdict",
    "judge_utilization",
    "utilization",
]

FlopsKind = Literal["model", "hardware", "profiler_attributed"]

PRECISION_BITS = {"fp32": 32, "tf32": 19, "bf16": 16, "fp16": 16, "fp8": 8, "int8": 8}
"""Mantissa-and-exponent width per peak-table precision: a lower-precision run against a higher one's peak
overstates, a higher one against a lower one's understates."""


@dataclass(frozen=True)
class BucketInput:
    """One step shape: FLOPs and wall time per device per optimizer step, its weight in optimizer steps,
    and the evidence they were read from."""

    name: str
    flops_per_step: float
    step_time_s: float
    weight: float
    flops_id: str | None = None
    window_id: str | None = None


@dataclass(frozen=True)
class BucketFigures:
    name: str
    steps: float
    flops_per_step: float
    step_time_s: float
    flops_id: str | None
    window_id: str | None
    achieved_tflops: float
    """This bucket alone: FLOPs / step time, TFLOP/s per device."""
    utilization: float | None
    time_share: float
    """Fraction of the mixture's total time spent in this bucket."""


@dataclass(frozen=True)
class Utilization:
    achieved_tflops: float
    ratio: float | None
    """Achieved over the peak; may exceed 1 on bad inputs; None without a peak."""
    total_flops: float
    total_time_s: float
    buckets: list[BucketFigures]


@dataclass(frozen=True)
class Verdict:
    value: float | None
    """The utilization to report; None when there is no peak or the ratio is impossible."""
    reason: str | None
    """Why ``value`` is None."""
    warnings: list[str] = field(default_factory=list[str])


def utilization(buckets: Sequence[BucketInput], peak_tflops: float | None) -> Utilization:
    """Aggregate achieved TFLOP/s as total FLOPs / total time (never a mean of per-bucket ratios)."""
    total_flops = math.fsum(b.flops_per_step * b.weight for b in buckets)
    total_time = math.fsum(b.step_time_s * b.weight for b in buckets)
    achieved = total_flops / total_time / 1e12
    per_bucket = [
        BucketFigures(
            name=b.name,
            steps=b.weight,
            flops_per_step=b.flops_per_step,
            step_time_s=b.step_time_s,
            flops_id=b.flops_id,
            window_id=b.window_id,
            achieved_tflops=b.flops_per_step / b.step_time_s / 1e12,
            utilization=None
            if peak_tflops is None
            else (b.flops_per_step / b.step_time_s / 1e12) / peak_tflops,
            time_share=b.step_time_s * b.weight / total_time,
        )
        for b in buckets
    ]
    return Utilization(
        achieved_tflops=achieved,
        ratio=None if peak_tflops is None else achieved / peak_tflops,
        total_flops=total_flops,
        total_time_s=total_time,
        buckets=per_bucket,
    )


def judge_utilization(
    figures: Utilization,
    *,
    peak_tflops: float | None,
    no_peak_reason: str,
    flops_kind: FlopsKind,
    precision: str | None,
    training_precision: str | None,
) -> Verdict:
    """The figure to report and its cautions: none above the peak, profiler-attributed FLOPs never MFU, a
    denominator of another precision than the run's, and a suspiciously small MFU."""
    warnings: list[str] = []
    reason: str | None = None
    value = figures.ratio
    if value is None:
        reason = no_peak_reason
    elif value > 1.0:
        value = None
        reason = (
            f"achieved {figures.achieved_tflops:.4g} TFLOP/s exceeds the peak {peak_tflops:g}: the FLOPs, the step "
            "time or the peak is wrong (per-device vs global FLOPs? sparse peak? wrong precision?)."
        )
        warnings.append(reason)
    if flops_kind == "profiler_attributed":
        warnings.append(
            "profiler-attributed FLOPs count only the ops the profiler knows (matmul, 2D conv): this is not "
            "MFU; use estimate_flops for model FLOPs."
        )
    if training_precision and precision and training_precision != precision:
        if PRECISION_BITS[training_precision] < PRECISION_BITS[precision]:
            warnings.append(
                f"the run used {training_precision} but the denominator is the {precision} peak: the "
                f"figure is relative to {precision} and overstates utilization of the hardware's "
                f"{training_precision} capability; report it as such, not as MFU."
            )
        else:
            warnings.append(
                f"the run used {training_precision} but the denominator is the {precision} peak, which "
                "the run could never reach: use the peak of the precision actually used."
            )
    if value is not None and flops_kind == "model" and value < 0.01:
        warnings.append(
            "utilization under 1%: check that flops_per_step is per device and per optimizer step"
        )
    return Verdict(value, reason, warnings)
