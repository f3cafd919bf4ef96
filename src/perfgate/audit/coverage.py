"""Coverage of one epoch: counts per id, missing and extra ids, duplicates and who saw them."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from perfgate.audit.codes import IdCodes

__all__ = ["EpochCoverage", "OwnerTable", "epoch_coverage"]


@dataclass(frozen=True)
class OwnerTable:
    """Dense owner index -> (rank, worker); an owner is one process that recorded ids."""

    rank: NDArray[np.int64]
    worker: NDArray[np.int64]

    def __len__(self) -> int:
        return int(self.rank.shape[0])


@dataclass(frozen=True)
class EpochCoverage:
    """Counts are complete; example codes are capped."""

    records: int
    unique: int
    duplicates: int
    """Records that repeat an id already seen this epoch (records - unique)."""
    duplicate_ids: int
    cross_owner_ids: int
    """Distinct ids seen by more than one (rank, worker)."""
    cross_rank_repeats: int
    """Repeats of an id on a rank other than those that had it, replayed records left out."""
    same_rank_repeats: int
    """Repeats of an id on a rank that already had it, replayed records left out."""
    missing: int | None
    extra_ids: int | None
    extra_records: int | None
    records_per_rank: NDArray[np.int64]
    missing_examples: NDArray[np.int64]
    extra_examples: NDArray[np.int64]
    duplicate_examples: list[tuple[int, int, list[tuple[int, int, int]]]]
    """(code, count, [(rank, worker, count)]) for the first duplicated ids."""


def epoch_coverage(
    ids: IdCodes,
    codes: NDArray[np.int64],
    rank: NDArray[np.int32],
    owner: NDArray[np.int32],
    replayed: NDArray[np.bool_] | None,
    owners: OwnerTable,
    world_size: int,
    limit: int,
) -> EpochCoverage:
    """Coverage of one epoch's effective records (rolled-back records already removed)."""
    n = int(codes.shape[0])
    if ids.n_codes <= 2 * n + (1 << 20):
        tally = _tally_dense(ids, np.bincount(codes, minlength=ids.n_codes), limit)
    else:
        tally = _tally_sparse(ids, codes, limit)
    unique, dup_codes = tally.unique, tally.dup_codes
    missing, extra_ids, extra_records = tally.missing, tally.extra_ids, tally.extra_records
    missing_examples, extra_examples = tally.missing_examples, tally.extra_examples

    if dup_codes.shape[0]:
        in_dup = tally.in_dup(codes)
        c_d, o_d, r_d = codes[in_dup], owner[in_dup].astype(np.int64), rank[in_dup].astype(np.int64)
        cross_owner_ids = _ids_with_many(c_d, o_d, len(owners))
        c_all = c_d
        if replayed is not None:
            keep = ~replayed[in_dup]
            c_d, r_d = c_d[keep], r_d[keep]
        distinct = int(np.unique(c_d).shape[0])
        rank_pairs = int(np.unique(c_d * (world_size + 1) + r_d).shape[0])
        cross_rank = rank_pairs - distinct
        same_rank = int(c_d.shape[0]) - rank_pairs
        examples = _duplicate_examples(c_all, o_d, dup_codes[:limit], owners)
    else:
        cross_owner_ids = cross_rank = same_rank = 0
        examples = []
    return EpochCoverage(
        records=n,
        unique=unique,
        duplicates=n - unique,
        duplicate_ids=int(dup_codes.shape[0]),
        cross_owner_ids=cross_owner_ids,
        cross_rank_repeats=cross_rank,
        same_rank_repeats=same_rank,
        missing=missing,
        extra_ids=extra_ids,
        extra_records=extra_records,
        records_per_rank=np.bincount(rank, minlength=world_size).astype(np.int64),
        missing_examples=missing_examples,
        extra_examples=extra_examples,
        duplicate_examples=examples,
    )


@dataclass(frozen=True)
class _Tally:
    unique: int
    dup_codes: NDArray[np.int64]
    missing: int | None
    extra_ids: int | None
    extra_records: int | None
    missing_examples: NDArray[np.int64]
    extra_examples: NDArray[np.int64]
    repeated: NDArray[np.bool_] | None
    """Per code (dense tallies): seen more than once."""

    def in_dup(self, codes: NDArray[np.int64]) -> NDArray[np.bool_]:
        """Per record: its id is seen more than once."""
        if self.repeated is not None:
            return self.repeated[codes]
        return np.isin(codes, self.dup_codes)


