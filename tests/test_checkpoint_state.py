"""Issue 57 item 1: checkpoint compatibility, observed.

The harness records what each checkpoint save holds (keys, shapes, dtypes of the object handed to the saver,
read from metadata); the keep's ``checkpoint_resume`` gate compares the baseline's saved state with the
candidate's. Real tiny CPU jobs that save a checkpoint at their end, in a git repository: an honest edit of
the same file (a vectorized loop) is not asked for a resume, whether or not the save ran in the measured
windows; a change that renames modules (the same numbers, the old checkpoint's keys no longer load) is
refused naming the keys, resume or no resume; an edit of the saving line itself still needs a resume.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from mcp import Client

from _trust import any_code_rules, operator_policy
from perfgate.harness.saved_state import MAX_STATE_KEYS, state_schema
from perfgate.server import build_server
from perfgate.serving.runtime import ServerConfig
from test_record_decision import Evidence, _shown_gate, _text

pytestmark = pytest.mark.anyio

PY = sys.executable
CONTRACT = {"invariants": {"model": "mlp", "dataset": "synthetic", "precision": "fp32", "global_batch": 16}}
SCRIPT = """\
import os

import torch


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(8, 16)
        self.fc2 = torch.nn.Linear(16, 1)

    def forward(self, x):
        return self.fc2(torch.tanh(self.fc1(x)))


