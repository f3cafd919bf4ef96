"""Slurm as the launcher, against a real single-node Slurm (scripts/slurm-single-node.sh; skipped without one).

A 2-rank gloo job through salloc + srun gives per-rank evidence with node facts, the slowest rank and
health; cancelling a detached Slurm run scancels the job and leaves no process; the approval covers
every resource of the submission, and the operator's allowlist never approves one.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from mcp import Client
from mcp.types import ElicitRequestParams, ElicitResult

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


class Human:
    """Accepts every elicitation, keeping what it was shown."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    async def __call__(self, context: Any, params: ElicitRequestParams) -> ElicitResult:
        self.asked.append(params.message)
        return ElicitResult(action="accept", content={"note": ""})


async def call(
    workspace: Path, tool: str, args: dict[str, Any], human: Human | None = None, error: bool = False
) -> Any:
    async with Client(build_server(ServerConfig.create(workspace)), elicitation_callback=human) as client:
        result = await client.call_tool(tool, args)
    text = result.content[0].text  # type: ignore[union-attr]
    assert result.is_error == error, text
    return text if error else result.structured_content


def _squeue(job: str) -> str:
    return subprocess.run(
        ["squeue", "-h", "-j", job, "-o", "%T"], capture_output=True, text=True
    ).stdout.strip()


def _processes_mentioning(needle: str) -> list[int]:
    found: list[int] = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if needle.encode() in cmdline:
            found.append(int(entry.name))
    return found


async def test_a_two_rank_gloo_job_through_slurm_gives_per_rank_evidence(
    workspace: Path, slurm_partition: str
) -> None:
    human = Human()
    args = {
        "command": [PY, TINY, "--ddp", "--steps", "1000", "--slow-rank", "1", "--slow-ms", "15"],
        "launcher": "slurm",
        "slurm": {"ntasks_per_node": 2, "partition": slurm_partition},
        "warmup_steps": 3,
        "measure_steps": 10,
        "repeats": 1,
        "timeout_s": 240,
        "contract": CONTRACT,
    }
    out = await call(workspace, "run_benchmark_window", args, human)
    assert out["state"] == "executed", out["failure_reason"]
    # the human saw the whole submission: the launcher, tasks, partition and time limit
    (asked,) = human.asked
    for shown in (
        "perfgate.execution.slurm",
        "--ntasks-per-node=2",
        f"--partition={slurm_partition}",
        "--time=4",
    ):
        assert shown in asked
    assert out["world_size"] == 2 and [r["rank"] for r in out["ranks"]] == [0, 1]
    assert out["slowest_rank"] == 1 and out["rank_skew"] > 0.2
    assert out["health"]["verdict"] == "healthy" and out["health"]["losses_seen"] == 10
    jobs = {r["node"]["slurm_job_id"] for r in out["ranks"]}
    assert len(jobs) == 1 and None not in jobs  # both ranks ran in one Slurm job
    for r in out["ranks"]:
        assert r["hostname"] and r["node"]["slurm_node"] and r["node"]["cpus"] >= 1
        assert r["node"]["device"] == "cpu" and isinstance(r["node"]["interconnect"], list)
    names = {Path(a).name for a in out["artifacts"]}
    assert {"rank0.json", "rank1.json"} <= {n.removeprefix("launch0_") for n in names}
    record = Ledger(workspace).get(out["evidence_id"])
    assert record is not None and record.command is not None
    assert record.command[1:4] == ["-P", "-m", "perfgate.execution.slurm"]
    (job,) = jobs
    assert job is not None and _squeue(job) == ""  # the allocation was released


async def test_torchrun_under_slurm_rendezvouses_from_the_allocation_and_gathers_the_same_way(
    workspace: Path, slurm_partition: str
) -> None:
    """One torchrun per node (here one node) with its c10d rendezvous taken from the allocation
    (PET_RDZV_*): the multi-node form; its workers' records come back through srun like srun's ranks'."""
    torchrun = shutil.which("torchrun", path=str(Path(PY).parent))
    if torchrun is None:
        pytest.skip("torchrun is not installed next to this interpreter")
    args = {
        "command": [torchrun, "--nproc-per-node", "2", TINY, "--ddp", "--steps", "1000"],
        "launcher": "slurm",
        "slurm": {"nodes": 1, "ntasks_per_node": 1, "cpus_per_task": 2, "partition": slurm_partition},
        "warmup_steps": 2,
        "measure_steps": 6,
        "repeats": 1,
        "timeout_s": 240,
        "contract": CONTRACT,
    }
    out = await call(workspace, "run_benchmark_window", args, Human())
    assert out["state"] == "executed", out["failure_reason"]
    assert out["world_size"] == 2 and [r["rank"] for r in out["ranks"]] == [0, 1]
    assert out["health"]["verdict"] == "healthy" and out["slowest_rank"] in (0, 1)
    assert len({r["node"]["slurm_job_id"] for r in out["ranks"]}) == 1


