"""Issue 49 item 3: the whole job measured beside the windows.

A real tiny CPU training run, shaped like nanoGPT's loop (an evaluation pass under ``no_grad`` before the
first step and every few steps, a ``torch.save`` checkpoint, a first step that pays for a compile), run with
``job=true``: the answer splits the time to its last step into start-up, the first steps' excess, the steps,
evaluation and checkpoint phases, on the server's clock. Then two such jobs compared: a candidate whose steps
are faster but whose compile is far longer gets a slower job, and the answer and the keep say so (a gate when
the contract's objective is time_to_train).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from mcp import Client

from _trust import operator_policy
from perfgate.benchmarking.reading.records import read_record
from perfgate.benchmarking.runs.job import compare_jobs, job_timing
from perfgate.server import build_server
from perfgate.serving.runtime import ServerConfig

pytestmark = pytest.mark.anyio

PY = sys.executable

TRAIN = """
import os, time
import torch
import perfgate.harness
torch.manual_seed(0)
step_sleep = float(os.environ.get("STEP_SLEEP", "0.01"))
compile_sleep = float(os.environ.get("COMPILE_SLEEP", "0.3"))
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x, y = torch.randn(32, 16), torch.randn(32, 1)

@torch.no_grad()
def evaluate():
    model.eval()
    for _ in range(4):
        model(x)
        time.sleep(0.01)
    model.train()

for it in range(ITERS):
    if it % 10 == 0:
        evaluate()
    loss = torch.nn.functional.mse_loss(model(x), y)
    if it == 0:
        time.sleep(compile_sleep)  # what a first forward's compile costs
    opt.zero_grad()
    loss.backward()
    time.sleep(step_sleep)
    opt.step()
    if it % 15 == 14:
        torch.save(model.state_dict(), "ckpt.pt")
with perfgate.harness.phase("export"):
    time.sleep(0.05)
