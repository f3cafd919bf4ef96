"""Read a region of a file chunk by chunk, in bounded memory, from one descriptor opened once.

Tensors used to be read through a memory map, but a mapped file that shrinks under the reader (training
re-saving a dump while the agent compares it) kills the whole server with SIGBUS on the next page
touched. Here every chunk is read with ``pread`` into a fresh array: a file that shrank gives a short
read, which becomes a `TensorInputError` naming the file and the byte offset, and a file replaced by a
rename is not seen at all (the descriptor still holds the original). The file is opened without following
any symbolic link (`perfgate.helpers.safeopen`), so a folder swapped for a link after the path check fails. Chunks are owned arrays, so
nothing stays resident after the consumer drops them; the kernel's page cache and read-ahead
(``POSIX_FADV_SEQUENTIAL``) keep sequential reads as fast as the map was.
"""

from __future__ import annotations

import io
import os
import threading
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, BinaryIO, Protocol, cast

import numpy as np

from perfgate.helpers.cpus import usable_cpus
from perfgate.helpers.safeopen import open_nofollow
from perfgate.security.digests import ALGORITHM, Algorithm, Hasher, new_hasher
from perfgate.tensors._errors import ComparisonCancelled, TensorInputError

__all__ = ["ChunkStream", "ChunkedFile", "FileChunks", "OwnedChunks"]

_SEQUENTIAL: int | None = getattr(os, "POSIX_FADV_SEQUENTIAL", None)
_MAX_GAP_BYTES = 1 << 20
"""Bytes between chunks (a header, padding, a zip member's local header) a running digest reads itself."""
_THREADED_BYTES = 32 << 20
"""A digest started on a file larger than this from its first byte by `ChunkedFile.digest` hashes on
all CPUs (BLAKE3 splits large updates); chunks the comparison reads are small and hash on one."""


_PAGE = 4096
_LINE = 64


def _empty_for(count: int, dtype: np.dtype[Any], offset: int) -> np.ndarray:
    """An uninitialised array of ``count`` elements of ``dtype`` to read the bytes at file ``offset`` into,
    placed so that its address is 64-byte aligned and lies 0-63 bytes before the file offset's place in its
    page (address = offset rounded down to 64, modulo the page size).

    The kernel copies a read from the page cache several times slower when the destination lies a few bytes
    past the source's place in the page, which is where numpy puts large arrays (16 bytes into a fresh
    mapping) for data at the start of a page. Measured on this project's AMD EPYC machine, ``preadv`` of 1 GiB
    from tmpfs in 512 KiB reads: 0.15 s of CPU with the destination 0-63 bytes before the source's page offset,
    0.47-0.58 s with it 8-24 bytes after."""
    nbytes = count * dtype.itemsize
    raw = np.empty(nbytes + _PAGE, dtype=np.uint8)
    address: int = raw.ctypes.data
    start = (offset - offset % _LINE - address) % _PAGE
    return cast(Any, raw[start : start + nbytes]).view(dtype)


class _Running:
    """Digests of one file's bytes taken in file order: ``position`` is the first byte not hashed yet.

    Chunks the comparison reads are queued (`ChunkedFile.observed`) and hashed on a pool thread, in order (or
    hashed at once by the reading thread, ``inline``, on a machine of few CPUs),
    while the reading thread goes on: the comparison and the hashing use different cores, and the bytes
    hashed are the very arrays compared (a chunk's array is reused only once `done` covers it). At most
    `_MAX_QUEUED` chunks wait, so a hash slower than the comparison holds the reader back instead of
    holding memory."""

    def __init__(self, algorithms: tuple[Algorithm, ...], *, inline: bool = False) -> None:
        self.lock = threading.Lock()
        self.algorithms = algorithms
        self.inline = inline
        """Hash each chunk on the reading thread as it is read, not on the pool (see `_INLINE_CPUS`)."""
        self.position = 0
        self.streaming = True
        self._hashers: list[Hasher] | None = None
        self.cond = threading.Condition()
        self.queue: deque[tuple[np.ndarray, int]] = deque()
        self.queued = 0
        """Chunks ever queued; a chunk's sequence number is this count just after it was queued."""
        self.done = 0
        """Chunks the hash is finished with (hashed, or dropped once streaming stopped)."""
        self.pumping = False

    def update(self, raw: np.ndarray, size_bytes: int, *, bulk: bool = False) -> None:
        """Hash ``raw`` (the bytes at ``position``); the caller holds the lock."""
        if self._hashers is None:
            threads = bulk and self.position == 0 and size_bytes > _THREADED_BYTES
            self._hashers = [new_hasher(a, threads=threads) for a in self.algorithms]
        data = raw.data
        for hasher in self._hashers:
            hasher.update(data)
        self.position += raw.shape[0]

    def hexdigests(self) -> dict[Algorithm, str]:
        if self._hashers is None:  # an empty file
            self._hashers = [new_hasher(a) for a in self.algorithms]
        return {a: h.hexdigest() for a, h in zip(self.algorithms, self._hashers, strict=True)}

    def drop_queue(self) -> None:
        """Count every queued chunk as done without hashing it (the hash stopped streaming, or has nothing
        left): `ChunkedFile.digest` reads from ``position`` itself. The caller holds ``cond``."""
        self.done += len(self.queue)
        self.queue.clear()
        self.pumping = False
        self.cond.notify_all()

    def wait_idle(self) -> None:
        """Until every queued chunk is hashed (or dropped)."""
        with self.cond:
            while self.pumping or self.queue:
                self.cond.wait()


