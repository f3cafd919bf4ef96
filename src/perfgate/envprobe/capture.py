"""One environment capture: the host's facts (system tools, git state), whether the probe's run counts as
an observation, and everything merged and redacted into the record's document and artifacts."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, cast

from perfgate.envprobe.collect import Assembled, assemble, learn_host
from perfgate.envprobe.models import SystemTool, Topology
from perfgate.envprobe.probe import ProbeOutput
from perfgate.envprobe.provenance import GitSnapshot, container_provenance, git_snapshot
from perfgate.envprobe.systools import collect_system_tools
from perfgate.envprobe.topology import collect_topology
from perfgate.security.envredactor import Redactor
from perfgate.security.quoting import file_text


class _Tail(Protocol):
    @property
    def tail(self) -> str: ...


class CommandResult(Protocol):
    """What this module reads of the probe run's result (`perfgate.execution.executor.CommandResult`
    has it; named structurally so environment probing does not depend on the executor)."""

    @property
    def argv(self) -> list[str]: ...
    @property
    def exit_code(self) -> int | None: ...
    @property
    def signal(self) -> str | None: ...
    @property
    def timed_out(self) -> bool: ...
    @property
    def duration_s(self) -> float: ...
    @property
    def stderr(self) -> _Tail: ...
    @property
    def approved_how(self) -> str | None: ...
    @property
    def approval_evidence_id(self) -> str | None: ...


__all__ = [
    "MAX_LOG_REWRITE_BYTES",
    "MAX_PROBE_OUTPUT_BYTES",
    "Capture",
    "HostFacts",
    "capture",
    "host_facts",
    "host_facts_failed",
    "probe_failure",
    "read_head",
    "rewrite_redacted",
]

MAX_PROBE_OUTPUT_BYTES = 8 * 1024 * 1024
"""Probe stdout parsed for facts; the rest is ignored."""
MAX_LOG_REWRITE_BYTES = 64 * 1024 * 1024
"""Probe log kept (redacted) in the record; a longer log is cut with a note."""


@dataclass
class HostFacts:
    """What the server learns about the host itself, beside the probe."""

    tools: list[SystemTool] = field(default_factory=list[SystemTool])
    transcripts: dict[str, str] = field(default_factory=dict[str, str])
    """Each system tool's raw output, by tool name."""
    tool_missing: list[tuple[str, str]] = field(default_factory=list[tuple[str, str]])
    git: GitSnapshot | None = None
    git_reason: str | None = None
    topology: Topology | None = None
    """NVLink (from nvidia-smi, with the system tools), RDMA ports and GPUDirect RDMA (sysfs, always)."""


def host_facts(
    workspace: Path, env: Mapping[str, str], system_tools: bool, root: Path = Path("/")
) -> HostFacts:
    """System tools (unless ``system_tools`` is false), the interconnect topology (sysfs under ``root``)
    and the workspace's git state."""
    facts = HostFacts()
    if system_tools:
        facts.tools, facts.transcripts, facts.tool_missing = collect_system_tools(
            env=dict(env), workspace=workspace
        )
    else:
        facts.tool_missing = [("system_tools", "not queried (system_tools=false)")]
    smi = next((t.path for t in facts.tools if t.name == "nvidia-smi" and t.found), None)
    facts.topology, transcript, missing = collect_topology(env=dict(env), nvidia_smi=smi, root=root)
    facts.tool_missing += missing
    if transcript:
        facts.transcripts["nvidia-smi-topology"] = transcript
    facts.git, facts.git_reason = git_snapshot(workspace)
    return facts


def host_facts_failed(exc: BaseException) -> HostFacts:
    """The facts when the host queries failed: none, each listed as unavailable with the reason."""
    return HostFacts(
        tool_missing=[("system_tools", f"host queries failed: {type(exc).__name__}: {exc}")],
        git_reason="not queried: the host queries failed",
    )


def read_head(path: Path, limit: int) -> str:
    with path.open("rb") as handle:
        return handle.read(limit).decode("utf-8", errors="replace")


def rewrite_redacted(path: Path, clean: Callable[[str], str]) -> None:
    """Replace a log with its redacted text (before the record hashes it); no file, nothing to do."""
    if not path.exists():
        return
    size = path.stat().st_size
    text = read_head(path, MAX_LOG_REWRITE_BYTES)
    if size > MAX_LOG_REWRITE_BYTES:
        text += f"\n[perfgate: log cut at {MAX_LOG_REWRITE_BYTES} bytes of {size} before redaction]\n"
    path.write_text(clean(text), encoding="utf-8")


def probe_failure(
    result: CommandResult, probe: ProbeOutput, redactor: Redactor, timeout_s: float
) -> str | None:
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


@dataclass(frozen=True)
class Capture:
    assembled: Assembled
    failure: str | None
    """Why the probe does not count (not yet redacted); None when it ran to its end."""
    artifacts: list[tuple[str, str]]
    """(name, redacted text) to write beside the record: the git diff, each system tool's transcript."""


def capture(
    probe: ProbeOutput,
    result: CommandResult,
    facts: HostFacts,
    redactor: Redactor,
    *,
    timeout_s: float,
    launch_command: Sequence[str] | None,
) -> Capture:
    """Merge the probe's output, its run and the host's facts into one redacted capture; ``redactor``
    learns the probe's host name and home first."""
    learn_host(redactor, probe)
    raw_container: Any = probe.sections.get("container")
    container, container_missing = container_provenance(
        cast("dict[str, Any]", raw_container) if isinstance(raw_container, dict) else None
    )
    failure = probe_failure(result, probe, redactor, timeout_s)
    artifacts: list[tuple[str, str]] = []
    diff_name: str | None = None
    diff_redacted = False
    if facts.git is not None and facts.git.diff:
        diff_name = "git.diff"
        safe_diff = redactor.text(facts.git.diff.decode("utf-8", errors="replace"))
        artifacts.append((diff_name, safe_diff))
        diff_redacted = safe_diff.encode("utf-8") != facts.git.diff
    for name, transcript in sorted(facts.transcripts.items()):
        artifacts.append((f"systool_{name}.txt", redactor.text(transcript)))
    tools = [
        t.model_copy(update={"artifact": f"systool_{t.name}.txt"}) if t.name in facts.transcripts else t
        for t in facts.tools
    ]
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
        launch_command=launch_command,
        run_info=run_info,
        extra_warnings=[failure] if failure else [],
        topology=facts.topology,
    )
    return Capture(assembled, failure, artifacts)