print("done")
"""


def _script(iters: int = 40) -> str:
    return TRAIN.replace("ITERS", str(iters))


def _harness(cwd: Path, warmup: int, measure: int, *, job: bool) -> subprocess.CompletedProcess[str]:
    """train.py in ``cwd`` under ``python -m perfgate.harness`` (records in ``rec``), as a job run or not."""
    return subprocess.run(
        [
            PY,
            "-m",
            "perfgate.harness",
            "--warmup-steps",
            str(warmup),
            "--measure-steps",
            str(measure),
            "--record-dir",
            "rec",
            "--",
            "train.py",
        ],
        cwd=cwd,
        env={**os.environ, "PERFGATE_JOB": "1"} if job else None,
        capture_output=True,
        text=True,
        timeout=180,
    )


def test_a_job_run_records_every_step_and_its_phases(tmp_path: Path) -> None:
    """The harness alone: nothing stops the script after its windows, every step and loss is kept, and each
    evaluation pass, checkpoint and marked phase is one phase at the step it ran in."""
    (tmp_path / "train.py").write_text(_script(40))
    done = _harness(tmp_path, 3, 5, job=True)
    assert done.returncode == 0, done.stderr
    assert "done" in done.stdout  # the script ran to its end
    record = read_record(tmp_path / "rec" / "rank0.json")
    assert record.steps.count == 40 and record.job is not None and record.job.measured
    kinds = [(p.kind, p.step, p.calls) for p in record.job.phases]
    assert [k for k in kinds if k[0] == "eval"] == [("eval", s, 4) for s in (0, 10, 20, 30)]
    assert [k for k in kinds if k[0] == "checkpoint"] == [("checkpoint", 15, 1), ("checkpoint", 30, 1)]
    assert kinds[-1] == ("export", 40, 1)  # after the last step
    # the evaluation before the first step ran before the first training forward
    assert record.job.train_start_ns is not None and record.job.phases[0].end_ns <= record.job.train_start_ns
    # every step's loss outside the one window (warm-up and the 32 steps after it) is kept for health
    assert record.outside_windows is not None and len(record.outside_windows.loss) == 35
    timed = job_timing(0, [record], None)
    assert timed is not None and not timed.observed and timed.wall_s is None
    parts = {p.name: p for p in timed.parts}
    assert parts["eval"].passes == 4 and parts["checkpoint"].passes == 2 and parts["export"].passes == 1
    assert parts["warmup_excess"].seconds >= 0.25  # the 0.3 s compile, less the steady step
    total = sum(p.seconds for p in timed.parts)
    assert total == pytest.approx(timed.time_to_last_step_s + parts["export"].seconds, rel=0.02)


def test_a_distributed_checkpoint_save_is_a_checkpoint_phase(tmp_path: Path) -> None:
    """torch.distributed.checkpoint.save, imported by the script after the harness started (as torchtitan
    does), is timed as a checkpoint like torch.save."""
    script = _script(20).replace(
        'torch.save(model.state_dict(), "ckpt.pt")',
        'dcp.save({"model": model.state_dict()}, checkpoint_id="dcp_ckpt")',
    )
    (tmp_path / "train.py").write_text("import torch.distributed.checkpoint as dcp\n" + script)
    done = _harness(tmp_path, 2, 3, job=True)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "dcp_ckpt").is_dir()
    record = read_record(tmp_path / "rec" / "rank0.json")
    assert record.job is not None
    assert [(p.kind, p.step) for p in record.job.phases if p.kind == "checkpoint"] == [("checkpoint", 15)]


def test_without_job_the_harness_stops_after_its_windows(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(_script(40))
    done = _harness(tmp_path, 3, 5, job=False)
    assert done.returncode == 0, done.stderr
    record = read_record(tmp_path / "rec" / "rank0.json")
    assert record.steps.count == 8 and "done" not in done.stdout
    assert record.job is not None and not record.job.measured
    assert job_timing(0, [record], None) is None


def test_a_phase_name_outside_its_alphabet_is_refused() -> None:
    import perfgate.harness

    for bad in ("", "x" * 41, "eval; rm -rf /", "a b"):
        with pytest.raises(ValueError, match="phase name"):
            perfgate.harness.phase(bad)
    with perfgate.harness.phase("eval"):  # no window: nothing recorded, nothing raised
        pass


@pytest.fixture
def ws(workspace: Path) -> Path:
    rules = "".join(
        f'\n[[execution.allow]]\nargv = {json.dumps(p)}\ncode = "any"\nenv = ["STEP_SLEEP", "COMPILE_SLEEP"]\n'
        for p in ([PY, "-m", "perfgate.harness"], [PY, "train.py"])
    )
    operator_policy("[execution]\n" + rules)
    (workspace / "train.py").write_text(_script(40))
    return workspace


CONTRACT = {"invariants": {"model": "mlp", "dataset": "random", "precision": "fp32", "global_batch": 32}}


async def _window(client: Client, env: dict[str, str], objective: str | None = None) -> dict[str, Any]:
    contract = json.loads(json.dumps(CONTRACT))
    if objective is not None:
        contract["invariants"]["objective"] = objective
    result = await client.call_tool(
        "run_benchmark_window",
        {
            "command": [PY, "train.py"],
            "env": env,
            "warmup_steps": 3,
            "measure_steps": 5,
            "repeats": 2,
            "job": True,
            "timeout_s": 180,
            "contract": contract,
        },
    )
    out = result.structured_content
    assert out is not None and out["state"] == "executed", result.content
    return out


@pytest.mark.timeout(900)
async def test_the_whole_job_is_measured_compared_and_gated(ws: Path) -> None:
    async with Client(build_server(ServerConfig.create(ws))) as client:
        base = await _window(client, {"STEP_SLEEP": "0.02", "COMPILE_SLEEP": "0.1"}, "time_to_train")
        job = base["job"]
        assert job["launches"] == 2 and job["observed"] is True
        assert base["summary"] == job["summary"] and job["summary"].startswith(
            "job (2 launch(es), medians): "
        )
        assert "eval " in job["summary"] and " x4" in job["summary"] and "; wall " in job["summary"]
        assert len(base["job_launches"]) == 2
        parts = {p["name"]: p for p in job["parts"]}
        assert parts["eval"]["passes"] == 4 and parts["checkpoint"]["passes"] == 2
        assert parts["steps"]["passes"] == 40 and parts["startup"]["seconds"] > 0
        assert job["wall_s"] >= job["time_to_last_step_s"] > 40 * 0.02
        # the parts add up to the time to the last step the server observed (after_last_step apart)
        for launch in base["job_launches"]:
            split = {p["name"]: p["seconds"] for p in launch["parts"]}
            inside = sum(v for k, v in split.items() if k not in ("after_last_step", "export"))
            assert inside == pytest.approx(launch["time_to_last_step_s"], rel=0.05, abs=0.05)
            assert split["after_last_step"] >= split["export"]

        # faster steps, a far longer compile (10 s: on a host at load 5, launches vary by 4 s): the steps improve, the job does not
        cand = await _window(client, {"STEP_SLEEP": "0.005", "COMPILE_SLEEP": "10"}, "time_to_train")
        compared = await client.call_tool(
            "compare_benchmarks",
            {
                "baseline": [base["evidence_id"]],
                "candidate": [cand["evidence_id"]],
                "declared_changes": ["env:STEP_SLEEP", "env:COMPILE_SLEEP"],
            },
        )
        out = compared.structured_content
        assert out is not None and out["status"] == "comparable", out
        assert out["job"]["verdict"] == "slower" and out["job"]["contradicts_steps"] is True, out["job"][
            "summary"
        ]
        assert out["job"]["parts"][0]["name"] == "warmup_excess" and out["job"]["parts"][0]["change_s"] > 2
        assert "the steps got faster (median step" in out["caution"], out["caution"]
        text = compared.content[0].text  # pyright: ignore[reportAttributeAccessIssue]
        assert text.index("the whole job got slower") < text.index("compare_benchmarks: ")

        opened = await client.call_tool(
            "record_decision",
            {
                "action": "open",
                "hypothesis": "less sleeping per step",
                "classification": "system_optimization",
                "changed_variable": "env:STEP_SLEEP",
                "tolerance": {"atol": 0, "rtol": 0},
            },
        )
        assert opened.structured_content is not None
        exp = opened.structured_content["experiment_id"]
        shown = await client.call_tool(
            "record_decision",
            {
                "action": "show",
                "experiment_id": exp,
                "evidence": [{"id": out["evidence_id"], "role": "comparison"}],
            },
        )
        assert shown.structured_content is not None
        gate = next(g for g in shown.structured_content["gates"] if g["name"] == "job_time")
        assert gate["status"] == "failed" and "time_to_train" in gate["reason"], gate
        assert "job=true" in gate["satisfy_with"]


def _timing(launch: int, wall: float, parts: dict[str, float], inside: int = 0) -> Any:
    from perfgate.benchmarking.runs.job import JobPart, JobTiming

    return JobTiming(
        launch=launch,
        observed=True,
        wall_s=wall,
        time_to_last_step_s=wall - 0.1,
        steps=100,
        steady_step_ms=10.0,
        parts=[JobPart(name=k, seconds=v) for k, v in parts.items()],
        phases_in_windows=inside,
    )


def test_a_pooled_figure_both_the_median_step_and_the_job_contradict_is_never_reported_alone() -> None:
    """The issue's case: a checkpoint inside the baseline's windows only makes the pooled speedup read 57x
    while the median step moved 1.1x and the job 1.3x."""
    base = [_timing(k, 13.0 + k * 0.1, {"steps": 10, "checkpoint": 3}, inside=1) for k in range(3)]
    cand = [_timing(k, 10.0 + k * 0.1, {"steps": 9, "checkpoint": 1}) for k in range(3)]
    job = compare_jobs(base, cand, pooled_speedup=57.0, median_step_speedup=1.1, min_effect=0.01)
    assert job is not None and job.verdict == "faster" and not job.contradicts_steps
    assert job.headline_contradicted is not None and "57.000x" in job.headline_contradicted
    assert "1.100x" in job.headline_contradicted and f"{job.speedup:.3f}x" in job.headline_contradicted
    assert job.unlike_windows is not None and "baseline 1, candidate 0" in job.unlike_windows
    # a pooled figure the median step agrees with stands
    agreed = compare_jobs(base, cand, pooled_speedup=1.12, median_step_speedup=1.1, min_effect=0.01)
    assert agreed is not None and agreed.headline_contradicted is None


def test_overlapping_launches_are_no_change_of_the_job() -> None:
    base = [_timing(k, w, {"steps": w}) for k, w in enumerate((10.0, 10.6, 10.3))]
    cand = [_timing(k, w, {"steps": w}) for k, w in enumerate((10.2, 10.5, 9.9))]
    job = compare_jobs(base, cand, pooled_speedup=1.0, median_step_speedup=1.0, min_effect=0.01)
    assert job is not None and job.verdict == "same" and "no clear change" in job.summary
