"""Hand memory the allocator holds but no longer uses back to the operating system (glibc only).

Reading a trace allocates and frees millions of small objects and thousands of buffers batch by batch,
interleaved with the columns that are kept. glibc keeps the freed pages (its heap cannot shrink below
a live allocation, and its mmap threshold rises after large frees), so resident memory grew to about
twice the kept columns. ``malloc_trim(0)`` returns every free page, wherever it sits in the heap; it
costs a few milliseconds, so the reader calls it every `TRIM_EVERY_BYTES` of JSON and between phases.
Elsewhere (musl, macOS) it does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from functools import cache
from typing import Any

__all__ = ["TRIM_EVERY_BYTES", "TRIM_ROWS", "release_for", "release_free_memory"]

TRIM_EVERY_BYTES = 48 << 20
"""Decoded JSON between two trims while a trace is read."""
TRIM_ROWS = 1 << 20
"""Rows (8 MB per float64 column) from which an analysis returns freed memory between its passes: freed
temporaries stay resident until trimmed, and the next pass's arrays land on fresh pages beside them."""


@cache
def _trim() -> Any:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        return ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):  # not glibc
        return None


def release_free_memory() -> bool:
    """Return freed heap pages to the OS; False where the C library has no ``malloc_trim``."""
    trim = _trim()
    if trim is None:
        return False
    trim(0)
    return True


def release_for(rows: int) -> None:
    """`release_free_memory` when an analysis works on at least `TRIM_ROWS` rows (a no-op below: the
    few milliseconds a trim costs are not worth it for small traces)."""
    if rows >= TRIM_ROWS:
        release_free_memory()
