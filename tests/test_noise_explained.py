"""Issue 46 item 3: noise that explains itself.

When a comparison cannot tell, its answer says which runs were noisy and why (threads over-subscribing the
free CPUs, neighbours, a host whose speed moved) and gives the next calls that settle it, with the thread
count to pin. perfgate's own server and supervisors are never counted as neighbours.

The over-subscribed case is run for real: a torch script at torch's thread count from ``OMP_NUM_THREADS=4``
on this machine's CPUs, one micro-batch split into four against one micro-batch of the same global batch.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
from mcp import Client

from _trust import any_code_rules, operator_policy
from perfgate.benchmarking.comparing.compare import Comparison
from perfgate.benchmarking.comparing.noise import explain_noise, oversubscription, pinned_threads
from perfgate.server import build_server
from perfgate.serving.runtime import ServerConfig
from perfgate.traces.diagnosis.hostload import _perfgate_service

pytestmark = pytest.mark.anyio

PY = sys.executable


def _record(
    rid: str,
    threads: int,
    ranks: int = 1,
    other: float = 0.0,
    speeds: list[float] | None = None,
    **inputs: Any,
) -> Any:
    load = {"measured": True, "cpus": 2, "other_cpus": other, "other_share": other / 2, "job_cpus": 1.0}
    return SimpleNamespace(
        id=rid,
        inputs=inputs,
        result={
            "environment_fingerprint": {"num_threads": str(threads)},
            "world_size": ranks,
            "host_load": [load, load],
            "launch_host_speed": speeds or [1.0, 1.0],
        },
    )


def _comparison(verdict: str = "within_noise", speedup: float = 1.2) -> Comparison:
    return cast(
        "Comparison",
        SimpleNamespace(verdict=verdict, speedup=speedup, baseline_launches=2, candidate_launches=2),
    )


def test_threads_beyond_the_free_cpus_are_named_with_the_count_to_pin() -> None:
    over = _record("ev-a", threads=4, other=1.0)
    assert oversubscription(over) == (1, 4, 1.0, 2)
    assert oversubscription(_record("ev-b", threads=1)) is None
    assert oversubscription(_record("ev-c", threads=4, launcher="slurm")) is None  # ranks on other nodes
    assert pinned_threads(1.0, 1) == 1 and pinned_threads(8.0, 2) == 4
    lines = explain_noise(
        [over], [_record("ev-d", threads=1)], _comparison(), ([1.0, 1.3], [1.2, 1.25]), "A B B A"
    )
    assert any(
        line.startswith(
            "over-subscribed: baseline ev-a ran 1 rank(s) x 4 torch threads on 1.0 free of 2 CPUs"
        )
        for line in lines
    )
    assert any(line.startswith("neighbours: baseline ev-a launch(es) 0, 1") for line in lines)
    assert lines[0].startswith("spread: baseline launches up to 13% from their median")
    assert (
        lines[-1]
        == 'next: pin threads on both sides (env {"OMP_NUM_THREADS": "1"} in every call), then A B B A'
    )
    # the over-subscribed calls are not reused: the next calls run with other threads, all of them afresh
    again = explain_noise(
        [over],
        [_record("ev-d", threads=1)],
        _comparison(),
        ([1.0, 1.3], [1.2, 1.25]),
        "B A",
        afresh="A B B A",
    )
    assert again[-1] == lines[-1]


def test_a_host_whose_speed_moved_between_launches_is_named() -> None:
    moved = _record("ev-a", threads=1, speeds=[1.0, 1.3])
    lines = explain_noise(
        [moved],
        [_record("ev-b", threads=1)],
        _comparison(),
        ([1.0, 1.1], [1.1, 1.2]),
        "B A",
        afresh="A B B A",
    )
    assert any(line.startswith("host speed: a fixed CPU probe ran 1.30x faster") for line in lines)
    assert lines[-1] == "next: B A"  # a drift question: the calls made are reused


def test_a_comparison_that_could_tell_needs_no_explanation() -> None:
    assert (
        explain_noise([_record("a", 4)], [_record("b", 4)], _comparison("improved"), ([1.0], [2.0]), "x")
        == []
    )


def test_perfgate_servers_and_supervisors_are_not_neighbours() -> None:
    code = "import time; time.sleep(30)"
    procs = [
        subprocess.Popen([PY, "-c", code, "perfgate", "serve"]),
        subprocess.Popen([PY, "-c", code, "-m", "perfgate.execution.detached", "/tmp/x"]),
        subprocess.Popen([PY, "-c", code, "train.py"]),
    ]
    try:
        time.sleep(0.2)
        assert [_perfgate_service(p.pid) for p in procs] == [True, True, False]
        assert not _perfgate_service(os.getpid())
    finally:
        for p in procs:
            p.kill()
            p.wait()


TRAIN = """\
import argparse

