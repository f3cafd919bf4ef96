"""Sample ids as columns: ints and strings kept apart, so `1` and `"1"` never merge."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import cast

import numpy as np
from numpy.typing import NDArray

from perfgate.audit.errors import AuditInputError

__all__ = ["MAX_ID_CHARS", "IdValue", "SampleIds", "StringPool", "parse_text_id"]

IdValue = int | str
"""One sample id as written by the training run: an int, or a string that is never read as a number."""

_CANONICAL_INT = re.compile(r"-?(0|[1-9][0-9]*)")
_INT64_MIN = -(2**63)
_INT64_MAX = 2**63 - 1


def parse_text_id(text: str) -> IdValue:
    """Read an id from an untyped text cell (CSV, TXT).

    Text has no types, so a cell that is a canonical decimal integer (`42`, `-7`, not `042` or `+7`)
    within int64 is an int and anything else stays a string.
    """
    if _CANONICAL_INT.fullmatch(text):
        value = int(text)
        if _INT64_MIN <= value <= _INT64_MAX:
            return value
    return text


MAX_ID_CHARS = 4096
"""Longest string sample id accepted (paths and hashes are far shorter); a longer one is refused."""


class StringPool:
    """Interns string ids to dense codes shared by every file of one audit (observed and expected)."""

    def __init__(self) -> None:
        self._codes: dict[str, int] = {}
        self.strings: list[str] = []

    def __len__(self) -> int:
        return len(self.strings)

    def code(self, value: str) -> int:
        """The code of one string id, interning it on first sight."""
        code = self._codes.get(value)
        if code is None:
            if len(value) > MAX_ID_CHARS:
                raise AuditInputError(
                    f"a sample_id is {len(value)} characters long, over the limit of {MAX_ID_CHARS} "
                    f"(audit.ids.MAX_ID_CHARS), starting {value[:40]!r}: ids must be short keys (an index, a "
                    "path, a hash), not the sample itself"
                )
            code = len(self.strings)
            self._codes[value] = code
            self.strings.append(value)
        return code

    def codes(self, values: Iterable[str]) -> NDArray[np.int64]:
        """Codes for many string ids, in order."""
        return np.fromiter(map(self.code, values), dtype=np.int64)


@dataclass(frozen=True)
class SampleIds:
    """The sample ids of n records.

    `values[i]` is the id itself for an int record and a `StringPool` code for a string record.
    `is_str` marks string records; it is None when all records share one type, which `all_str` names.
    """

    values: NDArray[np.int64]
    is_str: NDArray[np.bool_] | None
    all_str: bool

    def __len__(self) -> int:
        return int(self.values.shape[0])

    @staticmethod
    def of_ints(values: NDArray[np.int64]) -> SampleIds:
        return SampleIds(values=values, is_str=None, all_str=False)

    @staticmethod
    def of_strings(codes: NDArray[np.int64]) -> SampleIds:
        return SampleIds(values=codes, is_str=None, all_str=True)

    @staticmethod
    def of_values(values: Sequence[IdValue], pool: StringPool) -> SampleIds:
        """Ids from Python values (each an int or a str); bool and other types are refused.

        Raises:
            TypeError: a value is neither int nor str.
            OverflowError: an int id does not fit in int64.
        """
        kinds = set(map(type, values))
        if kinds <= {int}:
            return SampleIds.of_ints(np.fromiter(values, dtype=np.int64, count=len(values)))
        if kinds == {str}:
            # every element was just seen to be a str
            return SampleIds.of_strings(pool.codes(cast("Sequence[str]", values)))
        if not kinds <= {int, str}:
            bad = sorted(k.__name__ for k in kinds - {int, str})
            raise TypeError(f"sample ids must be ints or strings, found {', '.join(bad)}")
        is_str = np.fromiter((type(v) is str for v in values), dtype=np.bool_, count=len(values))
        out = np.empty(len(values), dtype=np.int64)
        out[~is_str] = np.fromiter((v for v in values if type(v) is int), dtype=np.int64)
        out[is_str] = pool.codes(v for v in values if isinstance(v, str))
        return SampleIds(values=out, is_str=is_str, all_str=False)

    def str_mask(self) -> NDArray[np.bool_]:
        """Per-record mask of string ids (materialized)."""
        if self.is_str is not None:
            return self.is_str
        return np.full(len(self), self.all_str, dtype=np.bool_)

    def counts_by_type(self) -> tuple[int, int]:
        """(int records, string records)."""
        if self.is_str is None:
            return (0, len(self)) if self.all_str else (len(self), 0)
        n_str = int(np.count_nonzero(self.is_str))
        return len(self) - n_str, n_str

    def take(self, mask: NDArray[np.bool_]) -> SampleIds:
        """The ids of the records where mask is true."""
        is_str = None if self.is_str is None else self.is_str[mask]
        return SampleIds(values=self.values[mask], is_str=is_str, all_str=self.all_str)

    @staticmethod
    def concat(parts: Sequence[SampleIds]) -> SampleIds:
        """Ids of several chunks in order; the chunks must share one StringPool."""
        if not parts:
            return SampleIds.of_ints(np.empty(0, dtype=np.int64))
        values = np.concatenate([p.values for p in parts]) if len(parts) > 1 else parts[0].values
        kinds = {None if p.is_str is not None else p.all_str for p in parts if len(p)}
        if len(kinds) == 1 and None not in kinds:
            return SampleIds(values=values, is_str=None, all_str=kinds.pop() is True)
        if not kinds:
            return SampleIds.of_ints(values)
        is_str = np.concatenate([p.str_mask() for p in parts])
        return SampleIds(values=values, is_str=is_str, all_str=False)
