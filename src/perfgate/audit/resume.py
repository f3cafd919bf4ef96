"""Resume boundaries: where a writer restarted, which records the restart rolled back or replayed.

A boundary is a record, within one (rank, worker) stream in file order, that carries a restart
marker, a new session token, an earlier epoch, or an earlier step in the same epoch. Across a
boundary inside one (epoch, rank):
- records before it with a step at or after the first step after it were rolled back (their
  updates were lost with the crash) and are left out of coverage;
- records after it that repeat an id kept from before it are replays: the run saw them twice;
- steps between the last kept step and the first step after it were skipped.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

__all__ = ["ResumeFindings", "ResumeGroup", "find_resumes"]


@dataclass(frozen=True)
class ResumeGroup:
    """One (epoch, rank) with records from more than one writer session."""

    epoch: int
    rank: int
    boundaries: int
    rolled_back: int
    replayed: int
    replayed_ids: int
    skipped_steps: int


@dataclass(frozen=True)
class ResumeFindings:
    rolled_back: NDArray[np.bool_]
    """Per record: left out of coverage."""
    replayed: NDArray[np.bool_]
    """Per record: repeats an id this rank kept from before a boundary in the same epoch."""
    groups: list[ResumeGroup]
    boundaries: int


_CHUNK = 1 << 22
"""Records examined at a time: the stream scan's memory is bounded by this, not by the input."""


@dataclass
class _Carry:
    """Per owner: the last record seen in earlier chunks, and its stream's segment count."""

    seen: NDArray[np.bool_]
    epoch: NDArray[np.int64]
    step: NDArray[np.int64]
    session: NDArray[np.int64]
    segment: NDArray[np.int32]

    @staticmethod
    def empty(n_owners: int) -> _Carry:
        return _Carry(
            seen=np.zeros(n_owners, dtype=np.bool_),
            epoch=np.zeros(n_owners, dtype=np.int64),
            step=np.zeros(n_owners, dtype=np.int64),
            session=np.zeros(n_owners, dtype=np.int64),
            segment=np.zeros(n_owners, dtype=np.int32),
        )


def _segments(
    epoch: NDArray[np.int32],
    owner: NDArray[np.int32],
    n_owners: int,
    step: NDArray[np.int64] | None,
    session: NDArray[np.int64] | None,
    restart: NDArray[np.bool_] | None,
) -> tuple[NDArray[np.int32] | None, int]:
    """Per record, the boundaries before it in its owner's stream; None when there are none."""
    n = int(epoch.shape[0])
    carry = _Carry.empty(n_owners)
    segment: NDArray[np.int32] | None = None
    boundaries = 0
    for lo in range(0, n, _CHUNK):
        hi = min(n, lo + _CHUNK)
        # numpy sorts 16-bit keys stably by radix, in linear time
        key = owner[lo:hi]
        perm = np.argsort(key.astype(np.uint16) if n_owners <= (1 << 16) else key, kind="stable")
        o = key[perm]
        e = epoch[lo:hi][perm].astype(np.int64)
        st = None if step is None else step[lo:hi][perm]
        se = None if session is None else session[lo:hi][perm]
        start = np.ones(hi - lo, dtype=np.bool_)
        start[1:] = o[1:] != o[:-1]
        # the record before each one in its stream: the previous element, or the carried last one
        prev_e = np.empty_like(e)
        prev_e[1:] = e[:-1]
        prev_e[start] = carry.epoch[o[start]]
        has_prev = np.ones(hi - lo, dtype=np.bool_)
        has_prev[start] = carry.seen[o[start]]
        cut = e < prev_e
        if st is not None:
            prev_st = np.empty_like(st)
            prev_st[1:] = st[:-1]
            prev_st[start] = carry.step[o[start]]
            cut |= (e == prev_e) & (st < prev_st)
        if se is not None:
            prev_se = np.empty_like(se)
            prev_se[1:] = se[:-1]
            prev_se[start] = carry.session[o[start]]
            cut |= se != prev_se
        if restart is not None:
            cut |= restart[lo:hi][perm]
        cut &= has_prev
        ends = np.flatnonzero(np.append(start[1:], True))
        last = o[ends]
        carry.seen[last] = True
        carry.epoch[last] = e[ends]
        if st is not None:
            carry.step[last] = st[ends]
        if se is not None:
            carry.session[last] = se[ends]
        if not cut.any() and segment is None:
            continue
        boundaries += int(np.count_nonzero(cut))
        if segment is None:
            segment = np.zeros(n, dtype=np.int32)
        counted = np.cumsum(cut, dtype=np.int32)
        run = np.cumsum(start) - 1
        before = (counted - cut)[start]
        seg = carry.segment[o[start]][run] + counted - before[run]
        carry.segment[last] = seg[ends]
        segment[lo + perm] = seg
    return segment, boundaries


