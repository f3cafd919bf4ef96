"""Run one approved command: argv only, its own process group, a timeout, captured output.

The child gets ``stdin=/dev/null`` and pipes for stdout and stderr, so it can never read from or write to
a stdio MCP stream. It starts a new session (``setsid``), which makes it the leader of a process group,
and carries a run tag in its environment; with the server a child subreaper, everything it starts is
found even after ``setsid``, ``setpgid`` or a double fork (`perfgate.execution.reaper`). Every stop
(timeout, a stall its ``watch`` declares, client cancellation, server shutdown, processes left behind
after a normal exit) sends SIGTERM to all of them, waits ``kill_grace_s``, then SIGKILLs what is left.

Output streams to ``stdout_path`` / ``stderr_path`` in full (up to ``max_log_bytes`` each) while only the
last ``tail_bytes`` stay in memory for the result.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import threading
import time
import weakref
from collections.abc import Awaitable, Callable, Set
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, Protocol

import anyio
import anyio.abc
from pydantic import BaseModel, Field

from perfgate.execution.launches import launch_variables
from perfgate.execution.linestamps import LOG_PATTERN_ENV, OutputStamps, stamps_path
from perfgate.execution.reaper import (
    RUN_TAG_VAR,
    RunHandle,
    RunList,
    members,
    new_tag,
    reap_zombies,
    stop_blocking,
)
from perfgate.execution.request import CommandRequest

__all__ = [
    "CommandError",
    "CommandProgress",
    "CommandResult",
    "ExecLimits",
    "ProcessRegistry",
    "ProgressWatch",
    "StreamCapture",
    "execute",
    "resolve_program",
]

_POLL_S = 0.02
_WATCH_S = 0.5
"""How often a ``watch`` is asked whether the run stalled."""


class CommandError(RuntimeError):
    """The command could not be started (program missing, not executable, bad cwd)."""


@dataclass(frozen=True)
class ExecLimits:
    """Output and shutdown limits that do not change what the command is (not part of the digest)."""

    tail_bytes: int = 16 * 1024
    max_log_bytes: int = 256 * 1024 * 1024
    kill_grace_s: float = 5.0
    progress_interval_s: float = 2.0


@dataclass(frozen=True)
class CommandProgress:
    """A progress snapshot while the command runs; ``elapsed_s`` never decreases."""

    elapsed_s: float
    stdout_lines: int
    stderr_lines: int
    last_line: str
    pid: int


ProgressCallback = Callable[[CommandProgress], Awaitable[None]]


class ProgressWatch(Protocol):
    """Decides that a running command stopped making progress, and looks at it before it is stopped
    (`perfgate.execution.hang.HangWatch`)."""

    def due(self, last_output_ns: int, now_ns: int) -> bool:
        """No progress for too long, given the last output seen (``time.monotonic_ns``)."""
        ...

    async def on_stall(self, pids: Set[int], last_output_ns: int, now_ns: int) -> bool:
        """Look at the run's processes ``pids``; True stops the run, False lets it go on."""
        ...


class StreamCapture(BaseModel):
    """One output stream: the full log on disk and the tail kept for the result."""

    path: str = Field(description="Absolute path of the log file.")
    bytes_total: int = Field(description="Bytes the command wrote to this stream.")
    bytes_logged: int = Field(description="Bytes written to the log file (less than total when capped).")
    lines: int = Field(description="Newline-terminated lines seen.")
    tail: str = Field(description="The last bytes of the stream, UTF-8 decoded with replacement.")
    tail_truncated: bool = Field(description="True when the tail is shorter than the whole stream.")