_INLINE_CPUS = 2
"""On at most this many CPUs the reading thread hashes each chunk itself, right after reading it (the bytes
are still in its cache), while the comparison's other thread computes: a hash thread per file on top of
them would oversubscribe the cores. On more CPUs a pool thread per file hashes, so that reading is not
held to one core's hashing speed."""
_MAX_QUEUED = 8
"""Chunks read but not hashed yet, per file, before the reader waits for the hash."""
_PUMP_TURN = 64
"""Chunks a pool thread hashes for one file before it lets other files' hashing take a turn."""
_hash_pool: ThreadPoolExecutor | None = None
_hash_pool_lock = threading.Lock()


def _pool() -> ThreadPoolExecutor:
    """Threads that hash what the comparisons read, shared by every file (at most one per file at a time)."""
    global _hash_pool
    with _hash_pool_lock:
        if _hash_pool is None:
            _hash_pool = ThreadPoolExecutor(max(2, usable_cpus()), thread_name_prefix="perfgate-hash")
        return _hash_pool


class ChunkedFile:
    """A file held open by descriptor; its size is taken once, from the descriptor, at open."""

    def __init__(self, path: Path, fd: int | None = None) -> None:
        """Open ``path`` (or adopt ``fd``, an open read-only descriptor of it; this object then owns it)."""
        self.path = path
        # Reads hold the lock, so close() never pulls the descriptor (whose number the OS may reuse at once)
        # from under a read still running in an abandoned worker thread of a cancelled call.
        self._lock = threading.Lock()
        self._fd: int | None = fd if fd is not None else open_nofollow(path)
        self.size_bytes = os.fstat(self._fd).st_size
        self._running: _Running | None = None
        if _SEQUENTIAL is not None:
            os.posix_fadvise(self._fd, 0, 0, _SEQUENTIAL)

    @property
    def fd(self) -> int:
        assert self._fd is not None, "file is closed"
        return self._fd

    def stream(self) -> BinaryIO:
        """A buffered binary stream from byte 0 over the same descriptor (for headers); close it after use."""
        raw = io.FileIO(os.dup(self.fd), "rb")
        return io.BufferedReader(raw)

    def read_into(self, out: np.ndarray[Any, np.dtype[Any]], offset: int) -> None:
        """Fill ``out`` with the bytes at ``offset``.

        Raises:
            TensorInputError: the file ends early (it shrank since it was opened).
            ComparisonCancelled: the file was closed meanwhile (only a cancelled call closes it early).
        """
        # As raw bytes: also for dtypes the buffer protocol cannot describe (bfloat16, float8).
        view: memoryview = cast(Any, out).view(np.uint8).data
        done = 0
        while done < len(view):
            with self._lock:
                if self._fd is None:
                    raise ComparisonCancelled(f"{self.path.name} was closed while it was being read")
                try:
                    n = os.preadv(self._fd, [view[done:]], offset + done)
                except OSError as exc:
                    raise TensorInputError(
                        f"{self.path.name}: cannot read at byte {offset + done} ({exc.strerror or exc})"
                    ) from exc
            if n == 0:
                raise TensorInputError(
                    f"{self.path.name}: the file ends at byte {offset + done}, but {self.size_bytes} bytes were "
                    "there when it was opened: it was truncated or rewritten during the comparison. Wait until "
                    "the writer finishes (or compare a copy) and retry"
                )
            done += n

    def start_digest(self, algorithms: Sequence[Algorithm]) -> None:
        """Digest the file as the comparison reads it: from now on every chunk `FileChunks` reads is hashed
        in the same pass, while reads go forward through the file (small gaps such as headers are read
        here); `digest` then hashes only what no chunk covered."""
        self._running = _Running(tuple(algorithms), inline=usable_cpus() <= _INLINE_CPUS)

    def observed(self, data: np.ndarray, offset: int) -> int:
        """``data`` (just read at byte ``offset``) feeds the running digest where it continues it: queued for
        the hash thread, which reads small gaps before it itself. Returns the sequence number to pass to
        `wait_hashed` before ``data``'s array is overwritten (0: not queued, free at once). Waits while
        `_MAX_QUEUED` chunks of this file are queued."""
        running = self._running
        if running is None or not running.streaming:
            return 0
        raw: np.ndarray = cast(Any, data).reshape(-1).view(np.uint8)
        if running.inline:
            try:
                self._hash_chunk(running, raw, offset)
            except (TensorInputError, ComparisonCancelled, OSError):
                running.streaming = False  # `digest` reads from where the hash stopped, and reports it
            return 0
        with running.cond:
            while len(running.queue) >= _MAX_QUEUED and running.streaming:
                running.cond.wait()
            if not running.streaming:
                return 0
            running.queue.append((raw, offset))
            running.queued += 1
            seq = running.queued
            if not running.pumping:
                running.pumping = self._submit_pump(running)
        return seq

    def _submit_pump(self, running: _Running) -> bool:
        """Start hashing the queue on the pool; False (and the queue dropped: `digest` reads those bytes
        itself) when the pool takes no more work (the interpreter is exiting). The caller holds the cond."""
        try:
            _pool().submit(self._pump, running)
        except RuntimeError:
            running.streaming = False
            running.drop_queue()
            return False
        return True

    def wait_hashed(self, seq: int) -> None:
        """Until the chunk `observed` numbered ``seq`` is hashed (then its array may be overwritten)."""
        running = self._running
        if seq == 0 or running is None:
            return
        with running.cond:
            while running.done < seq:
                running.cond.wait()

    def _pump(self, running: _Running) -> None:
        """Hash queued chunks in order until the queue is empty (on a pool thread); after `_PUMP_TURN` chunks
        it queues itself again, so files being read at once (concurrent calls) share the pool's threads. A
        chunk it cannot finish (a gap unreadable: the file shrank or was closed) stops the streaming:
        `digest` then reads from where the hash stopped, and reports the error itself."""
        settled = False  # the queue is empty and `pumping` cleared, or the next turn is queued on the pool
        try:
            for _ in range(_PUMP_TURN):
                with running.cond:
                    if not running.queue or not running.streaming:
                        running.drop_queue()
                        settled = True
                        return
                    raw, offset = running.queue[0]
                try:
                    self._hash_chunk(running, raw, offset)
                except (TensorInputError, ComparisonCancelled, OSError):
                    running.streaming = False
                finally:
                    del raw
                    with running.cond:
                        running.queue.popleft()
                        running.done += 1
                        running.cond.notify_all()
            with running.cond:
                running.pumping = self._submit_pump(running)
                settled = True
        except BaseException:
            running.streaming = False
            raise
        finally:
            if not settled:
                with running.cond:
                    running.drop_queue()

    def _hash_chunk(self, running: _Running, raw: np.ndarray, offset: int) -> None:
        end = offset + raw.shape[0]
        with running.lock:
            if end <= running.position:
                return  # hashed already (by `digest`, or a chunk read twice)
            if offset > running.position:
                if offset - running.position > _MAX_GAP_BYTES:
                    running.streaming = False  # out of file order: `digest` reads the rest itself
                    return
                gap = np.empty(offset - running.position, dtype=np.uint8)
                self.read_into(gap, running.position)
                running.update(gap, self.size_bytes)
            running.update(raw[running.position - offset :], self.size_bytes)

    def digest(
        self, on_chunk: Callable[[], None] | None = None, chunk_bytes: int = 8 << 20
    ) -> tuple[dict[Algorithm, str], int]:
        """Digests (algorithm -> hex) and size of the whole file as opened, read through this descriptor (so
        they are of the bytes compared, even if the path is replaced meanwhile): what `start_digest` began
        (default: BLAKE3 alone, from the first byte), finished from where the comparison's reads stopped.
        ``on_chunk`` runs before each chunk: raise from it to stop. The hashers release the GIL, so files
        hash in parallel on several threads.

        Raises:
            TensorInputError: the file ends early (it shrank since it was opened).
        """
        running = self._running or _Running((ALGORITHM,))
        running.wait_idle()
        running.streaming = False
        buffer = _empty_for(min(chunk_bytes, max(self.size_bytes, 1)), np.dtype(np.uint8), running.position)
        while True:
            if on_chunk is not None:
                on_chunk()
            with running.lock:
                if running.position >= self.size_bytes:
                    return running.hexdigests(), self.size_bytes
                part = buffer[: min(buffer.shape[0], self.size_bytes - running.position)]
                self.read_into(part, running.position)
                running.update(part, self.size_bytes, bulk=True)

    def read_bytes(self, offset: int, length: int) -> bytes:
        """A copy of ``length`` bytes at ``offset`` (bounds were checked by the caller)."""
        assert offset >= 0 and offset + length <= self.size_bytes
        out = np.empty(length, dtype=np.uint8)
        self.read_into(out, offset)
        return out.tobytes()

    def chunks(self, offset: int, dtype: np.dtype[Any], count: int, chunk_elements: int) -> FileChunks:
        """1-D arrays of ``count`` elements of ``dtype`` starting at byte ``offset``, ``chunk_elements`` at a time."""
        assert offset + count * dtype.itemsize <= self.size_bytes
        return FileChunks(self, offset, dtype, count, chunk_elements)

    def close(self) -> None:
        with self._lock:
            fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)


