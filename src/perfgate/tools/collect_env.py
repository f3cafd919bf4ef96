"""collect_env: the training environment, as the training interpreter sees it, recorded as evidence.

The probing and assembly code is imported where it is used, to keep server start-up fast.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import sys
import tempfile
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, cast

import anyio
import anyio.to_thread
from pydantic import BaseModel, ConfigDict, Field

from perfgate.envprobe import (
    EnvironmentSummary,
    Fingerprint,
    Provenance,
    SystemTool,
    Unavailable,
    Visibility,
)
from perfgate.errors import ToolError
from perfgate.evidence import EvidenceState
from perfgate.execution.executor import CommandError, CommandProgress, CommandResult, ExecLimits, execute
from perfgate.execution.request import CommandRequest
from perfgate.quoting import file_text
from perfgate.redactor import Redactor
from perfgate.tools._runtime import EvidenceBuilder, ToolRuntime
from perfgate.tools._spec import ToolSpec

if TYPE_CHECKING:
    from perfgate.envprobe import GitSnapshot, ProbeOutput

__all__ = ["SPEC", "CollectEnvInput", "CollectEnvOutput", "command", "run"]

_MAX_PROBE_OUTPUT_BYTES = 8 * 1024 * 1024
_MAX_LOG_REWRITE_BYTES = 64 * 1024 * 1024


class CollectEnvInput(BaseModel):
    model_config = ConfigDict(extra="forbid")

    python: Annotated[
        str | None,
        Field(
            description="The training interpreter: an absolute path, a path relative to the workspace "
            "(e.g. '.venv/bin/python') or a command name on the server's PATH. Omit to probe the server's own "
            "interpreter, which needs no approval; any other interpreter runs the probe through the approval gate."
        ),
    ] = None
    env: Annotated[
        dict[str, str],
        Field(
            description="Variables the training launch sets (e.g. CUDA_VISIBLE_DEVICES, MUSA_VISIBLE_DEVICES, "
            "NCCL_*), applied to the probe so it sees what training will see. Setting any makes the run "
            "approval-gated, even with the server's own interpreter."
        ),
    ] = Field(default_factory=dict[str, str])
    launch_command: Annotated[
        list[str] | None,
        Field(
            min_length=1,
            description="The training launch command as an argv list, recorded (redacted) as provenance; "
            "it is not run.",
        ),
    ] = None
    timeout_s: Annotated[
        float,
        Field(
            gt=0,
            le=3600,
            description="Wall-clock limit for the probe in seconds (importing torch can be slow).",
        ),
    ] = 120.0
    system_tools: Annotated[
        bool,
        Field(description="Also query nvidia-smi/NVML, mthreads-gmi, rocm-smi, nsys, ncu, msys and mcu."),
    ] = True


class CollectEnvOutput(BaseModel):
    evidence_id: str
    environment_id: str = Field(
        description="Cite this id (it equals evidence_id) as the environment of later benchmark and decision records."
    )
    state: EvidenceState = Field(
        description="executed: the probe ran to its end; failed: it crashed, hung or printed no probe output."
    )
    interpreter: str = Field(description="The interpreter probed (home directory shown as ~).")
    server_interpreter: bool = Field(
        description="True when it is the server's own interpreter (no approval needed)."
    )
    failure: str | None = Field(description="Why the probe failed, and what to do; null when it ran.")
    summary: EnvironmentSummary
    fingerprint: Fingerprint
    visibility: Visibility
    switches: dict[str, str] = Field(
        description="Performance switches in the probe's environment; secrets redacted."
    )
    system_tools: list[SystemTool]
    provenance: Provenance
    unavailable: list[Unavailable] = Field(
        description="Every fact that could not be observed, with the reason."
    )
    warnings: list[str]
    probe_exit_code: int | None
    probe_timed_out: bool
    probe_duration_s: float = Field(description="Wall-clock seconds the probe ran.")
    artifacts: list[str] = Field(
        description="Artifact files of this record; environment.json holds everything."
    )


def _resolve_python(raw: str, workspace: Path) -> str:
    """The interpreter's absolute path (symlinks kept: a venv's python is a link, and that matters).

    Raises:
        ToolError: not found, not a file, not executable, or not a program the kernel can start.
    """
    if "\x00" in raw or not raw.strip():
        raise ToolError("python must be a non-empty path or command name")
    if os.sep not in raw and not raw.startswith("~"):
        found = shutil.which(raw)
        if found is None:
            raise ToolError(
                f"no {raw!r} on the server's PATH; give the training interpreter's path, e.g. '.venv/bin/python' "
                "or '/opt/conda/bin/python'"
            )
        raw = found
    path = Path(raw).expanduser()
    if not path.is_absolute():
        path = workspace / path
    text = os.path.abspath(path)
    if not os.path.exists(text):
        raise ToolError(
            f"interpreter {text} does not exist (a missing file or a broken symlink); give the training "
            "interpreter's path, e.g. '.venv/bin/python'"
        )
    if not os.path.isfile(text):
        raise ToolError(f"interpreter {text} is not a file; give the path of the python executable itself")
    if not os.access(text, os.X_OK):
        raise ToolError(f"interpreter {text} is not executable (chmod +x, or give the right python)")
    with open(text, "rb") as handle:
        magic = handle.read(4)
    if magic[:2] != b"#!" and magic != b"\x7fELF":
        raise ToolError(
            f"{text} is neither a native executable nor a script with a #! line, so it cannot be an interpreter"
        )
    return text


def _interpreter(inp: CollectEnvInput, rt: ToolRuntime) -> str:
    return sys.executable if inp.python is None else _resolve_python(inp.python, rt.workspace)


def _request(python: str, inp: CollectEnvInput, rt: ToolRuntime) -> CommandRequest:
    from perfgate.envprobe import probe_script

    return CommandRequest(
        argv=(python, str(probe_script())),
        cwd=rt.workspace,
        env=dict(inp.env),
        timeout_s=inp.timeout_s,
        reason=f"collect_env: run perfgate's read-only environment probe (a standard-library script that "
        f"prints JSON about the interpreter, torch and its devices) under {python}",
    )


def command(inp: CollectEnvInput, rt: ToolRuntime) -> CommandRequest | None:
    """The gated request; None for the server's own interpreter with no extra variables.

    Extra variables make even the server's own interpreter gated: LD_PRELOAD or PYTHONPATH would let
    them run arbitrary code.
    """
    from perfgate.envprobe import is_server_interpreter

    python = _interpreter(inp, rt)
    if is_server_interpreter(python) and not inp.env:
        return None
    return _request(python, inp, rt)


@dataclass
class _HostFacts:
    tools: list[SystemTool] = field(default_factory=list[SystemTool])
    transcripts: dict[str, str] = field(default_factory=dict[str, str])
    tool_missing: list[tuple[str, str]] = field(default_factory=list[tuple[str, str]])
    git: GitSnapshot | None = None
    git_reason: str | None = None


def _host_facts(workspace: Path, env: dict[str, str], system_tools: bool) -> _HostFacts:
    from perfgate.envprobe import collect_system_tools, git_snapshot

    facts = _HostFacts()
    if system_tools:
        facts.tools, facts.transcripts, facts.tool_missing = collect_system_tools(
            env=env, workspace=workspace
        )
    else:
        facts.tool_missing = [("system_tools", "not queried (system_tools=false)")]
    facts.git, facts.git_reason = git_snapshot(workspace)
    return facts


async def _run_probe(
    request: CommandRequest, gated: bool, ev: EvidenceBuilder, rt: ToolRuntime, folder: Path
) -> CommandResult:
    """Run the probe with its output captured in ``folder`` (private: in the trust root), which is what
    the facts are parsed from; the record's artifacts get copies, for people."""
    if gated:
        return await rt.run_command(request, ev, label="probe_", log_dir=folder)

    async def progress(p: CommandProgress) -> None:
        await rt.progress(p.elapsed_s, request.timeout_s, f"probe: {p.elapsed_s:.0f} s; {p.last_line[:120]}")

    try:
        result = await execute(
            request,
            stdout_path=folder / "probe_stdout.log",
            stderr_path=folder / "probe_stderr.log",
            limits=ExecLimits(kill_grace_s=2.0),
            on_progress=progress,
            # registered, so a server shutting down mid-probe stops it too
            registry=rt.commands.registry if rt.commands is not None else None,
        )
    except CommandError as exc:
        raise ToolError(f"{exc}; the server's own interpreter could not start the probe") from exc
    for name in ("probe_stdout.log", "probe_stderr.log"):
        with (folder / name).open("rb") as source:
            ev.copy_in(name, source)
    return result


