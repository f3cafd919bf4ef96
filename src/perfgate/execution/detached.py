"""Detached runs: an approved command run by a supervisor process that outlives the tool call and the server.

`start` writes the run's manifest (the approved request, the number of launches, where the harness
writes its records) into ``<state>/detached/<run_id>/``, with ``<state>`` the workspace's folder in the
trust root (the agent can neither edit the manifest nor replace the logs and records the result is read
from), and starts ``python -m perfgate.execution.detached <run_dir>`` in a new session, outside the server's process registry: a
client disconnect or a server restart does not stop it. The supervisor runs the launches one after
another, each in its own process group with the request's timeout, keeps each launch's logs and
records in the run directory, and keeps ``status.json`` current (atomically replaced). `cancel` sends
SIGTERM to the supervisor, which stops the launch's process group (TERM, then KILL) and records
``cancelled``; a Slurm launch's launcher (`perfgate.execution.slurm`) answers that TERM with ``scancel``. Everything a later call needs is on disk: any server on the same workspace can answer.

The supervisor never imports mcp or torch.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO, Any

from perfgate.execution.launches import launch_variables, next_launch_id
from perfgate.execution.linestamps import LOG_PATTERN_ENV, OutputStamps, stamps_path
from perfgate.execution.ticks import TickListener
from perfgate.helpers.statefs import fresh_dir, remove_tree, write_file

__all__ = ["DETACHED_DIR", "RunNotFoundError", "cancel", "main", "read_status", "run_dir", "start"]

DETACHED_DIR = "detached"
_KILL_GRACE_S = 5.0
_RESTORE = "PERFGATE_DETACHED_RESTORE_ENV"


def _launch_env(extra: dict[str, str]) -> dict[str, str]:
    """The server's environment (as the blocking path gives it) plus the request's changes."""
    base = dict(os.environ)
    for key, value in json.loads(base.pop(_RESTORE, "{}")).items():
        if value is None:
            base.pop(key, None)
        else:
            base[key] = value
    return {**base, **extra}


class RunNotFoundError(LookupError):
    """No detached run with that id in this workspace."""


def run_dir(state_dir: Path, run_id: str) -> Path:
    """The directory of ``run_id``; ids are ``run-`` + hex, nothing else is accepted.

    Raises:
        RunNotFoundError: a malformed id or no such run.
    """
    if (
        not run_id.startswith("run-")
        or not all(c in "0123456789abcdef" for c in run_id[4:])
        or len(run_id) != 20
    ):
        raise RunNotFoundError(f"{run_id!r} is not a run id (run-<16 hex digits>)")
    path = state_dir / DETACHED_DIR / run_id
    if not (path / "manifest.json").is_file():
        raise RunNotFoundError(f"no detached run {run_id} in this workspace")
    return path


def _copy_stamped(source: IO[bytes], out: IO[bytes], stamps: OutputStamps) -> None:
    """Copy the launch's stdout into its log, stamping each read as it arrives."""
    total = 0
    while chunk := os.read(source.fileno(), 1 << 16):
        total += len(chunk)
        stamps.feed(total, chunk)
        out.write(chunk)
        out.flush()


def _write_json(path: Path, value: Any) -> None:
    # The run directory is in the agent-writable .perfgate/: written following no link (see _statefs).
    write_file(path, json.dumps(value, indent=1, sort_keys=True).encode())


