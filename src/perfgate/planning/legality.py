"""Legality rules of a layout, each with the reason it holds or fails.

The rules are the ones Megatron-LM enforces (or needs for its defaults) when it builds the process
groups: both meshes cover the world, experts and layers split evenly, tensor parallelism splits heads,
key/value groups and MLP widths, sequence parallelism and load-balanced context parallelism split the
sequence, and the global batch is a whole number of micro-batches per data-parallel rank.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

from perfgate.flops.config import ModelConfig
from perfgate.planning.memory import MAX_PIPELINE_CHUNKS, stage_layer_counts
from perfgate.planning.mesh import ParallelMesh
from perfgate.planning.setup import TrainingSetup

__all__ = ["Check", "check_layout"]

Status = Literal["ok", "violated", "not_applicable"]


class Check(BaseModel):
    """One rule: ``ok``, ``violated`` or ``not_applicable``, with the numbers behind it."""

    model_config = ConfigDict(frozen=True)

    rule: str
    status: Status
    detail: str


def _check(rule: str, ok: bool, detail: str) -> Check:
    return Check(rule=rule, status="ok" if ok else "violated", detail=detail)


def _na(rule: str, detail: str) -> Check:
    return Check(rule=rule, status="not_applicable", detail=detail)


def _divides(name: str, value: int, what: str, target: int) -> str:
    verb = "divides" if target % value == 0 else "does not divide"
    return f"{name}={value} {verb} {what}={target}"


def check_layout(
    model: ModelConfig,
    mesh: ParallelMesh,
    setup: TrainingSetup,
    *,
    world_size: int,
    gpus_per_node: int,
    keep_hot_comm_in_node: bool = False,
) -> list[Check]:
    """Every legality rule for ``mesh`` on ``world_size`` GPUs, in a fixed order."""
    checks: list[Check] = []
    m = mesh
    checks.append(
        _check(
            "attention_mesh_covers_world",
            m.attention_world == world_size,
            f"tp*cp*dp*pp = {m.tp}*{m.cp}*{m.dp}*{m.pp} = {m.attention_world}, world_size = {world_size}",
        )
    )
    if model.moe is None:
        checks.append(
            _check(
                "moe_mesh_covers_world",
                m.ep == 1 and m.etp == 1,
                "dense model: no expert mesh"
                + ("" if m.ep == 1 and m.etp == 1 else f"; ep={m.ep}, etp={m.etp} must be 1 without experts"),
            )
        )
        checks.append(_na("ep_divides_experts", "dense model"))
    else:
        checks.append(
            _check(
                "moe_mesh_covers_world",
                m.expert_world == world_size,
                f"etp*ep*edp*pp = {m.etp}*{m.ep}*{m.edp}*{m.pp} = {m.expert_world}, world_size = {world_size}",
            )
        )
        experts = model.moe.num_experts
        checks.append(
            _check(
                "ep_divides_experts",
                experts % m.ep == 0,
                _divides("ep", m.ep, "num_experts", experts)
                + (f" ({experts // m.ep} experts per rank)" if experts % m.ep == 0 else ""),
            )
        )

    chunks = m.pp * m.vpp
    if chunks > MAX_PIPELINE_CHUNKS:  # checked only when over: no memory estimate is made for such a mesh
        checks.append(
            _check(
                "pipeline_depth",
                False,
                f"pp*vpp = {chunks} pipeline chunks, over the {MAX_PIPELINE_CHUNKS} perfgate estimates",
            )
        )
    if chunks > model.layers:
        checks.append(
            _check(
                "pipeline_divides_layers",
                False,
                f"pp*vpp = {chunks} exceeds layers={model.layers}: some stages would hold no layer",
            )
        )
    elif model.layers % chunks == 0:
        checks.append(
            _check(
                "pipeline_divides_layers",
                True,
                f"pp*vpp = {chunks} divides layers={model.layers} ({model.layers // chunks} per chunk)",
            )
        )
    else:
        sizes = stage_layer_counts(model.layers, m.pp, m.vpp)
        checks.append(
            _check(
                "pipeline_divides_layers",
                False,
                f"pp*vpp = {chunks} does not divide layers={model.layers}: ranks would hold "
                f"{' or '.join(map(str, sizes))} layers; Megatron-LM needs an explicit uneven split "
                "(--decoder-first-pipeline-num-layers / --decoder-last-pipeline-num-layers) for that; "
                "the memory estimate puts the extra layers on the first chunks",
            )
        )
    if m.vpp > 1:
        checks.append(
            _check(
                "virtual_pipeline_needs_pp", m.pp > 1, f"vpp={m.vpp} interleaves stages, which needs pp > 1"
            )
        )
    else:
        checks.append(_na("virtual_pipeline_needs_pp", "vpp = 1"))

    heads, groups = model.num_attention_heads, model.kv_heads
    checks.append(
        _check(
            "tp_divides_heads",
            heads % m.tp == 0 and groups % m.tp == 0,
            f"{_divides('tp', m.tp, 'num_attention_heads', heads)}; {_divides('tp', m.tp, 'num_kv_heads', groups)}",
        )
    )
    widths: list[str] = []
    ok_widths = True
    if model.num_dense_layers > 0:
        ok_widths &= model.ffn_hidden_size % m.tp == 0
        widths.append(_divides("tp", m.tp, "ffn_hidden_size", model.ffn_hidden_size))
    if model.moe is not None:
        ok_widths &= model.expert_ffn_hidden_size % m.etp == 0
        widths.append(_divides("etp", m.etp, "moe_ffn_hidden_size", model.expert_ffn_hidden_size))
        if model.moe.shared_expert_ffn_hidden_size > 0:
            shared = model.moe.shared_expert_ffn_hidden_size
            ok_widths &= shared % m.tp == 0
            widths.append(_divides("tp", m.tp, "shared_expert_ffn_hidden_size", shared))
    checks.append(_check("tp_divides_mlp_widths", ok_widths, "; ".join(widths)))

    s = setup.seq_len
    seq_ok = True
    seq_notes: list[str] = []
    if m.cp > 1:
        seq_ok &= s % (2 * m.cp) == 0
        seq_notes.append(
            f"load-balanced causal context parallelism cuts the sequence into 2*cp = {2 * m.cp} chunks: "
            f"seq_len={s} {'is' if s % (2 * m.cp) == 0 else 'is not'} a multiple"
        )
    if m.tp > 1:
        per_cp = s // m.cp
        seq_ok &= s % m.cp == 0 and per_cp % m.tp == 0
        seq_notes.append(
            f"sequence parallelism splits seq_len/cp = {s}/{m.cp} tokens over tp={m.tp}: "
            f"{'even' if s % m.cp == 0 and per_cp % m.tp == 0 else 'not even'}"
        )
    if seq_notes:
        checks.append(_check("sequence_splits_evenly", seq_ok, "; ".join(seq_notes)))
    else:
        checks.append(_na("sequence_splits_evenly", "cp = 1 and tp = 1: the sequence is not split"))

    if not keep_hot_comm_in_node:
        checks.append(_na("hot_comm_in_node", "not requested (keep_hot_comm_in_node = false)"))
    elif world_size <= gpus_per_node:
        checks.append(_check("hot_comm_in_node", True, f"all {world_size} GPUs are in one node"))
    else:
        expert_group = m.etp * m.ep if model.moe is not None else 1
        node_ok = gpus_per_node % m.tp == 0 and gpus_per_node % expert_group == 0
        checks.append(
            _check(
                "hot_comm_in_node",
                node_ok,
                f"tensor-parallel groups (tp={m.tp}) and expert all-to-all groups (etp*ep={expert_group}) "
                f"must fit whole inside a node of {gpus_per_node} GPUs (group size dividing gpus_per_node, "
                "with the default rank order that places tp/etp innermost)",
            )
        )

    if setup.global_batch_size is None:
        checks.append(
            _na("global_batch_is_whole", "global_batch_size not given: accumulation steps not checked")
        )
    else:
        gbs, mbs = setup.global_batch_size, setup.micro_batch_size
        per_step = mbs * m.dp
        whole = gbs % per_step == 0
        detail = f"global_batch_size={gbs} = micro_batch_size {mbs} x accumulation x dp {m.dp}: "
        detail += (
            f"{gbs // per_step} accumulation steps" if whole else f"{gbs} is not a multiple of {per_step}"
        )
        checks.append(_check("global_batch_is_whole", whole, detail))
    return checks
