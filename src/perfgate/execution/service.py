"""Server-lifetime execution state, and the per-call runner tools use to run their approved command.

`ExecutionService` is created once in the server lifespan: it reports policy files found in the workspace
(never obeyed), stops what a killed server's commands left running, and tracks the process groups it
starts so shutdown stops them. It reads the operator's policy from the trust root once, at start (a run
cannot widen its own allowlist); the approval gate over it and the approval store open when a tool first
asks to run a command. `CommandRunner` is handed to one tool call; it runs
only the request whose digest that call's gate approved.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import logging
import shutil
import tempfile
from collections.abc import Awaitable, Callable, Generator
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, Protocol, cast

import anyio.to_thread

from perfgate.errors import ToolError
from perfgate.evidence import Ledger
from perfgate.execution.executor import (
    CommandError,
    CommandProgress,
    CommandResult,
    ExecLimits,
    ProcessRegistry,
    ProgressWatch,
    StreamCapture,
    execute,
    resolve_program,
)
from perfgate.execution.launches import next_launch_id
from perfgate.execution.policy import ExecutionPolicy, PolicyError, load_policy, workspace_policy_files
from perfgate.execution.reaper import RunList, become_subreaper

if TYPE_CHECKING:
    from perfgate.execution.gate import ApprovalGate, ElicitAction, Grant
    from perfgate.execution.request import CommandRequest
    from perfgate.security.scrubber import Scrubber

__all__ = [
    "ArtifactSink",
    "ArtifactWriter",
    "CommandRunner",
    "ExecutionService",
    "ReportFn",
    "UnapprovedCommandError",
]

_log = logging.getLogger("perfgate")

ReportFn = Callable[[float, "float | None", "str | None"], Awaitable[None]]
"""``(progress, total, message)``: the shape of an MCP progress notification."""


class ArtifactSink(Protocol):
    """Where a record's artifact files go (the tool's evidence builder)."""

    def path(self, name: str) -> Path: ...


class ArtifactWriter(ArtifactSink, Protocol):
    """A sink that also writes a record's artifacts; each returns the file it wrote."""

    def write_bytes(self, name: str, data: bytes) -> Path: ...

    def write_json(self, name: str, value: Any) -> Path: ...

    def copy_in(self, name: str, source: BinaryIO) -> Path: ...

    def scrubber(self) -> Scrubber:
        """What every string written through this sink passes (the tool's request secrets included)."""
        ...


class UnapprovedCommandError(RuntimeError):
    """A tool tried to run a command its call was not approved for: a bug in the tool, never the agent's."""


def record_cleanup(ledger: Ledger, leftovers: list[dict[str, object]]) -> str:
    """Record that this start stopped what commands of a killed server left running; returns the id."""
    from perfgate.evidence import EvidenceDraft, EvidenceState

    stopped = sum(len(cast("list[int]", e.get("stopped") or [])) for e in leftovers)
    _log.warning(
        "perfgate: a previous server ended without stopping its commands; stopped %d leftover process(es) "
        "of %d run(s)",
        stopped,
        len(leftovers),
    )
    evidence_id = Ledger.new_id()
    ledger.append(
        EvidenceDraft(
            id=evidence_id,
            tool="process_cleanup",
            state=EvidenceState.EXECUTED,
            result={
                "evidence_id": evidence_id,
                "state": "executed",
                "runs": leftovers,
                "processes_stopped": stopped,
                "note": "commands of a server that was killed (no cleanup ran) were found by their run tag "
                "and stopped at the next start",
            },
        )
    )
    return evidence_id