def start(
    state_dir: Path,
    *,
    argv: list[str],
    cwd: Path,
    env: dict[str, str],
    timeout_s: float,
    launches: int,
    record_dir: str | None,
    meta: dict[str, Any],
) -> tuple[str, Path]:
    """Write the manifest and start the supervisor; returns (run id, run directory).

    ``record_dir`` is the harness's record folder (emptied before each launch, copied after it);
    ``meta`` is stored as is for the caller (the tool input, the request digest, the approval).
    """
    run_id = "run-" + secrets.token_hex(8)
    directory = state_dir / DETACHED_DIR / run_id
    directory.mkdir(parents=True)
    manifest = {
        "run_id": run_id,
        "argv": argv,
        "cwd": str(cwd),
        "env": env,
        "timeout_s": timeout_s,
        "launches": launches,
        "record_dir": record_dir,
        "created_unix": time.time(),
        "meta": meta,
    }
    _write_json(directory / "manifest.json", manifest)
    _write_json(
        directory / "status.json", {"state": "starting", "launch": 0, "launches": launches, "exit_codes": []}
    )
    log = (directory / "supervisor.log").open("ab")
    # Started in its own folder (in the trust root), never in the server's working directory: ``-m`` puts
    # the working directory first on the import path, and this perfgate's folder comes right after it.
    package_parent = str(Path(__file__).resolve().parents[2])
    proc = subprocess.Popen(
        [sys.executable, "-m", "perfgate.execution.detached", str(directory)],
        cwd=directory,
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=log,
        start_new_session=True,
        close_fds=True,
        env={
            **os.environ,
            # the supervisor imports this perfgate
            "PYTHONPATH": os.pathsep.join([package_parent, *(p for p in sys.path if p)]),
            _RESTORE: json.dumps({"PYTHONPATH": os.environ.get("PYTHONPATH")}),  # launches get the server's
        },
    )
    log.close()
    (directory / "supervisor.pid").write_text(str(proc.pid))
    # Reap it when it ends while this server lives (after a restart, init does).
    threading.Thread(target=proc.wait, name=f"reap-{run_id}", daemon=True).start()
    return run_id, directory


def _alive(pid: int, directory: Path) -> bool:
    """Whether ``pid`` is still this run's supervisor (a reused pid is not)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        try:
            os.kill(pid, 0)
        except OSError:
            return False
        return True  # no /proc: trust the pid
    return str(directory).encode() in cmdline


def read_status(directory: Path) -> dict[str, Any]:
    """The run's status; a supervisor that died without finishing is reported as ``lost``."""
    status = json.loads((directory / "status.json").read_text(encoding="utf-8"))
    if status.get("state") in ("starting", "running"):
        pid_file = directory / "supervisor.pid"
        pid = int(pid_file.read_text()) if pid_file.is_file() else None
        if pid is not None and not _alive(pid, directory):
            # Re-read: it may have finished between the two reads.
            status = json.loads((directory / "status.json").read_text(encoding="utf-8"))
            if status.get("state") in ("starting", "running"):
                status["state"] = "lost"
                status["error"] = "the supervisor process ended without recording a result (killed?)"
    return status


def cancel(directory: Path) -> bool:
    """Ask the supervisor to stop the run; False when nothing was running.

    A supervisor that died (``lost``) leaves its launch's process group behind: that group is stopped
    directly, then the status says ``cancelled``.
    """
    pid_file = directory / "supervisor.pid"
    if not pid_file.is_file():
        return False
    pid = int(pid_file.read_text())
    if _alive(pid, directory):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
        return True
    status = read_status(directory)
    child = status.get("pid")
    if status.get("state") != "lost" or not isinstance(child, int):
        return False
    stopped = _scancel_jobs(directory)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(child, sig)
            stopped = True
        except ProcessLookupError:
            break
        if sig == signal.SIGTERM:
            time.sleep(min(_KILL_GRACE_S, 1.0))
    status["state"] = "cancelled"
    status["error"] = "the supervisor was gone; its launch's process group was stopped"
    _write_json(directory / "status.json", status)
    return stopped


def _scancel_jobs(directory: Path) -> bool:
    """``scancel`` the Slurm jobs a launch of this run announced (its launcher is gone with the
    supervisor, so nothing else would release them); True when there was one."""
    from perfgate.execution.slurm import job_ids_in
    from perfgate.helpers.cappedlines import capped_lines

    jobs: list[str] = []
    for log in sorted(directory.glob("launch*_stderr.log")):
        with contextlib.suppress(OSError), log.open(encoding="utf-8", errors="replace") as fh:
            for line in capped_lines(fh):
                jobs.extend(job_ids_in(line))
    jobs = list(dict.fromkeys(jobs))
    if jobs and shutil.which("scancel"):
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            subprocess.run(["scancel", *jobs], capture_output=True, timeout=30, check=False)
    return bool(jobs)


# --------------------------------------------------------------------------- the supervisor


