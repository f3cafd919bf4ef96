"""compute_mfu: model/hardware FLOP utilization from measured step times and a sourced or measured peak."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Annotated, Literal

import anyio.to_thread
from pydantic import BaseModel, ConfigDict, Field, model_validator

from perfgate.errors import ToolError
from perfgate.evidence import EvidenceState
from perfgate.evidence.access import as_dict
from perfgate.hardware.device_peak import (
    MEASURED_CAVEAT,
    Peak,
    RunDevice,
    is_this_cpu,
    peak_for,
    precision_of,
)
from perfgate.hardware.peaks import PeakLookupError, Precision, find_device, lookup_peak
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


@dataclass(frozen=True)
class _Resolved:
    name: str
    flops_per_step: float
    step_time_s: float
    weight: float
    flops_id: str | None
    window_id: str | None


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


def utilization(
    buckets: list[_Resolved], peak_tflops: float | None
) -> tuple[float, float | None, float, float, list[BucketResult]]:
    """Aggregate achieved TFLOP/s as total FLOPs / total time (never a mean of per-bucket ratios).

    Returns (achieved_tflops, ratio, total_flops, total_time_s, per-bucket results); ratio may exceed 1
    on bad inputs, and is None (per bucket too) without a peak.
    """
    total_flops = math.fsum(b.flops_per_step * b.weight for b in buckets)
    total_time = math.fsum(b.step_time_s * b.weight for b in buckets)
    achieved = total_flops / total_time / 1e12
    per_bucket = [
        BucketResult(
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
    return (
        achieved,
        None if peak_tflops is None else achieved / peak_tflops,
        total_flops,
        total_time,
        per_bucket,
    )


_WINDOW_TOOLS = ("run_benchmark_window", "import_benchmark")
_OK = (EvidenceState.EXECUTED, EvidenceState.PASSED)


def _number(value: object) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


async def _resolve(b: Bucket, inp: ComputeMfuInput, rt: ToolRuntime, warnings: list[str]) -> _Resolved:
    """The bucket's FLOPs and step time, read from evidence where ids are given.

    Raises:
        ToolError: an id of the wrong tool, unusable evidence, or evidence that contradicts itself.
    """
    step_time = b.step_time_s
    world: int | None = None
    window_tokens: float | None = None
    if b.window_id is not None:
        w = await rt.load(b.window_id)
        if w.tool not in _WINDOW_TOOLS:
            raise ToolError(
                f"window_id {b.window_id} is a {w.tool} record; pass run_benchmark_window or import_benchmark ids"
            )
        if w.profiled:
            raise ToolError(f"window {b.window_id} was profiled: profiled step times are never MFU evidence")
        if w.state not in _OK:
            raise ToolError(f"window {b.window_id} is {w.state.value}: measure a window that executed")
        throughput = as_dict(w.result.get("throughput"))
        steps_per_s = _number(throughput.get("steps_per_s"))
        if steps_per_s is None or steps_per_s <= 0:
            raise ToolError(f"window {b.window_id} has no step rate to take a step time from")
        step_time = 1.0 / steps_per_s
        tokens_per_s = _number(throughput.get("tokens_per_s"))
        window_tokens = None if tokens_per_s is None else tokens_per_s / steps_per_s
        world_value = w.result.get("world_size")
        world = world_value if isinstance(world_value, int) else None
        if w.tool == "import_benchmark":
            warnings.append(
                f"bucket {b.name!r}: the step time is imported from a log ({b.window_id}), not measured by perfgate"
            )
    flops = b.flops_per_step
    if b.flops_id is not None:
        f = await rt.load(b.flops_id)
        if f.tool != "estimate_flops":
            raise ToolError(f"flops_id {b.flops_id} is a {f.tool} record; pass an estimate_flops id")
        if inp.flops_kind == "profiler_attributed":
            raise ToolError(
                "estimate_flops counts model/hardware FLOPs: flops_kind 'profiler_attributed' needs flops_per_step"
            )
        key = "model" if inp.flops_kind == "model" else "hardware"
        per_device = _number(f.result.get(f"{key}_flops_per_step_per_device"))
        whole = _number(f.result.get(f"{key}_flops_per_step"))
        devices = f.result.get("devices")
        if per_device is None:
            if whole is None or world is None:
                raise ToolError(
                    f"estimate_flops {b.flops_id} gives whole-batch FLOPs and no device count, and no window "
                    "world size is known: call estimate_flops with devices=<world size>"
                )
            per_device = whole / world
            warnings.append(
                f"bucket {b.name!r}: whole-batch FLOPs divided by the window's world size {world}"
            )
        elif isinstance(devices, int) and world is not None and devices != world:
            raise ToolError(
                f"bucket {b.name!r}: estimate_flops {b.flops_id} spreads a step over {devices} devices but window "
                f"{b.window_id} ran {world} ranks: estimate with devices={world}"
            )
        est_tokens = _number(as_dict(f.inputs).get("tokens_per_step"))
        if (
            est_tokens is not None
            and window_tokens is not None
            and not math.isclose(est_tokens, window_tokens, rel_tol=0.01)
        ):
            raise ToolError(
                f"bucket {b.name!r}: estimate_flops {b.flops_id} counts {est_tokens:g} tokens per step but window "
                f"{b.window_id} processed {window_tokens:g}: the FLOPs and the step time describe different steps"
            )
        flops = per_device
    assert flops is not None and step_time is not None
    return _Resolved(b.name, flops, step_time, b.weight, b.flops_id, b.window_id)


async def _run_devices(inp: ComputeMfuInput, rt: ToolRuntime) -> list[tuple[str, RunDevice, object]]:
    """Per window_id bucket: (id, the device its run recorded, its contract's precision invariant)."""
    out: list[tuple[str, RunDevice, object]] = []
    for b in inp.buckets:
        if b.window_id is None:
            continue
        w = await rt.load(b.window_id)
        fingerprint = as_dict(w.result.get("environment_fingerprint"))
        ranks = w.result.get("ranks")
        first = as_dict(ranks[0]) if isinstance(ranks, list) and ranks else {}
        threads = fingerprint.get("num_threads")
        kind, name = fingerprint.get("device_kind"), fingerprint.get("device_name")
        version = fingerprint.get("torch_version")
        device = RunDevice(
            kind=kind if isinstance(kind, str) else None,
            name=name if isinstance(name, str) else None,
            hostname=host if isinstance(host := first.get("hostname"), str) else None,
            threads=int(threads) if isinstance(threads, str) and threads.isdigit() else None,
            torch_version=version if isinstance(version, str) else None,
        )
        invariants = as_dict(as_dict(as_dict(w.inputs).get("contract")).get("invariants"))
        out.append((b.window_id, device, invariants.get("precision")))
    return out


def _precision(inp: ComputeMfuInput, runs: list[tuple[str, RunDevice, object]]) -> Precision:
    """The given precision, else the one every run's contract declares.

    Raises:
        ToolError: none given and the runs declare none the peak table knows, or declare different ones.
    """
    if inp.precision is not None:
        return inp.precision
    declared: dict[str, Precision | None] = {str(p): precision_of(p) for _, _, p in runs}
    known: set[Precision | None] = set(declared.values())
    if len(known) == 1 and None not in known:
        found = known.pop()
        assert found is not None
        return found
    shown = ", ".join(sorted(declared)) or "nothing"
    raise ToolError(
        f"give precision (fp32, tf32, bf16, fp16, fp8, int8): the runs' contracts declare {shown}, which names "
        "no single one of them"
    )


def _device(inp: ComputeMfuInput, runs: list[tuple[str, RunDevice, object]]) -> RunDevice:
    """The device to take the peak of: the runs' own, or the one given when it is the runs' device.

    Raises:
        ToolError: the runs ran on different devices, record none and none is given, or ran on another
            device than the one given.
    """
    recorded = {(d.kind, d.name, d.hostname): (i, d) for i, d, _ in runs if d.kind is not None}
    if len({(k, n) for k, n, _ in recorded}) > 1:
        seen = "; ".join(f"{i}: {d.label}" for i, d in recorded.values())
        raise ToolError(
            f"the windows ran on different devices ({seen}): compute each device's MFU in its own call"
        )
    run = next(iter(recorded.values()))[1] if recorded else None
    if inp.device is None:
        if run is None:
            raise ToolError(
                "the windows record no device (imported logs do not): pass device and precision, or peak_tflops"
            )
        return run
    if is_this_cpu(inp.device):
        if run is not None and run.kind != "cpu":
            raise ToolError(
                f"device {inp.device!r} is a CPU but window {next(iter(recorded.values()))[0]} ran on "
                f"{run.label}: leave device out to use the run's"
            )
        return run or RunDevice(kind="cpu", name=None)
    if run is not None:
        mismatch = run.kind == "cpu"
        if not mismatch and run.name is not None:
            try:
                mismatch = find_device(inp.device) is not find_device(run.name)
            except PeakLookupError:
                mismatch = False  # the table lookup of the given name refuses it below
        if mismatch:
            raise ToolError(
                f"window {next(iter(recorded.values()))[0]} ran on {run.label}, not {inp.device!r}: leave device "
                "out to use the run's (a CPU's peak is measured on this machine)"
            )
    return RunDevice(kind=run.kind if run else None, name=inp.device)


async def _peak(inp: ComputeMfuInput, rt: ToolRuntime, warnings: list[str]) -> tuple[Peak, Precision | None]:
    """The denominator: the caller's peak_tflops, the table's, or this machine's measured CPU peak.

    Raises:
        ToolError: no precision or device can be settled, or the table has no figure for the device.
    """
    runs = await _run_devices(inp, rt)
    if inp.peak_tflops is not None:
        peak = Peak(
            inp.peak_tflops, "explicit", "explicit peak_tflops supplied by the caller", inp.device or ""
        )
        if inp.device and inp.precision and not is_this_cpu(inp.device):
            try:
                table_peak, row = lookup_peak(inp.device, inp.precision)
            except PeakLookupError:
                pass
            else:
                if not math.isclose(table_peak, inp.peak_tflops, rel_tol=1e-3):
                    warnings.append(
                        f"peak_tflops={inp.peak_tflops:g} differs from the table's {table_peak:g} for {row.name} "
                        f"{inp.precision} ({row.source}); the explicit value was used."
                    )
        return peak, inp.precision
    precision = _precision(inp, runs)
    device = _device(inp, runs)
    try:
        peak = await anyio.to_thread.run_sync(
            peak_for, device, precision, rt.ledger.trust.state_dir.resolve()
        )
    except PeakLookupError as exc:
        hint = (
            " For this machine's CPU pass device='cpu', or give a window_id and leave device out: its peak is "
            "measured."
            if inp.device is not None and "not in the peak table" in str(exc)
            else ""
        )
        raise ToolError(str(exc) + hint) from exc
    if peak.measured is not None:
        warnings.append(MEASURED_CAVEAT)
        if device.torch_version is not None and device.torch_version != peak.measured.key.torch_version:
            warnings.append(
                f"the run used torch {device.torch_version}; the peak was measured with the server's torch "
                f"{peak.measured.key.torch_version}"
            )
    return peak, precision


async def run(inp: ComputeMfuInput, rt: ToolRuntime) -> ComputeMfuOutput:
    warnings: list[str] = []
    names = [b.name for b in inp.buckets]
    if len(set(names)) != len(names):
        raise ToolError("bucket names must be unique; merge or rename the duplicated buckets")
    resolved = [await _resolve(b, inp, rt, warnings) for b in inp.buckets]
    found, precision = await _peak(inp, rt, warnings)
    peak = found.tflops

    achieved, ratio, total_flops, total_time, per_bucket = utilization(resolved, peak)
    metric = _METRIC[inp.flops_kind]
    reason: str | None = None
    value: float | None = ratio
    if ratio is None:
        reason = f"no peak for {found.device}: {found.reason}"
    elif ratio > 1.0:
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
    if inp.training_precision and precision and inp.training_precision != precision:
        if _PRECISION_BITS[inp.training_precision] < _PRECISION_BITS[precision]:
            warnings.append(
                f"the run used {inp.training_precision} but the denominator is the {precision} peak: the "
                f"figure is relative to {precision} and overstates utilization of the hardware's "
                f"{inp.training_precision} capability; report it as such, not as MFU."
            )
        else:
            warnings.append(
                f"the run used {inp.training_precision} but the denominator is the {precision} peak, which "
                "the run could never reach: use the peak of the precision actually used."
            )
    if value is not None and inp.flops_kind == "model" and value < 0.01:
        warnings.append(
            "utilization under 1%: check that flops_per_step is per device and per optimizer step"
        )

    ev = rt.evidence()
    out = ComputeMfuOutput(
        evidence_id=ev.id,
        state=EvidenceState.UNAVAILABLE if peak is None else EvidenceState.EXECUTED,
        metric=metric,
        utilization=value,
        utilization_reason=reason,
        achieved_tflops=achieved,
        peak_tflops=peak,
        peak_basis=found.basis,
        peak_source=found.source,
        device=found.device or None,
        precision=precision,
        total_flops=total_flops,
        total_time_s=total_time,
        buckets=per_bucket,
        evidence=[i for b in inp.buckets for i in (b.window_id, b.flops_id) if i is not None],
        warnings=warnings,
    )
    return await rt.commit(ev, out)


SPEC = ToolSpec(
    name="compute_mfu",
    title="Compute MFU / HFU",
    description=(
        "MFU or HFU from per-device FLOPs per step and measured step times against a sourced peak (a CPU's is "
        "measured here); pass window_id and flops_id evidence: the run's device is used. An unknown device "
        "needs peak_tflops."
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
