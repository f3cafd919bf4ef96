"""Slurm as the launcher: one approved command that allocates, runs every rank under the harness, gathers.

A Slurm launch is the request's argv ``python -m perfgate.execution.slurm [resources] -- CMD`` (CMD is
the harness-wrapped training command). Its parts, run on the server's host (a login node):

1. ``salloc --no-shell`` with the resources (nodes, tasks per node, CPUs per task, GRES, partition,
   time limit in minutes); the job id is printed at once (``[perfgate] slurm job N``).
2. ``srun --jobid N`` starts the ranks (one task per rank, or one ``torchrun`` per node). Each rank's
   harness maps SLURM_PROCID/SLURM_NTASKS/SLURM_LOCALID to RANK/WORLD_SIZE/LOCAL_RANK; this module sets
   MASTER_ADDR (the address of the allocation's first node), MASTER_PORT (from the job id) and torchrun's rendezvous
   variables (``PET_RDZV_*``, ``PET_NNODES``) where the environment does not already set them.
3. Records come back through Slurm's own stdout forwarding: with ``PERFGATE_RECORD_STREAM=1`` each rank
   prints its record as marked lines at its last window edge, srun forwards every task's stdout to
   this process, and this process writes ``rank<N>.json`` into the request's record folder
   (``PERFGATE_RECORD_DIR``), which is on the server's host. No filesystem shared with the nodes is
   assumed for records (the code and its Python environment must be on the nodes, as for any job).
4. The allocation is released (``scancel``) when srun ends; on SIGTERM/SIGHUP/SIGINT (a timeout, a
   cancelled call, ``benchmark_run(action='cancel')``) the job is cancelled with ``scancel`` and this
   process waits until Slurm no longer lists it.

Every resource is in argv, so the approval digest covers the whole submission: any change to nodes,
tasks, CPUs, GRES, partition or time limit is a new request a human must approve (the operator's
allowlist never approves a Slurm submission). Never imports mcp or torch.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

__all__ = [
    "SLURM_MODULE",
    "SUBMIT_PROGRAMS",
    "SlurmResources",
    "job_ids_in",
    "main",
    "missing_programs",
    "steering_env",
    "submission_argv",
    "time_limit_minutes",
]

SLURM_MODULE = "perfgate.execution.slurm"
JOB_LINE = "[perfgate] slurm job {job} allocated"
_JOB_LINE = re.compile(r"\[perfgate\] slurm job (\d+) allocated")
_SALLOC_JOB = re.compile(r"(?:Granted|Pending) job allocation (\d+)")
NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.:,=+-]{0,127}$")
"""Partition, GRES and job names: Slurm's own characters, nothing a shell or option parser would read."""
_WAIT_GONE_S = 4.0
SUBMIT_PROGRAMS = ("salloc", "srun", "scancel", "squeue")
"""What the server's host needs on its PATH to submit, follow and cancel a Slurm launch."""
_STEERING_PREFIXES = ("SLURM_", "SALLOC_", "SBATCH_", "PET_")


@dataclass(frozen=True)
class SlurmResources:
    """What a Slurm launch asks for; all of it goes into the approved argv."""

    nodes: int = 1
    ntasks_per_node: int = 1
    cpus_per_task: int | None = None
    gres: str | None = None
    partition: str | None = None
    time_minutes: int = 10

    def options(self) -> list[str]:
        """salloc/srun options, in a fixed order (the argv, hence the approval digest, is stable)."""
        out = [f"--nodes={self.nodes}", f"--ntasks-per-node={self.ntasks_per_node}"]
        if self.cpus_per_task is not None:
            out.append(f"--cpus-per-task={self.cpus_per_task}")
        if self.gres:
            out.append(f"--gres={self.gres}")
        if self.partition:
            out.append(f"--partition={self.partition}")
        out.append(f"--time={self.time_minutes}")
        return out


def time_limit_minutes(timeout_s: float) -> int:
    """Slurm's time limit for a launch whose wall-clock limit is ``timeout_s`` (whole minutes, >= 1)."""
    return max(1, math.ceil(timeout_s / 60.0))


def submission_argv(resources: SlurmResources, command: Sequence[str]) -> list[str]:
    """The request argv of a Slurm launch of ``command`` (already harness-wrapped)."""
    # -P (Python 3.11+; -I before): ``-m`` would put the run's working directory first on the import
    # path, and a ``perfgate/`` folder there would run in place of this launcher.
    isolated = "-P" if sys.version_info >= (3, 11) else "-I"
    return [sys.executable, isolated, "-m", SLURM_MODULE, *resources.options(), "--", *command]


