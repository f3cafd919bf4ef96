"""check_training_health through the MCP protocol, over imported logs (no training needed)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from mcp import Client

from perfgate.server import build_server
from perfgate.serving.runtime import ServerConfig

pytestmark = pytest.mark.anyio

PATTERN = r"step (?P<step>\d+) time (?P<step_time_ms>\S+)ms loss (?P<loss>\S+) skipped (?P<skipped>\d+)"


def _log(
    workspace: Path, name: str, losses: list[str], skipped_at: int | None = None, steps: int = 60
) -> str:
    lines = [
        f"step {s} time 100.0ms loss {losses[s % len(losses)] if s < len(losses) else losses[-1]} "
        f"skipped {1 if s == skipped_at else 0}"
        for s in range(1, steps + 1)
    ]
    (workspace / name).write_text("\n".join(lines) + "\n")
    return name


def _falling(start: float, rate: float, n: int = 61) -> list[str]:
    return [f"{start * (1 - rate) ** s:.5f}" for s in range(n)]


async def _run(workspace: Path, calls: list[tuple[str, dict[str, Any]]]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    async with Client(build_server(ServerConfig.create(workspace))) as client:
        for tool, args in calls:
            r = await client.call_tool(tool, args)
            assert not r.is_error, r.content[0].text  # type: ignore[union-attr]
            out.append(r.structured_content or {})
    return out


def _import(name: str) -> tuple[str, dict[str, Any]]:
    return (
        "import_benchmark",
        {
            "paths": [name],
            "format": "regex",
            "pattern": PATTERN,
            "interval_mean": False,
            "warmup_steps": 5,
            "windows": 1,
        },
    )


async def test_a_healthy_winner_over_50_steps_passes_against_its_baseline(workspace: Path) -> None:
    base = _log(workspace, "base.log", _falling(4.0, 0.01))
    cand = _log(workspace, "cand.log", _falling(4.0, 0.0105))
    b, c = await _run(workspace, [_import(base), _import(cand)])
    (out,) = await _run(
        workspace,
        [
            (
                "check_training_health",
                {
                    "evidence_id": c["evidence_id"],
                    "baseline_id": b["evidence_id"],
                    "loss_tolerance": 0.02,
                    "min_steps": 50,
                },
            )
        ],
    )
    assert out["state"] == "passed", out["checks"]
    assert out["quality_kind"] == "training_health"
    assert out["evidence"] == [c["evidence_id"], b["evidence_id"]]
    assert out["loss_last_ratio"] < 1
    # the metrics a training change's keep gate judges against the criterion declared at open
    assert out["metrics"]["loss_last_ratio"] == out["loss_last_ratio"]
    assert out["metrics"]["loss_last"] == out["health"]["loss_last"]
    assert out["metrics"]["loss_trend"] < 0


@pytest.mark.parametrize(
    ("losses", "skipped_at", "args", "failed"),
    [
        (_falling(4.0, 0.01)[:30] + ["nan"] * 31, None, {}, "finite"),
        (_falling(4.0, 0.01), 30, {}, "unexplained_skips"),
        (_falling(4.0, 0.01), None, {"min_steps": 100}, "steps"),
        (_falling(4.6, 0.005), None, {"tolerance": 0.02}, "loss_vs_baseline"),
    ],
)
async def test_an_unhealthy_run_fails_with_the_check_named(
    workspace: Path, losses: list[str], skipped_at: int | None, args: dict[str, Any], failed: str
) -> None:
    base = _log(workspace, "base.log", _falling(4.0, 0.01))
    cand = _log(workspace, "cand.log", losses, skipped_at)
    b, c = await _run(workspace, [_import(base), _import(cand)])
    call: dict[str, Any] = {"evidence_id": c["evidence_id"], "min_steps": args.get("min_steps", 0)}
    if "tolerance" in args:
        call |= {"baseline_id": b["evidence_id"], "loss_tolerance": args["tolerance"]}
    (out,) = await _run(workspace, [("check_training_health", call)])
    assert out["state"] == "failed"
    assert failed in out["failed_checks"]


async def test_a_baseline_without_a_declared_tolerance_is_refused(workspace: Path) -> None:
    base = _log(workspace, "base.log", _falling(4.0, 0.01))
    (b,) = await _run(workspace, [_import(base)])
    async with Client(build_server(ServerConfig.create(workspace))) as client:
        r = await client.call_tool(
            "check_training_health", {"evidence_id": b["evidence_id"], "baseline_id": b["evidence_id"]}
        )
    assert r.is_error
    assert "loss_tolerance" in r.content[0].text  # type: ignore[union-attr]
