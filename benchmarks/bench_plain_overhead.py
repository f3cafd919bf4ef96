"""What the harness changes in what it measures: a tiny CPU training script's start-up (exec to its first
step) and per-step time, run plainly and under the harness (``python -m perfgate.harness -- script``, the whole
job kept), interleaved (plain, harness, harness, plain, ...). The script stamps its own steps on the system's
monotonic clock (the same stamps in both modes), and the parent reads its clock just before starting it.
Goal: the harness within 3% of the plain run on both (issue 58 item 6); the report says by how much it differs,
and beside it what the harness says its own code took (the record's ``harness_own``: per step, and the
launcher's start-up with torch's import left out), the figure run_benchmark_window's answer states.

Run: python benchmarks/bench_plain_overhead.py [--quick] [--json results.json]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

GOAL = 0.03
"""Harness over plain, start-up and per step."""

SCRIPT = """\
import sys
import time

import torch

steps = int(sys.argv[1])
torch.manual_seed(0)
torch.set_num_threads(1)
model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 64))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x = torch.randn(32, 64)
stamps = [time.monotonic_ns()]
for _ in range(steps):
    loss = model(x).square().mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    stamps.append(time.monotonic_ns())
print(" ".join(map(str, stamps)))
"""


def _once(script: Path, steps: int, harness: bool, records: Path) -> tuple[float, float, dict[str, Any]]:
    """(start-up ms, median step ms, the harness's account of its own time: empty for a plain run)."""
    from perfgate.harness import HarnessConfig

    env = {k: v for k, v in os.environ.items() if not k.startswith("PERFGATE")}
    argv = [sys.executable, str(script), str(steps)]
    if harness:
        cfg = HarnessConfig(
            record_dir=str(records), warmup_steps=2, measure_steps=max(1, steps - 4), job=True
        )
        env.update(cfg.to_env())
        argv = [sys.executable, "-m", "perfgate.harness", "--", str(script), str(steps)]
    started = time.monotonic_ns()
    out = subprocess.run(argv, env=env, capture_output=True, text=True, check=True).stdout
    stamps = [int(t) for t in out.split()[-(steps + 1) :]]
    steps_ms = [(b - a) / 1e6 for a, b in itertools.pairwise(stamps)]
    own: dict[str, Any] = {}
    if harness:
        own = json.loads((records / "rank0.json").read_text())["harness_own"]
    return (stamps[0] - started) / 1e6, statistics.median(steps_ms), own


def measure(rounds: int, steps: int) -> dict[str, Any]:
    """Interleaved plain and harness runs; medians and the harness's ratio to plain."""
    got: dict[str, list[tuple[float, float, dict[str, Any]]]] = {"plain": [], "harness": []}
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "tiny_train.py"
        script.write_text(SCRIPT)
        for r in range(rounds):
            order = ("plain", "harness") if r % 2 == 0 else ("harness", "plain")
            for mode in order:
                got[mode].append(_once(script, steps, mode == "harness", Path(tmp) / f"records{r}"))
    out: dict[str, Any] = {"rounds": rounds, "steps": steps, "goal": GOAL}
    for mode, runs in got.items():
        out[mode] = {
            "startup_ms": statistics.median(s for s, _, _ in runs),
            "step_ms": statistics.median(t for _, t, _ in runs),
            "step_ms_range": [min(t for _, t, _ in runs), max(t for _, t, _ in runs)],
        }
    owns = [own for _, _, own in got["harness"]]
    out["harness_own"] = {
        "step_us": statistics.median(o["median_step_ns"] for o in owns) / 1e3,
        "step_us_range": [
            min(o["median_step_ns"] for o in owns) / 1e3,
            max(o["median_step_ns"] for o in owns) / 1e3,
        ],
        "startup_ms": statistics.median(o["startup_ns"] for o in owns) / 1e6,
    }
    startup = out["harness"]["startup_ms"] / out["plain"]["startup_ms"]
    step = out["harness"]["step_ms"] / out["plain"]["step_ms"]
    out["ratio"] = {"startup": startup, "step": step}
    out["within_goal"] = {"startup": startup <= 1 + GOAL, "step": step <= 1 + GOAL}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="2 rounds of 20 steps (a smoke run)")
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = parser.parse_args()
    report = measure(2, 20) if args.quick else measure(8, 300)
    for mode in ("plain", "harness"):
        r = report[mode]
        lo, hi = r["step_ms_range"]
        print(
            f"{mode:8s} start-up {r['startup_ms']:8.1f} ms   step {r['step_ms']:.3f} ms ({lo:.3f}..{hi:.3f})"
        )
    own = report["harness_own"]
    lo, hi = own["step_us_range"]
    print(
        f"harness's own account: {own['step_us']:.1f} us of each step (runs {lo:.1f}..{hi:.1f}), "
        f"{own['startup_ms']:.0f} ms of start-up (torch's import left out)"
    )
    ratio = report["ratio"]
    print(
        f"harness / plain: start-up {ratio['startup']:.3f}x, step {ratio['step']:.3f}x "
        f"(goal <= {1 + GOAL:.2f}x: start-up {'met' if report['within_goal']['startup'] else 'not met'}, "
        f"step {'met' if report['within_goal']['step'] else 'not met'})"
    )
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
