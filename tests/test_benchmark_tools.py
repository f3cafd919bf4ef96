"""run_benchmark_window and compare_benchmarks through the MCP protocol, on tiny real CPU runs."""

from __future__ import annotations

import json
import shutil
import statistics
import sys
from pathlib import Path
from typing import Any

import pytest
from mcp import Client

import perfgate.tools
from _ports import free_port
from _trust import any_code_rules, operator_policy
from perfgate.benchmarking.comparing.verdict import decide
from perfgate.evidence import EvidenceDraft, EvidenceState, Ledger
from perfgate.server import build_server
from perfgate.serving.runtime import ServerConfig
from perfgate.tools import compare_benchmarks, run_benchmark_window

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

PY = sys.executable
REPO = Path(__file__).resolve().parents[1]
TINY = str(REPO / "examples" / "tiny_train.py")
PACED = str(REPO / "examples" / "paced_loop.py")
CONTRACT = {
    "invariants": {"model": "tiny-mlp", "data": "synthetic", "precision": "fp32", "global_batch": 32},
    "execution": {"microbatch": 32, "accumulation": 1, "world_size": 1},
}


@pytest.fixture(autouse=True)
def registry_with_benchmark_tools(monkeypatch: pytest.MonkeyPatch) -> None:
    specs = [
        s for s in (run_benchmark_window.SPEC, compare_benchmarks.SPEC) if s not in perfgate.tools.REGISTRY
    ]
    monkeypatch.setattr(perfgate.tools, "REGISTRY", (*perfgate.tools.REGISTRY, *specs))


@pytest.fixture
def allowed(workspace: Path) -> Path:
    """An operator allowlist for the commands these tests run (so no human is asked)."""
    torchrun = shutil.which("torchrun", path=str(Path(PY).parent)) or "torchrun"
    rules = [[PY, "-m", "perfgate.harness"], [PY, PACED], [PY, TINY], [torchrun]]
    operator_policy("[execution]\n" + any_code_rules(*rules))
    return workspace


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


def paced(step_ms: float, **kw: Any) -> dict[str, Any]:
    contract = {
        "invariants": {"workload": "paced"},
        "execution": {"step_ms": step_ms},
        "classes": {"step_ms": "execution"},
    }
    return {
        "command": [PY, PACED, "--steps", "1000", "--step-ms", str(step_ms), "--samples", "8"],
        "timing": "explicit",
        "warmup_steps": 2,
        "measure_steps": 15,
        "repeats": 3,
        "same_process": True,
        "timeout_s": 60,
        "contract": contract,
        **kw,
    }


