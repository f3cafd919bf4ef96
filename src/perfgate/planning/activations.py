"""Activation memory of one transformer layer for one micro-batch.

The accounting follows Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer
Models" (arXiv:2205.05198), section 4: every tensor kept for the backward pass, in bytes, with tensor
and sequence parallelism dividing all of it by tp. Their GPT figure, 34·s·b·h + 5·a·s²·b bytes per
layer (16-bit activations, dropout on, unfused attention, GeLU MLP with ffn = 4h, multi-head
attention), is the special case of the per-token terms below with a = 2 bytes per element:

- attention block: norm input a·h, QKV-projection input a·h, Q a·H·d, K and V a·G·d each, projection
  input (attention output) a·H·d; unfused attention adds the softmax a·H·s (plus its dropout mask H·s
  and dropped copy a·H·s with dropout); flash attention instead keeps a fp32 log-sum-exp per head (4·H);
  a 1-byte residual-dropout mask h with dropout.
- dense MLP: norm input a·h, first-matmul input a·h, activation function: GeLU input and output 2·a·f,
  SwiGLU gate and up outputs plus their product 3·a·f; residual-dropout mask h with dropout.
- MoE block: norm input and output 2·a·h, fp32 router probabilities 4·E, per routed copy (top_k per
  token, balanced routing assumed) the expert input a·h (gathered over etp), its activation-function
  tensors and its output a·h (kept to weight it by the router probability), the shared expert's
  activation-function tensors; residual-dropout mask h with dropout.

Selective recomputation drops what core attention can rebuild (softmax, its mask and dropout; the
log-sum-exp under flash); full recomputation keeps only each layer's input (a·h per token) plus the
activations of the one layer being recomputed.
"""

from __future__ import annotations

from perfgate.flops.config import ModelConfig
from perfgate.planning.mesh import ParallelMesh
from perfgate.planning.setup import TrainingSetup

__all__ = ["ACTIVATION_SOURCE", "layer_activation_bytes", "layer_input_bytes", "local_tokens"]

ACTIVATION_SOURCE = (
    "Korthikanti et al. 2022, 'Reducing Activation Recomputation in Large Transformer Models' "
    "(arXiv:2205.05198), sec. 4, generalized to GQA, SwiGLU, flash attention and MoE experts"
)


def local_tokens(setup: TrainingSetup, mesh: ParallelMesh) -> float:
    """Tokens of one micro-batch held by one GPU between layers: b·s / (cp·tp) (sequence parallel)."""
    return setup.micro_batch_size * setup.seq_len / (mesh.cp * mesh.tp)


def _act_fn_bytes(ffn: int, swiglu: bool, a: int) -> int:
    return (3 if swiglu else 2) * a * ffn


def _attention_bytes_per_token(model: ModelConfig, setup: TrainingSetup, keep_core: bool) -> int:
    a, h, s = setup.activation_bytes, model.hidden_size, setup.seq_len
    heads = model.num_attention_heads
    total = 2 * a * h + a * model.query_width + 2 * a * model.kv_width + a * model.query_width
    if keep_core:
        if setup.attention_kernel == "unfused":
            total += a * heads * s + ((heads * s + a * heads * s) if setup.dropout else 0)
        else:
            total += 4 * heads
    if setup.dropout:
        total += h
    return total


def _mlp_bytes_per_token(
    model: ModelConfig, setup: TrainingSetup, mesh: ParallelMesh, moe_layer: bool
) -> float:
    a, h = setup.activation_bytes, model.hidden_size
    total: float = 2 * a * h + (h if setup.dropout else 0)
    if not moe_layer or model.moe is None:
        return total + _act_fn_bytes(model.ffn_hidden_size, model.swiglu, a)
    moe = model.moe
    per_copy = a * h * mesh.etp + _act_fn_bytes(model.expert_ffn_hidden_size, model.swiglu, a) + a * h
    total += 4 * moe.num_experts + moe.top_k * per_copy
    total += _act_fn_bytes(moe.shared_expert_ffn_hidden_size, model.swiglu, a)
    return total


def layer_activation_bytes(
    model: ModelConfig,
    setup: TrainingSetup,
    mesh: ParallelMesh,
    layer: int | None = None,
    *,
    moe_layer: bool | None = None,
    recompute: str | None = None,
) -> float:
    """Bytes one GPU keeps for layer ``layer`` (0-based; or any layer with experts or without, by
    ``moe_layer``) for one micro-batch under ``recompute``.

    ``recompute`` defaults to the setup's policy; ``"full"`` gives the layer's stored input only.
    """
    assert (layer is None) != (moe_layer is None), "pass the layer or whether it holds experts"
    policy = setup.recompute if recompute is None else recompute
    if policy == "full":
        return layer_input_bytes(model, setup, mesh)
    per_token = _attention_bytes_per_token(model, setup, keep_core=policy == "none")
    experts = model.is_moe_layer(layer) if layer is not None else bool(moe_layer)
    per_token += _mlp_bytes_per_token(model, setup, mesh, experts)
    return per_token * local_tokens(setup, mesh)


def layer_input_bytes(model: ModelConfig, setup: TrainingSetup, mesh: ParallelMesh) -> float:
    """Bytes of one layer's input for one micro-batch on one GPU (what full recomputation keeps)."""
    return setup.activation_bytes * model.hidden_size * local_tokens(setup, mesh)
