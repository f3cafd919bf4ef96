"""Layout planning: hand-checked memory cases, one illegal mesh per rule, pipeline and search behaviour."""

from __future__ import annotations

import pytest

from perfgate.flops import ModelConfig, MoEConfig, count_parameters
from perfgate.planning import (
    GIB,
    DeviceMemoryError,
    MeshRequest,
    SearchOptions,
    TrainingSetup,
    device_memory,
    estimate_memory,
    layer_activation_bytes,
    optimizer_bytes_per_param,
    plan_layout,
    search_layouts,
)

GPU_80G = 80 * GIB  # the peak table's H100 SXM entry: 85,899,345,920 bytes

# Llama-2-7B shapes: 32 layers, h=4096, SwiGLU ffn=11008, 32 heads (MHA), vocab 32000, untied.
DENSE_7B = ModelConfig(
    layers=32, hidden_size=4096, ffn_hidden_size=11008, num_attention_heads=32, vocab_size=32000, swiglu=True
)
# Mixtral-8x7B shapes: as above with ffn=14336, 8 kv heads, 8 experts top-2 in every layer.
MOE_8X7B = ModelConfig(
    layers=32,
    hidden_size=4096,
    ffn_hidden_size=14336,
    num_attention_heads=32,
    num_kv_heads=8,
    vocab_size=32000,
    swiglu=True,
    moe=MoEConfig(num_experts=8, top_k=2),
)
SEQ4K = TrainingSetup(seq_len=4096, micro_batch_size=1, recompute="selective")


def test_published_parameter_counts() -> None:
    # per layer: attention 4*4096^2 = 67,108,864; SwiGLU 3*4096*11008 = 135,266,304; norms 8,192
    # x32 = 6,476,267,520; embedding + output 2*32000*4096 = 262,144,000; final norm 4,096
    assert count_parameters(DENSE_7B).total == 6_738_415_616
    # attention 4096*(4096 + 2*1024) + 4096*4096 = 41,943,040; experts 8*3*4096*14336 = 1,409,286,144;
    # router 4096*8 = 32,768; norms 8,192 -> 1,451,270,144 per layer, x32 + 262,148,096
    assert count_parameters(MOE_8X7B).total == 46_702_792_704


def test_dense_7b_fits_on_8x80gb_at_tp1_with_the_distributed_optimizer() -> None:
    p = 6_738_415_616
    plan = plan_layout(
        DENSE_7B,
        MeshRequest(tp=1).resolve(8),
        SEQ4K,
        world_size=8,
        gpus_per_node=8,
        device_memory_bytes=GPU_80G,
    )
    assert plan.legal and plan.mesh.dp == 8
    stage = plan.memory.stages[0]
    assert stage.params_bytes == 2 * p  # bf16 weights: 13,476,831,232
    assert stage.grads_bytes == 4 * p  # fp32 gradient buffer: 26,953,662,464
    assert stage.optimizer_bytes == 12 * p // 8  # fp32 master + 2 moments over dp=8: 10,107,623,424
    # Activations per token per layer (bf16, flash, selective, no dropout):
    #   attention: norm in 2h + QKV in 2h + Q 2h + K 2h + V 2h + output 2h = 12h = 49,152
    #   MLP: norm in 2h + fc1 in 2h + SwiGLU gate/up/product 3*2*11008 = 16,384 + 66,048 = 82,432
    per_token_layer = 12 * 4096 + 4 * 4096 + 6 * 11008
    assert per_token_layer == 131_584
    assert stage.activations_bytes == per_token_layer * 4096 * 32  # 17,246,978,048
    # token ids 8*4096 + (final norm in + output-layer in 2*2*4096 + fp32 logits 4*32000) * 4096 tokens
    assert stage.embedding_and_logits_bytes == 8 * 4096 + (4 * 4096 + 4 * 32000) * 4096
    total = 2 * p + 4 * p + 12 * p // 8 + 17_246_978_048 + 591_429_632
    assert plan.memory.total_bytes == total == 68_376_524_800  # 63.7 GiB
    assert plan.memory.reserve_bytes == 8 * GIB  # 10% of 80 GiB
    assert plan.memory.margin_bytes == 80 * GIB - 8 * GIB - total == 8_932_886_528  # 8.3 GiB to spare
    assert plan.fits

    no_dist = SEQ4K.model_copy(update={"distributed_optimizer": False})
    plan = plan_layout(
        DENSE_7B,
        MeshRequest(tp=1).resolve(8),
        no_dist,
        world_size=8,
        gpus_per_node=8,
        device_memory_bytes=GPU_80G,
    )
    # 18 bytes per parameter = 121.3 GB of static state alone: it cannot fit.
    assert plan.memory.stages[0].optimizer_bytes == 12 * p
    assert not plan.fits and plan.legal