async def test_harness_timed_tiny_training_through_the_protocol(allowed: Path, mode: str) -> None:
    out = await call(
        allowed,
        "run_benchmark_window",
        {
            "command": [PY, TINY, "--steps", "100000"],
            "warmup_steps": 3,
            "measure_steps": 8,
            "repeats": 2,
            "contract": CONTRACT,
            "label": "baseline",
        },
        mode,
    )
    assert out["state"] == "executed" and out["failure_reason"] is None
    assert out["exit_code"] == 0 and out["world_size"] == 1 and out["device"] == "cpu"
    assert out["windows_measured"] == 2 and out["steps_measured"] == 16
    assert [w["launch"] for w in out["windows"]] == [0, 1]  # two separate launches
    assert out["median_step_ms"] > 0 and out["p95_step_ms"] >= out["median_step_ms"]
    thr = out["throughput"]
    assert thr["samples_per_s"] == pytest.approx(32 * thr["steps_per_s"])
    assert out["peak_memory_kind"] == "host_rss" and out["peak_memory_bytes"] > 0
    assert 0 < out["data_wait_fraction"] < 1 and out["slowest_rank"] == 0
    assert out["contract_problems"] == [] and out["profiled"] is False
    prov = out["provenance"]
    assert prov["argv"] == [PY, TINY, "--steps", "100000"] and prov["env_changes"] == []
    # measured inside the training process at the window edge: the env var and what torch made of it
    fp = out["environment_fingerprint"]
    assert "OMP_NUM_THREADS" in fp and int(fp["num_threads"]) >= 1 and fp["matmul_precision"] == "highest"
    assert fp["deterministic_algorithms"] == "False" and fp["device_count"] == "0"
    assert len(out["host_load"]) == 2  # one per launch, measured or honestly unknown
    assert all(h["measured"] or h["unknown_reason"] for h in out["host_load"])
    assert prov["code"]["commit"] is None and "not inside a git repository" in prov["code"]["unknown_reason"]
    assert any(a.endswith("step_series.json") for a in out["artifacts"])
    assert any(a.endswith("launch1_rank0.json") for a in out["artifacts"])
    record = Ledger(allowed).get(out["evidence_id"])
    assert record is not None and record.command is not None
    assert record.command[1].endswith("/perfgate-harness.py")  # started from the trust root's copy
    assert record.inputs["contract"]["invariants"]["model"] == "tiny-mlp"
    health = out["health"]  # the losses were read at window edges
    assert health["verdict"] == "healthy" and health["losses_seen"] == 16
    assert health["finite"] and health["loss_first"] > 0
    job = out[
        "job_health"
    ]  # every step each launch recorded: its 3 warm-up steps and the windows' 8, at least
    assert job["verdict"] == "healthy" and job["losses_seen"] >= 2 * (3 + 8) and job["first_step"] == 0
    assert job["nonfinite_loss_steps"] == [] and job["loss_spikes"] == []


def _artifact(workspace: Path, out: dict[str, Any], name: str) -> Path:
    (path,) = [workspace / a for a in out["artifacts"] if a.endswith(name)]
    return path


async def test_a_known_step_time_is_measured_within_two_percent(allowed: Path) -> None:
    # Measured against the loop's own clock over the same steps, not against the 10 ms it aims at: on a
    # busy machine the paced steps stretch (and the step after a late one shrinks), and both clocks see
    # that alike; a harness that lost, split or mis-bounded steps is off by whole steps.
    command = [PY, PACED, "--steps", "1000", "--step-ms", "10", "--samples", "8", "--print-steps"]
    out = await call(allowed, "run_benchmark_window", paced(10.0, command=command))
    assert out["state"] == "executed" and out["windows_measured"] == 3
    series = json.loads(_artifact(allowed, out, "step_series.json").read_text())
    steps_ms = [s * 1e3 for w in series["windows"] for s in w["host_step_s"]]
    assert len(steps_ms) == 45  # 3 windows of 15 steps after 2 warm-up steps, one launch
    own = [float(line.rsplit(" ", 1)[1]) for line in _artifact(allowed, out, "stdout.log").read_text().splitlines() if "step_time_ms" in line]  # fmt: skip
    n = min(len(own), 2 + len(steps_ms))  # the run stops at the last step's boundary, before it prints
    assert n > 2 + 40, own
    assert sum(steps_ms[: n - 2]) == pytest.approx(sum(own[2:n]), rel=0.02)
    assert sum(steps_ms) >= 0.95 * 45 * 10.0  # paced steps: at least their period, summed
    # The answer's figures are those of the measured steps.
    assert out["median_step_ms"] == pytest.approx(statistics.median(steps_ms), rel=1e-6)
    assert out["throughput"]["samples_per_s"] == pytest.approx(8 * 45 / (sum(steps_ms) / 1e3), rel=1e-6)
    assert out["iqr_ratio"] is not None and out["noisy"] == (out["iqr_ratio"] >= 0.10)