@contextlib.contextmanager
def _private_folder(rt: ToolRuntime) -> Generator[Path]:
    """A fresh folder in this workspace's trust-root folder (the agent cannot write there), removed after."""
    parent = rt.private_dir / "scratch"
    parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    folder = Path(tempfile.mkdtemp(prefix="probe-", dir=parent))
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _read_head(path: Path, limit: int) -> str:
    with path.open("rb") as handle:
        return handle.read(limit).decode("utf-8", errors="replace")


def _rewrite_redacted(path: Path, clean: Callable[[str], str]) -> None:
    """Replace a log with its redacted text before the record hashes it."""
    if not path.exists():
        return
    size = path.stat().st_size
    text = _read_head(path, _MAX_LOG_REWRITE_BYTES)
    if size > _MAX_LOG_REWRITE_BYTES:
        text += f"\n[perfgate: log cut at {_MAX_LOG_REWRITE_BYTES} bytes of {size} before redaction]\n"
    path.write_text(clean(text), encoding="utf-8")


def _failure(result: CommandResult, probe: ProbeOutput, redactor: Redactor, timeout_s: float) -> str | None:
    """Why the probe run does not count as a complete observation, with what to do; None when it does."""
    stderr = result.stderr.tail.strip().splitlines()
    last_err = file_text(redactor.text(stderr[-1])) if stderr else ""
    stage = probe.last_stage or "start-up"
    if result.timed_out:
        return (
            f"the probe was killed at its {timeout_s:g} s timeout during '{stage}'; check that `import torch` "
            "works under this interpreter (a hung driver or a slow file system), or raise timeout_s"
        )
    if result.signal:
        return f"the probe was killed by {result.signal} during '{stage}'" + (
            f": {last_err}" if last_err else ""
        )
    if result.exit_code != 0:
        detail = f": {last_err}" if last_err else ""
        hint = " (the probe needs Python 3.7 or newer)" if "SyntaxError" in result.stderr.tail else ""
        return f"the probe exited with status {result.exit_code}{detail}{hint}"
    if not probe.began:
        return "the interpreter exited without printing probe output: it does not behave like a Python 3 " + (
            f"interpreter (stderr: {last_err})" if last_err else "interpreter"
        )
    if not probe.complete:
        return f"the probe output stops during '{stage}' without its end record"
    return None