import torch
from perfgate.harness import Window

p = argparse.ArgumentParser()
p.add_argument("--microbatch", type=int, default=64)
p.add_argument("--accumulation", type=int, default=1)
args = p.parse_args()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 256))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x = torch.randn(args.microbatch * args.accumulation, 256)
window = Window()
for step in range(60):
    with window.step(samples=args.microbatch * args.accumulation):
        for part in x.split(args.microbatch):
            model(part).square().mean().backward()
        opt.step()
        opt.zero_grad()
window.close()
"""


def _window(split: int, threads: str) -> dict[str, Any]:
    return {
        "command": [PY, "train.py", "--microbatch", str(64 // split), "--accumulation", str(split)],
        "env": {"OMP_NUM_THREADS": threads},
        "timing": "explicit",
        "warmup_steps": 5,
        "measure_steps": 20,
        "repeats": 3,
        "timeout_s": 300,
        "contract": {
            "invariants": {
                "model": "mlp 256-512-256",
                "data": "synthetic",
                "precision": "fp32",
                "global_batch": 64,
            },
            "execution": {"microbatch": 64 // split, "accumulation": split, "world_size": 1},
        },
    }


async def _compare(client: Client, base: list[str], cand: list[str]) -> dict[str, Any]:
    result = await client.call_tool(
        "compare_benchmarks",
        {"baseline": base, "candidate": cand, "declared_changes": ["microbatch", "accumulation"]},
    )
    assert not result.is_error, result.content
    assert result.structured_content is not None
    return result.structured_content


async def _run(client: Client, args: dict[str, Any]) -> str:
    result = await client.call_tool("run_benchmark_window", args)
    assert not result.is_error, result.content
    out = result.structured_content
    assert out is not None and out["state"] == "executed", out
    return str(out["evidence_id"])


async def test_an_over_subscribed_comparison_gets_a_verdict_or_the_call_that_leads_to_one(
    workspace: Path,
) -> None:
    pytest.importorskip("torch")
    (workspace / "train.py").write_text(TRAIN)
    operator_policy(
        '[execution]\nallow_env = ["PERFGATE_*", "OMP_NUM_THREADS"]\n' + any_code_rules([PY, "train.py"])
    )
    cpus = len(os.sched_getaffinity(0))
    async with Client(build_server(ServerConfig.create(workspace))) as client:
        base = await _run(client, _window(4, str(2 * cpus)))
        cand = await _run(client, _window(1, str(2 * cpus)))
        compared = await _compare(client, [base], [cand])
        if compared["verdict"] == "improved":
            return  # a clear verdict even over-subscribed
        assert compared["verdict"] == "within_noise", compared
        noise = compared["noise"]
        assert noise and noise[-1].startswith("next: "), noise
        if '"OMP_NUM_THREADS": "' in noise[-1]:
            assert any(line.startswith("over-subscribed:") for line in noise), noise
            pin = noise[-1].split('"OMP_NUM_THREADS": "', 1)[1].split('"', 1)[0]
            assert 1 <= int(pin) <= cpus
        else:
            # torch may cap its threads at the CPUs (torch 2.13 reports 2 under OMP_NUM_THREADS=4 on 2 CPUs):
            # then nothing was over-subscribed, and the next step is the interleaved calls alone
            assert not any(line.startswith("over-subscribed:") for line in noise), noise
            pin = str(cpus)
        # the next step: the same calls with the threads pinned, interleaved A B B A
        b1 = await _run(client, {**_window(4, pin), "repeats": 3})
        c1 = await _run(client, {**_window(1, pin), "repeats": 3})
        c2 = await _run(client, {**_window(1, pin), "repeats": 3})
        b2 = await _run(client, {**_window(4, pin), "repeats": 3})
        settled = await _compare(client, [b1, b2], [c1, c2])
        assert settled["verdict"] == "improved", settled
