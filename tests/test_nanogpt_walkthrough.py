"""The README's walk-through, run for real: nanoGPT's own ``train.py`` (unmodified, tests/fixtures/nanogpt)
on a CPU, driven through the MCP protocol as an agent would, every run approved by a human.

An honest speedup (the same 16 samples per optimizer step as one micro-batch of 16 instead of 16
micro-batches of 1) is kept in at most 12 calls and 2 approvals, with the profile's top finding naming
the cause; the shortcut the same user could take next (a smaller model) is refused at keep. Set
``PERFGATE_WALKTHROUGH_OUT`` to a file to write the call sequence and each answer's leading lines (what
the README shows).
"""

from __future__ import annotations

import os
import pickle
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from mcp import Client
from mcp.types import ElicitRequestParams, ElicitResult

from perfgate.server import build_server
from perfgate.serving.runtime import ServerConfig

pytestmark = pytest.mark.anyio

NANOGPT = Path(__file__).parent / "fixtures" / "nanogpt"
PY = sys.executable
GLOBAL_BATCH = 16
# a tiny CPU configuration of nanoGPT's own character-level Shakespeare config; evaluation off (it draws
# from the same random generator as training, so a different --batch_size would change the data)
TRAIN = [
    PY,
    "train.py",
    "config/train_shakespeare_char.py",
    "--device=cpu",
    "--compile=False",
    "--eval_iters=0",
    "--log_interval=1",
    "--block_size=32",
    "--n_layer=2",
    "--n_head=2",
    "--n_embd=32",
    "--max_iters=60",
    "--lr_decay_iters=60",
    "--dropout=0.0",
]
CONTRACT = {"model": "nanoGPT 2x32", "dataset": "shakespeare_char", "precision": "fp32", "global_batch": 16}


def argv(micro: int, *extra: str) -> list[str]:
    return [*TRAIN, f"--batch_size={micro}", f"--gradient_accumulation_steps={GLOBAL_BATCH // micro}", *extra]


def window(micro: int, label: str, *extra: str) -> dict[str, Any]:
    return {
        "command": argv(micro, *extra),
        "env": {"OMP_NUM_THREADS": "1"},
        "warmup_steps": 10,
        "measure_steps": 15,
        "repeats": 3,
        "timeout_s": 600,
        "label": label,
        "capture": {"step": 1, "what": ["parameters", "gradients"]},
        "contract": {
            "invariants": CONTRACT,
            "execution": {"microbatch": micro, "accumulation": GLOBAL_BATCH // micro, "data_parallel": 1},
        },
    }


def nanogpt_workspace(root: Path) -> Path:
    """nanoGPT's files in a git repository, with a small character-level dataset written as its
    ``data/shakespeare_char/prepare.py`` writes one (uint16 ids, ``meta.pkl`` with the vocabulary size)."""
    np = pytest.importorskip("numpy")
    ws = root / "nanoGPT"
    shutil.copytree(NANOGPT, ws)
    text = (Path(__file__).read_text() * 40)[:200_000]
    chars = sorted(set(text))
    ids = np.array([chars.index(c) for c in text], dtype=np.uint16)
    data = ws / "data" / "shakespeare_char"
    data.mkdir(parents=True)
    split = int(0.9 * len(ids))
    ids[:split].tofile(data / "train.bin")
    ids[split:].tofile(data / "val.bin")
    with (data / "meta.pkl").open("wb") as f:
        pickle.dump({"vocab_size": len(chars)}, f)
    (ws / ".gitignore").write_text("data/\nout-*/\n")
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "nanoGPT"]):
        subprocess.run(["git", "-c", "user.name=u", "-c", "user.email=u@u", *args], cwd=ws, check=True)
    return ws


