"""A training-shaped loop with known step times and no torch, timed with the explicit harness API.

python examples/paced_loop.py --steps 30 --step-ms 10 [--record-dir DIR]
python -m perfgate.harness --timing explicit -- examples/paced_loop.py --step-ms 10
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _pace import Pacer

from perfgate.harness import Window


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--step-ms", type=float, default=10.0)
    p.add_argument("--samples", type=int, default=8, help="samples per step")
    p.add_argument("--tokens", type=int, default=0, help="tokens per step (0: not reported)")
    p.add_argument("--record-dir", default=None, help="default: the harness settings")
    p.add_argument(
        "--print-steps", action="store_true", help="print each step's time by the loop's own clock (ms)"
    )
    args = p.parse_args()
    window = Window(record_dir=args.record_dir)
    pacer = Pacer(args.step_ms)
    last = time.perf_counter()
    for step in range(args.steps):
        with window.step(samples=args.samples, tokens=args.tokens or None):
            pacer.wait()
        if args.print_steps:
            now = time.perf_counter()
            print(f"step {step} step_time_ms {(now - last) * 1000:.3f}", flush=True)
            last = now
    window.close()
    print(f"done {args.steps} steps")


if __name__ == "__main__":
    main()
