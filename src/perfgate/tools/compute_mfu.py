"""compute_mfu: model/hardware FLOP utilization from measured step times and a sourced or measured peak."""

from __future__ import annotations

import dataclasses
import functools
from typing import Annotated, Literal

import anyio.to_thread
from pydantic import BaseModel, ConfigDict, Field, model_validator

from perfgate.errors import ToolError
from perfgate.evidence import EvidenceState
from perfgate.flops.bucket_sources import BucketEvidenceError, resolve_bucket
from perfgate.flops.utilization import BucketFigures, BucketInput, FlopsKind, judge_utilization, utilization
from perfgate.hardware.device_peak import is_this_cpu
from perfgate.hardware.peaks import PeakLookupError, Precision
from perfgate.hardware.run_peak import resolve_peak, run_record
from perfgate.serving.runtime import ToolRuntime
from perfgate.serving.spec import ToolSpec

__all__ = ["SPEC", "Bucket", "ComputeMfuInput", "ComputeMfuOutput", "run"]

Metric = Literal["MFU", "HFU", "profiler_attributed_utilization"]
_METRIC: dict[str, Metric] = {
    "model": "MFU",
    "hardware": "HFU",
    "profiler_attributed": "profiler_attributed_utilization",
}


class Bucket(BaseModel):
    """One step shape: FLOPs and step time per device per optimizer step, and its weight in the mixture.

    FLOPs come from ``flops_per_step`` or an ``estimate_flops`` evidence id; the step time from
    ``step_time_s`` or a window evidence id; the weight from ``steps``, or ``samples`` with
    ``global_batch`` (steps = samples / global_batch), or 1. Unknown fields are refused: a misspelt
    weight must never silently become 1.
    """

    model_config = ConfigDict(extra="forbid")

    name: str = Field(description="Label of this shape bucket, e.g. 'seq2048'.")
    flops_per_step: float | None = Field(
        default=None,
        gt=0,
        allow_inf_nan=False,
        description="FLOPs per device per optimizer step for this bucket (or give flops_id).",
    )
    flops_id: str | None = Field(
        default=None,
        description="estimate_flops evidence id: its per-device model (or hardware) FLOPs per step are used.",
    )
    step_time_s: float | None = Field(
        default=None,
        gt=0,
        allow_inf_nan=False,
        description="Measured wall time of one optimizer step, seconds (or give window_id).",
    )
    window_id: str | None = Field(
        default=None,
        description="run_benchmark_window or import_benchmark evidence id: its step time (elapsed / steps "
        "of the slowest rank, pooled over windows) is used.",
    )
    steps: int | None = Field(
        default=None, ge=1, description="How many steps of this bucket the mixture holds (step weight)."
    )
    samples: int | None = Field(
        default=None, ge=1, description="Samples of this bucket in the mixture; needs global_batch."
    )
    global_batch: int | None = Field(
        default=None, ge=1, description="Samples per optimizer step in this bucket (with samples)."
    )

    @model_validator(mode="after")
    def _one_source_each(self) -> Bucket:
        if (self.flops_per_step is None) == (self.flops_id is None):
            raise ValueError(f"bucket {self.name!r}: give exactly one of flops_per_step and flops_id")
        if (self.step_time_s is None) == (self.window_id is None):
            raise ValueError(f"bucket {self.name!r}: give exactly one of step_time_s and window_id")
        if (self.samples is None) != (self.global_batch is None):
            raise ValueError(f"bucket {self.name!r}: samples and global_batch go together")
        if self.steps is not None and self.samples is not None:
            raise ValueError(f"bucket {self.name!r}: weight by steps or by samples + global_batch, not both")
        return self

    @property
    def weight(self) -> float:
        """Optimizer steps of this bucket in the mixture (fractional when samples do not fill a batch)."""
        if self.samples is not None and self.global_batch is not None:
            return self.samples / self.global_batch
        return float(self.steps or 1)


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
        Field(
            description="Device name matched against the peak table, e.g. 'H100 SXM', 'MTT S4000'; 'cpu' for "
            "this machine's CPU (its peak is measured). Leave out with window_id buckets: the device the runs "
            "recorded is used."
        ),
    ] = None
    precision: Annotated[
        Precision | None,
        Field(
            description="Precision whose dense peak is the denominator: fp32, tf32, bf16, fp16, fp8, int8. Leave "
            "out with window_id buckets to use the runs' contract precision."
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
        from_runs = any(b.window_id is not None for b in self.buckets)
        if self.peak_tflops is None and not from_runs and (self.device is None or self.precision is None):
            raise ValueError(
                "give device and precision (to look up the peak table), a window_id (the run's device and "
                "precision are used) or an explicit peak_tflops"
            )
        return self


class BucketResult(BaseModel):
    name: str
    steps: float = Field(description="Weight in optimizer steps (samples / global_batch when given so).")
    flops_per_step: float
    step_time_s: float
    flops_id: str | None = Field(description="estimate_flops evidence the FLOPs came from, if any.")
    window_id: str | None = Field(description="Window evidence the step time came from, if any.")
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
        description="Per device: sum(flops_per_step * steps) / sum(step_time_s * steps) over all buckets "
        "(total FLOPs / total time, never a mean of per-bucket ratios); utilization is this over the peak."
    )
    peak_tflops: float | None = Field(description="The peak per device; null when unavailable.")
    peak_basis: Literal["datasheet", "measured", "explicit", "unavailable"] = Field(
        description="'datasheet': the sourced table; 'measured': this machine's CPU, by perfgate's matmul probe "
        "(an achievable-GEMM rate, below the theoretical peak); 'explicit': the caller's peak_tflops; "
        "'unavailable': no peak (utilization_reason says why)."
    )
    peak_source: str | None
    device: str | None = Field(description="The device whose peak was used (from the runs unless given).")
    precision: str | None
    total_flops: float
    total_time_s: float
    buckets: list[BucketResult]
    evidence: list[str] = Field(description="Evidence ids the figures came from (windows, FLOP estimates).")
    warnings: list[str]


def _bucket_result(b: BucketFigures) -> BucketResult:
    return BucketResult.model_validate(dataclasses.asdict(b))


async def run(inp: ComputeMfuInput, rt: ToolRuntime) -> ComputeMfuOutput:
    names = [b.name for b in inp.buckets]
    if len(set(names)) != len(names):
        raise ToolError("bucket names must be unique; merge or rename the duplicated buckets")
    warnings: list[str] = []
    resolved: list[BucketInput] = []
    for b in inp.buckets:
        try:
            bucket, notes = await resolve_bucket(
                name=b.name,
                weight=b.weight,
                flops_per_step=b.flops_per_step,
                flops_id=b.flops_id,
                step_time_s=b.step_time_s,
                window_id=b.window_id,
                flops_kind=inp.flops_kind,
                load=rt.load,
            )
        except BucketEvidenceError as exc:
            raise ToolError(str(exc)) from exc
        resolved.append(bucket)
        warnings += notes
    runs = [run_record(await rt.load(b.window_id)) for b in inp.buckets if b.window_id is not None]
    lookup = functools.partial(
        resolve_peak, peak_tflops=inp.peak_tflops, device=inp.device, precision=inp.precision, runs=runs
    )
    try:
        if inp.peak_tflops is not None or (inp.device is not None and not is_this_cpu(inp.device)):
            choice = lookup(state_dir=rt.ledger.trust.state_dir)  # the table's or the caller's: no probe
        else:  # a CPU's peak may be measured (a matmul probe, its cache file)
            choice = await anyio.to_thread.run_sync(
                functools.partial(lookup, state_dir=rt.ledger.trust.state_dir.resolve())
            )
    except PeakLookupError as exc:
        raise ToolError(str(exc)) from exc
    found, precision = choice.peak, choice.precision
    warnings += choice.warnings
    peak = found.tflops

    figures = utilization(resolved, peak)
    verdict = judge_utilization(
        figures,
        peak_tflops=peak,
        no_peak_reason=f"no peak for {found.device}: {found.reason}",
        flops_kind=inp.flops_kind,
        precision=precision,
        training_precision=inp.training_precision,
    )
    warnings += verdict.warnings

    ev = rt.evidence()
    out = ComputeMfuOutput(
        evidence_id=ev.id,
        state=EvidenceState.UNAVAILABLE if peak is None else EvidenceState.EXECUTED,
        metric=_METRIC[inp.flops_kind],
        utilization=verdict.value,
        utilization_reason=verdict.reason,
        achieved_tflops=figures.achieved_tflops,
        peak_tflops=peak,
        peak_basis=found.basis,
        peak_source=found.source,
        device=found.device or None,
        precision=precision,
        total_flops=figures.total_flops,
        total_time_s=figures.total_time_s,
        buckets=[_bucket_result(b) for b in figures.buckets],
        evidence=[i for b in inp.buckets for i in (b.window_id, b.flops_id) if i is not None],
        warnings=warnings,
    )
    return await rt.commit(ev, out)


SPEC = ToolSpec(
    name="compute_mfu",
    title="Compute MFU / HFU",
    description=(
        "MFU or HFU from per-device FLOPs per step and measured step times against a sourced peak (a CPU's "
        "measured); pass window_id and flops_id."
    ),
    details=(
        "Compute model FLOP utilization (MFU), hardware FLOP utilization (HFU) or profiler-attributed "
        "utilization from per-device FLOPs per optimizer step and measured step times, against a sourced "
        "dense peak for the device and precision. Use after run_benchmark_window (step time) and "
        "estimate_flops (FLOPs): pass their evidence ids (window_id, flops_id) so the figure names what it came "
        "from; the device (and precision, threads) the runs recorded is then used, so leave device out. A CPU's "
        "peak is measured once per machine by a short matmul probe (fp32, bf16; cached per CPU model, cores, "
        "torch version and threads) and named as measured: an achievable-GEMM rate, so utilization reads higher "
        "than against a datasheet; when it cannot be measured the evidence is unavailable with the reason. "
        "Bucket weights: steps, or samples + global_batch. Mixed shapes aggregate as total FLOPs / total time. "
        "Unknown accelerators or precisions are refused: pass peak_tflops."
    ),
    input_model=ComputeMfuInput,
    output_model=ComputeMfuOutput,
    run=run,
    read_only=True,
    destructive=False,
    idempotent=True,
    open_world=False,
)
