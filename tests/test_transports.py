"""Real transports: stdio in a subprocess, streamable HTTP with its bearer token rule, the CLI."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx2
import pytest
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client

from _ports import free_port
from perfgate.cli import main as cli_main
from perfgate.evidence import Ledger

pytestmark = pytest.mark.anyio

MFU_ARGS = {
    "buckets": [{"name": "b", "flops_per_step": 1e14, "step_time_s": 0.5}],
    "flops_kind": "model",
    "peak_tflops": 400.0,
}


async def test_stdio_server_lists_tools_and_records_evidence(workspace: Path, mode: str) -> None:
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "perfgate", "serve", "--workspace", str(workspace)],
        env=dict(os.environ),  # the test's trust root and this checkout
    )
    async with Client(params, mode=mode) as client:
        names = [t.name for t in (await client.list_tools()).tools]
        assert "compute_mfu" in names
        result = await client.call_tool("compute_mfu", MFU_ARGS)
    assert not result.is_error
    assert result.structured_content is not None
    assert result.structured_content["utilization"] == pytest.approx(0.5)
    assert Ledger(workspace).get(result.structured_content["evidence_id"]) is not None


def _wait_for_port(port: int, proc: subprocess.Popen[bytes]) -> None:
    # Guards a hang only: a server process starts in about a second here, in tens of seconds when loaded.
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        assert proc.poll() is None, "server exited early"
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise AssertionError("server did not start listening")


async def test_http_requires_the_bearer_token_on_every_request(workspace: Path) -> None:
    port = free_port()
    cmd = [sys.executable, "-m", "perfgate", "serve", "--workspace", str(workspace), "--transport", "http"]
    env = {**os.environ, "PERFGATE_TOKEN": "s3cret-token-value"}
    with subprocess.Popen(
        [*cmd, "--port", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env
    ) as proc:
        try:
            _wait_for_port(port, proc)
            url = f"http://127.0.0.1:{port}/mcp"
            async with httpx2.AsyncClient(timeout=60) as anon:
                denied = await anon.post(url, json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"})
            assert denied.status_code == 401
            async with httpx2.AsyncClient(headers={"Authorization": "Bearer wrong"}, timeout=60) as bad:
                assert (await bad.post(url, json={})).status_code == 401
            http = httpx2.AsyncClient(headers={"Authorization": "Bearer s3cret-token-value"}, timeout=60)
            async with http, Client(streamable_http_client(url, http_client=http)) as client:
                result = await client.call_tool("compute_mfu", MFU_ARGS)
            assert not result.is_error
        finally:
            proc.terminate()
            _, err = proc.communicate(timeout=60)
    assert b"s3cret-token-value" not in err and b"$PERFGATE_TOKEN" in err


async def test_http_without_a_token_generates_one_and_checks_host_and_origin(
    workspace: Path, trust_root: Any
) -> None:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "PERFGATE_TOKEN"}
    cmd = [sys.executable, "-m", "perfgate", "serve", "--workspace", str(workspace), "--transport", "http"]
    with subprocess.Popen(
        [*cmd, "--port", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env
    ) as proc:
        try:
            _wait_for_port(port, proc)
            token_file = trust_root.state_dir / "http-token"
            assert token_file.stat().st_mode & 0o077 == 0
            token = token_file.read_text().strip()
            url = f"http://127.0.0.1:{port}/mcp"
            body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
            async with httpx2.AsyncClient(timeout=60) as anon:
                assert (await anon.post(url, json=body)).status_code == 401
            auth = {"Authorization": f"Bearer {token}"}
            async with httpx2.AsyncClient(headers=auth, timeout=60) as rebinding:
                # A DNS-rebinding page: right token (say, stolen), wrong Host / a browser Origin.
                assert (
                    await rebinding.post(url, json=body, headers={"Host": "evil.example"})
                ).status_code in (
                    400,
                    403,
                    421,
                )
                origin = {"Origin": "http://evil.example"}
                assert (await rebinding.post(url, json=body, headers=origin)).status_code in (400, 403)
            http = httpx2.AsyncClient(headers=auth, timeout=60)
            async with http, Client(streamable_http_client(url, http_client=http)) as client:
                assert (await client.list_tools()).tools
        finally:
            proc.terminate()
            _, err = proc.communicate(timeout=60)
    assert token.encode() not in err and b"http-token" in err and b"mcpServers" in err


def test_a_token_file_readable_by_others_is_refused(
    workspace: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("PERFGATE_TOKEN", raising=False)
    token_file = tmp_path / "token"
    token_file.write_text("abc")
    token_file.chmod(0o644)
    code = cli_main(
        ["serve", "--workspace", str(workspace), "--transport", "http", "--token-file", str(token_file)]
    )
    assert code == 2 and "readable by other users" in capsys.readouterr().err


def test_schemas_are_in_sync_with_the_code(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["schemas", "--check"]) == 0, capsys.readouterr().out


def test_ledger_show_lists_and_prints_records(workspace: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from perfgate.evidence import EvidenceDraft, EvidenceState

    ledger = Ledger(workspace)
    ledger.append(EvidenceDraft(id="ev-1", tool="compute_mfu", state=EvidenceState.EXECUTED, result={"x": 1}))
    assert cli_main(["ledger", "show", "--workspace", str(workspace)]) == 0
    assert "ev-1" in capsys.readouterr().out
    assert cli_main(["ledger", "show", "ev-1", "--workspace", str(workspace)]) == 0
    assert '"x": 1' in capsys.readouterr().out
    assert cli_main(["ledger", "show", "ev-404", "--workspace", str(workspace)]) == 2
