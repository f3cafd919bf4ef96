"""Launch ids: small integers the server gives each process tree it starts, in order, per workspace.

A launch id names a launch where people and the agent read it (a ``{launch}`` in a `dump_tensors` path,
the ``session`` of sample records), so it is ``1, 2, 3 ...`` rather than a clock reading. The counter is
this workspace's file in the trust root (``state/workspaces/<id>/launch-counter``), advanced under a
lock, so ids stay unique across calls, servers and detached supervisors of the workspace; the agent can
neither write the counter nor choose an id (`launch_env` refuses the variables in a request's ``env``,
and the launch sets them last).

The ids reach the launched processes as ``PERFGATE_LAUNCH_ID`` with ``PERFGATE_LAUNCH_GIVEN=1``: the
harness keeps a given id (every torchrun or Slurm rank of the launch shares it) and drops the marker, so
a harnessed process the script itself starts draws an id of its own, as does a process whose environment
merely inherited an old ``PERFGATE_LAUNCH_ID`` (`perfgate.harness.samples.launch_id`).

Stdlib only: the detached supervisor imports it.
"""

from __future__ import annotations

import os
from pathlib import Path

from perfgate.helpers.filelock import held

__all__ = ["COUNTER_FILE", "GIVEN_ENV", "LAUNCH_ENV", "launch_variables", "next_launch_id"]

LAUNCH_ENV = "PERFGATE_LAUNCH_ID"
GIVEN_ENV = "PERFGATE_LAUNCH_GIVEN"
COUNTER_FILE = "launch-counter"
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)


def next_launch_id(private_dir: Path) -> int:
    """Allocate the next launch id of the workspace whose trust-root folder is ``private_dir`` (1 first).

    A counter that cannot be read as a number (truncated by a crash mid-write) starts over after the
    largest id it can still see, never below 1.
    """
    private_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    path = private_dir / COUNTER_FILE
    with held(private_dir / f".{COUNTER_FILE}.lock"):
        try:
            fd = os.open(path, os.O_RDONLY | _NOFOLLOW)
            with os.fdopen(fd, "rb") as fh:
                text = fh.read(64).decode("ascii", "replace").strip()
        except FileNotFoundError:
            text = ""
        last = int(text) if text.isdigit() else 0
        launch = last + 1
        tmp = private_dir / f".{COUNTER_FILE}.{os.getpid()}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | _NOFOLLOW, 0o600)
        with os.fdopen(fd, "wb") as fh:
            fh.write(f"{launch}\n".encode())
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    return launch


def launch_variables(launch: int) -> dict[str, str]:
    """The environment entries that give a launched process tree its id (set after the request's own)."""
    return {LAUNCH_ENV: str(launch), GIVEN_ENV: "1"}
