"""Benchmark perfgate's trace analysis against HTA 0.5, and its memory on a synthetic 1 GB trace.

Run with an interpreter that has perfgate and, for the side-by-side numbers, HTA installed::

    python3 -m venv /work/venv-hta
    /work/venv-hta/bin/pip install holistictraceanalysis==0.5.0 msgspec numpy -e .
    /work/venv-hta/bin/python benchmarks/bench_traces.py                 # both parts
    /work/venv-hta/bin/python benchmarks/bench_traces.py --skip-synthetic  # only the shared traces

Part 1 times, per shared trace (../shared/data/traces/hta or $PERFGATE_SHARED_DIR), HTA's parse +
temporal breakdown + kernel breakdown against perfgate's full analysis of the same file (best of N
runs each, in this process), and checks that the temporal breakdowns agree. Without HTA it prints
perfgate's times alone. Part 2 builds a ~1 GB trace in /tmp from a real one (events replicated
with shifted timestamps, correlation ids and step numbers), analyzes it in a fresh child process and
reports that process's peak RSS. ``--hta-reference FILE`` writes HTA's temporal numbers per trace (the
fixture tests/fixtures/traces/hta_0.5_temporal.json) and exits.
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import math
import os
import re
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from perfgate.traces import AnalysisOptions, analyze_trace, classify_device, isal_available  # noqa: E402

HTA_FIELDS = ("idle_time(us)", "compute_time(us)", "non_compute_time(us)", "kernel_time(us)")


def shared_traces() -> list[Path]:
    base = Path(os.environ.get("PERFGATE_SHARED_DIR", REPO.parent / "shared")) / "data" / "traces" / "hta"
    return sorted(base.glob("*.json.gz")) + sorted(base.glob("*.json")) if base.is_dir() else []


# --------------------------------------------------------------------------- HTA side


def hta_available() -> bool:
    try:
        import hta  # noqa: F401  # pyright: ignore[reportMissingImports, reportUnusedImport]
    except ImportError:
        return False
    return True


def run_hta(path: Path) -> dict[str, float]:
    """HTA 0.5: load one trace, temporal breakdown, kernel breakdown. Raises what HTA raises."""
    from hta.trace_analysis import TraceAnalysis  # pyright: ignore[reportMissingImports]

    analysis = TraceAnalysis(trace_files={0: str(path)}, trace_dir="/")
    temporal = analysis.get_temporal_breakdown(visualize=False)
    analysis.get_gpu_kernel_breakdown(visualize=False)
    row = temporal.iloc[0]
    return {k: float(row[k]) for k in HTA_FIELDS}


def quiet_hta() -> None:
    logging.disable(logging.WARNING)
    warnings.filterwarnings("ignore")


def write_hta_reference(out: Path) -> None:
    """Record HTA's temporal breakdown for every shared trace (numbers or the error it raised)."""
    quiet_hta()
    import hta  # pyright: ignore[reportMissingImports]

    doc: dict[str, Any] = {
        "source": f"holistictraceanalysis {getattr(hta, '__version__', '0.5.0')}: "
        "TraceAnalysis(trace_files={0: path}).get_temporal_breakdown(visualize=False), default settings",
        "units": "microseconds",
        "traces": {},
    }
    for path in shared_traces():
        try:
            doc["traces"][path.name] = run_hta(path)
        except Exception as exc:  # noqa: BLE001 - top level of a script: record why HTA could not read it
            doc["traces"][path.name] = {"error": f"{type(exc).__name__}: {str(exc)[:160]}"}
        print(path.name, doc["traces"][path.name], flush=True)
    out.write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")


# --------------------------------------------------------------------------- timing


def best_of(n: int, fn: Callable[[], Any]) -> tuple[float, Any]:
    best, value = math.inf, None
    for _ in range(n):
        gc.collect()
        t0 = time.perf_counter()
        value = fn()
        best = min(best, time.perf_counter() - t0)
    return best, value


def agreement(ours: Any, hta: dict[str, float]) -> float:
    """Largest difference of idle/compute/non-compute/span, as a fraction of HTA's span."""
    mine = (ours.idle_us, ours.compute_us, ours.non_compute_us, ours.span_us)
    span = max(hta["kernel_time(us)"], 1e-9)
    return max(abs(a - hta[k]) for a, k in zip(mine, HTA_FIELDS, strict=True)) / span


