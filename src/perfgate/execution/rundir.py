"""One run at a time in a run directory whose path is fixed by the tool's input.

The record and trace folders of ``run_benchmark_window`` and ``profile_segment`` runs are named after a
digest of the call's input, since that path is in the approved command (its environment) and must be the
same on every round of the gate. Two runs of the same input would share them: each empties the folder
before its launch and removes it afterwards, so one run would read the other's records as its own, or
find its own deleted. A run therefore holds an exclusive lock on ``<run dir>.lock`` (beside the folder,
which is removed and made again) for as long as it uses the folder; the lock goes with the process that
holds it, also when that process is killed. The run directory is in the agent-writable ``.perfgate/``: its
lock and folders are opened following no link (`perfgate.helpers.statefs`).

Stdlib only: the detached supervisor imports it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from collections.abc import Generator, Mapping
from pathlib import Path
from typing import Any

from perfgate.helpers.filelock import held

__all__ = ["RunDirBusyError", "hold_run_dir", "input_run_dir", "lock_path", "one_run", "run_dir_of"]


class RunDirBusyError(RuntimeError):
    """Another run of the same input is using the run directory now."""


def lock_path(run_dir: Path) -> Path:
    return run_dir.with_name(run_dir.name + ".lock")


def run_dir_of(record_dir: str | os.PathLike[str]) -> Path:
    """The run directory of a harness record folder (``<run dir>/records``)."""
    return Path(record_dir).parent


@contextlib.contextmanager
def hold_run_dir(run_dir: Path, *, wait: bool) -> Generator[None]:
    """Hold ``run_dir`` for one run: wait for it, or raise at once when another run holds it.

    Raises:
        RunDirBusyError: ``wait`` is false and another run (a process or a call in this one) holds it.
    """
    with contextlib.ExitStack() as stack:
        try:
            stack.enter_context(held(lock_path(run_dir), wait=wait, confined=True))
        except BlockingIOError as exc:
            raise RunDirBusyError(str(run_dir)) from exc
        yield


def input_run_dir(parent: Path, inputs: Mapping[str, Any]) -> Path:
    """The run directory under ``parent`` of a call with these (JSON) inputs: a digest of them, so the
    approved request, which names it, is identical on every gate round."""
    key = hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()[:16]
    return parent / key


@contextlib.contextmanager
def one_run(run_dir: Path, tool: str, shown: str) -> Generator[None]:
    """Hold ``run_dir`` for one tool call's run, or refuse the call when a run of the same input holds it.

    Raises:
        ToolError: another run (detached, or another call) holds it; ``shown`` names the folder.
    """
    from perfgate.errors import ToolError  # here: the detached supervisor imports this module, not mcp

    with contextlib.ExitStack() as stack:
        try:
            stack.enter_context(hold_run_dir(run_dir, wait=False))
        except RunDirBusyError as exc:
            raise ToolError(
                f"a {tool} run of this same input is in progress (detached, or another call) and uses "
                f"{shown}: two at once would read each other's records. Wait for it to end "
                "(a detached run_benchmark_window: benchmark_run(action='wait')), then call again"
            ) from exc
        yield