async def test_a_four_times_faster_loop_is_improved_with_the_measured_speedup(allowed: Path) -> None:
    def loop(step_ms: float) -> dict[str, Any]:
        return paced(
            step_ms,
            same_process=False,
            contract={
                "invariants": {"workload": "paced"},
                "execution": {"step_ms": step_ms},
                "classes": {"step_ms": "execution"},
            },
        )

    # A 4x difference in pacing: load stretches steps by milliseconds (more, relatively, for the short
    # ones), which can pull the speedup well below 4 and widen the interval but not hide the change.
    base = await call(allowed, "run_benchmark_window", loop(40.0))
    cand = await call(allowed, "run_benchmark_window", loop(10.0))
    cmp = await call(
        allowed,
        "compare_benchmarks",
        {
            "baseline": [base["evidence_id"]],
            "candidate": [cand["evidence_id"]],
            "declared_changes": ["step_ms"],
        },
    )
    assert cmp["status"] == "comparable" and cmp["verdict"] == "improved" and cmp["state"] == "passed"
    # the speedup is the ratio of the two measured throughputs (total samples over total step time)
    measured = cand["throughput"]["samples_per_s"] / base["throughput"]["samples_per_s"]
    assert cmp["speedup"] == pytest.approx(measured, rel=1e-6) and cmp["speedup"] > 2.0
    assert cmp["ci_low"] > 1.0 and cmp["unit"] == "samples"
    assert cmp["ci_low"] <= cmp["speedup"] <= cmp["ci_high"]
    assert (cmp["baseline_windows"], cmp["baseline_launches"], cmp["candidate_launches"]) == (3, 3, 3)


async def test_windows_of_one_launch_give_no_verdict(allowed: Path) -> None:
    a = await call(allowed, "run_benchmark_window", paced(16.0))
    b = await call(allowed, "run_benchmark_window", paced(8.0))
    cmp = await call(
        allowed,
        "compare_benchmarks",
        {"baseline": [a["evidence_id"]], "candidate": [b["evidence_id"]], "declared_changes": ["step_ms"]},
    )
    assert (cmp["baseline_windows"], cmp["baseline_launches"]) == (3, 1)
    assert cmp["verdict"] == "insufficient_launches" and cmp["state"] == "executed"
    assert cmp["ci_low"] <= cmp["speedup"] <= cmp["ci_high"]


async def test_the_same_command_twice_is_comparable_with_no_difference(allowed: Path) -> None:
    a = await call(allowed, "run_benchmark_window", paced(8.0, same_process=False))
    b = await call(allowed, "run_benchmark_window", paced(8.0, same_process=False))
    cmp = await call(
        allowed, "compare_benchmarks", {"baseline": [a["evidence_id"]], "candidate": [b["evidence_id"]]}
    )
    # Nothing differs between two runs of one command, so they compare.
    assert cmp["status"] == "comparable" and cmp["reasons"] == []
    # The verdict is the rule's reading of the interval. On a quiet machine it is within_noise; a load
    # that changes between the two runs really does change their speed, so it may legitimately say
    # otherwise here (how rarely A-vs-A gives a verdict is tested on synthetic launches in
    # test_benchmark_compare.py).
    assert cmp["ci_low"] <= cmp["speedup"] <= cmp["ci_high"]
    assert cmp["verdict"] == decide(cmp["speedup"], cmp["ci_low"], cmp["ci_high"])
    assert cmp["state"] == ("passed" if cmp["verdict"] in ("improved", "regressed") else "executed")


async def test_torchrun_over_two_ranks_reports_the_slow_rank(allowed: Path) -> None:
    torchrun = shutil.which("torchrun", path=str(Path(PY).parent))
    if torchrun is None:
        pytest.skip("torchrun is not installed next to this interpreter")
    contract = {
        "invariants": {"model": "tiny-mlp", "global_batch": 64},
        "execution": {"microbatch": 32, "world_size": 2},
    }
    out = await call(
        allowed,
        "run_benchmark_window",
        {
            "command": [
                torchrun,
                "--nproc-per-node",
                "2",
                "--master-port",
                str(free_port()),
                TINY,
                "--ddp",
                "--steps",
                "1000",
                "--slow-rank",
                "1",
                "--slow-ms",
                "15",
            ],
            "warmup_steps": 3,
            "measure_steps": 10,
            "repeats": 1,
            "contract": contract,
        },
    )
    assert out["state"] == "executed", out["failure_reason"]
    assert out["world_size"] == 2 and out["slowest_rank"] == 1 and out["rank_skew"] > 0.2
    assert [r["rank"] for r in out["ranks"]] == [0, 1]
    assert out["ranks"][0]["collective_wait_fraction"] > out["ranks"][1]["collective_wait_fraction"]
    assert out["throughput"]["samples_per_s"] == pytest.approx(64 * out["throughput"]["steps_per_s"])
    assert out["contract_problems"] == []
    assert out["health"]["verdict"] == "healthy" and out["health"]["losses_seen"] == 10


