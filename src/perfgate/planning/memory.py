"""Memory per GPU for a layout, pipeline stage by pipeline stage.

Static state per GPU: weights and gradients of the parameters it holds, and optimizer states (Adam
moments plus fp32 master weights) that the distributed optimizer shards over dp·cp for dense parameters
and over edp for expert parameters. Activations: `perfgate.planning.activations` per layer and
micro-batch, times the micro-batches a stage keeps in flight under the 1F1B pipeline schedule
(stage r of pp keeps min(pp - r, m); with v virtual stages per rank, rank r keeps
2·(pp - r - 1) + (v - 1)·pp + 1 model chunks of L/(pp·v) layers, Megatron-LM's interleaved warm-up).
The first stage adds the token ids, the last stage the output layer's input and fp32 logits of one
micro-batch (the last stage runs each backward right after its forward).
"""

from __future__ import annotations

import math
from fractions import Fraction

from pydantic import BaseModel, ConfigDict, Field

from perfgate.flops.config import ModelConfig, moe_layers_in
from perfgate.flops.params import count_parameters
from perfgate.planning.activations import ACTIVATION_SOURCE, layer_activation_bytes, local_tokens
from perfgate.planning.mesh import ParallelMesh
from perfgate.planning.setup import GRAD_BYTES, PARAM_BYTES, TrainingSetup, optimizer_bytes_per_param

__all__ = [
    "MAX_PIPELINE_CHUNKS",
    "MemoryEstimate",
    "PipelineTooDeepError",
    "StageMemory",
    "estimate_memory",
    "stage_layer_counts",
    "stage_spans",
]


class StageMemory(BaseModel):
    """Memory of one GPU of pipeline stage ``stage``; every ``*_bytes`` field is in bytes."""

    model_config = ConfigDict(frozen=True)

    stage: int
    layers: int = Field(description="Transformer layers held by this rank (all its virtual chunks).")
    moe_layers: int
    dense_params: int = Field(description="Non-expert parameters on this GPU (after tp sharding).")
    expert_params: int = Field(description="Expert parameters on this GPU (after ep and etp sharding).")
    params_bytes: int
    grads_bytes: int
    optimizer_bytes: int = Field(description="Optimizer states left on the GPU after sharding and offload.")
    in_flight_microbatches: float = Field(description="Micro-batches of this stage's layers held at peak.")
    activations_bytes: int = Field(description="Layer activations for all in-flight micro-batches.")
    embedding_and_logits_bytes: int = Field(description="Token ids (first stage) and logits (last stage).")
    total_bytes: int


class MemoryEstimate(BaseModel):
    model_config = ConfigDict(frozen=True)

    stages: list[StageMemory]
    worst_stage: int = Field(description="The stage with the largest total: the one that must fit.")
    total_bytes: int = Field(description="Total of the worst stage.")
    reserve_bytes: int
    device_memory_bytes: int
    margin_bytes: int = Field(
        description="device memory - reserve - total of the worst stage (negative = OOM)."
    )
    fits: bool
    num_microbatches: int | None = Field(
        description="Gradient-accumulation micro-batches per step, if known."
    )
    formulas: list[str]


MAX_PIPELINE_CHUNKS = 4096
"""Most pipeline chunks (pp x vpp) perfgate estimates: the estimate has a row per stage and a range per
chunk, and no real pipeline comes near (deep ones use pp 64-128 with a few virtual stages)."""


class PipelineTooDeepError(ValueError):
    """More pipeline chunks than `MAX_PIPELINE_CHUNKS`."""


