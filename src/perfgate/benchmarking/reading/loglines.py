"""The lines of a training log as the importer reads them: whole, or refused with the reason.

A line is read only when it is known whole:

- it ends with its newline. The last line of a file without one may have been cut (a copy that stopped
  short, a run killed while writing): ``elapsed time per iteration (ms): 890`` may have been ``89075.2``.
  Nothing tells a cut line from a whole one, so such a line is never read; the reason names it.
- it is UTF-8. A torn multi-byte sequence (a line spliced with another, a copy cut inside a character) or
  another encoding is refused, with the byte where decoding failed.
- it is not longer than `MAX_LINE_BYTES`: the rest of a longer line is never looked at.

What the formats add (`perfgate.benchmarking.reading.logformats`): a step line whose numbers are not followed by what
the trainer prints after them (Megatron's `` |``, nanoGPT's ``,`` and ``ms``) is refused as cut too.

Every line then loses, by one rule for every format (`strip_prefix`), what launchers and loggers put before
the trainer's own text: ANSI colours; rank tags (``[rank3]:``, ``[default0]:``, ``[Rank 0]:``, srun
``--label``'s ``0:``, mpirun's ``[1,0]<stdout>:``, a pdsh host label ``node07:``); timestamps
(``2024-05-01 12:00:00,123``, ``2024-05-01T12:00:00Z``, ``[2024-05-01 12:00:00]``, ``05/01/2024 12:00:00``,
``12:00:00``); logger levels and names (``INFO:root:``, ``[INFO]``, ``root - INFO -``, ``[titan]``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import BinaryIO

from perfgate.helpers.cappedlines import capped_byte_lines

__all__ = [
    "MAX_LINE_BYTES",
    "NO_NEWLINE",
    "LogLine",
    "lines_of_text",
    "read_log_lines",
    "strip_prefix",
    "text_line",
]

MAX_LINE_BYTES = 1 << 16
"""Longest line read (64 KiB; a step line is a few hundred bytes)."""

NO_NEWLINE = "no newline at its end: the file ends inside it, so it may be cut; not read"

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_LEVEL = r"(?:DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL|FATAL)\b"
_RANK = r"\[(?:rank|default|Rank ?)?(\d+)\]:?"
_PREFIX = re.compile(
    r"(?:"
    + _RANK  # torchrun's [rank3]: / [default0]:, Megatron's [Rank 0]
    + r"|\[\d+,(\d+)\]<std(?:out|err)>:"  # mpirun --tag-output: [job,rank]
    + r"|(\d{1,7}):(?=\s)"  # srun --label
    + r"|[A-Za-z][\w-]{0,63}\d[\w.-]{0,63}:(?=\s)"  # a pdsh host label (a name holding a digit)
    + r"|\[?\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?\]?"  # ISO date and time
    + r"|\[?\d\d/\d\d/\d{4},? \d\d:\d\d:\d\d(?:[.,]\d+)?\]?"  # 05/01/2024 12:00:00
    + r"|\[?\d\d:\d\d:\d\d(?:[.,]\d+)?\]?"  # a time of day
    + r"|\[?"
    + _LEVEL
    + r"\]?(?::[\w.<>-]*:)?"  # INFO, [INFO], INFO:root:
    + r"|[\w.]{1,128}(?= - "
    + _LEVEL
    + r")"  # the logger's name in 'root - INFO - '
    + r"|\[[A-Za-z_][\w.-]*\]"  # a bracketed logger name: [titan], [main]
    + r")(?:\s*[-|](?=\s))?\s*"  # then spaces, ' - ' or ' | '
)
_MAX_PREFIX_TOKENS = 12


@dataclass(frozen=True)
class LogLine:
    """One line of a log: ``text`` without its prefixes and line end, and why it cannot be read whole
    (``problem``; such a line is never read for anything)."""

    no: int
    """1-based line number in the file."""
    text: str
    problem: str | None = None
    rank: int | None = None
    """The rank its prefix names (``[rank3]:``, ``3:``), when one does."""
    raw: str = ""
    """The line as written (without its line end)."""


def strip_prefix(text: str) -> tuple[str, str, int | None]:
    """``(text, prefix, rank)``: ``text`` without ANSI colours and without the launcher's and logger's
    prefixes (see the module docstring), what was removed, and the rank a rank tag names."""
    text = _ANSI.sub("", text)
    pos = len(text) - len(text.lstrip())
    rank: int | None = None
    for _ in range(_MAX_PREFIX_TOKENS):
        m = _PREFIX.match(text, pos)
        if m is None or m.end() == pos:
            break
        tagged = next((g for g in m.groups() if g is not None), None)
        if tagged is not None and rank is None:
            rank = int(tagged)
        pos = m.end()
    return text[pos:], text[:pos].strip(), rank


def text_line(no: int, text: str) -> LogLine:
    """Line ``no``, already decoded and known whole (its line end, if any, is dropped)."""
    return _line(no, text.rstrip("\r\n"), None)


def _line(no: int, text: str, problem: str | None) -> LogLine:
    body, _, rank = strip_prefix(text)
    return LogLine(no, body, problem, rank, text)


def read_log_lines(fh: BinaryIO, limit: int = MAX_LINE_BYTES) -> Iterator[LogLine]:
    """The lines of a log file opened in binary mode, each whole or with its ``problem``."""
    for no, (raw, cut) in enumerate(capped_byte_lines(fh, limit), 1):
        whole = raw.endswith(b"\n")
        body = raw[:-1] if whole else raw
        if no == 1 and body.startswith(b"\xef\xbb\xbf"):
            body = body[3:]
        body = body.removesuffix(b"\r")
        problem: str | None = None
        try:
            text = body.decode("utf-8")
        except UnicodeDecodeError as exc:
            text = body.decode("utf-8", errors="replace")
            problem = f"not UTF-8 at byte {exc.start + 1} (a torn multi-byte character or another encoding); not read"
        if cut:
            problem = f"longer than {limit} bytes: only its start was seen; not read"
        elif not whole and problem is None:
            problem = NO_NEWLINE
        yield _line(no, text, problem)


def lines_of_text(lines: Iterable[str]) -> Iterator[LogLine]:
    """Lines already decoded and known whole (an in-memory list; a file goes through `read_log_lines`,
    which judges its last line)."""
    for no, line in enumerate(lines, 1):
        yield text_line(no, line)
