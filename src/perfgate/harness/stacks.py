"""Let the server see where each rank is when a run stops making progress.

A hung distributed job shows nothing from outside: every rank waits inside a collective, and which one
waits where is only visible from inside. Once per process, when the run writes records, the harness:

- registers `faulthandler` for `STACK_SIGNAL` (a real-time signal nothing else uses, so no job's own
  SIGUSR1/SIGUSR2 handling changes) with this rank's stack file: the C-level handler writes every
  thread's Python stack even while the main thread is blocked in a C++ collective wait;
- where PyTorch's flight recorder is on (``TORCH_FR_BUFFER_SIZE`` or ``TORCH_NCCL_TRACE_BUFFER_SIZE`` > 0),
  starts a daemon thread blocked on a FIFO: a byte written to it dumps the recorder's JSON (the last
  collectives of every process group, with their sequence numbers and states) to this rank's file;
- announces both in ``<record_dir>/hang/rank<N>.json`` (rank, pid, signal number, what it installed).

Nothing runs until the server asks, and a process whose SIGRTMIN+4 already had a handler keeps it (the
announcement says no stack dump). The server signals only announced pids that belong to the run and
whose signal mask shows the handler (see :mod:`perfgate.execution.hang`).
"""

from __future__ import annotations

import contextlib
import faulthandler
import importlib
import json
import os
import signal
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import IO

__all__ = ["HANG_DIR", "STACK_SIGNAL", "flight_recorder_on", "install"]

HANG_DIR = "hang"
"""Folder of the record directory that announcements, stacks and flight-recorder dumps go to."""
_RTMIN: int | None = getattr(signal, "SIGRTMIN", None)
STACK_SIGNAL: int | None = _RTMIN + 4 if _RTMIN is not None and hasattr(faulthandler, "register") else None
"""The signal that makes a rank write its stacks (glibc keeps the first real-time signals for itself);
None where there are no real-time signals or no `faulthandler.register` (macOS, Windows): no stacks."""
_FR_VARS = ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE")

_installed_pid: int | None = None
_stack_file: IO[str] | None = None  # held open for faulthandler, which writes to its descriptor


def flight_recorder_on(env: Mapping[str, str] | None = None) -> bool:
    """PyTorch's flight recorder keeps entries in this process (its buffer size variable is > 0)."""
    src = os.environ if env is None else env
    for name in _FR_VARS:
        value = src.get(name)
        if value is not None:  # TORCH_FR_BUFFER_SIZE wins over the NCCL name, as torch reads them
            return value.strip().isdigit() and int(value) > 0
    return False


def install(record_dir: str | os.PathLike[str], rank: int) -> None:
    """Install the stack dump (and the flight-recorder trigger where on) once per process; never raises
    for a folder it cannot write (the run goes on without hang diagnosis)."""
    global _installed_pid, _stack_file
    if _installed_pid == os.getpid():
        return
    _installed_pid = os.getpid()
    folder = Path(record_dir) / HANG_DIR
    try:
        folder.mkdir(parents=True, exist_ok=True)
        stacks = False
        if STACK_SIGNAL is not None and signal.getsignal(STACK_SIGNAL) in (signal.SIG_DFL, None):
            _stack_file = (folder / f"rank{rank}.stacks.txt").open("a", encoding="utf-8")
            faulthandler.register(STACK_SIGNAL, file=_stack_file, all_threads=True, chain=False)
            stacks = True
        fr = flight_recorder_on() and _start_flight_recorder_trigger(folder, rank)
        note = {
            "rank": rank,
            "pid": os.getpid(),
            "signal": STACK_SIGNAL or 0,
            "stacks": stacks,
            "flight_recorder": fr,
        }
        tmp = folder / f".rank{rank}.json.tmp"
        tmp.write_text(json.dumps(note), encoding="utf-8")
        tmp.replace(folder / f"rank{rank}.json")
    except (OSError, RuntimeError, ValueError):
        return


def _start_flight_recorder_trigger(folder: Path, rank: int) -> bool:
    fifo = folder / f"rank{rank}.fr-trigger"
    with contextlib.suppress(FileNotFoundError):
        fifo.unlink()
    os.mkfifo(fifo, 0o600)
    # read-write: the read below blocks until a byte arrives and never sees end-of-file
    fd = os.open(fifo, os.O_RDWR | os.O_CLOEXEC)
    thread = threading.Thread(
        target=_dump_on_request, args=(fd, folder / f"rank{rank}.fr.json"), name="perfgate-fr", daemon=True
    )
    thread.start()
    return True


def _dump_on_request(fd: int, target: Path) -> None:
    while os.read(fd, 64):
        try:
            c10d = importlib.import_module("torch._C._distributed_c10d")
            dump: Callable[[bool, bool], object] = c10d._dump_fr_trace_json  # includeCollectives, onlyActive
            raw = dump(True, False)
        except Exception as exc:  # noqa: BLE001 (a trigger thread must outlive whatever torch raises)
            raw = json.dumps({"error": f"{type(exc).__name__}: {exc}"})
        data = raw if isinstance(raw, bytes) else str(raw).encode("utf-8")
        tmp = target.with_name(f".{target.name}.tmp")
        with contextlib.suppress(OSError):
            tmp.write_bytes(data)
            tmp.replace(target)