class ChunkStream(Protocol):
    """Consecutive 1-D pieces of one tensor in storage order; all but the last have the same length.

    The consumer calls ``release(n)`` once it no longer needs the first ``n`` elements (a stream over
    shared memory may then drop them; the streams here own their arrays and need not).
    """

    def __iter__(self) -> Iterator[np.ndarray]: ...
    def release(self, elements_done: int) -> None: ...


_READ_BYTES = 1 << 20
_READ_CHUNKS = 4
"""`FileChunks` reads, and hashes, up to `_READ_CHUNKS` whole chunks and `_READ_BYTES` at once (at least a
chunk). Each read and each hash update is a turn of the interpreter lock taken back from the computing
thread: a bfloat16 model's 256 KiB chunks read four at a time cut the compare_tensors tool's time on a
2 x 1 GiB model by about a sixth on 2 cores (alternating runs: 1.91-2.16 s against 2.37-2.53 s); 2 MiB
reads were slower again (the data no longer waits in the cache)."""


class FileChunks:
    """A `ChunkStream` over a region of a `ChunkedFile`.

    Chunks are read a few at a time (`_READ_CHUNKS`) into one array and handed out as views of it. Arrays are
    placed for fast copies from the page cache (`_empty_for`); one keeps its placement when reused for a
    later read as long as chunks are whole pages (the default chunk size's are). A read's array is reused
    once the consumer released every element of its chunks and the running digest, if any, has hashed it
    (the `ChunkStream` contract): fresh multi-megabyte arrays cost page faults on every read, twice the CPU
    of the comparison itself.
    """

    _MAX_HELD = 32
    """Reads remembered for reuse; a consumer that never releases only loses the reuse."""

    def __init__(self, file: ChunkedFile, offset: int, dtype: np.dtype[Any], count: int, chunk_elements: int):
        self._file = file
        self._offset = offset
        self._dtype = dtype
        self._count = count
        self._chunk = chunk_elements
        self._released = 0

    def __iter__(self) -> Iterator[np.ndarray]:
        itemsize = self._dtype.itemsize
        per_read = max(1, min(_READ_CHUNKS, _READ_BYTES // (self._chunk * itemsize))) * self._chunk
        # (end element, hash sequence number, array) of reads handed out
        held: deque[tuple[int, int, np.ndarray]] = deque()
        for start in range(0, self._count, per_read):
            n = min(per_read, self._count - start)
            out: np.ndarray | None = None
            if held and held[0][0] <= self._released:
                _, seq, spare = held.popleft()
                self._file.wait_hashed(seq)  # a hash behind the comparison holds the reader back
                out = spare if spare.shape[0] == n else None
            elif len(held) >= self._MAX_HELD:
                held.popleft()
            if out is None:
                out = _empty_for(n, self._dtype, self._offset + start * itemsize)
            self._file.read_into(out, self._offset + start * itemsize)
            seq = self._file.observed(out, self._offset + start * itemsize)
            held.append((start + n, seq, out))
            for piece in range(0, n, self._chunk):
                yield out[piece : piece + self._chunk]

    def release(self, elements_done: int) -> None:
        self._released = max(self._released, elements_done)


class OwnedChunks:
    """A `ChunkStream` of arrays the stream created itself (nothing to release)."""

    def __init__(self, chunks: Iterator[np.ndarray]) -> None:
        self._chunks = chunks

    def __iter__(self) -> Iterator[np.ndarray]:
        return self._chunks

    def release(self, elements_done: int) -> None:
        return None
