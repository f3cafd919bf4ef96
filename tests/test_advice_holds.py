"""Issue 57 item 6: advice that holds.

- The noise hint never undoes the declared change: where the thread count is what the sides compare
  (declared under any spelling, or a difference between them), it pins no thread count and says so.
- Re-runs never overwrite earlier captures: a baseline, candidate, baseline re-run sequence leaves a file
  per launch, each named in its window's answer with the number that is in its name, whether the path
  names ``{launch}`` or not.
- Refusals read as English and name their evidence: a failed window is named as failed (not as a
  ``step_time_source`` difference), and samples the model received are counted as samples.
"""

from __future__ import annotations

import hashlib
import re
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
from mcp import Client

from _trust import operator_policy
from perfgate.benchmarking.comparing.compare import Comparison
from perfgate.benchmarking.comparing.differences import Difference
from perfgate.benchmarking.comparing.noise import explain_noise, thread_change
from perfgate.server import build_server
from perfgate.serving.runtime import ServerConfig

PY = sys.executable


def _over(rid: str) -> Any:
    """A window record that ran 4 torch threads on the 1 CPU its neighbours left free."""
    load = {"measured": True, "cpus": 2, "other_cpus": 1.0, "other_share": 0.5, "job_cpus": 1.0}
    return SimpleNamespace(
        id=rid,
        inputs={},
        result={
            "environment_fingerprint": {"num_threads": "4"},
            "world_size": 1,
            "host_load": [load, load],
            "launch_host_speed": [1.0, 1.0],
        },
    )


def _hint(declared: list[str], differences: list[Difference] | None = None) -> str:
    comparison = cast("Comparison", SimpleNamespace(verdict="within_noise", speedup=1.2))
    lines = explain_noise(
        [_over("ev-a")],
        [_over("ev-b")],
        comparison,
        ([1.0, 1.3], [1.2, 1.25]),
        "A B B A",
        thread_change(declared, differences or []),
    )
    return lines[-1]


@pytest.mark.parametrize(
    "declared",
    [
        ["threads"],
        ["OMP_NUM_THREADS"],
        ["env:OMP_NUM_THREADS"],
        ["num_threads"],
        ["--num-threads"],
        ["intra_op_threads"],
        ["env:MKL_NUM_THREADS"],
        ["microbatch", "threads"],
    ],
)
def test_a_declared_thread_change_is_never_pinned_away(declared: list[str]) -> None:
    hint = _hint(declared)
    assert 'OMP_NUM_THREADS": ' not in hint and "pin threads" not in hint, hint
    assert hint.startswith("next: keep each side's own thread count (")
    assert "is the declared change: pinning it would undo the change" in hint
    assert "at least 4 CPUs free" in hint and hint.endswith("then A B B A")


def test_a_thread_difference_between_the_sides_is_not_pinned_even_when_declared_otherwise() -> None:
    differs = Difference("env.OMP_NUM_THREADS", "env", "1", "4", "declared_execution", "")
    hint = _hint(["torch_threads"], [differs])
    assert "pin threads" not in hint and "env.OMP_NUM_THREADS differs between the sides" in hint
    fingerprint = Difference("measured.num_threads", "measured", "1", "4", "declared_execution", "")
    assert "pin threads" not in _hint([], [fingerprint])


@pytest.mark.parametrize("declared", [["num_workers"], ["microbatch", "accumulation"], ["compile"], []])
def test_another_declared_change_gets_the_threads_pinned_and_keeps_its_own_setting(
    declared: list[str],
) -> None:
    hint = _hint(declared)
    assert (
        hint == 'next: pin threads on both sides (env {"OMP_NUM_THREADS": "1"} in every call), then A B B A'
    )
    for name in declared:
        assert name not in hint


TRAIN = """
import sys
import torch
from perfgate.harness import dump_tensors

if "--crash" in sys.argv:
    raise SystemExit("crashed on purpose")
torch.manual_seed(0)
torch.set_num_threads(1)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
opt = torch.optim.SGD(model.parameters(), lr=1e-2)
X, Y = torch.randn(8, 16), torch.randn(8, 1)
for it in range(100000):
    loss = torch.nn.functional.mse_loss(model(X), Y)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    if it == 0:
        dump_tensors("captures/{label}.safetensors", {k: v.detach() for k, v in model.state_dict().items()})
"""


