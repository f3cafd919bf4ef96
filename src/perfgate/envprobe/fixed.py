"""perfgate's own fixed, read-only diagnostic queries: ``nvidia-smi --query-gpu=...``, ``git status``, ...

These are not user commands: their argv is chosen by perfgate's code, never by tool input, so they need
no approval. They still follow the executor's rules: an argv list (no shell), stdin closed, their own
process group, a short timeout that kills the whole group, and capped output.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

__all__ = ["MAX_OUTPUT_BYTES", "RawRun", "run_fixed"]

MAX_OUTPUT_BYTES = 1 << 20


@dataclass(frozen=True)
class RawRun:
    """One invocation of a system tool and what it printed."""

    argv: tuple[str, ...]
    exit_code: int | None
    stdout: str
    stderr: str
    error: str | None = None
    stdout_bytes: bytes = b""

    @property
    def ok(self) -> bool:
        return self.error is None and self.exit_code == 0

    def describe_failure(self) -> str:
        if self.error:
            return self.error
        last = (self.stderr.strip() or self.stdout.strip()).splitlines()
        return f"exit status {self.exit_code}" + (f": {last[-1][:300]}" if last else "")

    def transcript(self) -> str:
        status = self.error or f"exit status {self.exit_code}"
        parts = [f"$ {' '.join(self.argv)}", f"[{status}]", self.stdout.rstrip("\n")]
        if self.stderr.strip():
            parts += ["[stderr]", self.stderr.rstrip("\n")]
        return "\n".join(parts) + "\n"


def run_fixed(
    argv: Sequence[str], timeout_s: float, env: Mapping[str, str], max_bytes: int = MAX_OUTPUT_BYTES
) -> RawRun:
    """Run a read-only query; a timeout kills the tool's whole process group.

    Output beyond ``max_bytes`` per stream is dropped (the raw stdout bytes are kept as well).
    """
    try:
        proc = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=dict(env),
            start_new_session=True,
        )
    except OSError as exc:
        return RawRun(tuple(argv), None, "", "", f"cannot start: {exc.strerror or exc}")
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        return RawRun(
            tuple(argv),
            None,
            _decode(out, max_bytes),
            _decode(err, max_bytes),
            f"timed out after {timeout_s:g} s and was killed",
        )
    return RawRun(
        tuple(argv), proc.returncode, _decode(out, max_bytes), _decode(err, max_bytes), None, out[:max_bytes]
    )


def _decode(data: bytes, max_bytes: int) -> str:
    return data[:max_bytes].decode("utf-8", errors="replace")
