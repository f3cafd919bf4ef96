"""Linear-time grouping of integer keys (names, categories, rows, correlation ids are dense small ints).

``np.unique`` sorts: O(n log n), and at a million-event scale the sort dominated the analyses. Keys
that span a modest range are grouped with a lookup table instead (one pass to mark, one cumulative
sum over the range, one gather): O(n + range). Wider keys fall back to ``np.unique``. Results equal
``np.unique``'s (sorted unique values; inverse indexes into them).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = ["TABLE_LIMIT", "pair_keys", "unique_counts", "unique_inverse", "unique_values"]

I64 = npt.NDArray[np.int64]

TABLE_LIMIT = 1 << 24
"""Widest key range grouped by a lookup table (a 16 M-entry table: ~150 MB at most, briefly)."""


def _range(key: npt.NDArray[np.integer[Any]]) -> tuple[int, int] | None:
    """(lowest, range) when the keys fit a lookup table, else None."""
    if key.size == 0:
        return None
    lo, hi = int(key.min()), int(key.max())
    span = hi - lo + 1
    if span > TABLE_LIMIT or span > 4 * key.size + 1024:
        # A table much larger than the keys costs more than sorting them.
        return None
    return lo, span


def unique_values(key: npt.NDArray[np.integer[Any]]) -> I64:
    """``np.unique(key)`` as int64."""
    found = _range(key)
    if found is None:
        return np.unique(key).astype(np.int64)
    lo, span = found
    present = np.zeros(span, bool)
    present[np.subtract(key, lo, dtype=np.int64)] = True
    return np.flatnonzero(present) + lo


def unique_inverse(key: npt.NDArray[np.integer[Any]]) -> tuple[I64, I64]:
    """``np.unique(key, return_inverse=True)`` as int64 arrays."""
    found = _range(key)
    if found is None:
        unique, inverse = np.unique(key, return_inverse=True)
        return unique.astype(np.int64), inverse.astype(np.int64).ravel()
    lo, span = found
    shifted = np.subtract(key, lo, dtype=np.int64)
    present = np.zeros(span, bool)
    present[shifted] = True
    index = np.cumsum(present, dtype=np.int64) - 1
    return np.flatnonzero(present) + lo, index[shifted]


def unique_counts(key: npt.NDArray[np.integer[Any]]) -> tuple[I64, I64]:
    """``np.unique(key, return_counts=True)`` as int64 arrays."""
    found = _range(key)
    if found is None:
        unique, counts = np.unique(key, return_counts=True)
        return unique.astype(np.int64), counts.astype(np.int64)
    lo, span = found
    counts = np.bincount(np.subtract(key, lo, dtype=np.int64), minlength=span)
    present = np.flatnonzero(counts)
    return present + lo, counts[present].astype(np.int64)


def pair_keys(major: npt.NDArray[np.integer[Any]], minor: npt.NDArray[np.integer[Any]]) -> I64:
    """One int64 key per (major, minor) pair (a stream: (device, stream id)): equal exactly when both are,
    ordered as the pairs are. Never wraps or collides, whatever ids a trace holds: a mixed-radix number
    over the ids' ranges when it fits, else the pairs' ranks."""
    if major.size == 0:
        return np.empty(0, np.int64)
    lo, hi = int(major.min()), int(major.max())
    minor_lo, minor_hi = int(minor.min()), int(minor.max())
    width = minor_hi - minor_lo + 1
    if (hi - lo + 1) * width <= 1 << 62:
        high = np.subtract(major, lo, dtype=np.int64) * width
        key: I64 = high + np.subtract(minor, minor_lo, dtype=np.int64)
        return key
    _, ranks = np.unique(np.stack([major, minor], axis=1), axis=0, return_inverse=True)
    return ranks.astype(np.int64).ravel()
