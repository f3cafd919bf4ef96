"""The trace benchmark measures the whole tool call over MCP (warm server and cold process) per trace.

Runs one round on a small planted trace without HTA (HTA needs its own environment: the benchmark
finds it through --hta-python / $PERFGATE_HTA_PYTHON / ../venv-hta and skips it when absent).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]
PLANTED = REPO / "tests" / "fixtures" / "traces" / "planted"


def _load(name: str) -> Any:
    """A benchmark script of benchmarks/ as a module (registered first: its dataclasses look it up)."""
    spec = importlib.util.spec_from_file_location(name, REPO / "benchmarks" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def bench() -> Any:
    return _load("bench_traces")


@pytest.mark.slow
@pytest.mark.anyio
async def test_one_round_times_the_tool_warm_and_cold_and_the_library(
    bench: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = await bench.measure_traces([PLANTED / "tiny_ops_rank0.json.gz"], 1, None, log=lambda _: None)
    (row,) = rows
    for who in ("warm", "first", "cold", "lib"):
        assert len(row.wall[who].values) == 1 and row.wall[who].values[0] > 0
    # The warm server's CPU is read from /proc; the cold process is the server spawned for the call.
    assert row.cpu["cold"].values[0] > 0
    assert not row.wall["hta"].values  # no HTA here
    bench.print_traces(rows)
    out = capsys.readouterr().out
    assert "tiny_ops_rank0" in out and "tool warm" in out and "tool first" in out


def test_the_goals_table_is_the_geometric_mean_and_the_smallest_ratio(
    bench: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(bench, "LARGE_BYTES", 0)  # the planted traces count as large here
    rows = []
    for path, hta, warm, first in (
        (PLANTED / "tiny_ops_rank0.json.gz", [4.0, 4.2, 3.8], [0.1, 0.1, 0.2], [0.25, 0.2, 0.3]),
        (PLANTED / "slow_rank_rank0.json.gz", [9.0, 8.0, 10.0], [0.2, 0.3, 0.25], [0.6, 0.5, 0.45]),
    ):
        row = bench.TraceRow(path)
        for who, values in (("hta", hta), ("warm", warm), ("first", first)):
            row.wall[who].values.extend(values)
        rows.append(row)
    got = bench.goals(rows)
    assert got["traces"] == 2
    assert "cpu_model" in got  # the ratios move with the machine: the report names it
    # Ratios of medians: 40x and 36x warm (geo-mean 37.9x), 16x and 18x first (geo-mean 16.97x).
    assert got["warm"]["geomean"] == pytest.approx((40 * 36) ** 0.5)
    assert got["warm"]["min"] == pytest.approx(36) and got["warm"]["met"]
    assert got["first"]["geomean"] == pytest.approx((16 * 18) ** 0.5) and not got["first"]["met"]
    assert got["cold"]["met"] is False  # nothing measured is never met
    report = {
        "bench_traces": got,
        "bench_tool_calls": {
            "warm_ratio": 1.25,
            "warm_compute_mfu_ms": {"median": 2.5},
            "warm_minimal_ms": {"median": 2.0},
        },
        "bench_startup": {
            "cold_start_ratio": 1.04,
            "perfgate_cold_start_s": 0.52,
            "minimal_cold_start_s": 0.5,
        },
        "bench_tensors": {
            "size_gib": 0.5,
            "kind": "float32 file",
            "results": {"mcp_warm": {"seconds_median": 1.0}, "torch": {"seconds_median": 3.3}},
        },
    }
    table = _load("run").goal_rows(report)
    results = [row[3] for row in table]
    assert results[0].startswith("17.0x geo-mean, smallest 16.0x: not met")
    assert results[1].startswith("37.9x geo-mean, smallest 36.0x: met")
    assert results[2] == "1.25x (2.50 vs 2.00 ms): met"
    assert results[3] == "1.04x (0.520 vs 0.500 s): not met"
    assert table[4][2] == ">= 4x" and results[4] == "3.30x (1.00 vs 3.30 s): not met"