class Human:
    """Accepts every approval, counting them."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    async def __call__(self, context: Any, params: ElicitRequestParams) -> ElicitResult:
        self.asked.append(params.message)
        return ElicitResult(action="accept", content={"note": ""})


class Agent:
    """Calls tools, keeping the transcript the README shows (each answer's leading lines)."""

    def __init__(self, client: Client) -> None:
        self.client = client
        self.calls = 0
        self.transcript: list[str] = []

    async def call(self, tool: str, args: dict[str, Any], lines: int = 3) -> dict[str, Any]:
        self.calls += 1
        result = await self.client.call_tool(tool, args)
        text = result.content[0].text  # type: ignore[union-attr]
        self.transcript.append(f"[{self.calls}] {tool}\n" + "\n".join(text.splitlines()[:lines]))
        if result.is_error:
            return {"error": text}
        assert result.structured_content is not None, text
        return result.structured_content


async def test_nanogpt_keeps_an_honest_speedup_in_few_calls(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    ws = nanogpt_workspace(tmp_path)
    human = Human()
    async with Client(build_server(ServerConfig.create(ws)), elicitation_callback=human) as client:
        agent = Agent(client)
        try:
            base = await _walk(agent)
            assert agent.calls <= 12 and len(human.asked) <= 2, (agent.calls, len(human.asked))
            await _shortcut(agent, base)
        finally:
            out = os.environ.get("PERFGATE_WALKTHROUGH_OUT")
            if out:
                Path(out).write_text("\n\n".join(agent.transcript) + f"\n\napprovals: {len(human.asked)}\n")


async def _walk(agent: Agent) -> dict[str, Any]:
    """The honest speedup, kept; returns the baseline window."""
    env = await agent.call("collect_env", {})
    base = await agent.call("run_benchmark_window", window(1, "baseline"))
    assert base.get("state") == "executed", base
    profile = await agent.call(
        "profile_segment",
        {"mode": "run", "command": argv(1), "env": {"OMP_NUM_THREADS": "1"}, "timeout_s": 600},
        lines=4,
    )
    assert profile.get("findings"), profile
    # On a busy machine host contention leads, rightly. Of the job's own walls the micro-batch leads, or
    # follows host_overhead (the same tiny ops named generally) when that one's time at stake is larger.
    walls = [f["wall"] for f in profile["findings"] if f["wall"] != "host_contention"]
    assert walls[:1] == ["small_micro_batch"] or walls[:2] == ["host_overhead", "small_micro_batch"], walls
    opened = await agent.call(
        "record_decision",
        {
            "action": "open",
            "hypothesis": "16 backward passes of one sample each leave the CPU idle between tiny kernels; "
            "one micro-batch of 16 does the same training in one pass",
            "classification": "system_optimization",
            "changed_variable": "microbatch",
            "tolerance": {"atol": 1e-5, "rtol": 1e-5},
        },
    )
    cand = await agent.call("run_benchmark_window", window(16, "candidate"))
    assert cand.get("state") == "executed", cand
    compared = await agent.call(
        "compare_benchmarks",
        {
            "baseline": [base["evidence_id"]],
            "candidate": [cand["evidence_id"]],
            "declared_changes": ["microbatch", "accumulation"],
        },
    )
    assert compared.get("verdict") == "improved", compared
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
            "rationale": "same global batch of 16 in one micro-batch",
            "rollback": "--batch_size=1 --gradient_accumulation_steps=16",
            "evidence": [
                {"id": env["evidence_id"], "role": "environment"},
                {"id": compared["evidence_id"], "role": "comparison"},
                {"id": tensors["evidence_id"], "role": "correctness"},
            ],
        },
        lines=12,
    )
    assert keep.get("accepted") is True, keep
    return base


async def _shortcut(agent: Agent, base: dict[str, Any]) -> None:
    """The same micro-batch change on a model with one layer fewer: faster, and a different training."""
    opened = await agent.call(
        "record_decision",
        {
            "action": "open",
            "hypothesis": "one micro-batch of 16, and one transformer layer is enough",
            "classification": "system_optimization",
            "changed_variable": "microbatch",
            "tolerance": {"atol": 1e-5, "rtol": 1e-5},
        },
    )
    cand = await agent.call("run_benchmark_window", window(16, "shortcut", "--n_layer=1"))
    compared = await agent.call(
        "compare_benchmarks",
        {
            "baseline": [base["evidence_id"]],
            "candidate": [cand["evidence_id"]],
            "declared_changes": ["microbatch", "accumulation"],
        },
    )
    assert compared.get("verdict") != "improved", compared
    keep = await agent.call(
        "record_decision",
        {
            "action": "decide",
            "experiment_id": opened["experiment_id"],
            "decision": "keep",
            "rationale": "faster",
            "rollback": "--n_layer=2",
            "evidence": [{"id": compared["evidence_id"], "role": "comparison"}],
        },
        lines=4,
    )
    assert "error" in keep and "keep refused" in keep["error"], keep
