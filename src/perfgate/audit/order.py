"""Order check: a rank that reads its shard in the same order every epoch never called set_epoch."""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

__all__ = ["rank_sequences", "repeated_orders"]


def rank_sequences(codes: NDArray[np.int64], rank: NDArray[np.int32]) -> dict[int, NDArray[np.int64]]:
    """Each rank's ids in record order (views when each rank's records are contiguous)."""
    n = int(codes.shape[0])
    if n == 0:
        return {}
    starts = np.flatnonzero(rank[1:] != rank[:-1]) + 1
    run_ranks = rank[np.concatenate(([0], starts))]
    if np.unique(run_ranks).shape[0] == run_ranks.shape[0]:
        bounds = [0, *starts.tolist(), n]
        return {int(r): codes[bounds[i] : bounds[i + 1]] for i, r in enumerate(run_ranks.tolist())}
    order = np.argsort(rank, kind="stable")
    sorted_rank = rank[order]
    cut = np.flatnonzero(sorted_rank[1:] != sorted_rank[:-1]) + 1
    bounds = [0, *cut.tolist(), n]
    return {
        int(sorted_rank[bounds[i]]): codes[order[bounds[i] : bounds[i + 1]]] for i in range(len(bounds) - 1)
    }


def repeated_orders(
    previous: dict[int, NDArray[np.int64]], current: dict[int, NDArray[np.int64]]
) -> list[int]:
    """Ranks whose sequence (of two or more records) is identical in both epochs."""
    return [
        r
        for r, seq in current.items()
        if seq.shape[0] > 1 and r in previous and np.array_equal(previous[r], seq)
    ]
