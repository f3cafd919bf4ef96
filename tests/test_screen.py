"""Issue 45 item 4: short screens, then the winner validated, in one place.

Three candidates of a real tiny CPU loop (each a different per-step cost, set through one environment
variable) screened against one baseline in a single compare_benchmarks call: each compared on its own and
ranked, the winner named, its >=50-step validation asked for, and the screen itself refused as a keep's
comparison. Then the winner's validation run is compared alone, as a keep needs.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from mcp import Client

from _trust import operator_policy
from perfgate.server import build_server
from perfgate.serving.runtime import ServerConfig
from test_job_phases import CONTRACT, PY, _script

pytestmark = pytest.mark.anyio


@pytest.fixture
def ws(workspace: Path) -> Path:
    rules = "".join(
        f'\n[[execution.allow]]\nargv = {json.dumps(p)}\ncode = "any"\nenv = ["STEP_SLEEP", "COMPILE_SLEEP"]\n'
        for p in ([PY, "-m", "perfgate.harness"], [PY, "train.py"])
    )
    operator_policy("[execution]\n" + rules)
    (workspace / "train.py").write_text(_script(200))
    return workspace


async def _window(client: Client, sleep: str, label: str, job: bool = False) -> str:
    result = await client.call_tool(
        "run_benchmark_window",
        {
            "command": [PY, "train.py"],
            "env": {"STEP_SLEEP": sleep, "COMPILE_SLEEP": "0"},
            "warmup_steps": 3,
            "measure_steps": 8,
            "job": job,
            "repeats": 3,
            "label": label,
            "timeout_s": 180,
            "contract": CONTRACT,
        },
    )
    out = result.structured_content
    assert out is not None and out["state"] == "executed", result.content
    return str(out["evidence_id"])


@pytest.mark.timeout(900)
async def test_a_screen_ranks_candidates_names_the_winner_and_is_never_kept(ws: Path) -> None:
    async with Client(build_server(ServerConfig.create(ws))) as client:
        base = await _window(client, "0.06", "baseline")
        cands = {
            label: await _window(client, sleep, label)
            for label, sleep in (("a", "0.03"), ("b", "0.01"), ("c", "0.12"))
        }
        screened = await client.call_tool(
            "compare_benchmarks",
            {"baseline": [base], "candidate": list(cands.values()), "declared_changes": ["env:STEP_SLEEP"]},
        )
        out = screened.structured_content
        assert out is not None, screened.content
        screen = out["screen"]
        assert [e["label"] for e in screen["entries"]] == ["b", "a", "c"], screen
        assert screen["winner"] == [cands["b"]], json.dumps(screen)[:3000]
        assert [e["verdict"] for e in screen["entries"][:2]] == ["improved", "improved"]
        assert (
            screen["entries"][2]["verdict"] in ("regressed", "within_noise")
            and screen["entries"][2]["speedup"] < 1
        )
        assert out["state"] == "executed" and out["speedup"] == screen["entries"][0]["speedup"]
        assert (
            "validation_steps=50" in screen["next"]
            and f"inputs of {cands['b']} plus job=true" in screen["next"]
        )
        text = screened.content[0].text  # pyright: ignore[reportAttributeAccessIssue]
        assert text.startswith("screen of 3 candidates, best first: b: improved"), text[:300]

        opened = await client.call_tool(
            "record_decision",
            {
                "action": "open",
                "hypothesis": "less work per step",
                "classification": "system_optimization",
                "changed_variable": "env:STEP_SLEEP",
                "validation_steps": 50,
            },
        )
        assert opened.structured_content is not None, opened.content
        exp = opened.structured_content["experiment_id"]
        gates = await _gates(client, exp, out["evidence_id"])
        assert (
            gates["comparison"]["status"] == "failed"
            and "screened 3 candidates" in gates["comparison"]["reason"]
        )
        assert "validation_steps=50" in gates["comparison"]["satisfy_with"]

        # the winner, run to its end (200 healthy steps) and compared alone: a comparison a keep can rest on
        winner = await _window(client, "0.01", "b-validation", job=True)
        alone = await client.call_tool(
            "compare_benchmarks",
            {"baseline": [base], "candidate": [winner], "declared_changes": ["env:STEP_SLEEP"]},
        )
        single = alone.structured_content
        assert single is not None and single.get("screen") is None and single["verdict"] == "improved", single
        gates = await _gates(client, exp, single["evidence_id"])
        assert gates["comparison"]["status"] == "passed", gates["comparison"]
        assert gates["validation_run"]["status"] == "passed", gates["validation_run"]


async def _gates(client: Client, exp: str, comparison: str) -> dict[str, Any]:
    shown = await client.call_tool(
        "record_decision",
        {"action": "show", "experiment_id": exp, "evidence": [{"id": comparison, "role": "comparison"}]},
    )
    assert shown.structured_content is not None, shown.content
    return {g["name"]: g for g in shown.structured_content["gates"]}