async def test_log_timing_parses_step_times_from_stdout(allowed: Path) -> None:
    out = await call(
        allowed,
        "run_benchmark_window",
        {
            "command": [PY, TINY, "--steps", "14", "--step-ms", "10", "--log-every", "1"],
            "timing": "log",
            "log_pattern": r"step (?P<step>\d+) .*step_time_ms (?P<step_time_ms>[0-9.]+)",
            "warmup_steps": 4,
            "measure_steps": 10,
            "repeats": 1,
            "samples_per_step": 32,
        },
    )
    assert out["state"] == "executed" and out["steps_measured"] == 10
    # The window holds the step_time_ms figures the job printed for steps 4-13, not the step numbers or
    # the losses. (Not a bound on the paced 10 ms: on a busy machine a late step is followed by a short
    # one, and the median of 10 steps fell below 9.5 ms in 7-15% of windows measured under load.)
    printed = {
        int(line.split()[1]): float(line.rsplit(" ", 1)[1])
        for line in _artifact(allowed, out, "stdout.log").read_text().splitlines()
        if line.startswith("step ") and "step_time_ms" in line
    }
    assert sorted(printed) == list(range(14)), printed
    window = [printed[step] for step in range(4, 14)]
    assert out["median_step_ms"] == pytest.approx(statistics.median(window), abs=1e-3)
    assert out["ranks"][0]["step_time_source"] == "log"


async def test_a_run_that_ends_before_the_window_is_failed_evidence(allowed: Path) -> None:
    out = await call(
        allowed, "run_benchmark_window", paced(1.0, command=[PY, PACED, "--steps", "10", "--step-ms", "1"])
    )
    assert out["state"] == "failed" and out["windows_measured"] == 0
    assert "measured 8 of 45 steps" in out["failure_reason"]


async def test_a_crashing_run_is_failed_evidence_with_its_exit_status(allowed: Path) -> None:
    out = await call(allowed, "run_benchmark_window", paced(1.0, command=[PY, PACED, "--steps", "-x"]))
    assert out["state"] == "failed" and out["exit_code"] == 2
    assert "exited with status 2" in out["failure_reason"]


async def test_an_inconsistent_contract_is_refused_before_anything_runs(allowed: Path) -> None:
    bad = {
        "invariants": {"global_batch": 64},
        "execution": {"microbatch": 16, "accumulation": 2, "world_size": 1},
    }
    message = await call_error(allowed, "run_benchmark_window", paced(1.0, contract=bad))
    assert "global_batch 64 != microbatch 16 x accumulation 2 x data_parallel 1 = 32" in message
    assert Ledger(allowed).records(tool="run_benchmark_window") == []


async def test_a_declared_world_size_that_did_not_run_fails_the_evidence(allowed: Path) -> None:
    contract = {"invariants": {"workload": "paced"}, "execution": {"world_size": 4}}
    out = await call(allowed, "run_benchmark_window", paced(1.0, contract=contract))
    assert out["state"] == "failed" and "world_size 4 but 1 rank(s) ran" in out["failure_reason"]


# ---------------------------------------------------------------- refusals, on ledger records


def _window(
    ledger: Ledger,
    invariants: dict[str, Any],
    execution: dict[str, Any],
    *,
    state: EvidenceState = EvidenceState.EXECUTED,
    profiled: bool = False,
    tool: str = "run_benchmark_window",
) -> str:
    evidence_id = Ledger.new_id()
    ledger.artifact_dir(evidence_id)
    ledger.append(
        EvidenceDraft(
            id=evidence_id,
            tool=tool,
            state=state,
            inputs={"contract": {"invariants": invariants, "execution": execution}},
            result={"world_size": 1, "environment_fingerprint": {"device_kind": "cpu", "device_name": None}},
            profiled=profiled,
        )
    )
    return evidence_id