async def run(inp: CollectEnvInput, rt: ToolRuntime) -> CollectEnvOutput:
    from perfgate.envprobe import (
        assemble,
        container_provenance,
        learn_host,
        parse_probe_output,
        sanitize_probe_log,
    )

    python = _interpreter(inp, rt)
    gated_request = command(inp, rt)
    request = gated_request if gated_request is not None else _request(python, inp, rt)
    env_seen = {**os.environ, **inp.env}
    redactor = Redactor(env_seen, homes=[str(Path.home())], hostnames=[socket.gethostname()])
    ev = rt.evidence()
    await rt.progress(0, None, f"probing {python}")

    facts_box: list[_HostFacts] = []
    probe_box: list[CommandResult] = []
    errors: list[ToolError] = []

    async def host() -> None:
        try:
            facts = await anyio.to_thread.run_sync(_host_facts, rt.workspace, env_seen, inp.system_tools)
        # Host queries are auxiliary: an unexpected failure in a vendor tool binding (NVML) or the file
        # system must cost only those facts, listed as unavailable, never the probe's record.
        except Exception as exc:  # noqa: BLE001 - the boundary of the auxiliary host queries
            facts = _HostFacts(
                tool_missing=[("system_tools", f"host queries failed: {type(exc).__name__}: {exc}")]
            )
            facts.git_reason = "not queried: the host queries failed"
        facts_box.append(facts)

    with _private_folder(rt) as folder:

        async def probe_task() -> None:
            try:
                probe_box.append(await _run_probe(request, gated_request is not None, ev, rt, folder))
            except ToolError as exc:
                errors.append(exc)

        async with anyio.create_task_group() as tg:
            tg.start_soon(host)
            tg.start_soon(probe_task)
        if errors:
            raise errors[0]
        # The facts come from the server's own capture, never from the copy in the workspace.
        probe = parse_probe_output(_read_head(folder / "probe_stdout.log", _MAX_PROBE_OUTPUT_BYTES))
    facts, result = facts_box[0], probe_box[0]
    learn_host(redactor, probe)
    raw_container: Any = probe.sections.get("container")
    container, container_missing = container_provenance(
        cast("dict[str, Any]", raw_container) if isinstance(raw_container, dict) else None
    )
    failure = _failure(result, probe, redactor, inp.timeout_s)

    # Artifacts are written redacted; logs are rewritten before the record hashes them.
    diff_name: str | None = None
    diff_redacted = False
    if facts.git is not None and facts.git.diff:
        diff_name = "git.diff"
        raw_diff = facts.git.diff.decode("utf-8", errors="replace")
        safe_diff = redactor.text(raw_diff)
        ev.write_text(diff_name, safe_diff)
        diff_redacted = safe_diff.encode("utf-8") != facts.git.diff
    for name, transcript in sorted(facts.transcripts.items()):
        ev.write_text(f"systool_{name}.txt", redactor.text(transcript))
    tools = [
        t.model_copy(update={"artifact": f"systool_{t.name}.txt"}) if t.name in facts.transcripts else t
        for t in facts.tools
    ]
    _rewrite_redacted(ev.path("probe_stdout.log"), lambda text: sanitize_probe_log(text, redactor))
    _rewrite_redacted(ev.path("probe_stderr.log"), redactor.text)

    run_info = {
        "argv": list(result.argv),
        "exit_code": result.exit_code,
        "signal": result.signal,
        "timed_out": result.timed_out,
        "duration_s": round(result.duration_s, 3),
        "stages": probe.stages,
        "complete": probe.complete,
        "stray_stdout_lines": probe.stray_lines,
        "approved_how": result.approved_how,
        "approval_evidence_id": result.approval_evidence_id,
    }
    assembled = assemble(
        probe,
        redactor=redactor,
        system_tools=tools,
        tool_missing=facts.tool_missing,
        git=facts.git,
        git_reason=facts.git_reason,
        diff_artifact=diff_name,
        diff_redacted=diff_redacted,
        container=container,
        container_missing=container_missing,
        launch_command=inp.launch_command,
        run_info=run_info,
        extra_warnings=[failure] if failure else [],
    )

    state = EvidenceState.FAILED if failure else EvidenceState.EXECUTED
    document = dict(assembled.document)
    document["environment_id"] = ev.id
    document["state"] = state.value
    document["failure"] = redactor.text(failure) if failure else None
    ev.write_json("environment.json", document)

    out = CollectEnvOutput(
        evidence_id=ev.id,
        environment_id=ev.id,
        state=state,
        interpreter=redactor.text(python),
        server_interpreter=gated_request is None,
        failure=redactor.text(failure) if failure else None,
        summary=assembled.summary,
        fingerprint=assembled.fingerprint,
        visibility=assembled.visibility,
        switches=assembled.switches,
        system_tools=assembled.system_tools,
        provenance=assembled.provenance,
        unavailable=assembled.unavailable,
        warnings=assembled.warnings,
        probe_exit_code=result.exit_code,
        probe_timed_out=result.timed_out,
        probe_duration_s=round(result.duration_s, 3),
        artifacts=sorted(ev.artifact_names),
    )
    # The record stores the call's inputs too: the same redaction applies to them.
    rt.inputs = redactor.tree({**rt.inputs, "env": redactor.env(inp.env)})
    return await rt.commit(
        ev, out, command=redactor.argv(result.argv), exit_code=result.exit_code, environment_id=ev.id
    )


