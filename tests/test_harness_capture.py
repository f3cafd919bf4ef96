"""Tensor capture by the harness at a chosen step, with no edit to the training script, on real tiny CPU
training runs (torch) through run_benchmark_window; and compute_mfu on that run's CPU, measured by the real
matmul probe, with no device typed."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from mcp import Client
from pydantic import ValidationError

import perfgate.tools
from _trust import any_code_rules, operator_policy
from perfgate.server import build_server
from perfgate.serving.runtime import ServerConfig
from perfgate.tools import compare_tensors, compute_mfu, run_benchmark_window
from perfgate.tools.run_benchmark_window_models import RunBenchmarkWindowInput

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

PY = sys.executable
# A training script in the usual shape: it knows nothing of perfgate unless --self-dump asks it to write,
# with dump_tensors and the names the capture documents, what the harness captures by itself.
SCRIPT = """
import argparse
import torch
from torch import nn

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=12)
p.add_argument("--self-dump", type=int, default=0)
args = p.parse_args()
torch.manual_seed(0)
torch.set_num_threads(1)
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
x, y = torch.randn(64, 8), torch.randn(64, 1)
for it in range(args.steps):
    i = it % 8
    loss = nn.functional.mse_loss(model(x[i * 8 : i * 8 + 8]), y[i * 8 : i * 8 + 8])
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    if it + 1 == args.self_dump:
        from perfgate.harness import dump_tensors

        named = list(model.named_parameters())
        mapping = dict(named)
        mapping.update({f"grad/{n}": q.grad for n, q in named})
        names = {id(q): n for n, q in named}
        for group in opt.param_groups:
            for q in group["params"]:
                for key, value in opt.state[q].items():
                    mapping[f"optimizer/{names[id(q)]}/{key}"] = value
        dump_tensors("self/{label}.safetensors", mapping)
