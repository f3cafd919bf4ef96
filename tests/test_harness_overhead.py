"""The harness reports what its own code took of each step and of start-up, as it timed itself: a real CPU
run answers with a plausible figure (more than nothing, less than the step it sits in), and the warning
follows the figure it states. No gate reads it."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
from mcp import Client

from _trust import any_code_rules, operator_policy
from perfgate.benchmarking.reading.records import HarnessOwnRecord, RankRecord
from perfgate.benchmarking.windows.window_run import OWN_SHARE_WARN, harness_overhead
from perfgate.server import build_server
from perfgate.serving.runtime import ServerConfig

pytestmark = pytest.mark.anyio

PY = sys.executable
_COLUMNS = ("start_ns", "end_ns", "step_time_ns", "data_wait_ns", "backward_ns", "samples", "tokens")

TRAIN = """\
import torch

torch.manual_seed(0)
torch.set_num_threads(1)
model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 64))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x = torch.randn(8, 64)
for _ in range(200):
    loss = model(x).square().mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
"""


@pytest.fixture
def ws(workspace: Path) -> Path:
    (workspace / "train.py").write_text(TRAIN)
    operator_policy("[execution]\n" + any_code_rules([PY, "-m", "perfgate.harness"], [PY, "train.py"]))
    return workspace


async def test_a_real_run_states_perfgates_own_share_of_each_step(ws: Path) -> None:
    args: dict[str, Any] = {
        "command": [PY, "train.py"],
        "warmup_steps": 10,
        "measure_steps": 60,
        "repeats": 1,
        "timeout_s": 300,
        "contract": {"invariants": {"workload": "tiny", "global_batch": 8}},
    }
    async with Client(build_server(ServerConfig.create(ws))) as client:
        result = await client.call_tool("run_benchmark_window", args)
    assert not result.is_error, result.content
    out = result.structured_content
    assert out is not None and out["state"] == "executed", out
    own = out["harness_overhead"]
    step_us = out["median_step_ms"] * 1e3
    assert 0 < own["step_us"] < step_us, (own, step_us)
    assert own["share"] == pytest.approx(own["step_us"] / step_us)
    assert own["startup_ms"] is not None and own["startup_ms"] > 0
    assert own["note"].startswith("perfgate's own code took") and "as the harness timed itself" in own["note"]
    warned = any(w.startswith("the step time includes perfgate") for w in out["warnings"])
    assert warned == (own["share"] > OWN_SHARE_WARN), (own, out["warnings"])
    assert "perfgate's own code took" in "".join(c.text for c in result.content if hasattr(c, "text"))


def _record(own: HarnessOwnRecord | None) -> RankRecord:
    import msgspec

    return msgspec.convert(
        {
            "schema": "perfgate.harness.record",
            "version": 1,
            "rank": 0,
            "world_size": 1,
            "timing": "optimizer",
            "warmup_steps": 0,
            "measure_steps": 1,
            "windows_requested": 1,
            "complete": True,
            "profiled": False,
            "steps": {key: [] for key in _COLUMNS} | {"count": 0, "warmup": 0},
            "windows": [],
            "origin_unix_ns": 0,
            "harness_own": None if own is None else msgspec.to_builtins(own),
        },
        RankRecord,
    )


def test_the_figure_is_the_median_over_ranks_and_absent_without_a_report() -> None:
    records = [
        _record(HarnessOwnRecord(median_step_ns=n, steps=50, startup_ns=40_000_000))
        for n in (10_000, 30_000, 20_000)
    ]
    got = harness_overhead(records, median_step_ms=0.5)
    assert got is not None
    assert got.step_us == pytest.approx(20.0)
    assert got.share == pytest.approx(0.04)
    assert got.startup_ms == pytest.approx(40.0)
    assert harness_overhead([_record(None)], median_step_ms=0.5) is None
