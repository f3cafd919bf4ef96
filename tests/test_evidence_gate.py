"""Evidence gate v2 through the protocol: every difference between the sides is declared or refused."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from mcp import Client

from perfgate.evidence import EvidenceDraft, EvidenceState, Ledger
from perfgate.server import build_server
from perfgate.serving.runtime import ServerConfig

pytestmark = pytest.mark.anyio

INVARIANTS = {"model": "tiny-mlp", "dataset": "synthetic", "precision": "bf16", "global_batch": 32}
FP = {"device_kind": "cpu", "device_name": "x86", "torch_version": "2.13.0", "python_version": "3.11.7"}
CODE = {"commit": "a" * 40, "dirty": False, "diff_sha256": None, "diff_files": {}, "diff_artifact": None}


def window(
    workspace: Path,
    step_ms: float,
    *,
    seed: int,
    env: dict[str, str] | None = None,
    execution: dict[str, Any] | None = None,
    invariants: dict[str, Any] | None = None,
    files: dict[str, str] | None = None,
    code: dict[str, Any] | None = None,
    fp: dict[str, Any] | None = None,
    command: list[str] | None = None,
    launches: int = 3,
    host_load: list[dict[str, Any]] | None = None,
    world: int = 1,
    logged: dict[str, str] | None = None,
) -> str:
    """A run_benchmark_window record as the tool writes it, with a step series of ``launches`` launches
    (``logged``: the settings its stdout listed, `logged_settings`)."""
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
        for k in range(launches)
    ]
    series = {"schema": "perfgate.benchmark.series", "version": 1, "windows": windows}
    (ledger.artifact_dir(eid) / "step_series.json").write_text(json.dumps(series))
    contract = {"invariants": invariants or INVARIANTS, "execution": execution or {"workers": 0}}
    ledger.append(
        EvidenceDraft(
            id=eid,
            tool="run_benchmark_window",
            state=EvidenceState.EXECUTED,
            inputs={"command": command or ["python", "train.py"], "env": env or {}, "contract": contract},
            result={
                "evidence_id": eid,
                "world_size": world,
                "environment_fingerprint": FP if fp is None else fp,
                "windows": [{"launch": k, "index": 0} for k in range(launches)],
                "host_load": host_load or [],
                "logged_settings": logged or {},
                "provenance": {
                    "argv": command or ["python", "train.py"],
                    "cwd": ".",
                    "env_changes": sorted(env or {}),
                    "code": code or CODE,
                    "files": files if files is not None else {"train.py": "1" * 64},
                },
            },
            artifact_names=["step_series.json"],
        )
    )
    return eid


async def compare(workspace: Path, base: str, cand: str, declared: list[str], **kw: Any) -> dict[str, Any]:
    async with Client(build_server(ServerConfig.create(workspace))) as client:
        result = await client.call_tool(
            "compare_benchmarks",
            {"baseline": [base], "candidate": [cand], "declared_changes": declared, **kw},
        )
    assert not result.is_error, result.content
    assert result.structured_content is not None
    return result.structured_content


async def test_an_undeclared_env_change_makes_the_comparison_incomparable(workspace: Path) -> None:
    # The example: OMP_NUM_THREADS=1 on the candidate, declared_changes [] -> "improved 15.5x".
    base = window(workspace, 20, seed=1)
    cand = window(workspace, 10, seed=2, env={"OMP_NUM_THREADS": "1"})
    out = await compare(workspace, base, cand, [])
    assert (out["status"], out["verdict"]) == ("incomparable", "incomparable")
    (diff,) = [d for d in out["differences"] if d["kind"] == "env"]
    assert diff == {**diff, "field": "env.OMP_NUM_THREADS", "baseline": None, "candidate": "1"}
    assert diff["classification"] == "undeclared"
    assert any("env.OMP_NUM_THREADS differs (None vs '1') but was not declared" in r for r in out["reasons"])
    # declared (by name, or by its vocabulary entry), the same pair is an honest execution change
    for declared in (["env:OMP_NUM_THREADS"], ["threads"]):
        ok = await compare(workspace, base, cand, declared)
        assert (ok["status"], ok["verdict"]) == ("comparable", "improved"), ok["reasons"]


async def test_a_semantic_setting_declared_as_execution_is_incomparable(workspace: Path) -> None:
    # bf16 -> fp8 declared as an execution setting was kept as an "equivalent speedup".
    base = window(workspace, 20, seed=1, execution={"precision": "bf16"})
    cand = window(workspace, 10, seed=2, execution={"precision": "fp8"})
    out = await compare(workspace, base, cand, ["precision"])
    assert out["status"] == "incomparable"
    assert any("execution.precision is a semantic setting" in r for r in out["reasons"])
    assert any(
        d["field"] == "contract.execution.precision" and d["classification"] == "semantic"
        for d in out["differences"]
    )


async def test_a_code_change_must_be_declared_and_names_the_file(workspace: Path) -> None:
    base = window(workspace, 20, seed=1)
    cand = window(workspace, 10, seed=2, files={"train.py": "2" * 64}, execution={"workers": 2})
    out = await compare(workspace, base, cand, ["workers"])
    assert out["status"] == "incomparable"
    assert any(
        d["field"] == "file:train.py" and d["classification"] == "undeclared" for d in out["differences"]
    )
    ok = await compare(workspace, base, cand, ["workers", "code"])
    assert ok["status"] == "comparable", ok["reasons"]
    dirty = {**CODE, "dirty": True, "diff_sha256": "d" * 64, "diff_files": {"model.py": "e" * 64}}
    cand2 = window(workspace, 10, seed=3, code=dirty, execution={"workers": 2})
    out2 = await compare(workspace, base, cand2, ["workers"])
    (code,) = [d for d in out2["differences"] if d["kind"] == "code"]
    assert "model.py" in code["note"] and code["classification"] == "undeclared"
    absent = await compare(
        workspace, base, window(workspace, 10, seed=4, execution={"workers": 2}), ["workers", "code"]
    )
    assert any("declared change 'code' did not happen" in r for r in absent["reasons"])


async def test_unknown_sides_are_never_the_same(workspace: Path) -> None:
    # Log-timed windows carried an all-null fingerprint, and "same environment" passed vacuously.
    nulls = dict.fromkeys(FP)
    base = window(workspace, 20, seed=1, fp=nulls, execution={"workers": 0})
    cand = window(workspace, 10, seed=2, fp=nulls, execution={"workers": 2})
    out = await compare(workspace, base, cand, ["workers"])
    assert any("measured environment" in u for u in out["unverified"])
    assert not any(d["kind"] == "measured" for d in out["differences"])


async def test_different_measured_environments_are_named(workspace: Path) -> None:
    base = window(workspace, 20, seed=1, execution={"workers": 0})
    cand = window(workspace, 10, seed=2, execution={"workers": 2}, fp={**FP, "device_kind": "musa"})
    out = await compare(workspace, base, cand, ["workers"])
    assert out["status"] == "incomparable"
    assert any(d["field"] == "measured.device_kind" and d["candidate"] == "musa" for d in out["differences"])


RUNTIME = {"OMP_NUM_THREADS": None, "num_threads": "8", "interop_threads": "8", "allow_tf32": "False"}


async def test_measured_process_settings_must_match_or_be_declared(workspace: Path) -> None:
    # The candidate process ran with 2 torch threads instead of 8, set in code (no env change, no argv).
    base = window(workspace, 20, seed=1, fp={**FP, **RUNTIME})
    cand = window(workspace, 10, seed=2, fp={**FP, **RUNTIME, "num_threads": "2"})
    out = await compare(workspace, base, cand, [])
    assert out["status"] == "incomparable"
    (diff,) = [d for d in out["differences"] if d["kind"] == "measured"]
    assert (diff["field"], diff["baseline"], diff["candidate"]) == ("measured.num_threads", "8", "2")
    assert any("measured.num_threads differs ('8' vs '2')" in r for r in out["reasons"])
    ok = await compare(workspace, base, cand, ["threads"])
    assert ok["status"] == "comparable", ok["reasons"]
    # a precision switch flipped inside the process is a training change, never an equivalent speedup
    tf32 = window(workspace, 10, seed=3, fp={**FP, **RUNTIME, "allow_tf32": "True"})
    out = await compare(workspace, base, tf32, [])
    assert any("measured.allow_tf32 changed" in r and "training_change" in r for r in out["reasons"])
    declared = await compare(workspace, base, tf32, ["allow_tf32"])
    assert [d["classification"] for d in declared["differences"]] == ["declared_semantic"]
    # a setting one side never recorded is unverified, not "the same"
    old = window(workspace, 10, seed=4, fp=FP)
    partial = await compare(workspace, old, cand, ["threads"])
    assert any("measured.num_threads (recorded on one side only)" in u for u in partial["unverified"])
    assert any("declared change 'threads' did not happen" in r for r in partial["reasons"])


async def test_a_busy_neighbour_is_flagged_in_the_comparison(workspace: Path) -> None:
    busy = {"measured": True, "cpus": 2, "other_cpus": 1.4, "other_share": 0.7, "job_cpus": 1.0}
    base = window(workspace, 20, seed=1, host_load=[busy, {"measured": False}])
    cand = window(workspace, 10, seed=2, host_load=[{"measured": True, "other_share": 0.01}])
    out = await compare(workspace, base, cand, [])
    assert out["verdict"] == "improved"
    (warning,) = [w for w in out["warnings"] if "busy neighbour" in w]
    assert warning.startswith(f"baseline evidence {base} ") and "70%" in warning


async def test_a_topology_change_is_never_an_equivalent_speedup(workspace: Path) -> None:
    # Two ranks at 10 ms a step against one at 20 ms: "2x faster" in total, the same per device.
    base = window(workspace, 20, seed=1, execution={"world_size": 1, "workers": 0})
    cand = window(workspace, 10, seed=2, execution={"world_size": 2, "workers": 0}, world=2)
    out = await compare(workspace, base, cand, ["world_size"])
    assert out["status"] == "incomparable"
    assert any(
        r.startswith("the topology changed (world_size; measured world size 1 -> 2)") for r in out["reasons"]
    )
    per_device = await compare(workspace, base, cand, ["world_size"], per_device=True)
    assert per_device["status"] == "comparable", per_device["reasons"]
    assert per_device["verdict"] == "within_noise" and 0.9 < per_device["speedup"] < 1.1
    assert "per device" in per_device["method"]


async def test_a_step_series_swapped_after_its_check_is_never_compared(
    workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The step series is an agent-writable file: one swapped for a faster forgery as the comparison
    reads it is refused. Before, its hash was checked on one read and the samples taken from a second,
    so a forgery put in place between the two came out as a measured improvement."""
    base = window(workspace, 10.0, seed=1)
    cand = window(workspace, 10.0, seed=2)
    record = Ledger(workspace).get(cand)
    assert record is not None
    series = workspace / record.artifacts[0].path
    forged = json.loads(series.read_text())
    for w in forged["windows"]:
        w["host_step_s"] = [t / 2 for t in w["host_step_s"]]
    from perfgate.evidence import artifacts

    real = artifacts.open_file
    swapped: list[Path] = []

    def open_file(path: Path) -> Any:  # the agent swaps the file just as perfgate opens it for use
        if path.name == series.name and not swapped:
            swapped.append(path)
            series.write_text(json.dumps(forged))
        return real(path)

    monkeypatch.setattr(artifacts, "open_file", open_file)
    async with Client(build_server(ServerConfig.create(workspace))) as client:
        result = await client.call_tool("compare_benchmarks", {"baseline": [base], "candidate": [cand]})
    assert swapped
    assert result.is_error, result.structured_content
    assert "was modified after it was recorded" in result.content[0].text  # type: ignore[union-attr]
