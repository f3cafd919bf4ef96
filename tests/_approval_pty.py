"""Drive ``perfgate`` inside a pseudo-terminal, as a human at a terminal would."""

from __future__ import annotations

import os
import select
import subprocess
import sys
import time

# Make the pty the child's controlling terminal (so /dev/tty opens it), then run the CLI.
_WRAPPER = (
    "import fcntl, sys, termios; fcntl.ioctl(0, termios.TIOCSCTTY, 0); "
    "from perfgate.cli import main; sys.exit(main(sys.argv[1:]))"
)


def run_in_pty(
    args: list[str], answer: str | None, prompt: bytes = b"leaves it pending:", timeout_s: float = 30.0
):
    """Run ``perfgate ARGS`` on a pty; type ``answer`` at ``prompt``. Returns (exit status, output)."""
    master, slave = os.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-c", _WRAPPER, *args],
        stdin=slave,
        stdout=slave,
        stderr=slave,
        start_new_session=True,
    )
    os.close(slave)
    output = b""
    sent = False
    deadline = time.monotonic() + timeout_s
    try:
        while True:
            ready, _, _ = select.select([master], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                raise TimeoutError(f"no output from perfgate within {timeout_s} s: {output!r}")
            try:
                chunk = os.read(master, 4096)
            except OSError:  # EIO: every holder of the terminal's other side exited
                break
            if not chunk:
                break
            output += chunk
            if answer is not None and not sent and prompt in output:
                os.write(master, answer.encode() + b"\n")
                sent = True
        code = proc.wait(timeout=timeout_s)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(master)
    return code, output.decode(errors="replace").replace("\r\n", "\n")
