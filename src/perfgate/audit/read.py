"""Reading observed records from a file or a folder of per-rank/per-worker files."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from perfgate.audit.errors import AuditInputError
from perfgate.audit.formats import OBSERVED_SUFFIXES
from perfgate.audit.ids import StringPool
from perfgate.audit.read_csv import read_csv
from perfgate.audit.read_jsonl import read_jsonl
from perfgate.audit.read_npz import read_npz
from perfgate.audit.read_parquet import read_parquet
from perfgate.audit.records import ObservedRecords, RecordBuilder

__all__ = ["OBSERVED_SUFFIXES", "read_observed"]

_READERS: dict[str, Callable[[Path, RecordBuilder], None]] = {
    ".jsonl": read_jsonl,
    ".ndjson": read_jsonl,
    ".jsonl.gz": read_jsonl,
    ".ndjson.gz": read_jsonl,
    ".csv": read_csv,
    ".csv.gz": read_csv,
    ".parquet": read_parquet,
    ".npz": read_npz,
}
assert tuple(_READERS) == OBSERVED_SUFFIXES, "a reader for every listed suffix, in order"


def _suffix(path: Path) -> str:
    suffixes = [s.lower() for s in path.suffixes[-2:]]
    if len(suffixes) == 2 and suffixes[1] == ".gz":
        return "".join(suffixes)
    return suffixes[-1] if suffixes else ""


def read_observed(
    path: Path,
    pool: StringPool | None = None,
    example_cap: int = 20,
    confine: Callable[[Path], Path] | None = None,
    progress: Callable[[int, int, Path], None] | None = None,
) -> ObservedRecords:
    """Read observed records from one file, or from every supported file under a folder (name order).

    Unreadable records are skipped and counted in `malformed` with their line (or row) numbers.
    `confine` sees every file before it is read and may refuse it by raising (links out of a workspace).
    `progress(files_done, files_total, file)` is called before each file.

    Raises:
        AuditInputError: the path is missing, has an unsupported suffix, a folder holds no record
            files, or a file lacks a required column.
    """
    if path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.is_file() and _suffix(p) in _READERS)
        if not files:
            raise AuditInputError(
                f"{path} holds no observed record files (looked for {', '.join(OBSERVED_SUFFIXES)})"
            )
    elif path.is_file():
        if _suffix(path) not in _READERS:
            raise AuditInputError(
                f"observed records {path}: unsupported suffix; use one of {', '.join(OBSERVED_SUFFIXES)}"
            )
        files = [path]
    else:
        raise AuditInputError(f"observed records {path} does not exist")
    builder = RecordBuilder(pool, example_cap=example_cap)
    for done, file in enumerate(files):
        if progress is not None:
            progress(done, len(files), file)
        if confine is not None:
            file = confine(file)
        try:
            _READERS[_suffix(file)](file, builder)
        except AuditInputError as exc:
            if str(file) in str(exc):
                raise
            raise AuditInputError(f"{file}: {exc}") from exc
    return builder.build()
