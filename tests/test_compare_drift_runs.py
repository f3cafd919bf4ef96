"""compare_benchmarks on tiny real CPU runs: host drift between the sides, and candidates that train differently.

The load is the test's own: busy-loop processes started between the calls (or between launches). Nothing
here asserts a time; the assertions are on the verdict and on what the answer says.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from mcp import Client

import perfgate.tools
from _trust import any_code_rules, operator_policy
from perfgate.server import build_server
from perfgate.serving.runtime import ServerConfig
from perfgate.tools import compare_benchmarks, run_benchmark_window

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

PY = sys.executable
EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
CONTRACT = {
    "invariants": {"model": "tiny-mlp", "data": "synthetic", "precision": "fp32", "global_batch": 32},
    "execution": {"microbatch": 32, "accumulation": 1, "world_size": 1},
}


@pytest.fixture(autouse=True)
def registry_with_benchmark_tools(monkeypatch: pytest.MonkeyPatch) -> None:
    specs = [
        s for s in (run_benchmark_window.SPEC, compare_benchmarks.SPEC) if s not in perfgate.tools.REGISTRY
    ]
    monkeypatch.setattr(perfgate.tools, "REGISTRY", (*perfgate.tools.REGISTRY, *specs))


@pytest.fixture
def train(workspace: Path) -> Path:
    """The tiny MLP trainer as the workspace's own train.py (allowed to run any code)."""
    shutil.copy(EXAMPLES / "_pace.py", workspace / "_pace.py")
    script = workspace / "train.py"
    shutil.copy(EXAMPLES / "tiny_train.py", script)
    operator_policy("[execution]\n" + any_code_rules([PY, "-m", "perfgate.harness"], [PY, str(script)]))
    return script


def window(script: Path, repeats: int, label: str) -> dict[str, Any]:
    return {
        "command": [PY, str(script), "--steps", "100000"],
        "warmup_steps": 3,
        "measure_steps": 15,
        "repeats": repeats,
        "contract": CONTRACT,
        "label": label,
        "timeout_s": 120,
    }


async def call(workspace: Path, tool: str, args: dict[str, Any]) -> tuple[dict[str, Any], str]:
    async with Client(build_server(ServerConfig.create(workspace))) as client:
        result = await client.call_tool(tool, args)
    text = result.content[0].text  # type: ignore[union-attr]
    assert not result.is_error, text
    assert result.structured_content is not None
    return result.structured_content, text


@contextlib.contextmanager
def burners(n: int) -> Iterator[None]:
    """``n`` busy-loop processes (this test's own load), stopped and reaped on the way out."""
    procs = [subprocess.Popen([PY, "-c", "while True: pass"]) for _ in range(n)]
    try:
        yield
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait(timeout=30)


async def test_the_same_job_before_and_after_a_load_started_between_calls_is_within_noise(
    workspace: Path, train: Path
) -> None:
    base, _ = await call(workspace, "run_benchmark_window", window(train, 3, "baseline"))
    with burners(2):
        cand, _ = await call(workspace, "run_benchmark_window", window(train, 3, "candidate"))
    assert len(base["launch_started_unix_s"]) == 3 and len(cand["launch_started_unix_s"]) == 3
    cmp, text = await call(
        workspace,
        "compare_benchmarks",
        {"baseline": [base["evidence_id"]], "candidate": [cand["evidence_id"]]},
    )
    assert cmp["status"] == "comparable"
    drift = cmp["drift"]
    assert drift["design"] == "blocks" and drift["order"] == "AAABBB"
    # the burners slow the server's probe around the candidate's launches
    assert any(s.startswith("host speed:") for s in drift["sources"]), drift
    assert cmp["verdict"] == "within_noise", (cmp["speedup"], cmp["ci_low"], cmp["ci_high"], drift)
    assert cmp["ci_low"] <= cmp["speedup"] <= cmp["ci_high"]
    assert "not interleaved" in cmp["method"]
    # where the drift is what kept a slowdown from being called one, the answer says so and gives the calls
    # that settle it
    for line in [w for w in cmp["warnings"] if w.startswith("drift:")]:
        assert "interleaved" in line and base["evidence_id"] in line and "compare_benchmarks(" in line
    assert cmp["training_may_differ"] == [] and not text.startswith("training may differ")


async def test_the_same_job_interleaved_under_a_load_that_ramps_between_launches_is_within_noise(
    workspace: Path, train: Path
) -> None:
    """The calls the drift line gives: A A | B B | B B | A A, the load growing at each call: both sides see
    it, and the comparison says they were interleaved."""
    first, _ = await call(workspace, "run_benchmark_window", window(train, 2, "baseline"))
    with burners(1):
        second, _ = await call(workspace, "run_benchmark_window", window(train, 2, "candidate"))
        third, _ = await call(workspace, "run_benchmark_window", window(train, 2, "candidate"))
        with burners(1):
            last, _ = await call(workspace, "run_benchmark_window", window(train, 2, "baseline"))
    cmp, _ = await call(
        workspace,
        "compare_benchmarks",
        {
            "baseline": [first["evidence_id"], last["evidence_id"]],
            "candidate": [second["evidence_id"], third["evidence_id"]],
        },
    )
    assert cmp["reasons"] == []
    assert cmp["status"] == "comparable"
    assert cmp["drift"]["design"] == "interleaved" and cmp["drift"]["order"] == "AABBBBAA"
    assert "interleaved in time" in cmp["method"]
    assert cmp["verdict"] == "within_noise", (cmp["speedup"], cmp["ci_low"], cmp["ci_high"])


async def test_a_candidate_that_halves_the_model_width_says_training_may_differ_first(
    workspace: Path, train: Path
) -> None:
    base, _ = await call(workspace, "run_benchmark_window", window(train, 2, "baseline"))
    assert base["model"]["name"] == "torch.nn.modules.container.Sequential"
    text = train.read_text()
    assert 'default=64, help="hidden width' in text
    train.write_text(text.replace('default=64, help="hidden width', 'default=32, help="hidden width'))
    cand, _ = await call(workspace, "run_benchmark_window", window(train, 2, "candidate"))
    # 32*64+64 + 64*64+64 + 64*10+10 parameters, then the same at width 32
    assert (base["model"]["parameters"], cand["model"]["parameters"]) == (6922, 2442)
    cmp, answer = await call(
        workspace,
        "compare_benchmarks",
        {"baseline": [base["evidence_id"]], "candidate": [cand["evidence_id"]], "declared_changes": ["code"]},
    )
    assert cmp["status"] == "comparable", cmp["reasons"]
    first = answer.splitlines()[0]
    assert first.startswith("training may differ: model size: 6,922 -> 2,442 parameters"), first
    assert "not an equivalent speedup until correctness evidence" in first
    assert any(d.startswith("loss:") for d in cmp["training_may_differ"]), cmp["training_may_differ"]
    assert cmp["caution"] == first
