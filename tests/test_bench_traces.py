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


@pytest.fixture(scope="module")
def bench() -> Any:
    spec = importlib.util.spec_from_file_location("bench_traces", REPO / "benchmarks" / "bench_traces.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_traces"] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
@pytest.mark.anyio
async def test_one_round_times_the_tool_warm_and_cold_and_the_library(
    bench: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = await bench.measure_traces([PLANTED / "tiny_ops_rank0.json.gz"], 1, None, log=lambda _: None)
    (row,) = rows
    for who in ("warm", "cold", "lib"):
        assert len(row.wall[who].values) == 1 and row.wall[who].values[0] > 0
    # The warm server's CPU is read from /proc; the cold process is the server spawned for the call.
    assert row.cpu["cold"].values[0] > 0
    assert not row.wall["hta"].values  # no HTA here
    bench.print_traces(rows)
    out = capsys.readouterr().out
    assert "tiny_ops_rank0" in out and "tool warm" in out
