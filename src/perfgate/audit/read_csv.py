"""CSV reader. CSV has no types: a canonical decimal integer cell is an int id, any other cell a string."""

from __future__ import annotations

import csv
import io
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO, Protocol

import numpy as np

from perfgate.audit._files import open_binary
from perfgate.audit.errors import AuditInputError
from perfgate.audit.ids import IdValue, SampleIds, parse_text_id
from perfgate.audit.records import REQUIRED_COLUMNS, RecordBuilder
from perfgate.helpers.deadline import checkpoint

__all__ = ["MAX_ROW_BYTES", "read_csv"]

MAX_ROW_BYTES = 1 << 20
"""Longest CSV row read (a line, or several lines joined by a quoted field; a sample record is ~30
bytes): a longer one stops the read with an error instead of growing a row without bound."""
_CHUNK_ROWS = 1 << 20
_RAW_READ = 1 << 16
_TRUE = {"1", "true", "True", "TRUE", "yes"}
_FALSE = {"", "0", "false", "False", "FALSE", "no"}


class _Rows(Protocol):
    """What csv.reader returns: rows, and the number of the line it read last."""

    line_num: int

    def __iter__(self) -> Iterator[list[str]]: ...


class _RowBound(io.RawIOBase):
    """Bytes of a record file, refused once one row runs past MAX_ROW_BYTES.

    The row loop calls `row_done` after each row; the bytes read since then (at most one row plus the
    read-ahead of one block) must stay under the limit. Each block read is also a deadline checkpoint.
    """

    def __init__(self, inner: BinaryIO, source: str) -> None:
        self._inner = inner
        self._source = source
        self.since_row = 0
        self.line = 0  # CSV lines completed before the row being read (set by the row loop)

    def readable(self) -> bool:
        return True

    def row_done(self, line: int) -> None:
        self.since_row = 0
        self.line = line

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]  # io.RawIOBase's buffer type
        checkpoint()
        data = self._inner.read(min(len(buffer), _RAW_READ))
        self.since_row += len(data)
        if self.since_row > MAX_ROW_BYTES + _RAW_READ:
            raise AuditInputError(
                f"{self._source}: the row after line {self.line} is longer than {MAX_ROW_BYTES} bytes (limit "
                "audit.read_csv.MAX_ROW_BYTES; a sample record is about 30 bytes): the file is not one record per "
                "line (an unclosed quote?), or it is corrupt"
            )
        buffer[: len(data)] = data
        return len(data)

    def close(self) -> None:
        self._inner.close()
        super().close()


class _Columns:
    def __init__(self) -> None:
        self.lines: list[int] = []
        self.ids: list[IdValue] = []
        self.epoch: list[int] = []
        self.rank: list[int] = []
        self.worker: list[int] = []
        self.step: list[int | None] = []
        self.session: list[int] = []
        self.restart: list[bool] = []


def read_csv(path: Path, builder: RecordBuilder) -> None:
    """Add the records of one CSV file (header row required; optionally .gz) to `builder`.

    Raises:
        AuditInputError: the file cannot be read or its header lacks a required column.
    """
    source = str(path)
    builder.sources.append(source)
    bound = _RowBound(open_binary(path, "observed records"), source)
    buffered = io.BufferedReader(bound, buffer_size=_RAW_READ)
    with io.TextIOWrapper(buffered, encoding="utf-8", newline="") as text:
        try:
            reader = csv.reader(text)
            header = next(reader, None)
            if header is None:
                return
            bound.row_done(reader.line_num)
            index = {name.strip(): i for i, name in enumerate(header)}
            missing = [c for c in REQUIRED_COLUMNS if c not in index]
            if missing:
                raise AuditInputError(
                    f"{source}: the header has no {', '.join(repr(c) for c in missing)} column "
                    f"(header: {', '.join(header)}). Required: {', '.join(REQUIRED_COLUMNS)}; "
                    "optional: step, session, restart."
                )
            _read_rows(reader, bound, index, len(header), source, builder)
        except (csv.Error, UnicodeDecodeError, OSError, EOFError) as exc:
            raise AuditInputError(f"cannot read {source} as CSV: {exc}") from exc


def _read_rows(
    reader: _Rows, bound: _RowBound, index: dict[str, int], width: int, source: str, builder: RecordBuilder
) -> None:
    i_id, i_epoch, i_rank, i_worker = (index[c] for c in REQUIRED_COLUMNS)
    i_step, i_session, i_restart = (index.get(c) for c in ("step", "session", "restart"))
    cols = _Columns()
    row_done = bound.row_done
    for row in reader:
        line = reader.line_num
        row_done(line)
        if not row or (len(row) == 1 and not row[0].strip()):
            continue
        if len(row) != width:
            builder.malformed.add(source, line, f"{len(row)} fields where the header has {width}")
            continue
        try:
            epoch, rank, worker = int(row[i_epoch]), int(row[i_rank]), int(row[i_worker])
            step = None if i_step is None or not row[i_step] else int(row[i_step])
            session = 0 if i_session is None or not row[i_session] else int(row[i_session])
        except ValueError as exc:
            builder.malformed.add(source, line, f"not an integer: {exc}")
            continue
        flag = "" if i_restart is None else row[i_restart].strip()
        if flag not in _TRUE and flag not in _FALSE:
            builder.malformed.add(source, line, f"restart must be true or false, got {flag!r}")
            continue
        if not row[i_id]:
            builder.malformed.add(source, line, "empty sample_id")
            continue
        cols.lines.append(line)
        cols.ids.append(parse_text_id(row[i_id]))
        cols.epoch.append(epoch)
        cols.rank.append(rank)
        cols.worker.append(worker)
        cols.step.append(step)
        cols.session.append(session)
        cols.restart.append(flag in _TRUE)
        if len(cols.lines) >= _CHUNK_ROWS:
            _flush(cols, i_session is not None, source, builder)
            cols = _Columns()
    _flush(cols, i_session is not None, source, builder)


def _flush(cols: _Columns, has_session: bool, source: str, builder: RecordBuilder) -> None:
    if not cols.lines:
        return
    lacking = cols.step.count(None)
    try:
        restart = np.array(cols.restart, dtype=np.bool_)
        builder.add(
            source,
            np.array(cols.lines, dtype=np.int64),
            SampleIds.of_values(cols.ids, builder.pool),
            epoch=np.array(cols.epoch, dtype=np.int64),
            rank=np.array(cols.rank, dtype=np.int64),
            worker=np.array(cols.worker, dtype=np.int64),
            step=np.array(cols.step, dtype=np.int64) if lacking == 0 else None,
            session=np.array(cols.session, dtype=np.int64) if has_session else None,
            restart=restart if restart.any() else None,
            step_lacking=lacking,
        )
    except OverflowError as exc:
        raise AuditInputError(f"{source}: an epoch, rank, worker, step or session exceeds 64 bits") from exc
