"""Read a region of a file through a read-only memory map, chunk by chunk, in bounded memory.

Pages of a file mapping count towards the process's resident set while they stay mapped, so reading a
checkpoint straight through a map would make RSS grow to the checkpoint's size. After each chunk the
pages behind it are dropped from this process (``MADV_DONTNEED``); they stay in the page cache, so
nothing is read twice from disk, but RSS stays at a few chunks.
"""

from __future__ import annotations

import contextlib
import mmap
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol

import numpy as np

__all__ = ["ChunkStream", "MappedChunks", "MappedFile", "OwnedChunks"]

_PAGE = mmap.PAGESIZE
_DONTNEED: int | None = getattr(mmap, "MADV_DONTNEED", None)
_SEQUENTIAL: int | None = getattr(mmap, "MADV_SEQUENTIAL", None)


class MappedFile:
    """A whole file mapped read-only (files of zero bytes are not mapped: they hold no elements)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        with path.open("rb") as f:
            self.size_bytes = os.fstat(f.fileno()).st_size
            self._map: mmap.mmap | None = None
            if self.size_bytes > 0:
                self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
                if _SEQUENTIAL is not None:
                    self._map.madvise(_SEQUENTIAL)

    def read_bytes(self, offset: int, length: int) -> bytes:
        """A copy of ``length`` bytes at ``offset`` (for headers; bounds were checked by the caller)."""
        assert self._map is not None and offset >= 0 and offset + length <= self.size_bytes
        return self._map[offset : offset + length]

    def chunks(self, offset: int, dtype: np.dtype[Any], count: int, chunk_elements: int) -> MappedChunks:
        """1-D views of ``count`` elements of ``dtype`` starting at byte ``offset``, ``chunk_elements`` at a time."""
        assert offset + count * dtype.itemsize <= self.size_bytes
        return MappedChunks(self, offset, dtype, count, chunk_elements)

    def _release(self, begin: int, end: int) -> None:
        if _DONTNEED is not None and self._map is not None and end > begin:
            self._map.madvise(_DONTNEED, begin, end - begin)

    def close(self) -> None:
        if self._map is None:
            return
        mapping, self._map = self._map, None
        # A caller still holding a view keeps the mapping alive; it is unmapped when that view is collected.
        with contextlib.suppress(BufferError):
            mapping.close()


class ChunkStream(Protocol):
    """Consecutive 1-D pieces of one tensor in storage order; all but the last have the same length.

    A piece may be a view into a memory map. The consumer calls ``release(n)`` once it no longer needs
    the first ``n`` elements, which lets a mapped stream drop those pages from the process.
    """

    def __iter__(self) -> Iterator[np.ndarray]: ...
    def release(self, elements_done: int) -> None: ...


class MappedChunks:
    """A `ChunkStream` over a region of a `MappedFile`."""

    def __init__(self, file: MappedFile, offset: int, dtype: np.dtype[Any], count: int, chunk_elements: int):
        self._file = file
        self._offset = offset
        self._dtype = dtype
        self._count = count
        self._chunk = chunk_elements
        self._released = offset // _PAGE * _PAGE

    def __iter__(self) -> Iterator[np.ndarray]:
        mapping = self._file._map  # pyright: ignore[reportPrivateUsage]  # the stream is part of the file
        for start in range(0, self._count, self._chunk):
            n = min(self._chunk, self._count - start)
            assert mapping is not None
            yield np.frombuffer(
                mapping, dtype=self._dtype, count=n, offset=self._offset + start * self._dtype.itemsize
            )

    def release(self, elements_done: int) -> None:
        # Whole pages only: the page holding the next element stays (a later chunk still reads it).
        end = (self._offset + elements_done * self._dtype.itemsize) // _PAGE * _PAGE
        self._file._release(self._released, end)  # pyright: ignore[reportPrivateUsage]  # same module
        self._released = max(self._released, end)


class OwnedChunks:
    """A `ChunkStream` of arrays the stream created itself (nothing to release)."""

    def __init__(self, chunks: Iterator[np.ndarray]) -> None:
        self._chunks = chunks

    def __iter__(self) -> Iterator[np.ndarray]:
        return self._chunks

    def release(self, elements_done: int) -> None:
        return None
