"""Opening a SQLite database that other processes may be creating at the same moment."""

from __future__ import annotations

import random
import sqlite3
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def is_busy(exc: sqlite3.OperationalError) -> bool:
    """SQLITE_BUSY (5) or SQLITE_LOCKED (6), extended codes included (the code is there from Python 3.11)."""
    code = getattr(exc, "sqlite_errorcode", None)
    if isinstance(code, int):
        return code & 0xFF in (5, 6)
    return "locked" in str(exc) or "busy" in str(exc)


def retry_while_busy(open_once: Callable[[], T], timeout_s: float) -> T:
    """``open_once()``, retried with jitter for up to ``timeout_s`` while the database is busy.

    Processes that open a new database at once race to switch it to WAL; SQLite answers the losers'
    ``journal_mode`` change with SQLITE_BUSY at once, without calling the busy handler, so the busy
    timeout alone does not cover it. ``open_once`` must close what it opened before raising."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return open_once()
        except sqlite3.OperationalError as exc:
            if not is_busy(exc) or time.monotonic() >= deadline:
                raise
        time.sleep(random.uniform(0.005, 0.025))
