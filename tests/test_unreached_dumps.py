"""A dump_tensors call the harness never let the script reach is named in the window's warnings (through the
protocol, on real harness launches of a tiny torch loop)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
from mcp import Client

from _trust import any_code_rules, operator_policy
from perfgate.benchmarking.runs.dumps import dump_call_lines
from perfgate.server import build_server
from perfgate.serving.runtime import ServerConfig

pytestmark = pytest.mark.anyio

PY = sys.executable
SCRIPT = """
import torch
from perfgate.harness import dump_tensors

torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x = torch.randn(8, 4)
for step in range(1000):
    loss = model(x).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    if EARLY and step == 0:
        dump_tensors("early.safetensors", {"w": model.weight.detach()})
dump_tensors("late.safetensors", {"w": model.weight.detach()})
"""
CONTRACT = {
    "invariants": {"model": "linear", "dataset": "randn", "precision": "fp32", "global_batch": 8},
    "execution": {"microbatch": 8, "accumulation": 1, "world_size": 1},
}


async def _window(client: Client, script: str, **more: Any) -> dict[str, Any]:
    result = await client.call_tool(
        "run_benchmark_window",
        {
            **more,
            "command": [PY, script],
            "warmup_steps": 2,
            "measure_steps": 3,
            "repeats": 1,
            "timeout_s": 120,
            "contract": CONTRACT,
        },
    )
    assert not result.is_error, result.content[0].text  # type: ignore[union-attr]
    assert result.structured_content is not None
    return result.structured_content


def test_call_sites_come_from_the_syntax_tree_not_from_comments_or_strings() -> None:
    source = (
        "import perfgate.harness as h\n# dump_tensors(x)\ns = 'dump_tensors()'\nh.dump_tensors('a', {})\n"
    )
    assert dump_call_lines(source) == [4]
    assert dump_call_lines("def broken(:\n dump_tensors()") == []


async def test_a_dump_after_the_last_window_is_named_with_where_to_move_it(workspace: Path) -> None:
    (workspace / "late.py").write_text(SCRIPT.replace("EARLY", "False"))
    (workspace / "early.py").write_text(SCRIPT.replace("EARLY", "True"))
    rules = ([PY, "-m", "perfgate.harness"], [PY, "late.py"], [PY, "early.py"])
    operator_policy("[execution]\n" + any_code_rules(*rules))
    async with Client(build_server(ServerConfig.create(workspace))) as client:
        late = await _window(client, "late.py")
        early = await _window(client, "early.py")
    assert late["state"] == "executed" and late["tensor_dumps"] == []
    (warning,) = [w for w in late["warnings"] if "dump_tensors" in w]
    assert "late.py:16" in warning and "before optimizer step 2" in warning
    assert not (workspace / "late.safetensors").exists()
    # a dump in the warm-up is reached and recorded, and nothing is said of the unreached one
    assert [d["path"] for d in early["tensor_dumps"]] == ["early.safetensors"]
    assert not [w for w in early["warnings"] if "dump_tensors" in w]


async def test_each_labelled_run_dumps_to_a_file_of_its_own(workspace: Path) -> None:
    """One line of code, two runs, two files: {label} and {rank} in the path are filled in by the harness."""
    script = SCRIPT.replace('"early.safetensors"', '"captures/{label}-r{rank}.safetensors"')
    (workspace / "labelled.py").write_text(script.replace("EARLY", "True"))
    operator_policy("[execution]\n" + any_code_rules([PY, "labelled.py"]))
    async with Client(build_server(ServerConfig.create(workspace))) as client:
        base = await _window(client, "labelled.py", label="base line/1")
        cand = await _window(client, "labelled.py", label="candidate")
    assert [d["path"] for d in base["tensor_dumps"]] == ["captures/base_line_1-r0.safetensors"]
    assert [d["path"] for d in cand["tensor_dumps"]] == ["captures/candidate-r0.safetensors"]
    assert (workspace / "captures" / "base_line_1-r0.safetensors").is_file()


async def test_a_global_batch_declared_alone_is_held_to_the_batch_the_run_measures(workspace: Path) -> None:
    """The contract no longer asks for microbatch and data_parallel beside global_batch: the run itself
    refuses a global_batch its model did not see (8 samples reach it per step, 16 are declared)."""
    (workspace / "plain.py").write_text(SCRIPT.replace("EARLY", "False"))
    operator_policy("[execution]\n" + any_code_rules([PY, "plain.py"]))
    contract = {
        "invariants": {"model": "linear", "dataset": "randn", "precision": "fp32", "global_batch": 16}
    }
    async with Client(build_server(ServerConfig.create(workspace))) as client:
        result = await client.call_tool(
            "run_benchmark_window",
            {
                "command": [PY, "plain.py"],
                "warmup_steps": 2,
                "measure_steps": 3,
                "repeats": 1,
                "contract": contract,
            },
        )
    out = result.structured_content
    assert out is not None and out["measured_batch"] == 8
    assert out["state"] == "failed"
    assert any("declares global_batch 16 but the ranks processed 8" in p for p in out["contract_problems"])
