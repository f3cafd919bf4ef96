"""The decoder-transformer description shared by FLOP estimates and layout planning.

Assumed architecture (what the parameter counts and FLOP formulas describe): pre-norm decoder layers,
each an attention block (query, key, value and output projections without biases; grouped-query
attention when ``num_kv_heads < num_attention_heads``) followed by either a dense MLP or a
mixture-of-experts block; RMSNorm-style norms with one weight vector of ``hidden_size`` each; an input
embedding and an output projection of ``vocab_size x hidden_size`` (tied or not). Multi-latent
attention, linear biases and multi-token prediction heads are not modelled.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, model_validator

__all__ = ["MoEConfig", "ModelConfig", "moe_layers_in"]


class MoEConfig(BaseModel):
    """Mixture-of-experts settings, with Megatron-LM's meaning of each field."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    num_experts: Annotated[int, Field(ge=1, description="Routed experts per MoE layer.")]
    top_k: Annotated[int, Field(ge=1, description="Routed experts each token is sent to.")]
    moe_ffn_hidden_size: Annotated[
        int | None,
        Field(ge=1, description="Hidden size of one routed expert's MLP; defaults to ffn_hidden_size."),
    ] = None
    shared_expert_ffn_hidden_size: Annotated[
        int,
        Field(ge=0, description="Total hidden size of the always-on shared expert(s); 0 = none."),
    ] = 0
    moe_layer_frequency: Annotated[
        int,
        Field(
            ge=1,
            description="Layer i (0-based) is an MoE layer when i % moe_layer_frequency == 0 (Megatron's "
            "moe_layer_freq); the others have a dense MLP of ffn_hidden_size. 1 = every layer is MoE.",
        ),
    ] = 1

    @model_validator(mode="after")
    def _top_k_within_experts(self) -> MoEConfig:
        if self.top_k > self.num_experts:
            raise ValueError(
                f"top_k={self.top_k} exceeds num_experts={self.num_experts}: a token cannot be routed to "
                "more experts than exist; lower top_k or raise num_experts"
            )
        return self


class ModelConfig(BaseModel):
    """A decoder-only transformer, dense or mixture-of-experts."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    layers: Annotated[int, Field(ge=1, description="Number of transformer layers.")]
    hidden_size: Annotated[int, Field(ge=1, description="Model width h.")]
    ffn_hidden_size: Annotated[
        int, Field(ge=1, description="Hidden size of the dense MLP (per branch with SwiGLU, e.g. 11008).")
    ]
    num_attention_heads: Annotated[int, Field(ge=1, description="Query heads.")]
    num_kv_heads: Annotated[
        int | None,
        Field(ge=1, description="Key/value heads (GQA query groups); defaults to num_attention_heads."),
    ] = None
    head_dim: Annotated[
        int | None, Field(ge=1, description="Per-head dimension; defaults to hidden_size / heads.")
    ] = None
    vocab_size: Annotated[
        int, Field(ge=1, description="Vocabulary size of the embedding (the padded size, if padded).")
    ]
    swiglu: Annotated[
        bool, Field(description="Gated MLP (SwiGLU: three matrices per MLP) rather than a two-matrix MLP.")
    ]
    tie_embeddings: Annotated[
        bool, Field(description="Input embedding and output projection share one weight matrix.")
    ] = False
    moe: Annotated[MoEConfig | None, Field(description="MoE settings; null for a dense model.")] = None

    @model_validator(mode="after")
    def _consistent_shapes(self) -> ModelConfig:
        heads = self.num_attention_heads
        if self.head_dim is None and self.hidden_size % heads != 0:
            raise ValueError(
                f"num_attention_heads={heads} does not divide hidden_size={self.hidden_size}; fix the head "
                "count or pass head_dim explicitly if the model really uses a non-standard head size"
            )
        kv = self.num_kv_heads if self.num_kv_heads is not None else heads
        if kv > heads or heads % kv != 0:
            raise ValueError(
                f"num_kv_heads={kv} must divide num_attention_heads={heads} (each key/value head serves a "
                "whole group of query heads)"
            )
        return self

    @property
    def kv_heads(self) -> int:
        """Key/value heads (equal to the query heads for multi-head attention)."""
        return self.num_kv_heads if self.num_kv_heads is not None else self.num_attention_heads

    @property
    def resolved_head_dim(self) -> int:
        """Per-head dimension, explicit or hidden_size / num_attention_heads."""
        if self.head_dim is not None:
            return self.head_dim
        return self.hidden_size // self.num_attention_heads

    @property
    def query_width(self) -> int:
        """Width of all query heads together (num_attention_heads x head_dim)."""
        return self.num_attention_heads * self.resolved_head_dim

    @property
    def kv_width(self) -> int:
        """Width of all key (or all value) heads together (num_kv_heads x head_dim)."""
        return self.kv_heads * self.resolved_head_dim

    @property
    def mlp_matrices(self) -> int:
        """Weight matrices per MLP: 3 for SwiGLU (gate, up, down), else 2 (up, down)."""
        return 3 if self.swiglu else 2

    @property
    def expert_ffn_hidden_size(self) -> int:
        """Hidden size of one routed expert (0 for a dense model)."""
        if self.moe is None:
            return 0
        size = self.moe.moe_ffn_hidden_size
        return size if size is not None else self.ffn_hidden_size

    def is_moe_layer(self, index: int) -> bool:
        """Whether 0-based layer ``index`` holds experts (Megatron's ``i % moe_layer_freq == 0``)."""
        return self.moe is not None and index % self.moe.moe_layer_frequency == 0

    @property
    def num_moe_layers(self) -> int:
        """Layers with experts: the multiples of the frequency below ``layers``, counted in closed form (a
        loop over layers would keep a call with layers=1e18 busy for ever)."""
        return moe_layers_in(self, 0, self.layers)

    @property
    def num_dense_layers(self) -> int:
        return self.layers - self.num_moe_layers


def moe_layers_in(model: ModelConfig, start: int, stop: int) -> int:
    """How many of the 0-based layers ``start`` to ``stop - 1`` hold experts (`ModelConfig.is_moe_layer`)."""
    if model.moe is None or stop <= start:
        return 0
    f = model.moe.moe_layer_frequency
    return -(-stop // f) - -(-start // f)  # multiples of f in [start, stop): ceil(stop/f) - ceil(start/f)
