"""The harness-overhead benchmark reports start-up and per-step time, plain and under the harness, and their
ratios (its structure only: never its timings)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_plain_overhead.py"


def test_the_benchmark_reports_start_up_and_per_step_overhead(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    out = tmp_path / "r.json"
    done = subprocess.run(
        [sys.executable, str(BENCH), "--quick", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(out.read_text())
    for mode in ("plain", "harness"):
        assert set(report[mode]) == {"startup_ms", "step_ms", "step_ms_range"}
        assert report[mode]["startup_ms"] > 0 and report[mode]["step_ms"] > 0
    own = report["harness_own"]
    assert 0 < own["step_us"] < report["harness"]["step_ms"] * 1e3
    assert own["startup_ms"] > 0
    assert set(report["ratio"]) == set(report["within_goal"]) == {"startup", "step"}
    assert "harness / plain: start-up" in done.stdout
