"""Start-up that names its line (issue 59 item 3): a job whose start-up dominates is ranked by line.

The issue's job spent most of its time in a slow tokenization before its first step and was reported as
"startup 33.36 s". The harness samples the main thread's stack until the first training forward; the
window's answer ranks start-up's own lines with their time and share.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from mcp import Client

from test_approval_scope import Human, server, text

pytestmark = pytest.mark.anyio

PY = sys.executable
TRAIN = """\
import time

import torch


def tokenize(n):
    time.sleep(n)  # the slow tokenization
    return list(range(64))


began = time.perf_counter()
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)  # its first use imports torch._dynamo: seconds when busy
tokens = tokenize(2 + 2 * (time.perf_counter() - began))  # longer than the rest of start-up's lines
for _ in range(12):
    opt.zero_grad()
    model(torch.randn(8, 4)).sum().backward()
    opt.step()
"""
SLOW = 7  # the line that sleeps: the innermost line of the user's code while start-up waits


async def test_a_job_whose_start_up_is_slow_ranks_its_slow_line_first(workspace: Path) -> None:
    (workspace / "train.py").write_text(TRAIN)
    assert "time.sleep" in TRAIN.splitlines()[SLOW - 1]
    args = {
        "command": [PY, "train.py"],
        "warmup_steps": 2,
        "measure_steps": 4,
        "repeats": 1,
        "job": True,
        "timeout_s": 300,
        "label": "slow-start",
        "contract": {
            "invariants": {"model": "linear", "dataset": "random", "precision": "fp32", "global_batch": 8},
            "execution": {"microbatch": 8, "accumulation": 1, "data_parallel": 1},
        },
    }
    async with Client(server(workspace), elicitation_callback=Human()) as client:
        result = await client.call_tool("run_benchmark_window", args)
    assert not result.is_error, text(result)
    out = result.structured_content
    assert out is not None
    lines = out["job"]["startup_lines"]
    assert lines and lines[0]["location"] == f"train.py:{SLOW} tokenize", lines
    # The sleep is most of the sampled start-up, and its time is the time asleep (not a count of samples).
    assert lines[0]["share"] > 0.3 and lines[0]["seconds"] >= 1.9, lines
    # perfgate's own start-up (its entry file, importing torch for its hooks) is no line of the user's.
    assert all(x["location"].startswith("train.py:") for x in lines), lines
    assert f"startup spent at train.py:{SLOW} tokenize" in out["job"]["summary"]
    assert f"train.py:{SLOW} tokenize" in text(result)
