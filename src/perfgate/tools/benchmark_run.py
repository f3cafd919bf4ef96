"""benchmark_run: follow a detached run_benchmark_window run (status, wait, result, cancel) by its run id.

Everything is read from the run's directory on disk, so these calls work from a new client connection
and after the server restarted. ``result`` summarises the launches exactly as the blocking call does
(the same code) and commits the record under ``run_benchmark_window``; later ``result`` calls return
that record again, and calls racing on one run (under its ``result.lock``) record it once.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Annotated, Any, Literal, cast

import anyio
import anyio.to_thread
from pydantic import BaseModel, ConfigDict, Field

from perfgate.benchmarking.windows.window_run import Launched
from perfgate.benchmarking.workload.provenance import RunProvenance
from perfgate.errors import ToolError
from perfgate.evidence import EvidenceState
from perfgate.execution import detached
from perfgate.execution.ticks import LaunchTicks
from perfgate.serving.runtime import ToolRuntime
from perfgate.serving.spec import ToolSpec
from perfgate.tools.run_benchmark_window_models import RunBenchmarkWindowInput, RunBenchmarkWindowOutput

__all__ = ["SPEC", "BenchmarkRunInput", "BenchmarkRunOutput", "run"]

Action = Literal["status", "wait", "result", "cancel"]
RunState = Literal["starting", "running", "finished", "cancelled", "lost"]
_PROGRESS = re.compile(r"\[perfgate\] progress step=(\d+) total=(\d+)")
_TAIL_BYTES = 64 * 1024


class BenchmarkRunInput(BaseModel):
    model_config = ConfigDict(extra="forbid")

    action: Annotated[
        Action,
        Field(
            description="'status': progress now; 'wait': block up to wait_s with progress notifications, then "
            "status; 'result': record the evidence of a finished run (as the blocking call would); 'cancel': "
            "stop the run."
        ),
    ]
    run_id: Annotated[str, Field(description="The run_id run_benchmark_window(detach=true) returned.")]
    wait_s: Annotated[
        float, Field(gt=0, le=600, description="action='wait': the longest time to wait, seconds.")
    ] = 60.0


class LatestWindow(BaseModel):
    launch: int
    median_step_ms: float
    steps: int
    steps_per_s: float


class BenchmarkRunOutput(BaseModel):
    run_id: str
    action: Action
    run_state: RunState = Field(
        description="lost: the supervisor died without a result (e.g. the machine rebooted)."
    )
    launch: int = Field(description="Launch in progress (or the last one), from 0.")
    launches: int
    exit_codes: list[int | None] = Field(description="Exit status of each finished launch.")
    steps_done: int | None = Field(
        description="Optimizer steps of the current launch so far (harness progress)."
    )
    steps_total: int | None
    latest_window: LatestWindow | None = Field(
        description="The last finished launch's window, when there is one."
    )
    health_verdict: str | None = Field(description="Training health over the finished launches so far.")
    evidence_id: str | None = Field(description="action='result': the run_benchmark_window record.")
    state: EvidenceState | None = Field(description="action='result': the record's state.")
    result: RunBenchmarkWindowOutput | None = Field(description="action='result': the full window result.")
    slurm_jobs: list[str] = Field(
        default_factory=list[str],
        description="launcher='slurm': the Slurm job id of each launch so far (squeue -j / scontrol show job).",
    )
    message: str


def _directory(rt: ToolRuntime, run_id: str) -> Path:
    try:
        return detached.run_dir(rt.private_dir, run_id)
    except detached.RunNotFoundError as exc:
        raise ToolError(f"{exc}; start one with run_benchmark_window(..., detach=true)") from exc


def _private(directory: Path, launch: int) -> tuple[Path, Path]:
    """A launch's records and stdout log as the supervisor kept them, in the trust root: what the
    figures are read from (the copies in the record's artifacts are for people)."""
    return directory / f"launch{launch}_records", directory / f"launch{launch}_stdout.log"


def _manifest(directory: Path) -> dict[str, Any]:
    return json.loads((directory / "manifest.json").read_text(encoding="utf-8"))


def _progress(directory: Path, launch: int) -> tuple[int | None, int | None]:
    path = directory / f"launch{launch}_stderr.log"
    if not path.is_file():
        return None, None
    with path.open("rb") as fh:
        size = fh.seek(0, 2)
        fh.seek(max(0, size - _TAIL_BYTES))
        tail = fh.read().decode("utf-8", errors="replace")
    found = _PROGRESS.findall(tail)
    return (int(found[-1][0]), int(found[-1][1])) if found else (None, None)


def _so_far(
    directory: Path, finished: int, inp: RunBenchmarkWindowInput
) -> tuple[LatestWindow | None, str | None]:
    from perfgate.benchmarking import load_records, summarize_window
    from perfgate.benchmarking.errors import BenchmarkError

    latest: LatestWindow | None = None
    records_all: list[Any] = []
    for k in range(finished):
        folder = directory / f"launch{k}_records"
        if not folder.is_dir():
            continue
        try:
            found = load_records(folder)
            if found.problems or not found.records or not found.records[0].windows:
                continue
            w = summarize_window(
                found.records, len(found.records[0].windows) - 1, inp.samples_per_step, inp.tokens_per_step
            )
        except BenchmarkError:
            continue
        records_all.extend(found.records)
        latest = LatestWindow(
            launch=k, median_step_ms=w.stats.median_ms, steps=w.steps, steps_per_s=w.steps_per_s
        )
    from perfgate.benchmarking.windows.importing import health_from_windows

    by_rank: dict[int, list[Any]] = {}
    for r in records_all:
        by_rank.setdefault(r.rank, []).extend(r.windows)
    h = health_from_windows(list(by_rank.items())) if by_rank else None
    return latest, h.verdict if h is not None else None


def _status(rt: ToolRuntime, inp: BenchmarkRunInput, directory: Path, message: str) -> BenchmarkRunOutput:
    manifest = _manifest(directory)
    window_inp = RunBenchmarkWindowInput.model_validate(manifest["meta"]["inputs"])
    st = detached.read_status(directory)
    launch = int(st.get("launch", 0))
    exit_codes: list[int | None] = list(st.get("exit_codes", []))
    done, total = _progress(directory, launch)
    latest, health = _so_far(directory, len(exit_codes), window_inp)
    jobs: list[str] = []
    if window_inp.launcher == "slurm":
        from perfgate.execution.slurm import job_ids_in

        for k in range(launch + 1):
            log = directory / f"launch{k}_stderr.log"
            if log.is_file():
                with log.open("rb") as fh:  # the launcher names the job in its first lines
                    jobs.extend(job_ids_in(fh.read(_TAIL_BYTES).decode("utf-8", errors="replace")))
    return BenchmarkRunOutput(
        slurm_jobs=jobs,
        run_id=inp.run_id,
        action=inp.action,
        run_state=st["state"],
        launch=launch,
        launches=int(st.get("launches", manifest["launches"])),
        exit_codes=exit_codes,
        steps_done=done,
        steps_total=total,
        latest_window=latest,
        health_verdict=health,
        evidence_id=None,
        state=None,
        result=None,
        message=message or st.get("error", ""),
    )


async def _result(rt: ToolRuntime, inp: BenchmarkRunInput, directory: Path) -> BenchmarkRunOutput:
    from perfgate.helpers.filelock import held_async

    status = await anyio.to_thread.run_sync(_status, rt, inp, directory, "")
    # Held while one call reads, or records, the run's result: calls racing on one run (two clients, two
    # servers) record it once, and the others return that record.
    async with held_async(directory / "result.lock", confined=True):
        return await _result_once(rt, inp, directory, status)


def _recorded_id(directory: Path, run_id: str) -> str | None:
    """The evidence id the run's result was recorded under, or None when it was not recorded yet.

    Raises:
        ToolError: ``result.json`` is there but holds no evidence id (never silently recorded twice).
    """
    done_file = directory / "result.json"
    try:
        text = done_file.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        text = ""
    try:
        value: Any = json.loads(text)
    except ValueError:
        value = None
    evidence_id: Any = cast("dict[str, Any]", value).get("evidence_id") if isinstance(value, dict) else None
    if not isinstance(evidence_id, str) or not evidence_id:
        raise ToolError(
            f"run {run_id}: {done_file} is unreadable or holds no evidence id, so whether its result was "
            "recorded is unknown; find its run_benchmark_window record with `perfgate ledger show --tool "
            "run_benchmark_window`, or move the file aside to record the result again"
        )
    return evidence_id


async def _result_once(
    rt: ToolRuntime, inp: BenchmarkRunInput, directory: Path, status: BenchmarkRunOutput
) -> BenchmarkRunOutput:
    """`_result` under the run's recording lock."""
    from perfgate.security.trustroot import write_private
    from perfgate.tools import run_benchmark_window as rbw

    evidence_id = _recorded_id(directory, inp.run_id)
    if evidence_id is not None:
        record = await rt.load(evidence_id)
        out = RunBenchmarkWindowOutput.model_validate(record.result)
        return status.model_copy(
            update={
                "evidence_id": evidence_id,
                "state": out.state,
                "result": out,
                "message": "recorded earlier",
            }
        )
    if status.run_state in ("starting", "running"):
        raise ToolError(
            f"run {inp.run_id} is still {status.run_state} (launch {status.launch + 1} of {status.launches}, "
            f"step {status.steps_done}/{status.steps_total}): call benchmark_run(action='wait') first"
        )
    manifest = _manifest(directory)
    window_inp = RunBenchmarkWindowInput.model_validate(manifest["meta"]["inputs"])
    st = detached.read_status(directory)
    # The record is committed as run_benchmark_window's, with that call's inputs: the same form as a
    # blocking call's record.
    wrt = ToolRuntime(
        config=rt.config,
        ledger=rt.ledger,
        tool=rbw.SPEC.name,
        inputs=window_inp.model_dump(mode="json"),
        report=rt.report,
    )
    request = rbw.command(window_inp, wrt)
    if list(request.argv) != manifest["argv"] or request.env != manifest["env"]:
        raise ToolError(f"run {inp.run_id}: its manifest no longer matches its inputs (edited?); re-run it")
    ev = wrt.evidence()
    exit_codes: list[int | None] = list(st.get("exit_codes", []))
    launch_ids = [i if isinstance(i, int) else None for i in st.get("launch_ids", [])]
    timed_out: list[int] = list(st.get("timed_out", []))
    observed = _observed(directory, len(exit_codes))

    from perfgate.security.scrubber import Scrubber, scrub_file

    scrub = Scrubber.for_values(request.env, request.argv)

    async def launch_once(launch: int, label: str) -> Launched:
        for stream in ("stdout", "stderr"):
            src = directory / f"launch{launch}_{stream}.log"
            if src.is_file():  # kept as artifacts without the secrets the command was given or printed
                with src.open("rb") as source:
                    target = ev.copy_in(f"{label}{stream}.log", source)
                await anyio.to_thread.run_sync(scrub_file, target, scrub)
        if launch >= len(exit_codes):
            why = "the run was cancelled" if st["state"] == "cancelled" else f"the run is {st['state']}"
            return Launched(None, f"{why} before this launch finished", *_private(directory, launch))
        code = exit_codes[launch]
        failure: str | None = None
        if launch in timed_out:
            failure = f"timed out after {window_inp.timeout_s:g} s"
        elif code != 0:
            failure = f"exited with status {code}"
        if failure is not None and st["state"] == "cancelled":
            failure = "cancelled (" + failure + ")"
        given = launch_ids[launch] if launch < len(launch_ids) else None
        return Launched(code, failure, *_private(directory, launch), launch_id=given)

    raw = manifest["meta"].get("provenance")
    provenance = RunProvenance.model_validate(raw) if isinstance(raw, dict) else None
    # the code state was captured at launch; its diff artifact stays with the start record
    out = await rbw.record_windows(
        window_inp, wrt, request, ev, launch_once, provenance, run_id=inp.run_id, observed=observed
    )
    # Whole or not at all: a reader never sees a part of it (the lock orders the writers).
    write_private(directory / "result.json", json.dumps({"evidence_id": out.evidence_id}).encode())
    return status.model_copy(
        update={"evidence_id": out.evidence_id, "state": out.state, "result": out, "message": "recorded"}
    )


async def run(inp: BenchmarkRunInput, rt: ToolRuntime) -> BenchmarkRunOutput:
    directory = _directory(rt, inp.run_id)
    if inp.action == "status":
        return await anyio.to_thread.run_sync(_status, rt, inp, directory, "")
    if inp.action == "cancel":
        sent = await anyio.to_thread.run_sync(detached.cancel, directory)
        with anyio.move_on_after(15):
            while detached.read_status(directory)["state"] in ("starting", "running"):
                await anyio.sleep(0.2)
        msg = (
            "cancel sent; the launch's process group was stopped" if sent else "the run was no longer running"
        )
        return await anyio.to_thread.run_sync(_status, rt, inp, directory, msg)
    if inp.action == "wait":
        with anyio.move_on_after(inp.wait_s):
            while True:
                out = await anyio.to_thread.run_sync(_status, rt, inp, directory, "")
                if out.run_state not in ("starting", "running"):
                    return out
                await rt.progress(
                    float(out.steps_done or 0),
                    float(out.steps_total) if out.steps_total else None,
                    f"launch {out.launch + 1}/{out.launches}, step {out.steps_done or 0}",
                )
                await anyio.sleep(1.0)
        return await anyio.to_thread.run_sync(
            _status, rt, inp, directory, f"still running after {inp.wait_s:g} s"
        )
    return await _result(rt, inp, directory)


def _brief(out: BenchmarkRunOutput) -> list[str]:
    lines = [
        f"run {out.run_id}: {out.run_state}, launch {out.launch + 1}/{out.launches}"
        + (f", step {out.steps_done}/{out.steps_total}" if out.steps_done is not None else "")
        + (f", slurm job {out.slurm_jobs[-1]}" if out.slurm_jobs else "")
    ]
    if out.result is not None:
        r = out.result
        lines.append(f"recorded {r.evidence_id} ({r.state.value}): median step {r.median_step_ms} ms")
    elif out.run_state == "finished":
        lines.append(f"next: benchmark_run(action='result', run_id='{out.run_id}')")
    if out.message:
        lines.append(out.message)
    return lines


SPEC = ToolSpec(
    name="benchmark_run",
    title="Follow a detached benchmark run",
    description=(
        "Follow a run_benchmark_window(detach=true) run by run_id: status, wait, result (records its window "
        "evidence) or cancel. Works after a reconnect or a server restart."
    ),
    details=(
        "Status, wait (progress notifications while it runs), result or cancel of a run started with "
        "run_benchmark_window(detach=true), by run_id. Works after the client reconnects and after the server "
        "restarts. 'result' records the same run_benchmark_window evidence the blocking call would; 'cancel' stops "
        "the run's process group (a Slurm launch: scancel of its job)."
    ),
    input_model=BenchmarkRunInput,
    output_model=BenchmarkRunOutput,
    run=run,
    read_only=False,
    destructive=True,
    idempotent=False,
    open_world=False,
    writes=True,
    brief=_brief,
)


def _observed(directory: Path, launches: int) -> dict[int, LaunchTicks]:
    """The supervisor's stamps of each launch's step boundaries (absent for a Slurm or log-timed run)."""
    out: dict[int, LaunchTicks] = {}
    for k in range(launches):
        path = directory / f"launch{k}_ticks.json"
        try:
            ticks = LaunchTicks.from_json(json.loads(path.read_text(encoding="utf-8")))
        except (OSError, ValueError):
            continue  # never written (the launch did not run): unobserved
        if ticks is not None:
            out[k] = ticks
    return out
