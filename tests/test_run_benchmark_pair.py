"""run_benchmark_pair on real CPU runs through the MCP protocol: an A/B in one call and one approval.

A 3x change (the baseline waits 30 ms in each step, the candidate 10 ms) settles `improved` at the first
look and is kept through record_decision on the records the call wrote; a change that changes nothing does
not come back `improved`; a candidate that trains a smaller model (faster, and another training) is refused
at keep by the gates that refuse it after separate calls; a failed launch stops the run with both sides'
records and no comparison. Tests/fixtures/paired_sleep.py, OMP_NUM_THREADS=1, every approval accepted.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from mcp import Client

from perfgate.server import build_server
from perfgate.serving.runtime import ServerConfig
from test_nanogpt_walkthrough import Agent, Human

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(900)]

SCRIPT = Path(__file__).parent / "fixtures" / "paired_sleep.py"
INVARIANTS = {
    "model": "mlp 8x16x2",
    "dataset": "synthetic",
    "precision": "fp32",
    "global_batch": 32,
    "seed": 0,
}


def _workspace(root: Path) -> Path:
    ws = root / "job"
    ws.mkdir()
    shutil.copy(SCRIPT, ws / "train.py")
    (ws / ".gitignore").write_text("captures/\n__pycache__/\n")
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "the job"]):
        subprocess.run(["git", "-c", "user.name=u", "-c", "user.email=u@u", *args], cwd=ws, check=True)
    return ws


def argv(*extra: str) -> list[str]:
    return [sys.executable, "train.py", "--steps", "16", *extra]


def pair(
    baseline: list[str], candidate: list[str], declared: list[str], max_launches: int = 4
) -> dict[str, Any]:
    return {
        "baseline": {
            "command": baseline,
            "env": {"OMP_NUM_THREADS": "1"},
            "warmup_steps": 3,
            "measure_steps": 10,
            "timeout_s": 300,
            "capture": {"step": 1, "what": ["parameters", "gradients"]},
            "contract": {"invariants": INVARIANTS, "execution": {}},
        },
        "candidate": {"command": candidate},
        "declared_changes": declared,
        "max_launches": max_launches,
    }


async def _open(agent: Agent, why: str, changed: str = "argv") -> str:
    opened = await agent.call(
        "record_decision",
        {
            "action": "open",
            "hypothesis": why,
            "classification": "system_optimization",
            "changed_variable": changed,
            "tolerance": {"atol": 1e-5, "rtol": 1e-5},
        },
    )
    return opened["experiment_id"]


async def _keep(
    agent: Agent,
    exp: str,
    env: dict[str, Any],
    got: dict[str, Any],
    why: str,
    rollback: str = "--sleep-ms 30",
    *,
    match: bool = False,
) -> dict[str, Any]:
    """Each side's first captured tensors compared at the experiment's tolerance (``match``: asserted to
    match), then the keep on the pair's comparison."""
    tensors = await agent.call(
        "compare_tensors",
        {
            "reference": got["baseline_tensor_dumps"][0],
            "candidate": got["candidate_tensor_dumps"][0],
            "atol": 1e-5,
            "rtol": 1e-5,
        },
    )
    assert not match or tensors.get("status") == "match", agent.transcript[-1]
    return await agent.call(
        "record_decision",
        {
            "action": "decide",
            "experiment_id": exp,
            "decision": "keep",
            "rationale": why,
            "rollback": rollback,
            "evidence": [
                {"id": env["evidence_id"], "role": "environment"},
                {"id": got["comparison_id"], "role": "comparison"},
                {"id": tensors["evidence_id"], "role": "correctness"},
            ],
        },
        lines=12,
    )


