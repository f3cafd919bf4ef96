"""Launches and wall time to a settled A/B verdict: today's calls against one run_benchmark_pair call.

For a 1.3x and a 3x change (extra matmuls in each step of the baseline, tests/fixtures/paired_sleep.py),
on the host as it is and with a CPU burner process beside it:

- today's way, as the skill described it: run_benchmark_window for the baseline (3 launches), for the
  candidate (3), compare_benchmarks; while the verdict is within_noise, the candidate again and the baseline
  again (B then A: interleaved in time with what ran before) and compare all of them, up to three rounds;
- the paired run: one run_benchmark_pair call (at most 8 launches a side).

Each counts launches, approvals and wall time until the verdict (decisive, or the last one). Every approval
is accepted in the client. ``--json PATH`` writes the report benchmarks/run.py's goals' table reads.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio
from mcp import Client
from mcp.types import ElicitRequestParams, ElicitResult

from perfgate.server import build_server
from perfgate.serving.runtime import ServerConfig

SCRIPT = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "paired_sleep.py"
CONTRACT = {"invariants": {"model": "mlp", "dataset": "synthetic", "precision": "fp32", "global_batch": 32}}
CHANGES = {"1.3x": ("13", "10"), "3x": ("30", "10")}
"""Matmuls per step of the baseline and the candidate."""


class _Accept:
    def __init__(self) -> None:
        self.asked = 0

    async def __call__(self, context: Any, params: ElicitRequestParams) -> ElicitResult:
        self.asked += 1
        return ElicitResult(action="accept", content={"note": ""})


def _window(matmuls: str, label: str, steps: int) -> dict[str, Any]:
    return {
        "command": [sys.executable, "train.py", "--steps", str(steps + 6), "--matmuls", matmuls],
        "env": {"OMP_NUM_THREADS": "1"},
        "warmup_steps": 3,
        "measure_steps": steps,
        "repeats": 3,
        "timeout_s": 300,
        "label": label,
        "contract": CONTRACT,
    }


async def _call(client: Client, tool: str, args: dict[str, Any]) -> dict[str, Any]:
    result = await client.call_tool(tool, args)
    assert not result.is_error and result.structured_content is not None, result.content
    return result.structured_content


async def _today(client: Client, base: str, cand: str, steps: int) -> tuple[int, str]:
    """(launches, verdict) the skill's calls take."""
    a_ids: list[str] = []
    b_ids: list[str] = []
    verdict = "none"
    for round_ in range(3):
        sides = [(base, "baseline", a_ids), (cand, "candidate", b_ids)]
        for matmuls, label, ids in sides if round_ == 0 else sides[::-1]:
            ids.append(
                (await _call(client, "run_benchmark_window", _window(matmuls, label, steps)))["evidence_id"]
            )
        compared = await _call(
            client,
            "compare_benchmarks",
            {"baseline": a_ids, "candidate": b_ids, "declared_changes": ["argv"]},
        )
        verdict = compared["verdict"]
        if verdict in ("improved", "regressed"):
            break
    return 3 * (len(a_ids) + len(b_ids)), verdict


async def _paired(client: Client, base: str, cand: str, steps: int) -> tuple[int, str]:
    window = _window(base, "baseline", steps)
    got = await _call(
        client,
        "run_benchmark_pair",
        {
            "baseline": {k: v for k, v in window.items() if k != "repeats"},
            "candidate": {"command": _window(cand, "candidate", steps)["command"]},
            "declared_changes": ["argv"],
        },
    )
    return 2 * got["launches"], str(got["verdict"])


async def _measure(way: str, change: str, steps: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="perfgate-bench-paired-") as tmp:
        ws = Path(tmp) / "job"
        ws.mkdir()
        shutil.copy(SCRIPT, ws / "train.py")
        human = _Accept()
        base, cand = CHANGES[change]
        async with Client(build_server(ServerConfig.create(ws)), elicitation_callback=human) as client:
            start = time.perf_counter()
            launches, verdict = await (_today if way == "today" else _paired)(client, base, cand, steps)
            wall = time.perf_counter() - start
    return {"launches": launches, "wall_s": wall, "verdict": verdict, "approvals": human.asked}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10, help="measured steps per window")
    parser.add_argument("--hosts", default="quiet,loaded")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    rows: list[dict[str, Any]] = []
    for host in args.hosts.split(","):
        burner = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if host == "loaded" else None
        try:
            for change in CHANGES:
                for way in ("today", "paired"):
                    got = anyio.run(_measure, way, change, args.steps)
                    rows.append({"host": host, "change": change, "way": way, **got})
                    print(
                        f"{host:6} {change:4} {way:6} {got['launches']:3d} launches {got['approvals']} approvals "
                        f"{got['wall_s']:7.1f} s -> {got['verdict']}",
                        flush=True,
                    )
        finally:
            if burner is not None:
                burner.kill()
                burner.wait()
    report = {"rows": rows, "ratios": ratios(rows)}
    for r in report["ratios"]:
        print(
            f"{r['host']:6} {r['change']:4} paired/today: launches {r['launches']:.2f}x, wall {r['wall']:.2f}x",
            flush=True,
        )
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))


def ratios(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per host and change: the paired run's launches and wall time over today's."""
    by = {(r["host"], r["change"], r["way"]): r for r in rows}
    out: list[dict[str, Any]] = []
    for (host, change, way), paired in by.items():
        today = by.get((host, change, "today"))
        if way != "paired" or today is None:
            continue
        out.append(
            {
                "host": host,
                "change": change,
                "launches": paired["launches"] / today["launches"],
                "wall": paired["wall_s"] / today["wall_s"],
                "verdicts": f"{today['verdict']} -> {paired['verdict']}",
            }
        )
    return out


if __name__ == "__main__":
    main()
