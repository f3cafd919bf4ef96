"""Issue 48 item 2, beyond step 0: a tensor check of what the training does not compute (the batch, a frozen
embedding table, a copy of the initial weights under parameter names) carries no keep at any step, whatever
the keys are called; a check of what it computes (parameters after an update, under any name, or the loss)
does, with no extra call. On real tiny CPU training runs through the protocol."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
from mcp import Client

import perfgate.tools
from _trust import any_code_rules, operator_policy
from perfgate.server import build_server
from perfgate.serving.runtime import ServerConfig
from perfgate.tools import compare_tensors, run_benchmark_window
from test_record_decision import Evidence, _text

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

PY = sys.executable
STEP = 3
SCRIPT = f"""
import torch
from torch import nn
from perfgate.harness import dump_tensors

torch.manual_seed(0)
torch.set_num_threads(1)


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(16, 8)
        self.emb.weight.requires_grad_(False)  # a frozen table: the same in every run
        self.fc = nn.Linear(8, 1)

    def forward(self, ids):
        return self.fc(self.emb(ids))


model = Model()
opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1)
init = {{n: p.detach().clone() for n, p in model.named_parameters()}}
ids, y = torch.randint(0, 16, (64,)), torch.randn(64, 1)
for it in range(12):
    b = slice((it % 8) * 8, (it % 8) * 8 + 8)
    loss = nn.functional.mse_loss(model(ids[b]), y[b])
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    if it + 1 == {STEP}:
        for what, mapping in {{
            "batch": {{"input_ids": ids[b], "labels": y[b]}},
            "frozen": {{"emb.weight": model.emb.weight}},
            "init": {{"fc.weight": init["fc.weight"], "fc.bias": init["fc.bias"]}},  # named like parameters
            "renamed": {{"a": model.fc.weight.detach().numpy().copy(), "b": model.fc.bias.detach().numpy().copy()}},
            "loss": {{"objective": loss.detach()}},
        }}.items():
            dump_tensors("d/{{label}}-" + what + ".safetensors", mapping)
"""
CONTRACT = {
    "invariants": {"model": "emb-fc", "dataset": "synthetic", "precision": "fp32", "global_batch": 8},
    "execution": {"microbatch": 8, "accumulation": 1, "world_size": 1},
}
CAPTURE = {"step": 1, "what": ["parameters", "gradients"]}
CHEATS = ("batch", "frozen", "init")


@pytest.fixture(autouse=True)
def registry(monkeypatch: pytest.MonkeyPatch) -> None:
    wanted = (run_benchmark_window.SPEC, compare_tensors.SPEC)
    specs = [s for s in wanted if s not in perfgate.tools.REGISTRY]
    monkeypatch.setattr(perfgate.tools, "REGISTRY", (*perfgate.tools.REGISTRY, *specs))


async def _call(client: Client, tool: str, args: dict[str, Any]) -> dict[str, Any]:
    result = await client.call_tool(tool, args)
    assert not result.is_error, _text(result)
    assert result.structured_content is not None
    return result.structured_content


async def _run(client: Client, label: str) -> dict[str, Any]:
    out = await _call(
        client,
        "run_benchmark_window",
        {
            "command": [PY, "train.py"],
            "warmup_steps": 5,
            "measure_steps": 4,
            "repeats": 1,
            "timeout_s": 120,
            "contract": CONTRACT,
            "label": label,
            "capture": CAPTURE,
        },
    )
    assert out["state"] == "executed", out["failure_reason"]
    return out


async def _correctness(client: Client, exp: str, comparison: str, what: str) -> dict[str, Any]:
    """The correctness gate as `show` evaluates it with a check of the two runs' ``what`` dumps attached."""
    check = await _call(
        client,
        "compare_tensors",
        {
            "reference": f"d/base-{what}.safetensors",
            "candidate": f"d/cand-{what}.safetensors",
            "experiment_id": exp,
        },
    )
    assert check["status"] == "match", check  # the same seeds: every one of these matches bit for bit
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
    return next(g for g in shown["gates"] if g["name"] == "correctness")


async def test_a_check_of_tensors_the_training_does_not_compute_is_refused_at_any_step(
    workspace: Path,
) -> None:
    (workspace / "train.py").write_text(SCRIPT)
    operator_policy("[execution]\n" + any_code_rules([PY, "-m", "perfgate.harness"], [PY, "train.py"]))
    ev = Evidence(workspace)
    async with Client(build_server(ServerConfig.create(workspace))) as client:
        base = await _run(client, "base")
        exp = (
            await _call(
                client,
                "record_decision",
                {
                    "action": "open",
                    "hypothesis": "one thread is enough",
                    "classification": "system_optimization",
                    "changed_variable": "workers",
                    "tolerance": {"atol": 0.0, "rtol": 0.0},
                },
            )
        )["experiment_id"]
        cand = await _run(client, "cand")
        comp = ev.comparison([base["evidence_id"]], [cand["evidence_id"]], declared=["workers"])

        # what the harness told of each dump, by value: nothing computed in the cheats' files
        told = {Path(d["path"]).name: d for d in cand["tensor_dumps"]}
        assert told["cand-batch.safetensors"]["computed"] == {"none": 2}
        assert told["cand-frozen.safetensors"]["computed"] == {"none": 1}
        assert told["cand-init.safetensors"]["computed"] == {"none": 2}
        assert told["cand-renamed.safetensors"]["computed"] == {"parameter": 2}
        assert told["cand-loss.safetensors"]["computed"] == {"loss": 1}
        # the capture writes the frozen table too (every named parameter): counted as nothing computed
        capture = {
            side: next(d["path"] for d in run["tensor_dumps"] if d["path"].startswith("captures/"))
            for side, run in (("base", base), ("cand", cand))
        }
        assert told[Path(capture["cand"]).name]["computed"] == {"parameter": 2, "gradient": 2, "none": 1}
        assert {d["step"] for d in cand["tensor_dumps"]} == {1, STEP}

        for what in CHEATS:
            gate = await _correctness(client, exp, comp, what)
            assert gate["status"] == "failed", (what, gate)
            assert "compares tensors the training does not compute" in gate["reason"], gate
            assert f"d/cand-{what}.safetensors (step {STEP})" in gate["reason"]
            assert gate["satisfy_with"].startswith(
                "run_benchmark_window(..., capture={'step': 1, 'what': ['parameters', 'gradients']})"
            ), gate
            assert "compare_tensors(reference=<baseline capture>" in gate["satisfy_with"]

        # what the training computes carries the check: parameters under any name, the loss
        for what in ("renamed", "loss"):
            gate = await _correctness(client, exp, comp, what)
            assert gate["status"] == "passed", (what, gate)

        # the next step the refusal names, already taken by these runs: the harness's own capture
        check = await _call(
            client,
            "compare_tensors",
            {
                "reference": capture["base"],
                "candidate": capture["cand"],
                "experiment_id": exp,
            },
        )
        shown = await _call(
            client,
            "record_decision",
            {
                "action": "show",
                "experiment_id": exp,
                "evidence": [
                    {"id": comp, "role": "comparison"},
                    {"id": check["evidence_id"], "role": "correctness"},
                ],
            },
        )
        gate = next(g for g in shown["gates"] if g["name"] == "correctness")
        assert gate["status"] == "passed", gate
