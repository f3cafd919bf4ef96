"""The measurement protocol is part of the comparison: a moved boundary is named and refused unless declared."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from mcp import Client

from _trust import any_code_rules, operator_policy
from perfgate.benchmarking.workload.protocol import IMPORTED_FIELDS, LAUNCHED_FIELDS
from perfgate.evidence import EvidenceDraft, EvidenceState, Ledger
from perfgate.server import build_server
from perfgate.serving.runtime import ServerConfig
from perfgate.tools.import_benchmark import ImportBenchmarkInput
from perfgate.tools.run_benchmark_window_models import RunBenchmarkWindowInput

pytestmark = pytest.mark.anyio

PY = sys.executable
PACED = str(Path(__file__).resolve().parents[1] / "examples" / "paced_loop.py")
CONTRACT = {
    "invariants": {"model": "m", "dataset": "d", "precision": "fp32", "global_batch": 32},
    "execution": {"compile": False},
}
FP = {"device_kind": "cpu", "device_name": "x86", "torch_version": "2.13.0"}
LAUNCHED = RunBenchmarkWindowInput(command=["python", "train.py"], contract=CONTRACT).model_dump(mode="json")  # pyright: ignore[reportArgumentType]
IMPORTED = ImportBenchmarkInput(paths=["train.log"], format="megatron", contract=CONTRACT).model_dump(
    mode="json"
)  # pyright: ignore[reportArgumentType]


def window(
    workspace: Path,
    *,
    seed: int,
    step_ms: float = 10.0,
    tool: str = "run_benchmark_window",
    changes: dict[str, Any] | None = None,
    step_time_source: str = "host",
    compiled: bool = False,
) -> str:
    """A window record as its tool writes it (inputs with every default, a step series of 3 launches)."""
    ledger = Ledger(workspace)
    eid = Ledger.new_id()
    rng = np.random.default_rng(seed)
    windows = [
        {
            "launch": k,
            "index": 0,
            "host_step_s": list(step_ms / 1e3 * (1 + 0.01 * rng.standard_normal(20))),
            "samples_per_step": [32.0] * 20,
            "tokens_per_step": None,
        }
        for k in range(3)
    ]
    series = {"schema": "perfgate.benchmark.series", "version": 1, "windows": windows}
    (ledger.artifact_dir(eid) / "step_series.json").write_text(json.dumps(series))
    imported = tool == "import_benchmark"
    contract = {**CONTRACT, "execution": {"compile": compiled}}
    inputs = {**(IMPORTED if imported else LAUNCHED), "contract": contract, **(changes or {})}
    result: dict[str, Any] = {
        "evidence_id": eid,
        "world_size": 1,
        "windows": [{"launch": k, "index": 0} for k in range(3)],
    }
    if imported:
        result |= {"contract": contract, "format": inputs["format"], "environment_fingerprint": {}}
    else:
        result |= {
            "environment_fingerprint": FP,
            "ranks": [{"rank": 0, "step_time_source": step_time_source}],
            "provenance": {
                "argv": inputs["command"],
                "cwd": ".",
                "env_changes": [],
                "code": {"commit": None, "unknown_reason": "not a repository"},
                "files": {},
            },
        }
    ledger.append(
        EvidenceDraft(
            id=eid,
            tool=tool,
            state=EvidenceState.EXECUTED,
            inputs=inputs,
            result=result,
            artifact_names=["step_series.json"],
        )
    )
    return eid


async def compare(workspace: Path, base: list[str], cand: list[str], declared: list[str]) -> dict[str, Any]:
    async with Client(build_server(ServerConfig.create(workspace))) as client:
        result = await client.call_tool(
            "compare_benchmarks", {"baseline": base, "candidate": cand, "declared_changes": declared}
        )
    assert not result.is_error, result.content
    assert result.structured_content is not None
    return result.structured_content


LAUNCHED_CHANGES: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "timing": ({}, {"timing": "explicit"}),
    "warmup_steps": ({}, {"warmup_steps": 0}),
    "measure_steps": ({}, {"measure_steps": 10}),
    "same_process": ({}, {"same_process": True}),
    "log_pattern": (
        {"timing": "log", "log_pattern": r"step (?P<step>\d+) (?P<step_time_ms>[0-9.]+)"},
        {"timing": "log", "log_pattern": r"iter (?P<step>\d+) (?P<step_time_ms>[0-9.]+)"},
    ),
    "samples_per_step": ({}, {"samples_per_step": 64}),
    "tokens_per_step": ({}, {"tokens_per_step": 4096}),
}
IMPORTED_CHANGES: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "pattern": (
        {"format": "regex", "pattern": r"step (?P<step>\d+) (?P<step_time_ms>[0-9.]+)"},
        {"format": "regex", "pattern": r"step (?P<step>\d+) .* (?P<step_time_ms>[0-9.]+)"},
    ),
    "interval_mean": (
        {"format": "regex", "pattern": "x"},
        {"format": "regex", "pattern": "x", "interval_mean": False},
    ),
    "warmup_steps": ({}, {"warmup_steps": 0}),
    "measure_steps": ({}, {"measure_steps": 50}),
    "windows": ({}, {"windows": 5}),
    "samples_per_step": ({}, {"samples_per_step": 32}),
    "tokens_per_step": ({}, {"tokens_per_step": 4096}),
}
CASES = [("run_benchmark_window", k, *v) for k, v in LAUNCHED_CHANGES.items()] + [
    ("import_benchmark", k, *v) for k, v in IMPORTED_CHANGES.items()
]


@pytest.mark.parametrize(("tool", "field", "before", "after"), CASES, ids=[f"{c[0]}-{c[1]}" for c in CASES])
async def test_each_protocol_field_changed_on_one_side_is_refused_by_name_unless_declared(
    workspace: Path, tool: str, field: str, before: dict[str, Any], after: dict[str, Any]
) -> None:
    base = window(workspace, seed=1, step_ms=20, tool=tool, changes=before)
    cand = window(workspace, seed=2, step_ms=10, tool=tool, changes=after, compiled=True)
    # the case: the candidate's own change (compile) declared, the moved boundary not
    out = await compare(workspace, [base], [cand], ["compile"])
    assert (out["status"], out["state"]) == ("incomparable", "failed")
    (diff,) = [d for d in out["differences"] if d["kind"] == "protocol"]
    assert (diff["field"], diff["classification"]) == (f"protocol.{field}", "undeclared")
    defaults = IMPORTED if tool == "import_benchmark" else LAUNCHED
    assert (IMPORTED_FIELDS if tool == "import_benchmark" else LAUNCHED_FIELDS)[field] in diff["note"]
    assert (diff["baseline"], diff["candidate"]) == ({**defaults, **before}[field], after[field])
    assert any(r.startswith(f"protocol.{field} differs") and "not declared" in r for r in out["reasons"])
    # declared as protocol.<field>, the same pair compares
    ok = await compare(workspace, [base], [cand], ["compile", f"protocol.{field}"])
    assert (ok["status"], ok["verdict"]) == ("comparable", "improved"), ok["reasons"]
    (diff,) = [d for d in ok["differences"] if d["kind"] == "protocol"]
    assert diff["classification"] == "declared_protocol"


async def test_the_step_timer_the_ranks_reported_is_part_of_the_protocol(workspace: Path) -> None:
    base = window(workspace, seed=1, step_ms=20, step_time_source="device_events")
    cand = window(workspace, seed=2, step_ms=10, step_time_source="host")
    out = await compare(workspace, [base], [cand], [])
    assert out["status"] == "incomparable"
    assert any(r.startswith("protocol.step_time_source differs") for r in out["reasons"])
    assert (await compare(workspace, [base], [cand], ["protocol.step_time_source"]))["status"] == "comparable"


async def test_a_declared_protocol_change_that_did_not_happen_is_refused(workspace: Path) -> None:
    base, cand = window(workspace, seed=1, step_ms=20), window(workspace, seed=2, step_ms=10)
    out = await compare(workspace, [base], [cand], ["protocol.warmup_steps"])
    assert out["status"] == "incomparable"
    assert (
        "declared change 'protocol.warmup_steps' did not happen (same value on both sides)" in out["reasons"]
    )
    # the vocabulary's warmup_steps is the learning-rate warm-up: it does not declare the measurement's
    moved = window(workspace, seed=3, step_ms=10, changes={"warmup_steps": 0})
    out = await compare(workspace, [base], [moved], ["warmup_steps"])
    assert out["status"] == "incomparable"
    assert any(
        r.startswith("protocol.warmup_steps differs (5 vs 0) but was not declared") for r in out["reasons"]
    )


async def test_windows_of_one_side_with_different_boundaries_are_refused(workspace: Path) -> None:
    # the moved boundary hidden among the candidate's windows (the first one matches the baseline)
    base = window(workspace, seed=1, step_ms=20)
    good, moved = (
        window(workspace, seed=2, step_ms=10),
        window(workspace, seed=3, step_ms=10, changes={"warmup_steps": 0}),
    )
    out = await compare(workspace, [base], [good, moved], [])
    assert out["status"] == "incomparable"
    assert "candidate: protocol.warmup_steps differs between windows of the same side" in out["reasons"]
    # and declaring the field does not excuse a side that is two measurements
    out = await compare(workspace, [base], [good, moved], ["protocol.warmup_steps"])
    assert "candidate: protocol.warmup_steps differs between windows of the same side" in out["reasons"]


async def test_a_record_that_lacks_a_protocol_field_is_never_assumed_to_match(workspace: Path) -> None:
    base = window(workspace, seed=1, step_ms=20)
    ledger = Ledger(workspace)
    old = ledger.get(window(workspace, seed=2, step_ms=10))
    assert old is not None
    inputs = {k: v for k, v in old.inputs.items() if k != "warmup_steps"}
    eid = Ledger.new_id()
    (ledger.artifact_dir(eid) / "step_series.json").write_bytes(
        (ledger.artifact_dir(old.id) / "step_series.json").read_bytes()
    )
    ledger.append(
        EvidenceDraft(
            id=eid,
            tool=old.tool,
            state=old.state,
            inputs=inputs,
            result={**old.result, "evidence_id": eid},
            artifact_names=["step_series.json"],
        )
    )
    out = await compare(workspace, [base], [eid], [])
    assert out["status"] == "incomparable"
    assert any(r.startswith("protocol.warmup_steps differs (5 vs None)") for r in out["reasons"])


@pytest.mark.slow
async def test_real_windows_with_a_moved_warm_up_are_refused_until_it_is_declared(workspace: Path) -> None:
    operator_policy("[execution]\n" + any_code_rules([PY, PACED]))

    def paced(warmup: int) -> dict[str, Any]:
        return {
            "command": [PY, PACED, "--steps", "1000", "--step-ms", "5", "--samples", "8"],
            "timing": "explicit",
            "warmup_steps": warmup,
            "measure_steps": 10,
            "repeats": 2,
            "same_process": True,
            "timeout_s": 60,
            "contract": {"invariants": {"workload": "paced"}, "execution": {}},
        }

    async with Client(build_server(ServerConfig.create(workspace))) as client:
        ids: list[str] = []
        for warmup in (5, 0):
            res = await client.call_tool("run_benchmark_window", paced(warmup))
            assert res.structured_content is not None, res.content
            assert res.structured_content["state"] == "executed", res.structured_content["failure_reason"]
            ids.append(res.structured_content["evidence_id"])
    out = await compare(workspace, ids[:1], ids[1:], [])
    assert out["status"] == "incomparable"
    assert any(r.startswith("protocol.warmup_steps differs (5 vs 0)") for r in out["reasons"])
    declared = await compare(workspace, ids[:1], ids[1:], ["protocol.warmup_steps"])
    assert declared["status"] == "comparable", declared["reasons"]
