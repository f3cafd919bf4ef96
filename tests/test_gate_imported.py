"""Imported windows carry a provenance block that says what is unknown, and two unknown sides are never
"the same environment", whatever environment_id the caller attached (through the protocol)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from mcp import Client

from perfgate.server import build_server
from perfgate.serving.runtime import ServerConfig
from test_import_benchmark import CONTRACT, LOGS
from test_record_decision import Evidence, _open, _text

pytestmark = pytest.mark.anyio


async def test_imported_sides_are_labelled_and_never_the_same_measured_environment(workspace: Path) -> None:
    for name in ("base.log", "cand.log"):
        shutil.copyfile(LOGS / "megatron_8rank.log", workspace / name)
    ev = Evidence(workspace)
    env = ev.env()  # a collect_env of this machine: not a measurement of the imported runs
    async with Client(build_server(ServerConfig.create(workspace))) as client:
        ids: list[str] = []
        for name in ("base.log", "cand.log"):
            result = await client.call_tool(
                "import_benchmark",
                {
                    "paths": [name],
                    "format": "megatron",
                    "warmup_steps": 20,
                    "contract": CONTRACT,
                    "environment_id": env,
                },
            )
            out = result.structured_content
            assert out is not None, _text(result)
            origin = out["origin"]
            assert origin["launched"] is False and origin["label"] == "imported, not launched by perfgate"
            assert (
                origin["argv"] is None and origin["code"] is None and origin["measured_environment"] is None
            )
            assert set(origin["files"]) == {name} and len(origin["files"][name]) == 64
            assert "measured environment" in origin["unknown"]
            ids.append(out["evidence_id"])
        exp = await _open(client)
        comp = ev.comparison([ids[0]], [ids[1]])
        shown = await client.call_tool(
            "record_decision",
            {"action": "show", "experiment_id": exp, "evidence": [{"id": comp, "role": "comparison"}]},
        )
    assert shown.structured_content is not None, _text(shown)
    gate = next(g for g in shown.structured_content["gates"] if g["name"] == "same_environment")
    assert gate["status"] == "failed"
    assert (
        "imported, not launched by perfgate" in gate["reason"]
        and "unknown is never the same" in gate["reason"]
    )
