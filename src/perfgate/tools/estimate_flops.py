"""estimate_flops: model and hardware FLOPs per optimizer step for a decoder transformer."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from perfgate.evidence import EvidenceState
from perfgate.flops import Convention, FlopBreakdown, ModelConfig, ParamCounts, Recompute, estimate_flops
from perfgate.serving.runtime import ToolRuntime
from perfgate.serving.spec import ToolSpec

__all__ = ["SPEC", "EstimateFlopsInput", "EstimateFlopsOutput", "run"]


class EstimateFlopsInput(BaseModel):
    """A model, the step's token count and the convention to count FLOPs under."""

    model_config = ConfigDict(extra="forbid")

    model: Annotated[ModelConfig, Field(description="The transformer: shapes, GQA, SwiGLU, optional MoE.")]
    seq_len: Annotated[int, Field(ge=1, description="Sequence length in tokens (the attention span).")]
    tokens_per_step: Annotated[
        int,
        Field(
            ge=1, description="Tokens per optimizer step over the whole global batch (sequences x seq_len)."
        ),
    ]
    convention: Annotated[
        Convention,
        Field(
            description="'megatron': Megatron-LM's num_floating_point_operations (causal attention at half, "
            "router omitted) - use it to compare with Megatron's TFLOP/s/GPU log; 'palm': 6N + 12·L·H·Q·T "
            "(PaLM appendix B, no causal discount) - use it for MFU as published by PaLM-style reports."
        ),
    ]
    recompute: Annotated[
        Recompute,
        Field(description="Activation recomputation the run uses; only hardware FLOPs depend on it."),
    ] = "none"
    devices: Annotated[
        int | None,
        Field(
            ge=1,
            description="Devices that share each optimizer step (world size). When given, the per-device "
            "figures that compute_mfu's buckets[].flops_per_step expects are returned too.",
        ),
    ] = None


class EstimateFlopsOutput(BaseModel):
    """FLOPs of one optimizer step; ``*_per_step`` figures cover the whole global batch."""

    evidence_id: str
    state: EvidenceState
    convention: Convention
    recompute: Recompute
    model_flops_per_step: int = Field(description="Model FLOPs of one optimizer step, whole global batch.")
    hardware_flops_per_step: int = Field(
        description="Model FLOPs plus recomputed forward FLOPs, whole batch."
    )
    recompute_flops_per_step: int
    flops_per_token: float = Field(description="Model FLOPs per token (forward + backward).")
    hardware_flops_per_token: float
    devices: int | None
    model_flops_per_step_per_device: float | None = Field(
        description="model_flops_per_step / devices: compute_mfu's flops_per_step with flops_kind='model'."
    )
    hardware_flops_per_step_per_device: float | None = Field(
        description="hardware_flops_per_step / devices: compute_mfu's flops_per_step with flops_kind='hardware'."
    )
    breakdown: FlopBreakdown = Field(description="Model FLOPs per step by component.")
    formula: str
    symbols: dict[str, int]
    recompute_assumption: str
    params: ParamCounts
    warnings: list[str]


async def run(inp: EstimateFlopsInput, rt: ToolRuntime) -> EstimateFlopsOutput:
    est = estimate_flops(
        inp.model,
        seq_len=inp.seq_len,
        tokens_per_step=inp.tokens_per_step,
        convention=inp.convention,
        recompute=inp.recompute,
    )
    warnings = list(est.warnings)
    if inp.devices is None:
        warnings.append(
            "these are FLOPs of the whole global batch; pass devices (or divide by the world size) before "
            "handing them to compute_mfu, which expects FLOPs per device per step"
        )
    ev = rt.evidence()
    out = EstimateFlopsOutput(
        evidence_id=ev.id,
        state=EvidenceState.EXECUTED,
        convention=est.convention,
        recompute=est.recompute,
        model_flops_per_step=est.model_flops_per_step,
        hardware_flops_per_step=est.hardware_flops_per_step,
        recompute_flops_per_step=est.recompute_flops_per_step,
        flops_per_token=est.flops_per_token,
        hardware_flops_per_token=est.hardware_flops_per_token,
        devices=inp.devices,
        model_flops_per_step_per_device=est.model_flops_per_step / inp.devices if inp.devices else None,
        hardware_flops_per_step_per_device=est.hardware_flops_per_step / inp.devices if inp.devices else None,
        breakdown=est.breakdown,
        formula=est.formula,
        symbols=est.symbols,
        recompute_assumption=est.recompute_assumption,
        params=est.params,
        warnings=warnings,
    )
    return await rt.commit(ev, out)


SPEC = ToolSpec(
    name="estimate_flops",
    title="Estimate model FLOPs per step",
    description=(
        "Model (and, with recompute, hardware) FLOPs per optimizer step of a dense or MoE decoder "
        "transformer, megatron or palm convention; pass devices for the per-device figure compute_mfu takes."
    ),
    details=(
        "Compute model FLOPs (and hardware FLOPs with recomputation) per optimizer step for a dense or MoE "
        "decoder transformer, under a named convention: 'megatron' (matches Megatron-LM's TFLOP/s/GPU) or "
        "'palm' (6N + 12·L·H·Q·T). Returns a per-component breakdown, the formula and parameter counts. Use it "
        "before compute_mfu: pass devices to get the per-device flops_per_step that compute_mfu expects."
    ),
    input_model=EstimateFlopsInput,
    output_model=EstimateFlopsOutput,
    run=run,
    read_only=True,
    destructive=False,
    idempotent=True,
    open_world=False,
)
