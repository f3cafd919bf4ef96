"""Sizes no model has (10^8 to 10^18 layers, a pipeline of a million stages) are answered at once.

The FLOP and memory estimates count layers in closed form, never one by one, and a pipeline deeper than
perfgate estimates is refused with the limit: a hostile size neither freezes the server nor fills its memory.
While such a call is in flight, another call on the same server is answered (both calls go through one
client; the guard against a frozen loop is the test's timeout, not a measured time).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client

from perfgate.server import build_server
from perfgate.serving.runtime import ServerConfig

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(120)]

HUGE = [10**8, 10**9, 10**18]


def _model(layers: int) -> dict[str, Any]:
    return {
        "layers": layers,
        "hidden_size": 4096,
        "ffn_hidden_size": 14336,
        "num_attention_heads": 32,
        "num_kv_heads": 8,
        "vocab_size": 32000,
        "swiglu": True,
        "moe": {"num_experts": 8, "top_k": 2, "moe_layer_frequency": 3},
    }


async def _with_another_call(client: Client, tool: str, args: dict[str, Any]) -> Any:
    """Call ``tool`` while a cheap call runs beside it; both must be answered."""
    results: dict[str, Any] = {}

    async def hostile() -> None:
        results["hostile"] = await client.call_tool(tool, args)

    async def other() -> None:
        results["other"] = await client.call_tool(
            "record_decision", {"action": "show", "experiment_id": "exp-x"}
        )

    async with anyio.create_task_group() as tg:
        tg.start_soon(hostile)
        tg.start_soon(other)
    assert "no experiment 'exp-x'" in results["other"].content[0].text
    return results["hostile"]


@pytest.mark.parametrize("layers", HUGE)
async def test_estimate_flops_counts_a_huge_layer_count_in_closed_form(workspace: Path, layers: int) -> None:
    args = {"model": _model(layers), "seq_len": 4096, "tokens_per_step": 4096, "convention": "megatron"}
    async with Client(build_server(ServerConfig.create(workspace))) as client:
        result = await _with_another_call(client, "estimate_flops", args)
    assert not result.is_error, result.content[0].text
    params = result.structured_content["params"]
    moe = -(-layers // 3)  # layers 0, 3, 6, ... hold experts
    assert params["moe_layers"] == moe and params["dense_layers"] == layers - moe


@pytest.mark.parametrize("layers", HUGE)
async def test_plan_check_of_a_huge_layer_count_is_answered(workspace: Path, layers: int) -> None:
    args = {
        "mode": "check",
        "model": _model(layers),
        "world_size": 64,
        "gpus_per_node": 8,
        "device": "H100",
        "seq_len": 4096,
        "micro_batch_size": 1,
        "mesh": {"pp": 8, "vpp": 2, "ep": 8},
    }
    async with Client(build_server(ServerConfig.create(workspace))) as client:
        result = await _with_another_call(client, "plan_parallel_layout", args)
    assert not result.is_error, result.content[0].text
    stages = result.structured_content["plan"]["memory"]["stages"]
    assert sum(s["layers"] for s in stages) == layers
    assert sum(s["moe_layers"] for s in stages) == -(-layers // 3)


async def test_a_pipeline_deeper_than_perfgate_estimates_is_refused_with_the_limit(workspace: Path) -> None:
    world = 1 << 20
    args = {
        "mode": "check",
        "model": _model(10**9),
        "world_size": world,
        "gpus_per_node": 8,
        "device": "H100",
        "seq_len": 4096,
        "micro_batch_size": 1,
        "mesh": {"pp": world, "ep": 8},
    }
    async with Client(build_server(ServerConfig.create(workspace))) as client:
        result = await _with_another_call(client, "plan_parallel_layout", args)
    text = result.content[0].text
    assert result.is_error and f"pp*vpp = {world} pipeline chunks" in text and "lower pp or vpp" in text
