"""A new user on another real repository: minGPT's own character-level ``projects/chargpt/chargpt.py``
(unmodified, tests/fixtures/mingpt) on a CPU, driven through the MCP protocol, every run approved by a human.

A tiny model on a CPU spends its step in many small ops. minGPT writes its attention (matmul, scale, mask,
softmax, matmul) and its tanh-GELU (seven elementwise ops) out by hand; PyTorch's fused
``F.scaled_dot_product_attention(is_causal=True)`` and ``F.gelu(approximate="tanh")`` compute the same
functions in one op each (dropout is off in this configuration, so no random stream changes). On top of
that edit, the shortcuts the same user could take next (a smaller model, fewer samples per step) are
refused at keep, each as a training change.

The edit alone (1.2-1.9x per launch) is not asserted kept: on a busy 2-core host its comparison is often
``within_noise`` once the host's measured speed trend between the sides widens the interval.
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

MINGPT = Path(__file__).parent / "fixtures" / "mingpt"
PY = sys.executable
# a tiny CPU configuration through chargpt's own CfgNode overrides (``--section.key=value``)
TRAIN = [
    PY,
    "projects/chargpt/chargpt.py",
    "--trainer.device=cpu",
    "--model.model_type=None",
    "--model.n_layer=2",
    "--model.n_head=2",
    "--model.n_embd=32",
    "--data.block_size=32",
    "--trainer.batch_size=16",
    "--trainer.num_workers=0",
    "--trainer.max_iters=60",
    "--model.embd_pdrop=0.0",
    "--model.resid_pdrop=0.0",
    "--model.attn_pdrop=0.0",
]
ENV = {"OMP_NUM_THREADS": "1", "PYTHONPATH": "."}
CONTRACT = {"model": "minGPT 2x32", "dataset": "chargpt input.txt", "precision": "fp32", "global_batch": 16}


# the edit: minGPT's hand-written attention and GELU replaced by PyTorch's fused ops (same functions)
HAND_ATTENTION = """        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(self.bias[:,:,:T,:T] == 0, float('-inf'))
        att = F.softmax(att, dim=-1)
        att = self.attn_dropout(att)
        y = att @ v"""
FUSED_ATTENTION = "        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)"
HAND_GELU = "0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))"
FUSED_GELU = "F.gelu(x, approximate='tanh')"


def fuse(ws: Path) -> None:
    model = ws / "mingpt" / "model.py"
    text = model.read_text()
    assert HAND_ATTENTION in text and HAND_GELU in text
    model.write_text(text.replace(HAND_ATTENTION, FUSED_ATTENTION).replace(HAND_GELU, FUSED_GELU))


def argv(*extra: str) -> list[str]:
    return [*TRAIN, *extra]


def window(fused: bool, label: str, *extra: str) -> dict[str, Any]:
    return {
        "command": argv(*extra),
        "env": ENV,
        "warmup_steps": 10,
        "measure_steps": 15,
        "repeats": 5,
        "timeout_s": 600,
        "label": label,
        "capture": {"step": 1, "what": ["parameters", "gradients"]},
        "contract": {
            "invariants": CONTRACT,
            "execution": {
                "attention_backend": "sdpa" if fused else "minGPT",
                "fused_kernels": "gelu" if fused else "none",
                "microbatch": 16,
                "data_parallel": 1,
            },
        },
    }


def comparison(bases: list[dict[str, Any]], cands: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "baseline": [b["evidence_id"] for b in bases],
        "candidate": [c["evidence_id"] for c in cands],
        "declared_changes": ["code", "attention_backend", "fused_kernels"],
    }


def mingpt_workspace(root: Path) -> Path:
    """minGPT's files in a git repository, with the ``input.txt`` chargpt reads: any text holding the
    characters of the prompt chargpt samples from at iteration 0 ("O God, O God!")."""
    ws = root / "minGPT"
    shutil.copytree(MINGPT, ws)
    (ws / "input.txt").write_text(("O God, O God!\n" + Path(__file__).read_text()) * 40)
    (ws / ".gitignore").write_text("input.txt\nout/\n__pycache__/\n")
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "minGPT"]):
        subprocess.run(["git", "-c", "user.name=u", "-c", "user.email=u@u", *args], cwd=ws, check=True)
    return ws


async def test_mingpt_user_shortcuts_are_refused_at_keep(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("numpy")
    ws = mingpt_workspace(tmp_path)
    async with Client(build_server(ServerConfig.create(ws)), elicitation_callback=Human()) as client:
        agent = Agent(client)
        env = await agent.call("collect_env", {})
        base = await agent.call("run_benchmark_window", window(False, "baseline"))
        assert base.get("state") == "executed", base
        fuse(ws)
        await _shortcut(agent, base, env, "one transformer layer is enough", "--model.n_layer=1")
        await _shortcut(agent, base, env, "half the samples per step", "--trainer.batch_size=8")


async def _shortcut(agent: Agent, base: dict[str, Any], env: dict[str, Any], why: str, change: str) -> None:
    """A training change on top of the kept edit, declared as the kept kind of change."""
    opened = await agent.call(
        "record_decision",
        {
            "action": "open",
            "hypothesis": f"fused attention, and {why}",
            "classification": "system_optimization",
            "changed_variable": "attention_backend",
            "tolerance": {"atol": 1e-5, "rtol": 1e-5},
        },
    )
    cand = await agent.call("run_benchmark_window", window(True, "shortcut", change))
    compared = await agent.call("compare_benchmarks", comparison([base], [cand]), lines=6)
    keep = await agent.call(
        "record_decision",
        {
            "action": "decide",
            "experiment_id": opened["experiment_id"],
            "decision": "keep",
            "rationale": "faster",
            "rollback": "git checkout mingpt/model.py",
            "evidence": [
                {"id": env["evidence_id"], "role": "environment"},
                {"id": compared["evidence_id"], "role": "comparison"},
            ],
        },
        lines=4,
    )
    assert "error" in keep and "keep refused" in keep["error"], keep
    assert compared.get("verdict") != "improved" or "training_change" in keep["error"], (compared, keep)
    assert "training_change" in str(compared.get("reasons")) + keep["error"], (compared, keep)
