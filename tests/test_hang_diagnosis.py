"""Hang diagnosis: a run that stops making progress is looked at rank by rank, then ended with nothing left."""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest
from mcp import Client

import perfgate.tools
from _ports import free_port
from _trust import any_code_rules, operator_policy
from perfgate.execution.executor import ExecLimits, execute
from perfgate.execution.hang import (
    STALL_FLOOR_S,
    STALL_STEP_FACTOR,
    HangWatch,
    RankHang,
    diagnose,
    ends_run,
    stall_limit_s,
)
from perfgate.execution.hang_read import last_flight_entry, parse_stacks, place
from perfgate.execution.request import CommandRequest
from perfgate.server import build_server
from perfgate.serving.runtime import ServerConfig
from perfgate.tools import run_benchmark_window

PY = sys.executable
REPO = Path(__file__).resolve().parents[1]
TINY = str(REPO / "examples" / "tiny_train.py")
SKIP = ["--sync-loss", "--skip-sync-rank", "1", "--skip-sync-step", "4"]
"""Rank 1 skips the loss all_reduce of step 4: its collectives no longer line up with rank 0's."""

# What faulthandler wrote for the two ranks of `tiny_train.py --sync-loss --skip-sync-rank 1` under
# torchrun and the harness (torch 2.13, gloo): rank 0 in its last all_reduce, rank 1 in the final barrier.
RANK0 = """Current thread 0x00007fd9efc2fb80 (most recent call first):
  File "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", line 3252 in all_reduce
  File "/venv/lib/python3.11/site-packages/torch/distributed/c10d_logger.py", line 83 in wrapper
  File "/work/examples/tiny_train.py", line 94 in main
  File "/work/examples/tiny_train.py", line 109 in <module>
  File "<frozen runpy>", line 88 in _run_code
  File "/work/src/perfgate/harness/launch.py", line 230 in _run_target
"""
RANK1 = """Thread 0x00007f33a1000640 (most recent call first):
  File "/work/src/perfgate/harness/stacks.py", line 101 in _dump_on_request
  File "/usr/lib/python3.11/threading.py", line 975 in run

Current thread 0x00007f33abab7b80 (most recent call first):
  File "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", line 5356 in barrier
  File "/venv/lib/python3.11/site-packages/torch/distributed/c10d_logger.py", line 83 in wrapper
  File "/work/examples/tiny_train.py", line 104 in main
"""


def _rank(rank: int, text: str, boundary: int | None = None) -> RankHang:
    where = place(parse_stacks(text))
    assert where is not None
    return RankHang(
        rank=rank,
        pid=100 + rank,
        state="in_collective" if where.collective else "elsewhere",
        collective=where.collective,
        call_site=where.call_site,
        last_step_boundary=boundary,
        stack_top=list(where.stack_top),
    )


def test_a_stack_names_the_collective_and_the_script_line_that_waits_in_it() -> None:
    where = place(parse_stacks(RANK0))
    assert where is not None
    assert where.collective == "all_reduce"
    assert where.call_site == "/work/examples/tiny_train.py:94 in main"
    # the thread inside a collective is chosen over the harness's own trigger thread
    other = place(parse_stacks(RANK1))
    assert other is not None and other.collective == "barrier"


def test_two_ranks_in_different_collectives_are_named_as_a_disagreement() -> None:
    waiting, odd, collective, sentence = diagnose([_rank(0, RANK0, 7), _rank(1, RANK1, 8)])
    assert waiting == [0, 1] and odd == [0, 1]  # a tie: neither side is the majority
    assert collective in ("all_reduce", "barrier")
    assert "rank 0 waits in all_reduce" in sentence and "rank 1 waits in barrier" in sentence
    assert "rank 0 7, rank 1 8" in sentence


def test_the_odd_rank_out_of_a_majority_is_named_alone() -> None:
    ranks = [_rank(r, RANK0) for r in range(3)] + [_rank(3, RANK1)]
    waiting, odd, collective, sentence = diagnose(ranks)
    assert odd == [3] and collective == "all_reduce" and waiting == [0, 1, 2, 3]
    assert "ranks 0-2 waits in all_reduce" in sentence


def test_ranks_that_agree_point_outside_the_run() -> None:
    _, odd, _, sentence = diagnose([_rank(0, RANK0), _rank(1, RANK0)])
    assert odd == [] and "they agree" in sentence


def test_the_flight_recorder_gives_the_last_collective_and_its_sequence_number() -> None:
    # the shape of torch 2.13's _dump_fr_trace_json for gloo (fields trimmed to those read)
    dump = {
        "entries": [
            {"collective_seq_id": 7, "profiling_name": "gloo:all_reduce", "state": "scheduled"},
            {"collective_seq_id": 8, "profiling_name": "gloo:barrier", "state": "scheduled"},
        ]
    }
    entry = last_flight_entry(json.dumps(dump).encode())
    assert entry is not None and (entry.seq, entry.op) == (8, "gloo:barrier")
    assert last_flight_entry(b"not json") is None
    assert last_flight_entry(b'{"entries": []}') is None


def test_the_stall_rule_is_given_or_derived_from_the_slowest_step() -> None:
    assert stall_limit_s(5.0, None)[0] == 5.0
    assert stall_limit_s(None, None)[0] is None  # not armed before a step was seen
    assert stall_limit_s(None, 0.1)[0] == STALL_FLOOR_S
    limit, rule = stall_limit_s(None, 10.0)
    assert limit == STALL_STEP_FACTOR * 10.0 and "slowest observed step" in rule


