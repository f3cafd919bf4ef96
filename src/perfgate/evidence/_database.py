"""The one SQLite connection a process holds on a ledger database: the schema, the reopening after a fork
or when the database was replaced underneath it, and the lock its threads share.

Durability: WAL journal with ``synchronous=FULL``, one short ``BEGIN IMMEDIATE`` transaction per append,
so concurrent writers (threads or processes) serialize on SQLite's lock, and a record is on disk before
the tool that produced it answers. Speed: the connection lives as long as some `Ledger` on the database
in this process, so an append costs one WAL commit (one fsync) instead of opening, checkpointing and
deleting the WAL every time. The WAL stays (SQLite checkpoints it as it grows), so a copy of
``ledger.db`` alone may miss the newest records: copy ``ledger.db-wal`` with it.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import sqlite3
import threading
import weakref
from collections.abc import Generator
from pathlib import Path

from perfgate.evidence._held import this_pid
from perfgate.helpers.safeopen import UnsafeFileError
from perfgate.helpers.sqlite import retry_while_busy
from perfgate.helpers.statefs import make_dirs

__all__ = ["FORMAT", "SCHEMA", "Connection", "LedgerFormatError", "connection"]

FORMAT = 2
"""The ledger's format, kept in ``meta`` as ``format``. 1: no marker (the signing columns may be missing:
a ledger from before signing); 2: the marker. An older ledger is migrated when it is opened (its records
are never rewritten: their hashes and MACs stay as they were); a newer one is refused."""

SCHEMA = """
CREATE TABLE IF NOT EXISTS evidence (
    seq INTEGER PRIMARY KEY,
    id TEXT NOT NULL UNIQUE,
    tool TEXT NOT NULL,
    state TEXT NOT NULL,
    body TEXT NOT NULL,
    hash TEXT NOT NULL,
    key_id TEXT,
    mac TEXT
);
CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS evidence_tool ON evidence(tool);
CREATE TRIGGER IF NOT EXISTS evidence_no_update BEFORE UPDATE ON evidence
BEGIN SELECT RAISE(ABORT, 'the evidence ledger is append-only'); END;
CREATE TRIGGER IF NOT EXISTS evidence_no_delete BEFORE DELETE ON evidence
BEGIN SELECT RAISE(ABORT, 'the evidence ledger is append-only'); END;
"""

_BUSY_TIMEOUT_S = 60.0


class LedgerFormatError(RuntimeError):
    """The ledger was written by a newer perfgate, in a format this one cannot read."""


_FileId = tuple[int, ...]


def _file_paths(db_path: Path) -> tuple[str, str, str]:
    """The database, its WAL and its shared-memory index, as `_file_ids` reads them."""
    return (str(db_path), f"{db_path}-wal", f"{db_path}-shm")


def _file_ids(paths: tuple[str, ...]) -> tuple[_FileId | None, ...]:
    """What identifies the database, its WAL and its shared-memory index (`_file_paths`) on disk now:
    device and inode of each, plus size and mtime of the first two (changed in place: restored from a
    copy)."""
    out: list[_FileId | None] = []
    for i, path in enumerate(paths):
        try:
            st = os.stat(path)
        except FileNotFoundError:
            out.append(None)
        else:
            out.append(
                (st.st_dev, st.st_ino) if i == 2 else (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
            )
    return tuple(out)


class Connection:
    """The one SQLite connection a process holds on one ledger database, shared by its `Ledger`s and
    threads under ``lock`` (SQLite shares its lock and WAL-index state per file and process anyway)."""

    def __init__(self, db_path: Path) -> None:
        self.db_path = db_path
        self.paths = _file_paths(db_path)
        self.lock = threading.RLock()
        self.conn: sqlite3.Connection | None = None
        self.pid = 0
        self.files: tuple[_FileId | None, ...] = ()
        self.ledger_id = ""

    def _open(self) -> sqlite3.Connection:
        """A fresh connection, with the schema in place and ``ledger_id`` read (or created)."""
        return retry_while_busy(self._open_once, _BUSY_TIMEOUT_S)

    def _open_once(self) -> sqlite3.Connection:
        # SQLite follows links when it opens (and creates) the database and its side files, and Python
        # offers no SQLITE_OPEN_NOFOLLOW: the folder is walked following no link, and a side file that
        # is a link is refused, so a link planted in the agent-writable .perfgate/ is never written.
        make_dirs(self.db_path.parent)
        for path in self.paths:
            if os.path.islink(path):
                raise UnsafeFileError(
                    errno.ELOOP,
                    f"{path} is a symbolic link; the ledger's files are perfgate's own. Remove the link and "
                    "restore the ledger from a backup (perfgate ledger verify names what is missing)",
                    path,
                )
        conn = sqlite3.connect(
            self.db_path, timeout=_BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=False
        )
        try:
            conn.execute(f"PRAGMA busy_timeout={int(_BUSY_TIMEOUT_S * 1000)}")
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=FULL")
            conn.executescript(SCHEMA)
            if self._format(conn) != FORMAT or len(self._signing_columns(conn)) < 2:
                # An older ledger is brought to this format, looked at again and migrated in one write
                # transaction: processes opening it at once all find it old, and only the first may migrate.
                conn.execute("BEGIN IMMEDIATE")
                try:
                    self._migrate(conn)
                    conn.execute("COMMIT")
                except BaseException:
                    conn.execute("ROLLBACK")
                    raise
            conn.execute(
                "INSERT OR IGNORE INTO meta (name, value) VALUES ('ledger_id', ?)", (secrets.token_hex(16),)
            )
            self.ledger_id = conn.execute("SELECT value FROM meta WHERE name = 'ledger_id'").fetchone()[0]
        except BaseException:
            conn.close()
            raise
        return conn

    def _format(self, conn: sqlite3.Connection) -> int:
        """The format ``meta`` names (1 when it names none: written before the marker).

        Raises:
            LedgerFormatError: a format newer than this perfgate's (or not a number).
        """
        row = conn.execute("SELECT value FROM meta WHERE name = 'format'").fetchone()
        if row is None:
            return 1
        value = str(row[0])
        if not value.isdigit() or int(value) > FORMAT:
            raise LedgerFormatError(
                f"the ledger {self.db_path} has format {value}, newer than this perfgate reads (up to {FORMAT}): "
                "upgrade perfgate (nothing was changed)"
            )
        return int(value)

    def _migrate(self, conn: sqlite3.Connection) -> None:
        """Bring a ledger of an older format to `FORMAT`, inside the caller's write transaction: a new
        database gets the marker; format 1 gains the signing columns when it predates signing (its records
        stay unsigned)."""
        found = self._format(conn)
        if found == FORMAT:
            return
        for column in ("key_id", "mac"):
            if column not in self._signing_columns(conn):
                conn.execute(f"ALTER TABLE evidence ADD COLUMN {column} TEXT")
        conn.execute("INSERT OR REPLACE INTO meta (name, value) VALUES ('format', ?)", (str(FORMAT),))
        if conn.execute("SELECT 1 FROM evidence LIMIT 1").fetchone() is not None:
            conn.execute(
                "INSERT OR IGNORE INTO meta (name, value) VALUES ('migrated_from', ?)", (str(found),)
            )

    @staticmethod
    def _signing_columns(conn: sqlite3.Connection) -> set[str]:
        """Which of the columns of a signed record (``key_id``, ``mac``) the evidence table has."""
        return {row[1] for row in conn.execute("PRAGMA table_info(evidence)")} & {"key_id", "mac"}

    def acquire(self) -> tuple[sqlite3.Connection, tuple[_FileId | None, ...] | None]:
        """Take the lock and the connection: `use` without its context manager (the append's path); give
        both back with `release` and what this returns second."""
        self.lock.acquire()
        try:
            pid = this_pid()
            now: tuple[_FileId | None, ...] | None = None
            if self.conn is not None and self.pid != pid:
                _INHERITED.append(self.conn)
                self.conn = None
            elif self.conn is not None:
                now = _file_ids(self.paths)
                if now != self.files:
                    self.conn.close()
                    self.conn = None
                    now = None
            if self.conn is None:
                self.conn = self._open()
                self.pid = pid
        except BaseException:
            self.lock.release()
            raise
        return self.conn, now

    def release(self, now: tuple[_FileId | None, ...] | None) -> None:
        """After a use: remember what this connection's own use changed (the database and the WAL, never
        which index file is there: only the opening, or another process, creates or replaces that one),
        and let go of the lock."""
        try:
            self.files = _file_ids(self.paths) if now is None else (*_file_ids(self.paths[:2]), now[2])
        finally:
            self.lock.release()

    @contextlib.contextmanager
    def use(self) -> Generator[sqlite3.Connection]:
        """The connection, under the lock. Reopened after a fork (the inherited one is left alone: closing
        it would drop the parent's POSIX locks) or when the database, its WAL or its index is no longer
        the file it had open: the database deleted, replaced or restored from a copy, or the WAL removed
        by another process that believed itself its last user (closing any other descriptor on
        ``ledger.db`` in this process drops SQLite's POSIX locks). Going on with the old files would
        lose records or read a stale index."""
        conn, now = self.acquire()
        try:
            yield conn
        finally:
            self.release(now)

    def close(self) -> None:
        with self.lock:
            if self.conn is not None and self.pid == os.getpid():
                self.conn.close()
            self.conn = None


# Connections inherited through fork are never used or closed by the child; they are only kept from the
# collector (see `Connection.use`).
_INHERITED: list[sqlite3.Connection] = []
# Weak: a database's connection lives as long as some `Ledger` on it (a process that opens many
# workspaces, such as a test run, does not keep their files open).
_CONNECTIONS: weakref.WeakValueDictionary[Path, Connection] = weakref.WeakValueDictionary()
_CONNECTIONS_LOCK = threading.Lock()


def connection(db_path: Path) -> Connection:
    with _CONNECTIONS_LOCK:
        found = _CONNECTIONS.get(db_path)
        if found is None:
            found = _CONNECTIONS[db_path] = Connection(db_path)
        return found