async def test_a_3x_change_settles_in_one_call_and_one_approval_and_is_kept(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    ws = _workspace(tmp_path)
    human = Human()
    async with Client(build_server(ServerConfig.create(ws)), elicitation_callback=human) as client:
        agent = Agent(client)
        env = await agent.call("collect_env", {})
        exp = await _open(agent, "the candidate waits 10 ms a step instead of 30")
        got = await agent.call(
            "run_benchmark_pair",
            pair(argv("--sleep-ms", "30"), argv("--sleep-ms", "10"), ["argv"], max_launches=6),
            lines=4,
        )
        assert got.get("verdict") == "improved", agent.transcript[-1]
        assert got["settled"] and got["launches"] == 3 and got["order"] == "ABBAAB", got
        assert len(human.asked) == 1
        question = human.asked[0]
        assert "A argv:" in question and "B argv:" in question
        assert (
            "candidate (B) against baseline (A): arguments argv[" in question and '"30" -> "10"' in question
        )
        records = {r["id"]: r for r in (await _ledger(ws))}
        assert (
            records[got["baseline_id"]]["tool"]
            == records[got["candidate_id"]]["tool"]
            == "run_benchmark_window"
        )
        assert records[got["comparison_id"]]["tool"] == "compare_benchmarks"
        keep = await _keep(agent, exp, env, got, "the candidate waits 10 ms a step instead of 30")
        assert agent.calls == 5  # environment, open, the pair, tensors, keep
        assert keep.get("accepted") is True, agent.transcript[-1]


async def test_no_change_is_not_a_false_improvement(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    ws = _workspace(tmp_path)
    async with Client(build_server(ServerConfig.create(ws)), elicitation_callback=Human()) as client:
        agent = Agent(client)
        # the same work spelled another way: 10 ms in each step either way
        got = await agent.call(
            "run_benchmark_pair",
            pair(argv("--sleep-ms", "10"), argv("--sleep-ms", "10.0"), ["argv"], max_launches=4),
            lines=4,
        )
    assert got.get("verdict") in ("within_noise", "regressed", "improved"), got
    assert not (got["settled"] and got["verdict"] == "improved"), agent.transcript[-1]
    assert got["verdict"] != "improved" or not got["settled"], got
    assert len(got["baseline_median_ms"]) == len(got["candidate_median_ms"]) == got["launches"]


async def test_a_smaller_model_is_faster_and_refused_at_keep(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    ws = _workspace(tmp_path)
    async with Client(build_server(ServerConfig.create(ws)), elicitation_callback=Human()) as client:
        agent = Agent(client)
        env = await agent.call("collect_env", {})
        exp = await _open(agent, "a smaller hidden layer")
        got = await agent.call(
            "run_benchmark_pair",
            pair(
                argv("--sleep-ms", "30"), argv("--sleep-ms", "10", "--hidden", "4"), ["argv"], max_launches=3
            ),
            lines=4,
        )
        assert got.get("comparison_id"), agent.transcript[-1]
        # each side's own window warnings reach the pair's answer, marked by side
        answer = "\n".join(got["warnings"])
        for side, rid in (("A", got["baseline_id"]), ("B", got["candidate_id"])):
            for warning in _record(ws, rid).result.get("warnings", []):
                assert f"{side}: {warning}" in answer or warning in answer, (side, warning)
        keep = await _keep(agent, exp, env, got, "a smaller hidden layer")
    assert keep.get("accepted") is not True, keep
    assert "correctness" in keep["error"] or "same_training" in keep["error"], keep


async def test_a_failed_launch_stops_the_run_and_compares_nothing(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    ws = _workspace(tmp_path)
    async with Client(build_server(ServerConfig.create(ws)), elicitation_callback=Human()) as client:
        agent = Agent(client)
        got = await agent.call("run_benchmark_pair", pair(argv(), argv("--fail"), ["argv"]), lines=4)
    assert got.get("state") == "failed" and got["stopped"] == "failure", got
    assert (
        got["order"] == "AB" and got["comparison_id"] is None and "launch 0" in (got["failure_reason"] or "")
    )
    assert got["baseline_id"] and got["candidate_id"]


def _record(ws: Path, rid: str) -> Any:
    from perfgate.evidence import Ledger

    return next(r for r in Ledger(ws).records() if r.id == rid)


async def _ledger(ws: Path) -> list[dict[str, Any]]:
    from perfgate.evidence import Ledger

    ledger = Ledger(ws)
    return [{"id": r.id, "tool": r.tool} for r in ledger.records()]
