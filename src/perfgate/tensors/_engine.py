"""Run the chunk kernel over a tensor pair on a small thread pool, folding results in chunk order.

numpy releases the GIL inside its loops, so chunks computed on several threads use several cores. With two
threads and reads that also hash, one thread reads (or inflates NPZ data) and hashes while the calling
thread computes; otherwise the reading thread also computes the chunks no pool thread has started when
enough are in flight. Finished chunks are folded in order, so every total is the same whatever thread computed what.
"""

from __future__ import annotations

import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np

from perfgate.tensors._kernel import ChunkStats, KernelParams, Scratch, TensorStats, Totals, chunk_stats
from perfgate.tensors._mapped import ChunkStream

__all__ = ["Engine"]


class Engine:
    """Computes chunk statistics with ``workers`` threads (numpy releases the GIL inside its loops).

    Two workers, with ``read_ahead`` (the reads also hash): one thread reads chunk pairs ahead
    (`_ReadAhead`; the files' running digests hash each chunk on it as it is read) and the calling thread
    computes them. The two seldom wait for each other's interpreter lock: a read or a hash releases it for a
    whole chunk, and each thread has about half the work (per 128 MiB tensor, ~0.2 s of CPU each). Measured
    on 2 cores (busy), the compare_tensors tool in process, this layout and the pool layout alternating,
    four rounds: 1.76-2.35 s against 2.71-3.18 s on 2 x 1 GiB float32, 2.42-2.98 s against 2.73-4.01 s on a
    2 x 1 GiB bfloat16 model in 4 shards. That holds while the second core is free: where other jobs hold
    the cores the two threads share one and cost more CPU than one alone, so a tensor read ahead whose
    threads got too little parallelism sends the next ones to the calling thread alone (`_Layout`).

    Otherwise (bare reads are cheap; more CPUs) the reading thread hands out chunk pairs to ``workers - 1``
    pool threads and folds finished chunks in order, keeping at most two chunks per thread in flight. When
    that many are in flight it does not wait: it takes back a chunk no pool thread has started (the oldest
    such) and computes it itself, so every core computes and no more threads than cores compete (measured on
    2 cores, a 1 GiB bfloat16 comparison: the former layout, a waiting reader beside two pool threads and a
    hash thread per file, switched threads 55,000-100,000 times; this one, hashing on the reader,
    10,000-18,000). Pages of mapped files are released once every chunk before them is done.
    """

    def __init__(self, workers: int, chunk_elements: int, *, read_ahead: bool = False) -> None:
        self._chunk_elements = chunk_elements
        self._read_ahead = read_ahead and workers == 2
        pooled = workers - 1 if not self._read_ahead else 0
        self._pool = ThreadPoolExecutor(pooled, thread_name_prefix="perfgate-compare") if pooled else None
        self._depth = 2 * workers
        self._local = threading.local()
        self._layout = _Layout()

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
        pairs: Iterable[tuple[np.ndarray, np.ndarray]] = zip(ref, cand, strict=True)
        reader = _ReadAhead(pairs) if self._read_ahead and self._layout.read_ahead() else None
        clock = _Clock()
        try:
            for ref_chunk, cand_chunk in reader or pairs:
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
            if reader is not None and offset >= _MEASURED_CHUNKS * self._chunk_elements:
                self._layout.measured(clock.parallelism())
        finally:
            # Never leave a thread reading a file that the caller is about to close.
            if reader is not None:
                reader.close()
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


_MEASURED_CHUNKS = 16
"""Chunks a tensor read ahead needs before its parallelism decides the layout (fewer: too short to tell)."""
_PAYING_PARALLELISM = 1.3
"""CPU seconds per wall second the two-thread layout must reach to pay. On a 2-core host it costs more CPU
than one thread doing everything (chunks handed between cores, the interpreter lock passed back and forth
about twenty times a chunk): measured with the compare_tensors tool on 2 x 512 MiB float32 on a loaded
host, 0.95-1.19 s of CPU against 0.78-0.91 s on one thread. So it is faster only where it gets clearly
more than one core: about 1.7 on a quiet host, 1.0-1.3 where other jobs hold the cores."""
_RETRY_AFTER = 4
"""Tensors computed on one thread before the two-thread layout is measured again (the load may have gone)."""


class _Clock:
    """The process's CPU seconds per wall second since it was made: how many cores its threads got."""

    def __init__(self) -> None:
        self._cpu = time.process_time()
        self._wall = time.perf_counter()

    def parallelism(self) -> float:
        wall = time.perf_counter() - self._wall
        return (time.process_time() - self._cpu) / wall if wall > 0 else 0.0


class _Layout:
    """Whether the next tensor whose reads hash is read ahead on a thread of its own (`_ReadAhead`) or read,
    hashed and computed on the calling thread alone, decided from what the last tensor read ahead got.

    The second thread pays only while a second core is free: where other jobs hold the cores, the two
    threads take turns on one and wait on each other's hand-offs (`_PAYING_PARALLELISM`). Which layout
    computed a chunk never changes a figure: totals fold in chunk order and digests hash in file order."""

    def __init__(self) -> None:
        self._alone = -1
        """Tensors computed on one thread since the two-thread layout last failed to pay; -1: it pays."""

    def read_ahead(self) -> bool:
        if self._alone < 0 or self._alone >= _RETRY_AFTER:
            return True
        self._alone += 1
        return False

    def measured(self, parallelism: float) -> None:
        """Record the parallelism a tensor read ahead reached."""
        self._alone = -1 if parallelism >= _PAYING_PARALLELISM else 0


_READ_AHEAD = 4
"""Chunk pairs `_ReadAhead` reads before the computing thread takes them."""
_FIRST_HERE = 2
"""Chunk pairs `_ReadAhead` hands out from the calling thread before it starts reading on its own: a
tensor of a chunk or two (most of a model's, often) costs no thread."""


class _ReadAhead:
    """Iterates chunk pairs read on a thread of its own, at most `_READ_AHEAD` ahead of the consumer.
    An error reading is raised to the consumer in order; `close` stops the thread and waits for it."""

    _END = object()

    def __init__(self, pairs: Iterable[tuple[np.ndarray, np.ndarray]]) -> None:
        self._pairs = iter(pairs)
        self._queue: queue.Queue[object] = queue.Queue(_READ_AHEAD)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __iter__(self) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        for _ in range(_FIRST_HERE):
            pair = next(self._pairs, None)
            if pair is None:
                return
            yield pair
        self._thread = threading.Thread(target=self._read, name="perfgate-read", daemon=True)
        self._thread.start()
        while True:
            item = self._queue.get()
            if item is self._END:
                return
            if isinstance(item, BaseException):
                raise item
            yield item  # pyright: ignore[reportReturnType]  # the reader queues only pairs here

    def _read(self) -> None:
        try:
            for pair in self._pairs:
                self._queue.put(pair)
                del pair
                if self._stop.is_set():
                    return
        except BaseException as exc:  # noqa: BLE001  # the consumer raises it, whatever it is
            self._queue.put(exc)
        else:
            self._queue.put(self._END)

    def close(self) -> None:
        """Stop reading (the consumer is done, or gave up) and wait until the reading thread has ended."""
        self._stop.set()
        thread = self._thread
        while thread is not None and thread.is_alive():
            while True:  # make room for a put the reader may be blocked in
                try:
                    self._queue.get_nowait()
                except queue.Empty:
                    break
            thread.join(0.01)
