"""A third public repository, with a loop unlike nanoGPT's and minGPT's: pytorch/examples'
``word_language_model`` (unmodified, tests/fixtures/word_language_model). Its loop has no optimizer object
(``p.data.add_(p.grad, alpha=-lr)`` after gradient clipping) and feeds an ``nn.LSTM`` sequence-first
``(bptt, batch)`` inputs. Measured as a user would, through the MCP protocol on a CPU: the steps are the
hand-written updates, the batch is the columns (dimension 1), and the launch stops after its windows
instead of training whole epochs.
"""

from __future__ import annotations

import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from mcp import Client

from perfgate.server import build_server
from perfgate.serving.runtime import ServerConfig
from test_nanogpt_walkthrough import Agent, Human

pytestmark = pytest.mark.anyio

SOURCE = Path(__file__).parent / "fixtures" / "word_language_model"
BATCH = 8
BPTT = 16
EPOCH_BATCHES = 400
"""Batches in one epoch of the corpus written below: far more than a window needs, so a launch that trained
its whole epoch (the harness finding no step) would show as steps the windows never asked for."""


def _workspace(root: Path) -> Path:
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
    (ws / ".gitignore").write_text("data/\n*.pt\n__pycache__/\n")
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "word_language_model"]):
        subprocess.run(["git", "-c", "user.name=u", "-c", "user.email=u@u", *args], cwd=ws, check=True)
    return ws


@pytest.mark.timeout(900)
async def test_a_hand_updated_sequence_first_lstm_is_measured_step_by_step(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    ws = _workspace(tmp_path)
    human = Human()
    command = [
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
    async with Client(build_server(ServerConfig.create(ws)), elicitation_callback=human) as client:
        agent = Agent(client)
        window = await agent.call(
            "run_benchmark_window",
            {
                "command": command,
                "env": {"OMP_NUM_THREADS": "1"},
                "warmup_steps": 5,
                "measure_steps": 10,
                "repeats": 1,
                "timeout_s": 600,
                "contract": {
                    "invariants": {
                        "model": "LSTM 2x32",
                        "dataset": "synthetic words",
                        "precision": "fp32",
                        "global_batch": BATCH,
                    },
                    "execution": {"batch_first": False},
                },
            },
            lines=8,
        )
    assert window.get("state") == "executed", agent.transcript[-1]
    assert window["windows_measured"] == 1 and window["windows"][0]["steps"] == 10, window["windows"]
    # the batch is the LSTM's, read from dimension 1 of its (bptt, batch) input, not the sequence length
    assert window["measured_batch"] == BATCH, (window["measured_batch"], window.get("warnings"))
    assert len(human.asked) <= 1
