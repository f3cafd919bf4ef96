"""compare_tensors vs safetensors+torch.testing.assert_close on two large float32 checkpoints.

Generates two safetensors files of ``--size-gib`` each (default 1 GiB: 8 tensors of 8192 x 4096 float32)
under a temporary folder, the candidate within tolerance of the reference everywhere, then times each
contender in its own fresh subprocess (so peak RSS is that contender's alone), alternating them
``--repeats`` times with the files in the page cache:

- ``perfgate``: `perfgate.tensors.compare_sources` (streamed, memory-mapped, float64 arithmetic).
- ``perfgate_tool``: the whole compare_tensors tool call (the above, plus sha256 of both inputs,
  evidence record and artifact), as an agent gets it.
- ``torch``: ``safetensors.torch.load_file`` on both files, then ``torch.testing.assert_close`` per tensor.

Each worker reports wall time, its peak RSS (VmHWM, else ``ru_maxrss``) and its peak after imports (the
interpreter's baseline); the figures that matter are ratios: time vs torch (best of the repeats, as the
machine may be shared), and peak RSS above the worker's own baseline.

    python benchmarks/bench_tensors.py [--size-gib 1] [--repeats 2] [--dir /tmp] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ATOL = 1e-5
RTOL = 1.3e-6
ROWS, COLS = 8192, 4096


def _rss_kib() -> int:
    """Peak RSS of this process so far, KiB. Linux keeps ru_maxrss across exec (a child inherits its
    parent's peak), so the per-address-space VmHWM is read where /proc has it."""
    status = Path("/proc/self/status")
    if status.exists():
        for line in status.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def write_pair(folder: Path, size_gib: float, seed: int = 0) -> tuple[Path, Path]:
    """Two safetensors files written tensor by tensor (never a whole file in memory)."""
    tensor_bytes = ROWS * COLS * 4
    count = max(1, round(size_gib * 2**30 / tensor_bytes))
    rng = np.random.default_rng(seed)
    header: dict[str, Any] = {}
    for i in range(count):
        header[f"layers.{i}.weight"] = {
            "dtype": "F32",
            "shape": [ROWS, COLS],
            "data_offsets": [i * tensor_bytes, (i + 1) * tensor_bytes],
        }
    raw = json.dumps(header).encode()
    raw += b" " * (-(8 + len(raw)) % 8)
    ref_path, cand_path = folder / "reference.safetensors", folder / "candidate.safetensors"
    with ref_path.open("wb") as ref, cand_path.open("wb") as cand:
        for f in (ref, cand):
            f.write(len(raw).to_bytes(8, "little") + raw)
        for _ in range(count):
            for _start in range(0, ROWS, 1024):
                block = rng.standard_normal((1024, COLS), dtype=np.float32)
                ref.write(block.tobytes())
                # Within atol everywhere: |noise| <= 4e-6 < atol.
                noise = np.clip(rng.standard_normal((1024, COLS), dtype=np.float32), -4, 4) * np.float32(1e-6)
                cand.write((block + noise).tobytes())
    return ref_path, cand_path


def worker_perfgate(ref: Path, cand: Path) -> dict[str, Any]:
    from perfgate.tensors import CompareOptions, compare_sources, open_tensor_source

    baseline = _rss_kib()
    cpu = _cpu_seconds()
    start = time.perf_counter()
    with open_tensor_source(ref) as r, open_tensor_source(cand) as c:
        report = compare_sources(r, c, CompareOptions(atol=ATOL, rtol=RTOL))
    seconds = time.perf_counter() - start
    assert report.status == "match", report.summary
    return {
        "seconds": seconds,
        "cpu_seconds": _cpu_seconds() - cpu,
        "baseline_kib": baseline,
        "peak_kib": _rss_kib(),
        "bytes": report.bytes_read,
    }


def worker_perfgate_tool(ref: Path, cand: Path) -> dict[str, Any]:
    import anyio

    from perfgate.evidence import Ledger
    from perfgate.tools._runtime import ServerConfig, ToolRuntime
    from perfgate.tools.compare_tensors import CompareTensorsInput, run

    workspace = ref.parent
    rt = ToolRuntime(config=ServerConfig.create(workspace), ledger=Ledger(workspace), tool="compare_tensors")
    inp = CompareTensorsInput(reference=ref.name, candidate=cand.name, atol=ATOL, rtol=RTOL)
    baseline = _rss_kib()
    cpu = _cpu_seconds()
    start = time.perf_counter()
    out = anyio.run(run, inp, rt)
    seconds = time.perf_counter() - start
    assert out.status == "match", out.summary
    return {
        "seconds": seconds,
        "cpu_seconds": _cpu_seconds() - cpu,
        "baseline_kib": baseline,
        "peak_kib": _rss_kib(),
        "bytes": out.bytes_compared,
    }


def worker_torch(ref: Path, cand: Path) -> dict[str, Any]:
    import torch
    from safetensors.torch import load_file

    baseline = _rss_kib()
    cpu = _cpu_seconds()
    start = time.perf_counter()
    reference = load_file(str(ref))
    candidate = load_file(str(cand))
    for key, expected in reference.items():
        torch.testing.assert_close(candidate[key], expected, atol=ATOL, rtol=RTOL)
    seconds = time.perf_counter() - start
    nbytes = sum(t.numel() * t.element_size() for t in reference.values()) * 2
    return {
        "seconds": seconds,
        "cpu_seconds": _cpu_seconds() - cpu,
        "baseline_kib": baseline,
        "peak_kib": _rss_kib(),
        "bytes": nbytes,
    }


WORKERS = {"perfgate": worker_perfgate, "perfgate_tool": worker_perfgate_tool, "torch": worker_torch}


def run_worker(name: str, ref: Path, cand: Path) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, __file__, "--worker", name, str(ref), str(cand)],
        capture_output=True,
        text=True,
        check=False,
        timeout=1800,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"{name} worker failed:\n{proc.stderr}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--size-gib", type=float, default=1.0, help="size of each file (GiB)")
    parser.add_argument("--repeats", type=int, default=2, help="runs of each contender, alternating")
    parser.add_argument("--dir", type=Path, default=None, help="where to write the files (default: temp dir)")
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    parser.add_argument("--only", choices=sorted(WORKERS), action="append", help="run only these contenders")
    parser.add_argument("--worker", choices=sorted(WORKERS), help=argparse.SUPPRESS)
    parser.add_argument("paths", nargs="*", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(WORKERS[args.worker](*args.paths)))
        return

    folder = Path(tempfile.mkdtemp(prefix="perfgate-bench-tensors-", dir=args.dir))
    try:
        start = time.perf_counter()
        ref, cand = write_pair(folder, args.size_gib)
        print(
            f"wrote 2 x {ref.stat().st_size / 2**30:.2f} GiB in {time.perf_counter() - start:.1f} s to {folder}"
        )
        names = args.only or ["perfgate", "perfgate_tool", "torch"]
        runs: dict[str, list[dict[str, Any]]] = {n: [] for n in names}
        for _ in range(args.repeats):
            for name in names:
                runs[name].append(run_worker(name, ref, cand))
        results = summarize(runs)
        print_table(results)
        if args.json:
            args.json.write_text(
                json.dumps({"size_gib": args.size_gib, "cpus": os.cpu_count(), "results": results}, indent=2)
            )
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def summarize(runs: dict[str, list[dict[str, Any]]]) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for name, items in runs.items():
        seconds = statistics.median(r["seconds"] for r in items)
        peak = max(r["peak_kib"] for r in items) * 1024
        above = max((r["peak_kib"] - r["baseline_kib"]) for r in items) * 1024
        out[name] = {
            "seconds_median": seconds,
            "seconds_min": min(r["seconds"] for r in items),
            "cpu_seconds_min": min(r["cpu_seconds"] for r in items),
            "throughput_gb_s": items[0]["bytes"] / min(r["seconds"] for r in items) / 1e9,
            "peak_rss_bytes": peak,
            "peak_rss_above_baseline_bytes": above,
        }
    if "torch" in out:
        for row in out.values():
            row["time_vs_torch"] = row["seconds_min"] / out["torch"]["seconds_min"]
            row["rss_above_baseline_vs_torch"] = (
                row["peak_rss_above_baseline_bytes"] / out["torch"]["peak_rss_above_baseline_bytes"]
            )
    return out


def print_table(results: dict[str, dict[str, float]]) -> None:
    print(f"{'contender':15s} {'median s':>9s} {'min s':>7s} {'CPU s':>7s} {'GB/s':>7s} {'peak RSS MiB':>13s} {'above base MiB':>15s} "
          f"{'time/torch':>11s} {'RSS/torch':>10s}")  # fmt: skip
    for name, row in results.items():
        print(
            f"{name:15s} {row['seconds_median']:9.2f} {row['seconds_min']:7.2f} {row['cpu_seconds_min']:7.2f} {row['throughput_gb_s']:7.2f} "
            f"{row['peak_rss_bytes'] / 2**20:13.0f} {row['peak_rss_above_baseline_bytes'] / 2**20:15.0f} "
            f"{row.get('time_vs_torch', float('nan')):11.2f} {row.get('rss_above_baseline_vs_torch', float('nan')):10.3f}"
        )


if __name__ == "__main__":
    main()
