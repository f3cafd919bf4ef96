"""What an agent waits for: one tool call over MCP (stdio), to a warm server or to a fresh process.

Shared by the benchmarks that time perfgate's tools side by side with a peer. Times are wall clock from
the client's side: for a warm server, from sending ``tools/call`` to the parsed answer; for a cold one,
from spawning the server to the parsed answer of its first ``tools/call`` (start-up, ``initialize``, the
call, the answer). Results are reported as median and range (min-max) of the repeats.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

from mcp import Client, StdioServerParameters

__all__ = ["call_cold", "call_timed", "fmt", "perfgate_server", "summary", "trust_env", "warm_client"]


_scratch: tempfile.TemporaryDirectory[str] | None = None


def trust_env() -> dict[str, str]:
    """``PERFGATE_STATE_DIR`` and ``PERFGATE_CONFIG_DIR`` for the servers and runtimes a benchmark starts:
    the caller's when set, else a scratch directory removed when the benchmark ends, so the throwaway
    workspaces' keys, anchors and approvals do not pile up in the user's own trust root."""
    global _scratch
    if os.environ.get("PERFGATE_STATE_DIR"):
        return {k: v for k, v in os.environ.items() if k in ("PERFGATE_STATE_DIR", "PERFGATE_CONFIG_DIR")}
    if _scratch is None:
        _scratch = tempfile.TemporaryDirectory(prefix="perfgate-bench-trust-")
    return {"PERFGATE_STATE_DIR": f"{_scratch.name}/state", "PERFGATE_CONFIG_DIR": f"{_scratch.name}/config"}


def perfgate_server(workspace: Path) -> StdioServerParameters:
    """``perfgate serve`` on ``workspace`` over stdio, as an agent's client starts it.

    The server imports the perfgate this process imported (the client passes a server only a few
    environment variables, so without ``PYTHONPATH`` it would run whichever perfgate is installed,
    not the checkout being measured), with the benchmark's trust root (`trust_env`).
    """
    import perfgate

    src = str(Path(perfgate.__file__).resolve().parents[1])
    path = os.pathsep.join(p for p in (src, os.environ.get("PYTHONPATH", "")) if p)
    return StdioServerParameters(
        command=sys.executable,
        args=["-m", "perfgate", "serve", "--workspace", str(workspace)],
        env={"PYTHONPATH": path, **trust_env()},
    )


async def warm_client(stack: AsyncExitStack, params: StdioServerParameters) -> Client:
    """A connected client whose server has answered ``tools/list`` (started and warm)."""
    client = await stack.enter_async_context(Client(params, mode="legacy"))
    await client.list_tools()
    return client


async def call_timed(client: Client, name: str, args: dict[str, Any]) -> float:
    start = time.perf_counter()
    result = await client.call_tool(name, args)
    seconds = time.perf_counter() - start
    _raise_on_error(name, result)
    return seconds


async def call_cold(params: StdioServerParameters, name: str, args: dict[str, Any]) -> float:
    """Spawn the server, call one tool, return the seconds until its answer."""
    start = time.perf_counter()
    async with Client(params, mode="legacy") as client:
        result = await client.call_tool(name, args)
        seconds = time.perf_counter() - start
    _raise_on_error(name, result)
    return seconds


def _raise_on_error(name: str, result: Any) -> None:
    """A timed call that failed is a benchmark error, never a figure."""
    if result.is_error:
        text = " ".join(getattr(c, "text", "") for c in result.content)
        raise RuntimeError(f"{name} failed: {text}")


def summary(values: Sequence[float], scale: float = 1.0) -> dict[str, float]:
    """Median and range of ``values`` (times ``scale``)."""
    return {
        "median": statistics.median(values) * scale,
        "min": min(values) * scale,
        "max": max(values) * scale,
        "n": float(len(values)),
    }


def fmt(row: dict[str, float], unit: str) -> str:
    return f"{row['median']:.3g} {unit} (range {row['min']:.3g}-{row['max']:.3g}, n={int(row['n'])})"
