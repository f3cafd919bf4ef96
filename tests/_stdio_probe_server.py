"""A one-tool server on `perfgate.transports.stdio.run_stdio`, for the transport's tests: ``python THIS``.

Its ``probe`` tool writes to fd 1 and reads fd 0 as a careless tool or child would, and says what it
saw and whether anyio worker threads exist (the SDK's transport reads stdin in one). After serving it
writes a last line to fd 1, which must then be the wire again, in blocking mode. ``PROBE_LINE_LIMIT``
sets the transport's longest message.
"""

from __future__ import annotations

import logging
import os
import sys
import threading

from mcp.server import MCPServer

import perfgate.transports.stdio
from perfgate.transports.stdio import run_stdio

# as perfgate's build_server does: plain lines, not the SDK's rich handler (which wraps at 80 columns)
logging.basicConfig(level=logging.INFO, format="%(message)s", handlers=[logging.StreamHandler(sys.stderr)])
server = MCPServer("probe")


@server.tool()
async def probe(echo: str = "", size: int = 0) -> dict[str, object]:
    """Report what a tool sees of the standard streams while the server serves (on the loop: async)."""
    os.write(1, b"stray output\n")
    return {
        "stdin_read": os.read(0, 16).decode(),
        "echo_len": len(echo),
        "big": "x" * size,
        "worker_threads": sum(t.name.startswith("AnyIO worker") for t in threading.enumerate()),
    }


if __name__ == "__main__":
    if "PROBE_LINE_LIMIT" in os.environ:  # a small limit, to send an over-long message cheaply
        perfgate.transports.stdio._LINE_LIMIT = int(os.environ["PROBE_LINE_LIMIT"])  # pyright: ignore[reportPrivateUsage]
    run_stdio(server)
    os.write(1, f"served; blocking {os.get_blocking(0)} {os.get_blocking(1)}\n".encode())
