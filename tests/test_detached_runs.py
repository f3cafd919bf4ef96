"""Detached runs: a real 2-rank torchrun (gloo) that outlives its client and the server, and cancel."""

from __future__ import annotations

import os
import shutil
import signal
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from mcp import Client

from _ports import free_port
from _trust import any_code_rules, operator_policy
from perfgate.evidence import Ledger
from perfgate.security.trustroot import TrustRoot
from perfgate.server import build_server
from perfgate.serving.runtime import ServerConfig

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

PY = sys.executable
REPO = Path(__file__).resolve().parents[1]
TINY = str(REPO / "examples" / "tiny_train.py")
PACED = str(REPO / "examples" / "paced_loop.py")
CONTRACT = {
    "invariants": {"model": "tiny-mlp", "global_batch": 64},
    "execution": {"microbatch": 32, "world_size": 2},
}


@pytest.fixture
def allowed(workspace: Path) -> Path:
    torchrun = shutil.which("torchrun", path=str(Path(PY).parent)) or "torchrun"
    rules = [[PY, "-m", "perfgate.harness"], [PY, PACED], [torchrun]]
    operator_policy("[execution]\n" + any_code_rules(*rules))
    return workspace


async def call(workspace: Path, tool: str, args: dict[str, Any]) -> dict[str, Any]:
    """One call on a fresh server and client: every call here is a reconnect to a restarted server."""
    async with Client(build_server(ServerConfig.create(workspace))) as client:
        result = await client.call_tool(tool, args)
    assert not result.is_error, result.content[0].text  # type: ignore[union-attr]
    assert result.structured_content is not None
    return result.structured_content


def two_ranks(port: int, **kw: Any) -> dict[str, Any]:
    torchrun = shutil.which("torchrun", path=str(Path(PY).parent))
    if torchrun is None:
        pytest.skip("torchrun is not installed next to this interpreter")
    argv = [torchrun, "--nproc-per-node", "2", "--master-port", str(port), TINY, "--ddp", "--steps", "1000"]
    return {"command": argv, "warmup_steps": 2, "measure_steps": 6, "repeats": 1, "contract": CONTRACT, **kw}


def paced(*, steps: int, step_ms: int, measure_steps: int, **extra: Any) -> dict[str, Any]:
    """A detached run_benchmark_window of the paced script: explicit timing, one launch."""
    return {
        "command": [PY, PACED, "--steps", str(steps), "--step-ms", str(step_ms)],
        "timing": "explicit",
        "warmup_steps": 2,
        "measure_steps": measure_steps,
        "repeats": 1,
        "contract": {"invariants": {"workload": "paced"}},
        "detach": True,
        **extra,
    }


def _wait_launched(run_dir: Path) -> None:
    """Until the run's first launch has started (its stderr log exists)."""
    deadline = time.monotonic() + 60
    while not (run_dir / "launch0_stderr.log").exists():
        assert time.monotonic() < deadline
        time.sleep(0.2)


async def _wait(workspace: Path, run_id: str) -> dict[str, Any]:
    deadline = time.monotonic() + 240
    while True:
        out = await call(workspace, "benchmark_run", {"action": "wait", "run_id": run_id, "wait_s": 20})
        if out["run_state"] != "running" and out["run_state"] != "starting":
            return out
        assert time.monotonic() < deadline, out


@pytest.mark.timeout(900)  # two 2-rank torchrun runs: about 95 s on the loaded 2-core machine
async def test_a_detached_two_rank_run_survives_restarts_and_matches_the_blocking_path(allowed: Path) -> None:
    port = free_port()  # both runs on it: their argv must be the same for the comparison below
    started = await call(allowed, "run_benchmark_window", two_ranks(port, detach=True))
    assert started["state"] == "planned" and started["run_id"].startswith("run-")
    run_id = started["run_id"]
    # the server that started it is gone (its lifespan ended with the call); a new one answers
    status = await call(allowed, "benchmark_run", {"action": "status", "run_id": run_id})
    assert status["run_state"] in ("starting", "running", "finished")
    done = await _wait(allowed, run_id)
    assert done["run_state"] == "finished" and done["exit_codes"] == [0]
    assert done["latest_window"]["steps"] == 6 and done["health_verdict"] == "healthy"
    res = await call(allowed, "benchmark_run", {"action": "result", "run_id": run_id})
    detached = res["result"]
    assert res["state"] == "executed", detached["failure_reason"]
    again = await call(allowed, "benchmark_run", {"action": "result", "run_id": run_id})
    assert again["evidence_id"] == res["evidence_id"]  # recorded once

    blocking = await call(allowed, "run_benchmark_window", two_ranks(port))
    assert blocking["state"] == "executed"
    same = ("state", "world_size", "windows_measured", "steps_measured", "device", "timing", "label")
    assert {k: detached[k] for k in same} == {k: blocking[k] for k in same}
    assert detached["health"]["verdict"] == blocking["health"]["verdict"] == "healthy"
    assert [r["rank"] for r in detached["ranks"]] == [0, 1]
    # each launch names the id the server gave it (what its sample records carry as their session)
    for out in (detached, blocking):
        assert len(out["launch_ids"]) == 1 and isinstance(out["launch_ids"][0], int), out["launch_ids"]
    assert detached["launch_ids"] != blocking["launch_ids"]
    # the supervisor stamped both ranks' step boundaries as the server does for a blocking run
    for out in (detached, blocking):
        assert [c["status"] for c in out["timing_checks"]] == ["corroborated"], out["timing_checks"]

    def names(out: dict[str, Any]) -> list[str]:
        return sorted(Path(a).name for a in out["artifacts"])

    assert names(detached) == names(blocking)
    assert set(detached) == set(blocking)
    assert detached["provenance"]["argv"][:3] == blocking["provenance"]["argv"][:3]
    ledger = Ledger(allowed)
    d, b = ledger.get(res["evidence_id"]), ledger.get(blocking["evidence_id"])
    assert d is not None and b is not None
    assert d.tool == b.tool == "run_benchmark_window"
    assert d.command is not None and b.command is not None and len(d.command) == len(b.command)
    # compare_benchmarks takes the detached record like any window
    cmp = await call(allowed, "compare_benchmarks", {"baseline": [b.id], "candidate": [d.id]})
    assert cmp["status"] == "comparable", cmp["reasons"]


