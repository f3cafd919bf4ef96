"""A new user on another real repository: minGPT's own character-level ``projects/chargpt/chargpt.py``
(unmodified, tests/fixtures/mingpt) on a CPU, driven through the MCP protocol, every run approved by a human.

A tiny model on a CPU spends its step in many small ops. minGPT writes its attention (matmul, scale, mask,
softmax, matmul) and its tanh-GELU (seven elementwise ops) out by hand; PyTorch's fused
``F.scaled_dot_product_attention(is_causal=True)`` and ``F.gelu(approximate="tanh")`` compute the same
functions in one op each (dropout is off in this configuration, so no random stream changes). That edit
is kept as an equivalent speedup (1.2-1.9x per launch); on top of it, the shortcuts the same user could
take next (a smaller model, fewer samples per step) are refused at keep, each as a training change.

On a busy host the first comparison may not tell (``within_noise``); the user then does what its answer's
``next:`` line says (two more calls, the candidate's then the baseline's, the code switched with git stash
between them, so the calls already made bracket them: A B B A) and compares again. Either way the keep
takes at most 12 calls and 2 approval prompts: going back to the baseline's code reuses its approval. Set
``PERFGATE_MINGPT_INTERLEAVE=1`` to take the interleaved path whatever the first verdict.
"""

from __future__ import annotations

import os
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


@pytest.mark.timeout(
    1200
)  # 10 launches, up to 6 more interleaved, 4 for the shortcuts: 4-6 min on a quiet host
async def test_mingpt_user_keeps_the_fused_ops_and_shortcuts_are_refused(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("numpy")
    ws = mingpt_workspace(tmp_path)
    human = Human()
    async with Client(build_server(ServerConfig.create(ws)), elicitation_callback=human) as client:
        agent = Agent(client)
        env = await agent.call("collect_env", {})
        base = await agent.call("run_benchmark_window", window(False, "baseline"))
        assert base.get("state") == "executed", base
        noisy = await _keep_fused(agent, ws, base, env)
        # the keep, even through the interleaved re-run, in at most 12 calls and 2 approval prompts: the
        # baseline's code, back in place for its second call, is the code the human already approved
        assert agent.calls <= 12 and len(human.asked) <= 2, (agent.calls, human.asked)
        await _shortcut(agent, base, env, "one transformer layer is enough", "--model.n_layer=1")
        await _shortcut(agent, base, env, "half the samples per step", "--trainer.batch_size=8")
    if noisy:
        pytest.skip(f"the host was too noisy to tell the fused ops apart, even interleaved: {noisy}")


def _git(ws: Path, *args: str) -> None:
    subprocess.run(["git", "-c", "user.name=u", "-c", "user.email=u@u", *args], cwd=ws, check=True)


async def _keep_fused(agent: Agent, ws: Path, base: dict[str, Any], env: dict[str, Any]) -> list[str]:
    """The honest edit, kept: compared (again, interleaved, when the first comparison cannot tell), its
    captured parameters and gradients compared at the experiment's tolerance, then the keep. Returns the
    comparison's noise lines when even the interleaved comparison could not tell (nothing is kept then)."""
    opened = await agent.call(
        "record_decision",
        {
            "action": "open",
            "hypothesis": "minGPT's hand-written attention and GELU run as many tiny ops; the fused ops compute "
            "the same functions in one op each",
            "classification": "system_optimization",
            "changed_variable": "attention_backend and fused_kernels",
            "tolerance": {"atol": 1e-5, "rtol": 1e-5},
        },
    )
    fuse(ws)
    cand = await agent.call("run_benchmark_window", window(True, "fused"))
    assert cand.get("state") == "executed", cand
    compared = await agent.call("compare_benchmarks", comparison([base], [cand]), lines=6)
    if compared.get("verdict") == "within_noise" or os.environ.get("PERFGATE_MINGPT_INTERLEAVE") == "1":
        if compared.get("verdict") == "within_noise":
            # what the answer says to do next: the candidate's call, then the baseline's with its code in place
            nxt = compared["noise"][-1]
            assert nxt.startswith("next: ") and "git stash" in nxt, compared["noise"]
            assert (
                f"run_benchmark_window(the inputs of {cand['evidence_id']}, repeats=3), then "
                f"run_benchmark_window(the inputs of {base['evidence_id']}, repeats=3)"
            ) in nxt, nxt
        c2 = await agent.call("run_benchmark_window", {**window(True, "fused"), "repeats": 3})
        _git(ws, "stash")
        b2 = await agent.call("run_benchmark_window", {**window(False, "baseline"), "repeats": 3})
        _git(ws, "stash", "pop")
        compared = await agent.call("compare_benchmarks", comparison([base, b2], [cand, c2]), lines=6)
    if compared.get("verdict") != "improved":
        # a host this busy cannot tell even interleaved: the answer must say why and what settles it
        assert compared.get("verdict") == "within_noise" and compared["noise"][-1].startswith("next: "), (
            compared
        )
        return list(compared["noise"])
    tensors = await agent.call(
        "compare_tensors",
        {
            "reference": base["tensor_dumps"][0]["path"],
            "candidate": cand["tensor_dumps"][0]["path"],
            "atol": 1e-5,
            "rtol": 1e-5,
        },
    )
    assert tensors.get("status") == "match", tensors
    keep = await agent.call(
        "record_decision",
        {
            "action": "decide",
            "experiment_id": opened["experiment_id"],
            "decision": "keep",
            "rationale": "the same attention and GELU in one fused op each",
            "rollback": "git checkout mingpt/model.py",
            "evidence": [
                {"id": env["evidence_id"], "role": "environment"},
                {"id": compared["evidence_id"], "role": "comparison"},
                {"id": tensors["evidence_id"], "role": "correctness"},
            ],
        },
        lines=12,
    )
    assert keep.get("accepted") is True, keep
    return []


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
    # two launches: enough for the comparison to name the training change the keep refuses
    cand = await agent.call("run_benchmark_window", {**window(True, "shortcut", change), "repeats": 2})
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