class ExecutionService:
    """Policy, approvals and running process groups of one server."""

    def __init__(self, workspace: Path, ledger: Ledger, limits: ExecLimits | None = None) -> None:
        self.workspace = workspace.resolve()
        self.limits = limits or ExecLimits()
        self.ledger = ledger
        trust = ledger.trust
        self.ignored = tuple(workspace_policy_files(self.workspace))
        for path in self.ignored:
            _log.warning(
                "perfgate: ignoring %s: the execution policy is read from the trust root (%s), never from "
                "the workspace the agent can write; move the [execution] table there if you wrote it",
                path,
                trust.policy_file,
            )
        # The operator's policy, read now, once: a change to it (by a run, or by the agent's own shell)
        # takes effect at the next start, never in this server.
        self._policy: ExecutionPolicy | None = None
        self._policy_error: str | None = None
        try:
            self._policy = load_policy(self.workspace, trust)
        except PolicyError as exc:
            self._policy_error = str(exc)
        # Orphans of our commands are re-parented to us, not to init, so they stay findable.
        self.subreaper = become_subreaper()
        self.private_dir = trust.workspace_dir(self.workspace).resolve()
        run_list = RunList(self.private_dir / "runs.json")
        self.registry = ProcessRegistry(run_list)
        self.leftovers = run_list.stop_leftovers()
        if self.leftovers:
            record_cleanup(ledger, self.leftovers)
        # Last resort when the interpreter exits without running the lifespan's cleanup.
        atexit.register(self.registry.kill_all)

    @functools.cached_property
    def gate(self) -> ApprovalGate:
        """The approval gate over the policy read at start and the approval store, made when a tool first
        asks to run a command (its modules are not loaded before). A policy that did not load makes a gate
        that approves nothing by policy and says why."""
        from perfgate.execution.approvals import ApprovalStore
        from perfgate.execution.gate import ApprovalGate

        store = ApprovalStore.open(self.workspace, self.ledger.trust)
        return ApprovalGate(
            self.workspace, self.ledger, store, self._policy, self._policy_error, self.ignored
        )

    @contextlib.contextmanager
    def scratch(self) -> Generator[Path]:
        """A fresh private folder in this workspace's trust root folder, removed afterwards."""
        parent = self.private_dir / "scratch"
        parent.mkdir(mode=0o700, exist_ok=True)
        folder = Path(tempfile.mkdtemp(dir=parent))
        try:
            yield folder
        finally:
            shutil.rmtree(folder, ignore_errors=True)

    async def aclose(self) -> None:
        """Stop every process group still running (TERM, then KILL after the grace period)."""
        await self.registry.aclose(self.limits.kill_grace_s)
        atexit.unregister(self.registry.kill_all)

    async def bind(self, request: CommandRequest) -> CommandRequest:
        """``request`` bound to the code it runs now (file digests, workspace code state, programs, the
        importable files, whose text is kept for the approval's diff)."""
        from perfgate.execution.binding import bind_code
        from perfgate.execution.gate import change_store

        return await anyio.to_thread.run_sync(
            bind_code, request.unbound(), self.workspace, change_store(self.gate.store)
        )

    async def preapproved(self, request: CommandRequest, tool: str) -> Grant | None:
        return await anyio.to_thread.run_sync(self.gate.preapproved, request, tool)

    async def settle_elicitation(
        self, request: CommandRequest, tool: str, action: ElicitAction, who: str, note: str = ""
    ) -> Grant:
        return await anyio.to_thread.run_sync(self.gate.settle_elicitation, request, tool, action, who, note)

    async def require_human(self, request: CommandRequest, tool: str) -> None:
        await anyio.to_thread.run_sync(self.gate.require_human, request, tool)

    def runner(self, grant: Grant | None, report: ReportFn) -> CommandRunner:
        return CommandRunner(self, grant, report)


