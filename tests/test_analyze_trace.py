"""analyze_trace: the read-only trace analysis, on planted CPU traces and through a read-only server."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
from mcp import Client

from perfgate.server import build_server
from perfgate.serving.runtime import ServerConfig
from perfgate.traces import analyze_trace, analyze_traces

pytestmark = pytest.mark.anyio

PLANTED = Path(__file__).parent / "fixtures" / "traces" / "planted"


def planted(name: str, ranks: int = 1) -> list[Path]:
    return [PLANTED / f"{name}_rank{r}.json.gz" for r in range(ranks)]


def phases(path: Path) -> dict[str, float]:
    host = analyze_trace(path).host
    assert host is not None
    return {ph.phase: ph.per_step_us for ph in host.phases}


@pytest.mark.parametrize(
    ("scenario", "phase"),
    [("slow_loader", "data_loading"), ("eval_in_step", "no_grad"), ("ddp_allreduce", "collectives")],
)
def test_the_planted_phase_dominates_host_step_time(scenario: str, phase: str) -> None:
    by_phase = phases(planted(scenario)[0])
    assert max(by_phase, key=lambda k: by_phase[k]) == phase
    host = analyze_trace(planted(scenario)[0]).host
    assert host is not None and host.steps == 2
    # The phases partition the step: their sum is the step time.
    assert sum(by_phase.values()) == pytest.approx(host.step_us, rel=1e-6)


def test_gloo_collectives_count_as_communication_and_name_their_events() -> None:
    host = analyze_trace(planted("ddp_allreduce")[0]).host
    assert host is not None
    (coll,) = [ph for ph in host.phases if ph.phase == "collectives"]
    assert coll.share > 0.3 and any(e.startswith("gloo:") or e.startswith("c10d::") for e in coll.top_events)


def test_the_slowest_rank_is_the_busiest_not_the_one_waiting_longest() -> None:
    report = analyze_traces(planted("slow_rank", 2))
    skew = report.rank_skew
    assert skew is not None and skew.slowest_rank == 1
    r0, r1 = skew.per_rank_mean_step_us
    # Lockstep: both ranks' steps take about as long; rank 0 spends the difference waiting in gloo.
    assert r0.collective_wait_us > r1.collective_wait_us
    assert r1.busy_us > r0.busy_us and skew.busy_spread_us == pytest.approx(r1.busy_us - r0.busy_us)


def test_missing_flops_say_why_and_self_time_ops_are_ordered_by_self_time() -> None:
    p = analyze_trace(planted("slow_loader")[0])
    assert p.flops is None and p.flops_unavailable is not None and "with_flops" in p.flops_unavailable
    selfs = [o.self_us for o in p.top_self_ops]
    assert selfs == sorted(selfs, reverse=True) and selfs


async def test_a_read_only_server_analyzes_traces(workspace: Path, mode: str) -> None:
    folder = workspace / "profiles"
    folder.mkdir()
    for path in planted("slow_rank", 2):
        shutil.copy(path, folder)
    server = build_server(ServerConfig.create(workspace, read_only=True))
    async with Client(server, mode=mode) as client:
        names = {t.name for t in (await client.list_tools()).tools}
        assert "analyze_trace" in names and "profile_segment" not in names
        result = await client.call_tool("analyze_trace", {"trace_paths": ["profiles"], "top_k": 3})
        assert not result.is_error, result.content
        out: Any = result.structured_content
        bad = await client.call_tool("analyze_trace", {"trace_paths": []})
    assert out["state"] == "executed" and [r["rank"] for r in out["ranks"]] == [0, 1]
    assert out["rank_skew"]["slowest_rank"] == 1
    assert all(r["backend"] == "cpu" and r["host"]["phases"] for r in out["ranks"])
    assert bad.is_error


async def test_a_diff_against_earlier_evidence_through_the_protocol(workspace: Path) -> None:
    for name in ("slow_loader", "slow_loader_workers"):
        shutil.copy(planted(name)[0], workspace)
    async with Client(build_server(ServerConfig.create(workspace, read_only=True))) as client:
        first = await client.call_tool("analyze_trace", {"trace_paths": ["slow_loader_rank0.json.gz"]})
        assert not first.is_error, first.content
        base_id = first.structured_content["evidence_id"]  # type: ignore[index]
        second = await client.call_tool(
            "analyze_trace",
            {"trace_paths": ["slow_loader_workers_rank0.json.gz"], "baseline_evidence_id": base_id},
        )
        wrong = await client.call_tool(
            "analyze_trace", {"trace_paths": ["slow_loader_rank0.json.gz"], "baseline_evidence_id": "ev-nope"}
        )
    assert not second.is_error, second.content
    out: Any = second.structured_content
    assert out["diff"]["phases"][0]["name"] == "data_loading" and out["diff"]["phases"][0]["delta"] < 0
    assert out["baseline"].startswith(f"evidence {base_id}")
    text = second.content[0].text  # type: ignore[union-attr]
    assert text.splitlines()[1].startswith(f"diff vs evidence {base_id}") and "data_loading" in text
    assert out["findings"][0]["wall"] == "input_pipeline"
    assert wrong.is_error and "ev-nope" in wrong.content[0].text  # type: ignore[union-attr]
