"""The server as an agent sees it: through the MCP protocol, in memory, both protocol generations."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from mcp import Client

from perfgate.evidence import Ledger
from perfgate.schemas import SCHEMA_DIR
from perfgate.server import INSTRUCTIONS, build_server
from perfgate.serving.runtime import ServerConfig
from perfgate.tools import REGISTRY, registered_specs

pytestmark = pytest.mark.anyio

MFU_ARGS: dict[str, Any] = {
    "buckets": [{"name": "seq2048", "flops_per_step": 4.0e14, "step_time_s": 1.0, "steps": 10}],
    "flops_kind": "model",
    "device": "NVIDIA H100 80GB HBM3",
    "precision": "bf16",
}


async def test_tools_list_matches_the_golden_snapshot_exactly(server: Any, mode: str) -> None:
    async with Client(server, mode=mode) as client:
        tools = (await client.list_tools()).tools
    listed = [t.model_dump(mode="json", by_alias=True, exclude_none=True) for t in tools]
    golden = json.loads((SCHEMA_DIR / "tools_list.json").read_text())
    assert listed == golden


async def test_every_tool_sets_all_four_annotation_hints_explicitly(server: Any, mode: str) -> None:
    async with Client(server, mode=mode) as client:
        tools = (await client.list_tools()).tools
    assert [t.name for t in tools] == [s.name for s in REGISTRY]
    for tool in tools:
        assert tool.annotations is not None, tool.name
        hints = tool.annotations.model_dump(by_alias=True)
        for key in ("readOnlyHint", "destructiveHint", "idempotentHint", "openWorldHint"):
            assert isinstance(hints[key], bool), f"{tool.name} leaves {key} unset"
        assert tool.output_schema is not None, f"{tool.name} has no structured output"
        schema = tool.input_schema
        assert not {"anyOf", "oneOf", "allOf"} & set(schema), f"{tool.name} has a top-level combinator"
        assert len(tool.description or "") > 80, f"{tool.name} needs a description that says when to use it"


async def test_instructions_point_the_agent_at_the_skill(server: Any, mode: str) -> None:
    async with Client(server, mode=mode) as client:
        resources = (await client.list_resources()).resources
        uris = {str(r.uri) for r in resources}
        assert "skill://perfgate/SKILL.md" in uris
        text = await client.read_resource("skill://perfgate/SKILL.md")
    assert "perfgate" in text.contents[0].text  # type: ignore[union-attr]  # text resource
    assert "skill://perfgate/SKILL.md" in INSTRUCTIONS


async def test_compute_mfu_round_trip_records_evidence(server: Any, workspace: Path, mode: str) -> None:
    async with Client(server, mode=mode) as client:
        result = await client.call_tool("compute_mfu", MFU_ARGS)
    assert not result.is_error
    out = result.structured_content
    assert out is not None
    assert out["metric"] == "MFU"
    assert out["utilization"] == pytest.approx(400.0 / 989.4)
    assert out["state"] == "executed"
    record = Ledger(workspace).get(out["evidence_id"])
    assert record is not None
    assert record.tool == "compute_mfu"
    assert record.result["achieved_tflops"] == pytest.approx(400.0)
    assert record.inputs["device"] == MFU_ARGS["device"]
    assert Ledger(workspace).verify().ok


@pytest.mark.parametrize(
    ("patch", "expected"),
    [
        ({"buckets": []}, "at least 1 item"),
        ({"buckets": [{"name": "a", "flops_per_step": 1e12, "step_time_s": 0.0}]}, "greater than 0"),
        ({"buckets": [{"name": "a", "flops_per_step": 1e12, "step_time_s": -1.0}]}, "greater than 0"),
        ({"buckets": [{"name": "a", "flops_per_step": "NaN", "step_time_s": 1.0}]}, "finite"),
        ({"device": "Imaginary X9000"}, "not in the peak table"),
        ({"device": None, "precision": None}, "peak_tflops"),
        ({"device": "A100", "precision": "fp8"}, "no FP8"),
    ],
)
async def test_bad_input_gets_a_clear_error_and_no_record(
    server: Any, workspace: Path, mode: str, patch: dict[str, Any], expected: str
) -> None:
    args = {**MFU_ARGS, **patch}
    async with Client(server, mode=mode) as client:
        result = await client.call_tool("compute_mfu", args)
    assert result.is_error
    text = " ".join(getattr(c, "text", "") for c in result.content)
    assert expected in text
    assert Ledger(workspace).records() == []


async def test_parallel_calls_each_get_their_own_record(server: Any, workspace: Path, mode: str) -> None:
    # Concurrent appends: one through the ledger thread, the others (it is busy) through anyio's pool.
    import anyio

    ids: list[str] = []
    async with Client(server, mode=mode) as client:

        async def one(i: int) -> None:
            args = {
                **MFU_ARGS,
                "buckets": [{"name": f"b{i}", "flops_per_step": 1e14 * (i + 1), "step_time_s": 1.0}],
            }
            result = await client.call_tool("compute_mfu", args)
            assert not result.is_error
            assert result.structured_content is not None
            ids.append(result.structured_content["evidence_id"])

        async with anyio.create_task_group() as tg:
            for i in range(12):
                tg.start_soon(one, i)
    ledger = Ledger(workspace)
    assert sorted(r.id for r in ledger.records()) == sorted(ids)
    assert len(set(ids)) == 12
    assert ledger.verify().ok


def test_read_only_servers_drop_tools_that_run_commands_or_write() -> None:
    full = registered_specs(read_only=False)
    reduced = registered_specs(read_only=True)
    assert [s.name for s in reduced] == [s.name for s in full if not (s.runs_commands or s.writes)]
    assert all(not s.runs_commands and not s.writes for s in reduced)


async def test_read_only_server_lists_only_safe_tools(workspace: Path, mode: str) -> None:
    server = build_server(ServerConfig.create(workspace, read_only=True))
    async with Client(server, mode=mode) as client:
        names = [t.name for t in (await client.list_tools()).tools]
    assert names == [s.name for s in registered_specs(read_only=True)]
