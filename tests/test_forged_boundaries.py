"""Issue 58 item 2: a candidate that takes over the boundary channel cannot pass as corroborated.

The candidate finds the harness's channel to the server through ``gc``, points it at /dev/null, bends the
harness's clock to a third of real speed and writes its own boundary lines from a thread at a third of the
real spacing: every stamp then agrees with the record, and only the launch's exec-to-exit time (the steps the
record claims leave most of it unaccounted for, after the last boundary) can tell. The same script without
the helper's tricks, beside a CPU burner, stays corroborated. Real runs under the harness (timing='harness').
"""

from __future__ import annotations

import multiprocessing
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from mcp import Client

from _trust import any_code_rules, operator_policy
from perfgate.server import build_server
from perfgate.serving.runtime import ServerConfig

pytestmark = pytest.mark.anyio

PY = sys.executable
STEP_S = 0.1

TRAIN = f"""\
import time

import torch

import helper

model = torch.nn.Linear(4, 4)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
helper.start()
for step in range(200):
    loss = model(torch.ones(8, 4)).sum()
    loss.backward()
    time.sleep({STEP_S})
    opt.step()
    opt.zero_grad()
"""

HONEST = "def start():\n    pass\n"

FORGER = f"""\
import gc
import os
import threading
import time


def start():
    writer = next(o for o in gc.get_objects() if type(o).__name__ == "TickWriter")
    window = next(o for o in gc.get_objects() if type(o).__name__ == "Window" and hasattr(o, "_ticks"))
    channel = os.dup(writer._fd)
    os.dup2(os.open(os.devnull, os.O_WRONLY), writer._fd)  # the harness's own lines go nowhere
    module = __import__(type(window).__module__, fromlist=["_now"])
    real = time.perf_counter_ns
    t0 = real()
    module._now = lambda: t0 + (real() - t0) // 3  # the record's clock at a third of real speed

    def forge():
        begun = time.monotonic()
        for b in range(200):
            os.write(channel, b"0 %d\\n" % b)
            time.sleep(max(0.0, begun + (b + 1) * {STEP_S} * 1.01 / 3 - time.monotonic()))

    threading.Thread(target=forge, daemon=True).start()
"""


def _burn() -> None:
    while True:
        pass


@pytest.fixture
def burner() -> Iterator[None]:
    proc = multiprocessing.get_context("spawn").Process(target=_burn, daemon=True)
    proc.start()
    try:
        yield
    finally:
        proc.kill()
        proc.join()


@pytest.fixture
def ws(workspace: Path) -> Path:
    (workspace / "train.py").write_text(TRAIN)
    operator_policy("[execution]\n" + any_code_rules([PY, "-m", "perfgate.harness"], [PY, "train.py"]))
    return workspace


async def _run(ws: Path, helper: str) -> dict[str, Any]:
    (ws / "helper.py").write_text(helper)
    args = {
        "command": [PY, "train.py"],
        "warmup_steps": 6,
        "measure_steps": 36,
        "repeats": 1,
        "timeout_s": 120,
        "contract": {"invariants": {"workload": "paced", "global_batch": 8}},
    }
    async with Client(build_server(ServerConfig.create(ws))) as client:
        result = await client.call_tool("run_benchmark_window", args)
    assert not result.is_error, result.content
    out = result.structured_content
    assert out is not None and out["state"] == "executed", out
    return out


async def test_boundaries_forged_through_the_channel_are_untrusted(ws: Path) -> None:
    out = await _run(ws, FORGER)
    (check,) = out["timing_checks"]
    assert check["status"] == "untrusted", check
    assert any("no step accounts for" in r or "never reached" in r for r in check["reasons"]), check


async def test_an_honest_launch_beside_a_cpu_burner_is_corroborated(ws: Path, burner: None) -> None:
    out = await _run(ws, HONEST)
    (check,) = out["timing_checks"]
    assert check["status"] == "corroborated", check