class CommandResult(BaseModel):
    """What happened to one command."""

    argv: list[str]
    cwd: str
    env: dict[str, str] = Field(description="Variables set on top of the server's environment.")
    digest: str = Field(description="Digest of the request that ran (what its approval bound to).")
    pid: int
    exit_code: int | None = Field(description="Exit status; None when a signal ended it.")
    signal: str | None = Field(description="Name of the signal that ended it (e.g. SIGKILL), if any.")
    timed_out: bool
    stalled: bool = Field(
        default=False, description="Stopped because it made no progress for the watch's allowance."
    )
    duration_s: float = Field(description="Wall-clock seconds from start to the group's end.")
    stragglers_killed: bool = Field(
        description="Processes of its group outlived it and were terminated when it exited."
    )
    stdout: StreamCapture
    stderr: StreamCapture
    approved_how: str | None = Field(default=None, description="Gate path that approved it (allowlist, ...).")
    approval_evidence_id: str | None = Field(default=None, description="Ledger record of that approval.")
    launch_id: int | None = Field(
        default=None,
        description="The launch id the server gave the process tree (PERFGATE_LAUNCH_ID): the session of the "
        "sample records it wrote.",
    )

    @property
    def succeeded(self) -> bool:
        """Exited by itself with status 0 within its timeout."""
        return self.exit_code == 0 and not self.timed_out and not self.stalled

    def summary(self) -> str:
        if self.stalled:
            how = (
                f"made no progress and was stopped after {self.duration_s:.1f} s ({self.signal or 'exited'})"
            )
        elif self.timed_out:
            how = f"timed out after {self.duration_s:.1f} s and was killed ({self.signal or 'exited'})"
        elif self.signal:
            how = f"was killed by {self.signal}"
        else:
            how = f"exited with status {self.exit_code}"
        return f"command {self.argv[0]!r} {how}"


# Signal dispositions are process-wide, so the registries a fatal signal must clean up are too.
_LIVE_REGISTRIES: weakref.WeakSet[ProcessRegistry] = weakref.WeakSet()
_FATAL_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


def _on_fatal_signal(signum: int, frame: object) -> None:
    """Stop every running group, then die of the same signal as if no handler had been installed."""
    for registry in list(_LIVE_REGISTRIES):
        registry.stop_all_blocking(grace_s=1.0)
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def _guard_fatal_signals() -> None:
    """Make SIGTERM/SIGHUP of the server stop its commands first.

    Commands run in their own sessions, so a signal that kills the server does not reach them. Only
    default dispositions are replaced (never an application's own handler), and only from the main
    thread, where Python allows it.
    """
    if threading.current_thread() is not threading.main_thread():
        return
    for sig in _FATAL_SIGNALS:
        if signal.getsignal(sig) is signal.SIG_DFL:
            signal.signal(sig, _on_fatal_signal)


class ProcessRegistry:
    """The commands a server has running, so shutdown can stop every one of them and what they started.

    With a `RunList` (in the trust root) the runs are also listed on disk, so a server started after this
    one was killed can stop what is left (`RunList.stop_leftovers`).
    """

    def __init__(self, run_list: RunList | None = None) -> None:
        self._runs: dict[str, RunHandle] = {}
        self.run_list = run_list

    def add(self, run: RunHandle) -> None:
        self._runs[run.tag] = run
        if self.run_list is not None:
            with contextlib.suppress(OSError):
                self.run_list.add(run)
        _LIVE_REGISTRIES.add(self)
        _guard_fatal_signals()

    def discard(self, run: RunHandle) -> None:
        self._runs.pop(run.tag, None)
        if self.run_list is not None:
            with contextlib.suppress(OSError):
                self.run_list.discard(run)

    @property
    def groups(self) -> frozenset[int]:
        """Process group ids of the running commands."""
        return frozenset(r.pgid for r in self._runs.values())

    @property
    def runs(self) -> tuple[RunHandle, ...]:
        return tuple(self._runs.values())

    def kill_all(self) -> None:
        """SIGKILL every process of every run now (the last resort at interpreter exit)."""
        runs = list(self._runs.values())
        for _ in range(50):
            left = members(runs)
            if not left:
                break
            for pid in left:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(_POLL_S)
        self._runs.clear()

    def stop_all_blocking(self, grace_s: float) -> None:
        """TERM every run's processes, wait up to ``grace_s`` (blocking), KILL the rest: for signal handlers."""
        stop_blocking(list(self._runs.values()), grace_s)
        self._runs.clear()

    async def aclose(self, grace_s: float = 5.0) -> None:
        """TERM every run's processes, then KILL what is left after ``grace_s``."""
        runs = list(self._runs.values())
        if runs:
            await anyio.to_thread.run_sync(stop_blocking, runs, grace_s)
        self._runs.clear()