def test_the_default_rule_ends_a_run_only_when_no_rank_is_working() -> None:
    busy = _rank(0, RANK0).model_copy(update={"state": "elsewhere", "collective": None})
    assert ends_run(None, [_rank(0, RANK0), _rank(1, RANK1)])
    # rank 0 writes a checkpoint while rank 1 waits for it in the barrier: slow, not (yet) a hang
    assert not ends_run(None, [busy, _rank(1, RANK1)])
    assert not ends_run(None, [])
    assert ends_run(20.0, [busy, _rank(1, RANK1)])  # a given stall_s ends it whatever the ranks do


@pytest.mark.anyio
async def test_a_silent_command_is_stopped_as_stalled_not_timed_out(tmp_path: Path) -> None:
    request = CommandRequest(
        argv=(PY, "-c", "import time; time.sleep(600)"), cwd=tmp_path, env={}, timeout_s=300, reason="test"
    )
    watch = HangWatch(1.0, None, None)
    result = await execute(
        request,
        stdout_path=tmp_path / "out",
        stderr_path=tmp_path / "err",
        limits=ExecLimits(kill_grace_s=2.0),
        watch=watch,
    )
    assert result.stalled and not result.timed_out and not result.succeeded
    assert "made no progress" in result.summary()
    ended = watch.ended
    assert ended is not None and ended.ranks == [] and "no rank announced" in ended.summary


# --------------------------------------------------------------------------- a real hung gloo job


@pytest.fixture
def allowed(workspace: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    if run_benchmark_window.SPEC not in perfgate.tools.REGISTRY:
        monkeypatch.setattr(perfgate.tools, "REGISTRY", (*perfgate.tools.REGISTRY, run_benchmark_window.SPEC))
    torchrun = shutil.which("torchrun", path=str(Path(PY).parent)) or "torchrun"
    operator_policy(
        '[execution]\nallow_env = ["PERFGATE_*", "PYTHONPYCACHEPREFIX", "TORCH_FR_BUFFER_SIZE"]\n'
        + any_code_rules([torchrun])
    )
    return workspace


def _running(pid: int) -> bool:
    """Running (not a zombie waiting for its reaper, not gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat[stat.rfind(")") + 2] not in "ZX"


def _processes_with(needle: bytes) -> list[int]:
    """Running processes whose command line or environment holds ``needle`` (this user's, via /proc)."""
    found: list[int] = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            stat = (entry / "stat").read_text()
            if stat[stat.rfind(")") + 2] in "ZX":
                continue
            if needle in (entry / "cmdline").read_bytes() or needle in (entry / "environ").read_bytes():
                found.append(int(entry.name))
        except OSError:
            continue
    return found


@pytest.mark.slow
@pytest.mark.anyio
async def test_a_gloo_job_where_one_rank_skips_an_all_reduce_is_diagnosed_and_ended(allowed: Path) -> None:
    torchrun = shutil.which("torchrun", path=str(Path(PY).parent))
    if torchrun is None:
        pytest.skip("torchrun is not installed next to this interpreter")
    port = str(free_port())
    args: dict[str, Any] = {
        "command": [torchrun, "--nproc-per-node", "2", "--master-port", port, TINY, "--steps", "8", *SKIP],
        "warmup_steps": 3,
        "measure_steps": 10,
        "repeats": 1,
        "timeout_s": 600,
        # above start-up on a busy 2-core host (each rank imports torch without printing)
        "stall_s": 20,
        "env": {"TORCH_FR_BUFFER_SIZE": "64"},
        "contract": {"invariants": {"model": "tiny-mlp"}, "execution": {"world_size": 2}},
    }
    async with Client(build_server(ServerConfig.create(allowed))) as client:
        result = await client.call_tool("run_benchmark_window", args)
    assert not result.is_error, result.content[0].text  # type: ignore[union-attr]
    out = result.structured_content
    assert out is not None
    hang = out["hang"]
    assert out["state"] == "failed" and hang is not None, out["failure_reason"]
    # ended for the stall (a timeout would say "timed out"), with the rule that fired
    assert out["failure_reason"].startswith("launch 0: it made no progress and was stopped")
    assert hang["ended_run"] and hang["rule"].startswith("stall_s=20")
    by_rank = {r["rank"]: r for r in hang["ranks"]}
    assert sorted(by_rank) == [0, 1]
    # rank 1 skipped its all_reduce at step 4, so it finished the loop one collective early and waits in
    # the final barrier, while rank 0 still waits in its last all_reduce
    assert by_rank[0]["collective"] == "all_reduce" and "tiny_train.py" in by_rank[0]["call_site"]
    assert by_rank[1]["collective"] == "barrier"
    assert hang["waiting_ranks"] == [0, 1] and hang["odd_ranks"] == [0, 1]
    assert "rank 0 waits in all_reduce" in hang["summary"] and "rank 1 waits in barrier" in hang["summary"]
    # the flight recorder agrees: both ranks entered their 8th collective, each a different one
    assert by_rank[0]["flight_recorder_op"] == "gloo:all_reduce"
    assert by_rank[1]["flight_recorder_op"] == "gloo:barrier"
    assert by_rank[0]["flight_recorder_seq"] == by_rank[1]["flight_recorder_seq"] == 8
    assert by_rank[0]["stack_top"][0].endswith("in all_reduce")
    stacks = allowed / hang["stacks_artifact"]
    assert "==== rank 1 ====" in stacks.read_text()
    # nothing of the run is left: not torchrun (its argv names the port), not a rank (its env does)
    assert not any(_running(r["pid"]) for r in hang["ranks"])
    assert _processes_with(f"MASTER_PORT={port}".encode()) == []
    assert _processes_with(f"--master-port\x00{port}".encode()) == []
