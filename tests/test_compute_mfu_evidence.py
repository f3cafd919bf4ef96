"""compute_mfu from evidence ids through the MCP protocol: an imported window and an estimate_flops record."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
from mcp import Client

from perfgate.evidence import EvidenceDraft, EvidenceState, Ledger
from perfgate.server import build_server
from perfgate.serving.runtime import ServerConfig

pytestmark = pytest.mark.anyio

LOG = Path(__file__).parent / "fixtures" / "logs" / "megatron_8rank.log"
GPT: dict[str, Any] = {
    "layers": 12,
    "hidden_size": 768,
    "ffn_hidden_size": 3072,
    "num_attention_heads": 12,
    "vocab_size": 50304,
    "swiglu": False,
}


async def _calls(workspace: Path, calls: list[tuple[str, dict[str, Any]]]) -> list[Any]:
    out: list[Any] = []
    async with Client(build_server(ServerConfig.create(workspace))) as client:
        for tool, args in calls:
            out.append(await client.call_tool(tool, args))
    return out


@pytest.fixture
def window_and_flops(workspace: Path) -> tuple[str, dict[str, Any]]:
    shutil.copy(LOG, workspace / "train.log")
    return "train.log", {"model": GPT, "seq_len": 1024, "convention": "megatron"}


async def test_mfu_from_a_window_id_and_an_estimate_id_names_its_evidence(
    workspace: Path, window_and_flops: tuple[str, dict[str, Any]]
) -> None:
    log, flops = window_and_flops
    win, est = await _calls(
        workspace,
        [
            ("import_benchmark", {"paths": [log], "format": "megatron", "warmup_steps": 20}),
            ("estimate_flops", {**flops, "tokens_per_step": 64 * 1024, "devices": 8}),
        ],
    )
    w, f = win.structured_content, est.structured_content
    (res,) = await _calls(
        workspace,
        [
            (
                "compute_mfu",
                {
                    "buckets": [
                        {"name": "main", "window_id": w["evidence_id"], "flops_id": f["evidence_id"]}
                    ],
                    "flops_kind": "model",
                    "device": "H100 SXM",
                    "precision": "bf16",
                },
            )
        ],
    )
    assert not res.is_error, res.content[0].text
    out = res.structured_content
    assert out["evidence"] == [w["evidence_id"], f["evidence_id"]]
    bucket = out["buckets"][0]
    assert bucket["step_time_s"] == pytest.approx(1 / w["throughput"]["steps_per_s"])
    assert bucket["flops_per_step"] == pytest.approx(f["model_flops_per_step_per_device"])
    assert out["achieved_tflops"] == pytest.approx(bucket["flops_per_step"] / bucket["step_time_s"] / 1e12)
    assert any("imported" in x for x in out["warnings"])


@pytest.mark.parametrize(
    ("estimate", "needle"),
    [
        ({"tokens_per_step": 2 * 64 * 1024, "devices": 8}, "different steps"),
        ({"tokens_per_step": 64 * 1024, "devices": 4}, "devices=8"),
    ],
)
async def test_evidence_that_describes_another_step_is_refused(
    workspace: Path, window_and_flops: tuple[str, dict[str, Any]], estimate: dict[str, Any], needle: str
) -> None:
    log, flops = window_and_flops
    win, est = await _calls(
        workspace,
        [
            ("import_benchmark", {"paths": [log], "format": "megatron"}),
            ("estimate_flops", {**flops, **estimate}),
        ],
    )
    bucket = {
        "name": "m",
        "window_id": win.structured_content["evidence_id"],
        "flops_id": est.structured_content["evidence_id"],
    }
    (res,) = await _calls(
        workspace, [("compute_mfu", {"buckets": [bucket], "flops_kind": "model", "peak_tflops": 989.4})]
    )
    assert res.is_error
    assert needle in res.content[0].text


async def test_profiled_failed_or_foreign_evidence_is_refused(workspace: Path) -> None:
    ledger = Ledger(workspace)
    for eid, tool, state, profiled in (
        ("prof", "run_benchmark_window", EvidenceState.EXECUTED, True),
        ("fail", "run_benchmark_window", EvidenceState.FAILED, False),
        ("env", "collect_env", EvidenceState.EXECUTED, False),
    ):
        ledger.append(
            EvidenceDraft(
                id=eid, tool=tool, state=state, profiled=profiled, result={"throughput": {"steps_per_s": 1.0}}
            )
        )
    for eid, needle in (
        ("prof", "profiled"),
        ("fail", "failed"),
        ("env", "collect_env record"),
        ("nope", "no evidence"),
    ):
        bucket = {"name": "m", "window_id": eid, "flops_per_step": 1e14}
        (res,) = await _calls(
            workspace, [("compute_mfu", {"buckets": [bucket], "flops_kind": "model", "peak_tflops": 400})]
        )
        assert res.is_error, eid
        assert needle in res.content[0].text