def find_resumes(
    codes: NDArray[np.integer[Any]],
    epoch: NDArray[np.int32],
    rank: NDArray[np.int32],
    owner: NDArray[np.int32],
    n_owners: int,
    step: NDArray[np.int64] | None,
    session: NDArray[np.int64] | None,
    restart: NDArray[np.bool_] | None,
) -> ResumeFindings | None:
    """Find resume boundaries and their effect; None when no stream has a boundary."""
    segment, boundaries = _segments(epoch, owner, n_owners, step, session, restart)
    if segment is None:
        return None
    n = int(codes.shape[0])
    key = epoch.astype(np.int64) * (int(rank.max()) + 1) + rank
    resumed_keys = np.unique(key[segment > 0])
    chosen = np.flatnonzero(np.isin(key, resumed_keys))
    chosen = chosen[np.argsort(key[chosen], kind="stable")]
    edges = np.flatnonzero(key[chosen][1:] != key[chosen][:-1]) + 1
    rolled_back = np.zeros(n, dtype=np.bool_)
    replayed = np.zeros(n, dtype=np.bool_)
    groups: list[ResumeGroup] = []
    for idx in np.split(chosen, edges):
        group = _resolve(idx, codes, segment, step, rolled_back, replayed)
        if group is not None:
            groups.append(ResumeGroup(epoch=int(epoch[idx[0]]), rank=int(rank[idx[0]]), **group))
    return ResumeFindings(rolled_back=rolled_back, replayed=replayed, groups=groups, boundaries=boundaries)


def _resolve(
    idx: NDArray[np.intp],
    codes: NDArray[np.integer[Any]],
    segment: NDArray[np.int32],
    step: NDArray[np.int64] | None,
    rolled_back: NDArray[np.bool_],
    replayed: NDArray[np.bool_],
) -> dict[str, int] | None:
    seg = segment[idx]
    levels = np.unique(seg)
    if levels.shape[0] < 2:
        return None
    c = codes[idx]
    st = None if step is None else step[idx]
    kept = np.ones(idx.shape[0], dtype=np.bool_)
    rep = np.zeros(idx.shape[0], dtype=np.bool_)
    skipped = 0
    for level in levels[1:].tolist():
        post = seg == level
        prior = kept & (seg < level)
        if st is not None:
            first = int(st[post].min())
            lost = prior & (st >= first)
            kept &= ~lost
            prior &= ~lost
            if prior.any():
                skipped += max(0, first - int(st[prior].max()) - 1)
        rep |= post & np.isin(c, c[prior])
    rep &= kept  # a replay that a later restart rolled back again never reached the model
    rolled_back[idx[~kept]] = True
    replayed[idx[rep]] = True
    return {
        "boundaries": int(levels.shape[0] - 1),
        "rolled_back": int(np.count_nonzero(~kept)),
        "replayed": int(np.count_nonzero(rep)),
        "replayed_ids": int(np.unique(c[rep]).shape[0]),
        "skipped_steps": skipped,
    }