class CommandRunner:
    """Runs the one request a tool call was approved for."""

    def __init__(self, service: ExecutionService, grant: Grant | None, report: ReportFn) -> None:
        self._service = service
        self.grant = grant
        self._report = report

    @property
    def registry(self) -> ProcessRegistry:
        """The server's process registry: a process started here is stopped when the server shuts down."""
        return self._service.registry

    async def start_detached(
        self,
        request: CommandRequest,
        state_dir: Path,
        *,
        launches: int,
        record_dir: str | None,
        meta: dict[str, Any],
    ) -> tuple[str, Path]:
        """Start the approved ``request`` under a detached supervisor (see `perfgate.execution.detached`).

        The same approval and limits apply as to `run`; the run is not in the server's process registry,
        so it outlives the call and the server. Returns (run id, run directory).

        Raises:
            UnapprovedCommandError: ``request`` is not the request this call's gate approved.
            ToolError: outside the operator's limits, or the program does not exist.
        """
        from perfgate.execution import detached

        if self.grant is None:
            raise UnapprovedCommandError(
                f"refusing to start {list(request.argv)!r}: this call approved nothing"
            )
        request = await self._service.bind(request)
        if self.grant.digest != request.digest:
            if self.grant.base_digest == request.unbound().digest:
                raise ToolError(
                    "the code changed after this command was approved (a file it runs or the workspace's code "
                    f"state: {request.code.summary if request.code else 'unknown'}); it did not start. Call "
                    "again: the changed code needs a new approval."
                )
            raise UnapprovedCommandError(
                f"refusing to start {list(request.argv)!r}: its digest {request.short_digest} is not the one "
                "approved for this call"
            )
        self._service.gate.check_limits(request)
        try:
            resolve_program(request)
        except CommandError as exc:
            raise ToolError(
                f"{exc}. Fix argv or cwd and call again (a changed command needs a new approval)."
            ) from exc
        meta = {**meta, "approved_how": self.grant.how.value, "approval_evidence_id": self.grant.evidence_id}
        return await anyio.to_thread.run_sync(
            lambda: detached.start(
                state_dir,
                argv=list(request.argv),
                cwd=request.cwd,
                env=dict(request.env),
                timeout_s=request.timeout_s,
                launches=launches,
                record_dir=record_dir,
                meta=meta,
            )
        )

    async def run(
        self,
        request: CommandRequest,
        artifacts: ArtifactSink,
        *,
        label: str = "",
        log_dir: Path | None = None,
        watch: ProgressWatch | None = None,
        side: int = 0,
        around: Callable[[], contextlib.AbstractContextManager[object]] | None = None,
    ) -> CommandResult:
        """Run ``request`` after checking it is the approved one; logs go to ``{label}stdout.log`` etc.
        ``watch`` may stop it early when it stalls (`perfgate.execution.executor.execute`). A pair
        (`CommandRequest.paired`) is checked whole and runs the side ``side`` names: 0 its baseline, 1 its
        candidate; ``around`` (entered after the check, left after the process ended) puts that side's code
        in place, a baseline's `CommandRequest.code_ref`, so the approval is checked on the candidate's.

        The output is captured where only the operator can write (``log_dir``, or a temporary folder in
        the trust root), without secrets, then copied to the artifacts: the copy in the workspace is for
        people, the private file is what figures are read from (``result.stdout.path`` when ``log_dir`` is
        given; with a temporary folder the paths are the artifacts'). Progress is reported as elapsed
        seconds out of the timeout, with lines seen and the last line.

        Raises:
            UnapprovedCommandError: ``request`` is not the request this call's gate approved.
            ToolError: the request is outside the operator's limits, or cannot be started.
        """
        if self.grant is None:
            raise UnapprovedCommandError(
                f"refusing to run {list(request.argv)!r}: this call approved nothing"
            )
        request = await self._service.bind(request)
        if self.grant.digest != request.digest:
            if self.grant.base_digest == request.unbound().digest:
                raise ToolError(
                    "the code changed after this command was approved (a file it runs or the workspace's code "
                    f"state: {request.code.summary if request.code else 'unknown'}); it did not run. Call again: "
                    "the changed code needs a new approval."
                )
            raise UnapprovedCommandError(
                f"refusing to run {list(request.argv)!r}: its digest {request.short_digest} is not the one "
                "approved for this call"
            )
        self._service.gate.check_limits(request)
        request = request.sides[side]

        async def on_progress(p: CommandProgress) -> None:
            line = p.last_line[:160]
            await self._report(
                p.elapsed_s,
                request.timeout_s,
                f"pid {p.pid}: {p.elapsed_s:.0f} s, {p.stdout_lines} stdout / {p.stderr_lines} stderr lines"
                + (f"; last: {line}" if line else ""),
            )

        with contextlib.ExitStack() as stack:
            folder = log_dir if log_dir is not None else stack.enter_context(self._service.scratch())
            names = (f"{label}stdout.log", f"{label}stderr.log")
            launch = await anyio.to_thread.run_sync(next_launch_id, self._service.private_dir)
            if around is not None:
                stack.enter_context(around())
            try:
                result = await execute(
                    request,
                    stdout_path=folder / names[0],
                    stderr_path=folder / names[1],
                    limits=self._service.limits,
                    on_progress=on_progress,
                    registry=self._service.registry,
                    launch=launch,
                    watch=watch,
                )
            except CommandError as exc:
                raise ToolError(
                    f"{exc}. Fix argv or cwd and call again (a changed command needs a new approval)."
                ) from exc
            result = await anyio.to_thread.run_sync(_scrub_result, result, request)
            published = await anyio.to_thread.run_sync(_publish, result, artifacts, names)
            if log_dir is None:
                result = published
        return result.model_copy(
            update={
                "approved_how": self.grant.how.value,
                "approval_evidence_id": self.grant.evidence_id,
                "launch_id": launch,
            }
        )


def _publish(result: CommandResult, artifacts: ArtifactSink, names: tuple[str, str]) -> CommandResult:
    """Copy the captured logs to the record's artifacts; the result with the artifacts' paths."""
    streams: dict[str, StreamCapture] = {}
    for key, capture, name in (("stdout", result.stdout, names[0]), ("stderr", result.stderr, names[1])):
        target = artifacts.path(name)
        source = Path(capture.path)
        if source.is_file():
            shutil.copyfile(source, target)
        else:
            target.write_bytes(b"")
        streams[key] = capture.model_copy(update={"path": str(target)})
    return result.model_copy(update=streams)


def _scrub_result(result: CommandResult, request: CommandRequest) -> CommandResult:
    """The command's logs (kept as artifacts) and tails without the secrets it was given or printed."""
    from perfgate.security.scrubber import Scrubber, scrub_file

    scrub = Scrubber.for_values(request.env, request.argv)
    for capture in (result.stdout, result.stderr):
        path = Path(capture.path)
        if path.is_file():
            scrub_file(path, scrub)
    return result.model_copy(
        update={
            "argv": scrub.argv(result.argv),
            "env": {k: str(v) for k, v in scrub.env(result.env).items()},
            "stdout": result.stdout.model_copy(update={"tail": scrub.text(result.stdout.tail)}),
            "stderr": result.stderr.model_copy(update={"tail": scrub.text(result.stderr.tail)}),
        }
    )