async def test_cancel_stops_the_run_and_its_process_group(allowed: Path) -> None:
    args = paced(steps=100000, step_ms=20, measure_steps=50000, timeout_s=300)
    started = await call(allowed, "run_benchmark_window", args)
    run_id = started["run_id"]
    run_dir = TrustRoot.locate().workspace_dir(allowed) / "detached" / run_id
    _wait_launched(run_dir)
    supervisor = int((run_dir / "supervisor.pid").read_text())
    out = await call(allowed, "benchmark_run", {"action": "cancel", "run_id": run_id})
    assert out["run_state"] == "cancelled"
    # Guards a hang only: stopping the launch may take its 5 s kill grace, and a loaded machine more.
    deadline = time.monotonic() + 60
    while True:  # the supervisor exits once it has recorded the cancellation (and is reaped)
        try:
            os.kill(supervisor, 0)
        except ProcessLookupError:
            break
        assert time.monotonic() < deadline
        time.sleep(0.1)
    res = await call(allowed, "benchmark_run", {"action": "result", "run_id": run_id})
    assert res["state"] == "failed" and "cancelled" in res["result"]["failure_reason"]
    out = await call(allowed, "benchmark_run", {"action": "cancel", "run_id": run_id})
    assert "no longer running" in out["message"]


async def test_unknown_or_malformed_run_ids_are_refused(allowed: Path) -> None:
    async with Client(build_server(ServerConfig.create(allowed))) as client:
        for run_id in ("run-0000000000000000", "../../etc", "run-zz"):
            result = await client.call_tool("benchmark_run", {"action": "status", "run_id": run_id})
            assert result.is_error
            assert "detach=true" in result.content[0].text  # type: ignore[union-attr]


def test_a_lost_supervisor_is_reported_as_lost(tmp_path: Path) -> None:
    from perfgate.execution import detached

    run_id, directory = detached.start(
        tmp_path,
        argv=[PY, "-c", "import time; time.sleep(60)"],
        cwd=tmp_path,
        env={},
        timeout_s=120,
        launches=1,
        record_dir=None,
        meta={},
    )
    pid = int((directory / "supervisor.pid").read_text())
    # Wait for the launch itself, not just the supervisor's "running": the supervisor says "running"
    # before it starts the launch, and on a loaded machine a kill in between leaves no launch to reach.
    deadline = time.monotonic() + 120
    while "pid" not in (status := detached.read_status(directory)) or status["state"] != "running":
        assert time.monotonic() < deadline, status
        time.sleep(0.1)
    os.kill(pid, signal.SIGKILL)  # a crash: no status is written
    deadline = time.monotonic() + 10
    while detached.read_status(directory)["state"] != "lost":
        assert time.monotonic() < deadline
        time.sleep(0.1)
    assert detached.run_dir(tmp_path, run_id) == directory
    # cancel still reaches the orphaned launch through its recorded process group
    assert detached.cancel(directory)
    child = int(detached.read_status(directory)["pid"])
    deadline = time.monotonic() + 10
    while _running(child):  # gone, or a zombie waiting for init to reap it
        assert time.monotonic() < deadline
        time.sleep(0.1)


