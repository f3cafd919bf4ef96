"""The stdio transport without a thread per message.

The SDK's ``stdio_server`` reads stdin and writes stdout through anyio's file wrappers: every line read,
every write and every flush is a hop to a worker thread and back, three per tool call. When both standard
streams are pipes or sockets (as an agent host starts a server) and the loop is asyncio's on POSIX, the
event loop reads and writes them itself here, through its pipe transports. The SDK still frames and
parses every message (its ``stdio_server`` given these streams), so the wire is unchanged. Anything else
(a terminal, a regular file, Windows, trio) gets the SDK's own transport.

As the SDK does while it serves, fd 0 is pointed at the null device and fd 1 at stderr, so a child
process or stray ``print`` can neither read the client's messages nor write into the wire; both are
restored, in blocking mode, when serving ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import stat
import sys
from collections.abc import AsyncGenerator, Generator
from typing import Any, cast

import anyio
from mcp.server.mcpserver import MCPServer
from mcp.server.stdio import stdio_server

from perfgate.transports.wire import guarded

__all__ = ["ClientGone", "run_stdio"]

_LINE_LIMIT = 64 << 20
"""The longest message read (bytes): a longer line is dropped as it arrives, and the reader stops taking
input while twice this is buffered, so a client cannot make the server hold unbounded input."""

logger = logging.getLogger(__name__)


def _pipe_like(fd: int) -> bool:
    try:
        mode = os.fstat(fd).st_mode
    except OSError:
        return False
    return stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)


class _Lines:
    """stdin as the SDK's reader iterates it: decoded lines, until end of file. A line over
    `_LINE_LIMIT` is skipped with a warning in the log, as the SDK ignores a line it cannot parse."""

    def __init__(self, reader: asyncio.StreamReader) -> None:
        self._reader = reader

    def __aiter__(self) -> _Lines:
        return self

    async def __anext__(self) -> str:
        while True:
            try:
                line = await self._reader.readuntil(b"\n")
            except asyncio.IncompleteReadError as end:  # end of input, maybe after a last unended line
                if not end.partial:
                    raise StopAsyncIteration from None
                line = end.partial
            except asyncio.LimitOverrunError as over:
                logger.warning("dropped a message longer than %d bytes from stdin", _LINE_LIMIT)
                await self._drop_line(over.consumed)
                continue
            return line.decode("utf-8", errors="replace")

    async def _drop_line(self, buffered: int) -> None:
        """Discard the rest of an over-long line: ``buffered`` bytes of it are in the reader's buffer."""
        while True:
            await self._reader.readexactly(buffered)
            try:
                await self._reader.readuntil(b"\n")
                return
            except asyncio.IncompleteReadError:
                return
            except asyncio.LimitOverrunError as over:
                buffered = over.consumed


class _Drain(asyncio.Protocol):
    """Flow control for the stdout pipe: `drain` waits while the transport holds bytes the pipe did not
    take yet (its write buffer limits are set to 0, so any byte held pauses it)."""

    def __init__(self) -> None:
        self._paused = False
        self._lost: BaseException | None = None
        self._waiters: list[asyncio.Future[None]] = []

    def pause_writing(self) -> None:
        self._paused = True

    def resume_writing(self) -> None:
        self._paused = False
        self._wake()

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost = exc or ConnectionResetError("stdout was closed")
        self._wake()

    def _wake(self) -> None:
        for waiter in self._waiters:
            if not waiter.done():
                waiter.set_result(None)
        self._waiters.clear()

    async def drain(self) -> None:
        while True:
            if self._lost is not None:
                raise BrokenPipeError("the client closed the server's stdout") from self._lost
            if not self._paused:
                return
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            await waiter


class _Out:
    """stdout as the SDK's writer uses it: ``write`` then ``flush``, each awaited."""

    def __init__(self, transport: asyncio.WriteTransport, protocol: _Drain) -> None:
        transport.set_write_buffer_limits(high=0)  # flush: every byte handed to the pipe, as a file's
        self._transport, self._protocol = transport, protocol

    async def write(self, text: str) -> None:
        self._transport.write(text.encode("utf-8"))

    async def flush(self) -> None:
        await self._protocol.drain()


