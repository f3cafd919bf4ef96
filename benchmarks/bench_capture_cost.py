"""What naming the code costs a profiled step: torch.profiler with and without stacks and module ranges.

Tiny CPU training jobs (one thread), each setting in its own process (one profiler session per
process), in rounds whose order rotates::

    python benchmarks/bench_capture_cost.py --rounds 5

Settings: ``none`` (no profiler), ``base`` (CPU activity only, what profile_segment records without
stacks), ``stack`` (+ with_stack: the Python tracer), ``modules`` (+ the harness's module ranges,
`perfgate.harness.module_ranges`), ``both`` (profile_segment's default). Jobs: ``mlp`` (a 3-layer MLP,
batch 64: op-bound) and ``loop`` (the same MLP behind a layer that loops over the batch in Python:
Python-bound). Each cell is the median over rounds of the median step's CPU time of the training
thread (thread_time: other processes on a shared machine inflate wall time, not this), with the
ratio to ``base``, and the fastest step of all runs (the least disturbed by other processes) with its
ratio. The trace size of one profiled step is printed for each setting too.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SETTINGS = ("none", "base", "stack", "modules", "both")
JOBS = ("mlp", "loop")
STEPS = 40


def _child(job: str, setting: str) -> None:
    import warnings

    import torch
    from torch.profiler import ProfilerActivity, profile, schedule

    from perfgate.harness.module_ranges import ModuleRanges

    torch.set_num_threads(1)
    torch.manual_seed(0)

    class PerSample(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.scale = torch.nn.Parameter(torch.ones(32))

        def forward(self, xb: torch.Tensor) -> torch.Tensor:
            return torch.stack([(xb[i] * self.scale + 1.0).tanh() for i in range(xb.shape[0])])

    layers: list[torch.nn.Module] = [PerSample()] if job == "loop" else []
    layers += [torch.nn.Linear(32, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers, torch.nn.Linear(256, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(64, 32), torch.randn(64, 4)

    def step() -> None:
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()

    for _ in range(5):
        step()
    times: list[float] = []
    trace = Path(tempfile.mkdtemp()) / "trace.json"

    def run(prof: object | None) -> None:
        for _ in range(STEPS):
            t = time.thread_time()
            step()
            if prof is not None:
                prof.step()  # type: ignore[attr-defined]
            times.append(time.thread_time() - t)

    if setting == "none":
        run(None)
        size = 0
    else:
        warnings.simplefilter("ignore")
        ranges = ModuleRanges() if setting in ("modules", "both") else None
        with profile(
            activities=[ProfilerActivity.CPU],
            schedule=schedule(wait=0, warmup=1, active=1, repeat=1),
            on_trace_ready=lambda p: p.export_chrome_trace(str(trace)),
            with_stack=setting in ("stack", "both"),
        ) as prof:
            if ranges is not None:
                ranges.install()
            run(prof)
            if ranges is not None:
                ranges.remove()
        size = trace.stat().st_size if trace.exists() else 0
    print(
        json.dumps(
            {"us": statistics.median(times[2:]) * 1e6, "min_us": min(times[2:]) * 1e6, "trace_bytes": size}
        )
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    ns = ap.parse_args()
    if ns.child:
        _child(*ns.child)
        return
    cells: dict[tuple[str, str], list[float]] = {}
    fastest: dict[tuple[str, str], list[float]] = {}
    sizes: dict[tuple[str, str], int] = {}
    order = [(j, s) for j in JOBS for s in SETTINGS]
    for r in range(ns.rounds):
        for job, setting in order[r % len(order) :] + order[: r % len(order)]:
            out = subprocess.run(
                [sys.executable, __file__, "--child", job, setting],
                capture_output=True,
                text=True,
                check=True,
            )
            row = json.loads(out.stdout.strip().splitlines()[-1])
            cells.setdefault((job, setting), []).append(row["us"])
            fastest.setdefault((job, setting), []).append(row["min_us"])
            sizes[(job, setting)] = row["trace_bytes"]
    print(
        f"step CPU time over {ns.rounds} rounds (us): median of the runs' median steps (range) and ratio to "
        "base; the fastest step of all runs and its ratio; trace bytes per profiled step"
    )
    for job in JOBS:
        base = statistics.median(cells[(job, "base")])
        base_min = min(fastest[(job, "base")])
        for setting in SETTINGS:
            values = cells[(job, setting)]
            med, low = statistics.median(values), min(fastest[(job, setting)])
            print(
                f"{job:5s} {setting:8s} {med:9.0f}  ({min(values):.0f}-{max(values):.0f})  x{med / base:.2f}   "
                f"fastest {low:7.0f} x{low / base_min:.2f}  {sizes[(job, setting)]:>9d} B"
            )


if __name__ == "__main__":
    main()
