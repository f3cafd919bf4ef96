"""compute_mfu: model/hardware FLOP utilization from measured step times and a sourced peak."""

from __future__ import annotations

import math
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from perfgate.errors import ToolError
from perfgate.evidence import EvidenceState
from perfgate.hardware.peaks import PeakLookupError, Precision, lookup_peak
from perfgate.tools._runtime import ToolRuntime
from perfgate.tools._spec import ToolSpec

__all__ = ["SPEC", "Bucket", "ComputeMfuInput", "ComputeMfuOutput", "run", "utilization"]

FlopsKind = Literal["model", "hardware", "profiler_attributed"]
Metric = Literal["MFU", "HFU", "profiler_attributed_utilization"]
_METRIC: dict[str, Metric] = {
    "model": "MFU",
    "hardware": "HFU",
    "profiler_attributed": "profiler_attributed_utilization",
}
_PRECISION_BITS = {"fp32": 32, "tf32": 19, "bf16": 16, "fp16": 16, "fp8": 8, "int8": 8}


class Bucket(BaseModel):
    """One step shape: FLOPs and step time per device per optimizer step, weighted by ``steps``."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(description="Label of this shape bucket, e.g. 'seq2048'.")
    flops_per_step: float = Field(
        gt=0, allow_inf_nan=False, description="FLOPs per device per optimizer step for this bucket."
    )
    step_time_s: float = Field(
        gt=0, allow_inf_nan=False, description="Measured wall time of one optimizer step, seconds."
    )
    steps: int = Field(default=1, ge=1, description="How many steps of this bucket the mixture holds.")


class ComputeMfuInput(BaseModel):
    model_config = ConfigDict(extra="forbid")

    buckets: Annotated[
        list[Bucket],
        Field(
            min_length=1,
            description="Step shapes with per-device FLOPs per optimizer step and measured step time. "
            "Use one bucket for a single shape; several for mixed sequence lengths.",
        ),
    ]
    flops_kind: Annotated[
        FlopsKind,
        Field(
            description="What the FLOPs count: 'model' (useful model FLOPs, e.g. from estimate_flops -> MFU), "
            "'hardware' (including recomputation -> HFU), 'profiler_attributed' (torch.profiler with_flops; "
            "never called MFU)."
        ),
    ]
    device: Annotated[
        str | None,
        Field(description="Device name matched against the peak table, e.g. 'H100 SXM', 'MTT S4000'."),
    ] = None
    precision: Annotated[
        Precision | None,
        Field(
            description="Precision whose dense peak is the denominator: fp32, tf32, bf16, fp16, fp8, int8."
        ),
    ] = None
    peak_tflops: Annotated[
        float | None,
        Field(
            gt=0,
            allow_inf_nan=False,
            description="Explicit dense peak per device in TFLOP/s; overrides the table.",
        ),
    ] = None
    training_precision: Annotated[
        Precision | None,
        Field(description="Precision the matmuls actually ran in, when it differs from `precision` (warns)."),
    ] = None

    @model_validator(mode="after")
    def _peak_given(self) -> ComputeMfuInput:
        if self.peak_tflops is None and (self.device is None or self.precision is None):
            raise ValueError(
                "give device and precision (to look up the peak table) or an explicit peak_tflops"
            )
        return self


class BucketResult(BaseModel):
    name: str
    steps: int
    flops_per_step: float
    step_time_s: float
    achieved_tflops: float = Field(description="FLOPs / step time of this bucket alone, TFLOP/s per device.")
    utilization: float | None
    time_share: float = Field(description="Fraction of the mixture's total time spent in this bucket.")


class ComputeMfuOutput(BaseModel):
    evidence_id: str
    state: EvidenceState
    metric: Metric = Field(
        description="MFU for model FLOPs, HFU for hardware FLOPs, else profiler-attributed."
    )
    utilization: float | None = Field(
        description="Achieved / peak as a fraction; null when it cannot be trusted."
    )
    utilization_reason: str | None = Field(description="Why utilization is null, when it is.")
    achieved_tflops: float = Field(
        description="Total FLOPs / total time over the weighted buckets, per device."
    )
    peak_tflops: float
    peak_source: str
    precision: str | None
    aggregation: str
    total_flops: float
    total_time_s: float
    buckets: list[BucketResult]
    warnings: list[str]


def utilization(buckets: list[Bucket], peak_tflops: float) -> tuple[float, float, float, list[BucketResult]]:
    """Aggregate achieved TFLOP/s as total FLOPs / total time (never a mean of per-bucket ratios).

    Returns (achieved_tflops, ratio, total_flops, per-bucket results); ratio may exceed 1 on bad inputs.
    """
    total_flops = math.fsum(b.flops_per_step * b.steps for b in buckets)
    total_time = math.fsum(b.step_time_s * b.steps for b in buckets)
    achieved = total_flops / total_time / 1e12
    per_bucket = [
        BucketResult(
            name=b.name,
            steps=b.steps,
            flops_per_step=b.flops_per_step,
            step_time_s=b.step_time_s,
            achieved_tflops=b.flops_per_step / b.step_time_s / 1e12,
            utilization=(b.flops_per_step / b.step_time_s / 1e12) / peak_tflops,
            time_share=b.step_time_s * b.steps / total_time,
        )
        for b in buckets
    ]
    return achieved, achieved / peak_tflops, total_flops, per_bucket


async def run(inp: ComputeMfuInput, rt: ToolRuntime) -> ComputeMfuOutput:
    warnings: list[str] = []
    if inp.peak_tflops is not None:
        peak = inp.peak_tflops
        source = "explicit peak_tflops supplied by the caller"
        if inp.device and inp.precision:
            try:
                table_peak, row = lookup_peak(inp.device, inp.precision)
            except PeakLookupError:
                pass
            else:
                if not math.isclose(table_peak, peak, rel_tol=1e-3):
                    warnings.append(
                        f"peak_tflops={peak:g} differs from the table's {table_peak:g} for {row.name} "
                        f"{inp.precision} ({row.source}); the explicit value was used."
                    )
    else:
        assert inp.device is not None
        assert inp.precision is not None
        try:
            peak, row = lookup_peak(inp.device, inp.precision)
        except PeakLookupError as exc:
            raise ToolError(str(exc)) from exc
        source = f"{row.name}, {inp.precision}, {row.basis}: {row.source}"

    names = [b.name for b in inp.buckets]
    if len(set(names)) != len(names):
        raise ToolError("bucket names must be unique; merge or rename the duplicated buckets")

    achieved, ratio, total_flops, per_bucket = utilization(inp.buckets, peak)
    metric = _METRIC[inp.flops_kind]
    reason: str | None = None
    value: float | None = ratio
    if ratio > 1.0:
        value = None
        reason = (
            f"achieved {achieved:.4g} TFLOP/s exceeds the peak {peak:g}: the FLOPs, the step time or the "
            "peak is wrong (per-device vs global FLOPs? sparse peak? wrong precision?)."
        )
        warnings.append(reason)
    if inp.flops_kind == "profiler_attributed":
        warnings.append(
            "profiler-attributed FLOPs count only the ops the profiler knows (matmul, 2D conv): this is not "
            "MFU; use estimate_flops for model FLOPs."
        )
    if inp.training_precision and inp.precision and inp.training_precision != inp.precision:
        if _PRECISION_BITS[inp.training_precision] < _PRECISION_BITS[inp.precision]:
            warnings.append(
                f"the run used {inp.training_precision} but the denominator is the {inp.precision} peak: the "
                f"figure is relative to {inp.precision} and overstates utilization of the hardware's "
                f"{inp.training_precision} capability; report it as such, not as MFU."
            )
        else:
            warnings.append(
                f"the run used {inp.training_precision} but the denominator is the {inp.precision} peak, which "
                "the run could never reach: use the peak of the precision actually used."
            )
    if value is not None and inp.flops_kind == "model" and ratio < 0.01:
        warnings.append(
            "utilization under 1%: check that flops_per_step is per device and per optimizer step"
        )

    ev = rt.evidence()
    out = ComputeMfuOutput(
        evidence_id=ev.id,
        state=EvidenceState.EXECUTED,
        metric=metric,
        utilization=value,
        utilization_reason=reason,
        achieved_tflops=achieved,
        peak_tflops=peak,
        peak_source=source,
        precision=inp.precision,
        aggregation="sum(flops_per_step * steps) / sum(step_time_s * steps) over all buckets, divided by the peak",
        total_flops=total_flops,
        total_time_s=math.fsum(b.step_time_s * b.steps for b in inp.buckets),
        buckets=per_bucket,
        warnings=warnings,
    )
    return await rt.commit(ev, out)


SPEC = ToolSpec(
    name="compute_mfu",
    title="Compute MFU / HFU",
    description=(
        "Compute model FLOP utilization (MFU), hardware FLOP utilization (HFU) or profiler-attributed "
        "utilization from per-device FLOPs per optimizer step and measured step times, against a sourced "
        "dense peak for the device and precision. Use after run_benchmark_window (step time) and "
        "estimate_flops (FLOPs). Mixed shapes aggregate as total FLOPs / total time. Unknown devices or "
        "precisions are refused: pass peak_tflops."
    ),
    input_model=ComputeMfuInput,
    output_model=ComputeMfuOutput,
    run=run,
    read_only=True,
    destructive=False,
    idempotent=True,
    open_world=False,
)
