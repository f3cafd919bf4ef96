"""Interval arithmetic on numpy arrays: unions, their lengths, and overlaps.

Intervals are half-open ``[start, end)`` in microseconds; touching intervals merge.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

__all__ = [
    "clip",
    "difference",
    "difference_merged",
    "intersection_length",
    "merge",
    "merge_merged",
    "union_length",
]

F64 = npt.NDArray[np.float64]


def merge(start: F64, end: F64) -> tuple[F64, F64]:
    """Disjoint, sorted intervals covering the same time as the input ones."""
    if start.size == 0:
        return np.empty(0, np.float64), np.empty(0, np.float64)
    if bool(np.all(start[1:] >= start[:-1])):
        # Already in order (merged or time-ordered input): the stable sort would be the identity.
        return _sweep(start, np.array(end, np.float64))
    order = np.argsort(start, kind="stable")
    s = start[order]
    e = end[order]
    del order
    return _sweep(s, e)


def merge_merged(a_s: F64, a_e: F64, b_s: F64, b_e: F64) -> tuple[F64, F64]:
    """``merge`` of two sets of intervals that are each already merged (sorted by start), without
    concatenating and sorting them: B's intervals are placed among A's by binary search. The result
    equals ``merge(concatenate([a_s, b_s]), concatenate([a_e, b_e]))``."""
    n = a_s.size + b_s.size
    if n == 0:
        return np.empty(0, np.float64), np.empty(0, np.float64)
    # Where the stable sort of the concatenation puts each B interval: after A's with start <= its own.
    at = np.searchsorted(a_s, b_s, side="right")
    at += np.arange(b_s.size)
    from_a = np.ones(n, bool)
    from_a[at] = False
    s, e = np.empty(n, np.float64), np.empty(n, np.float64)
    s[at], e[at] = b_s, b_e
    del at
    s[from_a], e[from_a] = a_s, a_e
    del from_a
    return _sweep(s, e)


def _sweep(s: F64, e: F64) -> tuple[F64, F64]:
    """Merge intervals sorted by start (``e`` is overwritten)."""
    np.maximum.accumulate(e, out=e)
    # A new merged interval begins where a start lies beyond every earlier end.
    new = np.empty(s.size, dtype=bool)
    new[0] = True
    np.greater(s[1:], e[:-1], out=new[1:])
    starts = s[new]
    # Each merged interval ends at the running end just before the next one begins (masks, not index
    # arrays: a byte per interval instead of sixteen).
    new[:-1] = new[1:]
    new[-1] = True
    return starts, e[new]


def union_length(start: F64, end: F64) -> float:
    """Total time covered by at least one interval."""
    s, e = merge(start, end)
    return float(np.sum(e - s))


def intersection_length(a_start: F64, a_end: F64, b_start: F64, b_end: F64) -> float:
    """Time covered by both interval sets: |A| + |B| - |A ∪ B|."""
    a = union_length(a_start, a_end)
    b = union_length(b_start, b_end)
    both = union_length(np.concatenate([a_start, b_start]), np.concatenate([a_end, b_end]))
    return max(0.0, a + b - both)


def difference(a_start: F64, a_end: F64, b_start: F64, b_end: F64) -> tuple[F64, F64]:
    """Disjoint, sorted intervals covering the time of A that B does not cover."""
    a_s, a_e = merge(a_start, a_end)
    if a_s.size == 0 or b_start.size == 0:
        return a_s, a_e
    return difference_merged(a_s, a_e, *merge(b_start, b_end))


def difference_merged(a_s: F64, a_e: F64, b_s: F64, b_e: F64) -> tuple[F64, F64]:
    """`difference` of two sets that are each already merged (as `merge` returns them), with A not
    empty: the same result without merging them again."""
    if bool(np.all(a_e > a_s)) and bool(np.all(b_e > b_s)):
        b_s, b_e = _cutting(a_s, a_e, b_s, b_e)
    bounds = np.unique(np.concatenate([a_s, a_e, b_s, b_e]))
    lo, hi = bounds[:-1], bounds[1:]
    mid = (lo + hi) / 2

    def covered(s: F64, e: F64) -> npt.NDArray[np.bool_]:
        if s.size == 0:
            return np.zeros(mid.size, bool)
        i = np.searchsorted(s, mid, side="right") - 1
        return (i >= 0) & (e[np.maximum(i, 0)] > mid)

    keep = covered(a_s, a_e) & ~covered(b_s, b_e)
    return merge(lo[keep], hi[keep])


def _cutting(a_s: F64, a_e: F64, b_s: F64, b_e: F64) -> tuple[F64, F64]:
    """The merged B intervals that can change `difference` of merged A: those that overlap an A
    interval, and those with a bound one float below an A start (where the midpoint test of a
    one-ulp piece rounds into A). The others' bounds lie in A's gaps, where nothing is kept; B can be
    far larger than A, and this spares sorting it."""
    last_a = np.searchsorted(a_s, b_e, side="left") - 1
    keep = last_a >= 0
    keep &= a_e[np.maximum(last_a, 0)] > b_s
    del last_a
    below = np.nextafter(a_s, -np.inf)  # ascending, as A's starts are
    keep |= _member(b_s, below)
    keep |= _member(b_e, below)
    return b_s[keep], b_e[keep]


def _member(values: F64, ascending: F64) -> npt.NDArray[np.bool_]:
    """``np.isin(values, ascending)`` for a sorted, non-empty ``ascending``, by binary search: a few
    bytes per value where isin's sort holds dozens."""
    at = np.searchsorted(ascending, values)
    np.minimum(at, ascending.size - 1, out=at)
    found: npt.NDArray[np.bool_] = ascending[at] == values
    return found


def clip(start: F64, end: F64, lo: float, hi: float) -> tuple[F64, F64]:
    """The intervals cut to ``[lo, hi)``; empty ones dropped."""
    s, e = np.maximum(start, lo), np.minimum(end, hi)
    keep = e > s
    return s[keep], e[keep]
