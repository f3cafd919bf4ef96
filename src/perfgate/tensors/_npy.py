"""NPY arrays: the header parsed without ever unpickling, the data streamed or mapped.

numpy only needs pickle for object arrays; those are refused from the header alone, before a byte of
data is read, which is what ``allow_pickle=False`` guarantees and then some: a file that is not NPY at
all (a raw pickle renamed ``.npy``) is refused by its magic bytes.
"""

from __future__ import annotations

import math
import tokenize
import warnings
from collections.abc import Callable, Generator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import numpy as np

from perfgate.security.digests import Algorithm
from perfgate.tensors._errors import TensorInputError
from perfgate.tensors._mapped import ChunkedFile, ChunkStream
from perfgate.tensors.dtypes import category
from perfgate.tensors.entry import TensorEntry

__all__ = ["NpyFile", "NpyHeader", "read_npy_header"]

MAGIC = b"\x93NUMPY"
_MAX_HEADER_BYTES = 10_000


@dataclass(frozen=True)
class NpyHeader:
    dtype: np.dtype[Any]
    shape: tuple[int, ...]
    fortran_order: bool
    header_bytes: int
    """Bytes from the magic string to the first data byte."""

    @property
    def data_bytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize


NPY_HEADER_ERRORS: tuple[type[BaseException], ...] = (
    ValueError,
    TypeError,
    SyntaxError,
    tokenize.TokenError,
    RecursionError,
    OverflowError,
    EOFError,
)
"""What numpy's NPY header parser raises on a malformed header (it evaluates a Python literal)."""


@contextmanager
def quiet_py2_header() -> Generator[None]:
    """Silence numpy's warnings while it parses an NPY header (a header in Python 2 syntax, a deprecated
    dtype alias such as 'a'): the header is then checked like any other, and under ``-W error`` a
    warning would escape as an exception no caller expects. (`warnings.catch_warnings` is process-wide:
    at worst a concurrent thread's warning is not shown.)"""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        warnings.simplefilter("ignore", DeprecationWarning)
        yield


def read_npy_header(stream: IO[bytes], where: str) -> NpyHeader:
    """Parse the NPY header at the stream's position, refusing anything that is not plain numeric data.

    Raises:
        TensorInputError: not NPY, an unsupported format version, or a dtype that needs pickle or
            cannot be compared (strings, records, raw bytes).
    """
    start = stream.tell()
    if stream.read(len(MAGIC)) != MAGIC:
        raise TensorInputError(f"{where}: not an NPY array (bad magic bytes); only numeric NPY data is read")
    stream.seek(start)
    try:
        with quiet_py2_header():
            version = np.lib.format.read_magic(stream)
            if version == (1, 0):
                shape, fortran, dtype = np.lib.format.read_array_header_1_0(
                    stream, max_header_size=_MAX_HEADER_BYTES
                )
            elif version == (2, 0):
                shape, fortran, dtype = np.lib.format.read_array_header_2_0(
                    stream, max_header_size=_MAX_HEADER_BYTES
                )
            else:
                raise TensorInputError(
                    f"{where}: NPY format version {version} is not supported (1.0 and 2.0 are)"
                )
    except TensorInputError:
        raise
    except NPY_HEADER_ERRORS as exc:
        raise TensorInputError(f"{where}: malformed NPY header ({type(exc).__name__}: {exc})") from exc
    if dtype.hasobject:
        raise TensorInputError(
            f"{where}: object array (dtype {dtype}): reading it would need pickle, which is never done; "
            "save numeric arrays only"
        )
    if category(dtype) is None:
        raise TensorInputError(
            f"{where}: dtype {dtype} holds no comparable numbers (strings, records, raw bytes or extended "
            "precision); save numeric arrays (bool, int, float, complex), or safetensors for bfloat16/float8"
        )
    return NpyHeader(dtype, tuple(int(d) for d in shape), bool(fortran), stream.tell() - start)


class NpyFile:
    """A standalone ``.npy`` file; its one tensor is keyed by the file's stem."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._file = ChunkedFile(path)
        try:
            with self._file.stream() as f:
                self.header = read_npy_header(f, path.name)
            self._check_size()
        except BaseException:
            self._file.close()
            raise
        self.key = path.stem

    def _check_size(self) -> None:
        path = self.path
        available = self._file.size_bytes - self.header.header_bytes
        if available < self.header.data_bytes:
            raise TensorInputError(
                f"{path.name}: the header describes {self.header.data_bytes} data bytes but the file holds "
                f"{available}: the file is truncated"
            )
        if available > self.header.data_bytes:
            raise TensorInputError(
                f"{path.name}: {available - self.header.data_bytes} bytes after the array data: not a file "
                "numpy.save wrote"
            )

    def entries(self) -> list[TensorEntry]:
        h = self.header
        return [TensorEntry(self.key, h.dtype, h.shape, h.fortran_order, self.path)]

    def chunks(self, key: str, chunk_elements: int) -> ChunkStream:
        assert key == self.key
        h = self.header
        return self._file.chunks(h.header_bytes, h.dtype, math.prod(h.shape), chunk_elements)

    streams_digest = True
    """The comparison's reads feed the digest (see `start_digest`)."""

    def start_digest(self, algorithms: Sequence[Algorithm]) -> None:
        """Hash the file's bytes as the comparison reads them (see `ChunkedFile.start_digest`)."""
        self._file.start_digest(algorithms)

    def digest(self, on_chunk: Callable[[], None] | None = None) -> tuple[dict[Algorithm, str], int]:
        """Digests and size of the file as opened (see `ChunkedFile.digest`)."""
        return self._file.digest(on_chunk)

    def close(self) -> None:
        self._file.close()
