"""profile_segment: analyze mode called directly and through the protocol; run mode on a tiny CPU run."""

from __future__ import annotations

import gzip
import json
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest
from mcp import Client
from pydantic import ValidationError

import perfgate.tools
from _trust import operator_policy
from perfgate.errors import ToolError
from perfgate.evidence import Ledger
from perfgate.security.trustroot import TrustRoot
from perfgate.server import build_server
from perfgate.serving.runtime import ServerConfig, ToolRuntime
from perfgate.tools import profile_segment
from perfgate.tools.profile_segment import ProfileSegmentInput, ProfileSegmentOutput, run

pytestmark = pytest.mark.anyio

FIXTURES = Path(__file__).parent / "fixtures" / "traces"
REPO = Path(__file__).resolve().parents[1]
PY = sys.executable
TINY = str(REPO / "examples" / "tiny_train.py")


@pytest.fixture(autouse=True)
def registry_with_profile_segment(monkeypatch: pytest.MonkeyPatch) -> None:
    if profile_segment.SPEC not in perfgate.tools.REGISTRY:
        monkeypatch.setattr(perfgate.tools, "REGISTRY", (*perfgate.tools.REGISTRY, profile_segment.SPEC))


@pytest.fixture
def traces(workspace: Path) -> Path:
    folder = workspace / "traces"
    folder.mkdir()
    shutil.copy(FIXTURES / "musa_s4000_rank1.json", folder)
    (folder / "rocm_mi300x_rank-3.json.gz").write_bytes(
        gzip.compress((FIXTURES / "rocm_mi300x_rank-3.json").read_bytes())
    )
    (folder / "notes.txt").write_text("not a trace")
    return folder


def _rt(workspace: Path) -> ToolRuntime:
    return ToolRuntime(
        config=ServerConfig.create(workspace), ledger=Ledger(workspace), tool="profile_segment"
    )


async def analyze(workspace: Path, **kwargs: Any) -> ProfileSegmentOutput:
    return await run(ProfileSegmentInput.model_validate({"mode": "analyze", **kwargs}), _rt(workspace))


async def test_a_folder_of_per_rank_traces_is_analyzed_and_recorded(workspace: Path, traces: Path) -> None:
    out = await analyze(workspace, trace_paths=["traces"], top_k=2)
    assert out.state == "executed" and out.profiled is False and out.mode == "analyze"
    assert [(r.rank, r.backend) for r in out.ranks] == [(1, "musa"), (3, "rocm")]
    assert [f.path for f in out.trace_files] == [
        "traces/musa_s4000_rank1.json",
        "traces/rocm_mi300x_rank-3.json.gz",
    ]
    assert [f.rank for f in out.trace_files] == [1, 3]
    assert out.ranks[0].path == "traces/musa_s4000_rank1.json"
    assert all(len(r.top_kernels) <= 2 for r in out.ranks)
    assert out.rank_skew is not None and out.rank_skew.ranks == 2
    record = Ledger(workspace).get(out.evidence_id)
    assert record is not None and record.tool == "profile_segment" and record.profiled is False
    assert record.result["ranks"][0]["compute_us"] == 152


async def test_hta_compatible_rounding_is_passed_through(workspace: Path, traces: Path) -> None:
    out = await analyze(workspace, trace_paths=["traces/rocm_mi300x_rank-3.json.gz"], hta_compatible=True)
    assert out.time_basis == "hta_rounded" and out.ranks[0].compute_us == 53


async def test_a_path_outside_the_workspace_is_refused(workspace: Path, tmp_path: Path) -> None:
    outside = tmp_path / "elsewhere.json"
    shutil.copy(FIXTURES / "musa_s4000_rank1.json", outside)
    with pytest.raises(ToolError, match="outside the workspace"):
        await analyze(workspace, trace_paths=[str(outside)])
    with pytest.raises(ToolError, match="outside the workspace"):
        await analyze(workspace, trace_paths=["../elsewhere.json"])


async def test_a_link_inside_a_trace_folder_cannot_reach_outside(workspace: Path, tmp_path: Path) -> None:
    outside = tmp_path / "secret_rank0.json"
    shutil.copy(FIXTURES / "musa_s4000_rank1.json", outside)
    folder = workspace / "linked"
    folder.mkdir()
    (folder / "rank0.json").symlink_to(outside)
    with pytest.raises(ToolError, match="outside the workspace"):
        await analyze(workspace, trace_paths=["linked"])


