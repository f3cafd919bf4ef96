"""`perfgate serve`'s stdio transport (`perfgate.transports.stdio`), at the byte level of its pipes.

The server reads and writes its pipes on the event loop, without a thread per message; everything else
falls back to the SDK's transport. Either way the standard streams are diverted while it serves and
restored after, and large messages cross whole.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import IO, Any

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
ECHO = "y" * 300_000  # past asyncio's default 64 KiB line limit
SIZE = 1_000_000  # past a pipe's 64 KiB buffer


def _call(echo: str = ECHO, size: int = SIZE) -> dict[str, Any]:
    args = {"echo": echo, "size": size}
    return {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "probe", "arguments": args}}


def _send(stdin: IO[bytes], *messages: dict[str, Any]) -> None:
    stdin.write(b"".join(json.dumps(m).encode() + b"\n" for m in messages))
    stdin.flush()


def _probe_result(line: bytes) -> dict[str, Any]:
    message = json.loads(line)
    assert message["id"] == 2, message
    result = message["result"]
    assert not result.get("isError"), result
    return result["structuredContent"]


def _server(stdout: IO[bytes] | int, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, str(PROBE)],
        stdin=subprocess.PIPE,
        stdout=stdout,
        stderr=subprocess.PIPE,
        env={**os.environ, **(env or {})},
    )


def test_pipes_are_served_on_the_loop_with_the_streams_diverted_and_restored() -> None:
    with _server(subprocess.PIPE) as proc:
        assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
        _send(proc.stdin, INIT, INITIALIZED, _call())
        assert json.loads(proc.stdout.readline())["id"] == 1
        probed = _probe_result(proc.stdout.readline())
        proc.stdin.close()  # end of input: the server stops
        rest = proc.stdout.read()
        err = proc.stderr.read()
    assert proc.returncode == 0, err.decode(errors="replace")[-2000:]
    # No thread per message: the SDK's transport reads stdin in an anyio worker thread.
    assert probed["worker_threads"] == 0
    assert probed["echo_len"] == len(ECHO)
    assert probed["big"] == "x" * SIZE
    # While serving, fd 0 is the null device and fd 1 the log: a tool neither reads nor writes the wire.
    assert probed["stdin_read"] == ""
    assert b"stray output" in err
    assert b"stray output" not in rest
    # After: fd 1 is the wire again, fd 0 and fd 1 blocking as they were handed over.
    assert rest == b"served; blocking True True\n"


def test_a_stdout_that_is_not_a_pipe_gets_the_sdk_transport(tmp_path: Path) -> None:
    out_path = tmp_path / "out.jsonl"
    with out_path.open("wb") as out, _server(out) as proc:
        assert proc.stdin is not None and proc.stderr is not None
        _send(proc.stdin, INIT, INITIALIZED, _call(echo="z", size=10))
        deadline = time.monotonic() + 120  # guards a hang only
        while out_path.read_bytes().count(b"\n") < 2:
            assert proc.poll() is None, proc.stderr.read().decode(errors="replace")[-2000:]
            assert time.monotonic() < deadline, "no answer"
            time.sleep(0.05)
        proc.stdin.close()
        proc.wait(timeout=120)
    lines = out_path.read_bytes().splitlines()
    assert proc.returncode == 0
    probed = _probe_result(lines[1])
    assert probed["worker_threads"] >= 1  # the SDK's reader thread
    assert (probed["echo_len"], probed["big"], probed["stdin_read"]) == (1, "x" * 10, "")
    assert lines[2:] == [b"served; blocking True True"]


def test_a_client_that_stops_reading_ends_the_server() -> None:
    with _server(subprocess.PIPE) as proc:
        assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
        proc.stdout.close()  # the client went away without closing stdin
        with contextlib.suppress(BrokenPipeError):  # the server may be gone already
            _send(proc.stdin, INIT)
        code = proc.wait(timeout=120)
        err = proc.stderr.read()
    assert code != 0
    assert b"the client closed the server's stdout" in err


@pytest.mark.parametrize("ends", ["newline", "end of input"])
def test_a_message_over_the_line_limit_is_dropped_and_the_next_one_answered(ends: str) -> None:
    limit = 100_000
    with _server(subprocess.PIPE, {"PROBE_LINE_LIMIT": str(limit)}) as proc:
        assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
        _send(proc.stdin, INIT, INITIALIZED)
        assert json.loads(proc.stdout.readline())["id"] == 1
        over = json.dumps(_call(echo="w" * (5 * limit), size=1)).encode()
        if ends == "end of input":  # the over-long line is the last thing the client sends
            proc.stdin.write(over)
            proc.stdin.close()
            assert proc.stdout.read() == b"served; blocking True True\n"
        else:  # the line is skipped to its end; the call after it (in the same write) is answered
            _send(proc.stdin, _call(echo="y" * (limit - 200), size=1))  # just under the limit
            assert _probe_result(proc.stdout.readline())["echo_len"] == limit - 200
            proc.stdin.write(over + b"\n" + json.dumps(_call(echo="after", size=3)).encode() + b"\n")
            proc.stdin.flush()
            probed = _probe_result(proc.stdout.readline())
            assert (probed["echo_len"], probed["big"]) == (len("after"), "xxx")
            proc.stdin.close()
            assert proc.stdout.read() == b"served; blocking True True\n"
        err = proc.stderr.read()
    assert proc.returncode == 0
    assert f"dropped a message longer than {limit} bytes".encode() in err


def test_perfgate_serve_whose_client_stops_reading_says_so_in_a_sentence(workspace: Path) -> None:
    cmd = [sys.executable, "-m", "perfgate", "serve", "--workspace", str(workspace)]
    with subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE) as proc:
        assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
        proc.stdout.close()
        with contextlib.suppress(BrokenPipeError):  # the server may be gone already
            _send(proc.stdin, INIT)
        code = proc.wait(timeout=120)
        err = proc.stderr.read().decode(errors="replace")
    assert code == 1, err[-2000:]
    assert "perfgate: the client closed the server's stdout, so the server stopped" in err
    assert "next: reconnect from the agent host" in err
    assert "Traceback" not in err


def test_perfgate_logs_plain_lines_where_rich_is_installed(tmp_path: Path) -> None:
    """The SDK installs a rich log handler when rich is importable, and rich wraps a long message at the
    terminal's width; perfgate's server logs one plain line per message instead."""
    pytest.importorskip("rich")
    code = (
        "import logging, sys; from pathlib import Path; from perfgate.server import build_server; "
        "from perfgate.serving.config import ServerConfig; build_server(ServerConfig.create(Path(sys.argv[1]))); "
        "print(*sorted(type(h).__name__ for h in logging.getLogger().handlers))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, timeout=120, check=True
    )
    assert done.stdout.split() == ["StreamHandler"], done.stdout + done.stderr