def bench_shared(repeats: int, hta_repeats: int) -> None:
    traces = shared_traces()
    if not traces:
        print("shared traces not found (set PERFGATE_SHARED_DIR): part 1 skipped")
        return
    with_hta = hta_available()
    if with_hta:
        quiet_hta()
    else:
        print("HTA is not importable here: perfgate times only (install holistictraceanalysis==0.5.0)")
    print(f"python-isal: {'yes' if isal_available() else 'no (stdlib gzip)'}")
    header = f"{'trace':44} {'MB':>6} {'HTA s':>8} {'perfgate s':>10} {'speed-up':>9} {'agree (rounded)':>15}"
    print(header)
    print("-" * len(header))
    total_hta = total_ours = 0.0
    exact = AnalysisOptions()
    rounded = AnalysisOptions(time_basis="hta_rounded")
    for path in traces:
        analyze_trace(path, exact)  # warm imports

        def ours(p: Path = path) -> Any:
            # Kernel-name classifications are cached across calls; start cold each run for fairness.
            classify_device.cache_clear()
            return analyze_trace(p, exact)

        ours_s, _ = best_of(repeats, ours)
        size_mb = path.stat().st_size / 1e6
        hta_cell, ratio_cell, agree_cell = "-", "-", "-"
        if with_hta:
            try:
                hta_s, hta_numbers = best_of(hta_repeats, lambda p=path: run_hta(p))
            except Exception as exc:  # noqa: BLE001 - HTA's own failure is a result to report
                hta_cell = f"fails: {type(exc).__name__}"[:8]
            else:
                hta_cell, ratio_cell = f"{hta_s:8.3f}", f"{hta_s / ours_s:8.1f}x"
                agree_cell = f"{agreement(analyze_trace(path, rounded), hta_numbers):.2%} of span"
                total_hta += hta_s
                total_ours += ours_s
        print(
            f"{path.name[:44]:44} {size_mb:6.2f} {hta_cell:>8} {ours_s:10.3f} {ratio_cell:>9} {agree_cell:>15}"
        )
    if total_ours:
        print(
            f"{'all traces HTA reads':44} {'':6} {total_hta:8.3f} {total_ours:10.3f} {total_hta / total_ours:8.1f}x"
        )


# --------------------------------------------------------------------------- synthetic 1 GB


_STEP = re.compile(r"ProfilerStep#(\d+)")


def make_synthetic(source: Path, target: Path, target_bytes: int) -> tuple[int, int]:
    """Replicate ``source``'s events (shifted in time, ids and step numbers) until ``target_bytes``.

    Returns (events written, bytes written). Written in a streaming way, one replica at a time.
    """
    import gzip

    import msgspec

    with gzip.open(source, "rb") if source.name.endswith(".gz") else source.open("rb") as fh:
        doc = msgspec.json.decode(fh.read())
    events: list[dict[str, Any]] = doc["traceEvents"]
    header = {k: v for k, v in doc.items() if k != "traceEvents"}
    del doc
    timed = [e for e in events if isinstance(e.get("ts"), int | float)]
    t0 = min(e["ts"] for e in timed)
    span = max(e["ts"] + (e.get("dur") or 0) for e in timed) - t0 + 1000.0
    steps = [int(m.group(1)) for e in events if (m := _STEP.search(str(e.get("name", ""))))]
    step_stride = (max(steps) + 1) if steps else 0
    ids = [
        e["args"]["correlation"]
        for e in events
        if isinstance(e.get("args"), dict) and "correlation" in e["args"]
    ]
    id_stride = (max(ids) + 1) if ids else 0
    encode = msgspec.json.Encoder().encode
    written = count = 0
    with target.open("wb") as out:
        head = encode(header)[:-1] + b', "traceEvents": [\n'
        out.write(head)
        written += len(head)
        k = 0
        while written < target_bytes:
            shift = k * span
            chunk: list[bytes] = []
            for e in events:
                e2 = dict(e)
                if isinstance(e2.get("ts"), int | float):
                    e2["ts"] = e2["ts"] + shift
                if e2.get("ph") in ("s", "f") and isinstance(e2.get("id"), int):
                    e2["id"] = e2["id"] + k * id_stride
                args = e2.get("args")
                if isinstance(args, dict) and "correlation" in args:
                    e2["args"] = {**args, "correlation": args["correlation"] + k * id_stride}
                name = e2.get("name")
                if step_stride and isinstance(name, str) and name.startswith("ProfilerStep#"):
                    e2["name"] = f"ProfilerStep#{int(name[13:]) + k * step_stride}"
                chunk.append(encode(e2))
            blob = (b",\n" if k else b"") + b",\n".join(chunk)
            out.write(blob)
            written += len(blob)
            count += len(chunk)
            k += 1
        tail = b'\n], "traceName": "synthetic"}\n'
        out.write(tail)
        written += len(tail)
    return count, written


