"""The CPU matmul probe, run as ``python -I -m perfgate.hardware.gemm_probe --threads N --budget-s S``.

A separate process of the server's interpreter (see `perfgate.hardware.cpu_peak`): it imports torch, which
the server itself never does, and sets the thread count the run used without touching the server. For
each dtype it grows a square ``torch.mm`` until one product takes long enough to reach steady throughput
(or the largest size is reached), then times repetitions within that dtype's share of the budget and keeps
the fastest. Prints one JSON object on stdout; a dtype that fails (unsupported, too slow) carries an error.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

__all__ = ["main"]

_DTYPES = (("fp32", "float32"), ("bf16", "bfloat16"))
_SMALLEST = 256
_LARGEST = 4096
_TARGET_S = 0.025
"""One product at least this long: large enough that per-call overhead is a small share of it."""
_MIN_REPS = 3
_MAX_REPS = 10


def _measure(torch: Any, dtype: Any, budget_s: float) -> dict[str, Any]:
    clock = time.perf_counter
    deadline = clock() + budget_s
    n = _SMALLEST
    while True:
        a = torch.randn(n, n).to(dtype)
        b = torch.randn(n, n).to(dtype)
        c = torch.empty(n, n, dtype=dtype)
        start = clock()
        torch.mm(a, b, out=c)  # the first product at this size also warms its code path
        took = clock() - start
        if took >= _TARGET_S or n >= _LARGEST or clock() + 8 * took > deadline:
            break
        n *= 2
    times: list[float] = []
    while len(times) < _MAX_REPS and (len(times) < _MIN_REPS or clock() + min(times) < deadline):
        start = clock()
        torch.mm(a, b, out=c)
        times.append(clock() - start)
    best = min(times)
    return {"tflops": 2.0 * n**3 / best / 1e12, "n": n, "reps": len(times), "best_s": best}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m perfgate.hardware.gemm_probe")
    p.add_argument("--threads", type=int, required=True)
    p.add_argument("--budget-s", type=float, default=2.0)
    args = p.parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)
    out: dict[str, Any] = {
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "results": {},
    }
    share = args.budget_s / len(_DTYPES)
    with torch.inference_mode():
        for name, attr in _DTYPES:
            try:
                out["results"][name] = _measure(torch, getattr(torch, attr), share)
            except Exception as exc:  # noqa: BLE001 -- a dtype this build cannot multiply is reported, not fatal
                out["results"][name] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
    json.dump(out, sys.stdout)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