@contextlib.contextmanager
def _claimed(fd: int, divert: int) -> Generator[int]:
    """A private duplicate of ``fd`` (what the wire is read or written through), with ``fd`` itself
    pointed at ``divert`` until the block ends; then ``fd`` is the wire again, in blocking mode."""
    import fcntl

    private = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 3)
    try:
        os.dup2(divert, fd)
        try:
            yield private
        finally:
            os.set_blocking(private, True)
            os.dup2(private, fd)
    finally:
        os.close(private)


@contextlib.asynccontextmanager
async def _loop_streams() -> AsyncGenerator[tuple[_Lines, _Out] | None]:
    """stdin and stdout served by the running asyncio loop, or None where that cannot be done here."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:  # trio
        yield None
        return
    if sys.platform == "win32" or not (_pipe_like(0) and _pipe_like(1)):
        yield None
        return
    with contextlib.ExitStack() as held:
        null = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
        held.callback(os.close, null)
        try:
            errors = os.dup(2)  # stray output goes where the server's log goes
        except OSError:
            errors = os.open(os.devnull, os.O_WRONLY | os.O_CLOEXEC)
        held.callback(os.close, errors)
        wire_in = held.enter_context(_claimed(0, null))
        wire_out = held.enter_context(_claimed(1, errors))
        reader = asyncio.StreamReader(limit=_LINE_LIMIT)
        # closefd=False: the descriptors are `_claimed`'s, which restores and closes them.
        read_transport, _ = await loop.connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(wire_in, "rb", buffering=0, closefd=False)
        )
        # Closed before the descriptors go back: both transports leave the loop's poller at once.
        held.callback(read_transport.close)
        write_transport, drain = await loop.connect_write_pipe(
            _Drain, os.fdopen(wire_out, "wb", buffering=0, closefd=False)
        )
        # Each answer was flushed whole; bytes still held belong to one cut short: dropped. (A transport
        # whose pipe broke has closed itself already.)
        held.callback(lambda: write_transport.is_closing() or write_transport.abort())
        yield _Lines(reader), _Out(write_transport, drain)


async def serve_stdio(server: MCPServer[Any]) -> None:
    """``server.run_stdio_async()``, through the loop's own pipe transports where `_loop_streams` can."""
    lowlevel = server._lowlevel_server  # pyright: ignore[reportPrivateUsage]  # as run_stdio_async
    async with _loop_streams() as streams:
        # The SDK's own streams where the loop cannot serve the pipes (its run_stdio_async, guarded).
        stdin, stdout = streams if streams is not None else (None, None)
        async with stdio_server(cast("Any", stdin), cast("Any", stdout)) as (read_stream, write_stream):
            # Unreadable lines and over-long ids answered, errors bounded (`perfgate.transports.wire`).
            guarded_read, guarded_write = guarded(read_stream, write_stream)
            await lowlevel.run(guarded_read, guarded_write, lowlevel.create_initialization_options())


class ClientGone(Exception):
    """The client closed the server's stdout while it served: nobody reads the answers any more."""


def _only_broken_pipes(exc: BaseException) -> bool:
    """Whether ``exc`` is a broken pipe, or a group (the task groups') of nothing else."""
    group = getattr(exc, "exceptions", None)
    if isinstance(group, tuple) and group:
        return all(_only_broken_pipes(e) for e in cast("tuple[BaseException, ...]", group))
    return isinstance(exc, BrokenPipeError)


def run_stdio(server: MCPServer[Any]) -> None:
    """Serve ``server`` over stdin and stdout until the client closes stdin (`serve_stdio`).

    Raises:
        ClientGone: the client closed stdout first (on either transport), instead of the task groups'
            traceback.
    """
    try:
        anyio.run(serve_stdio, server)
    except BaseException as exc:
        if not _only_broken_pipes(exc):
            raise
        raise ClientGone("the client closed the server's stdout, so the server stopped") from None
