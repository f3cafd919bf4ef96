"""The independent TypeScript client (MCP Inspector CLI) against `perfgate serve` over stdio."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from perfgate.tools import registered_specs

NPX = shutil.which("npx")
# Pinned: the version these tests were written against (npx reuses its cached copy, no network needed);
# unpinned, a new release (2.x is out) or a cleared npm cache would change the client under test.
INSPECTOR = "@modelcontextprotocol/inspector@0.15.0"
# npm's words for a registry it cannot reach (DNS, refused, reset, timed out, offline)
_UNREACHABLE = ("ENOTFOUND", "EAI_AGAIN", "ECONNREFUSED", "ECONNRESET", "ETIMEDOUT", "ENETUNREACH")
pytestmark = pytest.mark.skipif(NPX is None, reason="npx (Node.js) is not installed")


def _inspector(workspace: Path, *args: str) -> dict[str, object]:
    assert NPX is not None
    server = [sys.executable, "-m", "perfgate", "serve", "--workspace", str(workspace)]
    proc = subprocess.run(
        [NPX, "-y", INSPECTOR, "--cli", *server, *args],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    if proc.returncode != 0 and any(code in proc.stderr + proc.stdout for code in _UNREACHABLE):
        pytest.skip("the npm registry is unreachable, so the inspector cannot be fetched")
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout)


def test_the_typescript_client_lists_every_tool(workspace: Path) -> None:
    listed = _inspector(workspace, "--method", "tools/list")
    names = [t["name"] for t in listed["tools"]]  # type: ignore[index,union-attr]
    assert names == [s.name for s in registered_specs(read_only=False)]


def test_the_typescript_client_calls_compute_mfu(workspace: Path) -> None:
    result = _inspector(
        workspace,
        "--method",
        "tools/call",
        "--tool-name",
        "compute_mfu",
        "--tool-arg",
        'buckets=[{"name": "b", "flops_per_step": 1e14, "step_time_s": 0.5}]',
        "--tool-arg",
        "flops_kind=model",
        "--tool-arg",
        "peak_tflops=400",
    )
    structured = result["structuredContent"]
    assert structured["utilization"] == 0.5  # type: ignore[index]
    assert str(structured["evidence_id"]).startswith("ev-")  # type: ignore[index]
