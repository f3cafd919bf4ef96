"""The zero-code-change launcher on real tiny training runs (CPU, torch), in subprocesses."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from _ports import free_port
from perfgate.benchmarking import load_records, summarize_window

pytestmark = pytest.mark.slow
pytest.importorskip("torch")

REPO = Path(__file__).resolve().parents[1]
TINY = REPO / "examples" / "tiny_train.py"
PACED = REPO / "examples" / "paced_loop.py"


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PERFGATE_")}
    env["OMP_NUM_THREADS"] = "1"
    return env


def harness(
    records: Path, opts: list[str], target: list[str], cwd: Path = REPO, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "perfgate.harness", "--record-dir", str(records), *opts, "--", *target]
    return subprocess.run(argv, cwd=cwd, env=_env(), capture_output=True, text=True, timeout=timeout)


def _record(records: Path, rank: int = 0) -> dict[str, object]:
    return json.loads((records / f"rank{rank}.json").read_text())


def test_optimizer_steps_are_timed_and_the_run_stops_after_the_window(tmp_path: Path) -> None:
    out = harness(
        tmp_path,
        ["--warmup-steps", "3", "--measure-steps", "8"],
        [str(TINY), "--steps", "100000", "--log-every", "1"],
    )
    assert out.returncode == 0, out.stderr
    (rec,) = load_records(tmp_path).records
    # stopped after the 11th optimizer.step(), far before the script's 100000 steps, where the 12th step's
    # work started: the 11th step's own log line printed (one line per recorded step)
    assert out.stdout.count("step_time_ms") == rec.steps.count == 11
    assert rec.complete and rec.stop_reason == "window_complete" and rec.timing == "optimizer"
    assert rec.steps.count == 11 and rec.steps.warmup == 3
    assert rec.steps.samples == [32] * 11  # batch size read from the DataLoader
    assert all(ns > 0 for ns in rec.steps.data_wait_ns)
    assert all(ns > 0 for ns in rec.steps.backward_ns)
    (win,) = rec.windows
    assert (win.first_step, win.last_step) == (3, 10)
    assert win.host_peak_rss_bytes is not None and win.host_peak_rss_bytes > 0
    assert rec.device is not None and rec.device.kind == "cpu"


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="Linux /proc only")
def test_a_launch_peak_is_its_own_not_the_resident_size_of_the_process_that_started_it() -> None:
    """Linux's ru_maxrss carries the forking process's resident size over exec: a server holding 300 MB
    would make every launch's peak at least that. The peak is the launched program's own (VmHWM)."""
    held = bytearray(300 << 20)
    held[::4096] = b"x" * len(held[::4096])  # touched: resident in this process, the launcher
    probe = (
        "import resource; from perfgate.harness._host import host_peak_rss_bytes; "
        "print(host_peak_rss_bytes(), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60
    )
    peak, inherited = map(int, out.stdout.split())
    del held
    assert 0 < peak < 150 << 20, (peak, inherited)


def test_finish_mode_lets_the_script_run_to_its_end(tmp_path: Path) -> None:
    out = harness(
        tmp_path,
        ["--warmup-steps", "2", "--measure-steps", "3", "--finish"],
        [str(TINY), "--steps", "9", "--log-every", "1", "--accumulation", "2"],
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("step_time_ms") == 9
    rec = _record(tmp_path)
    assert rec["complete"]
    # two micro-batches of 32 per optimizer step
    assert rec["steps"]["samples"] == [64] * 5  # type: ignore[index]


def test_a_failing_script_leaves_an_incomplete_record_and_its_exit_status(tmp_path: Path) -> None:
    script = tmp_path / "fails.py"
    script.write_text(
        textwrap.dedent(
            """
            import torch
            p = torch.nn.Parameter(torch.ones(2))
            opt = torch.optim.SGD([p], lr=0.1)
            for i in range(3):
                (p * 2).sum().backward()
                opt.step()
            raise ValueError("data ran out")
            """
        )
    )
    out = harness(tmp_path / "rec", ["--warmup-steps", "2", "--measure-steps", "5"], [str(script)])
    assert out.returncode == 1
    assert "ValueError: data ran out" in out.stderr
    rec = _record(tmp_path / "rec")
    assert not rec["complete"] and rec["stop_reason"] == "script_error"
    assert rec["error"] == "ValueError: data ran out"
    assert rec["steps"]["count"] == 3  # type: ignore[index]


def test_a_module_target_runs_with_its_arguments(tmp_path: Path) -> None:
    pkg = tmp_path / "mytrain"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "loop.py").write_text(
        textwrap.dedent(
            """
            import sys
            import torch
            assert sys.argv[1:] == ["--steps", "7"], sys.argv
            p = torch.nn.Parameter(torch.ones(2))
            opt = torch.optim.SGD([p], lr=0.1)
            for i in range(int(sys.argv[2])):
                (p * 2).sum().backward()
                opt.step()
            """
        )
    )
    out = harness(
        tmp_path / "rec",
        ["--warmup-steps", "1", "--measure-steps", "3", "--finish"],
        ["-m", "mytrain.loop", "--steps", "7"],
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr
    assert _record(tmp_path / "rec")["complete"]


def test_explicit_timing_uses_the_scripts_own_window(tmp_path: Path) -> None:
    out = harness(
        tmp_path,
        ["--timing", "explicit", "--warmup-steps", "2", "--measure-steps", "20"],
        [str(PACED), "--steps", "1000", "--step-ms", "10", "--samples", "4", "--print-steps"],
    )
    assert out.returncode == 0, out.stderr
    (rec,) = load_records(tmp_path).records
    assert rec.timing == "explicit" and rec.complete and rec.steps.count == 22  # stopped by the launcher
    summary = summarize_window([rec], 0)
    # accuracy against the loop's own clock, under whatever load the machine has: the paced 10 ms steps
    # stretch when the host is busy, and the harness must see exactly what the loop saw
    steps = [t / 1e6 for t in rec.steps.step_time_ns]
    _assert_matches_own_clock(steps, out.stdout, first=2, period_ms=10.0)
    assert summary.samples == 80


def test_optimizer_timing_measures_a_known_step_time_within_two_percent(tmp_path: Path) -> None:
    out = harness(
        tmp_path,
        ["--warmup-steps", "3", "--measure-steps", "20"],
        [str(TINY), "--step-ms", "12", "--steps", "1000", "--log-every", "1"],
    )
    assert out.returncode == 0, out.stderr
    (rec,) = load_records(tmp_path).records
    _assert_matches_own_clock([t / 1e6 for t in rec.steps.step_time_ns], out.stdout, first=3, period_ms=12.0)


def _assert_matches_own_clock(step_ms: list[float], stdout: str, first: int, period_ms: float) -> None:
    """Steps ``first``.. as the harness timed them add up to what the script's own clock saw over the
    same steps (its printed per-step times), within 2%: both clocks see the same load, so the margin
    holds on a busy machine; a harness that lost, split or mis-bounded steps is off by whole steps."""
    own = [float(line.rsplit(" ", 1)[1]) for line in stdout.splitlines() if "step_time_ms" in line]
    assert len(own) > first + 10, stdout
    # The last step is left out: when the script may finish it (printing its time), the harness's own
    # end-of-run work at that boundary (records written as the last window closes) lands on the script's
    # clock for that step and on neither of the harness's steps.
    n = min(len(own), len(step_ms)) - 1
    harness_total, own_total = sum(step_ms[first:n]), sum(own[first:n])
    assert harness_total == pytest.approx(own_total, rel=0.02)
    assert harness_total >= 0.95 * (n - first) * period_ms  # paced steps: at least their period, summed


def test_profile_mode_writes_one_kineto_trace_and_flags_the_record(tmp_path: Path) -> None:
    traces = tmp_path / "traces"
    out = harness(
        tmp_path / "rec",
        [
            "--warmup-steps",
            "1",
            "--measure-steps",
            "2",
            "--profile-dir",
            str(traces),
            "--profile-skip-first",
            "1",
            "--profile-warmup",
            "1",
            "--profile-active",
            "2",
            "--profile-record-shapes",
        ],
        [str(TINY), "--steps", "1000"],
    )
    assert out.returncode == 0, out.stderr
    rec = _record(tmp_path / "rec")
    assert rec["profiled"] is True
    profile = rec["profile"]
    assert isinstance(profile, dict)
    assert profile["complete"] and profile["active_steps"] == [2, 3] and "CPU" in profile["activities"]
    trace = json.loads(Path(profile["trace_path"]).read_text())
    names = {e.get("name", "") for e in trace["traceEvents"]}
    assert any(n.startswith("ProfilerStep#") for n in names)
    assert any(e.get("cat") == "cpu_op" for e in trace["traceEvents"])
    assert rec["steps"]["count"] == 4  # type: ignore[index]  # max(warmup+measure, profile schedule)


def _torchrun() -> list[str]:
    exe = shutil.which("torchrun", path=str(Path(sys.executable).parent))
    return [exe] if exe else [sys.executable, "-m", "torch.distributed.run"]


@pytest.mark.parametrize("slow_rank", [0, 1])
def test_torchrun_ddp_over_two_ranks_finds_the_slow_rank(tmp_path: Path, slow_rank: int) -> None:
    argv = [
        *_torchrun(),
        "--nproc-per-node",
        "2",
        "--master-port",
        str(free_port()),
        "-m",
        "perfgate.harness",
        "--record-dir",
        str(tmp_path),
        "--warmup-steps",
        "3",
        "--measure-steps",
        "10",
        "--",
        str(TINY),
        "--ddp",
        "--steps",
        "1000",
        "--slow-rank",
        str(slow_rank),
        "--slow-ms",
        "15",
    ]
    out = subprocess.run(argv, cwd=REPO, env=_env(), capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr[-3000:]
    records = load_records(tmp_path)
    assert not records.problems
    assert [r.rank for r in records.records] == [0, 1]
    assert all(r.world_size == 2 and r.complete for r in records.records)
    summary = summarize_window(records.records, 0)
    assert summary.slowest_rank == slow_rank
    # lockstep: both ranks' windows take about as long; the other rank waited in backward
    fast = next(r for r in summary.ranks if r.rank != slow_rank)
    assert fast.collective_wait_ms > 10 * 10 * 0.5
    assert summary.rank_skew > 0.2
    assert summary.samples == 2 * 32 * 10  # global work over the aligned window


def test_the_record_directory_default_and_progress_lines(tmp_path: Path) -> None:
    argv = [
        sys.executable,
        "-m",
        "perfgate.harness",
        "--timing",
        "explicit",
        "--warmup-steps",
        "1",
        "--measure-steps",
        "4",
        "--progress-every",
        "2",
        "--",
        str(PACED),
        "--steps",
        "50",
        "--step-ms",
        "1",
    ]
    out = subprocess.run(argv, cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "perfgate-records" / "rank0.json").is_file()
    assert "[perfgate] progress step=2 total=5" in out.stderr
    assert "[perfgate] progress step=5 total=5" in out.stderr


def test_a_missing_target_is_a_usage_error(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "perfgate.harness", "--warmup-steps", "2"],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2
    assert "after '--'" in out.stderr


def test_without_a_separator_the_first_positional_starts_the_target(tmp_path: Path) -> None:
    # torchrun strips a leading '--' from the script arguments; the launcher must still find the target.
    from perfgate.harness.launch import _split_target, build_parser  # pyright: ignore[reportPrivateUsage]

    opts, target = _split_target(
        ["--warmup-steps", "2", "--finish", "-m", "pkg.train", "--lr", "1"], build_parser()
    )
    assert (opts.warmup_steps, opts.stop) == (2, False)
    assert target == ["-m", "pkg.train", "--lr", "1"]
    opts, target = _split_target(["--warmup-steps=4", "train.py", "--", "x"], build_parser())
    assert opts.warmup_steps == 4
    assert target == ["train.py", "--", "x"]  # a later '--' belongs to the script


def test_an_explicitly_timed_script_stops_cleanly_when_the_environment_asks(tmp_path: Path) -> None:
    env = {
        **_env(),
        "PERFGATE_RECORD_DIR": str(tmp_path),
        "PERFGATE_WARMUP_STEPS": "1",
        "PERFGATE_MEASURE_STEPS": "3",
        "PERFGATE_STOP": "1",
    }
    argv = [sys.executable, str(PACED), "--steps", "100000", "--step-ms", "1"]
    out = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stderr == ""  # no traceback: WindowComplete is SystemExit(0)
    assert "done" not in out.stdout
    rec = _record(tmp_path)
    assert rec["complete"] and rec["steps"]["count"] == 4  # type: ignore[index]


def test_without_stop_in_the_environment_a_direct_run_is_never_cut_short(tmp_path: Path) -> None:
    env = {
        **_env(),
        "PERFGATE_RECORD_DIR": str(tmp_path),
        "PERFGATE_WARMUP_STEPS": "1",
        "PERFGATE_MEASURE_STEPS": "2",
    }
    out = subprocess.run(
        [sys.executable, str(PACED), "--steps", "6", "--step-ms", "0"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert "done 6 steps" in out.stdout  # the script ran on after its window
    assert _record(tmp_path)["steps"]["count"] == 3  # type: ignore[index]
