"""No process a command started survives, whichever way it tries to leave and whichever way it is stopped.

The command starts four sleepers: a plain child, one that calls ``setsid``, one that moves to its own
process group, and a daemon that double-forks and calls ``setsid``. Each stop path (timeout, client
cancellation, stdin closed, SIGTERM to the server, SIGKILL of the server followed by a new start) must
leave zero of them running.
"""

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
from perfgate.evidence import Ledger
from perfgate.server import build_server
from perfgate.serving.runtime import ServerConfig

pytestmark = pytest.mark.anyio

PY = sys.executable
SERVER_SCRIPT = Path(__file__).resolve().parent / "_gated_stdio_server.py"
ESCAPE = textwrap.dedent(
    """
    import os, subprocess, sys, time
    out = sys.argv[1]
    sleep = [sys.executable, "-c", "import time; time.sleep(600)"]
    plain = subprocess.Popen(sleep)
    session = subprocess.Popen(sleep, start_new_session=True)
    group = subprocess.Popen(sleep, process_group=0)
    daemon_pid = out + ".daemon"
    daemon = (
        "import os, sys, time\\n"
        "if os.fork(): os._exit(0)\\n"
        "os.setsid()\\n"
        "if os.fork(): os._exit(0)\\n"
        "open(sys.argv[1], 'w').write(str(os.getpid()))\\n"
        "time.sleep(600)\\n"
    )
    subprocess.run([sys.executable, "-c", daemon, daemon_pid], check=True)
    while not os.path.exists(daemon_pid) or not open(daemon_pid).read():
        time.sleep(0.01)
    pids = [os.getpid(), plain.pid, session.pid, group.pid, int(open(daemon_pid).read())]
    open(out + ".tmp", "w").write(" ".join(map(str, pids)) + f" {os.getppid()}")
    os.replace(out + ".tmp", out)
    time.sleep(600)
    """
)


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat[stat.rfind(")") + 2] not in "ZX"


async def wait_for_pids(path: Path) -> tuple[list[int], int]:
    with anyio.fail_after(60):
        while not path.exists():
            await anyio.sleep(0.02)
    *pids, parent = (int(x) for x in path.read_text().split())
    return pids, parent


async def assert_none_survive(pids: list[int]) -> None:
    with anyio.move_on_after(30):
        while any(alive(p) for p in pids):
            await anyio.sleep(0.05)
    assert [p for p in pids if alive(p)] == []


@pytest.fixture(autouse=True)
def escape_tool(workspace: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if not Path("/proc/self/stat").exists():
        pytest.skip("needs /proc (Linux)")
    monkeypatch.setattr(perfgate.tools, "REGISTRY", (*perfgate.tools.REGISTRY, SPEC))
    operator_policy("[execution]\n" + any_code_rules([PY]))


async def test_timeout_stops_every_descendant(workspace: Path) -> None:
    pids_file = workspace / "pids"
    async with Client(build_server(ServerConfig.create(workspace))) as client:
        result = await client.call_tool(
            SPEC.name, {"argv": [PY, "-c", ESCAPE, str(pids_file)], "timeout_s": 8}
        )
    assert result.structured_content is not None and result.structured_content["timed_out"]
    pids, _ = await wait_for_pids(pids_file)
    await assert_none_survive(pids)


async def test_client_cancellation_stops_every_descendant(workspace: Path) -> None:
    pids_file = workspace / "pids"
    scope = anyio.CancelScope()
    async with Client(build_server(ServerConfig.create(workspace))) as client:

        async def call() -> None:
            with scope:
                await client.call_tool(SPEC.name, {"argv": [PY, "-c", ESCAPE, str(pids_file)]})

        async with anyio.create_task_group() as tg:
            tg.start_soon(call)
            pids, _ = await wait_for_pids(pids_file)
            assert all(alive(p) for p in pids)
            scope.cancel()
            await assert_none_survive(pids)


def stdio_params(workspace: Path) -> StdioServerParameters:
    return StdioServerParameters(command=PY, args=[str(SERVER_SCRIPT), str(workspace)], env=dict(os.environ))


@pytest.mark.parametrize("how", ["stdin_closed", "sigterm", "sigkill_then_restart"])
async def test_stopping_the_server_stops_every_descendant(workspace: Path, how: str) -> None:
    pids_file = workspace / "pids"
    async with anyio.create_task_group() as tg:
        async with Client(stdio_params(workspace)) as client:

            async def call() -> None:
                with pytest.raises(MCPError):
                    await client.call_tool(SPEC.name, {"argv": [PY, "-c", ESCAPE, str(pids_file)]})

            tg.start_soon(call)
            pids, server_pid = await wait_for_pids(pids_file)
            assert all(alive(p) for p in pids)
            if how == "sigterm":
                os.kill(server_pid, signal.SIGTERM)
            elif how == "sigkill_then_restart":
                os.kill(server_pid, signal.SIGKILL)
        tg.cancel_scope.cancel()
    if how != "sigkill_then_restart":
        await assert_none_survive([*pids, server_pid])
        return
    # SIGKILL runs no handler: what the command started is still running...
    with anyio.fail_after(20):
        while alive(server_pid):
            await anyio.sleep(0.05)
    assert [p for p in pids if alive(p)], "the test needs survivors to clean up"
    # ...until the next start on this workspace finds them by their run tag, stops them and says so.
    async with Client(build_server(ServerConfig.create(workspace))) as client:
        await client.list_tools()
    await assert_none_survive(pids)
    (cleanup,) = Ledger(workspace).records(tool="process_cleanup")
    assert cleanup.result["processes_stopped"] >= len([p for p in pids if p]) - 1
    assert Ledger(workspace).verify().ok
