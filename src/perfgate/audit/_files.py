"""Opening record files, gzip or plain, the same way for every text reader."""

from __future__ import annotations

import gzip
import io
import os
import zlib
from pathlib import Path
from typing import BinaryIO, cast

from perfgate.audit.errors import AuditInputError
from perfgate.helpers.safeopen import open_file

__all__ = ["MAX_GZIP_RATIO", "RATIO_EXEMPT_BYTES", "open_binary"]

MAX_GZIP_RATIO = 200
"""A ``.gz`` record file may expand to at most this many times its size (sample records compress 5-30x);
beyond it the file is refused as a possible decompression bomb."""
RATIO_EXEMPT_BYTES = 256 << 20
"""Output below this size is never refused for its ratio (small, very repetitive files are fine)."""


class _BoundedGzip(io.RawIOBase):
    """A gzip stream that stops once its output passes MAX_GZIP_RATIO x the compressed file size."""

    def __init__(self, path: Path, what: str) -> None:
        self._raw = open_file(path)
        self._gz = gzip.GzipFile(fileobj=self._raw, mode="rb")
        self._path = path
        self._what = what
        self._limit = max(RATIO_EXEMPT_BYTES, MAX_GZIP_RATIO * os.fstat(self._raw.fileno()).st_size)
        self._out = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]  # io.RawIOBase's buffer type
        try:
            data = self._gz.read(len(buffer))
        except (zlib.error, EOFError, gzip.BadGzipFile) as exc:
            raise AuditInputError(
                f"{self._what} {self._path}: the gzip data is corrupt or truncated after {self._out} "
                f"decompressed bytes ({exc}); re-create the file, or pass it uncompressed"
            ) from exc
        self._out += len(data)
        if self._out > self._limit:
            raise AuditInputError(
                f"{self._what} {self._path}: decompresses to over {self._limit} bytes, more than {MAX_GZIP_RATIO}x "
                "its size (limit audit._files.MAX_GZIP_RATIO): refusing a possible decompression bomb. If the "
                "file is genuine, pass it uncompressed"
            )
        buffer[: len(data)] = data
        return len(data)

    def close(self) -> None:
        self._gz.close()
        self._raw.close()  # GzipFile does not close a file object it was given
        super().close()


def open_binary(path: Path, what: str) -> BinaryIO:
    """Open `path` for reading bytes, decompressing `.gz`; the caller closes it.

    Raises:
        AuditInputError: the file cannot be opened.
    """
    try:
        if path.suffix == ".gz":
            return cast("BinaryIO", io.BufferedReader(_BoundedGzip(path, what), buffer_size=1 << 20))
        return open_file(path)
    except OSError as exc:
        raise AuditInputError(f"cannot open {what} {path}: {exc}") from exc
