"""A cheap tool call as the agent waits for it, and the ledger append under it, vs a one-tool server.

- ``ledger append`` (library figure): `Ledger.append` of a compute_mfu-sized record, in process, on the
  file system of ``--dir`` (durable: one WAL commit with fsync per record).
- ``warm``: a ``compute_mfu`` call over stdio to a running ``perfgate serve`` (which validates, computes,
  appends its ledger record and answers), interleaved call by call with the ``ratio`` tool of
  ``_minimal_server.py`` (the smallest useful server on the same SDK), ``--calls`` of each; with each
  server's CPU time per call (all its threads, in the scheduler's nanoseconds from /proc on Linux:
  steadier than wall time on a loaded machine).
- ``cold``: spawn, ``initialize`` and that one call, as an agent's first call of a session, alternating
  the two servers ``--cold`` times.

Medians and ranges; the goal ratio: warm compute_mfu within 1.3x of the one-tool server, and an append of
at most 0.3 ms on a quiet machine.

    python benchmarks/bench_tool_calls.py [--calls 60] [--cold 5] [--dir PATH] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
import time
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import anyio
from mcp import StdioServerParameters

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _mcp import call_cold, call_timed, fmt, perfgate_server, summary, warm_client

HERE = Path(__file__).resolve().parent
MFU_ARGS: dict[str, Any] = {
    "buckets": [{"name": "b", "flops_per_step": 1e14, "step_time_s": 0.5}],
    "flops_kind": "model",
    "device": "H100",
    "precision": "bf16",
}
RATIO_ARGS: dict[str, Any] = {"flops": 1e14, "seconds": 0.5, "peak_tflops": 989.4}


def ledger_appends(folder: Path, n: int) -> list[float]:
    from perfgate.evidence import EvidenceDraft, EvidenceState, Ledger
    from perfgate.security.trustroot import TrustRoot

    ws = folder / "ledger-ws"
    ws.mkdir()
    ledger = Ledger(ws, TrustRoot.locate(state_dir=folder / "state", config_dir=folder / "config"))
    result = {"mfu": 0.41, "hfu": 0.45, "buckets": [{"name": "b", "mfu": 0.41}], "note": "x" * 120}
    times: list[float] = []
    for i in range(n + 5):
        draft = EvidenceDraft(
            id=Ledger.new_id(),
            tool="compute_mfu",
            state=EvidenceState.EXECUTED,
            inputs=MFU_ARGS,
            result=result,
        )
        start = time.perf_counter()
        ledger.append(draft)
        if i >= 5:  # the first appends create the key, the anchor and the WAL
            times.append(time.perf_counter() - start)
    return times


def _server_pids() -> dict[int, str]:
    """This process's child processes and their command lines (Linux /proc; empty elsewhere)."""
    out: dict[int, str] = {}
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return out
    for tid in tasks:
        try:
            kids = Path(f"/proc/self/task/{tid}/children").read_text().split()
        except OSError:
            continue
        for kid in kids:
            try:
                out[int(kid)] = Path(f"/proc/{kid}/cmdline").read_text().replace("\0", " ")
            except OSError:
                continue
    return out


def _cpu_s(pid: int | None) -> float:
    """CPU seconds a process has run so far, all its threads (NaN when it cannot be read).

    From the scheduler's nanosecond counts (``/proc/<pid>/task/*/schedstat``) where the kernel gives them,
    else user + system clock ticks (``/proc/<pid>/stat``: 10 ms steps, coarse for a call of a few ms)."""
    if pid is None:
        return math.nan
    try:
        total = 0
        for tid in os.listdir(f"/proc/{pid}/task"):
            total += int(Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()[0])
        if total > 0:
            return total / 1e9
    except (OSError, IndexError, ValueError):
        pass
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return math.nan
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def warm(folder: Path, calls: int) -> tuple[list[float], list[float], list[float]]:
    """Interleaved warm calls; also each server's CPU seconds per call (server side, from /proc)."""
    ours: list[float] = []
    peer: list[float] = []
    cpu = [0.0, 0.0]
    minimal = StdioServerParameters(command=sys.executable, args=[str(HERE / "_minimal_server.py")])
    async with AsyncExitStack() as stack:
        pg = await warm_client(stack, perfgate_server(folder / "warm-ws"))
        mini = await warm_client(stack, minimal)
        pids = _server_pids()
        pg_pid = next((p for p, cmd in pids.items() if " perfgate serve " in f" {cmd} "), None)
        mini_pid = next((p for p, cmd in pids.items() if "_minimal_server" in cmd), None)
        for _ in range(5):  # first calls import the tool's modules
            await call_timed(pg, "compute_mfu", MFU_ARGS)
            await call_timed(mini, "ratio", RATIO_ARGS)
        for _ in range(calls):
            before = _cpu_s(pg_pid)
            ours.append(await call_timed(pg, "compute_mfu", MFU_ARGS))
            middle = _cpu_s(pg_pid), _cpu_s(mini_pid)
            peer.append(await call_timed(mini, "ratio", RATIO_ARGS))
            cpu[0] += middle[0] - before
            cpu[1] += _cpu_s(mini_pid) - middle[1]
    return ours, peer, [c / calls for c in cpu]