INV = {"model": "m", "precision": "bf16", "global_batch": 64}
EXE = {"microbatch": 16, "accumulation": 4, "world_size": 1, "compile": False}


async def _refusal(workspace: Path, base: str, cand: str, declared: list[str]) -> dict[str, Any]:
    out = await call(
        workspace,
        "compare_benchmarks",
        {"baseline": [base], "candidate": [cand], "declared_changes": declared},
    )
    assert out["status"] == "incomparable" and out["verdict"] == "incomparable" and out["state"] == "failed"
    return out


async def test_a_changed_invariant_is_refused(workspace: Path) -> None:
    ledger = Ledger(workspace)
    out = await _refusal(
        workspace, _window(ledger, INV, EXE), _window(ledger, {**INV, "precision": "fp8"}, EXE), []
    )
    # One reason naming the field, both values and the only honest route (a training change).
    [reason] = out["reasons"]
    assert reason.startswith("contract.invariants.precision changed ('bf16' -> 'fp8')")
    assert "training_change" in reason


async def test_an_undeclared_change_is_refused(workspace: Path) -> None:
    ledger = Ledger(workspace)
    out = await _refusal(
        workspace, _window(ledger, INV, EXE), _window(ledger, INV, {**EXE, "compile": True}), []
    )
    [reason] = out["reasons"]
    assert reason.startswith("contract.execution.compile differs (False vs True) but was not declared")
    assert out["actual_changes"] == ["compile"]


async def test_a_declared_but_absent_change_is_refused(workspace: Path) -> None:
    ledger = Ledger(workspace)
    out = await _refusal(workspace, _window(ledger, INV, EXE), _window(ledger, INV, EXE), ["compile"])
    assert out["reasons"] == ["declared change 'compile' did not happen (same value on both sides)"]


async def test_profiled_evidence_is_refused(workspace: Path) -> None:
    ledger = Ledger(workspace)
    profiled = _window(ledger, INV, EXE, profiled=True, tool="profile_segment")
    out = await _refusal(workspace, _window(ledger, INV, EXE), profiled, [])
    assert any("is profiled" in r for r in out["reasons"])


async def test_failed_evidence_is_refused(workspace: Path) -> None:
    ledger = Ledger(workspace)
    failed = _window(ledger, INV, EXE, state=EvidenceState.FAILED)
    out = await _refusal(workspace, failed, _window(ledger, INV, EXE), [])
    assert any("window" in r and " failed, so it has no step timing to compare" in r for r in out["reasons"])


async def test_windows_without_a_contract_are_refused(workspace: Path) -> None:
    ledger = Ledger(workspace)
    out = await _refusal(workspace, _window(ledger, {}, {}), _window(ledger, {}, {}), [])
    assert any("declares no contract invariants" in r for r in out["reasons"])


async def test_evidence_of_another_tool_or_unknown_ids_are_errors(workspace: Path) -> None:
    ledger = Ledger(workspace)
    other = _window(ledger, INV, EXE, tool="compute_mfu")
    assert "comes from compute_mfu" in await call_error(
        workspace, "compare_benchmarks", {"baseline": [other], "candidate": [_window(ledger, INV, EXE)]}
    )
    assert "no evidence 'ev-nope'" in await call_error(
        workspace, "compare_benchmarks", {"baseline": ["ev-nope"], "candidate": [other]}
    )
    same = _window(ledger, INV, EXE)
    assert "on both sides" in await call_error(
        workspace, "compare_benchmarks", {"baseline": [same], "candidate": [same]}
    )


