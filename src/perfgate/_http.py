"""Streamable HTTP transport with an optional bearer token (required off loopback)."""

from __future__ import annotations

import hmac
import json
from typing import Any

from starlette.types import ASGIApp, Receive, Scope, Send

__all__ = ["BearerAuth", "serve_http"]


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


def serve_http(server: Any, *, host: str, port: int, token: str | None) -> None:
    """Serve ``server`` (an MCPServer) at http://HOST:PORT/mcp until interrupted."""
    import uvicorn

    app: ASGIApp = server.streamable_http_app(host=host, streamable_http_path="/mcp")
    if token:
        app = BearerAuth(app, token)
    uvicorn.run(app, host=host, port=port, log_level="warning")
