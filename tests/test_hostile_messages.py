"""Raw messages no client should send get a JSON-RPC error, and no answer echoes a large input.

Over `perfgate serve`'s stdio transport (the probe server, `tests/_stdio_probe_server.py`), on both of its
paths: pipes served on the event loop, and the SDK's own transport (stdin a regular file). Each bad line
is followed by a ``ping`` that must still be answered.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

PROBE = Path(__file__).resolve().parent / "_stdio_probe_server.py"
INIT = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-11-25",
        "capabilities": {},
        "clientInfo": {"name": "t", "version": "0"},
    },
}
INITIALIZED = {"jsonrpc": "2.0", "method": "notifications/initialized"}
PING = b'{"jsonrpc": "2.0", "id": 9, "method": "ping"}\n'
DEEP = 100_000

BAD_LINES = {
    "nested 100k deep": b'{"jsonrpc": "2.0", "id": 3, "method": "ping", "params": {"a": '
    + b"[" * DEEP
    + b"]" * DEEP
    + b"}}",
    "a 10^5000 literal": b'{"jsonrpc": "2.0", "id": 1' + b"0" * 5000 + b', "method": "ping"}',
    "not JSON": b"hello, server",
    "no method": b'{"jsonrpc": "2.0", "id": 3}',
}


def _answers(read_line: Any) -> list[dict[str, Any]]:
    """Answers read with ``read_line`` up to the ping's (each checked to be small)."""
    answers: list[dict[str, Any]] = []
    while not answers or answers[-1].get("id") != 9:
        line = read_line()
        assert len(line) < 20_000, f"an answer of {len(line)} bytes"
        answers.append(json.loads(line))
    return answers


def _exchange(lines: list[bytes], tmp_path: Path, *, pipe: bool) -> list[dict[str, Any]]:
    """Send the handshake, ``lines`` and a ping; every answer after the handshake's, up to the ping's.

    ``pipe``: stdout a pipe (served on the loop); else a regular file, which the SDK's transport serves.
    """
    payload = b"".join(json.dumps(m).encode() + b"\n" for m in (INIT, INITIALIZED))
    payload += b"".join(line + b"\n" for line in lines) + PING
    out_file, log_file = tmp_path / "answers.jsonl", tmp_path / "server.log"
    with (
        out_file.open("wb") as sink,
        log_file.open("wb") as log,
        subprocess.Popen(
            [sys.executable, str(PROBE)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE if pipe else sink,
            stderr=log,  # a file: the log may be large, and nothing reads a pipe of it meanwhile
            env=os.environ,
        ) as proc,
    ):
        assert proc.stdin is not None
        proc.stdin.write(payload)
        proc.stdin.flush()
        if pipe:
            assert proc.stdout is not None
            answers = _answers(proc.stdout.readline)
        else:
            with out_file.open("rb") as source:

                def read_line() -> bytes:
                    line = b""
                    while not line.endswith(b"\n"):  # the server writes it; wait for the whole line
                        line += source.readline()
                        if not line.endswith(b"\n"):
                            assert proc.poll() is None, log_file.read_text(errors="replace")[-3000:]
                            time.sleep(0.05)
                    return line

                answers = _answers(read_line)
        proc.stdin.close()
        if proc.stdout is not None:
            proc.stdout.read()
        assert proc.wait(timeout=60) == 0, log_file.read_text(errors="replace")[-3000:]
    return answers[1:]


@pytest.mark.parametrize("pipe", [True, False], ids=["loop", "sdk"])
@pytest.mark.parametrize("what", list(BAD_LINES))
def test_an_unreadable_message_gets_an_error_and_the_next_is_answered(
    tmp_path: Path, what: str, pipe: bool
) -> None:
    *errors, ping = _exchange([BAD_LINES[what]], tmp_path, pipe=pipe)
    assert ping == {"jsonrpc": "2.0", "id": 9, "result": {}}
    (error,) = errors
    assert error["id"] is None and error["error"]["code"] in (-32700, -32600), error
    assert "hello" not in error["error"]["message"]  # what is wrong, never the line itself


@pytest.mark.parametrize("pipe", [True, False], ids=["loop", "sdk"])
def test_a_huge_id_is_refused_not_echoed(tmp_path: Path, pipe: bool) -> None:
    huge = "i" * 5_000_000
    line = json.dumps({"jsonrpc": "2.0", "id": huge, "method": "ping"}).encode()
    *errors, ping = _exchange([line], tmp_path, pipe=pipe)
    assert ping["id"] == 9
    (error,) = errors
    assert error["id"] is None and "5000000 characters long" in error["error"]["message"]


def test_an_error_about_a_huge_name_echoes_a_bounded_prefix(tmp_path: Path) -> None:
    name = "n" * 3_000_000
    call = {"jsonrpc": "2.0", "id": 4, "method": "tools/call", "params": {"name": name, "arguments": {}}}
    *answers, ping = _exchange([json.dumps(call).encode()], tmp_path, pipe=True)
    assert ping["id"] == 9
    (answer,) = answers  # its size is checked by _exchange
    assert answer["id"] == 4 and ("error" in answer or answer["result"]["isError"])
