"""Run the chunk kernel over a tensor pair on a small thread pool, folding results in chunk order.

numpy releases the GIL inside its loops, so chunks computed on several threads use several cores; the
reading thread only creates views (or inflates NPZ data) and folds finished chunks, in order, so every
total is the same whatever thread computed what.
"""

from __future__ import annotations

import os
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np

from perfgate.tensors._kernel import ChunkStats, KernelParams, Scratch, TensorStats, Totals, chunk_stats
from perfgate.tensors._mapped import ChunkStream

__all__ = ["Engine", "usable_cpus"]


def usable_cpus() -> int:
    """CPUs this process may run on."""
    sched_getaffinity = getattr(os, "sched_getaffinity", None)
    if sched_getaffinity is not None:
        return len(sched_getaffinity(0))
    return os.cpu_count() or 1


class Engine:
    """Computes chunk statistics on a thread pool (numpy releases the GIL inside its loops).

    The reading thread hands out chunk pairs and folds finished chunks in order, keeping at most two
    chunks per thread in flight; pages of mapped files are released once every chunk before them is done.
    """

    def __init__(self, workers: int, chunk_elements: int) -> None:
        self._chunk_elements = chunk_elements
        self._pool = (
            ThreadPoolExecutor(workers, thread_name_prefix="perfgate-compare") if workers > 1 else None
        )
        self._depth = 2 * workers
        self._local = threading.local()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)

    def _compute(self, ref: np.ndarray, cand: np.ndarray, offset: int, params: KernelParams) -> ChunkStats:
        scratch: Scratch | None = getattr(self._local, "scratch", None)
        if scratch is None:
            scratch = Scratch(self._chunk_elements)
            self._local.scratch = scratch
        return chunk_stats(ref, cand, offset, params, scratch)

    def run(
        self, ref: ChunkStream, cand: ChunkStream, params: KernelParams, advance: Callable[[int], None]
    ) -> TensorStats:
        totals = Totals()
        pending: deque[tuple[Future[ChunkStats], int]] = deque()

        def fold(stats: ChunkStats, end: int) -> None:
            totals.fold(stats)
            ref.release(end)
            cand.release(end)
            advance(stats.elements)

        offset = 0
        try:
            for ref_chunk, cand_chunk in zip(ref, cand, strict=True):
                n = ref_chunk.shape[0]
                if self._pool is None:
                    stats = self._compute(ref_chunk, cand_chunk, offset, params)
                    del ref_chunk, cand_chunk  # views into memory maps: drop them before releasing pages
                    fold(stats, offset + n)
                else:
                    pending.append(
                        (self._pool.submit(self._compute, ref_chunk, cand_chunk, offset, params), offset + n)
                    )
                    del ref_chunk, cand_chunk
                    while len(pending) >= self._depth:
                        future, end = pending.popleft()
                        fold(future.result(), end)
                offset += n
            while pending:
                future, end = pending.popleft()
                fold(future.result(), end)
        finally:
            # Never leave a worker reading a mapping that the caller is about to close.
            for future, _ in pending:
                future.cancel()
            for future, _ in pending:
                if not future.cancelled():
                    future.exception()
        return totals.result()
