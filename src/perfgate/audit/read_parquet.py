"""Parquet reader (optional `parquet` extra: pyarrow), batch by batch in bounded memory."""

from __future__ import annotations

import importlib
import importlib.util
import os
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from perfgate.audit._files import MAX_GZIP_RATIO, RATIO_EXEMPT_BYTES
from perfgate.audit.errors import AuditInputError
from perfgate.audit.ids import SampleIds, StringPool
from perfgate.audit.records import OPTIONAL_COLUMNS, REQUIRED_COLUMNS, RecordBuilder
from perfgate.helpers.deadline import checkpoint
from perfgate.helpers.safeopen import open_file

__all__ = ["parquet_available", "read_parquet", "read_parquet_ids"]

_BATCH_ROWS = 1 << 22
_BYTES_PER_ROW = 24
"""Memory of one record's columns while reading (id int64, three int32 columns, step int64)."""
_MISSING_PYARROW = (
    "reading Parquet needs pyarrow, which is not installed: `pip install 'perfgate[parquet]'` "
    "(or pass the records as JSONL, CSV or NPZ)"
)


def parquet_available() -> bool:
    """Whether pyarrow can be imported, without importing it."""
    return importlib.util.find_spec("pyarrow") is not None


def _arrow(module: str = "pyarrow") -> Any:
    """A pyarrow module, imported on use (optional dependency, and untyped: it ships no stubs).

    Raises:
        AuditInputError: pyarrow is not installed.
    """
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise AuditInputError(_MISSING_PYARROW) from exc


_PROC_FD = Path("/proc/self/fd")


def _open(path: Path) -> Any:
    pq = _arrow("pyarrow.parquet")
    f = open_file(path)  # no link followed, a regular file of its own (`perfgate.helpers.safeopen`)
    try:
        if _PROC_FD.is_dir():
            # pyarrow reopens exactly the checked file through /proc, at native speed, and keeps its own handle.
            with f:
                return pq.ParquetFile(str(_PROC_FD / str(f.fileno())))
        return pq.ParquetFile(f)
    except _arrow_errors() as exc:
        raise AuditInputError(f"cannot read {path} as Parquet: {exc}") from exc


def _arrow_errors() -> tuple[type[BaseException], ...]:
    """What pyarrow raises for a file it cannot read: OSError, ValueError (ArrowInvalid) and every other
    ArrowException (e.g. ArrowNotImplementedError for a 3-bit or 128-bit integer column in a corrupt file)."""
    return (OSError, ValueError, _arrow().ArrowException)


def read_parquet(path: Path, builder: RecordBuilder) -> None:
    """Add the records of one Parquet file to `builder`; rows with nulls become malformed rows.

    Raises:
        AuditInputError: pyarrow missing, unreadable file, a missing column or a column of the wrong type.
    """
    source = str(path)
    builder.sources.append(source)
    pf = _open(path)
    try:
        names: list[str] = list(pf.schema_arrow.names)
    except _arrow_errors() as exc:
        raise AuditInputError(f"cannot read {source} as Parquet: {exc}") from exc
    missing = [c for c in REQUIRED_COLUMNS if c not in names]
    if missing:
        raise AuditInputError(
            f"{source}: no {', '.join(repr(c) for c in missing)} column (columns: {', '.join(names)}). "
            f"Required: {', '.join(REQUIRED_COLUMNS)}; optional: {', '.join(OPTIONAL_COLUMNS)}."
        )
    columns = [c for c in (*REQUIRED_COLUMNS, *OPTIONAL_COLUMNS) if c in names]
    pa = _arrow()

    # id columns stay arrow-owned views until build() copies them out; the arrow allocator then
    # keeps the freed pages cached for itself unless told to hand them back
    builder.after_build(pa.default_memory_pool().release_unused)
    try:
        _read_batches(pf, columns, source, builder)
    except AuditInputError:
        raise
    except _arrow_errors() as exc:
        raise AuditInputError(f"cannot read {source} as Parquet: {exc}") from exc