_NONE = np.empty(0, dtype=np.int64)


def _first(mask: NDArray[np.bool_], limit: int, offset: int = 0) -> NDArray[np.int64]:
    """The first `limit` indices where mask is true, without listing all of them."""
    found: list[NDArray[np.int64]] = []
    total = 0
    step = 1 << 20
    for lo in range(0, int(mask.shape[0]), step):
        if total >= limit:
            break
        hit = np.flatnonzero(mask[lo : lo + step])[: limit - total].astype(np.int64) + (lo + offset)
        found.append(hit)
        total += int(hit.shape[0])
    return np.concatenate(found) if found else _NONE


def _tally_dense(ids: IdCodes, counts: NDArray[np.int64], limit: int) -> _Tally:
    """From a count per code (bincount): no array as long as the ids seen is built."""
    seen = counts > 0
    repeated = counts > 1
    unique = int(np.count_nonzero(seen))
    base = _Tally(unique, np.flatnonzero(repeated).astype(np.int64), None, None, None, _NONE, _NONE, repeated)
    if ids.expected_count is None:
        return base
    if ids.expected_mask is None:  # the expected ids are the codes [0, span)
        span = ids.span
        wanted_seen = int(np.count_nonzero(seen[:span]))
        extra_records = int(counts[span:].sum())
        missing_examples = _first(~seen[:span], limit)
        extra_examples = _first(seen[span:], limit, offset=span)
    else:
        wanted = ids.expected_mask
        wanted_seen = int(np.count_nonzero(seen & wanted))
        extra = seen & ~wanted
        extra_records = int(counts[extra].sum())
        missing_examples = _first(wanted & ~seen, limit)
        extra_examples = _first(extra, limit)
    return _Tally(
        unique=unique,
        dup_codes=base.dup_codes,
        missing=ids.expected_count - wanted_seen,
        extra_ids=unique - wanted_seen,
        extra_records=extra_records,
        missing_examples=missing_examples,
        extra_examples=extra_examples,
        repeated=repeated,
    )


def _tally_sparse(ids: IdCodes, codes: NDArray[np.int64], limit: int) -> _Tally:
    """From the sorted distinct codes: when the code space is much larger than the epoch."""
    present, counts = np.unique(codes, return_counts=True)
    unique = int(present.shape[0])
    dup_codes = present[counts > 1]
    if ids.expected_count is None:
        return _Tally(unique, dup_codes, None, None, None, _NONE, _NONE, None)
    wanted = ids.is_expected(present)
    n_wanted = int(np.count_nonzero(wanted))
    missing = ids.expected_count - n_wanted
    return _Tally(
        unique=unique,
        dup_codes=dup_codes,
        missing=missing,
        extra_ids=unique - n_wanted,
        extra_records=int(counts[~wanted].sum()),
        missing_examples=ids.expected_codes(limit, present) if missing else _NONE,
        extra_examples=present[~wanted][:limit],
        repeated=None,
    )


def _ids_with_many(codes: NDArray[np.int64], owner: NDArray[np.int64], n_owners: int) -> int:
    """How many distinct codes occur with more than one owner."""
    pair_codes = np.unique(codes * n_owners + owner) // n_owners  # sorted by code
    repeated = pair_codes[1:][pair_codes[1:] == pair_codes[:-1]]
    if not repeated.shape[0]:
        return 0
    return int(np.count_nonzero(repeated[1:] != repeated[:-1])) + 1


def _duplicate_examples(
    codes: NDArray[np.int64], owner: NDArray[np.int64], chosen: NDArray[np.int64], owners: OwnerTable
) -> list[tuple[int, int, list[tuple[int, int, int]]]]:
    sel = np.isin(codes, chosen)
    keys, counts = np.unique(codes[sel] * len(owners) + owner[sel], return_counts=True)
    by_code: dict[int, list[tuple[int, int, int]]] = {}
    for key, count in zip(keys.tolist(), counts.tolist(), strict=True):
        code, own = divmod(key, len(owners))
        by_code.setdefault(code, []).append((int(owners.rank[own]), int(owners.worker[own]), count))
    return [(code, sum(c for _, _, c in by_code[code]), by_code[code]) for code in chosen.tolist()]
