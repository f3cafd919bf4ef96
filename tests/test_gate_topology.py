"""A change of parallel degrees at the same world size is a topology change: never an equivalent speedup
unless compared per device and declared, also when only the command line changes it (protocol)."""

from __future__ import annotations

from pathlib import Path

import pytest
from mcp import Client

from test_evidence_gate import compare, window
from test_record_decision import Evidence, _drop, _honest, _keep, _open, _text

pytestmark = pytest.mark.anyio

MEGATRON = ["python", "pretrain_gpt.py", "--tensor-model-parallel-size"]


async def test_a_parallel_degree_changed_on_the_command_line_is_a_topology_change(workspace: Path) -> None:
    # Two ranks both sides; the candidate also turns on loader workers (declared) and, unsaid, TP 1 -> 2.
    execution = {"world_size": 2, "workers": 0}
    base = window(workspace, 20, seed=1, world=2, execution=execution, command=[*MEGATRON, "1"])
    cand = window(
        workspace, 10, seed=2, world=2, execution={**execution, "workers": 4}, command=[*MEGATRON, "2"]
    )
    out = await compare(workspace, base, cand, ["workers"])
    assert out["status"] == "incomparable"
    assert any(
        r.startswith("the command line changes tensor_parallel (1 -> 2) but it was not declared")
        for r in out["reasons"]
    ), out["reasons"]
    assert any("the same devices split the work differently" in r for r in out["reasons"])

    # a contract that says tp=1 while the command line ran tp=2 is named (what ran beats what was declared)
    liar = window(
        workspace,
        10,
        seed=3,
        world=2,
        execution={**execution, "tensor_parallel": 1},
        command=["python", "train.py", "--parallelism.tensor_parallel_degree=2"],
    )
    out = await compare(workspace, base, liar, ["tensor_parallel"], per_device=True)
    assert any(
        "the candidate command line sets tensor_parallel=2 but its contract declares 1" in r
        for r in out["reasons"]
    ), out["reasons"]


async def test_tp_for_dp_at_the_same_world_size_needs_a_per_device_comparison(workspace: Path) -> None:
    degrees = {"world_size": 2, "data_parallel": 2, "tensor_parallel": 1, "microbatch": 16}
    base = window(workspace, 20, seed=1, world=2, execution=degrees)
    cand = window(
        workspace,
        10,
        seed=2,
        world=2,
        execution={**degrees, "data_parallel": 1, "tensor_parallel": 2, "microbatch": 32},
    )
    declared = ["tensor_parallel", "data_parallel", "microbatch"]
    total = await compare(workspace, base, cand, declared)
    assert total["status"] == "incomparable"
    assert any(
        "the topology changed (data_parallel, tensor_parallel; measured world size 2 -> 2)" in r
        for r in total["reasons"]
    )
    per_device = await compare(workspace, base, cand, declared, per_device=True)
    assert per_device["status"] == "comparable" and "per device" in per_device["method"]


async def test_a_topology_change_is_kept_only_on_a_per_device_comparison_and_labelled_so(
    server: object, workspace: Path
) -> None:
    ev = Evidence(workspace)
    changes = ["data_parallel", "microbatch", "tensor_parallel"]
    async with Client(server) as client:  # type: ignore[arg-type]
        exp = await _open(client, changed_variable="tensor_parallel 1 -> 2")
        links, ids = _honest(ev)
        total = ev.comparison(ids["base"], ids["cand"], declared=changes, actual_changes=changes)
        refused = await _keep(client, exp, [*_drop(links, "comparison"), {"id": total, "role": "comparison"}])
        assert refused.is_error and "topology" in _text(refused)
        assert "never an equivalent speedup" in _text(refused) and "per_device=true" in _text(refused)
    async with Client(server) as client:  # type: ignore[arg-type]
        exp = await _open(client, changed_variable="tensor_parallel 1 -> 2")
        links, ids = _honest(ev)
        per_device = ev.comparison(
            ids["base"], ids["cand"], declared=changes, actual_changes=changes, per_device=True
        )
        # a layout change also shows that its checkpoints resume (the checkpoint_resume gate)
        ev.add(
            "run_benchmark_window",
            "executed",
            {
                "checkpoint_resume": {
                    "status": "passed",
                    "reason": "resumed from ckpt/step8.pt (saved at step 8)",
                }
            },
            {
                "command": ["python", "train.py", "--resume", "ckpt/step8.pt"],
                "job": True,
                "resume_of": ids["cand"][0],
            },
        )
        kept = await _keep(
            client, exp, [*_drop(links, "comparison"), {"id": per_device, "role": "comparison"}]
        )
    assert not kept.is_error, _text(kept)
    assert kept.structured_content is not None
    assert "per device-second" in kept.structured_content["label"]