def _read_batches(pf: Any, columns: list[str], source: str, builder: RecordBuilder) -> None:
    """Fill whole-file columns batch by batch: no per-batch chunks to join, so memory is the columns."""
    pa = _arrow()

    n = _row_count(pf, source)
    ids = np.empty(n, dtype=np.int64)
    as_strings = not pa.types.is_integer(pf.schema_arrow.field("sample_id").type)
    ints: dict[str, NDArray[Any]] = {
        name: np.empty(n, dtype=np.int64 if name in ("step", "session") else np.int32)
        for name in columns
        if name not in ("sample_id", "restart")
    }
    restart = np.empty(n, dtype=np.bool_) if "restart" in columns else None
    invalid: list[NDArray[np.int64]] = []
    reasons: list[str] = []
    pos = 0
    for batch in pf.iter_batches(batch_size=_BATCH_ROWS, columns=columns):
        checkpoint()  # the parsing deadline (perfgate.helpers.deadline), per batch of rows
        m = int(batch.num_rows)
        valid = np.ones(m, dtype=np.bool_)
        for name in REQUIRED_COLUMNS:
            valid &= _not_null(batch.column(name), m)
        part: slice | NDArray[np.int64] = slice(pos, pos + m)
        if not valid.all():
            invalid.append(np.flatnonzero(~valid) + pos)
            reasons.append("null in a required column")
            batch = batch.filter(valid)
            part = np.flatnonzero(valid) + pos  # rows left unset here are dropped below
        ids[part] = _ids(batch.column("sample_id"), builder.pool, source).values
        for name, out in ints.items():
            values = _ints(batch.column(name), name, source)
            if out.dtype != np.int32 or not np.can_cast(values.dtype, np.int32):
                # int8/16/32 columns (the usual epoch, rank and worker) go in as they are; wider ones
                # as int64 (uint64 wraps, as before), checked against the int32 column
                values = values.astype(np.int64, copy=False)
                if out.dtype == np.int32:
                    wide = (values < -(2**31)) | (values >= 2**31)
                    if wide.any():
                        rows = np.arange(pos, pos + m) if isinstance(part, slice) else part
                        invalid.append(rows[wide])
                        reasons.append(f"{name} beyond 32 bits")
            out[part] = values
        if restart is not None:
            col = batch.column("restart")
            restart[part] = np.asarray(col.fill_null(False).to_numpy(zero_copy_only=False), dtype=np.bool_)
        pos += m
    if pos != n:
        raise AuditInputError(
            f"{source}: the metadata declares {n} rows but the row groups yielded {pos}: the file is truncated or "
            "corrupt; re-write it"
        )
    keep: NDArray[np.bool_] | None = None
    if invalid:
        keep = np.ones(n, dtype=np.bool_)
        for rows, reason in zip(invalid, reasons, strict=True):
            builder.malformed.add_many(source, rows + 1, reason)
            keep[rows] = False
    sample_ids = SampleIds.of_strings(ids) if as_strings else SampleIds.of_ints(ids)
    if keep is None:
        kept, first_line = ints, 1
    else:
        sample_ids = sample_ids.take(keep)
        kept = {name: out[keep] for name, out in ints.items()}
        restart = None if restart is None else restart[keep]
        first_line = np.flatnonzero(keep).astype(np.int64) + 1
    builder.add(
        source,
        first_line,
        sample_ids,
        epoch=kept["epoch"],
        rank=kept["rank"],
        worker=kept["worker"],
        step=kept.get("step"),
        session=kept.get("session"),
        restart=restart if restart is not None and restart.any() else None,
    )


