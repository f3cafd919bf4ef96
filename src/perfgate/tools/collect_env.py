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
from collections.abc import Generator
from pathlib import Path
from typing import Annotated

import anyio
import anyio.to_thread
from pydantic import BaseModel, ConfigDict, Field

from perfgate.envprobe import (
    EnvironmentSummary,
    Fingerprint,
    Provenance,
    SystemTool,
    Topology,
    Unavailable,
    Visibility,
)
from perfgate.errors import ToolError
from perfgate.evidence import EvidenceState
from perfgate.execution.executor import CommandError, CommandProgress, CommandResult, ExecLimits, execute
from perfgate.execution.request import CommandRequest
from perfgate.security.envredactor import Redactor
from perfgate.serving.runtime import EvidenceBuilder, ToolRuntime
from perfgate.serving.spec import ToolSpec

__all__ = ["SPEC", "CollectEnvInput", "CollectEnvOutput", "command", "run"]


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
    topology: Topology = Field(
        description="NVLink, RDMA ports, GPUDirect RDMA and HybridEP, for MoE token exchange; notes say "
        "where they limit DeepEP/HybridEP."
    )
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


def _interpreter(inp: CollectEnvInput, rt: ToolRuntime) -> str:
    from perfgate.envprobe.probe import InterpreterError, resolve_interpreter

    if inp.python is None:
        return sys.executable
    try:
        return resolve_interpreter(inp.python, rt.workspace)
    except InterpreterError as exc:
        raise ToolError(str(exc)) from exc


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


async def run(inp: CollectEnvInput, rt: ToolRuntime) -> CollectEnvOutput:
    from perfgate.envprobe import parse_probe_output, sanitize_probe_log
    from perfgate.envprobe.capture import (
        MAX_PROBE_OUTPUT_BYTES,
        HostFacts,
        capture,
        host_facts,
        host_facts_failed,
        read_head,
        rewrite_redacted,
    )

    python = _interpreter(inp, rt)
    gated_request = command(inp, rt)
    request = gated_request if gated_request is not None else _request(python, inp, rt)
    env_seen = {**os.environ, **inp.env}
    redactor = Redactor(env_seen, homes=[str(Path.home())], hostnames=[socket.gethostname()])
    ev = rt.evidence()
    await rt.progress(0, None, f"probing {python}")

    facts_box: list[HostFacts] = []
    probe_box: list[CommandResult] = []
    errors: list[ToolError] = []

    async def host() -> None:
        try:
            facts = await anyio.to_thread.run_sync(host_facts, rt.workspace, env_seen, inp.system_tools)
        # Host queries are auxiliary: an unexpected failure in a vendor tool binding (NVML) or the file
        # system must cost only those facts, listed as unavailable, never the probe's record.
        except Exception as exc:  # noqa: BLE001 - the boundary of the auxiliary host queries
            facts = host_facts_failed(exc)
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
        probe = parse_probe_output(read_head(folder / "probe_stdout.log", MAX_PROBE_OUTPUT_BYTES))
    result = probe_box[0]
    captured = capture(
        probe, result, facts_box[0], redactor, timeout_s=inp.timeout_s, launch_command=inp.launch_command
    )
    failure, assembled = captured.failure, captured.assembled

    # Artifacts are written redacted; logs are rewritten before the record hashes them.
    for name, text in captured.artifacts:
        ev.write_text(name, text)
    rewrite_redacted(ev.path("probe_stdout.log"), lambda text: sanitize_probe_log(text, redactor))
    rewrite_redacted(ev.path("probe_stderr.log"), redactor.text)

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
        topology=assembled.topology,
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
        "mcu); the interconnect MoE token exchange needs (NVLink from nvidia-smi topo -m and nvlink --status, RDMA "
        "ports from /sys/class/infiniband, the GPUDirect RDMA module, HybridEP in the installed deep_ep's file "
        "list); performance switches (NCCL_*, TORCH_*, ...; secrets redacted); git commit, dirty flag and diff; "
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
