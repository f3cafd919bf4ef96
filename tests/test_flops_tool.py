"""estimate_flops as a tool: evidence, per-device figures for compute_mfu, and errors through the protocol."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from mcp import Client

import perfgate.server
from perfgate.evidence import EvidenceState, Ledger
from perfgate.serving.runtime import ServerConfig, ToolRuntime
from perfgate.serving.spec import AnySpec
from perfgate.tools.compute_mfu import ComputeMfuInput
from perfgate.tools.compute_mfu import run as run_mfu
from perfgate.tools.estimate_flops import SPEC, EstimateFlopsInput, run

pytestmark = pytest.mark.anyio

# Llama-2-7B shapes (GQA-free, SwiGLU) at 4 Mi tokens per step on 64 GPUs.
LLAMA_7B: dict[str, Any] = {
    "layers": 32,
    "hidden_size": 4096,
    "ffn_hidden_size": 11008,
    "num_attention_heads": 32,
    "vocab_size": 32000,
    "swiglu": True,
}
ARGS: dict[str, Any] = {
    "model": LLAMA_7B,
    "seq_len": 4096,
    "tokens_per_step": 1024 * 4096,
    "convention": "megatron",
    "recompute": "selective",
    "devices": 64,
}


def single_tool_server(workspace: Path, spec: AnySpec, monkeypatch: pytest.MonkeyPatch) -> Any:
    """The real server, built the real way, with only ``spec`` registered (before the registry lists it)."""
    monkeypatch.setattr(perfgate.server, "registered_specs", lambda read_only: [spec])
    return perfgate.server.build_server(ServerConfig.create(workspace))


def _rt(workspace: Path) -> ToolRuntime:
    return ToolRuntime(config=ServerConfig.create(workspace), ledger=Ledger(workspace), tool="estimate_flops")


async def test_result_is_executed_evidence_with_per_device_figures(workspace: Path) -> None:
    out = await run(EstimateFlopsInput.model_validate(ARGS), _rt(workspace))
    assert out.state == EvidenceState.EXECUTED
    # Megatron per token: 6*32*(4*4096^2) + 6*32*4096*4096 + 6*32*3*4096*11008 + 6*4096*32000
    per_token = 6 * 32 * 4 * 4096**2 + 6 * 32 * 4096 * 4096 + 6 * 32 * 3 * 4096 * 11008 + 6 * 4096 * 32000
    assert out.flops_per_token == per_token
    assert out.model_flops_per_step == per_token * 1024 * 4096
    assert out.model_flops_per_step_per_device == pytest.approx(out.model_flops_per_step / 64)
    # selective recompute: one extra forward of core attention, 2*32*4096*4096 per token
    assert out.hardware_flops_per_step - out.model_flops_per_step == 2 * 32 * 4096 * 4096 * 1024 * 4096
    record = Ledger(workspace).get(out.evidence_id)
    assert record is not None and record.state == "executed"
    assert record.result["model_flops_per_step"] == out.model_flops_per_step


async def test_per_device_flops_feed_compute_mfu(workspace: Path) -> None:
    est = await run(EstimateFlopsInput.model_validate(ARGS), _rt(workspace))
    assert est.model_flops_per_step_per_device is not None
    mfu = await run_mfu(
        ComputeMfuInput.model_validate(
            {
                "buckets": [
                    {
                        "name": "seq4096",
                        "flops_per_step": est.model_flops_per_step_per_device,
                        "step_time_s": 5.0,
                    }
                ],
                "flops_kind": "model",
                "peak_tflops": 989.4,
            }
        ),
        ToolRuntime(config=ServerConfig.create(workspace), ledger=Ledger(workspace), tool="compute_mfu"),
    )
    assert mfu.utilization == pytest.approx(est.model_flops_per_step / 64 / 5.0 / 989.4e12)


async def test_without_devices_the_output_warns_that_figures_are_global(workspace: Path) -> None:
    out = await run(EstimateFlopsInput.model_validate(ARGS | {"devices": None}), _rt(workspace))
    assert out.model_flops_per_step_per_device is None
    assert any("whole global batch" in w for w in out.warnings)


async def test_round_trip_through_the_protocol(workspace: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    async with Client(single_tool_server(workspace, SPEC, monkeypatch)) as client:
        tools = (await client.list_tools()).tools
        result = await client.call_tool("estimate_flops", ARGS)
    assert tools[0].annotations is not None and tools[0].annotations.read_only_hint is True
    assert not {"anyOf", "oneOf", "allOf"} & set(tools[0].input_schema)
    assert not result.is_error
    out = result.structured_content
    assert out is not None and out["convention"] == "megatron" and out["state"] == "executed"


@pytest.mark.parametrize(
    ("patch", "message"),
    [
        ({"model": LLAMA_7B | {"num_attention_heads": 30}}, "does not divide hidden_size"),
        ({"model": LLAMA_7B | {"layers": 0}}, "model.layers"),
        ({"model": LLAMA_7B | {"moe": {"num_experts": 4, "top_k": 8}}}, "top_k=8 exceeds num_experts=4"),
        ({"convention": "chinchilla"}, "convention"),
        ({"tokens_per_step": 0}, "tokens_per_step"),
    ],
)
async def test_bad_input_is_a_clear_tool_error(
    workspace: Path, monkeypatch: pytest.MonkeyPatch, patch: dict[str, Any], message: str
) -> None:
    async with Client(single_tool_server(workspace, SPEC, monkeypatch)) as client:
        result = await client.call_tool("estimate_flops", ARGS | patch)
    assert result.is_error
    text = result.content[0].text  # type: ignore[union-attr]  # error results carry text
    assert message in text
