"""A third public repository, with a loop unlike nanoGPT's and minGPT's: pytorch/examples'
``word_language_model`` (unmodified, tests/fixtures/word_language_model). Its loop has no optimizer object
(``p.data.add_(p.grad, alpha=-lr)`` after gradient clipping) and feeds an ``nn.LSTM`` sequence-first
``(bptt, batch)`` inputs. Measured as a user would, through the MCP protocol on a CPU: the steps are the
hand-written updates, the batch is the columns (dimension 1), and the launch stops after its windows
instead of training whole epochs.

The user's commit left ``torch.autograd.set_detect_anomaly(True)`` on from chasing a NaN (every op records
its stack, every backward checks for NaNs: about 2x the step on this model); the working-tree edit takes it
out, which trains exactly the same. The A/B of that edit is one ``run_benchmark_pair(baseline_ref="HEAD")``
call: the keep takes 5 calls and 1 approval prompt (collect_env, open, the pair, compare_tensors, decide).
Before the pair, the skill's way took 7 calls and 2 prompts when the first comparison told (collect_env, a
baseline window measured before editing, open, a candidate window, compare_benchmarks, compare_tensors,
decide) and 12 calls and 6 prompts when it came back within_noise (four interleaved windows, the code
switched by hand between them, and a second compare_benchmarks). The shortcut the same user could take next,
a hidden size halved with the edit, is refused at keep after one more pair.
"""

from __future__ import annotations

import random
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from mcp import Client

from perfgate.evidence import Ledger
from perfgate.server import build_server
from perfgate.serving.runtime import ServerConfig
from perfgate.skills.catalog import SKILL_DIR, SKILL_FILE
from test_nanogpt_walkthrough import Agent, Human
from test_run_benchmark_pair import _keep, _open

pytestmark = pytest.mark.anyio

SOURCE = Path(__file__).parent / "fixtures" / "word_language_model"
BATCH = 8
BPTT = 16
EPOCH_BATCHES = 400
"""Batches in one epoch of the corpus written below: far more than a window needs, so a launch that trained
its whole epoch (the harness finding no step) would show as steps the windows never asked for."""
SEEDED = "torch.manual_seed(args.seed)\n"
ANOMALY = SEEDED + "torch.autograd.set_detect_anomaly(True)  # chasing a NaN\n"
COMMAND = [
    sys.executable,
    "main.py",
    "--data",
    "data/corpus",
    "--emsize",
    "32",
    "--nhid",
    "32",
    "--batch_size",
    str(BATCH),
    "--bptt",
    str(BPTT),
    "--epochs",
    "1",
    "--dropout",
    "0",
]
CONTRACT = {
    "invariants": {
        "model": "LSTM 2x32",
        "dataset": "synthetic words",
        "precision": "fp32",
        "global_batch": BATCH,
    },
    "execution": {"batch_first": False},
}


def _git(ws: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", "-c", "user.name=u", "-c", "user.email=u@u", *args],
        cwd=ws,
        check=True,
        capture_output=True,
        text=True,
    )
    return done.stdout.strip()