async def test_cancel_of_a_detached_slurm_run_scancels_the_job(workspace: Path, slurm_partition: str) -> None:
    loop = workspace / "loop.py"  # a path of its own: the run's processes can be found by it
    loop.write_text(
        f"import runpy, sys\nsys.argv[0] = {PACED!r}\nrunpy.run_path({PACED!r}, run_name='__main__')\n"
    )
    args = {
        "command": [PY, str(loop), "--steps", "100000", "--step-ms", "20"],
        "timing": "explicit",
        "launcher": "slurm",
        "slurm": {"ntasks_per_node": 2, "partition": slurm_partition},
        "warmup_steps": 2,
        "measure_steps": 50000,
        "repeats": 1,
        "timeout_s": 300,
        "contract": {"invariants": {"workload": "paced"}},
        "detach": True,
    }
    started = await call(workspace, "run_benchmark_window", args, Human())
    run_id = started["run_id"]
    # the server captures a detached run's logs in the trust root (the workspace copy comes at the end)
    stderr = TrustRoot.locate().workspace_dir(workspace) / "detached" / run_id / "launch0_stderr.log"
    deadline = time.monotonic() + 120
    job = None
    while job is None or len(_processes_mentioning(str(loop))) < 2:
        assert time.monotonic() < deadline, stderr.read_text() if stderr.exists() else "no stderr"
        if stderr.exists():
            found = re.search(r"slurm job (\d+) allocated", stderr.read_text())
            job = found.group(1) if found else None
        time.sleep(0.3)
    assert _squeue(job) == "RUNNING"
    status = await call(workspace, "benchmark_run", {"action": "status", "run_id": run_id})
    assert status["slurm_jobs"] == [job]
    out = await call(workspace, "benchmark_run", {"action": "cancel", "run_id": run_id})
    assert out["run_state"] == "cancelled"
    deadline = time.monotonic() + 30
    while _squeue(job) or _processes_mentioning(str(loop)):
        assert time.monotonic() < deadline, (_squeue(job), _processes_mentioning(str(loop)))
        time.sleep(0.3)
    assert f"scancel {job}" in stderr.read_text()
    res = await call(workspace, "benchmark_run", {"action": "result", "run_id": run_id})
    assert res["state"] == "failed" and "cancelled" in res["result"]["failure_reason"]


def _digest(text: str) -> str:
    found = re.search(r"digest:?\s+([0-9a-f]{12})", text)
    assert found, text
    return found.group(1)


async def test_the_approval_covers_every_resource_and_no_allowlist_rule_approves_it(workspace: Path) -> None:
    if shutil.which("salloc") is None:
        pytest.skip("Slurm's client commands are not installed (apt-get install slurm-wlm)")
    # the operator allowlists the script with any code: fine locally, never for a cluster submission
    operator_policy("[execution]\n" + any_code_rules([PY, PACED]))
    base = {
        "command": [PY, PACED, "--steps", "50"],
        "timing": "explicit",
        "launcher": "slurm",
        "slurm": {"nodes": 1, "ntasks_per_node": 2},
        "repeats": 1,
        "timeout_s": 120,
        "contract": {"invariants": {"workload": "paced"}},
    }
    first = await call(workspace, "run_benchmark_window", base, error=True)
    assert "approv" in first and "--ntasks-per-node=2" in first and "--time=2" in first
    seen = {_digest(first)}
    changes: list[dict[str, Any]] = [
        {"slurm": {"nodes": 2, "ntasks_per_node": 1}},
        {"slurm": {"nodes": 1, "ntasks_per_node": 2, "cpus_per_task": 2}},
        {"slurm": {"nodes": 1, "ntasks_per_node": 2, "gres": "gpu:1"}},
        {"slurm": {"nodes": 1, "ntasks_per_node": 2, "partition": "other"}},
        {"timeout_s": 600},  # the time limit
    ]
    for change in changes:
        text = await call(workspace, "run_benchmark_window", {**base, **change}, error=True)
        digest = _digest(text)
        assert digest not in seen, change
        seen.add(digest)
    # the same script launched locally is allowlisted (the rule is not broken, only not for Slurm)
    local = {k: v for k, v in base.items() if k not in ("launcher", "slurm")}
    local["warmup_steps"], local["measure_steps"] = 2, 5
    out = await call(workspace, "run_benchmark_window", local)
    assert out["state"] == "executed", out["failure_reason"]  # it ran without a human