"""
CONTRACT = {
    "invariants": {"model": "mlp", "dataset": "synthetic", "precision": "fp32", "global_batch": 8},
    "execution": {"microbatch": 8, "accumulation": 1, "world_size": 1},
}
ALL = ["parameters", "gradients", "optimizer_state"]


@pytest.fixture(autouse=True)
def registry(monkeypatch: pytest.MonkeyPatch) -> None:
    wanted = (run_benchmark_window.SPEC, compare_tensors.SPEC, compute_mfu.SPEC)
    specs = [s for s in wanted if s not in perfgate.tools.REGISTRY]
    monkeypatch.setattr(perfgate.tools, "REGISTRY", (*perfgate.tools.REGISTRY, *specs))


@pytest.fixture
def allowed(workspace: Path) -> Path:
    (workspace / "train.py").write_text(SCRIPT)
    operator_policy("[execution]\n" + any_code_rules([PY, "-m", "perfgate.harness"], [PY, "train.py"]))
    return workspace


async def _call(client: Client, tool: str, args: dict[str, Any]) -> dict[str, Any]:
    result = await client.call_tool(tool, args)
    assert not result.is_error, result.content[0].text  # type: ignore[union-attr]
    assert result.structured_content is not None
    return result.structured_content


def _window(steps: int, capture: dict[str, Any], *extra: str, warmup: int = 5) -> dict[str, Any]:
    return {
        "command": [PY, "train.py", "--steps", str(steps), *extra],
        "warmup_steps": warmup,
        "measure_steps": 4,
        "repeats": 1,
        "timeout_s": 120,
        "contract": CONTRACT,
        "label": "baseline",
        "capture": capture,
    }


async def test_the_harness_captures_at_a_step_what_the_script_would_dump_bit_for_bit(allowed: Path) -> None:
    async with Client(build_server(ServerConfig.create(allowed))) as client:
        out = await _call(
            client, "run_benchmark_window", _window(12, {"step": 3, "what": ALL}, "--self-dump", "3")
        )
        assert out["state"] == "executed", out["failure_reason"]
        dumps = {d["path"]: d for d in out["tensor_dumps"]}
        capture = f"captures/baseline-{out['launch_ids'][0]}.safetensors"  # the default names the launch
        assert set(dumps) == {capture, "self/baseline.safetensors"}
        own, script = dumps[capture], dumps["self/baseline.safetensors"]
        # bound to this launch like the script's own dump, at the same step, outside the window
        assert own["launch"] == script["launch"] == 0 and own["step"] == script["step"] == 3
        assert own["digest"] == script["digest"] and own["size_bytes"] == script["size_bytes"]
        assert (allowed / own["path"]).read_bytes() == (allowed / script["path"]).read_bytes()
        assert not any("discarded" in w for w in out["warnings"]), out["warnings"]
        assert out["windows_measured"] == 1

        check = await _call(
            client,
            "compare_tensors",
            {"reference": own["path"], "candidate": script["path"], "atol": 0.0, "rtol": 0.0},
        )
        assert check["state"] == "passed"
        assert {p["evidence_id"] for p in check["producers"]} == {out["evidence_id"]}

        # MFU of the same run on this CPU: the device, threads and precision come from the run
        mfu = await _call(
            client,
            "compute_mfu",
            {
                "buckets": [{"name": "mlp", "window_id": out["evidence_id"], "flops_per_step": 6 * 8 * 161}],
                "flops_kind": "model",
            },
        )
    assert mfu["state"] == "executed" and mfu["peak_basis"] == "measured"
    assert mfu["precision"] == "fp32" and mfu["device"].startswith("cpu")
    assert mfu["peak_tflops"] > 0 and 0 < mfu["utilization"] < 1
    assert mfu["peak_source"].startswith("measured on this machine by perfgate, ")
    assert "float32" in mfu["peak_source"] and "1 threads" in mfu["peak_source"]  # the run's torch threads


async def test_a_capture_inside_a_window_discards_it_as_dump_tensors_does(allowed: Path) -> None:
    async with Client(build_server(ServerConfig.create(allowed))) as client:
        out = await _call(client, "run_benchmark_window", _window(30, {"step": 4}, warmup=3))
    assert out["state"] == "executed", out["failure_reason"]
    (dump,) = out["tensor_dumps"]
    assert dump["step"] == 4 and dump["path"] == f"captures/baseline-{dump['launch_id']}.safetensors"
    assert any(
        "dump_tensors ran inside window 0 at step 4" in w and "discarded" in w for w in out["warnings"]
    )


async def test_what_the_harness_cannot_find_is_said_not_guessed(allowed: Path) -> None:
    # no nn.Module: the optimizer steps a bare tensor, so parameters have no module to be named by
    (allowed / "bare.py").write_text(
        "import torch\n"
        "w = torch.zeros(4, requires_grad=True)\n"
        "opt = torch.optim.Adam([w], lr=0.1)\n"
        "for _ in range(12):\n"
        "    opt.zero_grad()\n"
        "    ((w - 1.0) ** 2).sum().backward()\n"
        "    opt.step()\n"
    )
    operator_policy("[execution]\n" + any_code_rules([PY, "-m", "perfgate.harness"], [PY, "bare.py"]))
    args = {**_window(12, {"step": 2}), "command": [PY, "bare.py"]}
    async with Client(build_server(ServerConfig.create(allowed))) as client:
        out = await _call(client, "run_benchmark_window", args)
        assert out["tensor_dumps"] == []
        assert any(
            "tensor capture at step 2 wrote nothing" in w and "dump_tensors" in w for w in out["warnings"]
        )
        assert any("capture at step 2 wrote no file in launch(es) 0" in w for w in out["warnings"])
        # the optimizer's state needs no module: it is captured under the parameter's place in the optimizer
        args["capture"] = {"step": 2, "what": ["optimizer_state"], "path": "opt-{label}.safetensors"}
        out = await _call(client, "run_benchmark_window", args)
    (dump,) = out["tensor_dumps"]
    raw = (allowed / dump["path"]).read_bytes()
    names = set(json.loads(raw[8 : 8 + int.from_bytes(raw[:8], "little")]))
    assert names == {
        "optimizer/group0.param0/exp_avg",
        "optimizer/group0.param0/exp_avg_sq",
        "optimizer/group0.param0/step",
    }


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"timing": "explicit"}, "capture needs timing='harness'"),
        ({"capture": {"step": 9}}, "never reached"),
        ({"capture": {"step": 2, "path": "../outside.safetensors"}}, "without '..'"),
        ({"capture": {"step": 2, "path": "/tmp/x.safetensors"}}, "relative to cwd"),
        ({"capture": {"step": 2, "what": []}}, "at least 1"),
        ({"capture": {"step": 2, "what": ["activations"]}}, "parameters"),
        ({"capture": {"step": 0}}, "greater than or equal to 1"),
    ],
)
def test_captures_that_cannot_happen_or_would_write_outside_are_refused(
    change: dict[str, Any], message: str
) -> None:
    args = {
        "command": [PY, "train.py"],
        "warmup_steps": 5,
        "measure_steps": 4,
        "capture": {"step": 2},
        **change,
    }
    with pytest.raises(ValidationError, match=message):
        RunBenchmarkWindowInput.model_validate(args)
