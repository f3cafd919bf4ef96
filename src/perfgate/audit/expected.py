"""The ids every epoch should cover: a half-open int range, or a list read from a file."""

from __future__ import annotations

import csv
import io
import os
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import msgspec
import numpy as np
from numpy.typing import NDArray

from perfgate.audit.errors import AuditInputError
from perfgate.audit.formats import EXPECTED_SUFFIXES
from perfgate.audit.ids import IdValue, SampleIds, StringPool, parse_text_id
from perfgate.audit.read_npz import ids_from_array, load_array_file
from perfgate.audit.read_parquet import read_parquet_ids
from perfgate.helpers.deadline import past_memory_budget
from perfgate.helpers.safeopen import open_file

__all__ = ["EXPECTED_SUFFIXES", "ExpectedIds", "IdRange", "read_expected"]


_HELD_PER_BYTE = 16
"""Server memory per byte of an expected-ids text file read whole (its bytes, the parsed values, the ids)."""


@dataclass(frozen=True)
class IdRange:
    """Int ids `start <= id < stop`."""

    start: int
    stop: int

    def __post_init__(self) -> None:
        if self.stop < self.start:
            raise AuditInputError(
                f"expected_range [{self.start}, {self.stop}) is empty: stop must be >= start"
            )

    def __len__(self) -> int:
        return self.stop - self.start


ExpectedIds = IdRange | SampleIds
"""What one epoch should cover; a SampleIds may list an id twice (reported, counted once)."""


class _IdObject(msgspec.Struct):
    sample_id: int | str


_JSON_TYPE = list[int | str] | dict[str, list[int | str]]
_LINE_TYPE = int | str | _IdObject


def read_expected(path: Path, pool: StringPool) -> SampleIds:
    """Read expected ids; string ids are interned in the observed records' pool.

    Formats: .json (a list of ids, or an object with an "ids" or "sample_ids" list), .jsonl
    (one id or one {"sample_id": ...} object a line), .txt (one id a line; canonical integers are
    ints), .csv (a sample_id column), .npy (a 1-D array), .npz and .parquet (a sample_id column).

    Raises:
        AuditInputError: a missing or unreadable file, an unknown suffix, or an id that is neither
            int nor str.
    """
    suffix = path.suffix.lower()
    if suffix not in EXPECTED_SUFFIXES:
        raise AuditInputError(
            f"expected ids file {path}: unknown suffix {suffix!r}; use one of {', '.join(EXPECTED_SUFFIXES)}"
        )
    if suffix == ".parquet":
        return read_parquet_ids(path, pool)
    if suffix in (".npy", ".npz"):
        return SampleIds.concat([ids_from_array(_load_array(path), pool, str(path))])
    try:
        with open_file(path) as f:
            if why := past_memory_budget(
                os.fstat(f.fileno()).st_size, _HELD_PER_BYTE, f"expected ids file {path}"
            ):
                raise AuditInputError(why)
            data = f.read()
    except OSError as exc:
        raise AuditInputError(f"cannot read expected ids {path}: {exc}") from exc
    if suffix == ".json":
        values = _json_ids(data, path)
    elif suffix in (".jsonl", ".ndjson"):
        values = _jsonl_ids(data, path)
    elif suffix == ".txt":
        values = [parse_text_id(line.strip()) for line in _text(data, path).splitlines() if line.strip()]
    else:
        values = _csv_ids(_text(data, path), path)
    try:
        return SampleIds.of_values(values, pool)
    except (TypeError, OverflowError) as exc:
        raise AuditInputError(f"expected ids {path}: {exc}") from exc


def _text(data: bytes, path: Path) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise AuditInputError(f"expected ids {path} is not UTF-8 text: {exc}") from exc


def _json_ids(data: bytes, path: Path) -> list[IdValue]:
    try:
        doc = msgspec.json.decode(data, type=_JSON_TYPE)
    except (msgspec.DecodeError, RecursionError) as exc:  # RecursionError: nested thousands deep
        raise AuditInputError(
            f'expected ids {path}: {exc}. Write a JSON list of int or string ids, or {{"ids": [...]}}'
        ) from exc
    if isinstance(doc, list):
        return doc
    for key in ("ids", "sample_ids"):
        if key in doc:
            return doc[key]
    raise AuditInputError(f"expected ids {path}: the object has no 'ids' or 'sample_ids' list")


def _jsonl_ids(data: bytes, path: Path) -> list[IdValue]:
    decoder = msgspec.json.Decoder(_LINE_TYPE)
    out: list[IdValue] = []
    for number, line in enumerate(data.split(b"\n"), start=1):
        if not line.strip():
            continue
        try:
            value = decoder.decode(line)
        except (msgspec.DecodeError, RecursionError) as exc:  # RecursionError: nested thousands deep
            raise AuditInputError(f"expected ids {path}, line {number}: {exc}") from exc
        out.append(value.sample_id if isinstance(value, _IdObject) else value)
    return out


def _csv_ids(text: str, path: Path) -> list[IdValue]:
    reader = csv.reader(io.StringIO(text, newline=""))
    header = next(reader, None)
    if header is None:
        return []
    names = [h.strip() for h in header]
    if "sample_id" not in names:
        raise AuditInputError(f"expected ids {path}: the header has no 'sample_id' column (header: {header})")
    col = names.index("sample_id")
    out: list[IdValue] = []
    for row in reader:
        if not row:
            continue
        if col >= len(row) or not row[col]:
            raise AuditInputError(f"expected ids {path}, line {reader.line_num}: no sample_id")
        out.append(parse_text_id(row[col]))
    return out


def _load_array(path: Path) -> NDArray[Any]:
    from perfgate.tensors._npy import quiet_py2_header  # here: the tensors package is slow to import

    try:
        with open_file(path) as f:
            loaded = load_array_file(path, f)
            if isinstance(loaded, np.ndarray):
                arr = cast("NDArray[Any]", loaded)
            else:
                with loaded as npz:
                    name = "sample_id" if "sample_id" in npz.files else None
                    if name is None and len(npz.files) == 1:
                        name = npz.files[0]
                    if name is None:
                        raise AuditInputError(
                            f"expected ids {path}: no 'sample_id' array (arrays: {', '.join(npz.files)})"
                        )
                    with quiet_py2_header():
                        arr = npz[name]
    except AuditInputError:
        raise
    except (OSError, zipfile.BadZipFile, EOFError, zlib.error) as exc:
        raise AuditInputError(f"cannot read expected ids {path}: {exc}") from exc
    except ValueError as exc:
        raise AuditInputError(
            f"expected ids {path}: {exc}. Pickled arrays are never loaded: save an integer or unicode array"
        ) from exc
    if arr.ndim != 1:
        raise AuditInputError(f"expected ids {path}: need a 1-D array, got shape {arr.shape}")
    return arr