async def test_broken_traces_and_empty_folders_are_tool_errors(workspace: Path) -> None:
    data = gzip.compress((FIXTURES / "musa_s4000_rank1.json").read_bytes())
    (workspace / "cut.json.gz").write_bytes(data[: len(data) // 2])
    with pytest.raises(ToolError, match="truncated"):
        await analyze(workspace, trace_paths=["cut.json.gz"])
    (workspace / "bad.json").write_text('{"traceEvents": [{"ph": "X", "ts": 1,, }]}')
    with pytest.raises(ToolError, match="invalid JSON"):
        await analyze(workspace, trace_paths=["bad.json"])
    (workspace / "empty").mkdir()
    with pytest.raises(ToolError, match=r"no \.json or \.json\.gz trace files"):
        await analyze(workspace, trace_paths=["empty"])
    with pytest.raises(ToolError, match="does not exist"):
        await analyze(workspace, trace_paths=["missing.json"])


async def test_external_layers_are_scaffolded_capture_commands(workspace: Path) -> None:
    cmd = ["python", "train.py", "--steps", "20"]
    out = await analyze(
        workspace, command=cmd, external_layers=["system", "kernel"], external_vendor="nvidia"
    )
    assert out.state == "scaffolded" and out.ranks == []
    system, kernel = out.external_captures
    assert (system.tool, system.layer, kernel.tool, kernel.layer) == ("nsys", "system", "ncu", "kernel")
    assert system.capture_argv[:2] == ["nsys", "profile"] and system.capture_argv[-4:] == cmd
    assert "--format" in system.export_argv and system.report_path.endswith(".nsys-rep")
    assert kernel.capture_argv[-4:] == cmd and "--launch-count" in kernel.capture_argv
    assert any("not throughput" in n for n in kernel.notes)
    if shutil.which("nsys") is None:
        assert not system.available and any("not on this machine's PATH" in n for n in system.notes)
    both = await analyze(workspace, command=cmd, external_layers=["system"])
    assert {c.tool for c in both.external_captures} <= {"nsys", "msys"} and both.external_captures


async def test_moore_threads_profilers_get_msys_and_mcu_commands(workspace: Path) -> None:
    cmd = ["python", "train.py"]
    out = await analyze(
        workspace, command=cmd, external_layers=["system", "kernel"], external_vendor="mthreads"
    )
    system, kernel = out.external_captures
    assert (system.tool, kernel.tool) == ("msys", "mcu")
    assert system.capture_argv[:2] == ["msys", "profile"] and system.report_path.endswith(".msys-rep")
    assert system.export_argv[:2] == ["msys", "stats"]
    assert any("--help" in n for n in system.notes) and any("not throughput" in n for n in kernel.notes)


async def test_nsys_csv_summaries_are_imported(workspace: Path) -> None:
    csv_text = (
        "Generating SQLite file report.sqlite\n"
        '"Time (%)","Total Time (ns)","Instances","Avg (ns)","Med (ns)","Min (ns)","Max (ns)","StdDev (ns)","Name"\n'
        '"60.0","6000","3","2000.0","2000.0","1000","3000","1000.0","ampere_sgemm_128x64_nn"\n'
        '"40.0","4000","2","2000.0","2000.0","1500","2500","707.1","ncclDevKernel_AllReduce_Sum_f32_RING_LL(x)"\n'
    )
    (workspace / "run_cuda_gpu_kern_sum.csv").write_text(csv_text)
    out = await analyze(workspace, summary_paths=["run_cuda_gpu_kern_sum.csv"])
    assert out.state == "executed"
    (table,) = out.imported_summaries
    assert table.report == "cuda_gpu_kern_sum" and table.path == "run_cuda_gpu_kern_sum.csv"
    gemm, nccl = table.rows
    assert (gemm.name, gemm.count, gemm.total_us, gemm.max_us, gemm.category) == (
        "ampere_sgemm_128x64_nn", 3, 6.0, 3.0, "gemm"
    )  # fmt: skip
    assert nccl.category == "communication" and nccl.share == pytest.approx(0.4)
    (workspace / "junk.csv").write_text("a,b\n1,2\n")
    with pytest.raises(ToolError, match="Total Time"):
        await analyze(workspace, summary_paths=["junk.csv"])


def test_inputs_are_validated_per_mode() -> None:
    with pytest.raises(ValidationError, match="needs `command`"):
        ProfileSegmentInput(mode="run")
    with pytest.raises(ValidationError, match="needs trace_paths"):
        ProfileSegmentInput(mode="analyze")
    with pytest.raises(ValidationError, match="warmup"):
        ProfileSegmentInput(mode="run", command=["python", "t.py"], warmup=0)


async def test_analyze_through_the_protocol_returns_structured_output(
    workspace: Path, traces: Path, mode: str
) -> None:
    async with Client(build_server(ServerConfig.create(workspace)), mode=mode) as client:
        tools = {t.name: t for t in (await client.list_tools()).tools}
        assert "profile_segment" in tools
        result = await client.call_tool("profile_segment", {"mode": "analyze", "trace_paths": ["traces"]})
        assert not result.is_error, result.content
        out = result.structured_content
        assert out is not None and out["state"] == "executed"
        assert [r["rank"] for r in out["ranks"]] == [1, 3]
        assert {"span_us", "idle_us", "compute_us", "non_compute_us", "communication_us", "memory_us",
                "categories", "top_kernels", "top_ops", "launch", "sync"} <= set(out["ranks"][0])  # fmt: skip
        bad = await client.call_tool("profile_segment", {"mode": "analyze", "trace_paths": ["/etc/passwd"]})
        assert bad.is_error and "outside the workspace" in bad.content[0].text  # type: ignore[union-attr]


@pytest.mark.slow
async def test_run_mode_profiles_a_tiny_cpu_training_and_flags_it_profiled(workspace: Path) -> None:
    pytest.importorskip("torch")
    operator_policy(f'[execution]\n\n[[execution.allow]]\nscript = {json.dumps(TINY)}\ncode = "any"\n')
    args = {
        "mode": "run",
        "command": [PY, TINY, "--steps", "50"],
        "skip_first": 1,
        "warmup": 1,
        "active": 2,
        "timeout_s": 120,
        "top_k": 3,
    }
    async with Client(build_server(ServerConfig.create(workspace))) as client:
        result = await client.call_tool("profile_segment", args)
    assert not result.is_error, result.content
    out = result.structured_content
    assert out is not None, result.content
    assert out["state"] == "executed", out["failure_reason"]
    assert out["profiled"] is True and out["exit_code"] == 0
    (artifact,) = out["trace_artifacts"]
    assert artifact.endswith("rank0.pt.trace.json.gz") and (workspace / artifact).is_file()
    (rank,) = out["ranks"]
    assert rank["backend"] == "cpu" and rank["path"] == artifact
    assert rank["steps"] is not None and len(rank["steps"]["steps"]) == 2
    assert any("profiler overhead" in w for w in out["warnings"])
    record = Ledger(workspace).get(out["evidence_id"])
    assert record is not None and record.profiled is True
    assert any(t.endswith("/perfgate-harness.py") for t in record.command or [])
    # the same provenance block as a benchmark window: what ran, and what the process measured
    assert out["provenance"]["argv"] == args["command"] and out["provenance"]["env_changes"] == []
    assert out["provenance"]["code"]["unknown_reason"]  # the test workspace is no git checkout
    assert out["environment_fingerprint"]["device_kind"] == "cpu"
    assert out["environment_fingerprint"]["torch_version"]


async def test_a_run_of_the_same_input_is_refused_while_one_holds_its_folder(workspace: Path) -> None:
    """The run folder is named after the input (its path is in the approved command): while a run of the
    same input holds it, another is refused before anything runs or is recorded, never sharing it."""
    import hashlib

    from perfgate.execution.rundir import hold_run_dir

    operator_policy(f'[execution]\n\n[[execution.allow]]\nscript = {json.dumps(TINY)}\ncode = "any"\n')
    args = {"mode": "run", "command": [PY, TINY, "--steps", "50"], "timeout_s": 120}
    inp = ProfileSegmentInput.model_validate(args)
    key = hashlib.sha256(json.dumps(inp.model_dump(mode="json"), sort_keys=True).encode()).hexdigest()[:16]
    run_dir = TrustRoot.locate().workspace_dir(workspace) / "profile-runs" / key
    with hold_run_dir(run_dir, wait=False):  # what a run in progress (another call, another server) holds
        async with Client(build_server(ServerConfig.create(workspace))) as client:
            result = await client.call_tool("profile_segment", args)
    assert result.is_error and "same input is in progress" in result.content[0].text  # type: ignore[union-attr]
    assert Ledger(workspace).records(tool="profile_segment") == []


async def test_a_run_names_the_micro_batch_loop_with_its_line_model_and_the_harness_sample_count(
    workspace: Path,
) -> None:
    """By default a run captures stacks and module ranges: the accumulation loop of micro-batch 1 is named
    with the line that calls backward(), the model it runs, and the micro-batch from the harness counter."""
    pytest.importorskip("torch")
    operator_policy(f'[execution]\n\n[[execution.allow]]\nscript = {json.dumps(TINY)}\ncode = "any"\n')
    args = {
        "mode": "run",
        "command": [PY, TINY, "--steps", "8", "--batch", "1", "--accumulation", "16"],
        "skip_first": 1,
        "warmup": 1,
        "active": 3,
        "timeout_s": 300,
    }
    async with Client(build_server(ServerConfig.create(workspace))) as client:
        result = await client.call_tool("profile_segment", args)
    assert not result.is_error, result.content
    out = result.structured_content
    assert out is not None and out["state"] == "executed", out
    (rank,) = out["ranks"]
    code = rank["code"]
    assert code["stacks"] and code["modules"] and code["backward_passes_per_step"] == 16
    assert code["samples_per_step"] == 16
    found = [f for f in out["findings"][:3] if f["wall"] == "small_micro_batch"]
    assert found, [(f["wall"], f["summary"]) for f in out["findings"]]
    (f,) = found
    assert f["figures"]["micro_batch"] == 1
    assert "16 backward() passes of 1 sample(s) per optimizer step" in f["summary"]
    assert "tiny_train.py:" in f["code"][0]["location"] and f["code"][0]["location"].endswith(" main")
    # The model each pass runs (the module with the most forward time: the model or its loss module).
    assert f["code"][1]["module"] in ("Sequential", "CrossEntropyLoss"), f["code"]
    assert any(c["module_path"] == "Sequential" for c in code["phases"]["forward"])
