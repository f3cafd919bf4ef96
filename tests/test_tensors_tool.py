"""compare_tensors as an agent calls it: through the MCP protocol, in memory, both protocol generations."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import blake3
import numpy as np
import pytest
from mcp import Client

import perfgate.server
from perfgate.evidence import Ledger
from perfgate.harness.dump import dump_tensors
from perfgate.server import build_server
from perfgate.serving.runtime import ServerConfig
from perfgate.tools import compare_tensors

pytestmark = pytest.mark.anyio


@pytest.fixture
def tensor_server(workspace: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """A server that registers compare_tensors (added here until the registry lists it)."""
    registered = perfgate.server.registered_specs

    def with_compare(read_only: bool) -> list[Any]:
        specs = registered(read_only)
        names = {s.name for s in specs}
        return specs if compare_tensors.SPEC.name in names else [*specs, compare_tensors.SPEC]

    monkeypatch.setattr(perfgate.server, "registered_specs", with_compare)
    return build_server(ServerConfig.create(workspace))


def write_pair(workspace: Path, change: float = 0.0) -> tuple[str, str]:
    rng = np.random.default_rng(0)
    ref = {"layer.weight": rng.standard_normal((16, 8)).astype(np.float32), "step": np.array([3])}
    cand = {k: v.copy() for k, v in ref.items()}
    cand["layer.weight"][2, 5] += change
    dump_tensors(workspace / "dumps" / "ref.safetensors", ref)
    dump_tensors(workspace / "dumps" / "cand.safetensors", cand)
    return "dumps/ref.safetensors", "dumps/cand.safetensors"


def error_text(result: Any) -> str:
    assert result.is_error
    return " ".join(getattr(c, "text", "") for c in result.content)


async def test_matching_tensors_give_passed_evidence_with_hashed_inputs(
    tensor_server: Any, workspace: Path, mode: str
) -> None:
    ref, cand = write_pair(workspace)
    progress: list[tuple[float, float | None]] = []

    async def on_progress(done: float, total: float | None, message: str | None) -> None:
        progress.append((done, total))

    async with Client(tensor_server, mode=mode) as client:
        result = await client.call_tool(
            "compare_tensors", {"reference": ref, "candidate": cand, "atol": 1e-6, "rtol": 1e-5},
            progress_callback=on_progress,
        )  # fmt: skip
    assert not result.is_error, error_text(result)
    out = result.structured_content
    assert out is not None
    assert (out["status"], out["state"], out["tensors_total"]) == ("match", "passed", 2)
    assert {t["key"]: t["compared_as"] for t in out["tensors"]} == {
        "layer.weight": "tolerance",
        "step": "exact",
    }
    for f in out["files"]:
        assert f["digest"] == "blake3:" + blake3.blake3((workspace / f["path"]).read_bytes()).hexdigest()
        assert f["other_digests"] == []  # no record written before BLAKE3 names these paths
    assert [f["role"] for f in out["files"]] == ["reference", "candidate"]
    assert progress and progress[-1][0] == progress[-1][1] == out["bytes_compared"] > 0

    ledger = Ledger(workspace)
    record = ledger.get(out["evidence_id"])
    assert record is not None
    assert (record.tool, record.state.value, record.inputs["atol"]) == ("compare_tensors", "passed", 1e-6)
    (artifact,) = record.artifacts
    assert json.loads((workspace / artifact.path).read_text())["status"] == "match"
    assert ledger.verify().ok


async def test_values_out_of_tolerance_give_failed_evidence_naming_the_element(
    tensor_server: Any, workspace: Path, mode: str
) -> None:
    ref, cand = write_pair(workspace, change=0.5)
    async with Client(tensor_server, mode=mode) as client:
        result = await client.call_tool(
            "compare_tensors", {"reference": ref, "candidate": cand, "atol": 1e-6, "rtol": 1e-5}
        )
    out = result.structured_content
    assert out is not None
    assert (out["status"], out["state"]) == ("mismatch", "failed")
    worst = out["tensors"][0]  # problems are listed first
    assert (worst["key"], worst["mismatched"], worst["max_abs_error_index"]) == ("layer.weight", 1, [2, 5])
    assert worst["max_abs_error"] == pytest.approx(0.5, rel=1e-6)
    assert "layer.weight" in out["summary"]


async def test_tolerances_are_required(tensor_server: Any, workspace: Path, mode: str) -> None:
    ref, cand = write_pair(workspace)
    async with Client(tensor_server, mode=mode) as client:
        result = await client.call_tool(
            "compare_tensors", {"reference": ref, "candidate": cand, "atol": 1e-6}
        )
    assert "rtol" in error_text(result)
    assert Ledger(workspace).records() == []


async def test_paths_escaping_the_workspace_are_refused(
    tensor_server: Any, workspace: Path, mode: str
) -> None:
    ref, _ = write_pair(workspace)
    outside = dump_tensors(workspace.parent / "outside.safetensors", {"x": np.ones(2)})
    (workspace / "link.safetensors").symlink_to(outside)
    shards = workspace / "ckpt"
    shards.mkdir()
    (shards / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"x": "s.safetensors"}}))
    (shards / "s.safetensors").symlink_to(outside)
    async with Client(tensor_server, mode=mode) as client:
        for candidate in ("../outside.safetensors", str(outside), "link.safetensors", "ckpt"):
            result = await client.call_tool(
                "compare_tensors", {"reference": ref, "candidate": candidate, "atol": 0, "rtol": 0}
            )
            assert "outside the workspace" in error_text(result), candidate
    assert Ledger(workspace).records() == []


async def test_unreadable_input_is_an_actionable_error(
    tensor_server: Any, workspace: Path, mode: str
) -> None:
    ref, cand = write_pair(workspace)
    path = workspace / cand
    path.write_bytes(path.read_bytes()[:-10])
    np.savez(workspace / "pickled.npz", x=np.array([object()], dtype=object))
    async with Client(tensor_server, mode=mode) as client:
        truncated = await client.call_tool(
            "compare_tensors", {"reference": ref, "candidate": cand, "atol": 0, "rtol": 0}
        )
        pickled = await client.call_tool(
            "compare_tensors", {"reference": ref, "candidate": "pickled.npz", "atol": 0, "rtol": 0}
        )
    assert "candidate:" in error_text(truncated) and "truncated" in error_text(truncated)
    assert "pickle" in error_text(pickled)


async def test_key_sets_that_differ_are_incomparable(tensor_server: Any, workspace: Path, mode: str) -> None:
    dump_tensors(workspace / "a.safetensors", {"x": np.ones(3), "y": np.ones(2)})
    dump_tensors(workspace / "b.safetensors", {"x": np.ones(3), "z": np.ones(2)})
    async with Client(tensor_server, mode=mode) as client:
        result = await client.call_tool(
            "compare_tensors",
            {"reference": "a.safetensors", "candidate": "b.safetensors", "atol": 0, "rtol": 0},
        )
    out = result.structured_content
    assert out is not None
    assert (out["status"], out["state"], out["missing_keys"], out["extra_keys"]) == (
        "incomparable",
        "failed",
        ["y"],
        ["z"],
    )


async def test_long_results_list_problems_first_and_keep_everything_in_the_artifact(
    tensor_server: Any, workspace: Path
) -> None:
    count = compare_tensors.MAX_LISTED + 50
    ref = {f"t{i:03d}": np.zeros(2, np.float32) for i in range(count)}
    cand = {**ref, "t123": np.ones(2, np.float32)}
    dump_tensors(workspace / "r.safetensors", ref)
    dump_tensors(workspace / "c.safetensors", cand)
    async with Client(tensor_server) as client:
        result = await client.call_tool(
            "compare_tensors",
            {"reference": "r.safetensors", "candidate": "c.safetensors", "atol": 0, "rtol": 0},
        )
    out = result.structured_content
    assert out is not None
    assert (out["tensors_total"], len(out["tensors"])) == (count, compare_tensors.MAX_LISTED)
    assert out["tensors"][0]["key"] == "t123"
    record = Ledger(workspace).get(out["evidence_id"])
    assert record is not None
    full = json.loads((workspace / record.artifacts[0].path).read_text())
    assert len(full["tensors"]) == count


async def test_cancelling_the_call_stops_the_comparison_and_records_nothing(
    workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import threading

    import anyio

    import perfgate.tensors.compare
    import perfgate.tensors.session
    from perfgate.serving.runtime import ToolRuntime
    from perfgate.tensors import ComparisonCancelled

    monkeypatch.setattr(perfgate.tensors.compare, "_PROGRESS_EVERY_BYTES", 1)  # report after every chunk
    finished = threading.Event()
    outcome: list[BaseException | None] = []
    real_compare = perfgate.tensors.session.compare_sources

    def watched_compare(*args: Any, **kwargs: Any) -> Any:
        try:
            result = real_compare(*args, **kwargs)
        except BaseException as exc:
            outcome.append(exc)
            raise
        else:
            outcome.append(None)
            return result
        finally:
            finished.set()

    monkeypatch.setattr(perfgate.tensors.session, "compare_sources", watched_compare)
    dump_tensors(workspace / "r.safetensors", {"x": np.zeros(2**21, np.float32)})  # 32 chunks
    ledger = Ledger(workspace)

    with anyio.CancelScope() as scope:

        async def cancel_on_progress(done: float, total: float | None, message: str | None) -> None:
            scope.cancel()

        rt = ToolRuntime(
            config=ServerConfig.create(workspace),
            ledger=ledger,
            tool="compare_tensors",
            report=cancel_on_progress,
        )
        inp = compare_tensors.CompareTensorsInput(
            reference="r.safetensors", candidate="r.safetensors", atol=0.0, rtol=0.0
        )
        await compare_tensors.run(inp, rt)
    assert scope.cancelled_caught
    # Wait off the event loop: the abandoned thread may still be handing a progress report to it.
    assert await anyio.to_thread.run_sync(finished.wait, 30), "the abandoned comparison thread never returned"
    assert len(outcome) == 1 and isinstance(outcome[0], ComparisonCancelled)
    assert ledger.records() == []


async def test_matching_infinities_fail_unless_explicitly_allowed(
    tensor_server: Any, workspace: Path
) -> None:
    # The example: [1, inf] vs [1, inf] passed although non-finite values must fail.
    values = {"loss": np.array([1.0, np.inf], dtype=np.float32)}
    dump_tensors(workspace / "a.safetensors", values)
    dump_tensors(workspace / "b.safetensors", {k: v.copy() for k, v in values.items()})
    args = {"reference": "a.safetensors", "candidate": "b.safetensors", "atol": 0.0, "rtol": 0.0}
    async with Client(tensor_server) as client:
        strict = await client.call_tool("compare_tensors", args)
        refused = await client.call_tool("compare_tensors", {**args, "equal_nan": True})
        allowed = await client.call_tool("compare_tensors", {**args, "allow_nonfinite": True})
    out = strict.structured_content
    assert out is not None and (out["status"], out["state"]) == ("mismatch", "failed")
    (tensor,) = out["tensors"]
    assert (tensor["mismatched"], tensor["nonfinite_reference"], tensor["nonfinite_candidate"]) == (1, 1, 1)
    assert "allow_nonfinite" in error_text(refused)
    opted = allowed.structured_content
    assert opted is not None and opted["status"] == "match"
    assert any("allow_nonfinite" in note for note in opted["notes"])
    record = Ledger(workspace).get(opted["evidence_id"])
    assert record is not None and record.inputs["allow_nonfinite"] is True