SPEC = ToolSpec(
    name="collect_env",
    title="Collect the training environment",
    description=(
        "Record the training environment as evidence: packages, accelerator and driver, devices, switches and "
        "git state, as the training interpreter sees them. Call it first; cite its environment_id."
    ),
    details=(
        "Record the training environment as evidence, as the training interpreter sees it from inside its own "
        "process: Python, OS, CPU, memory; package versions (torch, torch_musa, triton, flash-attn, "
        "transformer-engine, megatron-core, deepspeed, ...); the accelerator backend (cuda, musa, rocm, xpu, cpu), "
        "runtime/driver, devices, visibility variables vs the devices actually seen, cuDNN/muDNN, NCCL/MCCL, "
        "bf16/tf32 and SDPA backends; system tools (nvidia-smi/NVML, mthreads-gmi, rocm-smi, nsys, ncu, msys, "
        "mcu); performance switches (NCCL_*, TORCH_*, ...; secrets redacted); git commit, dirty flag and diff; "
        "container image. Call it first in every experiment and cite its environment_id; its fingerprint tells "
        "whether two runs are comparable. Pass `python` when training uses another interpreter than the "
        "server's (that run needs approval)."
    ),
    input_model=CollectEnvInput,
    output_model=CollectEnvOutput,
    run=run,
    read_only=True,
    destructive=False,
    idempotent=False,
    open_world=False,
    runs_commands=True,
    command=command,
)