class _Supervisor:
    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.manifest: dict[str, Any] = json.loads((directory / "manifest.json").read_text(encoding="utf-8"))
        self.proc: subprocess.Popen[bytes] | None = None
        self.cancelled = False
        self.status: dict[str, Any] = {
            "state": "running",
            "launch": 0,
            "launches": self.manifest["launches"],
            "exit_codes": [],
            "timed_out": [],
            "started_unix": time.time(),
        }

    def save(self) -> None:
        _write_json(self.dir / "status.json", self.status)

    def on_term(self, signum: int, frame: object) -> None:
        self.cancelled = True
        self._stop_group()

    def _stop_group(self) -> None:
        proc = self.proc
        if proc is None or proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + _KILL_GRACE_S
        while proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)

    def launch(self, k: int) -> int | None:
        m = self.manifest
        record_dir = m.get("record_dir")
        if record_dir:
            fresh_dir(Path(record_dir))
        label = f"launch{k}_"
        ticks_fifo = m["env"].get("PERFGATE_TICKS")  # the harness's step boundaries, stamped here
        stdout_log = self.dir / f"{label}stdout.log"
        # a log-timed launch's lines, stamped here as they arrive
        stamps = OutputStamps() if LOG_PATTERN_ENV in m["env"] else None
        launch_id = next_launch_id(self.dir.parents[1])
        self.status.setdefault("launch_ids", []).append(launch_id)
        with (
            stdout_log.open("wb") as out,
            (self.dir / f"{label}stderr.log").open("wb") as err,
            TickListener(Path(ticks_fifo)) if ticks_fifo else contextlib.nullcontext() as listener,
        ):
            self.proc = subprocess.Popen(
                m["argv"],
                cwd=m["cwd"],
                # the workspace's next launch id (its trust-root folder holds this run's folder)
                env={**_launch_env(m["env"]), **launch_variables(launch_id)},
                stdin=subprocess.DEVNULL,
                stdout=out if stamps is None else subprocess.PIPE,
                stderr=err,
                start_new_session=True,
            )
            copier = None
            if stamps is not None:
                assert self.proc.stdout is not None
                copier = threading.Thread(
                    target=_copy_stamped, args=(self.proc.stdout, out, stamps), daemon=True
                )
                copier.start()
            self.status["pid"] = self.proc.pid  # its process group: cancel reaches it even if we are gone
            self.save()
            deadline = time.monotonic() + float(m["timeout_s"])
            while self.proc.poll() is None:
                if time.monotonic() > deadline:
                    self.status["timed_out"].append(k)
                    self._stop_group()
                    break
                time.sleep(0.1)
            self._stop_group()  # anything the command left behind in its group
            if copier is not None:
                copier.join(timeout=_KILL_GRACE_S)
        if stamps is not None:
            stamps.save(stamps_path(stdout_log))
        if listener is not None:
            _write_json(self.dir / f"{label}ticks.json", listener.stop().to_json())
        code = self.proc.returncode
        if record_dir:
            target = self.dir / f"launch{k}_records"
            target.mkdir(exist_ok=True)
            for p in sorted(Path(record_dir).glob("rank*.json")):
                shutil.copyfile(p, target / p.name)
            remove_tree(Path(record_dir))
        return code

    def run(self) -> None:
        from perfgate.execution.rundir import hold_run_dir, run_dir_of

        signal.signal(signal.SIGTERM, self.on_term)
        self.save()
        record_dir = self.manifest.get("record_dir")
        # The record folder is named after the input: a run of the same input that holds it now (a
        # blocking call started since this run was) is waited for, never shared.
        with hold_run_dir(run_dir_of(record_dir), wait=True) if record_dir else contextlib.nullcontext():
            self._launches()
        self.status["state"] = "cancelled" if self.cancelled else "finished"
        self.status["ended_unix"] = time.time()
        self.save()

    def _launches(self) -> None:
        for k in range(int(self.manifest["launches"])):
            if self.cancelled:
                break
            self.status["launch"] = k
            self.save()
            code = self.launch(k)
            self.status["exit_codes"].append(code)
            self.save()
            if self.cancelled or code != 0 or k in self.status["timed_out"]:
                break


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m perfgate.execution.detached <run_dir>", file=sys.stderr)
        return 2
    _Supervisor(Path(args[0])).run()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