def steering_env(env: Mapping[str, str]) -> list[str]:
    """Variables of ``env`` that Slurm or torchrun would read as job options, which the approved argv
    would not show (resources go into `SlurmResources`, the time limit comes from the launch's timeout)."""
    return sorted(k for k in env if k.startswith(_STEERING_PREFIXES))


def missing_programs(path: str) -> list[str]:
    """The `SUBMIT_PROGRAMS` not found on ``path`` (a ``PATH`` value)."""
    return [p for p in SUBMIT_PROGRAMS if shutil.which(p, path=path) is None]


def job_ids_in(text: str) -> list[str]:
    """Slurm job ids this module announced in a launch's stderr."""
    return list(dict.fromkeys(_JOB_LINE.findall(text)))


# --------------------------------------------------------------------------- the launcher process


class _Cancelled(Exception):
    pass


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=f"python -m {SLURM_MODULE}", description="Run a command's ranks through Slurm."
    )
    p.add_argument("--nodes", type=int, required=True)
    p.add_argument("--ntasks-per-node", type=int, required=True)
    p.add_argument("--cpus-per-task", type=int)
    p.add_argument("--gres")
    p.add_argument("--partition")
    p.add_argument("--time", type=int, required=True, help="minutes")
    p.add_argument("command", nargs=argparse.REMAINDER)
    return p


def _say(text: str) -> None:
    print(f"[perfgate] {text}", file=sys.stderr, flush=True)


