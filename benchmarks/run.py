"""Run the benchmarks (``bench_*.py``) in turn, each in its own interpreter, print each report, then the
goals' table: what an agent waits for, as ratios to the peer a user would otherwise run.

python benchmarks/run.py              # all
python benchmarks/run.py startup      # only those whose name contains 'startup'
python benchmarks/run.py --goals      # the waits of the goals' table only (traces without the
                                      # rank set and the 1 GB trace; ~10 minutes on 2 cores)
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
GOALS: dict[str, list[str]] = {
    "bench_traces": ["--skip-synthetic", "--ranks", "0"],
    "bench_tool_calls": [],
    "bench_startup": [],
    "bench_paired": ["--steps", "6"],
    # the tool call an agent waits for and the peer's cold process only, 2 x 512 MiB fp32
    "bench_tensors": ["--size-gib", "0.5", "--only", "mcp_warm", "--only", "torch"],
}
"""The benchmarks whose ``--json`` report feeds the goals' table, and their arguments under ``--goals``."""


def _x(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:.2f}x"


def goal_rows(reports: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    """(work, peer, goal, result) for each goal whose benchmark reported."""
    rows: list[tuple[str, str, str, str]] = []
    traces = reports.get("bench_traces")
    if traces is not None and traces.get("traces"):
        peer = "HTA 0.5's temporal + kernel breakdown as a cold process, same trace"
        for who, what in (
            ("first", "first read of the trace"),
            ("warm", "again, parse kept by content digest"),
        ):
            got = traces[who]
            rows.append(
                (
                    f"`analyze_trace` call over MCP stdio, warm server, {what} ({traces['traces']} large shared "
                    f"traces, {traces.get('cpu_model') or 'unknown CPU'})",
                    peer,
                    ">= 20x geo-mean, no trace under 15x",
                    f"{got['geomean']:.1f}x geo-mean, smallest {got['min']:.1f}x: {'met' if got['met'] else 'not met'}",
                )
            )
    calls = reports.get("bench_tool_calls")
    if calls is not None:
        ratio = calls["warm_ratio"]
        rows.append(
            (
                "`compute_mfu` round trip over stdio, warm",
                "a one-tool server on the same SDK",
                "<= 1.3x",
                f"{_x(ratio)} ({calls['warm_compute_mfu_ms']['median']:.2f} vs "
                f"{calls['warm_minimal_ms']['median']:.2f} ms): {'met' if ratio <= 1.3 else 'not met'}",
            )
        )
    startup = reports.get("bench_startup")
    if startup is not None:
        ratio = startup["cold_start_ratio"]
        rows.append(
            (
                "cold start to a completed tools/list",
                "a one-tool server on the same SDK",
                "<= 1.0x",
                f"{_x(ratio)} ({startup['perfgate_cold_start_s']:.3f} vs {startup['minimal_cold_start_s']:.3f} s): "
                f"{'met' if ratio <= 1.0 else 'not met'}",
            )
        )
    tensors = reports.get("bench_tensors")
    if tensors is not None and "mcp_warm" in tensors["results"] and "torch" in tensors["results"]:
        warm = tensors["results"]["mcp_warm"]
        peer = tensors["results"]["torch"]
        ratio = peer["seconds_median"] / warm["seconds_median"]
        rows.append(
            (
                f"`compare_tensors` call over MCP stdio, warm server, 2 x {tensors['size_gib']} GiB ({tensors['kind']})",
                "safetensors + torch + `assert_close`, cold process",
                ">= 4x",
                f"{_x(ratio)} ({warm['seconds_median']:.2f} vs {peer['seconds_median']:.2f} s): "
                f"{'met' if ratio >= 4 else 'not met'}",
            )
        )
    rows += paired_rows(reports.get("bench_paired"))
    return rows


def paired_rows(paired: dict[str, Any] | None) -> list[tuple[str, str, str, str]]:
    """Launches and wall time to a verdict, the paired run over today's calls, per change and host."""
    rows: list[tuple[str, str, str, str]] = []
    for r in (paired or {}).get("ratios", []):
        met = r["launches"] <= 0.5 and r["wall"] <= 1 / 3
        rows.append(
            (
                f"A/B to a verdict, {r['change']} change, {r['host']} host: one `run_benchmark_pair` call",
                "the skill's run_benchmark_window calls per side and compare_benchmarks",
                "<= 0.5x launches, <= 0.33x wall time",
                f"{r['launches']:.2f}x launches, {r['wall']:.2f}x wall ({r['verdicts']}): {'met' if met else 'not met'}",
            )
        )
    return rows


def print_goals(reports: dict[str, Any]) -> None:
    rows = goal_rows(reports)
    if not rows:
        return
    print("\n== goals ==\n\n| work | peer | goal | result |\n|---|---|---|---|")
    for row in rows:
        print("| " + " | ".join(row) + " |")


def main(argv: list[str]) -> int:
    only_goals = "--goals" in argv
    wanted = [a for a in argv[1:] if a != "--goals"]
    failures = 0
    reports: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="perfgate-bench-reports-") as tmp:
        for script in sorted(HERE.glob("bench_*.py")):
            if only_goals and script.stem not in GOALS:
                continue
            if wanted and not any(w in script.stem for w in wanted):
                continue
            print(f"== {script.stem} ==", flush=True)
            command = [sys.executable, str(script)]
            report = Path(tmp) / f"{script.stem}.json"
            if script.stem in GOALS:
                command += [*(GOALS[script.stem] if only_goals else []), "--json", str(report)]
            failures += subprocess.call(command) != 0
            if report.is_file():
                reports[script.stem] = json.loads(report.read_text())
    print_goals(reports)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
