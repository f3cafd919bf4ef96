"""Tensor files are bound to the launched runs that dumped them: a copied, swapped or stale file cannot
carry a keep (through the protocol, on real harness launches)."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path
from typing import Any

import pytest
from mcp import Client

from _trust import any_code_rules, operator_policy
from perfgate.server import build_server
from perfgate.serving.runtime import ServerConfig
from test_record_decision import Evidence, _text

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

PY = sys.executable
SCRIPT = """
import argparse, time
import numpy as np
from perfgate.harness import Window, dump_tensors

p = argparse.ArgumentParser()
p.add_argument("--scale", type=float, default=1.0)
p.add_argument("--out", required=True)
p.add_argument("--before-update", action="store_true", help="dump before the first step")
p.add_argument("--key", default="w")
args = p.parse_args()
window = Window()
tensors = {args.key: np.arange(16, dtype=np.float32) * args.scale, "loss": np.ones(1, np.float32)}
if args.before_update:
    dump_tensors(args.out, tensors)
for step in range(8):
    with window.step(samples=4):
        time.sleep(0.002)
    if step == 0 and not args.before_update:  # after the first update, in the warm-up
        dump_tensors(args.out, tensors)
window.close()
"""
CONTRACT = {
    "invariants": {"model": "m", "dataset": "d", "precision": "fp32", "global_batch": 4},
    "execution": {"workers": 0, "microbatch": 4, "accumulation": 1, "world_size": 1},
}


async def _call(client: Client, tool: str, args: dict[str, Any]) -> dict[str, Any]:
    result = await client.call_tool(tool, args)
    assert not result.is_error, _text(result)
    assert result.structured_content is not None
    return result.structured_content


async def _window(client: Client, scale: float, out: str, *extra: str) -> dict[str, Any]:
    return await _call(
        client,
        "run_benchmark_window",
        {
            "command": [PY, "train.py", "--scale", str(scale), "--out", out, *extra],
            "timing": "explicit",
            "warmup_steps": 2,
            "measure_steps": 4,
            "repeats": 1,
            "timeout_s": 120,
            "contract": CONTRACT,
        },
    )


async def _correctness(
    client: Client, exp: str, comparison: str, reference: str, candidate: str
) -> dict[str, Any]:
    """The correctness gate as `show` evaluates it with this tensor check attached (nothing recorded)."""
    check = await _call(
        client, "compare_tensors", {"reference": reference, "candidate": candidate, "atol": 0.0, "rtol": 0.0}
    )
    shown = await _call(
        client,
        "record_decision",
        {
            "action": "show",
            "experiment_id": exp,
            "evidence": [
                {"id": comparison, "role": "comparison"},
                {"id": check["evidence_id"], "role": "correctness"},
            ],
        },
    )
    gate = next(g for g in shown["gates"] if g["name"] == "correctness")
    return {"check": check, "gate": gate}


async def test_only_each_sides_own_dump_carries_correctness(workspace: Path) -> None:
    (workspace / "train.py").write_text(SCRIPT)
    operator_policy("[execution]\n" + any_code_rules([PY, "-m", "perfgate.harness"], [PY, "train.py"]))
    ev = Evidence(workspace)
    async with Client(build_server(ServerConfig.create(workspace))) as client:
        base = await _window(client, 1.0, "ref.safetensors")
        early = await _window(client, 1.0, "early.safetensors")  # the candidate's command, before open
        assert [d["path"] for d in base["tensor_dumps"]] == ["ref.safetensors"]
        assert base["tensor_dumps"][0]["launch"] == 0
        exp = (
            await _call(
                client,
                "record_decision",
                {
                    "action": "open",
                    "hypothesis": "h",
                    "classification": "system_optimization",
                    "changed_variable": "workers",
                },
            )
        )["experiment_id"]
        cand = await _window(client, 1.0, "cand.safetensors")  # a bit-exact change: identical bytes
        broken = await _window(client, 2.0, "broken.safetensors")  # a change that alters the numbers
        comp = ev.comparison([base["evidence_id"]], [cand["evidence_id"]], declared=["workers"])
        comp_broken = ev.comparison([base["evidence_id"]], [broken["evidence_id"]], declared=["workers"])

        honest = await _correctness(client, exp, comp, "ref.safetensors", "cand.safetensors")
        assert honest["gate"]["status"] == "passed", honest["gate"]
        producers = {p["role"]: p["evidence_id"] for p in honest["check"]["producers"]}
        assert producers == {"reference": base["evidence_id"], "candidate": cand["evidence_id"]}

        # a copy of the baseline's dump presented as the candidate's: identical bytes, no producer
        shutil.copyfile(workspace / "ref.safetensors", workspace / "copy.safetensors")
        copied = await _correctness(client, exp, comp, "ref.safetensors", "copy.safetensors")
        assert copied["check"]["status"] == "match"
        assert copied["gate"]["status"] == "failed"
        assert "the candidate file copy.safetensors is unbound" in copied["gate"]["reason"]
        assert "perfgate.harness.dump_tensors" in copied["gate"]["reason"]

        # the broken candidate's own dump overwritten with the baseline's bytes: unbound, not the candidate's
        shutil.copyfile(workspace / "ref.safetensors", workspace / "broken.safetensors")
        swapped = await _correctness(client, exp, comp_broken, "ref.safetensors", "broken.safetensors")
        assert swapped["check"]["status"] == "match"
        assert "the candidate file broken.safetensors is unbound" in swapped["gate"]["reason"]

        # a dump from before the experiment was opened, not from the compared candidate windows
        stale = await _correctness(client, exp, comp, "ref.safetensors", "early.safetensors")
        reason = stale["gate"]["reason"]
        assert stale["gate"]["status"] == "failed"
        assert f"produced by {early['evidence_id']}, before the experiment was opened" in reason
        assert "not one of the comparison's candidate windows" in reason

        # the sides swapped: the candidate's dump as the reference
        reversed_ = await _correctness(client, exp, comp, "cand.safetensors", "ref.safetensors")
        assert "the reference file comes from" in reversed_["gate"]["reason"]


async def test_a_dump_from_before_the_first_update_proves_nothing_unless_it_holds_gradients(
    workspace: Path,
) -> None:
    """Issue 48 item 2: weights written before any optimizer step are the initial weights on both sides."""
    (workspace / "train.py").write_text(SCRIPT)
    operator_policy("[execution]\n" + any_code_rules([PY, "-m", "perfgate.harness"], [PY, "train.py"]))
    ev = Evidence(workspace)
    async with Client(build_server(ServerConfig.create(workspace))) as client:
        base = await _window(client, 1.0, "ref.safetensors", "--before-update")
        assert base["tensor_dumps"][0]["step"] == 0
        exp = (
            await _call(
                client,
                "record_decision",
                {
                    "action": "open",
                    "hypothesis": "h",
                    "classification": "system_optimization",
                    "changed_variable": "workers",
                },
            )
        )["experiment_id"]
        cand = await _window(client, 1.0, "cand.safetensors", "--before-update")
        comp = ev.comparison([base["evidence_id"]], [cand["evidence_id"]], declared=["workers"])
        early = await _correctness(client, exp, comp, "ref.safetensors", "cand.safetensors")
        assert early["check"]["status"] == "match" and early["gate"]["status"] == "failed"
        assert "written before the first optimizer update (step 0)" in early["gate"]["reason"]
        assert "capture={'step': 1, 'what': ['parameters', 'gradients']}" in early["gate"]["reason"]

        # the same moment, but gradients: filled by the training's own backward, so they count
        base_g = await _window(client, 1.0, "ref_g.safetensors", "--before-update", "--key", "grad/w")
        cand_g = await _window(client, 1.0, "cand_g.safetensors", "--before-update", "--key", "grad/w")
        comp_g = ev.comparison([base_g["evidence_id"]], [cand_g["evidence_id"]], declared=["workers"])
        grads = await _correctness(client, exp, comp_g, "ref_g.safetensors", "cand_g.safetensors")
        assert grads["gate"]["status"] == "passed", grads["gate"]
