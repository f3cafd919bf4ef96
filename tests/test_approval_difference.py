"""Approvals that show the difference (issue 59 item 6): an argv or environment change is shown against
the last approved run, as a code change is, and perfgate's own harness variables are one line.

The issue's human approved a run whose only difference from the last one was an argv value and read
"code: no change", with the real difference somewhere among about 15 PERFGATE_* variables they never set.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

import pytest
from mcp import Client

import perfgate.tools
from _gated_tool import SPEC
from test_approval_scope import Human, repo, server, text

pytestmark = pytest.mark.anyio

PY = sys.executable
TRAIN = """\
import sys

import torch

lr = float(sys.argv[sys.argv.index("--lr") + 1])
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=lr)
for _ in range(30):
    opt.zero_grad()
    model(torch.randn(8, 4)).sum().backward()
    opt.step()
"""
SINCE = r"since the last approved run \(ap-[0-9a-f]+, \d{4}-\d\d-\d\dT[\d:]+\+00:00\)"


def window(lr: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "command": [PY, "train.py", "--lr", lr],
        "env": env or {},
        "warmup_steps": 2,
        "measure_steps": 4,
        "repeats": 1,
        "timeout_s": 300,
        "label": f"lr{lr}",
        "contract": {
            "invariants": {"model": "linear", "dataset": "random", "precision": "fp32", "global_batch": 8},
            "execution": {"microbatch": 8, "accumulation": 1, "data_parallel": 1},
        },
    }


def lead(message: str) -> list[str]:
    """The lines above the scope line: what decides."""
    lines = message.splitlines()
    return lines[: next(i for i, line in enumerate(lines) if "grants this command" in line)]


async def test_an_argv_change_is_shown_and_perfgates_own_variables_are_one_line(workspace: Path) -> None:
    (workspace / "train.py").write_text(TRAIN)
    human = Human()
    async with Client(server(workspace), elicitation_callback=human) as client:
        for lr in ("0.01", "0.02"):
            result = await client.call_tool("run_benchmark_window", window(lr))
            assert not result.is_error, text(result)
    first, second = human.asked
    assert "arguments, environment: no approved run to compare with" in lead(first)
    decide = lead(second)
    argv_at = next(i for i, line in enumerate(decide) if line.startswith("arguments: "))
    assert re.fullmatch(rf'arguments: changed {SINCE}: argv\[\d+\] "0.01" -> "0.02"', decide[argv_at]), decide
    assert decide[argv_at + 1] == "environment: no change since then", decide
    # The harness's variables are set (the run was timed) but none is shown by name: one line counts them.
    for message in (first, second):
        assert "PERFGATE_" not in message, message
        hidden = re.search(r"\+ (\d+) variables perfgate sets for its harness", message)
        assert hidden is not None and int(hidden[1]) >= 5, message


@pytest.fixture
def registry_with_test_tool(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(perfgate.tools, "REGISTRY", (*perfgate.tools.REGISTRY, SPEC))


@pytest.mark.usefixtures("registry_with_test_tool")
async def test_environment_changes_are_listed_added_removed_and_changed(workspace: Path) -> None:
    repo(workspace)
    human = Human()
    base = {"argv": [PY, "train.py"], "env": {"OMP_NUM_THREADS": "1", "A_FLAG": "on"}}
    after = {"argv": [PY, "train.py"], "env": {"OMP_NUM_THREADS": "2", "NEW_ONE": "x"}}
    async with Client(server(workspace), elicitation_callback=human) as client:
        for args in (base, after):
            assert not (await client.call_tool(SPEC.name, args)).is_error
    decide = lead(human.asked[1])
    assert re.fullmatch(rf"arguments: no change {SINCE}", decide[-2]), decide
    assert (
        decide[-1] == 'environment: changed since then: - A_FLAG; + NEW_ONE="x"; OMP_NUM_THREADS "1" -> "2"'
    ), decide


@pytest.mark.usefixtures("registry_with_test_tool")
async def test_a_changed_secret_shows_as_changed_without_its_value(workspace: Path) -> None:
    """Both sides are shown redacted; the values' digests kept with each approval still tell them apart."""
    repo(workspace)
    human = Human()
    async with Client(server(workspace), elicitation_callback=human) as client:
        for key in ("sk-first-secret-value-0001", "sk-other-secret-value-0002"):
            args = {"argv": [PY, "train.py"], "env": {"WANDB_API_KEY": key}}
            assert not (await client.call_tool(SPEC.name, args)).is_error
    decide = lead(human.asked[1])
    assert decide[-1].startswith("environment: changed since then: ") and "WANDB_API_KEY " in decide[-1], (
        decide
    )
    assert "secret-value" not in human.asked[1]
