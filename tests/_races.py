"""Test helper for races on opening old SQLite databases: two openers that both look at a table's
columns before either changes them."""

from __future__ import annotations

import contextlib
import functools
import sqlite3
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import pytest

T = TypeVar("T")


def open_twice_after_both_looked(
    monkeypatch: pytest.MonkeyPatch, table: str, open_one: Callable[[], T]
) -> list[T | Exception]:
    """Run ``open_one`` on two threads at once, each holding back after its ``PRAGMA table_info(<table>)``
    until the other has run it too (as two processes opening a database at once can); returns what each
    returned or raised. The hold gives up after a second, so a fix that serializes the openers still
    completes. sqlite3 is restored before returning."""
    both_looked = threading.Barrier(2, timeout=1)

    class Looking(sqlite3.Connection):
        def execute(self, sql: str, *args: Any) -> sqlite3.Cursor:  # type: ignore[override]
            cursor = super().execute(sql, *args)
            if sql.startswith(f"PRAGMA table_info({table})"):
                with contextlib.suppress(threading.BrokenBarrierError):
                    both_looked.wait()
            return cursor

    results: list[T | Exception] = []

    def run() -> None:
        try:
            results.append(open_one())
        except Exception as exc:  # noqa: BLE001 - returned to the test
            results.append(exc)

    with monkeypatch.context() as patch:
        patch.setattr(sqlite3, "connect", functools.partial(sqlite3.connect, factory=Looking))
        threads = [threading.Thread(target=run) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    return results
