"""JSON Lines reader: blocks of uniform lines decode as columns (`_jsonl_columns`), other blocks with
msgspec in one call, and bad lines are reported by number."""

from __future__ import annotations

import zlib
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from operator import attrgetter
from pathlib import Path
from typing import Any, BinaryIO, cast

import msgspec
import numpy as np
from numpy.typing import NDArray

from perfgate.audit._files import open_binary
from perfgate.audit._jsonl_columns import ABSENT, Columns, uniform_columns
from perfgate.audit.errors import AuditInputError
from perfgate.audit.ids import SampleIds
from perfgate.audit.records import REQUIRED_COLUMNS, RecordBuilder

__all__ = ["MAX_LINE_BYTES", "read_jsonl"]

_BLOCK_BYTES = 8 << 20
_PROBE_LINES = 64
MAX_LINE_BYTES = 1 << 20
"""Longest record line read (a sample record is ~100 bytes); a longer line stops the read with an error
instead of growing without bound."""


class _IntRow(msgspec.Struct, gc=False):
    sample_id: int
    epoch: int
    rank: int
    worker: int
    step: int | None = ABSENT
    session: int | None = ABSENT
    restart: bool = False
    pass_index: int | None = msgspec.field(default=ABSENT, name="pass")


class _StrRow(msgspec.Struct, gc=False):
    sample_id: str
    epoch: int
    rank: int
    worker: int
    step: int | None = ABSENT
    session: int | None = ABSENT
    restart: bool = False
    pass_index: int | None = msgspec.field(default=ABSENT, name="pass")


class _AnyRow(msgspec.Struct, gc=False):
    sample_id: int | str
    epoch: int
    rank: int
    worker: int
    step: int | None = ABSENT
    session: int | None = ABSENT
    restart: bool = False
    pass_index: int | None = msgspec.field(default=ABSENT, name="pass")


_Row = _IntRow | _StrRow | _AnyRow
_BLOCK_DECODERS: tuple[msgspec.json.Decoder[Any], ...] = (
    msgspec.json.Decoder(list[_IntRow]),
    msgspec.json.Decoder(list[_StrRow]),
    msgspec.json.Decoder(list[_AnyRow]),
)
_LINE_DECODER = msgspec.json.Decoder(_AnyRow)
_get_id, _get_epoch, _get_rank, _get_worker = (
    attrgetter("sample_id"),
    attrgetter("epoch"),
    attrgetter("rank"),
    attrgetter("worker"),
)
_get_step, _get_session, _get_restart = attrgetter("step"), attrgetter("session"), attrgetter("restart")
_get_pass = attrgetter("pass_index")


def read_jsonl(path: Path, builder: RecordBuilder) -> None:
    """Add the records of one JSONL file (optionally .gz) to `builder`.

    A block whose lines all share the first line's keys and differ only in their integers is read as
    columns with numpy, in `DECODE_THREADS` threads for a file of several blocks (numpy works outside
    the GIL); other blocks decode in one msgspec call, and a block with any bad line is decoded again
    line by line so each malformed line is reported with its number and the rest are kept. Blocks join
    the builder in file order.

    Raises:
        AuditInputError: the file cannot be opened or read, a line is longer than MAX_LINE_BYTES, or a
            required field is absent from its records.
    """
    source = str(path)
    builder.sources.append(source)
    joiner = _Joiner(source, builder)
    pending: deque[tuple[bytes, Future[tuple[int, Columns | None]]]] = deque()
    with (
        open_binary(path, "observed records") as stream,
        ThreadPoolExecutor(DECODE_THREADS, thread_name_prefix="perfgate-jsonl") as pool,
    ):
        probed = False
        try:
            for block in _blocks(stream):
                if not probed:
                    _probe_columns(block, source)
                    probed = True
                while len(pending) > DECODE_THREADS:  # bounded memory: a few blocks in flight
                    joiner.join(*pending.popleft())
                pending.append((block, pool.submit(_attempt, block)))
            while pending:
                joiner.join(*pending.popleft())
        except _LongLine as exc:
            line = joiner.line_base + sum(b.count(b"\n") for b, _ in pending) + exc.lines_before + 1
            raise AuditInputError(
                f"{source}: line {line} is longer than {MAX_LINE_BYTES} bytes (limit "
                "audit.read_jsonl.MAX_LINE_BYTES; a sample record is about 100 bytes): the file is not one "
                "JSON record per line, or it is corrupt"
            ) from None
        except _ReadFailed as exc:
            line = joiner.line_base + sum(b.count(b"\n") for b, _ in pending)
            raise AuditInputError(f"cannot read {source} after line {line}: {exc.cause}") from exc.cause
        finally:  # after an error, blocks not yet started are dropped, not decoded
            for _, attempt in pending:
                attempt.cancel()


