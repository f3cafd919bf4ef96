"""The real-repository path (issue 47): launch ids are 1, 2, 3 ... per workspace; a profiled run leaves no
tensor files; the profile and the windows read the same fingerprint; the job's last line prints."""

from __future__ import annotations

import json
import os
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from mcp import Client

from _trust import operator_policy
from perfgate.benchmarking.errors import BenchmarkError
from perfgate.benchmarking.windows.launch import launch_env
from perfgate.evidence import Ledger
from perfgate.execution.launches import COUNTER_FILE, launch_variables, next_launch_id
from perfgate.harness import samples
from perfgate.server import build_server
from perfgate.serving.runtime import ServerConfig

PY = sys.executable


def test_launch_ids_count_up_per_workspace_and_stay_unique_under_concurrency(tmp_path: Path) -> None:
    ws_a, ws_b = tmp_path / "a", tmp_path / "b"
    assert [next_launch_id(ws_a) for _ in range(3)] == [1, 2, 3]
    assert next_launch_id(ws_b) == 1  # another workspace counts on its own
    got: list[int] = []

    def draw() -> None:
        for _ in range(25):
            got.append(next_launch_id(ws_a))

    threads = [threading.Thread(target=draw) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(got) == list(range(4, 104))
    (ws_a / COUNTER_FILE).write_text("garbage")  # a counter that cannot be read starts over, never below 1
    assert next_launch_id(ws_a) == 1


def test_the_harness_keeps_the_id_the_server_gave_and_only_that(monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in launch_variables(7).items():
        monkeypatch.setenv(key, value)
    assert samples.start_launch() == 7 and os.environ[samples.LAUNCH_ENV] == "7"
    assert samples.GIVEN_ENV not in os.environ  # a harnessed process this one starts draws its own
    assert samples.start_launch() > 10**15  # an inherited id without the marker is not reused
    monkeypatch.setenv(samples.LAUNCH_ENV, "-3")
    monkeypatch.setenv(samples.GIVEN_ENV, "1")
    assert samples.start_launch() > 10**15  # nor a marked one that is not a positive integer


def test_the_agent_cannot_choose_a_launch_id(tmp_path: Path) -> None:
    for key in ("PERFGATE_LAUNCH_ID", "PERFGATE_LAUNCH_GIVEN"):
        with pytest.raises(BenchmarkError, match=f"env sets {key}: perfgate numbers each launch itself"):
            launch_env({key: "1"}, tmp_path, None)


TRAIN = """
import torch
from perfgate.harness import dump_tensors

torch.manual_seed(0)
torch.set_num_threads(1)  # the script's own set-up, in main, as nanoGPT's does
torch.set_float32_matmul_precision("high")
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
X, Y = torch.randn(8, 16), torch.randn(8, 1)
dump_tensors("captures/{label}-{launch}.safetensors", {k: v.detach() for k, v in model.state_dict().items()})
for it in range(100000):
    loss = torch.nn.functional.mse_loss(model(X), Y)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    print(f"iter {it}: loss {loss.item():.4f}", flush=True)
"""
SAME = ("num_threads", "matmul_precision", "allow_tf32", "interop_threads", "OMP_NUM_THREADS")


async def _call(client: Client, tool: str, args: dict[str, Any]) -> dict[str, Any]:
    result = await client.call_tool(tool, args)
    assert not result.is_error, result.content
    assert result.structured_content is not None
    return result.structured_content


@pytest.mark.slow
@pytest.mark.anyio
async def test_a_real_repository_run_numbers_launches_leaves_no_strays_and_agrees_on_its_fingerprint(
    workspace: Path,
) -> None:
    pytest.importorskip("torch")
    (workspace / "train.py").write_text(TRAIN)
    operator_policy(f'[execution]\n[[execution.allow]]\nscript = "train.py"\ncode = "any"\nargv = ["{PY}"]\n')
    before = {"train.py", ".perfgate"}  # perfgate writes only under .perfgate/ (and the trust root)
    async with Client(build_server(ServerConfig.create(workspace))) as client:
        profile = await _call(
            client,
            "profile_segment",
            {
                "mode": "run",
                "command": [PY, "train.py"],
                "skip_first": 1,
                "warmup": 1,
                "active": 2,
                "timeout_s": 300,
            },
        )
        assert profile["state"] == "executed", profile["failure_reason"]
        # a profiled run writes no tensor file: no unlabelled-*.safetensors, nothing new in the workspace
        assert not (workspace / "captures").exists()
        assert set(os.listdir(workspace)) == before
        windows = await _call(
            client,
            "run_benchmark_window",
            {
                "command": [PY, "train.py"],
                "label": "base",
                "warmup_steps": 2,
                "measure_steps": 4,
                "repeats": 2,
                "timeout_s": 300,
                "contract": {
                    "invariants": {"model": "mlp", "global_batch": 8},
                    "execution": {"world_size": 1},
                },
            },
        )
    assert windows["state"] == "executed", windows["failure_reason"]
    # each launch's {launch} is the workspace's next small integer, one file per launch
    names = sorted(os.listdir(workspace / "captures"))
    ids = sorted(int(n.removeprefix("base-").removesuffix(".safetensors")) for n in names)
    assert len(ids) == 2 and ids[1] == ids[0] + 1 and 1 <= ids[0] <= 10, names
    assert set(os.listdir(workspace)) == before | {"captures"}
    # the same fingerprint where the script set it up, profiled or timed
    prof_fp, win_fp = profile["environment_fingerprint"], windows["environment_fingerprint"]
    assert prof_fp["num_threads"] == "1" and prof_fp["matmul_precision"] == "high"
    assert {k: prof_fp.get(k) for k in SAME} == {k: win_fp.get(k) for k in SAME}
    # the job's own line of its last recorded step printed; the next step's did not run
    art = Ledger(workspace).artifact_dir(windows["evidence_id"])
    record = json.loads((art / "launch0_rank0.json").read_text())
    last = record["steps"]["count"] - 1
    stdout = (art / "launch0_stdout.log").read_text()
    assert f"iter {last}: loss" in stdout and f"iter {last + 1}: loss" not in stdout, stdout[-500:]