_CHILD = """
import re, resource, sys, time
from pathlib import Path
sys.path.insert(0, {src!r})
from perfgate.traces import analyze_trace
t0 = time.perf_counter()
p = analyze_trace(Path({path!r}))
dt = time.perf_counter() - t0
# VmHWM is this process's own peak (ru_maxrss can carry the parent's RSS over fork + exec).
try:
    status = Path("/proc/self/status").read_text()
    rss = int(re.search(r"VmHWM:\\s*(\\d+) kB", status).group(1)) * 1024
except (OSError, AttributeError):
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print(dt, rss, p.event_counts["events"], p.span_us, p.compute_us, len(p.steps.steps) if p.steps else 0)
"""


def bench_synthetic(target_gb: float, keep: bool) -> None:
    traces = {p.name: p for p in shared_traces()}
    source = traces.get("df_index_resolver_df_index_resolver.json.gz") or next(iter(traces.values()), None)
    if source is None:
        print("no shared trace to replicate: part 2 skipped")
        return
    fd, name = tempfile.mkstemp(prefix="perfgate_synthetic_", suffix=".json", dir="/tmp")
    os.close(fd)
    path = Path(name)
    try:
        t0 = time.perf_counter()
        # Built in a child process, so this process stays small while the analysis child runs.
        made = subprocess.run(
            [sys.executable, __file__, "--make-synthetic", str(source), str(path), str(int(target_gb * 1e9))],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()
        events, size = int(made[0]), int(made[1])
        print(f"\nsynthetic trace: {size / 1e9:.2f} GB, {events:,} events from {source.name} "
              f"(built in {time.perf_counter() - t0:.0f} s) at {path}")  # fmt: skip
        out = subprocess.run(
            [sys.executable, "-c", _CHILD.format(src=str(REPO / "src"), path=str(path))],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()
        seconds, rss = float(out[0]), int(out[1])
        print(f"{'analysis wall time':24} {seconds:8.1f} s  ({size / 1e6 / seconds:.0f} MB/s of JSON)")
        print(
            f"{'peak RSS (child)':24} {rss / 2**20:8.0f} MiB  (goal < 1024 MiB; {rss / size:.2f} x file size)"
        )
        print(f"{'events / steps':24} {int(out[2]):,} / {out[5]}")
    finally:
        if not keep:
            path.unlink(missing_ok=True)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeats", type=int, default=3, help="perfgate runs per trace (best is kept)")
    parser.add_argument("--hta-repeats", type=int, default=2, help="HTA runs per trace (best is kept)")
    parser.add_argument("--skip-shared", action="store_true")
    parser.add_argument("--skip-synthetic", action="store_true")
    parser.add_argument("--synthetic-gb", type=float, default=1.0)
    parser.add_argument("--keep-synthetic", action="store_true", help="leave the synthetic file in /tmp")
    parser.add_argument("--hta-reference", type=Path, help="write HTA's temporal numbers per trace and exit")
    parser.add_argument(
        "--make-synthetic", nargs=3, metavar=("SOURCE", "TARGET", "BYTES"), help=argparse.SUPPRESS
    )
    args = parser.parse_args()
    if args.make_synthetic is not None:
        source, target, size = args.make_synthetic
        print(*make_synthetic(Path(source), Path(target), int(size)))
        return
    if args.hta_reference is not None:
        write_hta_reference(args.hta_reference)
        return
    if not args.skip_shared:
        bench_shared(args.repeats, args.hta_repeats)
    if not args.skip_synthetic:
        bench_synthetic(args.synthetic_gb, args.keep_synthetic)


if __name__ == "__main__":
    main()
