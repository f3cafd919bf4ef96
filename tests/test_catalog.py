"""The server lists its tools from the generated catalog and imports a tool's module on its first call."""

from __future__ import annotations

import json
import logging
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from mcp import Client

from perfgate._toolnames import TOOL_MODULES
from perfgate.schemas import SCHEMA_DIR
from perfgate.server import build_server
from perfgate.serving.config import ServerConfig

pytestmark = pytest.mark.anyio

MFU_ARGS = {
    "buckets": [{"name": "b", "flops_per_step": 1e14, "step_time_s": 0.5}],
    "flops_kind": "model",
    "device": "H100",
    "precision": "bf16",
}

_PROBE = textwrap.dedent(
    """
    import json, sys
    from pathlib import Path
    import anyio
    from mcp import Client
    from perfgate.server import build_server
    from perfgate._toolnames import TOOL_MODULES
    from perfgate.serving.config import ServerConfig

    APPROVAL = ("perfgate.execution.gate", "perfgate.execution.approvals", "perfgate.execution.changes",
                "perfgate.execution.binding", "perfgate.execution.scope", "perfgate.harness.window")

    def loaded():
        return sorted(m for m in TOOL_MODULES if f"perfgate.tools.{m}" in sys.modules)

    async def main():
        seen = {}
        async with Client(build_server(ServerConfig.create(Path(sys.argv[1])))) as client:
            seen["listed"] = [t.name for t in (await client.list_tools()).tools]
            seen["after_list"] = loaded()
            seen["approval_modules"] = sorted(m for m in APPROVAL if m in sys.modules)
            result = await client.call_tool("compute_mfu", json.loads(sys.argv[2]))
            seen["error"] = result.is_error
            seen["after_call"] = loaded()
        print(json.dumps(seen))

    anyio.run(main)
    """
)


def test_listing_imports_no_tool_module_nor_the_approval_machinery_and_a_call_imports_its_own(
    tmp_path: Path,
) -> None:
    out = subprocess.run(
        [sys.executable, "-c", _PROBE, str(tmp_path), json.dumps(MFU_ARGS)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    seen = json.loads(out.stdout)
    assert seen["listed"] == [t["name"] for t in json.loads((SCHEMA_DIR / "tools_list.json").read_text())]
    assert seen["after_list"] == []
    # The approval machinery opens when a command is first asked for, not at start.
    assert seen["approval_modules"] == []
    assert seen["error"] is False
    assert "compute_mfu" in seen["after_call"] and "run_benchmark_window" not in seen["after_call"]


@pytest.mark.parametrize("read_only", [False, True])
async def test_the_catalog_lists_exactly_what_the_code_registers(workspace: Path, read_only: bool) -> None:
    config = ServerConfig.create(workspace, read_only=read_only)
    listed: list[list[dict[str, Any]]] = []
    for catalog in (True, False):
        async with Client(build_server(config, catalog=catalog)) as client:
            tools = (await client.list_tools()).tools
        listed.append([t.model_dump(mode="json", by_alias=True, exclude_none=True) for t in tools])
    assert listed[0] == listed[1]
    assert len(listed[0]) == (9 if read_only else len(TOOL_MODULES))


async def test_a_call_through_the_catalog_answers_as_the_code_does(workspace: Path) -> None:
    answers: list[tuple[bool, str]] = []
    for catalog in (True, False):
        async with Client(build_server(ServerConfig.create(workspace), catalog=catalog)) as client:
            bad = await client.call_tool("compute_mfu", {**MFU_ARGS, "peak_tflops": -1, "extra": 1})
            good = await client.call_tool("compute_mfu", MFU_ARGS)
        assert not good.is_error and good.structured_content is not None
        assert good.structured_content["utilization"] > 0
        answers.append((bool(bad.is_error), "\n".join(getattr(c, "text", "") for c in bad.content)))
    assert answers[0] == answers[1] and answers[0][0]


def _catalog_copy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "schemas"
    folder.mkdir()
    for name in ("tools_list.json", "tools_index.json"):
        shutil.copyfile(SCHEMA_DIR / name, folder / name)
    monkeypatch.setattr("perfgate.serving.catalog.SCHEMA_DIR", folder)
    return folder


async def test_a_stale_catalog_is_reported_and_the_code_decides(
    workspace: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    folder = _catalog_copy(tmp_path, monkeypatch)
    listing = json.loads((folder / "tools_list.json").read_text())
    (mfu,) = [t for t in listing if t["name"] == "compute_mfu"]
    del mfu["inputSchema"]["properties"]["precision"]  # as if a field was added without `perfgate schemas`
    (folder / "tools_list.json").write_text(json.dumps(listing))
    with caplog.at_level(logging.WARNING, logger="perfgate.serving.catalog"):
        async with Client(build_server(ServerConfig.create(workspace))) as client:
            result = await client.call_tool("compute_mfu", MFU_ARGS)
    assert not result.is_error, result.content  # the code's model took `precision`
    assert any(
        "compute_mfu" in r.getMessage() and "perfgate schemas" in r.getMessage() for r in caplog.records
    )


async def test_without_a_readable_catalog_every_tool_is_registered_from_its_module(
    workspace: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = _catalog_copy(tmp_path, monkeypatch)
    (folder / "tools_index.json").write_text("{not json")
    async with Client(build_server(ServerConfig.create(workspace))) as client:
        names = [t.name for t in (await client.list_tools()).tools]
        result = await client.call_tool("compute_mfu", MFU_ARGS)
    assert len(names) == len(TOOL_MODULES) and not result.is_error
