"""Harness overhead per step, and its accuracy next to torch.utils.benchmark on the same workloads.

1. Overhead: a bare loop against the same loop with a harness step boundary in it (explicit
   ``with window.step()`` and ``mark_step()``), plus the cost of each probe the zero-code-change
   launcher installs (optimizer post-hook, DataLoader ``__next__`` wrapper, ``backward`` wrapper),
   timed directly and as an A/B on real torch calls. Goal: under 5 microseconds per step on CPU.
2. Accuracy: workloads of known duration (held by sleep + spin) timed by the harness window and by
   torch.utils.benchmark.Timer; the error of each median against the known time. Then a real tiny MLP
   training step, where there is no ground truth: the two medians side by side.

Run: python benchmarks/bench_harness.py [--quick] [--json results.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from perfgate.harness import HarnessConfig, Window, hooks

_now = time.perf_counter_ns


def _window(steps: int) -> Window:
    return Window(config=HarnessConfig(warmup_steps=0, measure_steps=steps), instrument=False)


def _per_call_ns(fn: Callable[[int], None], n: int, repeats: int) -> float:
    """Median over ``repeats`` of (time of fn(n)) / n, in ns."""
    samples: list[float] = []
    for _ in range(repeats):
        t = _now()
        fn(n)
        samples.append((_now() - t) / n)
    return statistics.median(samples)


def overhead(n: int, repeats: int) -> dict[str, float]:
    """Nanoseconds per step added by each harness mechanism."""

    def bare(k: int) -> None:
        for _ in range(k):
            pass

    def with_block(k: int) -> None:
        w = _window(k + 1)
        step = w.step
        for _ in range(k):
            with step():
                pass

    def with_mark(k: int) -> None:
        w = _window(k + 1)
        mark = w.mark_step
        for _ in range(k):
            mark()

    base = _per_call_ns(bare, n, repeats)
    out = {
        "bare_loop_ns": base,
        "explicit_with_step_ns": _per_call_ns(with_block, n, repeats) - base,
        "explicit_mark_step_ns": _per_call_ns(with_mark, n, repeats) - base,
    }
    out.update(_torch_probes(max(n // 20, 2000), repeats))
    return out


def _ab_ns(
    run: Callable[[int], None], install: Callable[[], None], remove: Callable[[], None], n: int, repeats: int
) -> float:
    """Median over interleaved pairs of (with probe - without probe) per call, in ns."""
    deltas: list[float] = []
    for _ in range(repeats):
        remove()
        t = _now()
        run(n)
        without = (_now() - t) / n
        install()
        t = _now()
        run(n)
        deltas.append((_now() - t) / n - without)
    remove()
    return statistics.median(deltas)


def _torch_probes(n: int, repeats: int) -> dict[str, float]:
    import torch
    from torch.optim.optimizer import register_optimizer_step_post_hook
    from torch.utils.data import DataLoader, TensorDataset
    from torch.utils.data.dataloader import _BaseDataLoaderIter  # pyright: ignore[reportPrivateUsage]

    torch.set_num_threads(1)
    original_next = _BaseDataLoaderIter.__next__
    original_backward = torch.autograd.backward
    w = Window(
        config=HarnessConfig(warmup_steps=0, measure_steps=100 * n * repeats),
        instrument=False,
        _optimizer_mode=True,
    )
    hooks.activate(w, data_wait=True, backward=True)  # installs the DataLoader and backward wrappers
    patched_next = _BaseDataLoaderIter.__next__
    patched_backward = torch.autograd.backward

    param = torch.nn.Parameter(torch.ones(4))
    opt = torch.optim.SGD([param], lr=0.0)
    param.grad = torch.zeros(4)

    def hook_only(k: int) -> None:
        for _ in range(k):
            hooks._on_optimizer_step(opt, (), {})  # pyright: ignore[reportPrivateUsage] -- what torch calls

    def bare(k: int) -> None:
        for _ in range(k):
            pass

    def steps(k: int) -> None:
        for _ in range(k):
            opt.step()

    handle: list[Any] = []

    def add_hook() -> None:
        handle.append(register_optimizer_step_post_hook(hooks._on_optimizer_step))  # pyright: ignore[reportPrivateUsage]

    def remove_hook() -> None:
        while handle:
            handle.pop().remove()

    data = TensorDataset(torch.zeros(n, 2))

    def load(k: int) -> None:
        for _ in DataLoader(data, batch_size=1):
            pass

    def set_next(fn: Any) -> Callable[[], None]:
        return lambda: setattr(_BaseDataLoaderIter, "__next__", fn)

    x = torch.ones(2, requires_grad=True)

    def backward(k: int) -> None:
        for _ in range(k):
            (x * 1.0).sum().backward()

    def set_backward(fn: Any) -> Callable[[], None]:
        return lambda: setattr(torch.autograd, "backward", fn)

    out = {
        "optimizer_hook_direct_ns": _per_call_ns(hook_only, n, repeats) - _per_call_ns(bare, n, repeats),
        "optimizer_step_bare_ns": _per_call_ns(steps, n, repeats),
        "optimizer_step_ab_delta_ns": _ab_ns(steps, add_hook, remove_hook, n, repeats),
        "dataloader_next_ab_delta_ns": _ab_ns(
            load, set_next(patched_next), set_next(original_next), n, repeats
        ),
        "backward_ab_delta_ns": _ab_ns(
            backward, set_backward(patched_backward), set_backward(original_backward), n, repeats
        ),
    }
    hooks.deactivate(w)
    return out


def _hold(seconds: float) -> None:
    """Busy for ``seconds``: sleep most of it, spin the last 1.5 ms (a few microseconds of error)."""
    deadline = time.perf_counter() + seconds
    if seconds > 0.002:
        time.sleep(seconds - 0.0015)
    while time.perf_counter() < deadline:
        pass


def _harness_median_ms(fn: Callable[[], None], warmup: int, steps: int) -> float:
    w = Window(config=HarnessConfig(warmup_steps=warmup, measure_steps=steps), instrument=False)
    for _ in range(warmup + steps):
        with w.step():
            fn()
    ns = w.to_record()["steps"]["step_time_ns"][warmup:]
    return statistics.median(ns) / 1e6


def _torch_benchmark_median_ms(fn: Callable[[], None], steps: int) -> float:
    from torch.utils import benchmark

    timer = benchmark.Timer(stmt="fn()", globals={"fn": fn})
    # One call per measurement, as many measurements as the harness takes steps.
    return timer.timeit(1).median * 1e3 if steps == 1 else _tub_repeated(timer, steps)


def _tub_repeated(timer: Any, steps: int) -> float:
    times = [timer.timeit(1).median for _ in range(steps)]
    return statistics.median(times) * 1e3


def accuracy(durations_ms: list[float], steps: int) -> list[dict[str, float]]:
    rows: list[dict[str, float]] = []
    for d in durations_ms:
        fn = lambda d=d: _hold(d / 1e3)  # noqa: E731
        h = _harness_median_ms(fn, warmup=3, steps=steps)
        t = _torch_benchmark_median_ms(fn, steps)
        rows.append(
            {
                "known_ms": d,
                "harness_median_ms": h,
                "harness_error_pct": (h - d) / d * 100,
                "torch_benchmark_median_ms": t,
                "torch_benchmark_error_pct": (t - d) / d * 100,
            }
        )
    return rows


def real_training(steps: int) -> dict[str, float]:
    """A tiny MLP training step (no ground truth): both medians, and how far apart they are."""
    import torch
    from torch import nn

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(64, 256), torch.randint(0, 10, (64,))
    loss_fn = nn.CrossEntropyLoss()

    def step() -> None:
        loss_fn(model(x), y).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    h = _harness_median_ms(step, warmup=10, steps=steps)
    t = _torch_benchmark_median_ms(step, steps)
    return {"harness_median_ms": h, "torch_benchmark_median_ms": t, "difference_pct": (h - t) / t * 100}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="fewer iterations (CI smoke run)")
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = parser.parse_args()
    n, repeats, steps = (20_000, 5, 15) if args.quick else (200_000, 9, 40)

    over = overhead(n, repeats)
    print(f"Harness overhead per step (CPU, {os.cpu_count()} cores; goal < 5000 ns)")
    for key, value in over.items():
        print(f"  {key:32s} {value:10.0f} ns")
    acc = accuracy([5.0, 10.0, 20.0], steps)
    print(f"\nAccuracy on known step times ({steps} steps each; median)")
    print(f"  {'known ms':>9s} {'harness ms':>11s} {'err %':>7s} {'t.u.benchmark ms':>17s} {'err %':>7s}")
    for r in acc:
        print(
            f"  {r['known_ms']:9.3f} {r['harness_median_ms']:11.4f} {r['harness_error_pct']:7.3f} "
            f"{r['torch_benchmark_median_ms']:17.4f} {r['torch_benchmark_error_pct']:7.3f}"
        )
    real = real_training(steps * 5)
    print("\nReal tiny MLP training step (no ground truth)")
    print(
        f"  harness median {real['harness_median_ms']:.4f} ms, torch.utils.benchmark median "
        f"{real['torch_benchmark_median_ms']:.4f} ms, difference {real['difference_pct']:+.2f}%"
    )
    worst = max(
        over["explicit_with_step_ns"], over["explicit_mark_step_ns"], over["optimizer_hook_direct_ns"]
    )
    ok = worst < 5000 and all(abs(r["harness_error_pct"]) < 2 for r in acc)
    print(f"\n{'PASS' if ok else 'FAIL'}: worst per-step overhead {worst:.0f} ns; harness accuracy within 2%")
    if args.json:
        args.json.write_text(json.dumps({"overhead_ns": over, "accuracy": acc, "real": real}, indent=2))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
