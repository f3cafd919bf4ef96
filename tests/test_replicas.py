"""Issue 48 item 3: a data-parallel run proves its replicas agree.

A real two-rank gloo job under torchrun, each rank reading its own shard (DistributedSampler): synced on
every step, the ranks hold bit-identical parameters after the last measured update; a candidate that syncs
its gradients only every fourth step (DDP's ``no_sync`` in between, so each rank applies its own gradient)
drifts apart, and the keep's ``replicas`` gate refuses it with no extra call. The check itself is then
exercised on records built by hand.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path
from typing import Any

import pytest
from mcp import Client

from _ports import free_port
from _trust import any_code_rules, operator_policy
from perfgate.benchmarking.runs.replicas import replica_check
from perfgate.server import build_server
from perfgate.serving.runtime import ServerConfig
from test_record_decision import Evidence, _text
from test_timing_corroboration import _record

pytestmark = pytest.mark.anyio

PY = sys.executable
SCRIPT = """
import argparse
import contextlib

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

p = argparse.ArgumentParser()
p.add_argument("--sync-every", type=int, default=1)
args = p.parse_args()
torch.manual_seed(0)
torch.set_num_threads(1)
dist.init_process_group("gloo")
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(16, 4))
data = TensorDataset(torch.randn(4096, 16), torch.randn(4096, 4))
loader = DataLoader(data, batch_size=16, sampler=DistributedSampler(data, shuffle=True, seed=0))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
for step, (x, y) in zip(range(40), loader):
    skip = (step + 1) % args.sync_every != 0
    with model.no_sync() if skip else contextlib.nullcontext():
        torch.nn.functional.mse_loss(model(x), y).backward()
    opt.step()
    opt.zero_grad()
dist.destroy_process_group()
"""
CONTRACT = {
    "invariants": {"model": "linear 16-4", "dataset": "synthetic", "precision": "fp32", "global_batch": 32},
    "execution": {"microbatch": 16, "accumulation": 1, "data_parallel": 2, "world_size": 2},
}


async def _window(client: Client, torchrun: str, sync_every: int) -> dict[str, Any]:
    args = {
        "command": [
            *(torchrun, "--nproc-per-node", "2", "--master-port", str(free_port())),
            *("train.py", "--sync-every", str(sync_every)),
        ],
        "warmup_steps": 4,
        "measure_steps": 8,
        "repeats": 1,
        "timeout_s": 300,
        "contract": CONTRACT,
    }
    result = await client.call_tool("run_benchmark_window", args)
    assert not result.is_error, _text(result)
    out = result.structured_content
    assert out is not None and out["state"] == "executed", out
    return out


async def test_replicas_that_drift_apart_refuse_the_keep(workspace: Path) -> None:
    torchrun = shutil.which("torchrun", path=str(Path(PY).parent))
    if torchrun is None:
        pytest.skip("torchrun is not installed next to this interpreter")
    (workspace / "train.py").write_text(SCRIPT)
    operator_policy("[execution]\n" + any_code_rules([torchrun]))
    ev = Evidence(workspace)
    async with Client(build_server(ServerConfig.create(workspace))) as client:
        base = await _window(client, torchrun, 1)
        assert [c["status"] for c in base["replicas"]] == ["agree"], base["replicas"]
        opened = await client.call_tool(
            "record_decision",
            {
                "action": "open",
                "hypothesis": "sync less",
                "classification": "system_optimization",
                "changed_variable": "workers",
            },
        )
        exp = opened.structured_content["experiment_id"]  # type: ignore[index]
        cand = await _window(client, torchrun, 4)
        (check,) = cand["replicas"]
        assert check["status"] == "disagree" and check["groups"] == [[0], [1]], check
        assert cand["warnings"][0].startswith("launch 0: the replicas differ after the last measured update")

        shown = {}
        for side in (base, cand):
            comp = ev.comparison([base["evidence_id"]], [side["evidence_id"]], declared=["workers"])
            result = await client.call_tool(
                "record_decision",
                {"action": "show", "experiment_id": exp, "evidence": [{"id": comp, "role": "comparison"}]},
            )
            assert result.structured_content is not None, _text(result)
            shown[side["evidence_id"]] = next(
                g for g in result.structured_content["gates"] if g["name"] == "replicas"
            )
    assert shown[base["evidence_id"]]["status"] == "passed"
    refused = shown[cand["evidence_id"]]
    assert refused["status"] == "failed" and "drifted apart" in refused["reason"], refused
    assert "gradient all-reduce on every step" in refused["satisfy_with"]


def _with(digests: list[str | None], structure: str = "0" * 32) -> list[Any]:
    """One record per rank whose last window holds ``digests[rank]``."""
    import msgspec

    from perfgate.benchmarking.reading.records import ModelRecord

    model = ModelRecord(name="m", parameters=1, trainable_parameters=1, structure=structure)
    out = []
    for rank, digest in enumerate(digests):
        r = _record([10.0] * 12, first=4, steps=4)
        window = msgspec.structs.replace(r.windows[0], replica_digest=digest)
        out.append(
            msgspec.structs.replace(r, rank=rank, world_size=len(digests), windows=[window], model=model)
        )
    return out


def test_the_replica_check_compares_only_ranks_that_hold_replicas() -> None:
    a, b = "a" * 32, "b" * 32
    assert replica_check(0, _with([a, a]), {}).status == "agree"
    assert replica_check(0, _with([a, a, b]), {}).groups == [[0, 1], [2]]
    assert replica_check(0, _with([a]), {}).status == "not_applicable"
    assert replica_check(0, _with([a, b]), {"tensor_parallel": 2}).status == "not_applicable"
    assert replica_check(0, _with([a, b]), {"fsdp": True}).status == "not_applicable"
    assert replica_check(0, _with([a, None]), {}).status == "unavailable"