def _row_count(pf: Any, source: str) -> int:
    """Rows the file declares, checked before the columns are allocated for them.

    The file-level count must equal the row groups' sum, and the columns it implies (about 24 bytes a
    row) may be at most MAX_GZIP_RATIO times the file's size past RATIO_EXEMPT_BYTES, the expansion
    allowed to compressed record files: a small file cannot make this process allocate terabytes.
    """
    meta = pf.metadata
    n = int(meta.num_rows)
    groups = sum(int(meta.row_group(i).num_rows) for i in range(int(meta.num_row_groups)))
    if n != groups or n < 0:
        raise AuditInputError(
            f"{source}: the file metadata declares {n} rows but its row groups hold {groups}: the file is "
            "corrupt; re-write it"
        )
    size = os.stat(source).st_size
    limit = max(RATIO_EXEMPT_BYTES, MAX_GZIP_RATIO * size)
    if n * _BYTES_PER_ROW > limit:
        raise AuditInputError(
            f"{source}: declares {n} rows ({n * _BYTES_PER_ROW} bytes of columns) in a {size}-byte file, over "
            f"{MAX_GZIP_RATIO}x its size (limit audit._files.MAX_GZIP_RATIO): refusing a possible decompression "
            "bomb. Split the records into several files"
        )
    return n


def _not_null(column: Any, n: int) -> NDArray[np.bool_]:
    if column.null_count == 0:
        return np.ones(n, dtype=np.bool_)
    return np.asarray(column.is_valid().to_numpy(zero_copy_only=False), dtype=np.bool_)


def _ids(column: Any, pool: StringPool, source: str) -> SampleIds:
    pa, pc = _arrow(), _arrow("pyarrow.compute")

    kind = column.type
    if pa.types.is_integer(kind):
        if pa.types.is_uint64(kind) and len(column) and pc.max(column).as_py() > np.iinfo(np.int64).max:
            raise AuditInputError(f"{source}: sample ids beyond int64: write them as strings")
        return SampleIds.of_ints(np.asarray(column.to_numpy(), dtype=np.int64))
    if pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_string_view(kind):
        column = pc.dictionary_encode(column)
        kind = column.type
    if pa.types.is_dictionary(kind) and (
        pa.types.is_string(kind.value_type) or pa.types.is_large_string(kind.value_type)
    ):
        mapping = pool.codes(column.dictionary.to_pylist())
        indices = np.asarray(column.indices.to_numpy(zero_copy_only=False), dtype=np.int64)
        return SampleIds.of_strings(mapping[indices])
    raise AuditInputError(
        f"{source}: sample_id has type {kind}; use an integer or string column (floats are ambiguous ids)"
    )


def _ints(column: Any, name: str, source: str) -> NDArray[np.integer[Any]]:
    """An integer column in its own width (an int16 epoch stays int16: widening it is a copy)."""
    pa = _arrow()

    if not pa.types.is_integer(column.type):
        raise AuditInputError(f"{source}: '{name}' must be an integer column, got {column.type}")
    if column.null_count:
        if name == "step":
            raise AuditInputError(f"{source}: 'step' has nulls: give every record a step or drop the column")
        column = column.fill_null(0)  # a record without a session token belongs to session 0
    return np.asarray(column.to_numpy())


def read_parquet_ids(path: Path, pool: StringPool) -> SampleIds:
    """The `sample_id` column of a Parquet file (expected ids).

    Raises:
        AuditInputError: pyarrow missing, unreadable file, no sample_id column, nulls or a wrong type.
    """
    pf = _open(path)
    try:
        names: list[str] = list(pf.schema_arrow.names)
    except _arrow_errors() as exc:
        raise AuditInputError(f"cannot read {path} as Parquet: {exc}") from exc
    if "sample_id" not in names:
        raise AuditInputError(f"{path}: no 'sample_id' column (columns: {', '.join(names)})")
    _row_count(pf, str(path))
    parts: list[SampleIds] = []
    try:
        for batch in pf.iter_batches(batch_size=_BATCH_ROWS, columns=["sample_id"]):
            checkpoint()
            column = batch.column("sample_id")
            if column.null_count:
                raise AuditInputError(f"{path}: 'sample_id' has nulls")
            parts.append(_ids(column, pool, str(path)))
    except AuditInputError:
        raise
    except _arrow_errors() as exc:
        raise AuditInputError(f"cannot read {path} as Parquet: {exc}") from exc
    return SampleIds.concat(parts)
