"""Tool answers are sized for a model: deciding lines first, compact JSON, a fixed character budget."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from mcp import Client
from pydantic import BaseModel

from perfgate.server import build_server
from perfgate.serving import answer
from perfgate.serving.answer import TEXT_BUDGET_CHARS, answer_text, compact_json
from perfgate.serving.runtime import ServerConfig

pytestmark = pytest.mark.anyio

PLANTED = Path(__file__).parent / "fixtures" / "traces" / "planted"


class Out(BaseModel):
    evidence_id: str
    state: str
    verdict: str
    rows: list[dict[str, Any]]
    warnings: list[str]


def test_a_small_result_is_compact_json_with_rounded_floats_and_no_empty_fields() -> None:
    text, shortened = compact_json({"a": 1.23456789, "b": None, "c": [], "d": [1, 2.0]}, 1000)
    assert not shortened and text == '{"a":1.235,"d":[1,2]}'


def _rounds_reference(value: Any, budget: int) -> tuple[str, bool]:
    """`compact_json` by its definition: each round shortens the whole value with its own limits."""
    text = ""
    for k, (max_list, max_str) in enumerate(answer._ROUNDS):
        text = json.dumps(
            answer._shorten(value, max_list, max_str), separators=(",", ":"), ensure_ascii=False
        )
        if len(text) <= budget:
            return text, k > 0
    return text[: budget - 3] + "...", True


def test_a_shortened_result_rounds_each_float_once_and_reads_as_each_round_alone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    value: dict[str, Any] = {
        "rows": [
            {"name": f"op_{i}" * (i % 7), "us": i / 3, "gone": None, "tags": [], "n": i} for i in range(60)
        ],
        "notes": ["x" * 900, "", "short"],
        "nested": {"empty": {}, "deep": [[1.23456, 2.5], [], [{"a": ""}]] * 9},
    }
    for budget in (100, 600, 1500, 3000, 20000):
        assert compact_json(value, budget) == _rounds_reference(value, budget)
    rounded: list[float] = []
    original = answer._round
    monkeypatch.setattr(answer, "_round", lambda x: rounded.append(x) or original(x))
    text, shortened = compact_json(value, 600)
    assert shortened and len(text) <= 600
    assert len(rounded) == 60 + 2 * 9  # every float once, not once per round


def test_a_large_result_is_cut_to_the_budget_and_says_how_much_is_left_out() -> None:
    rows = [{"name": f"kernel_{i}" * 10, "total_us": i * 1.1} for i in range(2000)]
    out = Out(
        evidence_id="ev-1", state="executed", verdict="improved", rows=rows, warnings=["w1", "w2", "w3"]
    )
    text = answer_text("some_tool", out)
    assert len(text) <= TEXT_BUDGET_CHARS
    lines = text.splitlines()
    assert lines[0] == "some_tool: executed, evidence ev-1"
    assert "verdict=improved" in lines[1] and lines[2].startswith("warnings (3): w1 | w2")
    assert "shortened" in lines[3]
    body = json.loads(lines[4])
    assert body["rows"][-1].startswith("...+") and body["verdict"] == "improved"


async def test_every_answer_through_the_protocol_stays_under_the_budget(workspace: Path, mode: str) -> None:
    folder = workspace / "profiles"
    folder.mkdir()
    for name in ("slow_rank_rank0.json.gz", "slow_rank_rank1.json.gz"):
        shutil.copy(PLANTED / name, folder)
    mfu = {
        "buckets": [{"name": "s", "flops_per_step": 4.0e14, "step_time_s": 1.0, "steps": 10}],
        "flops_kind": "model",
        "device": "NVIDIA H100 80GB HBM3",
        "precision": "bf16",
    }
    async with Client(build_server(ServerConfig.create(workspace)), mode=mode) as client:
        for tool, args in (
            ("analyze_trace", {"trace_paths": ["profiles"], "top_k": 100}),
            ("compute_mfu", mfu),
        ):
            result = await client.call_tool(tool, args)
            assert not result.is_error, result.content
            text = result.content[0].text  # type: ignore[union-attr]
            assert len(text) <= TEXT_BUDGET_CHARS and text.startswith(f"{tool}: executed, evidence ")
            # The structured result is whole: nothing cut there.
            full = json.dumps(result.structured_content)
            assert tool != "analyze_trace" or len(full) > len(text)
