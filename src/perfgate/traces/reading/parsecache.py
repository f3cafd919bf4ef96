"""Parsed traces kept between calls, by content: an agent reads the same trace several times in a session
(the whole profile, then a step range, a time basis, a diff against it), and reading is most of a call's
work on a large trace (decompressing and decoding: ~80% of `analyze_trace` on the shared MTIA trace).

An entry is the `EventTable` one reader builds and the facts the analysis reads from the stream (header,
JSON size, events skipped), under the BLAKE3 digest of the file's bytes and the two limits that can refuse
a file (``max_event_bytes``, ``max_events``): a copy of a trace under another name is the same entry, an
edited one another. The file's size and modification time are compared before and after it is hashed and
read; a file that changed meanwhile is analysed as read and not kept. Entries are evicted least recently
used first, to stay under a byte budget (``PERFGATE_TRACE_CACHE_MB``, default 512; 0 turns it off); a
table larger than the budget is not kept, and its analysis releases its columns as before. The analysis
never changes a kept table: it reads it with ``release=False``, so a hit gives exactly the uncached answer.
"""

from __future__ import annotations

import math
import os
import threading
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

from perfgate.helpers.safeopen import open_file
from perfgate.security.digests import new_hasher
from perfgate.traces.reading._events import Header
from perfgate.traces.reading.table import Columns, EventTable

__all__ = ["CACHE_ENV", "ParseCache", "Parsed", "file_stamp", "parse_cache", "table_bytes"]

CACHE_ENV = "PERFGATE_TRACE_CACHE_MB"
DEFAULT_MB = 512
_HASH_BLOCK = 4 << 20


@dataclass(frozen=True)
class Parsed:
    """A read trace: what `perfgate.traces.analyze.analyze_table` needs besides the path and options."""

    table: EventTable
    header: Header
    decoded_bytes: int
    lenient_skipped: int


def _columns_bytes(columns: Columns) -> int:
    return sum(a.nbytes for a in columns.data.values()) + sum(
        s.rows.nbytes + s.values.nbytes for s in columns.sparse.values()
    )


def table_bytes(table: EventTable) -> int:
    """About what ``table`` holds in memory: its columns, and its names at ~64 bytes a string."""
    held = (_columns_bytes(c) for c in (table.device, table.host, table.cpu))
    return sum(held) + 64 * (len(table.names) + len(table.cats))


def file_stamp(path: Path) -> tuple[int, int, int, int]:
    """(device, inode, size, modification time in ns): what changes when the file is replaced or edited."""
    st = path.stat()
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


def _digest(path: Path) -> str:
    hasher = new_hasher(threads=True)
    with open_file(path) as fh:
        while block := fh.read(_HASH_BLOCK):
            hasher.update(block)
    return hasher.hexdigest()


class ParseCache:
    """A byte-bounded, least-recently-used map from a trace's content (and limits) to its `Parsed` form;
    safe to use from several threads."""

    def __init__(self, budget_bytes: int) -> None:
        self.budget_bytes = budget_bytes
        self._entries: OrderedDict[tuple[str, int, int], tuple[Parsed, int]] = OrderedDict()
        self._held = 0
        self._lock = threading.Lock()
        self.hits = 0

    @property
    def enabled(self) -> bool:
        return self.budget_bytes > 0

    def key(self, path: Path, max_event_bytes: int, max_events: int) -> tuple[str, int, int]:
        """The entry's key: the file's content digest and the limits (reads the whole file)."""
        return _digest(path), max_event_bytes, max_events

    def get(self, key: tuple[str, int, int]) -> Parsed | None:
        with self._lock:
            found = self._entries.get(key)
            if found is None:
                return None
            self._entries.move_to_end(key)
            self.hits += 1
            return found[0]

    def put(self, key: tuple[str, int, int], parsed: Parsed) -> bool:
        """Keep ``parsed`` (evicting the least recently used entries); False when it exceeds the budget."""
        size = table_bytes(parsed.table)
        if size > self.budget_bytes:
            return False
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self._held -= old[1]
            while self._entries and self._held + size > self.budget_bytes:
                _, (_, freed) = self._entries.popitem(last=False)
                self._held -= freed
            self._entries[key] = (parsed, size)
            self._held += size
        return True

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._held = 0

    @property
    def held_bytes(self) -> int:
        return self._held


def _budget_from_env() -> int:
    raw = os.environ.get(CACHE_ENV, "").strip()
    try:
        mb = float(raw) if raw else DEFAULT_MB
    except ValueError:
        mb = DEFAULT_MB
    return int(max(mb, 0.0) * (1 << 20)) if math.isfinite(mb) else DEFAULT_MB << 20


_cache: ParseCache | None = None
_cache_lock = threading.Lock()


def parse_cache() -> ParseCache:
    """This process's cache, sized from ``PERFGATE_TRACE_CACHE_MB`` when first used."""
    global _cache
    with _cache_lock:
        if _cache is None:
            _cache = ParseCache(_budget_from_env())
        return _cache
