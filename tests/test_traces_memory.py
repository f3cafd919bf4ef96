"""Bounded memory: a trace far larger than the read block is analyzed without holding its JSON."""

from __future__ import annotations

import json
import tracemalloc
from pathlib import Path
from typing import Any

import pytest

from perfgate.traces import AnalysisOptions, analyze_trace

MUSA = Path(__file__).parent / "fixtures" / "traces" / "musa_s4000_rank1.json"


def replicate(path: Path, copies: int, pad: int) -> tuple[int, int]:
    """Write ``copies`` shifted copies of the MUSA fixture's step 3/4 work (padded names); returns
    (file bytes, complete events per copy)."""
    doc = json.loads(MUSA.read_text())
    events: list[dict[str, Any]] = [
        e
        for e in doc["traceEvents"]
        if e.get("ph") == "X" and not str(e.get("name", "")).startswith("Profiler")
    ]
    events = [e for e in events if e.get("cat") != "Trace" and e["ts"] < 1800]
    span = 1000.0
    with path.open("w") as out:
        out.write('{"schemaVersion": 1, "traceEvents": [\n')
        for k in range(copies):
            shift = k * span
            step = {"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{k}", "pid": 500, "tid": 100,
                    "ts": 1000 + shift, "dur": 800}  # fmt: skip
            rows = [step]
            for e in events:
                e2 = {**e, "ts": e["ts"] + shift}
                if "args" in e and "correlation" in e["args"]:
                    e2["args"] = {**e["args"], "correlation": e["args"]["correlation"] + 100 * k}
                if e.get("cat") == "cpu_op":
                    e2["name"] = e["name"] + "#" * pad  # bulk, as real stacks and shapes are
                rows.append(e2)
            out.write((",\n" if k else "") + ",\n".join(json.dumps(r) for r in rows))
        out.write("\n]}\n")
    return path.stat().st_size, len(events)


def test_a_large_trace_is_streamed_with_memory_far_below_its_size(tmp_path: Path) -> None:
    path = tmp_path / "large.json"
    copies = 1000
    size, per_copy = replicate(path, copies, pad=8000)
    assert size > 30e6
    tracemalloc.start()
    try:
        profile = analyze_trace(path, AnalysisOptions(chunk_bytes=1 << 20, include_last_step=True))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # Everything is counted...
    assert profile.event_counts["complete"] == copies * (per_copy + 1)
    assert profile.steps is not None and len(profile.steps.steps) == copies
    gemm = next(c for c in profile.categories if c.category == "gemm")
    assert gemm.count == copies
    assert profile.launch.launches == copies * 8
    # ...while Python allocations peak at a small fraction of the JSON size (json.load would need
    # several times the file size).
    assert peak < 0.25 * size, f"peak {peak / 1e6:.1f} MB for a {size / 1e6:.1f} MB trace"


@pytest.mark.parametrize("chunk_bytes", [4096, 1 << 20])
def test_results_do_not_depend_on_the_block_size(tmp_path: Path, chunk_bytes: int) -> None:
    path = tmp_path / "t.json"
    replicate(path, 50, pad=0)
    small = analyze_trace(path, AnalysisOptions(chunk_bytes=chunk_bytes))
    whole = analyze_trace(path, AnalysisOptions(chunk_bytes=64 << 20))
    assert small.model_dump(exclude={"event_counts"}) == whole.model_dump(exclude={"event_counts"})
