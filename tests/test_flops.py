"""Hand-worked FLOP counts for both conventions, dense GQA+SwiGLU and MoE.

Every expected figure is written out from the model's shapes in the comments and expressions below, not
through the library's own helpers.
"""

from __future__ import annotations

from fractions import Fraction

import pytest
from pydantic import ValidationError

from perfgate.flops import ModelConfig, MoEConfig, count_parameters, estimate_flops

# Dense GQA + SwiGLU: L=2, h=64, ffn=176, H=8 query heads, G=2 kv heads, d=64/8=8, V=1000.
DENSE = ModelConfig(
    layers=2,
    hidden_size=64,
    ffn_hidden_size=176,
    num_attention_heads=8,
    num_kv_heads=2,
    vocab_size=1000,
    swiglu=True,
)
# Weights per layer: q 64x(8*8) = 4096, k 64x(2*8) = 1024, v 1024, o (8*8)x64 = 4096 -> 10240.
DENSE_ATTN_W = 4096 + 1024 + 1024 + 4096
# SwiGLU MLP: gate 64x176 + up 64x176 + down 176x64 = 3 * 11264 = 33792.
DENSE_MLP_W = 3 * 64 * 176
SEQ = 128
TOKENS = 1024  # 8 sequences of 128 per optimizer step

# MoE: L=4, h=64, dense ffn=128, H=G=4 (MHA), d=16, V=512, SwiGLU, 8 experts top-2 of width 32,
# one shared expert of width 64, moe_layer_frequency=2 -> layers 0 and 2 are MoE, 1 and 3 dense.
MOE = ModelConfig(
    layers=4,
    hidden_size=64,
    ffn_hidden_size=128,
    num_attention_heads=4,
    vocab_size=512,
    swiglu=True,
    moe=MoEConfig(
        num_experts=8,
        top_k=2,
        moe_ffn_hidden_size=32,
        shared_expert_ffn_hidden_size=64,
        moe_layer_frequency=2,
    ),
)
MOE_SEQ = 64
MOE_TOKENS = 256
# Attention weights per layer: q,k,v,o all 64x64 -> 4 * 4096 = 16384.
MOE_ATTN_W = 4 * 64 * 64
MOE_DENSE_MLP_W = 3 * 64 * 128  # 24576
MOE_EXPERT_W = 3 * 64 * 32  # 6144 per routed expert
MOE_SHARED_W = 3 * 64 * 64  # 12288
MOE_ROUTER_W = 64 * 8  # 512


def test_dense_gqa_swiglu_megatron_convention_matches_hand_count() -> None:
    # Each weight: 3 passes (fwd, dgrad, wgrad) x 2 FLOPs per multiply-add = 6 FLOPs per token.
    proj = 6 * 2 * DENSE_ATTN_W  # 122880
    # Core attention forward per layer per token: QK^T = 2 FLOPs x (H*d = 64) x (s/2 = 64 keys on
    # average under the causal mask) = 8192, attention-over-V the same -> 16384; x3 passes x2 layers.
    core = 3 * 2 * (8192 + 8192)  # 98304
    mlp = 6 * 2 * DENSE_MLP_W  # 405504
    logits = 6 * 64 * 1000  # 384000
    per_token = proj + core + mlp + logits
    assert per_token == 1_010_688

    est = estimate_flops(DENSE, seq_len=SEQ, tokens_per_step=TOKENS, convention="megatron")
    assert est.model_flops_per_step == TOKENS * per_token == 1_034_944_512
    assert est.flops_per_token == per_token
    assert est.breakdown.attention_projections == TOKENS * proj
    assert est.breakdown.core_attention == TOKENS * core
    assert est.breakdown.mlp == TOKENS * mlp
    assert est.breakdown.logits == TOKENS * logits
    assert est.breakdown.router == 0
    assert est.hardware_flops_per_step == est.model_flops_per_step  # recompute="none"
    assert est.convention == "megatron"
    assert "s/2" in est.formula