async def test_slurm_resources_refuse_shell_and_option_text(workspace: Path) -> None:
    base = {"command": [PY, TINY], "launcher": "slurm", "repeats": 1}
    for bad in ({"partition": "debug --uid=0"}, {"gres": "gpu:1;rm -rf /"}, {"partition": "-x"}):
        text = await call(workspace, "run_benchmark_window", {**base, "slurm": bad}, error=True)
        assert "pattern" in text or "match" in text, text
    text = await call(
        workspace, "run_benchmark_window", {"command": [PY, TINY], "slurm": {"nodes": 2}}, error=True
    )
    assert "launcher='slurm'" in text
    # resources only through `slurm`: Slurm's own input variables would steer the job beside them
    for key in ("SALLOC_PARTITION", "SLURM_EXCLUSIVE", "PET_NNODES"):
        text = await call(workspace, "run_benchmark_window", {**base, "env": {key: "x"}}, error=True)
        assert key in text and "slurm={" in text
    # no Slurm commands where the server runs: said before any approval is asked
    empty = workspace / "bin"
    empty.mkdir()
    text = await call(workspace, "run_benchmark_window", {**base, "env": {"PATH": str(empty)}}, error=True)
    assert "needs salloc" in text and "login node" in text and "approval" not in text


def test_record_pieces_reassemble_whatever_the_order_between_ranks(tmp_path: Path) -> None:
    """The gathering path without Slurm: two ranks' streamed records, interleaved line by line."""
    from perfgate.harness.record import RecordStreamReader, stream_record

    outs = []
    for rank in (0, 1):
        r, w = os.pipe()
        stream_record({"rank": rank, "pad": "x" * 9000}, fd=w)
        os.close(w)
        with os.fdopen(r) as fh:
            outs.append(fh.read().splitlines())
    assert len(outs[0]) > 3  # split into several lines
    reader = RecordStreamReader()
    for a, b in zip(outs[0], outs[1], strict=True):
        assert reader.feed(b) and reader.feed(a)
    assert not reader.feed("an ordinary line")
    assert {k: json.loads(v)["rank"] for k, v in reader.records.items()} == {0: 0, 1: 1}
    half = RecordStreamReader()
    half.feed(outs[0][0])
    assert half.incomplete == [0] and half.records == {}


def test_a_record_line_with_another_ranks_bytes_spliced_in_is_dropped_never_decoded() -> None:
    """srun forwards task output in messages of at most 1024 bytes and may write one rank's message into the
    middle of another's longer line; such a line must fail its checksum, and the next whole version of the
    record must still assemble (a lost piece of the earlier version does not block it)."""
    from perfgate.harness.record import RecordStreamReader, stream_record

    def lines(record: dict[str, object]) -> list[str]:
        r, w = os.pipe()
        stream_record(record, fd=w)
        os.close(w)
        with os.fdopen(r) as fh:
            return fh.read().splitlines()

    first, other = lines({"rank": 1, "pad": "a" * 4000}), lines({"rank": 0, "pad": "b" * 4000})
    assert max(len(line) for line in first + other) < 1024
    mark, piece = first[1].rsplit(" ", 1)
    spliced = f"{mark} {piece[:400]}{other[1].rsplit(' ', 1)[1][:400]}{piece[400:]}"
    reader = RecordStreamReader()
    for line in (first[0], spliced, *first[2:]):
        assert reader.feed(line)
    assert reader.bad_lines == 1 and reader.records == {} and reader.incomplete == [1]
    for line in lines({"rank": 1, "pad": "c" * 3000, "final": True}):
        reader.feed(line)
    assert json.loads(reader.records[1])["final"] is True and reader.incomplete == []


def test_slurm_step_variables_become_torch_distributed_ones() -> None:
    from perfgate.harness._node import slurm_rank_env

    step = {
        "SLURM_STEP_ID": "0",
        "SLURM_PROCID": "5",
        "SLURM_LOCALID": "1",
        "SLURM_STEP_NUM_TASKS": "8",
        "SLURM_STEP_TASKS_PER_NODE": "4(x2)",
        "SLURM_STEP_NUM_NODES": "2",
        "SLURM_JOB_ID": "1234",
        "MASTER_ADDR": "node-a",
    }
    got = slurm_rank_env(step)
    assert got == {
        "RANK": "5",
        "WORLD_SIZE": "8",
        "LOCAL_RANK": "1",
        "LOCAL_WORLD_SIZE": "4",
        "MASTER_PORT": str(20000 + 1234),
    }
    # torchrun under srun numbers its own workers: RANK is already set, nothing is touched
    assert slurm_rank_env({**step, "RANK": "0"}) == {}
    assert slurm_rank_env({"SLURM_PROCID": "0"}) == {}  # an allocation's shell, not a step
    single = {k: v for k, v in step.items() if k != "MASTER_ADDR"} | {"SLURM_STEP_NUM_NODES": "1"}
    assert slurm_rank_env(single)["MASTER_ADDR"] == "127.0.0.1"


