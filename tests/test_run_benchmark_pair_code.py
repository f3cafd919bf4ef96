"""run_benchmark_pair at two code states: the baseline at a git commit, the candidate the working tree.

Real CPU runs through the MCP protocol (tests/fixtures/paired_sleep.py, OMP_NUM_THREADS=1): the committed
script waits 30 ms a step, the working tree's 10 ms and adds an untracked module. One call with one approval
settles `improved` and is kept; after it, and after a baseline that crashes, the working tree is the
candidate's byte for byte. A journal a crash left is restored by the next server (and said in the next
answer); a ref that names no commit is refused with what to give instead.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
from mcp import Client

from perfgate.evidence import Ledger
from perfgate.server import build_server
from perfgate.serving.runtime import ServerConfig
from test_nanogpt_walkthrough import Agent, Human
from test_run_benchmark_pair import INVARIANTS, SCRIPT, _keep

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(900)]

SLOW = 'parser.add_argument("--sleep-ms", type=float, default=0.0)'


def _script(sleep_ms: float, crash: bool = False) -> str:
    text = SCRIPT.read_text().replace(SLOW, SLOW.replace("0.0", f"{sleep_ms:.1f}"))
    return (
        text.replace("args = parser.parse_args()\n", "args = parser.parse_args()\nsys.exit('broken')\n")
        if crash
        else text
    )


def _workspace(root: Path, crash: bool = False) -> Path:
    """A repository whose commit is the slow baseline (or one that crashes) and whose working tree is the
    fast candidate with a new module."""
    ws = root / "job"
    ws.mkdir()
    (ws / "train.py").write_text(_script(30, crash))
    (ws / ".gitignore").write_text("captures/\n__pycache__/\n")
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "the job"]):
        subprocess.run(["git", "-c", "user.name=u", "-c", "user.email=u@u", *args], cwd=ws, check=True)
    (ws / "train.py").write_text(_script(10))
    (ws / "helpers.py").write_text("FAST = True\n")
    os.chmod(ws / "helpers.py", 0o755)
    return ws


def _files(ws: Path) -> dict[str, tuple[bytes, int]]:
    return {rel: ((ws / rel).read_bytes(), (ws / rel).stat().st_mode) for rel in ("train.py", "helpers.py")}


def request(max_launches: int = 4, ref: str = "HEAD") -> dict[str, Any]:
    return {
        "baseline_ref": ref,
        "baseline": {
            "command": ["python", "train.py", "--steps", "16"],
            "env": {"OMP_NUM_THREADS": "1"},
            "warmup_steps": 3,
            "measure_steps": 10,
            "timeout_s": 300,
            "capture": {"step": 1, "what": ["parameters", "gradients"]},
            "contract": {"invariants": INVARIANTS, "execution": {}},
        },
        "max_launches": max_launches,
    }


async def test_an_edit_against_head_settles_in_one_call_is_kept_and_leaves_the_candidate(
    tmp_path: Path,
) -> None:
    pytest.importorskip("torch")
    ws = _workspace(tmp_path)
    candidate = _files(ws)
    human = Human()
    async with Client(build_server(ServerConfig.create(ws)), elicitation_callback=human) as client:
        agent = Agent(client)
        env = await agent.call("collect_env", {})
        opened = await agent.call(
            "record_decision",
            {
                "action": "open",
                "hypothesis": "the edit waits 10 ms a step instead of 30",
                "classification": "system_optimization",
                "changed_variable": "code",
                "tolerance": {"atol": 1e-5, "rtol": 1e-5},
            },
        )
        got = await agent.call("run_benchmark_pair", request(max_launches=6), lines=4)
        assert _files(ws) == candidate, "the working tree is not the candidate's after the call"
        assert got.get("verdict") == "improved" and got["settled"], agent.transcript[-1]
        assert len(human.asked) == 1
        question = human.asked[0]
        assert "code: A runs HEAD (" in question and "train.py" in question and "helpers.py" in question
        assert "-" + SLOW.replace("0.0", "30.0") in question and "+" + SLOW.replace("0.0", "10.0") in question
        ledger = {r.id: r for r in Ledger(ws).records()}
        base_code = ledger[got["baseline_id"]].result["provenance"]["code"]
        cand_code = ledger[got["candidate_id"]].result["provenance"]["code"]
        assert base_code["dirty"] is False and cand_code["dirty"] is True, (base_code, cand_code)
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ws, capture_output=True, text=True).stdout
        undo = f"git checkout {head.strip()[:12]} -- helpers.py train.py"
        keep = await _keep(agent, opened["experiment_id"], env, got, "the edit waits 10 ms a step", undo)
        assert keep.get("accepted") is True, agent.transcript[-1]


async def test_a_crashing_baseline_fails_and_leaves_the_candidate(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    ws = _workspace(tmp_path, crash=True)
    candidate = _files(ws)
    async with Client(build_server(ServerConfig.create(ws)), elicitation_callback=Human()) as client:
        got = await Agent(client).call("run_benchmark_pair", request(), lines=4)
    assert got.get("stopped") == "failure" and got["order"] == "A", got
    assert _files(ws) == candidate


async def test_a_crash_left_swapped_is_restored_and_an_unknown_ref_refused(tmp_path: Path) -> None:
    from perfgate.execution.codeswap import CodeSwap, plan_swap

    ws = _workspace(tmp_path)
    candidate = _files(ws)
    config = ServerConfig.create(ws)
    private = config.trust.workspace_dir(ws.resolve())
    swap = CodeSwap(ws, plan_swap(ws, "HEAD"), private / "codeswap")
    swap.__enter__()
    swap.to_ref()  # the server dies here, before swapping back
    assert not (ws / "helpers.py").exists() and "default=30.0" in (ws / "train.py").read_text()
    async with Client(build_server(config), elicitation_callback=Human()) as client:
        got = await Agent(client).call("run_benchmark_pair", request(ref="no-such-branch"), lines=4)
    assert _files(ws) == candidate
    assert "does not name a commit" in got["error"] and "give HEAD, a branch" in got["error"], got
    assert "restored the working tree a paired run left at its baseline" in got["error"], got