def test_dense_gqa_swiglu_palm_convention_matches_hand_count() -> None:
    # N: matmul weights per token = 2 layers x (attention 10240 + MLP 33792) + output projection 64x1000.
    n = 2 * (DENSE_ATTN_W + DENSE_MLP_W) + 64 * 1000
    assert n == 152_064
    # 12*L*H*Q*T with T the sequence length: 12 * 2 * 8 * 8 * 128.
    attn = 12 * 2 * 8 * 8 * 128
    assert attn == 196_608
    per_token = 6 * n + attn  # 912384 + 196608

    est = estimate_flops(DENSE, seq_len=SEQ, tokens_per_step=TOKENS, convention="palm")
    assert est.model_flops_per_step == TOKENS * per_token == 1_135_607_808
    assert est.symbols["N"] == n
    assert est.params.matmul_active_per_token == n
    # PaLM does not discount the causal mask: core attention is twice Megatron's.
    assert est.breakdown.core_attention == TOKENS * attn


def test_recompute_adds_forward_passes_only() -> None:
    # Megatron per token (above): proj 122880, core 98304, mlp 405504, logits 384000.
    selective = estimate_flops(
        DENSE, seq_len=SEQ, tokens_per_step=TOKENS, convention="megatron", recompute="selective"
    )
    # selective: one more forward of core attention = 98304 / 3 = 32768 per token.
    assert selective.recompute_flops_per_step == TOKENS * 32768
    assert selective.hardware_flops_per_step == TOKENS * (1_010_688 + 32768)
    assert selective.model_flops_per_step == TOKENS * 1_010_688

    full = estimate_flops(DENSE, seq_len=SEQ, tokens_per_step=TOKENS, convention="megatron", recompute="full")
    # full: one more forward of every layer (not the logits): (122880 + 98304 + 405504) / 3 = 208896.
    assert full.recompute_flops_per_step == TOKENS * 208_896
    assert full.hardware_flops_per_token == 1_010_688 + 208_896
    assert "logits are not recomputed" in full.recompute_assumption


def test_moe_megatron_convention_counts_top_k_and_shared_experts() -> None:
    proj = 6 * 4 * MOE_ATTN_W  # 393216
    # Core forward per layer per token: 2 matmuls x 2 FLOPs x (H*d = 64) x (s/2 = 32) = 8192; x3 x4 layers.
    core = 3 * 4 * 8192  # 98304
    dense_mlp = 6 * 2 * MOE_DENSE_MLP_W  # layers 1 and 3: 294912
    # MoE layers 0 and 2: top-2 routed experts + the shared expert, router not counted.
    moe_mlp = 6 * 2 * (2 * MOE_EXPERT_W + MOE_SHARED_W)  # 294912
    logits = 6 * 64 * 512  # 196608
    per_token = proj + core + dense_mlp + moe_mlp + logits
    assert per_token == 1_277_952

    est = estimate_flops(MOE, seq_len=MOE_SEQ, tokens_per_step=MOE_TOKENS, convention="megatron")
    assert est.model_flops_per_step == MOE_TOKENS * per_token == 327_155_712
    assert est.breakdown.mlp == MOE_TOKENS * (dense_mlp + moe_mlp)
    assert est.breakdown.router == 0
    assert est.symbols["L_moe"] == 2 and est.symbols["L_dense"] == 2


def test_moe_palm_convention_counts_active_experts_and_router() -> None:
    # N = 4 x attention + 2 dense MLPs + 2 x (router + 2 routed experts + shared) + output projection.
    n = 4 * MOE_ATTN_W + 2 * MOE_DENSE_MLP_W + 2 * (MOE_ROUTER_W + 2 * MOE_EXPERT_W + MOE_SHARED_W) + 64 * 512
    assert n == 197_632
    attn = 12 * 4 * 4 * 16 * 64  # 12*L*H*Q*T = 196608
    est = estimate_flops(MOE, seq_len=MOE_SEQ, tokens_per_step=MOE_TOKENS, convention="palm")
    assert est.model_flops_per_step == MOE_TOKENS * (6 * n + attn) == 353_894_400
    assert est.breakdown.router == MOE_TOKENS * 6 * 2 * MOE_ROUTER_W


