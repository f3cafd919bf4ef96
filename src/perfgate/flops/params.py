"""Parameter counts of a `ModelConfig`, split the way FLOP and memory estimates need them."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from perfgate.flops.config import ModelConfig

__all__ = ["ParamCounts", "count_parameters"]


class ParamCounts(BaseModel):
    """Parameter counts (number of scalars, not bytes).

    Per-layer figures are for one layer of that kind; totals cover the whole model.
    """

    model_config = ConfigDict(frozen=True)

    attention_per_layer: int = Field(description="Query, key, value and output projections of one layer.")
    norms_per_layer: int = Field(description="The two norm weight vectors of one layer.")
    dense_mlp_per_layer: int = Field(description="MLP weights of one dense layer.")
    router_per_moe_layer: int = Field(description="Router (gate) weights of one MoE layer.")
    expert_each: int = Field(description="Weights of one routed expert.")
    routed_experts_per_moe_layer: int = Field(description="All routed experts of one MoE layer.")
    shared_expert_per_moe_layer: int = Field(description="Shared-expert weights of one MoE layer.")
    input_embedding: int = Field(description="Input embedding table (vocab_size x hidden_size).")
    output_projection: int = Field(description="Separate output projection; 0 when tied to the embedding.")
    final_norm: int
    dense_layers: int = Field(description="Number of layers with a dense MLP.")
    moe_layers: int = Field(description="Number of layers with experts.")
    total: int = Field(description="Every parameter of the model, counted once.")
    expert_total: int = Field(description="All routed-expert parameters (sharded by expert parallelism).")
    non_expert_total: int = Field(description="total - expert_total.")
    active_per_token: int = Field(
        description="Parameters a token touches: all non-expert weights plus top_k experts per MoE layer."
    )
    matmul_active_per_token: int = Field(
        description="Weights taking part in matmuls for one token (attention and MLP/active-expert weights, "
        "router, output projection); norms and the input embedding lookup excluded. The PaLM N."
    )


def count_parameters(model: ModelConfig) -> ParamCounts:
    """Count the parameters of ``model`` under the architecture stated in `perfgate.flops.config`."""
    h = model.hidden_size
    attention = h * model.query_width + 2 * h * model.kv_width + model.query_width * h
    norms = 2 * h
    dense_mlp = model.mlp_matrices * h * model.ffn_hidden_size
    if model.moe is not None:
        router = h * model.moe.num_experts
        expert_each = model.mlp_matrices * h * model.expert_ffn_hidden_size
        routed = model.moe.num_experts * expert_each
        shared = model.mlp_matrices * h * model.moe.shared_expert_ffn_hidden_size
        top_k = model.moe.top_k
    else:
        router = expert_each = routed = shared = top_k = 0
    embedding = model.vocab_size * h
    output = 0 if model.tie_embeddings else model.vocab_size * h
    n_dense = model.num_dense_layers
    n_moe = model.num_moe_layers

    layer_common = attention + norms
    total = (
        model.layers * layer_common
        + n_dense * dense_mlp
        + n_moe * (router + routed + shared)
        + embedding
        + output
        + h
    )
    expert_total = n_moe * routed
    active = total - expert_total + n_moe * top_k * expert_each
    matmul_active = (
        model.layers * attention
        + n_dense * dense_mlp
        + n_moe * (router + top_k * expert_each + shared)
        # The logits matmul runs whether or not the weight is tied to the embedding.
        + model.vocab_size * h
    )
    return ParamCounts(
        attention_per_layer=attention,
        norms_per_layer=norms,
        dense_mlp_per_layer=dense_mlp,
        router_per_moe_layer=router,
        expert_each=expert_each,
        routed_experts_per_moe_layer=routed,
        shared_expert_per_moe_layer=shared,
        input_embedding=embedding,
        output_projection=output,
        final_norm=h,
        dense_layers=n_dense,
        moe_layers=n_moe,
        total=total,
        expert_total=expert_total,
        non_expert_total=total - expert_total,
        active_per_token=active,
        matmul_active_per_token=matmul_active,
    )