def _workspace(root: Path) -> Path:
    """The example in a git repository whose commit has anomaly detection on; the working tree has it off."""
    ws = root / "word_language_model"
    ws.mkdir()
    for name in ("main.py", "model.py", "data.py", "LICENSE"):
        shutil.copy(SOURCE / name, ws / name)
    corpus = ws / "data" / "corpus"
    corpus.mkdir(parents=True)
    rng = random.Random(0)
    words = [f"w{i}" for i in range(300)]
    tokens = BATCH * BPTT * EPOCH_BATCHES
    for name, n in (("train.txt", tokens), ("valid.txt", 2000), ("test.txt", 2000)):
        lines = [" ".join(rng.choices(words, k=20)) for _ in range(n // 21 + 1)]
        (corpus / name).write_text("\n".join(lines) + "\n")
    (ws / ".gitignore").write_text("data/\n*.pt\n__pycache__/\ncaptures/\n")
    main = ws / "main.py"
    upstream = main.read_text()
    assert upstream.count(SEEDED) == 1
    main.write_text(upstream.replace(SEEDED, ANOMALY))
    for args in (
        ["init", "-q"],
        ["add", "-A"],
        ["commit", "-qm", "word_language_model, anomaly detection on"],
    ):
        _git(ws, *args)
    main.write_text(upstream)
    return ws


def pair(*extra: str) -> dict[str, Any]:
    """The edit against the commit: one command, the baseline on HEAD's code and the candidate on the working
    tree (its argv plus ``extra``), parameters and gradients captured at step 1 on both sides."""
    return {
        "baseline_ref": "HEAD",
        "baseline": {
            "command": COMMAND,
            "env": {"OMP_NUM_THREADS": "1"},
            "warmup_steps": 5,
            "measure_steps": 10,
            "timeout_s": 600,
            "capture": {"step": 1, "what": ["parameters", "gradients"]},
            "contract": CONTRACT,
        },
        **({"candidate": {"command": [*COMMAND, *extra]}} if extra else {}),
        "max_launches": 8,
        "reason": "anomaly detection off: the same training without per-op stack records and NaN checks",
    }


def test_the_skill_routes_an_a_b_of_a_code_edit_to_the_paired_run() -> None:
    """The call this walk-through makes is the one the skill's candidate step teaches, and the answer to a
    comparison within noise sends the agent to it too."""
    skill = (SKILL_DIR / SKILL_FILE).read_text(encoding="utf-8")
    step = re.search(r"^8\. \*\*Candidate windows\.\*\*(.*?)^9\. ", skill, re.S | re.M)
    assert step is not None, "the skill has no candidate step 8"
    assert "run_benchmark_pair(" in step.group(1) and 'baseline_ref="HEAD"' in step.group(1), step.group(1)
    noise = skill[skill.index("**A speedup inside noise.**") :].split("\n- ", 1)[0]
    assert "`run_benchmark_pair`" in noise, noise


@pytest.mark.timeout(1200)  # up to 32 launches of a few seconds each; 3-6 min on a quiet 2-core host
async def test_an_edit_to_the_hand_updated_lstm_is_kept_in_one_pair_and_a_shortcut_refused(
    tmp_path: Path,
) -> None:
    pytest.importorskip("torch")
    ws = _workspace(tmp_path)
    edited = (ws / "main.py").read_bytes()
    human = Human()
    async with Client(build_server(ServerConfig.create(ws)), elicitation_callback=human) as client:
        agent = Agent(client)
        env = await agent.call("collect_env", {})
        opened = await _open(
            agent,
            "anomaly detection records every op's stack and checks every gradient; off, "
            "the same training runs without that work",
            "code",
        )
        got = await agent.call("run_benchmark_pair", pair(), lines=4)
        assert (ws / "main.py").read_bytes() == edited, "the working tree is not the edit after the pair"
        assert got.get("verdict") == "improved", agent.transcript[-1]
        _measured_step_by_step(ws, got)
        head = _git(ws, "rev-parse", "--short=12", "HEAD")
        keep = await _keep(
            agent,
            opened,
            env,
            got,
            "anomaly detection off; the same updates",
            f"git checkout {head} -- main.py",
            match=True,
        )
        assert keep.get("accepted") is True, agent.transcript[-1]
        assert agent.calls == 5 and len(human.asked) == 1, (agent.calls, human.asked)
        await _shortcut(agent, env)


def _measured_step_by_step(ws: Path, got: dict[str, Any]) -> None:
    """Each side's window record: the hand-written updates counted as steps, the batch read from dimension
    1 of the LSTM's (bptt, batch) input, not the sequence length; anomaly detection committed, not in the
    candidate."""
    ledger = {r.id: r.result for r in Ledger(ws).records()}
    for side in (got["baseline_id"], got["candidate_id"]):
        window = ledger[side]
        assert window["windows_measured"] == got["launches"], window["windows_measured"]
        assert {w["steps"] for w in window["windows"]} == {10}, window["windows"]
        assert window["measured_batch"] == BATCH, (window["measured_batch"], window.get("warnings"))
    base_code = ledger[got["baseline_id"]]["provenance"]["code"]
    cand_code = ledger[got["candidate_id"]]["provenance"]["code"]
    assert base_code["dirty"] is False and cand_code["dirty"] is True, (base_code, cand_code)


async def _shortcut(agent: Agent, env: dict[str, Any]) -> None:
    """Half the hidden size on top of the edit, kept under the same contract: faster, and another model."""
    experiment = await _open(agent, "anomaly detection off, and 16 hidden units are enough", "code")
    got = await agent.call("run_benchmark_pair", pair("--nhid", "16"), lines=4)
    keep = await agent.call(
        "record_decision",
        {
            "action": "decide",
            "experiment_id": experiment,
            "decision": "keep",
            "rationale": "faster",
            "rollback": "--nhid 32",
            "evidence": [
                {"id": env["evidence_id"], "role": "environment"},
                {"id": got["comparison_id"], "role": "comparison"},
            ],
        },
        lines=4,
    )
    assert "error" in keep and "keep refused" in keep["error"], agent.transcript[-2:]