torch.manual_seed(0)
torch.set_num_threads(1)
model = Net()
opt = torch.optim.Adam(model.parameters(), lr=0.01)
for it in range(12):
    x = torch.randn(16, 8, generator=torch.Generator().manual_seed(it))
    y = torch.stack([x[i, :1] * 2 - x[i, 1:2] for i in range(len(x))])
    loss = torch.nn.functional.mse_loss(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
os.makedirs("ckpt", exist_ok=True)
torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, "ckpt/final.pt")
"""
LOOP = "torch.stack([x[i, :1] * 2 - x[i, 1:2] for i in range(len(x))])"
VECTORIZED = SCRIPT.replace(LOOP, "x[:, :1] * 2 - x[:, 1:2]")
RENAMED = SCRIPT.replace("fc1", "encoder").replace("fc2", "head")
SAVE_EDITED = SCRIPT.replace('"ckpt/final.pt"', '"ckpt/last.pt"')


@pytest.fixture
def ws(workspace: Path) -> Path:
    operator_policy("[execution]\n" + any_code_rules([PY, "train.py"]))
    (workspace / "train.py").write_text(SCRIPT)
    git = ["git", "-C", str(workspace), "-c", "user.name=t", "-c", "user.email=t@example.com"]
    if not (workspace / ".git").exists():
        subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "train.py"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "baseline"], check=True)
    return workspace


async def _window(client: Client, ws: Path, script: str, *, job: bool = True) -> dict[str, Any]:
    """train.py as ``script`` (uncommitted edit of the baseline's commit), one launch."""
    (ws / "train.py").write_text(script)
    result = await client.call_tool(
        "run_benchmark_window",
        {
            "command": [PY, "train.py"],
            "warmup_steps": 2,
            "measure_steps": 4,
            "repeats": 1,
            "job": job,
            "timeout_s": 180,
            "contract": CONTRACT,
        },
    )
    out = result.structured_content
    assert out is not None and out["state"] == "executed", _text(result)
    return out


async def _open(client: Client, changed: str) -> str:
    opened = await client.call_tool(
        "record_decision",
        {
            "action": "open",
            "hypothesis": "h",
            "classification": "system_optimization",
            "changed_variable": changed,
        },
    )
    assert opened.structured_content is not None, _text(opened)
    return opened.structured_content["experiment_id"]


@pytest.mark.timeout(900)
async def test_a_checkpoint_gate_reads_what_the_saves_hold_not_that_the_file_saves(ws: Path) -> None:
    ev = Evidence(ws)
    async with Client(build_server(ServerConfig.create(ws))) as client:
        base = await _window(client, ws, SCRIPT)
        saved = base["saved_states"]
        assert [s["saves"] for s in saved] == [1], saved
        keys = {e[0]: e for e in saved[0]["entries"]}
        assert keys["model.fc1.weight"] == ["model.fc1.weight", [16, 8], "float32"], keys
        assert keys["opt.state.0.exp_avg"][1:] == [[16, 8], "float32"], keys

        async def gate(cand: dict[str, Any], changed: str) -> dict[str, Any]:
            exp = await _open(client, changed)
            comp = ev.comparison([base["evidence_id"]], [cand["evidence_id"]], declared=["code"])
            return await _shown_gate(client, exp, comp, "checkpoint_resume")

        # an honest edit of the file that saves: the same state saved, no changed line saves
        honest = await _window(client, ws, VECTORIZED)
        assert [s["digest"] for s in honest["saved_states"]] == [saved[0]["digest"]]
        got = await gate(honest, "vectorized targets")
        assert got["status"] == "not_applicable", got
        assert "the state it saves is the baseline's" in got["reason"], got
        # measured without the end of the job (no save ran): its changed lines alone decide
        quick = await _window(client, ws, VECTORIZED, job=False)
        assert quick["saved_states"] == [], quick["saved_states"]
        got = await gate(quick, "vectorized targets")
        assert got["status"] == "not_applicable", got

        # renamed modules: the same numbers, but the baseline's checkpoint no longer loads
        renamed = await _window(client, ws, RENAMED)
        got = await gate(renamed, "module names")
        assert got["status"] == "failed", got
        assert "a checkpoint the baseline saved does not load into the candidate strictly" in got["reason"]
        assert (
            "4 missing from the candidate's (model.fc1.bias, model.fc1.weight, model.fc2.bias"
            in got["reason"]
        )
        assert "4 unexpected in the candidate's (model.encoder.bias, model.encoder.weight" in got["reason"]
        assert "same keys" in got["satisfy_with"], got

        # an edit of the saving line itself: the state is the same, the save is not
        edited = await _window(client, ws, SAVE_EDITED)
        got = await gate(edited, "checkpoint path")
        assert got["status"] == "failed", got
        got = await gate(edited, "save location")
        assert got["status"] == "failed", got
        assert (
            "the code change's own lines touch checkpointing: train.py (its changed lines call torch.save)"
            in (got["reason"])
        ), got
        assert "no resume launch" in got["reason"], got


async def test_a_renamed_model_is_refused_even_with_a_resume_of_its_own(ws: Path) -> None:
    """A resume of the candidate's own checkpoint (which loads: it saved the new names) does not pass a
    change whose checkpoints the baseline's no longer feed."""
    ev = Evidence(ws)
    base_state = {
        "digest": "a" * 32,
        "keys": 2,
        "complete": True,
        "saves": 1,
        "entries": [["model.fc1.weight", [16, 8], "float32"], ["model.fc2.weight", [1, 16], "float32"]],
    }
    cand_state = {
        **base_state,
        "digest": "b" * 32,
        "entries": [["model.fc1.weight", [16, 8], "bfloat16"], ["model.head.weight", [1, 16], "float32"]],
    }
    async with Client(build_server(ServerConfig.create(ws))) as client:
        exp = await _open(client, "tensor_parallel")
        base = ev.window(saved_states=[base_state])
        cand = ev.window(saved_states=[cand_state])
        comp = ev.comparison([base], [cand], declared=["tensor_parallel"])
        ev.add(
            "run_benchmark_window",
            "executed",
            {
                "checkpoint_resume": {
                    "status": "passed",
                    "reason": "resumed from ckpt/step8.pt (saved at step 8)",
                }
            },
            {"command": ["python", "train.py", "--resume", "ckpt/step8.pt"], "job": True, "resume_of": cand},
        )
        got = await _shown_gate(client, exp, comp, "checkpoint_resume")
    assert got["status"] == "failed", got
    assert (
        "1 missing from the candidate's (model.fc2.weight); 1 unexpected in the candidate's (model.head.weight); "
        "1 of another shape or dtype (model.fc1.weight)"
    ) in got["reason"], got


def test_the_saved_state_is_read_from_metadata_and_bounded() -> None:
    torch = pytest.importorskip("torch")
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    schema = state_schema({"model": model, "opt": opt, "epoch": 3, "names": ["a", "b"]})
    entries = {e[0]: e[1:] for e in schema["entries"]}
    assert entries["model.weight"] == [[2, 3], "float32"] and entries["epoch"] == [None, "value"]
    assert entries["names"] == [[2], "values"] and entries["opt.param_groups.0.params"] == [[2], "values"]
    assert schema["complete"] and schema["keys"] == len(schema["entries"])
    # the digest covers the layout, not the values
    assert (
        state_schema({"model": torch.nn.Linear(3, 2), "opt": opt, "epoch": 9, "names": ["c", "d"]})["digest"]
        == schema["digest"]
    )
    assert (
        state_schema({"model": torch.nn.Linear(3, 4)})["digest"] != state_schema({"model": model})["digest"]
    )
    big = state_schema({f"k{i}": torch.zeros(1) for i in range(MAX_STATE_KEYS + 5)})
    assert big["keys"] == MAX_STATE_KEYS + 5 and len(big["entries"]) == MAX_STATE_KEYS