def _window_record(workspace: Path, seed: int, launch: dict[str, Any]) -> str:
    """A run_benchmark_window record as the tool writes it (3 launches of 20 steps), launched as ``launch``."""
    import numpy as np

    from perfgate.evidence import EvidenceDraft, EvidenceState

    ledger = Ledger(workspace)
    eid = Ledger.new_id()
    rng = np.random.default_rng(seed)
    windows = [
        {
            "launch": k,
            "index": 0,
            "host_step_s": list(0.02 * (1 + 0.01 * rng.standard_normal(20))),
            "samples_per_step": [64.0] * 20,
            "tokens_per_step": None,
        }
        for k in range(3)
    ]
    series = {"schema": "perfgate.benchmark.series", "version": 1, "windows": windows}
    (ledger.artifact_dir(eid) / "step_series.json").write_text(json.dumps(series))
    command = ["python", "train.py"]
    code = {"commit": "a" * 40, "dirty": False, "diff_sha256": None, "diff_files": {}, "diff_artifact": None}
    ledger.append(
        EvidenceDraft(
            id=eid,
            tool="run_benchmark_window",
            state=EvidenceState.EXECUTED,
            inputs={"command": command, "env": {}, "contract": CONTRACT, **launch},
            result={
                "evidence_id": eid,
                "world_size": 2,
                "environment_fingerprint": {"device_kind": "cpu", "torch_version": "2.13.0"},
                "windows": [{"launch": k, "index": 0} for k in range(3)],
                "host_load": [],
                "provenance": {"argv": command, "cwd": ".", "env_changes": [], "code": code, "files": {}},
            },
            artifact_names=["step_series.json"],
        )
    )
    return eid


async def test_a_changed_launch_is_an_argv_difference_in_comparisons(workspace: Path) -> None:
    """Local against Slurm, or Slurm with other resources: compare_benchmarks sees the launch change."""
    two_tasks = {"launcher": "slurm", "slurm": {"nodes": 1, "ntasks_per_node": 2}}
    more_cpus = {"launcher": "slurm", "slurm": {"nodes": 1, "ntasks_per_node": 2, "cpus_per_task": 4}}
    local = _window_record(workspace, 1, {})
    slurm_a = _window_record(workspace, 2, two_tasks)
    slurm_b = _window_record(workspace, 3, two_tasks)
    slurm_c = _window_record(workspace, 4, more_cpus)

    async def argv_diffs(base: str, cand: str, declared: list[str]) -> tuple[str, list[dict[str, Any]]]:
        async with Client(build_server(ServerConfig.create(workspace))) as client:
            result = await client.call_tool(
                "compare_benchmarks", {"baseline": [base], "candidate": [cand], "declared_changes": declared}
            )
        out = result.structured_content
        assert out is not None, result.content
        return out["status"], [d for d in out["differences"] if d["kind"] == "argv"]

    assert (await argv_diffs(slurm_a, slurm_b, []))[1] == []  # the same submission twice
    for base, cand in ((local, slurm_a), (slurm_a, slurm_c)):
        status, diffs = await argv_diffs(base, cand, [])
        assert status == "incomparable" and diffs and diffs[0]["classification"] == "undeclared"
        status, diffs = await argv_diffs(base, cand, ["argv"])
        assert status == "comparable" and diffs[0]["classification"] == "declared_execution"


async def test_a_rank_that_fails_under_slurm_is_named_in_the_failure(
    workspace: Path, slurm_partition: str
) -> None:
    bad = workspace / "bad.py"
    bad.write_text(
        'import os, time\nif os.environ["RANK"] == "1":\n    raise SystemExit("rank 1 broke")\ntime.sleep(60)\n'
    )
    args = {
        "command": [PY, str(bad)],
        "timing": "explicit",
        "launcher": "slurm",
        "slurm": {"ntasks_per_node": 2, "partition": slurm_partition},
        "repeats": 1,
        "timeout_s": 120,
        "contract": {"invariants": {"workload": "broken"}},
    }
    out = await call(workspace, "run_benchmark_window", args, Human())
    assert out["state"] == "failed"
    # the cause (srun's first error: which task exited how), not the launcher's closing words
    assert re.search(
        r"first error: srun: error: \S+: tasks? [0-9-]*1: Exited with exit code 1", out["failure_reason"]
    ), out["failure_reason"]
