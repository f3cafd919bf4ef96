"""The executor: argv only, process groups, timeouts, cancellation, output capture."""

from __future__ import annotations

import os
import sys
import textwrap
from pathlib import Path

import anyio
import pytest

from perfgate.execution.executor import (
    CommandError,
    CommandProgress,
    CommandResult,
    ExecLimits,
    ProcessRegistry,
    execute,
)
from perfgate.execution.request import CommandRequest

pytestmark = pytest.mark.anyio

PY = sys.executable
FAST = ExecLimits(kill_grace_s=2.0, progress_interval_s=0.02)

# A child that starts a sleeping grandchild in its own process group, reports both pids, then sleeps.
TREE = textwrap.dedent(
    """
    import os, subprocess, sys, time
    grandchild = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    print(os.getpid(), grandchild.pid, flush=True)
    open(sys.argv[1], "w").write(f"{os.getpid()} {grandchild.pid}")
    time.sleep(600)
    """
)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def alive(pid: int) -> bool:
    """Running (not a zombie waiting for its reaper, not gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat[stat.rfind(")") + 2] not in "ZX"


def request(
    tmp_path: Path, *argv: str, timeout_s: float = 30.0, env: dict[str, str] | None = None
) -> CommandRequest:
    return CommandRequest(argv=argv, cwd=tmp_path, env=env or {}, timeout_s=timeout_s, reason="test")


async def run(tmp_path: Path, req: CommandRequest, limits: ExecLimits = FAST, **kw: object) -> CommandResult:
    return await execute(
        req,
        stdout_path=tmp_path / "stdout.log",
        stderr_path=tmp_path / "stderr.log",
        limits=limits,
        **kw,  # type: ignore[arg-type]
    )


async def wait_for_pids(path: Path) -> tuple[int, int]:
    with anyio.fail_after(20):
        while not path.exists() or len(path.read_text().split()) != 2:
            await anyio.sleep(0.01)
    child, grandchild = (int(x) for x in path.read_text().split())
    return child, grandchild


async def test_output_exit_status_and_env_changes_are_captured(tmp_path: Path) -> None:
    code = "import os, sys; print('out', os.environ['PG_TEST']); print('err', file=sys.stderr); sys.exit(0)"
    result = await run(tmp_path, request(tmp_path, PY, "-c", code, env={"PG_TEST": "value 1"}))
    assert result.exit_code == 0 and result.signal is None and not result.timed_out and result.succeeded
    assert result.stdout.tail == "out value 1\n" and result.stdout.lines == 1
    assert result.stderr.tail == "err\n"
    assert (tmp_path / "stdout.log").read_text() == "out value 1\n"
    assert result.env == {"PG_TEST": "value 1"} and result.argv[0] == PY


async def test_shell_metacharacters_in_arguments_stay_literal(tmp_path: Path) -> None:
    marker = tmp_path / "marker"
    marker.write_text("keep me")
    hostile = f"x; rm -rf {marker} && touch {tmp_path}/pwned $(touch {tmp_path}/sub) `id`"
    result = await run(tmp_path, request(tmp_path, PY, "-c", "import sys; print(sys.argv[1])", hostile))
    assert result.exit_code == 0
    assert result.stdout.tail == hostile + "\n"
    assert marker.read_text() == "keep me"
    assert not (tmp_path / "pwned").exists() and not (tmp_path / "sub").exists()


async def test_non_zero_exit_is_reported_as_failure(tmp_path: Path) -> None:
    result = await run(tmp_path, request(tmp_path, PY, "-c", "raise SystemExit(3)"))
    assert result.exit_code == 3 and not result.succeeded and result.signal is None
    assert "exited with status 3" in result.summary()


async def test_death_by_signal_is_recorded(tmp_path: Path) -> None:
    code = "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"
    result = await run(tmp_path, request(tmp_path, PY, "-c", code))
    assert result.exit_code is None and result.signal == "SIGKILL" and not result.succeeded


async def test_timeout_kills_the_whole_process_tree(tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    result = await run(tmp_path, request(tmp_path, PY, "-c", TREE, str(pids), timeout_s=2.0))
    child, grandchild = (int(x) for x in pids.read_text().split())
    assert result.timed_out and not result.succeeded
    assert result.signal == "SIGTERM" and result.pid == child
    assert not alive(child) and not alive(grandchild)
    assert "timed out" in result.summary()


async def test_a_group_that_ignores_sigterm_is_killed_after_the_grace_period(tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    code = "import signal; signal.signal(signal.SIGTERM, signal.SIG_IGN)\n" + TREE
    limits = ExecLimits(kill_grace_s=0.3, progress_interval_s=1.0)
    result = await run(tmp_path, request(tmp_path, PY, "-c", code, str(pids), timeout_s=2.0), limits)
    child, grandchild = (int(x) for x in pids.read_text().split())
    assert result.timed_out and result.signal == "SIGKILL"
    assert not alive(child) and not alive(grandchild)


async def test_cancellation_kills_the_whole_process_tree(tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    finished: list[CommandResult] = []

    async def runner() -> None:
        finished.append(await run(tmp_path, request(tmp_path, PY, "-c", TREE, str(pids))))

    async with anyio.create_task_group() as tg:
        tg.start_soon(runner)
        child, grandchild = await wait_for_pids(pids)
        assert alive(child) and alive(grandchild)
        tg.cancel_scope.cancel()
    assert finished == []
    assert not alive(child) and not alive(grandchild)


async def test_processes_left_behind_by_a_finished_command_are_stopped(tmp_path: Path) -> None:
    code = textwrap.dedent(
        """
        import subprocess, sys
        g = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        print(g.pid, flush=True)
        """
    )
    result = await run(tmp_path, request(tmp_path, PY, "-c", code))
    assert result.exit_code == 0 and result.stragglers_killed
    assert not alive(int(result.stdout.tail))


async def test_output_beyond_the_tail_cap_is_truncated_and_the_full_log_kept(tmp_path: Path) -> None:
    code = "import sys\nfor i in range(20000): sys.stdout.write(f'line {i:05d}\\n')"
    limits = ExecLimits(tail_bytes=1000, progress_interval_s=1.0)
    result = await run(tmp_path, request(tmp_path, PY, "-c", code), limits)
    log = (tmp_path / "stdout.log").read_text()
    assert log.splitlines() == [f"line {i:05d}" for i in range(20000)]
    assert result.stdout.bytes_total == len(log) == result.stdout.bytes_logged
    assert result.stdout.lines == 20000 and result.stdout.tail_truncated
    assert len(result.stdout.tail) == 1000 and result.stdout.tail.endswith("line 19999\n")


async def test_the_log_file_stops_at_its_cap_while_the_stream_is_still_drained(tmp_path: Path) -> None:
    code = "import sys; sys.stdout.write('x' * 100000)"
    limits = ExecLimits(tail_bytes=10, max_log_bytes=4096, progress_interval_s=1.0)
    result = await run(tmp_path, request(tmp_path, PY, "-c", code), limits)
    assert result.exit_code == 0
    assert (tmp_path / "stdout.log").stat().st_size == 4096 == result.stdout.bytes_logged
    assert result.stdout.bytes_total == 100000


async def test_progress_reports_lines_and_elapsed_time(tmp_path: Path) -> None:
    seen: list[CommandProgress] = []

    async def on_progress(p: CommandProgress) -> None:
        seen.append(p)

    code = "print('a'); print('b')"
    await run(tmp_path, request(tmp_path, PY, "-c", code), on_progress=on_progress)
    assert len(seen) >= 2
    assert [p.elapsed_s for p in seen] == sorted(p.elapsed_s for p in seen)
    assert seen[-1].stdout_lines == 2 and seen[-1].last_line == "b"


async def test_missing_program_or_cwd_is_refused_before_starting(tmp_path: Path) -> None:
    with pytest.raises(CommandError, match="not found on PATH"):
        await run(tmp_path, request(tmp_path, "perfgate-no-such-program-xyz"))
    with pytest.raises(CommandError, match="not an executable file"):
        await run(tmp_path, request(tmp_path, "./missing.sh"))
    gone = CommandRequest(argv=(PY, "-V"), cwd=tmp_path / "gone", timeout_s=5)
    with pytest.raises(CommandError, match="does not exist"):
        await run(tmp_path, gone)


async def test_registry_shutdown_stops_running_groups(tmp_path: Path) -> None:
    registry = ProcessRegistry()
    pids = tmp_path / "pids"
    finished: list[CommandResult] = []

    async def runner() -> None:
        finished.append(await run(tmp_path, request(tmp_path, PY, "-c", TREE, str(pids)), registry=registry))

    async with anyio.create_task_group() as tg:
        tg.start_soon(runner)
        child, grandchild = await wait_for_pids(pids)
        assert registry.groups == {child}
        await registry.aclose(grace_s=2.0)
    assert finished[0].signal == "SIGTERM" and registry.groups == frozenset()
    assert not alive(child) and not alive(grandchild)
    assert os.getpgrp() != child
