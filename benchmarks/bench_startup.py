"""Cold start to a completed tools/list over stdio, and a compute_mfu round trip, vs a minimal server.

Both servers are launched as fresh subprocesses by the same client, alternately, N times each; medians
are reported with the ratio perfgate / minimal (goal: cold start within 1.3x).
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

import anyio
from mcp import Client, StdioServerParameters

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _mcp import perfgate_server  # the server runs the perfgate imported here

HERE = Path(__file__).resolve().parent
MFU_ARGS = {
    "buckets": [{"name": "b", "flops_per_step": 1e14, "step_time_s": 0.5}],
    "flops_kind": "model",
    "device": "H100",
    "precision": "bf16",
}


async def _cold_start(params: StdioServerParameters) -> float:
    start = time.perf_counter()
    async with Client(params, mode="legacy") as client:
        await client.list_tools()
        return time.perf_counter() - start


async def _round_trip(client: Client, name: str, args: dict[str, object], n: int) -> float:
    times: list[float] = []
    for _ in range(n):
        start = time.perf_counter()
        result = await client.call_tool(name, args)
        times.append(time.perf_counter() - start)
        assert not result.is_error, result
    return statistics.median(times)


async def main(repeats: int = 7) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as ws:
        perfgate = perfgate_server(Path(ws))
        minimal = StdioServerParameters(command=sys.executable, args=[str(HERE / "_minimal_server.py")])
        await _cold_start(perfgate)  # warm the OS page cache for both before timing
        await _cold_start(minimal)
        ours: list[float] = []
        peer: list[float] = []
        for _ in range(repeats):
            ours.append(await _cold_start(perfgate))
            peer.append(await _cold_start(minimal))
        async with Client(perfgate, mode="legacy") as client:
            mfu_s = await _round_trip(client, "compute_mfu", MFU_ARGS, 30)
        async with Client(minimal, mode="legacy") as client:
            ratio_s = await _round_trip(
                client, "ratio", {"flops": 1e14, "seconds": 0.5, "peak_tflops": 989.4}, 30
            )
    results = {
        "perfgate_cold_start_s": statistics.median(ours),
        "minimal_cold_start_s": statistics.median(peer),
        "perfgate_compute_mfu_round_trip_ms": mfu_s * 1e3,
        "minimal_tool_round_trip_ms": ratio_s * 1e3,
    }
    results["cold_start_ratio"] = results["perfgate_cold_start_s"] / results["minimal_cold_start_s"]
    results["round_trip_ratio"] = mfu_s / ratio_s
    return results


if __name__ == "__main__":
    res = anyio.run(main)
    print("startup: perfgate vs a minimal MCP server on the same SDK (stdio, medians)")
    for key, value in res.items():
        print(f"  {key:<38} {value:.3f}")
    print(f"  goal: cold start within 1.3x -> {'met' if res['cold_start_ratio'] <= 1.3 else 'NOT met'}")
