"""What a tool gets for one call: the workspace, the ledger, path confinement and progress.

The runtime knows nothing about MCP: the server adapts the SDK's context into it, and tests can build
one directly around a temporary workspace.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, TypeVar

import anyio.to_thread
from pydantic import BaseModel

from perfgate.errors import ToolError
from perfgate.evidence import EvidenceDraft, EvidenceRecord, Ledger
from perfgate.evidence._writer import run_in_ledger_thread
from perfgate.execution.executor import CommandResult, ProgressWatch
from perfgate.execution.request import CommandRequest
from perfgate.execution.service import CommandRunner, UnapprovedCommandError
from perfgate.helpers.statefs import make_dirs, write_file
from perfgate.security.scrubber import Scrubber, scrub_stream
from perfgate.serving.config import ServerConfig

__all__ = ["EvidenceBuilder", "ProgressFn", "ServerConfig", "ToolRuntime"]

ProgressFn = Callable[[float, "float | None", "str | None"], Awaitable[None]]
OutT = TypeVar("OutT", bound=BaseModel)


async def _no_progress(progress: float, total: float | None, message: str | None) -> None:
    return None


@dataclass
class EvidenceBuilder:
    """A record being assembled: its id is fixed up front so artifacts can be written under it.

    Text written as an artifact (`write_text`, `write_json`, `copy_in`) passes the scrubber the ledger
    applies to the record (`perfgate.security.scrubber.Scrubber.for_tree` of the tool's ``inputs``, whose env and
    argv secrets it adds): a string a run reported (a tensor key, a path, a metric name) is kept in no
    artifact raw. `write_bytes` writes as given (images; text its caller scrubbed).
    """

    id: str
    tool: str
    dir: Path
    started_at: str
    artifact_names: list[str] = field(default_factory=list[str])
    inputs: Any = None
    _scrub: Scrubber | None = field(default=None, repr=False)

    def scrubber(self) -> Scrubber:
        if self._scrub is None:
            self._scrub = Scrubber.for_tree(self.inputs) if self.inputs is not None else Scrubber()
        return self._scrub

    def path(self, name: str) -> Path:
        """Where to write artifact ``name`` (a plain file name); it is recorded on commit. The record's
        folder is created with its first artifact (a record without artifacts leaves no folder)."""
        if not name or name != Path(name).name or name.startswith("."):
            raise ValueError(f"artifact name must be a plain file name, got {name!r}")
        if name not in self.artifact_names:
            make_dirs(self.dir)  # in the agent-writable .perfgate/: a link planted on the way is refused
            self.artifact_names.append(name)
        return self.dir / name

    def write_text(self, name: str, text: str) -> Path:
        return self.write_bytes(name, self.scrubber().text(text).encode())

    def write_json(self, name: str, value: Any) -> Path:
        clean = self.scrubber().tree(value)
        return self.write_bytes(
            name, (json.dumps(clean, indent=2, sort_keys=True, allow_nan=False) + "\n").encode()
        )

    def write_bytes(self, name: str, data: bytes) -> Path:
        path = self.path(name)
        write_file(path, data)  # never through a link planted at the name or on the way
        return path

    def copy_in(self, name: str, source: BinaryIO) -> Path:
        """Artifact ``name`` holding what is left to read of ``source``, written as `write_bytes` writes."""
        path = self.path(name)
        write_file(path, scrub_stream(source, self.scrubber()))
        return path


@dataclass
class ToolRuntime:
    """Per-call services for a tool."""

    config: ServerConfig
    ledger: Ledger
    tool: str
    inputs: dict[str, Any] = field(default_factory=dict[str, Any])
    report: ProgressFn = _no_progress
    commands: CommandRunner | None = None
    key_image: bytes | None = None
    plots_off: str | None = None
    committed: tuple[BaseModel, dict[str, Any]] | None = None
    """The output last returned by `commit` and the result its record stored (the output's JSON dump,
    through JSON), when the two agree: the answer reuses that dump."""

    @property
    def workspace(self) -> Path:
        return self.config.workspace

    @property
    def private_dir(self) -> Path:
        """This workspace's folder in the trust root (``state/workspaces/<id>``): where a run's records,
        logs and traces are written while it runs, out of the agent's reach.

        Raises:
            TrustRootError: the trust root cannot be written.
        """
        # resolved: the server's link-refusing file operations walk it (links on it are the operator's)
        return self.ledger.trust.workspace_dir(self.workspace).resolve()

    async def progress(self, done: float, total: float | None = None, message: str | None = None) -> None:
        """Send a progress notification to the client (a no-op when it did not ask for progress)."""
        await self.report(done, total, message)

    async def run_command(
        self,
        request: CommandRequest,
        evidence: EvidenceBuilder,
        *,
        label: str = "",
        log_dir: Path | None = None,
        watch: ProgressWatch | None = None,
        side: int = 0,
        around: Callable[[], contextlib.AbstractContextManager[object]] | None = None,
    ) -> CommandResult:
        """Run the command this call was approved for; its logs become artifacts of ``evidence``. A
        paired run's request runs one side at a time: ``side`` 0 its baseline, 1 its candidate, with ``around``
        putting its code in place (`perfgate.execution.service.CommandRunner.run`).

        ``request`` must equal what the spec's ``command`` function returned for this input. The server
        captures the output in a private folder (``log_dir``, a folder of `private_dir` the caller holds,
        or a temporary one) and then copies it to the artifacts ``{label}stdout.log`` /
        ``{label}stderr.log``; ``result.stdout.path`` is the private copy when ``log_dir`` is given: read
        figures from there, never from the workspace. Progress is reported while it runs. A non-zero
        exit is a result (``exit_code``, ``signal``, ``timed_out``), not an exception: record it as
        ``failed`` evidence, with ``command=result.argv, exit_code=result.exit_code``. ``watch`` (see
        `perfgate.execution.hang.HangWatch`) stops a run that makes no progress (``result.stalled``).

        Raises:
            ToolError: outside the operator's limits, or the program/cwd does not exist.
            UnapprovedCommandError: not the approved request, or the tool declares no command.
        """
        if self.commands is None:
            raise UnapprovedCommandError(f"{self.tool} declares no ToolSpec.command; it cannot run commands")
        return await self.commands.run(
            request, evidence, label=label, log_dir=log_dir, watch=watch, side=side, around=around
        )

    async def start_detached(
        self, request: CommandRequest, *, launches: int, record_dir: str | None, meta: dict[str, Any]
    ) -> tuple[str, Path]:
        """Start this call's approved command detached (it outlives the call); returns (run id, run dir).

        Raises:
            ToolError: outside the operator's limits, or the program does not exist.
            UnapprovedCommandError: not the approved request, or the tool declares no command.
        """
        if self.commands is None:
            raise UnapprovedCommandError(f"{self.tool} declares no ToolSpec.command; it cannot run commands")
        return await self.commands.start_detached(
            request, self.private_dir, launches=launches, record_dir=record_dir, meta=meta
        )

    async def plot(
        self, evidence: EvidenceBuilder, name: str, render: Callable[[], bytes], *, key: bool = False
    ) -> str | None:
        """Render a PNG artifact of ``evidence`` in a worker thread; ``key`` also returns it to the agent.

        Plots are optional: without matplotlib nothing is written, the agent is told plots are off, and
        None is returned. A plot never fails the tool.
        """
        from perfgate.report.plots import PlotsUnavailable

        try:
            png = await anyio.to_thread.run_sync(render)
        except PlotsUnavailable as exc:
            self.plots_off = str(exc)
            return None
        evidence.write_bytes(name, png)
        if key:
            self.key_image = png
        return name

    def resolve_path(self, raw: str, *, kind: str = "any", must_exist: bool = True) -> Path:
        """Resolve a user-supplied path (relative to the workspace) and confine it.

        Symlinks are resolved before the check, so a link pointing outside the workspace is refused.
        ``kind`` is ``file``, ``dir`` or ``any``. Readers open the returned path with
        `perfgate.helpers.safeopen.open_file`, which follows no link: a folder swapped for a link after this
        check makes the read fail instead of leaving the workspace.

        Raises:
            ToolError: the path escapes the workspace and the extra read roots, or does not exist.
        """
        if "\x00" in raw:
            raise ToolError("path contains a NUL byte")
        try:
            candidate = Path(raw).expanduser()
            if not candidate.is_absolute():
                candidate = self.workspace / candidate
            resolved = candidate.resolve()
            resolved.exists()  # raises for names the file system cannot hold
        except (OSError, RuntimeError) as exc:  # RuntimeError: a symlink loop on Python 3.10-3.12
            shown = raw if len(raw) <= 80 else raw[:77] + "..."
            raise ToolError(
                f"path {shown!r} cannot be used: {getattr(exc, 'strerror', None) or exc}"
            ) from exc
        roots = (self.workspace, *self.config.read_roots)
        if not any(resolved == root or root in resolved.parents for root in roots):
            allowed = ", ".join(str(r) for r in roots)
            # Where it leads is not said: a refusal naming files outside would tell which exist.
            raise ToolError(
                f"path {raw[:200]!r} leads outside the workspace ({allowed})\n"
                "next: copy the file into the workspace (links are not followed out of it), or ask the operator "
                "to start the server with --read-root for that folder"
            )
        if must_exist and not resolved.exists():
            raise ToolError(f"path {raw!r} does not exist (resolved to {resolved})")
        if must_exist and kind == "file" and not resolved.is_file():
            raise ToolError(f"path {raw!r} is not a regular file")
        if must_exist and kind == "dir" and not resolved.is_dir():
            raise ToolError(f"path {raw!r} is not a directory")
        return resolved

    def relative(self, path: Path) -> str:
        """A path as shown in results: relative to the workspace when inside it."""
        try:
            return str(path.relative_to(self.workspace))
        except ValueError:
            return str(path)

    def evidence(self) -> EvidenceBuilder:
        """Start a record for this call: reserves an id and its artifact folder."""
        evidence_id = Ledger.new_id()
        return EvidenceBuilder(
            id=evidence_id,
            tool=self.tool,
            dir=self.ledger.artifact_dir(evidence_id, create=False),
            started_at=Ledger.timestamp(),
            inputs=self.inputs,
        )

    async def commit(
        self,
        builder: EvidenceBuilder,
        output: OutT,
        *,
        profiled: bool = False,
        command: list[str] | None = None,
        exit_code: int | None = None,
        environment_id: str | None = None,
    ) -> OutT:
        """Append the record (state and result taken from ``output``) and return ``output``.

        The output must carry ``evidence_id == builder.id`` and a ``state``; the whole output is stored
        as the record's result so later tools (comparisons, decisions, reports) can read it back. The
        answer shows what was stored: change nothing in the output after committing it.
        """
        from pydantic import ValidationError

        result = output.model_dump(mode="json")
        assert result.get("evidence_id") == builder.id, "output.evidence_id must be the builder's id"
        state = result.get("state")
        assert state is not None, "tool outputs carry a state"
        draft = EvidenceDraft(
            id=builder.id,
            tool=builder.tool,
            state=state,
            inputs=self.inputs,
            result=result,
            profiled=profiled,
            command=command,
            exit_code=exit_code,
            environment_id=environment_id,
            artifact_names=list(builder.artifact_names),
            started_at=builder.started_at,
        )
        # One redaction pass, the ledger's, scrubs what is stored (argv flags, env values, URLs); when it
        # changed the result, the answer is rebuilt from the stored one.
        record = await run_in_ledger_thread(self.ledger.append, draft)
        if record.result != result:
            self.committed = None
            # A constrained field that cannot hold the marker keeps the answer as is; the record is scrubbed.
            with contextlib.suppress(ValidationError):
                output = type(output).model_validate(record.result)
        else:
            self.committed = (output, record.result)
        return output

    async def load(self, evidence_id: str) -> EvidenceRecord:
        """A committed record by id.

        Raises:
            ToolError: no such record in this workspace's ledger.
        """
        record = await anyio.to_thread.run_sync(self.ledger.get, evidence_id)
        if record is None:
            raise ToolError(
                f"no evidence {evidence_id!r} in the ledger of {self.workspace}; list records with "
                "`perfgate ledger show` or use an evidence_id returned by an earlier tool call"
            )
        return record