def test_moe_parameter_counts_total_and_active() -> None:
    p = count_parameters(MOE)
    norms = 2 * 64
    total = (
        4 * (MOE_ATTN_W + norms)
        + 2 * MOE_DENSE_MLP_W
        + 2 * (MOE_ROUTER_W + 8 * MOE_EXPERT_W + MOE_SHARED_W)
        + 2 * 512 * 64  # untied embedding and output projection
        + 64  # final norm
    )
    assert p.total == total == 304_704
    assert p.expert_total == 2 * 8 * MOE_EXPERT_W
    assert p.active_per_token == total - 2 * (8 - 2) * MOE_EXPERT_W


def test_palm_convention_equals_the_textbook_dense_formula() -> None:
    # MHA, ffn = 4h, GeLU MLP: F = 72*B*s*L*h^2*(1 + s/(6h) + V/(12*L*h)) (no causal discount).
    L, h, s, V, B = 4, 256, 512, 5120, 3
    model = ModelConfig(
        layers=L, hidden_size=h, ffn_hidden_size=4 * h, num_attention_heads=8, vocab_size=V, swiglu=False
    )
    expected = 72 * B * s * L * h**2 * (1 + Fraction(s, 6 * h) + Fraction(V, 12 * L * h))
    palm = estimate_flops(model, seq_len=s, tokens_per_step=B * s, convention="palm")
    assert palm.model_flops_per_step == expected
    # Megatron halves the s/(6h) attention term for the causal mask.
    causal = 72 * B * s * L * h**2 * (1 + Fraction(s, 12 * h) + Fraction(V, 12 * L * h))
    megatron = estimate_flops(model, seq_len=s, tokens_per_step=B * s, convention="megatron")
    assert megatron.model_flops_per_step == causal


def test_moe_layer_frequency_follows_megatron_modulo_rule() -> None:
    def moe_layers(layers: int, freq: int) -> list[int]:
        moe = MoEConfig(num_experts=8, top_k=2, moe_layer_frequency=freq)
        m = MOE.model_copy(update={"layers": layers, "moe": moe})
        return [i for i in range(layers) if m.is_moe_layer(i)]

    assert moe_layers(4, 1) == [0, 1, 2, 3]
    assert moe_layers(4, 2) == [0, 2]
    assert moe_layers(4, 3) == [0, 3]
    assert moe_layers(4, 5) == [0]


def test_defaults_head_dim_and_kv_heads() -> None:
    assert DENSE.resolved_head_dim == 8
    assert MOE.kv_heads == 4
    assert MOE.expert_ffn_hidden_size == 32
    explicit = DENSE.model_copy(update={"head_dim": 16})
    assert explicit.query_width == 128


def test_non_multiple_token_count_is_warned() -> None:
    est = estimate_flops(DENSE, seq_len=SEQ, tokens_per_step=100, convention="megatron")
    assert any("not a multiple" in w for w in est.warnings)
    assert any("smaller than one sequence" in w for w in est.warnings)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"num_attention_heads": 7}, "does not divide hidden_size"),
        ({"layers": 0}, "greater than or equal to 1"),
        ({"num_kv_heads": 3}, "must divide num_attention_heads"),
        ({"num_kv_heads": 16}, "must divide num_attention_heads"),
        ({"vocab_size": -1}, "greater than or equal to 1"),
    ],
)
def test_bad_model_shapes_are_refused_with_a_reason(changes: dict[str, int], message: str) -> None:
    fields = DENSE.model_dump() | changes
    with pytest.raises(ValidationError, match=message):
        ModelConfig.model_validate(fields)


def test_top_k_above_expert_count_is_refused() -> None:
    with pytest.raises(ValidationError, match="top_k=3 exceeds num_experts=2"):
        MoEConfig(num_experts=2, top_k=3)


def test_unknown_fields_are_refused() -> None:
    with pytest.raises(ValidationError, match="extra"):
        ModelConfig.model_validate(DENSE.model_dump() | {"num_layers": 2})


def test_non_positive_sequence_or_tokens_are_refused() -> None:
    with pytest.raises(ValueError, match="must be positive"):
        estimate_flops(DENSE, seq_len=0, tokens_per_step=TOKENS, convention="megatron")
    with pytest.raises(ValueError, match="must be positive"):
        estimate_flops(DENSE, seq_len=SEQ, tokens_per_step=-5, convention="palm")
