"""Two owners reading one shard: the same id at the same position of the epoch in two (rank, worker) streams.

Sampling with replacement repeats ids, but by chance, at scattered positions; a rank or worker given the
wrong rank or world size (or an IterableDataset that does not split its stream by worker) reads another
owner's shard in the same order, so the same ids line up position by position. The check compares what is
seen at each position with what chance explains (the repeats one draw in ``n_ids`` predicts), so a few
chance coincidences of sampling with replacement pass and a duplicated shard fails whatever the policy.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

__all__ = ["MIN_ALIGNED", "P_CHANCE", "P_CHANCE_MOST", "ShardRepeats", "aligned_repeats"]

MIN_ALIGNED = 2
"""Fewer aligned repeats than this are never a duplicated shard (one coincidence is chance)."""
P_CHANCE = 1e-6
"""Aligned repeats this unlikely under independent draws (a Poisson tail) are a duplicated shard."""
P_CHANCE_MOST = 1e-2
"""...and so are repeats at half or more of the shared positions at this likelihood (small epochs)."""


def _tail(k: int, mean: float) -> float:
    """P(X >= k) for X ~ Poisson(mean)."""
    if k <= 0:
        return 1.0
    if mean <= 0:
        return 0.0
    if k > mean + 40 * math.sqrt(mean) + 60:
        return 0.0
    term = math.exp(-mean)
    below = 0.0
    for i in range(k):
        below += term
        term *= mean / (i + 1)
    return max(0.0, 1.0 - below)


@dataclass(frozen=True)
class ShardRepeats:
    aligned: int
    """Positions at which two or more owners hold the same id."""
    chance: float
    """Aligned repeats expected by chance from independent draws over ``n_ids`` ids."""
    shared_positions: int
    """Positions that two or more owners reached."""
    owners: list[tuple[int, int]]
    """The (rank, worker) owners involved, first ones."""

    @property
    def duplicated(self) -> bool:
        if self.aligned < MIN_ALIGNED:
            return False
        p = _tail(self.aligned, self.chance)
        return p < P_CHANCE or (2 * self.aligned >= self.shared_positions and p < P_CHANCE_MOST)


def aligned_repeats(
    codes: NDArray[np.int64],
    owner: NDArray[np.int32],
    owner_rank: NDArray[np.int64],
    owner_worker: NDArray[np.int64],
    n_ids: int,
) -> ShardRepeats:
    """Same id at the same position of two owners' streams of one epoch (records in file order)."""
    n = int(codes.shape[0])
    if n == 0 or n_ids <= 0:
        return ShardRepeats(0, 0.0, 0, [])
    order = np.argsort(owner, kind="stable")
    sorted_owner = owner[order]
    starts = np.r_[0, np.flatnonzero(sorted_owner[1:] != sorted_owner[:-1]) + 1]
    first = np.repeat(starts, np.diff(np.r_[starts, n]))
    position = np.empty(n, dtype=np.int64)
    position[order] = np.arange(n, dtype=np.int64) - first
    # distinct (position, owner, id): an owner repeating itself is not two owners
    triples = np.unique(np.stack([position, owner.astype(np.int64), codes], axis=1), axis=0)
    pairs, counts = np.unique(triples[:, [0, 2]], axis=0, return_counts=True)
    shared = pairs[counts > 1]
    per_position = np.bincount(triples[:, 0])
    chance = float(np.sum(per_position * (per_position - 1) / 2)) / float(n_ids)
    who: list[tuple[int, int]] = []
    if shared.shape[0]:
        width = int(codes.max()) + 1  # position * width + id: one int64 key per (position, id)
        hit = np.isin(triples[:, 0] * width + triples[:, 2], shared[:, 0] * width + shared[:, 1])
        for o in np.unique(triples[hit, 1]).tolist()[:8]:
            who.append((int(owner_rank[o]), int(owner_worker[o])))
    return ShardRepeats(int(shared.shape[0]), chance, int(np.count_nonzero(per_position > 1)), who)