DECODE_THREADS = 2
"""Threads that decode uniform blocks of one JSONL file at once (each holds a block of _BLOCK_BYTES and
its temporaries, about ten times that); msgspec blocks decode in the calling thread, in order."""


class _LongLine(Exception):
    def __init__(self, lines_before: int) -> None:
        self.lines_before = lines_before  # whole lines between the last block handed out and the long one


class _ReadFailed(Exception):
    def __init__(self, cause: Exception) -> None:
        self.cause = cause


def _blocks(stream: BinaryIO) -> Iterator[bytes]:
    """Blocks of whole lines, each ending in a newline (one is added to a last line without it).

    Raises:
        _LongLine: a line longer than MAX_LINE_BYTES (before it is read whole).
        _ReadFailed: the stream failed (a corrupt gzip member, an I/O error).
    """
    tail = b""
    while True:
        try:
            data = stream.read(_BLOCK_BYTES)
        except (OSError, EOFError, zlib.error) as exc:
            raise _ReadFailed(exc) from exc
        if not data:
            if tail:
                yield tail if tail.endswith(b"\n") else tail + b"\n"
            return
        data = tail + data
        cut = data.rfind(b"\n") + 1
        block, tail = data[:cut], data[cut:]
        if len(tail) > MAX_LINE_BYTES:
            raise _LongLine(block.count(b"\n"))
        if block:
            yield block


def _attempt(block: bytes) -> tuple[int, Columns | None]:
    """The block's line count and, when its lines are uniform, its columns (runs in a pool thread)."""
    n_lines = block.count(b"\n")
    return n_lines, uniform_columns(block, n_lines, _LINE_DECODER)


class _Joiner:
    """Adds decoded blocks to the builder in file order, counting lines for their numbers."""

    def __init__(self, source: str, builder: RecordBuilder) -> None:
        self.source = source
        self.builder = builder
        self.line_base = 0  # lines before the next block
        self.preferred = 0  # the msgspec decoder that worked last

    def join(self, block: bytes, attempt: Future[tuple[int, Columns | None]]) -> None:
        n_lines, columns = attempt.result()
        if columns is not None:
            ids = SampleIds.of_ints(columns.sample_id)
            _add_columns(columns, ids, self.line_base + 1, self.source, self.builder)
        else:
            self.preferred = _decode_block(
                block, n_lines, self.line_base, self.source, self.builder, self.preferred
            )
        self.line_base += n_lines


def _probe_columns(block: bytes, source: str) -> None:
    """Fail clearly when a required field is absent from every record among the first lines."""
    seen: set[str] = set()
    parsed = 0
    for line in block.split(b"\n", _PROBE_LINES)[:_PROBE_LINES]:
        try:
            obj = msgspec.json.decode(line)
        except (msgspec.DecodeError, RecursionError):
            continue
        if isinstance(obj, dict):
            seen.update(str(k) for k in cast("dict[object, object]", obj))
            parsed += 1
    missing = [c for c in REQUIRED_COLUMNS if c not in seen]
    if parsed and missing:
        raise AuditInputError(
            f"{source}: records have no {', '.join(repr(c) for c in missing)} field "
            f"(fields seen: {', '.join(sorted(seen)) or 'none'}). Every record needs sample_id, epoch, "
            "rank and worker (-1 for the main process); step, session, restart and pass are optional."
        )


def _decode_block(
    block: bytes, n_lines: int, line_base: int, source: str, builder: RecordBuilder, preferred: int
) -> int:
    """Decode a block of whole lines with msgspec; returns the decoder that worked, to try first next time."""
    # one JSON array of every line; a blank or broken line makes it invalid and is then found below
    joined = bytearray(b"[")
    joined += block.replace(b"\n", b",")
    joined[-1] = ord("]")
    if not block.startswith(b"\n"):
        for which in (preferred, *(k for k in range(len(_BLOCK_DECODERS)) if k != preferred)):
            try:
                rows: list[_Row] = _BLOCK_DECODERS[which].decode(joined)
            except msgspec.ValidationError:
                continue  # another id type may fit; a bad field fails every decoder
            except (msgspec.DecodeError, RecursionError):
                break
            if len(rows) != n_lines:
                break  # a line held more or less than one value: find it line by line
            lines = np.arange(line_base + 1, line_base + 1 + n_lines, dtype=np.int64)
            _add_rows(rows, lines, source, builder, _fields_in(block, len(rows)))
            return which
    _decode_lines(block, line_base, source, builder)
    return preferred


