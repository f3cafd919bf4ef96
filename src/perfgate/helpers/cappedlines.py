"""Lines of a log read with a cap on each: a file with no newline never becomes one giant string.

``for line in file`` holds a whole line in memory, and a training log is the run's (or the agent's) to
write: 2 GiB without a newline grew the server past 3 GiB. Readers of logs take `capped_lines` instead: a
line longer than `MAX_LINE_CHARS` is cut to its first `MAX_LINE_CHARS` characters (what a step line needs
is at its start) and the rest of it is read past in bounded pieces, never kept.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import BinaryIO, TextIO

__all__ = ["MAX_LINE_CHARS", "capped_byte_lines", "capped_lines", "placed_lines"]

_LINE_END = re.compile(rb"\r\n|\r|\n")

MAX_LINE_CHARS = 1 << 16
"""Longest line a log reader looks at (64 Ki characters; a step line is a few hundred)."""


def capped_lines(fh: TextIO, limit: int = MAX_LINE_CHARS) -> Iterator[str]:
    """The lines of ``fh`` (with their newline), each cut to at most ``limit`` characters."""
    while line := fh.readline(limit):
        if len(line) == limit and not line.endswith("\n"):
            while (rest := fh.readline(limit)) and not rest.endswith("\n"):
                pass  # the rest of an over-long line: read past it, a piece at a time
        yield line


def capped_byte_lines(fh: BinaryIO, limit: int = MAX_LINE_CHARS) -> Iterator[tuple[bytes, bool]]:
    """``(line, cut)`` for each line of ``fh``: its bytes (with the newline when it has one) cut to at most
    ``limit``, and whether it was longer. Bytes, so a reader can tell a torn UTF-8 sequence from a
    character, and a last line without its newline from a whole one."""
    while line := fh.readline(limit):
        cut = False
        if len(line) == limit and not line.endswith(b"\n"):
            rest = fh.readline(limit)
            if rest == b"\n":
                line += rest  # exactly ``limit`` bytes: whole
            elif rest:
                cut = True
                while not rest.endswith(b"\n") and (rest := fh.readline(limit)):
                    pass  # the rest of an over-long line: read past it, a piece at a time
        yield line, cut


def placed_lines(fh: BinaryIO, limit: int = MAX_LINE_CHARS) -> Iterator[tuple[str, int]]:
    """``(line, end)`` for each whole line of ``fh``: its text as `capped_lines` gives it (universal newlines:
    ``\r``, ``\r\n`` and ``\n`` each end a line, given as ``\n``) and the byte offset just past its end.
    A last line without its end is left out (the file may stop inside it); an over-long line is given cut,
    placed at the end of all of it."""
    while True:
        start = fh.tell()
        raw = fh.readline(limit)
        if not raw:
            return
        if len(raw) == limit and not raw.endswith(b"\n"):
            while (rest := fh.readline(limit)) and not rest.endswith(b"\n"):
                pass
            if rest:
                yield raw.decode("utf-8", errors="replace"), fh.tell()
            continue
        at = 0
        for m in _LINE_END.finditer(raw):
            yield raw[at : m.start()].decode("utf-8", errors="replace") + "\n", start + m.end()
            at = m.end()
        if at < len(raw):
            return  # only the file's end stops a read short of a line end: the last line may be cut
