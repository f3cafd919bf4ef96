"""Model and hardware FLOPs per optimizer step under two named conventions.

Both conventions count 2 FLOPs per multiply-add and 3 matmuls per weight per token (forward, gradient
with respect to the input, gradient with respect to the weight), hence the factor 6; they differ in
what they include:

- ``megatron``: Megatron-LM's ``num_floating_point_operations`` (megatron/training/training.py,
  standard attention path): attention projections with GQA widths, core attention at half the
  sequence length because of the causal mask, dense MLPs, routed top-k plus shared experts, logits
  6·h·V per token; the router gate is not counted.
- ``palm``: Chowdhery et al. 2022 (PaLM), appendix B: 6·N + 12·L·H·Q·T per token, with N the weights
  that take part in matmuls for a token (attention and MLP/active-expert weights, router, output
  projection; the input embedding lookup is not a matmul) and no causal discount for attention.

Hardware FLOPs add what recomputation re-runs (its forward passes only; see `RECOMPUTE_ASSUMPTIONS`).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from perfgate.flops.config import ModelConfig
from perfgate.flops.params import ParamCounts, count_parameters

__all__ = [
    "RECOMPUTE_ASSUMPTIONS",
    "Convention",
    "FlopBreakdown",
    "FlopEstimate",
    "Recompute",
    "estimate_flops",
]

Convention = Literal["megatron", "palm"]
Recompute = Literal["none", "selective", "full"]

RECOMPUTE_ASSUMPTIONS: dict[Recompute, str] = {
    "none": "no recomputation: hardware FLOPs equal model FLOPs",
    "selective": "selective recomputation (Korthikanti et al. 2022) re-runs the forward of core attention "
    "(QK^T, softmax, attention over V) once per step: +1/3 of the core-attention term",
    "full": "full recomputation re-runs the forward of every transformer layer (attention projections, core "
    "attention, MLP/experts, router) once per step: +1/3 of those terms; the output layer and loss are "
    "outside the checkpointed layers (as in Megatron-LM and per-block activation checkpointing), so logits "
    "are not recomputed",
}

_FORMULAS: dict[Convention, str] = {
    "megatron": (
        "F = T * 6 * [ L*(h*(H*d + 2*G*d) + H*d*h) + L*H*d*s "
        "+ h*(m*f*L_dense + m*(k*f_e + f_s)*L_moe) + h*V ]; "
        "6 = 3 (forward, input-gradient, weight-gradient) x 2 (FLOPs per multiply-add); core attention is "
        "2 matmuls (QK^T, AV) over s/2 keys on average (causal mask); m = 3 with SwiGLU else 2; "
        "router not counted"
    ),
    "palm": (
        "F = T * (6*N + 12*L*H*d*s), N = L*(h*(H*d + 2*G*d) + H*d*h) "
        "+ h*(m*f*L_dense + (E + m*(k*f_e + f_s))*L_moe) + h*V "
        "(matmul weights used per token, router and output projection included, input embedding "
        "excluded); attention over all s keys (no causal discount); m = 3 with SwiGLU else 2"
    ),
}


class FlopBreakdown(BaseModel):
    """Model FLOPs per optimizer step by component (forward + backward)."""

    model_config = ConfigDict(frozen=True)

    attention_projections: int = Field(description="Query, key, value and output projections.")
    core_attention: int = Field(description="QK^T and attention-weighted values.")
    mlp: int = Field(description="Dense MLPs, routed top-k experts and shared experts.")
    router: int = Field(description="MoE router gate (0 under the megatron convention, which omits it).")
    logits: int = Field(description="Output projection to the vocabulary.")


class FlopEstimate(BaseModel):
    """FLOPs of one optimizer step over the whole global batch (all devices together)."""

    model_config = ConfigDict(frozen=True)

    convention: Convention
    recompute: Recompute
    seq_len: int
    tokens_per_step: int
    model_flops_per_step: int = Field(description="Model FLOPs of one optimizer step, whole global batch.")
    recompute_flops_per_step: int = Field(description="Extra forward FLOPs re-run by recomputation.")
    hardware_flops_per_step: int = Field(description="model_flops_per_step + recompute_flops_per_step.")
    flops_per_token: float = Field(description="model_flops_per_step / tokens_per_step.")
    hardware_flops_per_token: float
    breakdown: FlopBreakdown
    formula: str
    symbols: dict[str, int] = Field(description="Values of the formula's symbols for this model.")
    recompute_assumption: str
    params: ParamCounts
    warnings: list[str]


def estimate_flops(
    model: ModelConfig,
    *,
    seq_len: int,
    tokens_per_step: int,
    convention: Convention,
    recompute: Recompute = "none",
) -> FlopEstimate:
    """FLOPs of one optimizer step processing ``tokens_per_step`` tokens in sequences of ``seq_len``.

    Raises:
        ValueError: ``seq_len`` or ``tokens_per_step`` is not positive.
    """
    if seq_len < 1 or tokens_per_step < 1:
        raise ValueError(f"seq_len ({seq_len}) and tokens_per_step ({tokens_per_step}) must be positive")
    p = count_parameters(model)
    h, s, tokens = model.hidden_size, seq_len, tokens_per_step
    q, kv = model.query_width, model.kv_width
    n_layers = model.layers

    # Per-token figures, each already forward + backward (factor 6 = 3 passes x 2 FLOPs per FMA).
    attn_proj = 6 * n_layers * (h * (q + 2 * kv) + q * h)
    core_full = 12 * n_layers * q * s  # two s-long matmuls per query, no masking discount
    mlp = 6 * (p.dense_layers * p.dense_mlp_per_layer)
    if model.moe is not None:
        mlp += 6 * p.moe_layers * (model.moe.top_k * p.expert_each + p.shared_expert_per_moe_layer)
    logits = 6 * h * model.vocab_size
    if convention == "megatron":
        core = core_full // 2  # causal mask: on average a query sees half the keys
        router = 0
    else:
        core = core_full
        router = 6 * p.moe_layers * p.router_per_moe_layer
    if recompute == "none":
        extra = 0
    elif recompute == "selective":
        extra = core // 3
    else:
        extra = (attn_proj + core + mlp + router) // 3

    breakdown = FlopBreakdown(
        attention_projections=tokens * attn_proj,
        core_attention=tokens * core,
        mlp=tokens * mlp,
        router=tokens * router,
        logits=tokens * logits,
    )
    model_flops = tokens * (attn_proj + core + mlp + router + logits)
    if convention == "palm":
        # The same total written the PaLM way, as a guard on the decomposition above.
        assert model_flops == tokens * (6 * p.matmul_active_per_token + core_full)

    warnings: list[str] = []
    if tokens % s != 0:
        warnings.append(
            f"tokens_per_step={tokens} is not a multiple of seq_len={s}: fine for packed or variable-length "
            "batches, but check that it is the global batch's token count per optimizer step"
        )
    if tokens < s:
        warnings.append("tokens_per_step is smaller than one sequence; is it per device or per micro-batch?")

    symbols = {
        "T": tokens,
        "s": s,
        "L": n_layers,
        "h": h,
        "H": model.num_attention_heads,
        "G": model.kv_heads,
        "d": model.resolved_head_dim,
        "f": model.ffn_hidden_size,
        "m": model.mlp_matrices,
        "V": model.vocab_size,
        "L_dense": p.dense_layers,
        "L_moe": p.moe_layers,
    }
    if model.moe is not None:
        symbols |= {
            "E": model.moe.num_experts,
            "k": model.moe.top_k,
            "f_e": model.expert_ffn_hidden_size,
            "f_s": model.moe.shared_expert_ffn_hidden_size,
        }
    if convention == "palm":
        symbols["N"] = p.matmul_active_per_token

    return FlopEstimate(
        convention=convention,
        recompute=recompute,
        seq_len=s,
        tokens_per_step=tokens,
        model_flops_per_step=model_flops,
        recompute_flops_per_step=tokens * extra,
        hardware_flops_per_step=model_flops + tokens * extra,
        flops_per_token=model_flops / tokens,
        hardware_flops_per_token=(model_flops + tokens * extra) / tokens,
        breakdown=breakdown,
        formula=_FORMULAS[convention],
        symbols=symbols,
        recompute_assumption=RECOMPUTE_ASSUMPTIONS[recompute],
        params=p,
        warnings=warnings,
    )