async def cold(folder: Path, repeats: int) -> tuple[list[float], list[float]]:
    ours: list[float] = []
    peer: list[float] = []
    minimal = StdioServerParameters(command=sys.executable, args=[str(HERE / "_minimal_server.py")])
    params = perfgate_server(folder / "cold-ws")
    await call_cold(params, "compute_mfu", MFU_ARGS)  # page cache
    await call_cold(minimal, "ratio", RATIO_ARGS)
    for _ in range(repeats):
        ours.append(await call_cold(params, "compute_mfu", MFU_ARGS))
        peer.append(await call_cold(minimal, "ratio", RATIO_ARGS))
    return ours, peer


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--calls", type=int, default=60, help="warm calls of each server, interleaved")
    parser.add_argument("--cold", type=int, default=5, help="cold calls of each server, alternating")
    parser.add_argument("--appends", type=int, default=200, help="ledger appends timed")
    parser.add_argument("--dir", type=Path, default=None, help="where workspaces go (default: temp dir)")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="perfgate-bench-calls-", dir=args.dir) as tmp:
        folder = Path(tmp)
        for name in ("warm-ws", "cold-ws"):
            (folder / name).mkdir()
        appends = ledger_appends(folder, args.appends)
        warm_ours, warm_peer, (cpu_ours, cpu_peer) = anyio.run(warm, folder, args.calls)
        cold_ours, cold_peer = anyio.run(cold, folder, args.cold)
    results = {
        "ledger_append_ms": summary(appends, 1e3),
        "warm_compute_mfu_ms": summary(warm_ours, 1e3),
        "warm_minimal_ms": summary(warm_peer, 1e3),
        "warm_server_cpu_ms_per_call": {"compute_mfu": cpu_ours * 1e3, "minimal": cpu_peer * 1e3},
        "cold_compute_mfu_s": summary(cold_ours),
        "cold_minimal_s": summary(cold_peer),
    }
    warm_ratio = statistics.median(warm_ours) / statistics.median(warm_peer)
    cold_ratio = statistics.median(cold_ours) / statistics.median(cold_peer)
    print("tool calls over MCP stdio: perfgate compute_mfu vs a one-tool server on the same SDK")
    print(f"  ledger append (library)     {fmt(results['ledger_append_ms'], 'ms')}")
    print(f"  warm compute_mfu            {fmt(results['warm_compute_mfu_ms'], 'ms')}")
    print(f"  warm one-tool server        {fmt(results['warm_minimal_ms'], 'ms')}")
    print(f"  warm ratio (medians)        {warm_ratio:.2f}x (goal <= 1.3x)")
    print(
        f"  server CPU per warm call    {cpu_ours * 1e3:.2f} ms vs {cpu_peer * 1e3:.2f} ms "
        f"({cpu_ours / cpu_peer:.2f}x; scheduler CPU time of all server threads, summed over the calls)"
    )
    print(f"  cold compute_mfu            {fmt(results['cold_compute_mfu_s'], 's')}")
    print(f"  cold one-tool server        {fmt(results['cold_minimal_s'], 's')}")
    print(f"  cold ratio (medians)        {cold_ratio:.2f}x")
    if args.json:
        args.json.write_text(
            json.dumps({**results, "warm_ratio": warm_ratio, "cold_ratio": cold_ratio}, indent=2) + "\n"
        )


if __name__ == "__main__":
    main()