def _args(label: str, *extra: str) -> dict[str, Any]:
    return {
        "command": [PY, "train.py", *extra],
        "label": label,
        "warmup_steps": 2,
        "measure_steps": 4,
        "repeats": 2,
        "timeout_s": 300,
        "capture": {"step": 1},
        "contract": {"invariants": {"model": "mlp", "global_batch": 8}, "execution": {"world_size": 1}},
    }


async def _call(client: Client, tool: str, args: dict[str, Any]) -> dict[str, Any]:
    result = await client.call_tool(tool, args)
    assert not result.is_error, result.content
    assert result.structured_content is not None
    return result.structured_content


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.slow
@pytest.mark.anyio
async def test_a_baseline_re_run_leaves_every_earlier_capture_as_it_was(workspace: Path) -> None:
    pytest.importorskip("torch")
    (workspace / "train.py").write_text(TRAIN)
    operator_policy(f'[execution]\n[[execution.allow]]\nscript = "train.py"\ncode = "any"\nargv = ["{PY}"]\n')
    async with Client(build_server(ServerConfig.create(workspace))) as client:
        first = await _call(client, "run_benchmark_window", _args("baseline"))
        assert first["state"] == "executed", first["failure_reason"]
        kept = {d["path"]: _sha(workspace / d["path"]) for d in first["tensor_dumps"]}
        cand = await _call(client, "run_benchmark_window", _args("candidate"))
        again = await _call(client, "run_benchmark_window", _args("baseline"))
        crashed = await _call(client, "run_benchmark_window", {**_args("candidate", "--crash"), "repeats": 1})
        compared = await _call(
            client,
            "compare_benchmarks",
            {"baseline": [first["evidence_id"]], "candidate": [cand["evidence_id"]]},
        )
        refused = await _call(
            client,
            "compare_benchmarks",
            {"baseline": [first["evidence_id"]], "candidate": [crashed["evidence_id"]]},
        )

    runs = [first, cand, again]
    names: list[str] = []
    for run in runs:
        assert run["state"] == "executed", run["failure_reason"]
        # per launch: the harness's capture ({label}-{launch}) and the script's own dump, each a file of its own
        assert len(run["tensor_dumps"]) == 4, run["tensor_dumps"]
        for d in run["tensor_dumps"]:
            assert d["launch_id"] == run["launch_ids"][d["launch"]]
            assert (workspace / d["path"]).exists()
            names.append(d["path"])
        captures = sorted(
            d["path"] for d in run["tensor_dumps"] if re.search(r"-\d+\.safetensors$", d["path"])
        )
        assert captures == sorted(f"captures/{run['label']}-{i}.safetensors" for i in run["launch_ids"])
    assert len(names) == len(set(names)) == 12  # nothing written twice: every launch kept its own files
    # the script's fixed path kept its first launch's file; later launches wrote beside it, numbered, and said so
    own = sorted(d["path"] for d in again["tensor_dumps"] if not re.search(r"-\d+\.safetensors$", d["path"]))
    assert own == [f"captures/baseline-launch{i}.safetensors" for i in again["launch_ids"]], own
    assert any("holds an earlier launch's file, so this launch wrote" in w for w in again["warnings"])
    assert {p: _sha(workspace / p) for p in kept} == kept
    assert "captures/baseline.safetensors" in kept

    # samples that reached the model are samples: no "no samples or tokens were recorded" warning
    assert compared["unit"] == "samples", compared
    assert not any("no samples or tokens" in w for w in compared["warnings"])
    # a side whose window failed is named as failed, never as a step timer that differs
    assert crashed["state"] == "failed"
    reasons = refused["reasons"]
    assert any(
        r.startswith(f"candidate window {crashed['evidence_id']} failed, so it has no step timing to compare")
        for r in reasons
    ), reasons
    assert not any("step_time_source" in r for r in reasons), reasons
