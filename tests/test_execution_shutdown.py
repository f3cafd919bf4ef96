"""No command outlives the server: client cancellation, stdin closed, SIGTERM to a stdio server."""

from __future__ import annotations

import os
import signal
import sys
import textwrap
from pathlib import Path

import anyio
import pytest
from mcp import Client, MCPError, StdioServerParameters

import perfgate.tools
from _gated_tool import SPEC
from _trust import any_code_rules, operator_policy
from perfgate.server import build_server
from perfgate.serving.runtime import ServerConfig

pytestmark = pytest.mark.anyio

PY = sys.executable
SERVER_SCRIPT = Path(__file__).resolve().parent / "_gated_stdio_server.py"
# The command: a child that starts a sleeping grandchild and reports (child, grandchild, parent) pids.
TREE = textwrap.dedent(
    """
    import os, subprocess, sys, time
    g = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    open(sys.argv[1], "w").write(f"{os.getpid()} {g.pid} {os.getppid()}")
    time.sleep(600)
    """
)


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat[stat.rfind(")") + 2] not in "ZX"


def allow_python(workspace: Path) -> None:
    operator_policy("[execution]\n" + any_code_rules([PY]))


async def wait_for_pids(path: Path) -> list[int]:
    with anyio.fail_after(30):
        while not path.exists() or len(path.read_text().split()) != 3:
            await anyio.sleep(0.01)
    return [int(x) for x in path.read_text().split()]


async def wait_until_gone(*pids: int) -> None:
    with anyio.fail_after(20):
        while any(alive(p) for p in pids):
            await anyio.sleep(0.02)


async def test_client_cancellation_kills_the_command_tree(
    workspace: Path, mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(perfgate.tools, "REGISTRY", (*perfgate.tools.REGISTRY, SPEC))
    allow_python(workspace)
    pids = workspace / "pids"
    call_scope = anyio.CancelScope()

    async with Client(build_server(ServerConfig.create(workspace)), mode=mode) as client:

        async def call() -> None:
            with call_scope:
                await client.call_tool(SPEC.name, {"argv": [PY, "-c", TREE, str(pids)]})

        async with anyio.create_task_group() as tg:
            tg.start_soon(call)
            child, grandchild, _ = await wait_for_pids(pids)
            assert alive(child) and alive(grandchild)
            call_scope.cancel()
            # The server is still up: only the cancelled call's process group goes away.
            await wait_until_gone(child, grandchild)
        assert (await client.list_tools()).tools


@pytest.mark.parametrize("how", ["stdin_closed", "sigterm"])
async def test_stopping_a_stdio_server_kills_the_command_tree(workspace: Path, how: str) -> None:
    allow_python(workspace)
    pids = workspace / "pids"
    # The whole environment: the trust root (conftest) and this checkout on PYTHONPATH.
    params = StdioServerParameters(
        command=PY, args=[str(SERVER_SCRIPT), str(workspace)], env=dict(os.environ)
    )
    async with anyio.create_task_group() as tg:
        async with Client(params) as client:

            async def call() -> None:
                with pytest.raises(MCPError):
                    await client.call_tool(SPEC.name, {"argv": [PY, "-c", TREE, str(pids)]})

            tg.start_soon(call)
            child, grandchild, server_pid = await wait_for_pids(pids)
            assert alive(child) and alive(grandchild)
            if how == "sigterm":
                os.kill(server_pid, signal.SIGTERM)
        tg.cancel_scope.cancel()
    await wait_until_gone(child, grandchild, server_pid)