def _running(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


async def test_racing_result_calls_record_a_run_once(allowed: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two 'result' calls at once (a retry, a second client) commit one record; before, each saw no
    result.json, measured and recorded its own (two records of one run, counted as two windows)."""
    import anyio

    from perfgate.tools import run_benchmark_window as rbw

    args = paced(steps=8, step_ms=1, measure_steps=4)
    run_id = (await call(allowed, "run_benchmark_window", args))["run_id"]
    assert (await _wait(allowed, run_id))["run_state"] == "finished"

    real = rbw.record_windows
    entered: list[int] = []
    both_in = anyio.Event()

    async def measure(*a: Any, **kw: Any) -> Any:  # holds the first caller until a second one arrives
        entered.append(1)
        if len(entered) >= 2:
            both_in.set()
        with anyio.move_on_after(3):  # with the lock, the second caller never gets here: go on alone
            await both_in.wait()
        return await real(*a, **kw)

    monkeypatch.setattr(rbw, "record_windows", measure)
    outs: list[dict[str, Any]] = []
    async with Client(build_server(ServerConfig.create(allowed))) as client:

        async def result() -> None:
            res = await client.call_tool("benchmark_run", {"action": "result", "run_id": run_id})
            assert not res.is_error, res.content[0].text  # type: ignore[union-attr]
            assert res.structured_content is not None
            outs.append(res.structured_content)

        async with anyio.create_task_group() as tg:
            tg.start_soon(result)
            tg.start_soon(result)
    assert len(entered) == 1
    assert len({o["evidence_id"] for o in outs}) == 1
    assert sorted(o["message"] for o in outs) == ["recorded", "recorded earlier"]
    windows = [r for r in Ledger(allowed).records(tool="run_benchmark_window") if r.state.value != "planned"]
    assert [r.id for r in windows] == [outs[0]["evidence_id"]]

    # A result.json that holds no id is refused with what to do, never taken as "not recorded yet".
    (TrustRoot.locate().workspace_dir(allowed) / "detached" / run_id / "result.json").write_text("")
    async with Client(build_server(ServerConfig.create(allowed))) as client:
        res = await client.call_tool("benchmark_run", {"action": "result", "run_id": run_id})
    assert res.is_error and "move the file aside" in res.content[0].text  # type: ignore[union-attr]
    assert len(Ledger(allowed).records(tool="run_benchmark_window")) == len(windows) + 1


async def test_a_detached_run_of_the_same_input_is_refused_while_one_runs(allowed: Path) -> None:
    """Two detached runs of one input would share the record folder named after it (each supervisor
    empties it before a launch and copies it after): the second is refused while the first holds it."""
    args = paced(steps=100000, step_ms=20, measure_steps=50000, timeout_s=300)
    run_id = (await call(allowed, "run_benchmark_window", args))["run_id"]
    run_dir = TrustRoot.locate().workspace_dir(allowed) / "detached" / run_id
    _wait_launched(run_dir)  # its supervisor holds the folder by now
    started = [run_id]
    try:
        async with Client(build_server(ServerConfig.create(allowed))) as client:
            second = await client.call_tool("run_benchmark_window", args)
        started += [second.structured_content["run_id"]] if second.structured_content else []
        assert second.is_error and "same input is in progress" in second.content[0].text  # type: ignore[union-attr]
        assert len(list((TrustRoot.locate().workspace_dir(allowed) / "detached").iterdir())) == 1
    finally:
        for started_id in started:
            await call(allowed, "benchmark_run", {"action": "cancel", "run_id": started_id})


async def _runs_finished(workspace: Path, experiment_id: str) -> dict[str, Any]:
    shown = await call(workspace, "record_decision", {"action": "show", "experiment_id": experiment_id})
    (gate,) = [g for g in shown["gates"] if g["name"] == "runs_finished"]
    return gate


async def test_a_keep_on_a_detached_run_waits_for_its_observed_end(allowed: Path) -> None:
    started = await call(allowed, "run_benchmark_window", paced(steps=60, step_ms=5, measure_steps=40))
    run_id = started["run_id"]
    opened = await call(
        allowed,
        "record_decision",
        {
            "action": "open",
            "hypothesis": "h",
            "classification": "system_optimization",
            "changed_variable": "v",
            "evidence": [{"id": started["evidence_id"], "role": "candidate"}],
        },
    )
    gate = await _runs_finished(allowed, opened["experiment_id"])
    assert gate["status"] == "failed" and run_id in gate["reason"], gate
    assert "benchmark_run(action='result'" in gate["satisfy_with"]
    done = await _wait(allowed, run_id)
    assert done["run_state"] == "finished"
    # finished on disk is not yet observed: nothing in the ledger says how it ended
    assert (await _runs_finished(allowed, opened["experiment_id"]))["status"] == "failed"
    res = await call(allowed, "benchmark_run", {"action": "result", "run_id": run_id})
    assert res["state"] == "executed"
    assert (await _runs_finished(allowed, opened["experiment_id"]))["status"] == "passed"
