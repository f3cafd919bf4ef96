"""plan_parallel_layout as a tool: planned evidence, check and search modes, errors an agent can fix."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from mcp import Client

import perfgate.server
from perfgate.errors import ToolError
from perfgate.evidence import EvidenceState, Ledger
from perfgate.serving.runtime import ServerConfig, ToolRuntime
from perfgate.tools.plan_parallel_layout import SPEC, PlanParallelLayoutInput, run

pytestmark = pytest.mark.anyio

MIXTRAL: dict[str, Any] = {
    "layers": 32,
    "hidden_size": 4096,
    "ffn_hidden_size": 14336,
    "num_attention_heads": 32,
    "num_kv_heads": 8,
    "vocab_size": 32000,
    "swiglu": True,
    "moe": {"num_experts": 8, "top_k": 2},
}
BASE: dict[str, Any] = {
    "model": MIXTRAL,
    "world_size": 16,
    "gpus_per_node": 8,
    "device": "H100",
    "seq_len": 4096,
    "micro_batch_size": 1,
    "global_batch_size": 256,
    "recompute": "full",
}


def _rt(workspace: Path) -> ToolRuntime:
    return ToolRuntime(
        config=ServerConfig.create(workspace), ledger=Ledger(workspace), tool="plan_parallel_layout"
    )


async def _plan(workspace: Path, **changes: Any) -> Any:
    return await run(PlanParallelLayoutInput.model_validate(BASE | changes), _rt(workspace))


async def test_check_mode_records_a_planned_verdict(workspace: Path) -> None:
    out = await _plan(workspace, mesh={"pp": 2, "ep": 8})
    assert out.state == EvidenceState.PLANNED
    assert out.plan is not None and out.plan.legal and out.plan.fits
    assert out.plan.mesh.dp == 8 and out.plan.mesh.edp == 1
    assert out.plan.memory.num_microbatches == 32  # 256 / (1 x dp 8)
    assert "fits with" in out.summary and "EP8" in out.summary
    assert out.device_memory_bytes == 80 * 2**30 and "H100" in out.device_memory_source
    record = Ledger(workspace).get(out.evidence_id)
    assert record is not None and record.state == "planned"


async def test_illegal_mesh_is_reported_not_raised(workspace: Path) -> None:
    out = await _plan(workspace, mesh={"ep": 3})
    assert out.plan is not None and not out.plan.legal and not out.plan.fits
    assert "ep_divides_experts" in out.plan.violations
    assert "ILLEGAL" in out.summary


async def test_search_mode_returns_ranked_fitting_layouts(workspace: Path) -> None:
    out = await _plan(workspace, mode="search", search={"limit": 3})
    assert out.search is not None and out.plan is None
    assert len(out.search.candidates) == 3
    best = out.search.candidates[0].mesh
    assert (best.tp, best.ep, best.pp) == (1, 8, 2)
    assert out.summary.startswith(f"{out.search.fitting} of {out.search.legal} legal layouts fit")


async def test_nothing_fits_names_the_closest_miss(workspace: Path) -> None:
    out = await _plan(workspace, mode="search", world_size=2, recompute="none")
    assert out.search is not None and out.search.fitting == 0
    assert "closest" in out.summary and "short by" in out.summary
    assert any("nothing fits" in w for w in out.warnings)


async def test_small_batch_with_deep_pipeline_is_warned(workspace: Path) -> None:
    out = await _plan(workspace, mesh={"pp": 2, "ep": 8}, global_batch_size=8)
    assert any("bubble" in w for w in out.warnings)


async def test_unknown_device_asks_for_memory(workspace: Path) -> None:
    with pytest.raises(ToolError, match="device_memory_gib"):
        await _plan(workspace, mesh={"ep": 8}, device="Imaginary X1")
    out = await _plan(workspace, mesh={"pp": 2, "ep": 8}, device="Imaginary X1", device_memory_gib=96)
    assert out.device_memory_bytes == 96 * 2**30
    assert any("not in the peak table" in w for w in out.warnings)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"mode": "check"}, "needs a mesh"),
        ({"mesh": {"ep": 8}, "device": None}, "device_memory_gib"),
        ({"mesh": {"ep": 0}}, "greater than or equal to 1"),
        ({"mesh": {"ep": 8}, "reserve_fraction": 1.5}, "less than 1"),
    ],
)
def test_bad_inputs_are_refused_before_planning(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        PlanParallelLayoutInput.model_validate(BASE | changes)


async def test_round_trip_through_the_protocol(workspace: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(perfgate.server, "registered_specs", lambda read_only: [SPEC])
    async with Client(perfgate.server.build_server(ServerConfig.create(workspace))) as client:
        tools = (await client.list_tools()).tools
        ok = await client.call_tool("plan_parallel_layout", BASE | {"mesh": {"pp": 2, "ep": 8}})
        bad = await client.call_tool("plan_parallel_layout", BASE)
    assert not {"anyOf", "oneOf", "allOf"} & set(tools[0].input_schema)
    assert tools[0].annotations is not None and tools[0].annotations.read_only_hint is True
    assert not ok.is_error and ok.structured_content is not None
    assert ok.structured_content["state"] == "planned"
    assert bad.is_error and "needs a mesh" in bad.content[0].text  # type: ignore[union-attr]  # text content
