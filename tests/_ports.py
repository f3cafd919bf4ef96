"""A free TCP port for a server a test starts (a fixed number collides with any other run on the host)."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A port nothing listens on now, picked by the kernel (the caller's server binds it right after)."""
    with socket.socket() as s:
        s.bind(("", 0))  # every address: free for a server on 127.0.0.1 or on all of them
        return int(s.getsockname()[1])
