"""Streamable HTTP transport: a bearer token on every request, Host and Origin checked on every bind.

On a shared login node every local user can reach a loopback port, so there is no unauthenticated mode.
The token comes from ``$PERFGATE_TOKEN``, a ``--token-file`` (0600), or is generated into the trust root
(`http_token`); it is never needed on the command line, where ``/proc/PID/cmdline`` would show it.
"""

from __future__ import annotations

import hmac
import json
import os
import secrets
import stat
from pathlib import Path
from typing import Any

from starlette.types import ASGIApp, Receive, Scope, Send

__all__ = ["BearerAuth", "TokenError", "allowed_hosts", "http_token", "serve_http"]


class TokenError(ValueError):
    """A token file is unreadable, empty, or readable by other users."""


def http_token(env_token: str | None, token_file: Path | None, state_dir: Path) -> tuple[str, str]:
    """The bearer token and where it came from: ``$PERFGATE_TOKEN``, the file, or the trust root.

    Raises:
        TokenError: ``token_file`` cannot be read, is empty, or is group/world readable; the generated
            token file is empty.
    """
    if env_token:
        return env_token, "$PERFGATE_TOKEN"
    if token_file is not None:
        try:
            mode = token_file.stat().st_mode
            text = token_file.read_text().strip()
        except OSError as exc:
            raise TokenError(f"cannot read the token file {token_file}: {exc.strerror or exc}") from exc
        if mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise TokenError(f"the token file {token_file} is readable by other users: chmod 600 it")
        if not text:
            raise TokenError(f"the token file {token_file} is empty")
        return text, str(token_file)
    path = state_dir / "http-token"
    if not path.is_file():
        from perfgate.security.trustroot import create_private

        # Exactly one of several servers starting at once creates it; each then serves the file's token.
        create_private(path, (secrets.token_urlsafe(32) + "\n").encode())
    text = path.read_text().strip()
    if not text:
        raise TokenError(f"the token file {path} is empty: delete it and the next start generates a new one")
    return text, str(path)


def allowed_hosts(host: str, port: int, extra: list[str]) -> list[str]:
    """Host header values accepted: the bind address, loopback names when bound there, and ``extra``."""
    hosts = [f"{host}:{port}", host]
    if host in ("127.0.0.1", "localhost", "::1", "0.0.0.0", "::"):
        hosts += [f"127.0.0.1:{port}", f"localhost:{port}", f"[::1]:{port}"]
    for name in extra:
        hosts += [name] if ":" in name else [name, f"{name}:{port}"]
    return hosts


class BearerAuth:
    """ASGI middleware: every HTTP request must carry ``Authorization: Bearer <token>``."""

    def __init__(self, app: ASGIApp, token: str) -> None:
        self.app = app
        self.expected = f"Bearer {token}".encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            headers: list[tuple[bytes, bytes]] = scope.get("headers", [])
            given = next((v for k, v in headers if k.lower() == b"authorization"), b"")
            if not hmac.compare_digest(given, self.expected):
                body = json.dumps({"error": "missing or wrong bearer token"}).encode()
                await send(
                    {
                        "type": "http.response.start",
                        "status": 401,
                        "headers": [
                            (b"content-type", b"application/json"),
                            (b"www-authenticate", b"Bearer"),
                            (b"content-length", str(len(body)).encode()),
                        ],
                    }
                )
                await send({"type": "http.response.body", "body": body})
                return
        await self.app(scope, receive, send)


def serve_http(
    server: Any,
    *,
    host: str,
    port: int,
    token: str,
    hosts: list[str],
    origins: list[str],
) -> None:
    """Serve ``server`` (an MCPServer) at http://HOST:PORT/mcp until interrupted.

    Every request needs ``Authorization: Bearer TOKEN``; a Host header outside ``hosts`` or an Origin
    header outside ``origins`` (browsers send one; MCP clients do not) is refused.
    """
    import uvicorn
    from mcp.server.transport_security import TransportSecuritySettings

    from perfgate.security.scrubber import install_log_filter

    if not token:
        raise ValueError("the HTTP transport always needs a token")
    security = TransportSecuritySettings(
        enable_dns_rebinding_protection=True, allowed_hosts=hosts, allowed_origins=origins
    )
    app: ASGIApp = server.streamable_http_app(
        host=host, streamable_http_path="/mcp", transport_security=security
    )
    app = BearerAuth(app, token)
    install_log_filter()
    os.environ.pop("PERFGATE_TOKEN", None)  # commands the server starts must not inherit it
    uvicorn.run(app, host=host, port=port, log_level="warning")
