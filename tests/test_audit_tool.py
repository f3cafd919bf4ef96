"""audit_samples as a tool: evidence states, artifacts, errors, and the round trip through MCP."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from mcp import Client

from perfgate.errors import ToolError
from perfgate.evidence import Ledger
from perfgate.server import build_server
from perfgate.serving.runtime import ServerConfig, ToolRuntime
from perfgate.tools import REGISTRY
from perfgate.tools.audit_samples import SPEC, AuditSamplesInput, AuditSamplesOutput, run

pytestmark = pytest.mark.anyio


def write_records(workspace: Path, ids: list[Any], name: str = "samples/r0.jsonl") -> str:
    path = workspace / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        "".join(json.dumps({"sample_id": i, "epoch": 0, "rank": 0, "worker": -1}) + "\n" for i in ids)
    )
    return name


async def call(workspace: Path, **kwargs: Any) -> AuditSamplesOutput:
    inp = AuditSamplesInput.model_validate(kwargs)
    rt = ToolRuntime(
        config=ServerConfig.create(workspace),
        ledger=Ledger(workspace),
        tool="audit_samples",
        inputs=inp.model_dump(mode="json"),
    )
    return await run(inp, rt)


async def test_full_coverage_is_passed_evidence_with_the_report_as_artifact(workspace: Path) -> None:
    observed = write_records(workspace, list(range(8)))
    out = await call(workspace, observed="samples", expected_range=[0, 8], world_size=1)
    assert (out.state.value, out.status, out.coverage) == ("passed", "passed", "checked")
    record = Ledger(workspace).get(out.evidence_id)
    assert record is not None and record.tool == "audit_samples"
    assert [a.name for a in record.artifacts] == ["audit.json", "coverage.png"]
    assert out.files[0].path == observed
    assert out.files[0].size_bytes == (workspace / observed).stat().st_size
    assert Ledger(workspace).verify().ok


async def test_unknown_coverage_is_never_passed_evidence(workspace: Path) -> None:
    write_records(workspace, list(range(8)))
    out = await call(workspace, observed="samples/r0.jsonl", world_size=1)
    assert (out.state.value, out.status, out.coverage) == ("executed", "passed", "unknown")
    assert "cannot be seen" in out.summary


async def test_missing_ids_fail_and_the_summary_names_the_finding(workspace: Path) -> None:
    # epoch 0 lost two ids; epoch 1, the run's last, read them all: epoch 0 did not end part-way
    path = workspace / write_records(workspace, list(range(6)))
    with path.open("a") as f:
        f.writelines(
            json.dumps({"sample_id": i, "epoch": 1, "rank": 0, "worker": -1}) + "\n" for i in range(8)
        )
    out = await call(workspace, observed="samples", expected_range=[0, 8], world_size=1)
    assert (out.state.value, out.status) == ("failed", "failed")
    assert "missing_ids (2)" in out.summary
    assert out.epochs[0].examples.missing == [6, 7]


async def test_the_last_epoch_of_a_run_stopped_part_way_passes_for_what_it_read_and_says_so(
    workspace: Path,
) -> None:
    write_records(workspace, list(range(6)))
    out = await call(workspace, observed="samples", expected_range=[0, 8], world_size=1)
    assert (out.state.value, out.status, out.coverage) == ("passed", "passed", "checked")
    assert out.epochs[0].partial is True and out.partial_epochs == [0]
    assert "partial" in out.summary and "6 of 8" in out.summary


async def test_input_problems_are_tool_errors_without_a_record(workspace: Path) -> None:
    write_records(workspace, list(range(3)))
    (workspace / "bad.csv").write_text("sample_id,epoch\n1,0\n")
    with pytest.raises(ToolError, match="no 'rank', 'worker' column"):
        await call(workspace, observed="bad.csv")
    with pytest.raises(ToolError, match="outside the workspace"):
        await call(workspace, observed="/etc")
    with pytest.raises(ValueError, match="not both"):
        AuditSamplesInput.model_validate({"observed": "x", "expected": "e.json", "expected_range": [0, 1]})
    assert Ledger(workspace).records() == []


async def test_a_link_out_of_the_workspace_inside_the_folder_is_refused(
    workspace: Path, tmp_path: Path
) -> None:
    outside = tmp_path / "outside.jsonl"
    outside.write_text(json.dumps({"sample_id": 1, "epoch": 0, "rank": 0, "worker": 0}) + "\n")
    write_records(workspace, [0])
    (workspace / "samples" / "r1.jsonl").symlink_to(outside)
    with pytest.raises(ToolError, match="outside the workspace"):
        await call(workspace, observed="samples")


@pytest.fixture
def audit_server(workspace: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """The real server; audit_samples is added to its registry when the registry lacks it."""
    if SPEC.name not in {s.name for s in REGISTRY}:
        import perfgate.server

        original = perfgate.server.registered_specs
        monkeypatch.setattr(
            perfgate.server, "registered_specs", lambda read_only: [*original(read_only), SPEC]
        )
    return build_server(ServerConfig.create(workspace))


async def test_protocol_round_trip_records_the_audit(audit_server: Any, workspace: Path, mode: str) -> None:
    write_records(workspace, [0, 1, 2, 2, "2"])
    async with Client(audit_server, mode=mode) as client:
        tools = {t.name: t for t in (await client.list_tools()).tools}
        assert tools["audit_samples"].annotations is not None
        assert tools["audit_samples"].annotations.read_only_hint is True
        result = await client.call_tool(
            "audit_samples", {"observed": "samples", "expected_range": [0, 4], "world_size": 1}
        )
        bad = await client.call_tool("audit_samples", {"observed": "nowhere"})
    assert not result.is_error
    out = result.structured_content
    assert out is not None
    assert out["status"] == "failed"
    epoch = out["epochs"][0]
    assert (epoch["missing"], epoch["extra"], epoch["duplicates"]) == (1, 1, 1)
    assert epoch["examples"]["extra"] == ["2"]  # the string id, not the int
    assert {f["kind"] for f in out["findings"]} >= {
        "missing_ids",
        "extra_ids",
        "duplicate_records",
        "ambiguous_ids",
    }
    assert Ledger(workspace).get(out["evidence_id"]) is not None
    assert bad.is_error
    assert "does not exist" in " ".join(getattr(c, "text", "") for c in bad.content)
