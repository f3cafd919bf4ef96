"""Host contention: a profile captured while other processes took the job's CPUs says so first.

A unit-level check on recorded figures (a planted trace with a host load attached) and a real capture:
profile_segment mode='run' on a tiny CPU training pinned to one CPU beside a planted burner process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from mcp import Client

from _trust import operator_policy
from perfgate.server import build_server
from perfgate.serving.runtime import ServerConfig
from perfgate.tools.trace_analysis import trace_brief
from perfgate.traces import analyze_traces, combine
from perfgate.traces.diagnosis.diagnose import _OP_LEVEL, THRESHOLDS  # pyright: ignore[reportPrivateUsage]
from perfgate.traces.models import HostLoad, OtherProcess

PLANTED = Path(__file__).parent / "fixtures" / "traces" / "planted"
REPO = Path(__file__).resolve().parents[1]
PY = sys.executable
TINY = str(REPO / "examples" / "tiny_train.py")


def _load(other: float, job: float, cpus: int = 4) -> HostLoad:
    return HostLoad(
        measured=True,
        window_s=3.0,
        cpus=cpus,
        job_cpus=job,
        other_cpus=other,
        other_share=other / cpus,
        load_avg_1m=6.0,
        top_other=[OtherProcess(pid=4242, name="burner", cpus=other)],
    )


def _with_load(scenario: str, load: HostLoad | None):
    profiles = analyze_traces([PLANTED / f"{scenario}_rank0.json.gz"]).ranks
    if load is not None:
        for p in profiles:
            p.host_load = load
    return combine(profiles)


def test_contention_outranks_the_op_level_findings_it_distorts() -> None:
    # tiny_ops: the top finding is host_overhead (op-level) without a load figure.
    assert _with_load("tiny_ops", None).findings[0].wall == "host_overhead"
    report = _with_load("tiny_ops", _load(other=2.0, job=2.0))
    walls = [f.wall for f in report.findings]
    assert walls[0] == "host_contention", walls
    top = report.findings[0]
    assert top.rank is None and top.share_of_step == pytest.approx(0.5)
    assert "burner (pid 4242" in top.events[0] and top.figures["other_cpus"] == 2.0
    over = next(f for f in report.findings if f.wall == "host_overhead")
    assert over.confidence == "low" and "op times are inflated" in over.confidence_reason


def test_contention_does_not_push_a_non_op_wall_down() -> None:
    # A sleeping DataLoader is not an op-level finding: it keeps its place if its time at stake is larger.
    report = _with_load("slow_loader", _load(other=1.0, job=3.0))
    walls = [f.wall for f in report.findings]
    assert walls[0] == "input_pipeline" and "host_contention" in walls


@pytest.mark.parametrize(
    ("other", "job"),
    [(0.9, 3.0), (1.2, 0.5)],  # below the share threshold; or the CPUs were not kept busy (room left)
)
def test_a_light_or_unsaturated_load_is_not_contention(other: float, job: float) -> None:
    load = _load(other=other, job=job)
    assert (load.other_share or 0) < THRESHOLDS["host_contention"] or (
        other + job < THRESHOLDS["host_contention_busy"] * 4
    )
    assert "host_contention" not in [f.wall for f in _with_load("tiny_ops", load).findings]


def test_an_analyzed_trace_says_its_load_is_unknown_not_absent() -> None:
    report = _with_load("tiny_ops", None)
    (rank,) = report.ranks
    assert rank.host_load.measured is False and "unknown" in (rank.host_load.unknown_reason or "")
    assert rank.host_load.other_share is None
    assert any(
        "host load during capture: unknown" in line for line in trace_brief(report.ranks, None, [], "x")
    )


@pytest.mark.slow
@pytest.mark.anyio
async def test_a_capture_beside_a_burner_names_host_contention_before_op_level_findings(
    workspace: Path,
) -> None:
    pytest.importorskip("torch")
    if not hasattr(os, "sched_setaffinity") or not Path("/proc/stat").is_file():
        pytest.skip("needs Linux /proc and CPU affinity")
    operator_policy(f'[execution]\n\n[[execution.allow]]\nscript = {json.dumps(str(TINY))}\ncode = "any"\n')
    args = {"mode": "run", "command": [PY, TINY, "--steps", "8"], "skip_first": 1, "warmup": 1, "active": 2,
            "timeout_s": 120, "top_k": 3}  # fmt: skip
    saved = os.sched_getaffinity(0)
    cpu = min(saved)
    # The job (launched by this process) and two burners share one CPU: the burners take about two thirds
    # of it, 2.7x the 25% threshold. One burner (half the CPU) measured 24% once on a machine loaded by
    # other work, whose own burners share the same CPU: the planted effect must stay large against that.
    os.sched_setaffinity(0, {cpu})
    burners = [subprocess.Popen([PY, "-c", "while True: pass"]) for _ in range(2)]
    try:
        async with Client(build_server(ServerConfig.create(workspace))) as client:
            result = await client.call_tool("profile_segment", args)
    finally:
        for burner in burners:
            burner.kill()
            burner.wait()
        os.sched_setaffinity(0, saved)
    out = result.structured_content
    assert out is not None and out["state"] == "executed", result.content
    load = out["ranks"][0]["host_load"]
    assert load["measured"] is True and load["cpus"] == 1, load
    assert load["other_share"] >= THRESHOLDS["host_contention"], load
    # Named, and ahead of every op-level finding it distorts. A larger wall that is not op-level (the tiny
    # job's own loader wait, slowed by the same burner) may rank above it: that is the documented rule.
    walls = [f["wall"] for f in out["findings"]]
    assert "host_contention" in walls, walls
    at = walls.index("host_contention")
    assert all(i > at for i, wall in enumerate(walls) if wall in _OP_LEVEL), walls
    assert "host load during capture: other processes" in result.content[0].text  # type: ignore[union-attr]


def test_the_next_line_opens_a_hypothesis_on_the_jobs_own_wall_not_the_hosts() -> None:
    """The host's contention ranks first, but it is no change to the job: the next call names the first
    wall the job owns and says the figures are inflated; a report of contention alone says to quiet the host."""
    from perfgate.tools.trace_analysis import trace_brief

    report = _with_load("tiny_ops", _load(other=2.0, job=2.0))
    assert report.findings[0].wall == "host_contention"
    (next_line,) = [
        line for line in trace_brief(report.ranks, None, report.findings, "ev-1") if "next" in line
    ]
    assert "the host was busy" in next_line and 'hypothesis="host_overhead: ...")' in next_line
    alone = [f for f in report.findings if f.wall == "host_contention"]
    (quiet,) = [line for line in trace_brief(report.ranks, None, alone, "ev-1") if line.startswith("next")]
    assert "hypothesis" not in quiet and "quiet the host" in quiet