def test_moe_8x7b_on_16_gpus_with_ep8_needs_pp2_and_full_recompute_at_tp1() -> None:
    # tp=1, pp=1, ep=8 -> edp=2: each GPU holds 1 expert of each of the 32 layers.
    flat = plan_layout(
        MOE_8X7B,
        MeshRequest(ep=8).resolve(16),
        SEQ4K,
        world_size=16,
        gpus_per_node=8,
        device_memory_bytes=GPU_80G,
    )
    assert flat.legal and flat.mesh.edp == 2 and flat.mesh.dp == 16
    s0 = flat.memory.stages[0]
    dense = 32 * (41_943_040 + 8_192 + 32_768) + 2 * 32000 * 4096 + 4096  # 1,605,636,096
    experts = 32 * 3 * 4096 * 14336  # 5,637,144,576
    assert (s0.dense_params, s0.expert_params) == (dense, experts)
    static = 6 * (dense + experts) + 12 * (dense // 16 + experts // 2)
    assert s0.params_bytes + s0.grads_bytes + s0.optimizer_bytes == static == 78_483_778_560
    # 73.1 GiB of weights, grads and optimizer states: over the 72 GiB left after the reserve already.
    assert static > 72 * GIB and not flat.fits

    full = SEQ4K.model_copy(update={"recompute": "full"})
    piped = plan_layout(
        MOE_8X7B,
        MeshRequest(pp=2, ep=8).resolve(16),
        full,
        world_size=16,
        gpus_per_node=8,
        device_memory_bytes=GPU_80G,
    )
    assert piped.legal and (piped.mesh.dp, piped.mesh.edp) == (8, 1)
    first, last = piped.memory.stages
    # Stage 0: 16 layers, embedding; expert states unsharded (edp=1), dense states over dp=8.
    dense0 = 16 * (41_943_040 + 8_192 + 32_768) + 32000 * 4096  # 802,816,000
    experts0 = 16 * 3 * 4096 * 14336  # 2,818,572,288
    assert first.optimizer_bytes == 12 * (dense0 // 8 + experts0)
    # Full recompute: 2 in-flight micro-batches x 16 layer inputs (2*4096 bytes x 4096 tokens) plus one
    # MoE layer's whole activation set: attention 2h+2h+Q 8192+K 2048+V 2048+O 8192+lse 4*32 = 36,992;
    # MoE norm in/out 16,384 + router 4*8 + top-2 x (expert in 8192 + SwiGLU 6*14336 + expert out 8192)
    layer_full = 36_992 + 16_384 + 32 + 2 * (8192 + 6 * 14336 + 8192)
    assert layer_full == 258_208
    assert first.in_flight_microbatches == 2
    assert first.activations_bytes == 2 * 16 * 8192 * 4096 + layer_full * 4096
    assert last.in_flight_microbatches == 1
    assert piped.memory.worst_stage == 1  # the output layer and fp32 logits outweigh one in-flight input set
    assert piped.memory.total_bytes == 58_941_339_648  # 54.9 GiB
    assert piped.fits and piped.memory.margin_bytes == 80 * GIB - 8 * GIB - 58_941_339_648


def test_korthikanti_gpt_formula_is_reproduced_for_its_assumptions() -> None:
    # GPT-style layer: MHA, GeLU, ffn = 4h, dropout, unfused attention: 34*s*b*h + 5*a*s^2*b bytes,
    # divided by t with tensor + sequence parallelism (Korthikanti et al. 2022, Table 2).
    h, a, s, b, t = 1024, 16, 2048, 2, 8
    gpt = ModelConfig(
        layers=4, hidden_size=h, ffn_hidden_size=4 * h, num_attention_heads=a, vocab_size=512, swiglu=False
    )
    mesh = MeshRequest(tp=t).resolve(t)
    base = TrainingSetup(seq_len=s, micro_batch_size=b, dropout=True, attention_kernel="unfused")
    assert layer_activation_bytes(gpt, base, mesh, 0) == (34 * s * b * h + 5 * a * s * s * b) / t
    selective = base.model_copy(update={"recompute": "selective"})
    assert layer_activation_bytes(gpt, selective, mesh, 0) == 34 * s * b * h / t
    full = base.model_copy(update={"recompute": "full"})
    assert layer_activation_bytes(gpt, full, mesh, 0) == 2 * s * b * h / t


def test_optimizer_bytes_match_the_distributed_optimizer_table() -> None:
    # bf16 params + fp32 grads: 6 + 12/d; fp16 + fp16: 4 + 16/d; fp32 + fp32: 8 + 8/d.
    assert optimizer_bytes_per_param(SEQ4K) == 12
    fp16 = SEQ4K.model_copy(update={"param_precision": "fp16", "grad_precision": "fp16"})
    assert optimizer_bytes_per_param(fp16) == 16
    fp32 = SEQ4K.model_copy(update={"param_precision": "fp32"})
    assert optimizer_bytes_per_param(fp32) == 8


def test_pipeline_in_flight_micro_batches_follow_the_schedules() -> None:
    small = DENSE_7B.model_copy(update={"layers": 16})
    stages = estimate_memory(small, MeshRequest(pp=4).resolve(4), SEQ4K, GPU_80G).stages
    assert [s.in_flight_microbatches for s in stages] == [4, 3, 2, 1]
    few = SEQ4K.model_copy(update={"global_batch_size": 2})  # dp=1 -> 2 micro-batches per step
    stages = estimate_memory(small, MeshRequest(pp=4).resolve(4), few, GPU_80G).stages
    assert [s.in_flight_microbatches for s in stages] == [2, 2, 2, 1]
    # Interleaved pp=4, vpp=2: rank 0 keeps 2*(4-1) + (2-1)*4 + 1 = 11 chunks of 2 layers = 5.5
    # micro-batches of its 4 layers, i.e. pp * (1 + (pp-1)/(pp*vpp)) = 4 * 11/8.
    stages = estimate_memory(small, MeshRequest(pp=4, vpp=2).resolve(4), SEQ4K, GPU_80G).stages
    assert stages[0].in_flight_microbatches == 5.5
    assert stages[0].layers == 4


def test_shards_add_up_to_the_whole_model() -> None:
    p = count_parameters(MOE_8X7B)
    mesh = MeshRequest(pp=4, ep=4).resolve(16)
    stages = estimate_memory(MOE_8X7B, mesh, SEQ4K, GPU_80G).stages
    assert sum(s.dense_params for s in stages) == p.non_expert_total
    assert sum(s.expert_params for s in stages) * mesh.ep == p.expert_total


def _violations(model: ModelConfig, mesh: MeshRequest, world: int, setup: TrainingSetup = SEQ4K) -> list[str]:
    plan = plan_layout(
        model,
        mesh.resolve(world),
        setup,
        world_size=world,
        gpus_per_node=8,
        device_memory_bytes=GPU_80G,
        keep_hot_comm_in_node=True,
    )
    return plan.violations


@pytest.mark.parametrize(
    ("model", "mesh", "world", "rule"),
    [
        (DENSE_7B, MeshRequest(dp=4), 8, "attention_mesh_covers_world"),
        (MOE_8X7B, MeshRequest(ep=8, edp=4), 16, "moe_mesh_covers_world"),
        (DENSE_7B, MeshRequest(ep=2), 8, "moe_mesh_covers_world"),
        (MOE_8X7B, MeshRequest(ep=3), 6, "ep_divides_experts"),
        (DENSE_7B, MeshRequest(pp=3), 12, "pipeline_divides_layers"),
        (DENSE_7B, MeshRequest(pp=64), 64, "pipeline_divides_layers"),
        (DENSE_7B, MeshRequest(vpp=2), 8, "virtual_pipeline_needs_pp"),
        (DENSE_7B.model_copy(update={"num_kv_heads": 4}), MeshRequest(tp=8), 8, "tp_divides_heads"),
        (
            DENSE_7B.model_copy(update={"ffn_hidden_size": 11006}),
            MeshRequest(tp=4),
            8,
            "tp_divides_mlp_widths",
        ),
        (MOE_8X7B, MeshRequest(ep=8, etp=2, tp=2, pp=1), 16, "hot_comm_in_node"),
        (DENSE_7B, MeshRequest(tp=16), 16, "hot_comm_in_node"),
    ],
)
def test_each_rule_rejects_its_illegal_mesh(
    model: ModelConfig, mesh: MeshRequest, world: int, rule: str
) -> None:
    assert _violations(model, mesh, world) == [rule]


def test_node_locality_is_only_checked_when_asked() -> None:
    cross_node = MeshRequest(tp=2, ep=8, etp=2).resolve(16)  # etp*ep = 16 GPUs > 8 per node
    plan = plan_layout(
        MOE_8X7B, cross_node, SEQ4K, world_size=16, gpus_per_node=8, device_memory_bytes=GPU_80G
    )
    check = next(c for c in plan.checks if c.rule == "hot_comm_in_node")
    assert check.status == "not_applicable" and plan.legal
    assert _violations(MOE_8X7B, MeshRequest(tp=2, ep=8, etp=2), 16) == ["hot_comm_in_node"]


def test_uneven_pipeline_split_says_how_stages_would_split() -> None:
    plan = plan_layout(
        DENSE_7B,
        MeshRequest(pp=3).resolve(12),
        SEQ4K,
        world_size=12,
        gpus_per_node=8,
        device_memory_bytes=GPU_80G,
    )
    check = next(c for c in plan.checks if c.rule == "pipeline_divides_layers")
    assert "10 or 11 layers" in check.detail
    assert [s.layers for s in plan.memory.stages] == [11, 11, 10]


def test_sequence_must_split_over_cp_and_tp() -> None:
    odd = SEQ4K.model_copy(update={"seq_len": 4094})  # not a multiple of 2*cp = 4
    assert _violations(DENSE_7B, MeshRequest(cp=2), 8, odd) == ["sequence_splits_evenly"]
    assert _violations(DENSE_7B, MeshRequest(tp=4), 8, odd) == ["sequence_splits_evenly"]
    assert _violations(DENSE_7B, MeshRequest(tp=2, cp=2), 8) == []


def test_global_batch_must_be_whole_micro_batches_per_dp_rank() -> None:
    bad = SEQ4K.model_copy(update={"global_batch_size": 100})  # 100 is not a multiple of 1 x dp 8
    assert _violations(DENSE_7B, MeshRequest(), 8, bad) == ["global_batch_is_whole"]
    good = SEQ4K.model_copy(update={"global_batch_size": 128})
    plan = plan_layout(
        DENSE_7B, MeshRequest().resolve(8), good, world_size=8, gpus_per_node=8, device_memory_bytes=GPU_80G
    )
    assert plan.legal and plan.memory.num_microbatches == 16
    assert "16 accumulation steps" in next(c.detail for c in plan.checks if c.rule == "global_batch_is_whole")


def test_search_ranks_fitting_moe_layouts_by_the_workflow_rules() -> None:
    result = search_layouts(
        MOE_8X7B, SEQ4K, SearchOptions(), world_size=16, gpus_per_node=8, device_memory_bytes=GPU_80G
    )
    assert result.fitting > 0 and all(c.fits for c in result.candidates)
    # With selective recompute nothing fits at tp=1 (experts alone need 50+ GiB per GPU); the best is
    # tp=2 with the largest legal ep=8, then the largest dp.
    best = result.candidates[0].mesh
    assert (best.tp, best.ep, best.dp, best.pp) == (2, 8, 4, 2)
    keys = [(c.mesh.tp, -c.mesh.ep, -c.mesh.dp) for c in result.candidates]
    assert keys == sorted(keys)
    assert result.rejected_by_rule["ep_divides_experts"] > 0
    assert all(not c.fits for c in result.closest_misses)

    full = SEQ4K.model_copy(update={"recompute": "full"})
    result = search_layouts(
        MOE_8X7B, full, SearchOptions(), world_size=16, gpus_per_node=8, device_memory_bytes=GPU_80G
    )
    best = result.candidates[0].mesh
    assert (best.tp, best.ep, best.dp, best.pp) == (1, 8, 8, 2)


def test_search_reports_closest_misses_when_nothing_fits() -> None:
    result = search_layouts(
        MOE_8X7B, SEQ4K, SearchOptions(), world_size=4, gpus_per_node=8, device_memory_bytes=GPU_80G
    )
    assert result.fitting == 0 and result.candidates == []
    assert result.closest_misses and result.closest_misses[0].margin_bytes < 0


def test_device_memory_comes_from_the_peak_table_or_the_caller() -> None:
    size, source, warnings = device_memory("H100", None)
    assert size == 80 * GIB and "H100" in source and warnings == []
    size, _, warnings = device_memory("H100", 79.0)
    assert size == 79 * GIB and "differs" in warnings[0]
    with pytest.raises(DeviceMemoryError, match="device_memory_gib"):
        device_memory("Imaginary X1", None)
    with pytest.raises(DeviceMemoryError):
        device_memory(None, None)
