"""Opening record files, gzip or plain, the same way for every text reader."""

from __future__ import annotations

import gzip
from pathlib import Path
from typing import BinaryIO, cast

from perfgate.audit.errors import AuditInputError

__all__ = ["open_binary"]


def open_binary(path: Path, what: str) -> BinaryIO:
    """Open `path` for reading bytes, decompressing `.gz`; the caller closes it.

    Raises:
        AuditInputError: the file cannot be opened.
    """
    try:
        if path.suffix == ".gz":
            # GzipFile reads bytes like any binary file; typeshed does not declare it BinaryIO
            return cast("BinaryIO", gzip.open(path, "rb"))
        return path.open("rb")
    except OSError as exc:
        raise AuditInputError(f"cannot open {what} {path}: {exc}") from exc
