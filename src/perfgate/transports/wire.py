"""JSON-RPC messages checked between a transport and the server: every request is answered, and no answer
echoes a large piece of its input.

The SDK hands the server a line it cannot parse (nested 100,000 deep, a number of 5,000 digits, not JSON)
as an exception, which the server only logs: the client waits for an answer that never comes. Here such
a line is answered with a JSON-RPC error (id null, as the id could not be read) naming what is wrong,
never quoting the line. A request whose id is longer than `MAX_ID_CHARS` is refused the same way (an id
is echoed in every answer: a 60 MB id came back as a 63 MB answer). On the way out, an error's message
and the text of a failed tool call are cut to `MAX_ERROR_CHARS`, so no error repeats unbounded input.
"""

from __future__ import annotations

import json
import logging
from types import TracebackType
from typing import Any, cast

import anyio
from mcp.shared.message import SessionMessage
from mcp_types import (
    INVALID_REQUEST,
    PARSE_ERROR,
    ErrorData,
    JSONRPCError,
    JSONRPCRequest,
    JSONRPCResponse,
)
from pydantic import ValidationError

__all__ = ["MAX_ERROR_CHARS", "MAX_ID_CHARS", "GuardedRead", "GuardedWrite", "guarded"]

MAX_ID_CHARS = 200
"""Longest request id answered (its JSON text); a longer one is refused with id null."""
MAX_ERROR_CHARS = 8000
"""Longest error message or failed tool call text sent; the rest is left out, with a note saying so."""

logger = logging.getLogger(__name__)


def _cut(text: str) -> str:
    if len(text) <= MAX_ERROR_CHARS:
        return text
    return text[:MAX_ERROR_CHARS] + f" …(+{len(text) - MAX_ERROR_CHARS} characters left out)"


def _refusal(code: int, message: str) -> SessionMessage:
    return SessionMessage(JSONRPCError(jsonrpc="2.0", id=None, error=ErrorData(code=code, message=message)))


def _unreadable(exc: Exception) -> SessionMessage:
    """The answer to a line the SDK could not read as a message: what is wrong, without the line."""
    if isinstance(exc, ValidationError):
        errors = exc.errors(include_input=False, include_url=False)
        invalid = [e["msg"] for e in errors if e["type"] == "json_invalid"]
        if invalid:
            return _refusal(PARSE_ERROR, f"the message is not JSON perfgate reads: {_cut(invalid[0])}")
        fields = ", ".join(f"{'.'.join(map(str, e['loc']))[:80]}: {e['msg'][:200]}" for e in errors[:5])
        return _refusal(
            INVALID_REQUEST, f"the message is not a JSON-RPC 2.0 request or notification ({fields})"
        )
    return _refusal(PARSE_ERROR, f"the message could not be read ({type(exc).__name__})")


class GuardedRead:
    """The server's read stream: unreadable lines and over-long ids are answered here, never passed on."""

    def __init__(self, inner: Any, answers: Any) -> None:
        self._inner = inner
        self._answers = answers

    @property
    def last_context(self) -> Any:  # the SDK's dispatcher reads the sender's context from the stream
        return getattr(self._inner, "last_context", None)

    async def receive(self) -> SessionMessage | Exception:
        while True:
            item = cast("SessionMessage | Exception", await self._inner.receive())
            answer = self._screen(item)
            if answer is None:
                return item
            await self._answers.send(answer)

    @staticmethod
    def _screen(item: SessionMessage | Exception) -> SessionMessage | None:
        if isinstance(item, Exception):
            logger.warning("answered an unreadable message with an error: %s", type(item).__name__)
            return _unreadable(item)
        message = item.message
        if isinstance(message, JSONRPCRequest) and len(str(message.id)) > MAX_ID_CHARS:
            return _refusal(
                INVALID_REQUEST,
                f"the request id is {len(str(message.id))} characters long, over the {MAX_ID_CHARS} perfgate "
                "answers; send a short id (a counter or a UUID)",
            )
        return None

    async def aclose(self) -> None:
        await self._inner.aclose()

    def __aiter__(self) -> GuardedRead:
        return self

    async def __anext__(self) -> SessionMessage | Exception:
        try:
            return await self.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError):
            raise StopAsyncIteration from None

    async def __aenter__(self) -> GuardedRead:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc_val: BaseException | None,
        exc_tb: TracebackType | None,
    ) -> bool | None:
        await self.aclose()
        return None


def _text_of(block: object) -> str | None:
    """The text of a content block (a dict with a string ``text``), else None."""
    if isinstance(block, dict):
        text = cast("dict[str, object]", block).get("text")
        if isinstance(text, str):
            return text
    return None


def _bounded(item: SessionMessage) -> SessionMessage:
    """``item`` with an error's message, or a failed tool call's text, cut to `MAX_ERROR_CHARS`."""
    message = item.message
    if isinstance(message, JSONRPCError):
        error = message.error
        large_data = error.data is not None and len(json.dumps(error.data, default=str)) > MAX_ERROR_CHARS
        if len(error.message) > MAX_ERROR_CHARS or large_data:
            data = None if large_data else error.data
            cut = ErrorData(code=error.code, message=_cut(error.message), data=data)
            return SessionMessage(message.model_copy(update={"error": cut}), metadata=item.metadata)
    elif isinstance(message, JSONRPCResponse) and message.result.get("isError") is True:
        content: object = message.result.get("content")
        if isinstance(content, list):
            texts = [_text_of(c) for c in cast("list[object]", content)]
            if any(t is not None and len(t) > MAX_ERROR_CHARS for t in texts):
                shortened = [
                    c if t is None else {**cast("dict[str, Any]", c), "text": _cut(t)}
                    for c, t in zip(cast("list[object]", content), texts, strict=True)
                ]
                result = {**message.result, "content": shortened}
                return SessionMessage(message.model_copy(update={"result": result}), metadata=item.metadata)
    return item


class GuardedWrite:
    """The server's write stream: errors cut to `MAX_ERROR_CHARS` on their way out."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    async def send(self, item: SessionMessage, /) -> None:
        await self._inner.send(_bounded(item))

    async def aclose(self) -> None:
        await self._inner.aclose()

    async def __aenter__(self) -> GuardedWrite:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc_val: BaseException | None,
        exc_tb: TracebackType | None,
    ) -> bool | None:
        await self.aclose()
        return None


def guarded(read_stream: Any, write_stream: Any) -> tuple[GuardedRead, GuardedWrite]:
    """The streams to give the server in place of a transport's ``(read_stream, write_stream)``."""
    return GuardedRead(read_stream, write_stream), GuardedWrite(write_stream)