async def test_semantic_keys_as_execution_and_unclassified_keys_are_refused(allowed: Path) -> None:
    fp8 = {"invariants": {"model": "m"}, "execution": {"precision": "fp8", "microbatch": 8}}
    message = await call_error(allowed, "run_benchmark_window", paced(1.0, contract=fp8))
    assert "execution.precision is a semantic setting" in message and "training_change" in message
    odd = {"invariants": {"model": "m", "layer_kind": "cheap"}, "execution": {"step_ms": 1}}
    message = await call_error(allowed, "run_benchmark_window", paced(1.0, contract=odd))
    assert "unknown contract keys ['layer_kind', 'step_ms']" in message
    lying = {
        **odd,
        "classes": {"step_ms": "execution", "layer_kind": "semantic", "global_batch": "execution"},
    }
    message = await call_error(allowed, "run_benchmark_window", paced(1.0, contract=lying))
    assert "contract.classes['global_batch'] says execution, but 'global_batch' is semantic" in message
    assert Ledger(allowed).records(tool="run_benchmark_window") == []


async def test_measured_samples_per_step_beat_the_declared_global_batch(allowed: Path) -> None:
    # The example: global_batch 32 declared while the run processed another count per step.
    lying = {
        "invariants": {"workload": "paced", "global_batch": 32},
        "execution": {"microbatch": 32, "accumulation": 1, "world_size": 1},
    }
    out = await call(allowed, "run_benchmark_window", paced(1.0, contract=lying, repeats=1))
    assert out["state"] == "failed"
    assert "contract declares global_batch 32 but the ranks processed 8 samples" in out["failure_reason"]


async def test_measured_backward_passes_and_device_beat_the_declared_contract(allowed: Path) -> None:
    # Declares 4 x 8 accumulation on a GPU; the run does 2 x 16 on the CPU (same 32 samples per step).
    lying = {
        "invariants": {**CONTRACT["invariants"], "hardware": "cuda"},
        "execution": {"microbatch": 8, "accumulation": 4, "world_size": 1},
    }
    args = {
        "command": [PY, TINY, "--steps", "100000", "--batch", "16", "--accumulation", "2"],
        "warmup_steps": 2,
        "measure_steps": 4,
        "repeats": 1,
        "contract": lying,
    }
    out = await call(allowed, "run_benchmark_window", args)
    assert out["state"] == "failed"
    assert (
        "accumulation 4 but the harness counted 2 backward pass(es) per optimizer step"
        in out["failure_reason"]
    )
    assert "contract declares hardware 'cuda' but the ranks ran on cpu" in out["failure_reason"]


async def test_a_run_of_the_same_input_is_refused_while_one_is_in_progress(
    allowed: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Runs of one input share their record folder (its path is in the approved command, so it is named
    after the input): a second one is refused while the first runs. Before, it emptied the folder the
    first had just written its records into, ran, and removed it, so the first read no records."""
    import anyio

    from perfgate.serving.runtime import ToolRuntime

    args = paced(2.0, measure_steps=5, repeats=1)
    real = ToolRuntime.run_command
    launched: list[int] = []
    second_done = anyio.Event()

    async def run_command(self: ToolRuntime, *a: Any, **kw: Any) -> Any:
        result = await real(self, *a, **kw)
        launched.append(1)
        if len(launched) == 1:  # the first launch's records are written, not yet read: the second call now
            with anyio.move_on_after(30):
                await second_done.wait()
        return result

    monkeypatch.setattr(ToolRuntime, "run_command", run_command)
    outs: dict[str, Any] = {}
    async with Client(build_server(ServerConfig.create(allowed))) as client:

        async def first() -> None:
            outs["first"] = await client.call_tool("run_benchmark_window", args)

        async with anyio.create_task_group() as tg:
            tg.start_soon(first)
            with anyio.fail_after(60):
                while not launched:
                    await anyio.sleep(0.05)
            outs["second"] = await client.call_tool("run_benchmark_window", args)
            second_done.set()
    assert not outs["first"].is_error, outs["first"].content[0].text
    assert outs["first"].structured_content["state"] == "executed"
    assert outs["first"].structured_content["windows_measured"] == 1
    assert outs["second"].is_error and "same input is in progress" in outs["second"].content[0].text
    assert len(launched) == 1