def stage_layer_counts(layers: int, pp: int, vpp: int) -> list[int]:
    """The distinct numbers of layers a pipeline rank holds (`stage_spans`), in closed form, ascending."""
    base, extra = divmod(layers, pp * vpp)

    def held(rank: int) -> int:  # rank r holds chunks r, r + pp, ...; those below `extra` hold one more
        return vpp * base + min(vpp, max(0, -(-(extra - rank) // pp)))

    return sorted({held(0), held(pp - 1)})  # held() falls by at most one from the first rank to the last


def stage_spans(layers: int, pp: int, vpp: int) -> list[list[tuple[int, int]]]:
    """The 0-based layers held by each pipeline rank, as ``(start, stop)`` ranges (one per chunk).

    The model is cut into pp·vpp chunks of consecutive layers (the first ``layers % (pp·vpp)`` chunks
    take one extra layer when it does not divide) and chunk c goes to rank c % pp. Ranges, never lists of
    layers: a model of 10^9 layers costs what one of 32 does.
    """
    chunks = pp * vpp
    base, extra = divmod(layers, chunks)
    held: list[list[tuple[int, int]]] = [[] for _ in range(pp)]
    start = 0
    for c in range(chunks):
        size = base + (1 if c < extra else 0)
        held[c % pp].append((start, start + size))
        start += size
    return held


def _in_flight(stage: int, mesh: ParallelMesh, num_microbatches: int | None) -> float:
    if mesh.pp == 1:
        return 1.0
    if mesh.vpp == 1:
        held = mesh.pp - stage
        return float(min(held, num_microbatches) if num_microbatches is not None else held)
    chunks = 2 * (mesh.pp - stage - 1) + (mesh.vpp - 1) * mesh.pp + 1
    if num_microbatches is not None:
        chunks = min(chunks, num_microbatches * mesh.vpp)
    return chunks / mesh.vpp


def estimate_memory(
    model: ModelConfig,
    mesh: ParallelMesh,
    setup: TrainingSetup,
    device_memory_bytes: int,
) -> MemoryEstimate:
    """Per-stage memory of one GPU and whether the worst stage fits in ``device_memory_bytes``.

    Raises:
        PipelineTooDeepError: pp x vpp is over `MAX_PIPELINE_CHUNKS`.
    """
    if mesh.pp * mesh.vpp > MAX_PIPELINE_CHUNKS:
        raise PipelineTooDeepError(
            f"pp*vpp = {mesh.pp * mesh.vpp} pipeline chunks, over the {MAX_PIPELINE_CHUNKS} perfgate estimates "
            "(planning.memory.MAX_PIPELINE_CHUNKS); no real pipeline is that deep: lower pp or vpp"
        )
    p = count_parameters(model)
    h = model.hidden_size
    tp = mesh.tp
    vocab_shard = math.ceil(model.vocab_size / tp) * h
    expert_on_gpu = math.ceil(model.moe.num_experts / mesh.ep) if model.moe is not None else 0
    expert_layer = expert_on_gpu * math.ceil(p.expert_each / mesh.etp)
    dense_layer_mlp = math.ceil(p.dense_mlp_per_layer / tp)
    moe_layer_other = p.router_per_moe_layer + math.ceil(p.shared_expert_per_moe_layer / tp)
    layer_common = math.ceil(p.attention_per_layer / tp) + p.norms_per_layer

    num_mb: int | None = None
    if setup.global_batch_size is not None:
        num_mb = max(1, setup.global_batch_size // (setup.micro_batch_size * mesh.dp))
    opt_per_param = optimizer_bytes_per_param(setup) * (1.0 - setup.optimizer_offload_fraction)
    dense_shards = mesh.dp * mesh.cp if setup.distributed_optimizer else 1
    expert_shards = mesh.edp if setup.distributed_optimizer else 1
    wb, gb = PARAM_BYTES[setup.param_precision], GRAD_BYTES[setup.grad_precision]
    tokens = local_tokens(setup, mesh)

    stages: list[StageMemory] = []
    # A layer's activations depend only on whether it holds experts: one value for each kind.
    kinds = {moe: layer_activation_bytes(model, setup, mesh, moe_layer=moe) for moe in (False, True)}
    whole = {
        moe: layer_activation_bytes(model, setup, mesh, moe_layer=moe, recompute="none")
        for moe in (False, True)
    }
    for stage, spans in enumerate(stage_spans(model.layers, mesh.pp, mesh.vpp)):
        n_layers = sum(stop - start for start, stop in spans)
        n_moe = sum(moe_layers_in(model, start, stop) for start, stop in spans)
        n_dense = n_layers - n_moe
        dense = n_layers * layer_common + n_dense * dense_layer_mlp + n_moe * moe_layer_other
        if stage == 0:
            dense += vocab_shard
        if stage == mesh.pp - 1:
            dense += h
            # A tied output layer on a separate last stage still keeps its own copy of the matrix.
            if not model.tie_embeddings or mesh.pp > 1:
                dense += vocab_shard
        experts = n_moe * expert_layer
        params = dense + experts

        in_flight = _in_flight(stage, mesh, num_mb)
        # The exactly rounded sum of every layer's bytes, as math.fsum over the layers would give.
        per_mb = float(Fraction(kinds[False]) * n_dense + Fraction(kinds[True]) * n_moe)
        activations = per_mb * in_flight
        if setup.recompute == "full" and n_layers:
            # The layer being recomputed holds its whole activation set during its backward.
            activations += max(whole[moe] for moe, n in ((False, n_dense), (True, n_moe)) if n)
        edge = 0.0
        if stage == 0:
            edge += 8 * setup.micro_batch_size * setup.seq_len / mesh.cp * in_flight  # int64 token ids
        if stage == mesh.pp - 1:
            # final-norm input and output-layer input (2 x a·h), fp32 logits of the local vocabulary shard
            edge += tokens * (2 * setup.activation_bytes * h + 4 * model.vocab_size)

        optimizer = opt_per_param * (dense / dense_shards + experts / expert_shards)
        row = StageMemory(
            stage=stage,
            layers=n_layers,
            moe_layers=n_moe,
            dense_params=dense,
            expert_params=experts,
            params_bytes=params * wb,
            grads_bytes=params * gb,
            optimizer_bytes=math.ceil(optimizer),
            in_flight_microbatches=in_flight,
            activations_bytes=math.ceil(activations),
            embedding_and_logits_bytes=math.ceil(edge),
            total_bytes=0,
        )
        total = (
            row.params_bytes
            + row.grads_bytes
            + row.optimizer_bytes
            + row.activations_bytes
            + row.embedding_and_logits_bytes
        )
        stages.append(row.model_copy(update={"total_bytes": total}))

    worst = max(stages, key=lambda r: r.total_bytes)
    reserve = math.ceil(setup.reserve_fraction * device_memory_bytes)
    margin = device_memory_bytes - reserve - worst.total_bytes
    formulas = [
        f"params_bytes = params_on_gpu x {wb} ({setup.param_precision}); grads_bytes = params_on_gpu x {gb} "
        f"({setup.grad_precision} gradient buffer, not sharded)",
        f"optimizer_bytes = {optimizer_bytes_per_param(setup)} x (1 - offload {setup.optimizer_offload_fraction:g})"
        f" x (dense_params / {dense_shards} + expert_params / {expert_shards})"
        + (
            " (distributed optimizer: dense over dp*cp, experts over edp)"
            if setup.distributed_optimizer
            else ""
        ),
        f"activations_bytes = in_flight x sum over the stage's layers of per-layer bytes, per layer "
        f"= per-token bytes x b*s/(cp*tp) = per-token x {tokens:g}; source: {ACTIVATION_SOURCE}",
        f"fits when worst-stage total + reserve ({setup.reserve_fraction:g} x device memory) <= device memory",
    ]
    return MemoryEstimate(
        stages=stages,
        worst_stage=worst.stage,
        total_bytes=worst.total_bytes,
        reserve_bytes=reserve,
        device_memory_bytes=device_memory_bytes,
        margin_bytes=margin,
        fits=margin >= 0,
        num_microbatches=num_mb,
        formulas=formulas,
    )
