"""Honest work is kept, as an agent would do it on a job that saves a checkpoint at its end: the edit
(a vectorized loss, then a fused optimizer) committed, the candidate measured over two calls, `git revert
HEAD` as the rollback. An edit that renames
modules (the same numbers, but a checkpoint the baseline saved no longer loads) is refused by the
checkpoint gate, naming the keys.

Real runs on the CPU through the MCP protocol (tests/fixtures/save_at_end.py, every approval accepted).
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

pytestmark = pytest.mark.anyio

SCRIPT = Path(__file__).parent / "fixtures" / "save_at_end.py"
INVARIANTS = {
    "model": "mlp 16x32",
    "dataset": "synthetic",
    "precision": "fp32",
    "global_batch": 32,
    "seed": 0,
}
PER_SAMPLE = """    # one sample at a time
    losses = [nn.functional.cross_entropy(model(x[i : i + 1]), y[i : i + 1]) for i in range(len(x))]
    return torch.stack(losses).mean()"""
VECTORIZED = "    return nn.functional.cross_entropy(model(x), y)"
RENAMED = {"self.blocks": "self.layers"}
FUSED = {"foreach=False": "fused=True"}


def _git(ws: Path, *args: str) -> None:
    subprocess.run(["git", "-c", "user.name=u", "-c", "user.email=u@u", *args], cwd=ws, check=True)


def _workspace(root: Path) -> Path:
    ws = root / "job"
    ws.mkdir()
    shutil.copy(SCRIPT, ws / "train.py")
    (ws / ".gitignore").write_text("ckpt/\ncaptures/\n__pycache__/\n")
    _git(ws, "init", "-q")
    _git(ws, "add", "-A")
    _git(ws, "commit", "-qm", "the job")
    return ws


def _edit(ws: Path, replacements: dict[str, str], message: str) -> None:
    script = ws / "train.py"
    text = script.read_text()
    for old, new in replacements.items():
        assert old in text, old
        text = text.replace(old, new)
    script.write_text(text)
    _git(ws, "commit", "-qam", message)


def _window(label: str, repeats: int) -> dict[str, Any]:
    return {
        "command": [sys.executable, "train.py", "--steps", "40", "--depth", "16", "--out", "ckpt/final.pt"],
        "warmup_steps": 8,
        "measure_steps": 20,
        "repeats": repeats,
        "timeout_s": 300,
        "label": label,
        "capture": {"step": 1, "what": ["parameters", "gradients"]},
        "contract": {"invariants": INVARIANTS, "execution": {}},
    }


async def _experiment(
    agent: Agent, ws: Path, env: dict[str, Any], base: dict[str, Any], edit: dict[str, str], why: str
) -> tuple[str, dict[str, Any], dict[str, Any]]:
    opened = await agent.call(
        "record_decision",
        {
            "action": "open",
            "hypothesis": why,
            "classification": "system_optimization",
            "changed_variable": "code",
            "tolerance": {"atol": 1e-5, "rtol": 1e-5},
        },
    )
    _edit(ws, edit, why)
    # the candidate over two calls
    c1 = await agent.call("run_benchmark_window", _window("candidate", 2))
    c2 = await agent.call("run_benchmark_window", _window("candidate", 2))
    assert c1.get("state") == "executed" and c2.get("state") == "executed", (c1, c2)
    compared = await agent.call(
        "compare_benchmarks",
        {
            "baseline": [base["evidence_id"]],
            "candidate": [c1["evidence_id"], c2["evidence_id"]],
            "declared_changes": ["code"],
        },
        lines=8,
    )
    assert "screen" not in compared or not compared["screen"], compared
    tensors = await agent.call(
        "compare_tensors",
        {
            "reference": base["tensor_dumps"][0]["path"],
            "candidate": c1["tensor_dumps"][0]["path"],
            "atol": 1e-5,
            "rtol": 1e-5,
        },
    )
    keep = await agent.call(
        "record_decision",
        {
            "action": "decide",
            "experiment_id": opened["experiment_id"],
            "decision": "keep",
            "rationale": why,
            "rollback": "git revert HEAD",
            "evidence": [
                {"id": env["evidence_id"], "role": "environment"},
                {"id": compared["evidence_id"], "role": "comparison"},
                {"id": tensors["evidence_id"], "role": "correctness"},
            ],
        },
        lines=12,
    )
    return opened["experiment_id"], compared, keep


@pytest.mark.timeout(1500)
async def test_an_honest_edit_of_a_job_that_saves_at_its_end_is_kept_and_a_rename_is_refused(
    tmp_path: Path,
) -> None:
    pytest.importorskip("torch")
    ws = _workspace(tmp_path)
    human = Human()
    async with Client(build_server(ServerConfig.create(ws)), elicitation_callback=human) as client:
        agent = Agent(client)
        env = await agent.call("collect_env", {})
        base = await agent.call("run_benchmark_window", _window("baseline", 3))
        assert base.get("state") == "executed", base
        _, compared, keep = await _experiment(
            agent, ws, env, base, {PER_SAMPLE: VECTORIZED}, "the loss of the whole batch in one call"
        )
        if compared.get("verdict") == "within_noise":
            pytest.skip(f"the host was too noisy to tell an 8x change: {compared.get('noise')}")
        assert keep.get("accepted") is True, keep
        assert agent.calls <= 12 and len(human.asked) <= 2, (agent.calls, human.asked)
        gates = {g["name"]: g for g in keep["gates"]}
        assert gates["checkpoint_resume"]["status"] == "not_applicable", gates["checkpoint_resume"]
        assert gates["rollback"]["status"] == "passed", gates["rollback"]

        # the vectorized job is the new baseline; its optimizer's per-parameter loop fused into one kernel
        base = await agent.call("run_benchmark_window", _window("baseline", 3))
        _, compared, keep = await _experiment(agent, ws, env, base, FUSED, "Adam's update fused")
        if compared.get("verdict") == "improved":
            assert keep.get("accepted") is True, keep
        else:  # a busy host may not tell a 1.3-2x change: then the comparison alone says why
            assert "unmet (comparison)" in keep.get("error", ""), keep
            _git(ws, "revert", "--no-edit", "HEAD")

        # a rename of the modules keeps every number, and the windows end before the job's save: the
        # changed model structure asks for the saves to be observed
        base = await agent.call("run_benchmark_window", _window("baseline", 3))
        exp, _, refused = await _experiment(agent, ws, env, base, RENAMED, "clearer module names")
        error = refused.get("error", "")
        assert "keep refused" in error and "checkpoint_resume" in error and "job=true" in error, refused
        # what the refusal says: each side once with job=true, so its save runs and what it holds is compared
        _git(ws, "checkout", "-q", "HEAD~1")
        b_job = await agent.call("run_benchmark_window", {**_window("baseline", 1), "job": True})
        _git(ws, "checkout", "-q", "-")
        c_job = await agent.call("run_benchmark_window", {**_window("candidate", 1), "job": True})
        compared = await agent.call(
            "compare_benchmarks",
            {
                "baseline": [base["evidence_id"], b_job["evidence_id"]],
                "candidate": [c_job["evidence_id"]],
                "declared_changes": ["code"],
            },
        )
        refused = await agent.call(
            "record_decision",
            {
                "action": "decide",
                "experiment_id": exp,
                "decision": "keep",
                "rationale": "clearer module names",
                "rollback": "git revert HEAD",
                "fewer_windows_reason": "the saves are what this keep needs",
                "evidence": [{"id": compared["evidence_id"], "role": "comparison"}],
            },
            lines=12,
        )
        error = refused.get("error", "")
        assert "does not load into the candidate strictly" in error, refused
        assert "blocks.0.weight" in error and "layers.0.weight" in error, error
