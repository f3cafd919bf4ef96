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
    """Computes chunk statistics on the reading thread and ``workers - 1`` pool threads (numpy releases the
    GIL inside its loops).

    The reading thread hands out chunk pairs and folds finished chunks in order, keeping at most two chunks
    per thread in flight. When that many are in flight it does not wait: it takes back a chunk no pool
    thread has started (the oldest such) and computes it itself, so every core computes, and no thread more
    than the cores contends for them (a thread waiting while ``workers`` others compute cost 20-50% more
    CPU per chunk on 2 cores: cache and interpreter-lock hand-offs). Pages of mapped files are released once
    every chunk before them is done.
    """

    def __init__(self, workers: int, chunk_elements: int) -> None:
        self._chunk_elements = chunk_elements
        self._pool = (
            ThreadPoolExecutor(workers - 1, thread_name_prefix="perfgate-compare") if workers > 1 else None
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
        pending: deque[_Pending] = deque()

        def fold(stats: ChunkStats, end: int) -> None:
            totals.fold(stats)
            ref.release(end)
            cand.release(end)
            advance(stats.elements)

        def fold_ready() -> None:
            while pending and pending[0].ready():
                item = pending.popleft()
                fold(item.result(), item.end)

        offset = 0
        try:
            for ref_chunk, cand_chunk in zip(ref, cand, strict=True):
                n = ref_chunk.shape[0]
                if self._pool is None:
                    stats = self._compute(ref_chunk, cand_chunk, offset, params)
                    del ref_chunk, cand_chunk  # views into memory maps: drop them before releasing pages
                    fold(stats, offset + n)
                else:
                    args = (ref_chunk, cand_chunk, offset, params)
                    pending.append(_Pending(self._pool.submit(self._compute, *args), args, offset + n))
                    del ref_chunk, cand_chunk, args
                    while len(pending) >= self._depth:
                        self._help(pending)
                        fold_ready()
                offset += n
            while pending:
                self._help(pending)
                fold_ready()
        finally:
            # Never leave a worker reading a mapping that the caller is about to close.
            for item in pending:
                item.cancel()
            for item in pending:
                item.settle()
        return totals.result()

    def _help(self, pending: deque[_Pending]) -> None:
        """Compute the oldest chunk no pool thread has started, here; when all have started, wait for the
        oldest."""
        for item in pending:
            args = item.args
            if args is not None and item.take_back():
                item.stats = self._compute(args[0], args[1], args[2], args[3])
                item.args = None
                return
        pending[0].wait()


class _Pending:
    """A chunk pair handed to the pool, or taken back and computed by the reading thread (``stats``)."""

    def __init__(
        self,
        future: Future[ChunkStats],
        args: tuple[np.ndarray, np.ndarray, int, KernelParams] | None,
        end: int,
    ) -> None:
        self.future = future
        self.args = args
        self.end = end
        self.stats: ChunkStats | None = None

    def take_back(self) -> bool:
        """Whether the pool had not started it (it never will now): the caller computes it."""
        return self.stats is None and self.args is not None and self.future.cancel()

    def ready(self) -> bool:
        return self.stats is not None or (not self.future.cancelled() and self.future.done())

    def wait(self) -> None:
        if self.stats is None:
            self.future.exception()

    def result(self) -> ChunkStats:
        if self.stats is not None:
            return self.stats
        return self.future.result()

    def cancel(self) -> None:
        self.future.cancel()

    def settle(self) -> None:
        if not self.future.cancelled():
            self.future.exception()