def resolve_program(request: CommandRequest) -> None:
    """Check the program and working directory exist, as `execute` would before starting it.

    Raises:
        CommandError: they do not.
    """
    _resolve_program(request, {**os.environ, **request.env})


def _resolve_program(request: CommandRequest, env: dict[str, str]) -> None:
    program = request.argv[0]
    if "/" in program:
        path = Path(program) if Path(program).is_absolute() else request.cwd / program
        if not path.is_file() or not os.access(path, os.X_OK):
            raise CommandError(f"program {program!r} is not an executable file (looked at {path})")
    elif shutil.which(program, path=env.get("PATH", os.defpath)) is None:
        raise CommandError(f"program {program!r} was not found on PATH; give its full path in argv[0]")


@dataclass
class _Stream:
    path: Path
    tail_bytes: int
    max_log_bytes: int
    file: BinaryIO
    bytes_total: int = 0
    bytes_logged: int = 0
    lines: int = 0
    tail: bytearray = field(default_factory=bytearray)
    last_line: bytes = b""
    stamps: OutputStamps | None = None
    """The server's arrival times of the stream's lines, where they are kept (log-timed launches)."""

    def feed(self, chunk: bytes) -> None:
        self.bytes_total += len(chunk)
        if self.stamps is not None:
            self.stamps.feed(self.bytes_total, chunk)
        self.lines += chunk.count(b"\n")
        room = self.max_log_bytes - self.bytes_logged
        if room > 0:
            piece = chunk[:room]
            self.file.write(piece)
            self.bytes_logged += len(piece)
        self.tail += chunk
        if len(self.tail) > self.tail_bytes:
            del self.tail[: len(self.tail) - self.tail_bytes]
        stripped = chunk.rstrip(b"\n")
        if stripped:
            self.last_line = stripped.rsplit(b"\n", 1)[-1][-500:]

    def capture(self) -> StreamCapture:
        return StreamCapture(
            path=str(self.path),
            bytes_total=self.bytes_total,
            bytes_logged=self.bytes_logged,
            lines=self.lines,
            tail=bytes(self.tail).decode("utf-8", errors="replace"),
            tail_truncated=self.bytes_total > len(self.tail),
        )


async def _pump(source: anyio.abc.ByteReceiveStream, sink: _Stream) -> None:
    try:
        async for chunk in source:
            sink.feed(chunk)
    except (anyio.ClosedResourceError, anyio.BrokenResourceError):
        return


def _alive(run: RunHandle, process: anyio.abc.Process) -> bool:
    reap_zombies([run])
    return bool(members([run]) - ({process.pid} if process.returncode is not None else set()))


async def _stop_run(process: anyio.abc.Process, run: RunHandle, grace_s: float) -> bool:
    """TERM every process of the run, wait up to ``grace_s`` for all of them, then KILL until none is left.

    Returns True when anything had to be signalled.
    """
    if process.returncode is not None and not _alive(run, process):
        return False
    for pid in members([run]):
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGTERM)
    with anyio.move_on_after(grace_s):
        await process.wait()
        while _alive(run, process):
            await anyio.sleep(_POLL_S)
    for _ in range(200):
        if process.returncode is not None and not _alive(run, process):
            break
        for pid in members([run]):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        with anyio.move_on_after(_POLL_S * 5):
            await process.wait()
    await process.wait()
    return True


