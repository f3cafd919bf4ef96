"""Dense integer codes for sample ids, so coverage is counted with bincount and sorts, not sets.

Int ids code as `id - base` inside `[base, base + span)` and as `span + k` for the k-th other
distinct int; string ids code after every int code. An int and a string never share a code.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from perfgate.audit.expected import ExpectedIds, IdRange
from perfgate.audit.ids import IdValue, SampleIds, StringPool

__all__ = ["IdCodes", "encode_ids"]

_DENSE_SLACK = 4
"""Int ids are coded by offset when their span is at most this many times their count."""


@dataclass(frozen=True)
class IdCodes:
    """Codes of the observed records and the expected set in one code space."""

    codes: NDArray[np.int32] | NDArray[np.int64]
    """Per observed record, in [0, n_codes); int32 when n_codes allows (half the memory)."""
    n_codes: int
    expected_count: int | None
    """Distinct expected ids; None when no expected set was given."""
    expected_duplicates: int
    """Expected ids listed more than once."""
    base: int
    span: int
    outside: NDArray[np.int64]
    pool: StringPool
    _expected_mask: NDArray[np.bool_] | None
    _range_expected: bool

    @property
    def expected_mask(self) -> NDArray[np.bool_] | None:
        """Per code: expected, for an expected list; None for a range (codes [0, span)) or no set."""
        return self._expected_mask

    @property
    def n_int_codes(self) -> int:
        return self.span + int(self.outside.shape[0])

    def is_expected(self, codes: NDArray[np.int64]) -> NDArray[np.bool_]:
        """Per code: is it in the expected set (all False without one)."""
        if self._range_expected:
            return codes < self.span
        if self._expected_mask is not None:
            return self._expected_mask[codes]
        return np.zeros(codes.shape, dtype=np.bool_)

    def expected_codes(self, limit: int, present: NDArray[np.int64]) -> NDArray[np.int64]:
        """Up to `limit` smallest expected codes that are not in `present` (sorted, unique)."""
        if self.expected_count is None or limit <= 0:
            return np.empty(0, dtype=np.int64)
        if self._range_expected:
            # at most len(present) codes of [0, m) are present, so m = that + limit suffices
            stop = min(self.span, int(present.shape[0]) + limit)
            candidates = np.arange(stop, dtype=np.int64)
        else:
            assert self._expected_mask is not None
            candidates = np.flatnonzero(self._expected_mask).astype(np.int64)
        return candidates[~np.isin(candidates, present, assume_unique=True)][:limit]

    def decode(self, codes: Sequence[int] | NDArray[np.int64]) -> list[IdValue]:
        """The original ids of some codes (ints stay ints, strings stay strings)."""
        n_int = self.n_int_codes
        out: list[IdValue] = []
        as_list: list[int] = np.asarray(codes, dtype=np.int64).tolist()
        for code in as_list:
            if code < self.span:
                out.append(self.base + code)
            elif code < n_int:
                out.append(int(self.outside[code - self.span]))
            else:
                out.append(self.pool.strings[code - n_int])
        return out


def encode_ids(observed: SampleIds, pool: StringPool, expected: ExpectedIds | None) -> IdCodes:
    """Code observed ids (and the expected set) densely; O(n) when ids are compact ints or a range."""
    str_mask = observed.is_str
    obs_ints = observed.values if str_mask is None else observed.values[~str_mask]
    if observed.all_str:
        obs_ints = np.empty(0, dtype=np.int64)
    exp_ids = expected if isinstance(expected, SampleIds) else None
    exp_ints = np.empty(0, dtype=np.int64)
    if exp_ids is not None and not exp_ids.all_str:
        exp_ints = exp_ids.values if exp_ids.is_str is None else exp_ids.values[~exp_ids.is_str]
    base, span, outside = _int_layout(obs_ints, exp_ints, expected if isinstance(expected, IdRange) else None)
    n_int = span + int(outside.shape[0])

    n_codes = n_int + len(pool)
    wide = _code_ids(observed, base, span, outside, n_int)
    codes = wide.astype(np.int32) if n_codes <= np.iinfo(np.int32).max else wide
    del wide
    expected_mask: NDArray[np.bool_] | None = None
    expected_count: int | None = None
    duplicates = 0
    if isinstance(expected, IdRange):
        expected_count = len(expected)
    elif exp_ids is not None:
        expected_mask = np.zeros(n_codes, dtype=np.bool_)
        expected_mask[_code_ids(exp_ids, base, span, outside, n_int)] = True
        expected_count = int(np.count_nonzero(expected_mask))
        duplicates = len(exp_ids) - expected_count
    return IdCodes(
        codes=codes,
        n_codes=n_codes,
        expected_count=expected_count,
        expected_duplicates=duplicates,
        base=base,
        span=span,
        outside=outside,
        pool=pool,
        _expected_mask=expected_mask,
        _range_expected=isinstance(expected, IdRange),
    )


def _int_layout(
    obs: NDArray[np.int64], exp: NDArray[np.int64], id_range: IdRange | None
) -> tuple[int, int, NDArray[np.int64]]:
    """(base, span, sorted distinct ints outside [base, base + span))."""
    if id_range is not None:
        stray = obs[(obs < id_range.start) | (obs >= id_range.stop)]
        return id_range.start, len(id_range), np.unique(stray)
    count = int(obs.shape[0]) + int(exp.shape[0])
    if count == 0:
        return 0, 0, np.empty(0, dtype=np.int64)
    lo = min(int(a.min()) for a in (obs, exp) if a.shape[0])
    hi = max(int(a.max()) for a in (obs, exp) if a.shape[0])
    if hi - lo + 1 <= _DENSE_SLACK * count + 1024:
        return lo, hi - lo + 1, np.empty(0, dtype=np.int64)
    return 0, 0, np.unique(np.concatenate([obs, exp]))


def _code_ids(
    ids: SampleIds, base: int, span: int, outside: NDArray[np.int64], n_int: int
) -> NDArray[np.int64]:
    if ids.all_str:
        return ids.values + n_int
    if ids.is_str is None:
        return _code_ints(ids.values, base, span, outside)
    out = np.empty(len(ids), dtype=np.int64)
    out[~ids.is_str] = _code_ints(ids.values[~ids.is_str], base, span, outside)
    out[ids.is_str] = ids.values[ids.is_str] + n_int
    return out


def _code_ints(
    values: NDArray[np.int64], base: int, span: int, outside: NDArray[np.int64]
) -> NDArray[np.int64]:
    if span == 0:
        return np.searchsorted(outside, values).astype(np.int64, copy=False)
    codes = values - base
    inside = (codes >= 0) & (codes < span)
    if not inside.all():
        stray = ~inside
        codes[stray] = span + np.searchsorted(outside, values[stray])
    return codes