def _decode_lines(block: bytes, line_base: int, source: str, builder: RecordBuilder) -> None:
    rows: list[_Row] = []
    numbers: list[int] = []
    for offset, line in enumerate(block.split(b"\n")[:-1], start=line_base + 1):
        if not line.strip():
            continue
        try:
            rows.append(_LINE_DECODER.decode(line))
        except (msgspec.DecodeError, RecursionError) as exc:  # RecursionError: nested thousands deep
            builder.malformed.add(source, offset, str(exc))
            continue
        numbers.append(offset)
    if rows:
        _add_rows(rows, np.array(numbers, dtype=np.int64), source, builder, _fields_in(block, len(rows)))


_OPTIONAL_FIELDS = ("step", "session", "restart", "pass")


def _fields_in(block: bytes, n_records: int) -> frozenset[str]:
    """Optional fields the block may hold: a field whose quoted name never occurs is absent from
    every line, so its column need not be extracted (a byte search is far cheaper).

    Every record holds the four required fields, each with its own colon, so a block of ``n_records``
    records with exactly four colons per record holds no optional field at all: one ``count`` of a
    single byte (memchr speed) settles the common case before any name is searched for."""
    if block.count(b":") == 4 * n_records:
        return frozenset()
    return frozenset(name for name in _OPTIONAL_FIELDS if f'"{name}"'.encode() in block)


def _add_rows(
    rows: list[_Row], lines: NDArray[np.int64], source: str, builder: RecordBuilder, fields: frozenset[str]
) -> None:
    n = len(rows)
    first = rows[0]
    try:  # msgspec decodes integers of any size; the columns hold 64 bits
        if isinstance(first, _IntRow):
            ids = SampleIds.of_ints(np.fromiter(map(_get_id, rows), dtype=np.int64, count=n))
        elif isinstance(first, _StrRow):
            ids = SampleIds.of_strings(builder.pool.codes(map(_get_id, rows)))
        else:
            ids = SampleIds.of_values(list(map(_get_id, rows)), builder.pool)
    except OverflowError as exc:
        raise AuditInputError(
            f"{source}: a sample id does not fit in a signed 64-bit int: write such ids as strings"
        ) from exc
    try:
        columns = Columns(
            sample_id=ids.values,
            epoch=np.fromiter(map(_get_epoch, rows), dtype=np.int64, count=n),
            rank=np.fromiter(map(_get_rank, rows), dtype=np.int64, count=n),
            worker=np.fromiter(map(_get_worker, rows), dtype=np.int64, count=n),
            step=_optional(rows, _get_step) if "step" in fields else None,
            session=_optional(rows, _get_session) if "session" in fields else None,
            restart=np.fromiter(map(_get_restart, rows), dtype=np.bool_, count=n)
            if "restart" in fields
            else None,
            pass_index=_optional(rows, _get_pass) if "pass" in fields else None,
        )
    except OverflowError as exc:
        raise AuditInputError(f"{source}: an epoch, rank, worker, step or session exceeds 64 bits") from exc
    _add_columns(columns, ids, lines, source, builder)


def _add_columns(
    columns: Columns, ids: SampleIds, lines: NDArray[np.int64] | int, source: str, builder: RecordBuilder
) -> None:
    """Hand one block's columns to the builder: absent optional values become what they stand for."""
    step, missing_steps = None, len(ids)
    if columns.step is not None:
        missing_steps = int(np.count_nonzero(columns.step == ABSENT))
        step = columns.step if missing_steps == 0 else None
    session = None
    if columns.session is not None:
        absent = columns.session == ABSENT
        session = None if absent.all() else np.where(absent, 0, columns.session)  # unnamed session 0
    pass_index = None
    if columns.pass_index is not None:
        absent = columns.pass_index == ABSENT
        pass_index = None if absent.all() else np.where(absent, 0, columns.pass_index)  # the first pass
    restart = columns.restart
    builder.add(
        source,
        lines,
        ids,
        epoch=columns.epoch,
        rank=columns.rank,
        worker=columns.worker,
        step=step,
        session=session,
        restart=restart if restart is not None and restart.any() else None,
        step_lacking=missing_steps,
        pass_index=pass_index,
    )


def _optional(rows: list[_Row], get: attrgetter[Any]) -> NDArray[np.int64]:
    """An optional int field as int64, ABSENT where the line left it out or wrote null."""
    try:
        return np.fromiter(map(get, rows), dtype=np.int64, count=len(rows))
    except TypeError:  # an explicit null somewhere: the slow way
        return np.array([ABSENT if v is None else v for v in map(get, rows)], dtype=np.int64)