async def execute(
    request: CommandRequest,
    *,
    stdout_path: Path,
    stderr_path: Path,
    limits: ExecLimits | None = None,
    on_progress: ProgressCallback | None = None,
    registry: ProcessRegistry | None = None,
    launch: int | None = None,
    watch: ProgressWatch | None = None,
) -> CommandResult:
    """Run ``request`` to completion, timeout or cancellation; ``launch`` is its launch id
    (`perfgate.execution.launches`), given to the process tree after the request's own environment.
    ``watch``, when given, is asked every `_WATCH_S` whether the run stalled; when it says so and its
    ``on_stall`` agrees, the run is stopped as on a timeout (``stalled`` in the result).

    The caller is responsible for having approved ``request`` and checked the policy's limits;
    this function only refuses what cannot be started.

    Raises:
        CommandError: the working directory or the program does not exist or cannot be executed.
    """
    limits = limits or ExecLimits()
    cwd = request.cwd
    if not cwd.is_dir():
        raise CommandError(f"working directory {cwd} does not exist or is not a directory")
    env = {**os.environ, **request.env}
    _resolve_program(request, env)
    # Inherited by everything the command starts: how its descendants are found wherever they go.
    tag = new_tag()
    env[RUN_TAG_VAR] = tag
    if launch is not None:
        env.update(launch_variables(launch))

    started = time.monotonic()
    with stdout_path.open("wb") as out_file, stderr_path.open("wb") as err_file:
        out = _Stream(stdout_path, limits.tail_bytes, limits.max_log_bytes, out_file)
        if LOG_PATTERN_ENV in request.env:
            out.stamps = OutputStamps()
        err = _Stream(stderr_path, limits.tail_bytes, limits.max_log_bytes, err_file)
        try:
            process = await anyio.open_process(
                list(request.argv),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                cwd=cwd,
                env=env,
                start_new_session=True,
            )
        except OSError as exc:
            raise CommandError(f"cannot start {request.argv[0]!r}: {exc.strerror or exc}") from exc
        # After setsid the child's pid is its process group id.
        run = RunHandle(process.pid, tag)
        if registry is not None:
            registry.add(run)

        async def report() -> None:
            if on_progress is None:
                return
            last = (out.last_line or err.last_line).decode("utf-8", errors="replace")
            await on_progress(
                CommandProgress(time.monotonic() - started, out.lines, err.lines, last, process.pid)
            )

        async def progress_loop() -> None:
            while True:
                await anyio.sleep(limits.progress_interval_s)
                await report()

        timed_out = False
        stalled = False
        stragglers = False
        wait_scope = anyio.CancelScope(deadline=anyio.current_time() + request.timeout_s)

        async def watch_loop() -> None:
            nonlocal stalled
            if watch is None:
                return
            seen, last_output = -1, time.monotonic_ns()
            while True:
                await anyio.sleep(_WATCH_S)
                now = time.monotonic_ns()
                total = out.bytes_total + err.bytes_total
                if total != seen:
                    seen, last_output = total, now
                if watch.due(last_output, now) and await watch.on_stall(members([run]), last_output, now):
                    if process.returncode is None:  # it may have ended by itself while being looked at
                        stalled = True
                        wait_scope.cancel()
                    return

        try:
            await report()
            async with anyio.create_task_group() as tg:
                pumps_done = anyio.Event()

                async def pumps() -> None:
                    assert process.stdout is not None and process.stderr is not None
                    async with anyio.create_task_group() as inner:
                        inner.start_soon(_pump, process.stdout, out)
                        inner.start_soon(_pump, process.stderr, err)
                    pumps_done.set()

                tg.start_soon(pumps)
                tg.start_soon(progress_loop)
                tg.start_soon(watch_loop)
                with wait_scope:
                    await process.wait()
                timed_out = wait_scope.cancelled_caught and not stalled
                signalled = await _stop_run(process, run, limits.kill_grace_s)
                stragglers = signalled and not timed_out
                # A process that left the group may still hold the pipes; do not wait on it forever.
                with anyio.move_on_after(limits.kill_grace_s):
                    await pumps_done.wait()
                tg.cancel_scope.cancel()
        finally:
            with anyio.CancelScope(shield=True):
                await _stop_run(process, run, limits.kill_grace_s)
                reap_zombies([run], forget=True)
                if registry is not None:
                    registry.discard(run)
                await process.aclose()
        await report()
    if out.stamps is not None:
        out.stamps.save(stamps_path(stdout_path))

    code = process.returncode
    assert code is not None
    return CommandResult(
        argv=list(request.argv),
        cwd=str(cwd),
        env=dict(request.env),
        digest=request.digest,
        pid=process.pid,
        exit_code=code if code >= 0 else None,
        signal=signal.Signals(-code).name if code < 0 else None,
        timed_out=timed_out,
        stalled=stalled,
        duration_s=time.monotonic() - started,
        stragglers_killed=stragglers,
        stdout=out.capture(),
        stderr=err.capture(),
    )
