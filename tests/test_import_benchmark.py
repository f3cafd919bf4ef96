"""import_benchmark through the MCP protocol: existing logs and benchmark files become imported windows."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from mcp import Client

from perfgate.benchmarking.reading.logformats import parse_log
from perfgate.benchmarking.windows.importing import expand_steps, health_of
from perfgate.server import build_server
from perfgate.serving.runtime import ServerConfig

pytestmark = pytest.mark.anyio

LOGS = Path(__file__).parent / "fixtures" / "logs"
CONTRACT = {
    "invariants": {"model": "gpt-125m", "global_batch": 64},
    "execution": {"microbatch": 8, "accumulation": 1, "world_size": 8},
}


async def call(workspace: Path, tool: str, args: dict[str, Any], mode: str = "auto") -> dict[str, Any]:
    async with Client(build_server(ServerConfig.create(workspace)), mode=mode) as client:
        result = await client.call_tool(tool, args)
    assert not result.is_error, result.content[0].text  # type: ignore[union-attr]
    assert result.structured_content is not None
    return result.structured_content


async def call_error(workspace: Path, tool: str, args: dict[str, Any]) -> str:
    async with Client(build_server(ServerConfig.create(workspace))) as client:
        result = await client.call_tool(tool, args)
    assert result.is_error
    return result.content[0].text  # type: ignore[union-attr]


@pytest.fixture
def logs(workspace: Path) -> Path:
    target = workspace / "logs"
    shutil.copytree(LOGS, target)
    return target


async def test_a_megatron_log_imports_with_world_size_memory_and_health(logs: Path, mode: str) -> None:
    out = await call(
        logs.parent,
        "import_benchmark",
        {
            "paths": ["logs/megatron_8rank.log"],
            "format": "megatron",
            "warmup_steps": 20,
            "contract": CONTRACT,
        },
        mode,
    )
    assert out["state"] == "executed"
    assert out["provenance"] == "imported"
    assert "not launched by perfgate" in out["provenance_note"]
    assert out["world_size"] == 8
    assert "using world size" in out["world_size_source"]
    # lines 40..200 are past the warm-up (the first line's interval is unknown): 17 lines x 10 iterations
    assert out["windows_measured"] == 3
    assert out["steps_measured"] == 168
    assert 1515 < out["median_step_ms"] < 1535
    assert out["throughput"]["samples_per_s"] == pytest.approx(64 / (out["throughput"]["steps_per_s"] ** -1))
    assert out["throughput"]["tokens_per_s"] == pytest.approx(out["throughput"]["samples_per_s"] * 1024)
    assert out["peak_memory_bytes"] == int(30720.25 * 2**20)
    assert out["peak_memory_kind"] == "device_allocated"
    assert out["contract_problems"] == []
    health = out["health"]
    assert health["verdict"] == "unhealthy"
    assert health["nan_iterations"] == 1
    assert health["nonfinite_loss_steps"] == [160]
    assert health["explained_skips"] == 1  # step 120: the loss scale dropped
    assert health["unexplained_skips"] == 1  # step 180: it did not
    assert health["whole_log_skipped_iterations"] == 4  # the 2 in the warm-up are outside the windows
    assert health["loss_trend"] < 0
    assert any("no environment_id" in w for w in out["warnings"])


async def test_a_world_size_contradicting_the_log_is_refused(logs: Path) -> None:
    text = await call_error(
        logs.parent,
        "import_benchmark",
        {"paths": ["logs/megatron_8rank.log"], "format": "megatron", "world_size": 1},
    )
    assert "contradicts the log" in text


async def test_a_contract_contradicting_the_logged_world_size_fails_the_evidence(logs: Path) -> None:
    contract = {"invariants": {"model": "m"}, "execution": {"world_size": 4}}
    out = await call(
        logs.parent,
        "import_benchmark",
        {"paths": ["logs/megatron_8rank.log"], "format": "megatron", "contract": contract},
    )
    assert out["state"] == "failed"
    assert "world_size 4" in out["failure_reason"]


async def test_a_nanogpt_log_excludes_eval_and_checkpoint_iterations(logs: Path) -> None:
    out = await call(
        logs.parent,
        "import_benchmark",
        {
            "paths": ["logs/nanogpt.log"],
            "format": "nanogpt",
            "warmup_steps": 10,
            "windows": 1,
            "world_size": 8,
        },
    )
    # iterations 10..300 sampled every 10; 100, 200 and 300 ran an evaluation (2500 ms): excluded
    assert out["steps_measured"] == 27
    assert out["median_step_ms"] < 300
    assert out["world_size"] == 8
    assert out["world_size_source"] == "given by the caller"
    assert out["throughput"]["tokens_per_s"] == pytest.approx(491520 * out["throughput"]["steps_per_s"])
    assert out["health"]["verdict"] == "healthy"


async def test_a_world_size_the_contract_declares_is_used_when_the_log_does_not_say(logs: Path) -> None:
    # nanoGPT's log states no world size: the declared one is taken (and said to be declared), no warning
    args: dict[str, Any] = {
        "paths": ["logs/nanogpt.log"],
        "format": "nanogpt",
        "warmup_steps": 10,
        "windows": 1,
    }
    declared = {**args, "contract": {"invariants": {"model": "gpt2"}, "execution": {"world_size": 8}}}
    out = await call(logs.parent, "import_benchmark", declared)
    assert out["world_size"] == 8 and out["failure_reason"] is None
    assert "declared in the contract" in out["world_size_source"]
    assert not any("world size is unknown" in w for w in out["warnings"])
    # without the declaration the warning stays, and names both ways to give it
    bare = await call(logs.parent, "import_benchmark", args)
    assert bare["world_size"] is None
    assert any("declare execution.world_size" in w for w in bare["warnings"])


async def test_a_torchtitan_log_derives_step_time_from_tps(logs: Path) -> None:
    out = await call(
        logs.parent,
        "import_benchmark",
        {"paths": ["logs/torchtitan.log"], "format": "torchtitan", "warmup_steps": 0, "windows": 1},
    )
    assert out["world_size"] == 8
    # 64 x 2048 tokens over 8 devices at 16384 tokens/s per device: 1 s per step
    assert out["median_step_ms"] == pytest.approx(1000.0)
    assert out["peak_memory_kind"] == "device_reserved"
    assert out["peak_memory_bytes"] == int(41.85 * 2**30)


async def test_per_rank_logs_find_the_slowest_rank(workspace: Path) -> None:
    for rank, ms in ((0, 100.0), (1, 130.0)):
        d = workspace / "run" / "attempt_0" / str(rank)
        d.mkdir(parents=True)
        lines = [f"step {s} time {ms + (s % 3):.1f}ms loss {5 - s / 100:.3f}" for s in range(1, 41)]
        (d / "stdout.log").write_text("\n".join(lines) + "\n")
    out = await call(
        workspace,
        "import_benchmark",
        {
            "paths": ["run/attempt_0/*/stdout.log"],
            "format": "regex",
            "pattern": r"step (?P<step>\d+) time (?P<step_time_ms>[0-9.]+)ms loss (?P<loss>\S+)",
            "interval_mean": False,
            "warmup_steps": 4,
        },
    )
    assert out["world_size"] == 2
    assert out["world_size_source"] == "2 per-rank log files"
    assert [s["rank"] for s in out["sources"]] == [0, 1]
    assert out["slowest_rank"] == 1
    assert out["rank_skew"] == pytest.approx(0.3, abs=0.02)
    assert out["health"]["verdict"] == "healthy"


async def test_imported_windows_compare_with_imported_windows_and_are_labelled(workspace: Path) -> None:
    def bench(name: str, seconds: list[float]) -> None:
        doc = {
            "schema_version": 2,
            "invariants": {"model": "resnet50", "global_batch": 256},
            "execution": {"microbatch": 256, "accumulation": 1, "world_size": 1, "compile": name == "cand"},
            "unit": "samples",
            "runs": [{"seconds": s, "units": 256 * 100, "steps": 100} for s in seconds],
        }
        (workspace / f"{name}.json").write_text(json.dumps(doc))

    bench("base", [20.0, 20.4, 19.8])
    bench("cand", [10.0, 10.2, 9.9])
    base = await call(workspace, "import_benchmark", {"paths": ["base.json"], "format": "benchmark_json"})
    cand = await call(workspace, "import_benchmark", {"paths": ["cand.json"], "format": "benchmark_json"})
    assert base["windows_measured"] == 3
    assert base["contract"]["execution"]["compile"] is False
    cmp = await call(
        workspace,
        "compare_benchmarks",
        {
            "baseline": [base["evidence_id"]],
            "candidate": [cand["evidence_id"]],
            "declared_changes": ["compile"],
        },
    )
    assert cmp["status"] == "comparable"
    assert cmp["speedup"] == pytest.approx(2.0, rel=0.03)
    assert any("imported, not launched by perfgate" in w for w in cmp["warnings"])
    # an undeclared change is still refused for imported windows
    cmp = await call(
        workspace,
        "compare_benchmarks",
        {"baseline": [base["evidence_id"]], "candidate": [cand["evidence_id"]]},
    )
    assert cmp["status"] == "incomparable"


async def test_schema_1_benchmark_files_keep_protocol_and_measurement_as_invariants(workspace: Path) -> None:
    doc = {
        "schema_version": 1,
        "protocol": {"model": "m", "batch": 32},
        "measurement": {"unit": "samples", "warmup": 5},
        "runs": [{"seconds": 2.0, "samples": 640}],
    }
    (workspace / "b1.json").write_text(json.dumps(doc))
    out = await call(workspace, "import_benchmark", {"paths": ["b1.json"], "format": "benchmark_json"})
    assert out["contract"]["invariants"]["protocol.batch"] == 32
    assert out["throughput"]["samples_per_s"] == pytest.approx(320.0)


@pytest.mark.parametrize(
    ("doc", "needle"),
    [
        ({"schema_version": 3, "runs": []}, "schema_version must be 1 or 2"),
        (
            {
                "schema_version": 2,
                "invariants": {"m": 1},
                "unit": "samples",
                "runs": [{"seconds": -1, "units": 5}],
            },
            "positive",
        ),
        (
            {
                "schema_version": 2,
                "invariants": {"m": 1},
                "unit": "furlongs",
                "runs": [{"seconds": 1, "units": 5}],
            },
            "unit",
        ),
        (
            {"schema_version": 2, "invariants": {}, "runs": [{"seconds": 1, "units": 5}]},
            "non-empty invariants",
        ),
    ],
)
async def test_bad_benchmark_files_are_refused_with_the_reason(
    workspace: Path, doc: Any, needle: str
) -> None:
    (workspace / "bad.json").write_text(json.dumps(doc))
    text = await call_error(
        workspace, "import_benchmark", {"paths": ["bad.json"], "format": "benchmark_json"}
    )
    assert needle in text


async def test_imported_and_launched_windows_are_not_compared(workspace: Path, logs: Path) -> None:
    from perfgate.evidence import EvidenceDraft, EvidenceState, Ledger

    imported = await call(
        workspace,
        "import_benchmark",
        {"paths": ["logs/megatron_8rank.log"], "format": "megatron", "contract": CONTRACT},
    )
    ledger = Ledger(workspace)
    ledger.append(
        EvidenceDraft(
            id="launched1",
            tool="run_benchmark_window",
            state=EvidenceState.EXECUTED,
            inputs={"contract": CONTRACT},
            result={"world_size": 8, "environment_fingerprint": {}},
        )
    )
    cmp = await call(
        workspace, "compare_benchmarks", {"baseline": ["launched1"], "candidate": [imported["evidence_id"]]}
    )
    assert cmp["status"] == "incomparable"
    assert any("measured in different ways" in r for r in cmp["reasons"])


async def test_bad_input_is_refused_and_records_nothing(workspace: Path, logs: Path) -> None:
    text = await call_error(
        workspace, "import_benchmark", {"paths": ["logs/nanogpt.log"], "format": "megatron"}
    )
    assert "no megatron step line" in text
    text = await call_error(workspace, "import_benchmark", {"paths": ["../etc/passwd"], "format": "nanogpt"})
    assert "outside the workspace" in text
    text = await call_error(
        workspace,
        "import_benchmark",
        {"paths": ["logs/nanogpt.log"], "format": "regex", "pattern": "(?P<step>\\d+)"},
    )
    assert "step_time_ms" in text
    from perfgate.evidence import Ledger

    assert [r for r in Ledger(workspace).records() if r.tool == "import_benchmark"] == []


def test_health_explains_a_skip_only_by_a_scale_drop() -> None:
    lines = [
        "iteration 10/100 | elapsed time per iteration (ms): 10.0 | lm loss: 2.0 | loss scale: 1024.0 | number of skipped iterations: 0 | number of nan iterations: 0 |",
        "iteration 20/100 | elapsed time per iteration (ms): 10.0 | lm loss: 1.9 | loss scale: 512.0 | number of skipped iterations: 1 | number of nan iterations: 0 |",
        "iteration 30/100 | elapsed time per iteration (ms): 10.0 | lm loss: 1.8 | loss scale: 512.0 | number of skipped iterations: 1 | number of nan iterations: 0 |",
    ]
    parsed = parse_log(lines, "megatron")
    h = health_of(parsed.entries)
    assert (h.explained_skips, h.unexplained_skips, h.verdict) == (1, 1, "unhealthy")
    assert list(expand_steps(parsed, 0)) == list(range(11, 31))


def test_a_restarted_log_is_refused() -> None:
    parsed = parse_log(
        ["iter 1: loss 2.0, time 5.0ms", "iter 2: loss 2.0, time 5.0ms", "iter 1: loss 2.0, time 5.0ms"],
        "nanogpt",
    )
    with pytest.raises(Exception, match="backwards"):
        expand_steps(parsed, 0)


async def test_a_user_pattern_runs_in_linear_time_or_is_refused(workspace: Path) -> None:
    (workspace / "a.log").write_text("a" * 5000 + "!\n" + "step 1 time 5.0ms\nstep 2 time 5.0ms\n")
    pattern = r"(?:(a+)+$)|step (?P<step>\d+) time (?P<step_time_ms>[0-9.]+)ms"  # catastrophic under re
    out = await call(
        workspace,
        "import_benchmark",
        {"paths": ["a.log"], "format": "regex", "pattern": pattern, "warmup_steps": 0, "windows": 1},
    )
    assert out["steps_measured"] == 1  # the first line's interval is unknown; step 2 is used
    text = await call_error(
        workspace,
        "import_benchmark",
        {"paths": ["a.log"], "format": "regex", "pattern": r"(?P<step>\d+) (?P<step_time_ms>\d+) \1"},
    )
    assert "Backreferences" in text