def _allocate(res: SlurmResources, job: list[str]) -> None:
    """salloc --no-shell; fills ``job`` with the id as soon as Slurm names it (pending or granted)."""
    proc = subprocess.Popen(
        ["salloc", "--no-shell", "--job-name=perfgate", *res.options()],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert proc.stdout is not None
    lines: list[str] = []
    for line in proc.stdout:
        lines.append(line.rstrip())
        found = _SALLOC_JOB.search(line)
        if found and not job:
            job.append(found.group(1))
            _say(JOB_LINE.format(job=job[0])[len("[perfgate] ") :])
    code = proc.wait()
    if code != 0 or not job or not any("Granted job allocation" in ln for ln in lines):
        raise RuntimeError("salloc failed: " + (" | ".join(lines[-3:]) or f"exit status {code}"))


def _first_node(job: str) -> str | None:
    out = subprocess.run(["squeue", "-h", "-j", job, "-o", "%N"], capture_output=True, text=True, check=False)
    nodelist = out.stdout.strip()
    if not nodelist:
        return None
    names = subprocess.run(
        ["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True, check=False
    ).stdout.split()
    if not names:
        return None
    # the address Slurm itself reaches the node at (NodeAddr), which resolves where the name may not
    shown = subprocess.run(
        ["scontrol", "show", "node", "-o", names[0]], capture_output=True, text=True, check=False
    ).stdout
    found = re.search(r"\bNodeAddr=(\S+)", shown)
    return found.group(1) if found else names[0]


def _rank_env(res: SlurmResources, job: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PERFGATE_RECORD_STREAM"] = "1"
    addr = env.get("MASTER_ADDR") or _first_node(job) or "127.0.0.1"
    port = env.get("MASTER_PORT") or str(20000 + int(job) % 20000)
    defaults = {
        "MASTER_ADDR": addr,
        "MASTER_PORT": port,
        # torchrun under srun (one per node): its rendezvous, read from the environment
        "PET_NNODES": str(res.nodes),
        "PET_RDZV_BACKEND": "c10d",
        "PET_RDZV_ENDPOINT": f"{addr}:{port}",
        "PET_RDZV_ID": f"perfgate-{job}",
    }
    for key, value in defaults.items():
        env.setdefault(key, value)
    return env


def _pump(stream: IO[bytes], reader: object) -> None:
    from perfgate.harness.record import RecordStreamReader

    assert isinstance(reader, RecordStreamReader)
    out = sys.stdout.buffer
    for raw in stream:
        if raw.startswith(b"[perfgate-record] ") and reader.feed(raw.decode("ascii", errors="replace")):
            continue
        out.write(raw)
        out.flush()


def _relay_stderr(stream: IO[bytes], errors: list[str]) -> None:
    """Pass srun's stderr (the ranks' and its own) through, keeping its first error lines."""
    out = sys.stderr.buffer
    for raw in stream:
        out.write(raw)
        out.flush()
        if len(errors) < 5 and raw.startswith(b"srun: error:"):
            errors.append(raw.decode("utf-8", errors="replace").strip())


def _write_records(reader: object, record_dir: str | None) -> None:
    from perfgate.harness.record import RecordStreamReader

    assert isinstance(reader, RecordStreamReader)
    if reader.incomplete:
        _say(f"records of rank(s) {reader.incomplete} arrived only in part")
    if reader.bad_lines:
        _say(f"{reader.bad_lines} record line(s) could not be read")
    if not record_dir:
        return
    folder = Path(record_dir)
    folder.mkdir(parents=True, exist_ok=True)
    for rank, data in sorted(reader.records.items()):
        tmp = folder / f".rank{rank}.json.tmp"
        tmp.write_bytes(data)
        os.replace(tmp, folder / f"rank{rank}.json")
    _say(f"gathered {len(reader.records)} rank record(s) through srun's output")


def _release(job: str) -> None:
    subprocess.run(["scancel", job], capture_output=True, check=False)
    deadline = time.monotonic() + _WAIT_GONE_S
    while time.monotonic() < deadline:
        out = subprocess.run(
            ["squeue", "-h", "-j", job, "-o", "%T"], capture_output=True, text=True, check=False
        )
        if not out.stdout.strip() or out.returncode != 0:
            return
        time.sleep(0.2)
    _say(f"slurm job {job} is still listed {_WAIT_GONE_S:g} s after scancel")


def run(res: SlurmResources, command: list[str]) -> int:
    """Allocate, run ``command`` as the job's ranks, gather records, release; the exit status of srun."""
    from perfgate.harness.record import RecordStreamReader

    job: list[str] = []
    cancelled = threading.Event()

    def on_signal(signum: int, frame: object) -> None:
        cancelled.set()
        raise _Cancelled

    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(sig, on_signal)
    reader = RecordStreamReader()
    srun: subprocess.Popen[bytes] | None = None
    try:
        _allocate(res, job)
        srun = subprocess.Popen(
            ["srun", f"--jobid={job[0]}", *res.options(), "--kill-on-bad-exit=1", "--", *command],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=_rank_env(res, job[0]),
        )
        assert srun.stdout is not None and srun.stderr is not None
        errors: list[str] = []
        relay = threading.Thread(target=_relay_stderr, args=(srun.stderr, errors), daemon=True)
        relay.start()
        _pump(srun.stdout, reader)
        code = srun.wait()
        relay.join(timeout=5)
        _write_records(reader, os.environ.get("PERFGATE_RECORD_DIR"))
        if code != 0:
            # the last stderr line is what a failed launch reports: make it the cause, not the fallout
            _say(f"srun exited with status {code}" + (f"; first error: {errors[0]}" if errors else ""))
        return code
    except _Cancelled:
        _say("cancelled: scancel " + (job[0] if job else "(no job yet)"))
        return 143
    except RuntimeError as exc:
        _say(str(exc))
        return 2
    finally:
        for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
            signal.signal(sig, signal.SIG_IGN)  # let the release finish
        if job:
            _release(job[0])
        if srun is not None and srun.poll() is None:
            srun.kill()
            srun.wait()


def main(argv: Sequence[str] | None = None) -> int:
    ns = _parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    command = list(ns.command)
    if command[:1] == ["--"]:
        command = command[1:]
    if not command:
        print("give the command after --", file=sys.stderr)
        return 2
    for what, value in (("partition", ns.partition), ("gres", ns.gres)):
        if value is not None and not NAME.match(value):
            print(f"--{what} {value!r}: only letters, digits and _.:,=+- (not first)", file=sys.stderr)
            return 2
    missing = [p for p in ("salloc", "srun", "scancel", "squeue", "scontrol") if shutil.which(p) is None]
    if missing:
        print(f"Slurm commands not found on PATH: {', '.join(missing)}", file=sys.stderr)
        return 2
    res = SlurmResources(
        nodes=ns.nodes,
        ntasks_per_node=ns.ntasks_per_node,
        cpus_per_task=ns.cpus_per_task,
        gres=ns.gres,
        partition=ns.partition,
        time_minutes=ns.time,
    )
    return run(res, command)


if __name__ == "__main__":
    raise SystemExit(main())
