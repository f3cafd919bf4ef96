"""A test-only tool that runs a given argv through the approval gate and the executor."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, Field

from perfgate.evidence import EvidenceState
from perfgate.execution.request import CommandRequest
from perfgate.serving.runtime import ToolRuntime
from perfgate.serving.spec import ToolSpec


class RunInput(BaseModel):
    argv: list[str] = Field(min_length=1, description="Program and arguments.")
    cwd: str = Field(default=".", description="Working directory, relative to the workspace.")
    env: dict[str, str] = Field(default_factory=dict[str, str], description="Variables to set.")
    timeout_s: float = Field(default=60.0, gt=0, description="Timeout in seconds.")
    reason: str = Field(default="test run", description="Why.")


class RunOutput(BaseModel):
    evidence_id: str
    state: EvidenceState
    exit_code: int | None
    signal: str | None
    timed_out: bool
    stdout_tail: str
    approved_how: str | None
    approval_evidence_id: str | None


def command(inp: RunInput, rt: ToolRuntime) -> CommandRequest:
    return CommandRequest(
        argv=tuple(inp.argv),
        cwd=(rt.workspace / inp.cwd).resolve(),
        env=inp.env,
        timeout_s=inp.timeout_s,
        reason=inp.reason,
    )


async def run(inp: RunInput, rt: ToolRuntime) -> RunOutput:
    request = command(inp, rt)
    builder = rt.evidence()
    result = await rt.run_command(request, builder)
    out = RunOutput(
        evidence_id=builder.id,
        state=EvidenceState.EXECUTED if result.succeeded else EvidenceState.FAILED,
        exit_code=result.exit_code,
        signal=result.signal,
        timed_out=result.timed_out,
        stdout_tail=result.stdout.tail,
        approved_how=result.approved_how,
        approval_evidence_id=result.approval_evidence_id,
    )
    return await rt.commit(builder, out, command=result.argv, exit_code=result.exit_code)


SPEC = ToolSpec(
    name="run_test_command",
    title="Run a test command",
    description="Test-only: runs argv through perfgate's approval gate and executor, for the gate's tests.",
    input_model=RunInput,
    output_model=RunOutput,
    run=run,
    read_only=False,
    destructive=True,
    idempotent=False,
    open_world=True,
    runs_commands=True,
    command=command,
)


def marker_argv(python: str, marker: Path, text: str = "ran") -> list[str]:
    """argv that creates ``marker`` (so a test can tell whether the command ran)."""
    return [
        python,
        "-c",
        "import pathlib, sys; pathlib.Path(sys.argv[1]).write_text(sys.argv[2])",
        str(marker),
        text,
    ]
