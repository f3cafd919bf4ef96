"""The evidence ledger: an append-only SQLite database with a hash chain, signed and anchored.

Every record stores its canonical JSON body and ``hash = sha256(prev_hash || body)``. The chain makes an
edited, reordered or removed record detectable (`Ledger.verify`), and each record lists its artifacts with
their sha256 so an artifact edited on disk is detected too.

The workspace is writable by the agent, so the chain alone proves nothing: anyone can recompute it. Each
record therefore also carries an HMAC under the signing key of the trust root (`perfgate.trust`, outside
the workspace), over this ledger's id, the record's sequence number and its hash; and after every append
the head (sequence and hash, also MACed) is anchored in the trust root. `verify` then tells apart an
edited record, a recomputed chain or a record written without the key (a forgery), a record signed by a
key the trust root no longer has (key lost or replaced: unverifiable), a removed tail and a rollback to an
older copy. The read API (`get`, `get_many`, `records`) returns only records whose MAC verifies, so
nothing the server did not write is ever used as evidence; without access to the key (another user, a
lost key) the ledger stays readable for show, export and report, flagged as unverified.

Durability: WAL journal with ``synchronous=FULL``, one short ``BEGIN IMMEDIATE`` transaction per append, so
concurrent writers (threads or processes) serialize on SQLite's lock, and a record is on disk before the
tool that produced it answers. Artifacts are written and hashed before their record is committed; a crash
in between leaves an unreferenced artifact folder, which `verify` reports as a warning, never an error.

Speed: each `Ledger` keeps one connection for the life of its process (reopened after a fork, or when the
database file was replaced underneath it), shared by its threads under a lock, so an append costs one
WAL commit (one fsync) instead of opening, checkpointing and deleting the WAL every time. The WAL stays
(SQLite checkpoints it as it grows), so a copy of ``ledger.db`` alone may miss the newest records: copy
``ledger.db-wal`` with it (the README says so too). The anchor is two fixed-size slots
rewritten in place, alternately (the slot being replaced is never the newest; of its bytes, only those up
to the end of the new text are written when the rest, spaces, is there already): a kill -9 loses
nothing, since the page cache survives the process, and a power cut can at worst leave the anchor one
append behind the ledger, which `verify` accepts (it only ever flags a ledger *shorter* than its
anchor). HEAD is rewritten in place too, as a fixed-width line. Both files stay open between appends
and are written through those descriptors only while their paths still name the very files opened
(device, inode, type, mode and owner, by one ``lstat``): a file replaced, moved, turned into a link
or re-permissioned (HEAD also: given a second name) is opened afresh, as on every append before. Each append still reads both anchor
slots under the anchor's lock, but parses them and checks their MACs only when their bytes differ from
what this `Ledger` last read or wrote (another writer's slot is always checked afresh). The chain head is
read inside the write transaction, never cached: a concurrent writer's record cannot be skipped.
A record's inputs and result, most of its bytes, are encoded to canonical JSON once: the input digest
hashes that text and the body is spliced from it, byte for byte what encoding the whole record gives;
the body is then read back strictly as a record before it is stored, so a body no reader could parse is
never committed, and the record returned is exactly what every later read gives.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import io
import json
import os
import secrets
import sqlite3
import stat
import threading
import time
import weakref
from collections.abc import Callable, Generator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, cast

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from perfgate._safeopen import UnsafeFileError
from perfgate._sqlite import retry_while_busy
from perfgate._statefs import make_dirs, write_file
from perfgate.evidence.artifacts import ArtifactChanged, check_artifact
from perfgate.evidence.states import EvidenceState
from perfgate.trust import CorruptKeyError, SigningKey, TrustRoot, TrustRootError

__all__ = [
    "STATE_DIR_NAME",
    "Artifact",
    "EvidenceDraft",
    "EvidenceRecord",
    "Ledger",
    "VerifyReport",
    "canonical_json",
    "digest_inputs",
    "file_digest",
    "sha256_file",
]

STATE_DIR_NAME = ".perfgate"
GENESIS_HASH = "0" * 64
_SCHEMA = """
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


_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


_COMPACT = json.JSONEncoder(separators=(",", ":"))
_encode_str = cast("Callable[[str], str]", json.encoder.encode_basestring)  # type: ignore[attr-defined]
"""A string as canonical JSON writes it (``ensure_ascii=False``: the encoder's own function)."""


def _no_default(value: Any) -> Any:
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


_make_encoder: Any = getattr(json.encoder, "c_make_encoder", None)
_CANONICAL_TREE: Callable[[Any, int], list[str]] | None = (
    _make_encoder(None, _no_default, _encode_str, None, ":", ",", True, False, False)
    if _make_encoder
    else None
)
"""The canonical encoder's C core, made once, without the circular-reference check: for the trees
`Redactor` just built (new containers all, so no cycle), where `canonical_json` makes it per call."""


def _canonical_tree(value: Any) -> str:
    """``canonical_json`` of a tree of new containers (the scrubber's output)."""
    if _CANONICAL_TREE is None or isinstance(value, str):
        return canonical_json(value)
    return "".join(_CANONICAL_TREE(value, 0))


def canonical_json(value: Any) -> str:
    """JSON with sorted keys and no whitespace: the form that is hashed."""
    return _CANONICAL.encode(value)


def digest_inputs(inputs: Any) -> str:
    """sha256 of the canonical JSON of a tool's validated inputs."""
    return hashlib.sha256(canonical_json(inputs).encode()).hexdigest()


def file_digest(
    path: Path, *, chunk_bytes: int = 4 << 20, on_chunk: Callable[[], None] | None = None
) -> tuple[str, int]:
    """Streamed sha256 (hex) and size in bytes of a file, through one reusable buffer (bounded memory
    for checkpoint-sized files). ``on_chunk`` runs before each chunk: raise from it to stop early."""
    with path.open("rb", buffering=0) as f:
        return _digest_open(f, chunk_bytes, on_chunk)


def _digest_open(
    f: io.FileIO, chunk_bytes: int = 4 << 20, on_chunk: Callable[[], None] | None = None
) -> tuple[str, int]:
    """`file_digest` of a file open unbuffered, read from where it stands. The buffer is no larger than
    the file (plus a byte, to see its end in one read): a fresh 4 MiB buffer costs a millisecond of page
    faults, more than hashing a plot. A file that grew meanwhile is still read to its end, in more reads."""
    h = hashlib.sha256()
    buffer = bytearray(max(1, min(chunk_bytes, os.fstat(f.fileno()).st_size + 1)))
    view = memoryview(buffer)
    size = 0
    while n := f.readinto(buffer):
        if on_chunk is not None:
            on_chunk()
        h.update(view[:n])
        size += n
    return h.hexdigest(), size


def sha256_file(path: Path) -> str:
    """Streamed sha256 (hex) of a file."""
    return file_digest(path)[0]


# The current UTC second as ISO 8601 and as an id's stamp, written once per second (formatting a datetime
# costs more than the rest of a timestamp).
_second: tuple[int, str, str] = (-1, "", "")


def _utc_second() -> tuple[str, str, int]:
    """The current UTC time: ``YYYY-MM-DDTHH:MM:SS``, ``YYYYmmddTHHMMSS`` and the microseconds."""
    global _second
    second, micro = divmod(time.time_ns() // 1000, 1_000_000)
    known = _second
    if known[0] != second:
        moment = datetime.fromtimestamp(second, timezone.utc)
        known = _second = (second, moment.strftime("%Y-%m-%dT%H:%M:%S"), moment.strftime("%Y%m%dT%H%M%S"))
    return known[1], known[2], micro


def _utc_now() -> str:
    """``datetime.now(timezone.utc).isoformat(timespec="microseconds")``."""
    iso, _, micro = _utc_second()
    return f"{iso}.{micro:06d}+00:00"


class Artifact(BaseModel):
    """A file produced with a record, stored under ``.perfgate/artifacts/<evidence id>/``."""

    model_config = ConfigDict(frozen=True)

    name: str = Field(description="File name inside the record's artifact folder.")
    path: str = Field(description="Path relative to the workspace.")
    sha256: str
    size_bytes: int


class EvidenceDraft(BaseModel):
    """What a tool hands the ledger; the ledger adds sequence, timestamps and hashes."""

    id: str
    tool: str
    state: EvidenceState
    inputs: dict[str, Any] = Field(default_factory=dict[str, Any])
    result: dict[str, Any] = Field(default_factory=dict[str, Any])
    profiled: bool = False
    command: list[str] | None = None
    exit_code: int | None = None
    environment_id: str | None = None
    artifact_names: list[str] = Field(default_factory=list[str])
    started_at: str | None = None


class EvidenceRecord(BaseModel):
    """One committed piece of evidence, exactly as hashed."""

    seq: int
    id: str
    tool: str
    state: EvidenceState
    created_at: str
    started_at: str | None
    input_digest: str
    inputs: dict[str, Any]
    result: dict[str, Any]
    profiled: bool
    command: list[str] | None
    exit_code: int | None
    environment_id: str | None
    artifacts: list[Artifact]
    prev_hash: str
    hash: str = ""


_BODY_FIELDS = tuple(name for name in EvidenceRecord.model_fields if name != "hash")


def _json_value(value: Any) -> str:
    """``canonical_json(value)``, without the encoder's set-up for the scalars a record's fields hold."""
    kind: type = type(value)  # pyright: ignore[reportUnknownVariableType, reportUnknownArgumentType]
    if kind is str:
        return _encode_str(value)
    if value is None:
        return "null"
    if kind is int:
        return int.__repr__(value)
    if kind is bool:
        return "true" if value else "false"
    return canonical_json(value)


def _body_text(
    *,
    seq: int,
    draft: EvidenceDraft,
    created_at: str,
    input_digest: str,
    inputs_text: str,
    result_text: str,
    command: list[str] | None,
    artifacts: list[Artifact],
    prev_hash: str,
) -> str:
    """The canonical JSON of the record these values make (``canonical_json`` of its dump without
    ``hash``), written field by field in sorted order: the inputs and result as the canonical texts
    already written (most of a record's bytes, encoded once), the other fields' values as canonical
    JSON writes them. The caller validates the text as a record before it is stored."""
    j = _json_value
    return (
        f'{{"artifacts":{canonical_json([a.model_dump(mode="json") for a in artifacts]) if artifacts else "[]"}'
        f',"command":{j(command)},"created_at":{j(created_at)},"environment_id":{j(draft.environment_id)}'
        f',"exit_code":{j(draft.exit_code)},"id":{j(draft.id)},"input_digest":{j(input_digest)}'
        f',"inputs":{inputs_text},"prev_hash":{j(prev_hash)},"profiled":{j(draft.profiled)}'
        f',"result":{result_text},"seq":{j(seq)},"started_at":{j(draft.started_at)}'
        f',"state":{j(EvidenceState(draft.state).value)},"tool":{j(draft.tool)}}}'
    )


# `_body_text` writes these fields, in this order: a field added to the record must be added there.
assert tuple(sorted(_BODY_FIELDS)) == (
    "artifacts", "command", "created_at", "environment_id", "exit_code", "id", "input_digest", "inputs",
    "prev_hash", "profiled", "result", "seq", "started_at", "state", "tool",
)  # fmt: skip


class VerifyReport(BaseModel):
    """Outcome of `Ledger.verify`: ``ok`` is false when anything was edited, forged, lost or rolled back."""

    ok: bool
    records: int
    errors: list[str]
    warnings: list[str]
    signed_records: int = Field(
        default=0, description="Records whose MAC verifies under the trust root's key."
    )
    key_id: str | None = Field(default=None, description="The trust root's current key (None: no key).")


_RECORD_MAC = "perfgate-ledger-record"
_ANCHOR_MAC = "perfgate-ledger-anchor"
_ANCHOR_FILE = "anchor.slots"
_LEGACY_ANCHOR_FILE = "anchor.json"
_ANCHOR_SLOT = 8192  # bytes per slot; an anchor is ~300 bytes plus ~80 per replaced database
_FIRST_ANCHOR_WAIT_S = 0.2
"""How long `Ledger.verify` waits before it looks again at records without an anchor (an append in another
process writes the anchor within a millisecond or so of its commit)."""
_HEAD_WIDTH = 96  # "seq hash" padded with spaces, then a newline
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)
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


def _own_plain_file(st: os.stat_result) -> bool:
    """A regular file with no other name (HEAD is written in place only then, never through a link)."""
    return stat.S_ISREG(st.st_mode) and st.st_nlink == 1


def _any_file(st: os.stat_result) -> bool:
    return True


_encode_ascii = cast("Callable[[str], str]", json.encoder.encode_basestring_ascii)  # type: ignore[attr-defined]


def _anchor_text(anchor: dict[str, Any]) -> bytes:
    """``_COMPACT.encode(anchor).encode()`` for an anchor as `Ledger._advance_anchor` makes it (its ids,
    hash and MAC strings, its sequence an int): written field by field, the replaced list encoded."""
    replaced = anchor["replaced"]
    return (
        f'{{"ledger_id":{_encode_ascii(anchor["ledger_id"])},"workspace":{_encode_ascii(anchor["workspace"])}'
        f',"seq":{int.__repr__(anchor["seq"])},"hash":{_encode_ascii(anchor["hash"])}'
        f',"key_id":{_encode_ascii(anchor["key_id"])},"mac":{_encode_ascii(anchor["mac"])}'
        f',"replaced":{_COMPACT.encode(replaced) if replaced else "[]"}}}'
    ).encode()


def _changed_end(old: bytes, new: bytes, start: int) -> int:
    """How much of ``new`` (a slot: ``start`` bytes of text, spaces, a newline) must be written over ``old``
    (what the slot holds now, read under the anchor's lock) for the slot to hold ``new``: the text alone
    when everything after it is already there (the slot held a text no longer than this one, as when the
    anchor only moves forward), else all of it."""
    return start if len(old) == len(new) and old[start:] == new[start:] else len(new)


def _slot_seq(slot: dict[str, Any]) -> int:
    seq = slot.get("seq")
    return seq if isinstance(seq, int) else -1


class _HeldFile:
    """A file a `Ledger` keeps open between appends (HEAD, the anchor), used only while its path still
    names that very file.

    Before each use the path is looked at again (``lstat``, one system call instead of open and close):
    the descriptor is used only when the path's device, inode, type, permissions and owner are those it
    was opened with, in the process that opened it. Anything else (the file replaced, moved away, turned
    into a link, re-permissioned; a forked child) closes it (a child just forgets the inherited one) and
    the caller opens the path afresh, exactly as it did on every append before.
    """

    def __init__(self) -> None:
        self.fd: int | None = None
        self.pid = 0
        self.ident: tuple[int, ...] = ()

    @staticmethod
    def _ident(st: os.stat_result) -> tuple[int, ...]:
        return (st.st_dev, st.st_ino, st.st_mode, st.st_uid, st.st_gid)

    def get(
        self, path: Path, pid: int, accept: Callable[[os.stat_result], bool]
    ) -> tuple[int, os.stat_result] | None:
        """The held descriptor and the path's ``lstat``, when the path still names the held file and
        ``accept`` takes it; else None (and nothing held any more)."""
        fd = self.fd
        if fd is None:
            return None
        if self.pid == pid:
            try:
                st = os.lstat(path)
            except OSError:
                st = None
            if st is not None and self._ident(st) == self.ident and accept(st):
                return fd, st
            os.close(fd)
        self.fd = None
        return None

    def hold(self, fd: int, pid: int) -> None:
        """Keep ``fd`` (just opened on the path, by this process) for the next use."""
        self.close(pid)
        self.ident = self._ident(os.fstat(fd))
        self.fd, self.pid = fd, pid

    def close(self, pid: int) -> None:
        if self.fd is not None and self.pid == pid:
            os.close(self.fd)
        self.fd = None


_BUSY_TIMEOUT_S = 60.0

_pid = os.getpid()


def _refresh_pid() -> None:
    global _pid
    _pid = os.getpid()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_refresh_pid)


def _this_pid() -> int:
    """``os.getpid()`` without its system call: remembered, and read again in a child of ``os.fork``."""
    return _pid


class _Connection:
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
            conn.executescript(_SCHEMA)
            if len(self._signing_columns(conn)) < 2:
                # A ledger from before signing (its records stay unsigned) gains the columns. Looked at
                # again and added in one write transaction: processes opening it at once all find the
                # columns missing, and only the first may add them.
                conn.execute("BEGIN IMMEDIATE")
                try:
                    for column in ("key_id", "mac"):
                        if column not in self._signing_columns(conn):
                            conn.execute(f"ALTER TABLE evidence ADD COLUMN {column} TEXT")
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

    @staticmethod
    def _signing_columns(conn: sqlite3.Connection) -> set[str]:
        """Which of the columns of a signed record (``key_id``, ``mac``) the evidence table has."""
        return {row[1] for row in conn.execute("PRAGMA table_info(evidence)")} & {"key_id", "mac"}

    def acquire(self) -> tuple[sqlite3.Connection, tuple[_FileId | None, ...] | None]:
        """Take the lock and the connection: `use` without its context manager (the append's path); give
        both back with `release` and what this returns second."""
        self.lock.acquire()
        try:
            pid = _this_pid()
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
# collector (see `_Connection.use`).
_INHERITED: list[sqlite3.Connection] = []
# Weak: a database's connection lives as long as some `Ledger` on it (a process that opens many
# workspaces, such as a test run, does not keep their files open).
_CONNECTIONS: weakref.WeakValueDictionary[Path, _Connection] = weakref.WeakValueDictionary()
_CONNECTIONS_LOCK = threading.Lock()


def _connection(db_path: Path) -> _Connection:
    with _CONNECTIONS_LOCK:
        found = _CONNECTIONS.get(db_path)
        if found is None:
            found = _CONNECTIONS[db_path] = _Connection(db_path)
        return found


class Ledger:
    """The append-only evidence store of one workspace.

    Methods are synchronous and cheap; call them from a worker thread in async code (tool calls hand their
    appends to the process's ledger thread: `perfgate.evidence._writer.run_in_ledger_thread`). Every `Ledger` on
    a database shares its process's one connection under a lock, and writers serialize on SQLite's
    lock, so one `Ledger` is safe to share between threads and processes. ``trust`` is where the signing
    key and the anchor live (default: `TrustRoot.locate` from the environment).
    """

    def __init__(self, workspace: Path, trust: TrustRoot | None = None) -> None:
        self.workspace = workspace.resolve()
        self.trust = trust or TrustRoot.locate()
        self.state_dir = self.workspace / STATE_DIR_NAME
        self.db_path = self.state_dir / "ledger.db"
        self.head_path = self.state_dir / "HEAD"
        self.artifact_root = self.state_dir / "artifacts"
        make_dirs(self.artifact_root)  # and the state folder: refused when either is a planted link
        ignore = self.state_dir / ".gitignore"
        if not os.path.lexists(ignore):
            # nothing here is the user's code: `git add -A` leaves it out (an existing file is the user's)
            write_file(ignore, b"# perfgate's state: evidence, artifacts, reports\n*\n")
        self._key: tuple[SigningKey | None, tuple[int, ...] | None] = (None, None)
        """The key last read, and what identified its file then (one value: threads replace it whole)."""
        self.key_error: TrustRootError | None = None
        """Why `signing_key` found no key, when it raised (unreadable, or a corrupt key file)."""
        self._shared = _connection(self.db_path)
        self._lock = self._shared.lock
        self._anchor_file: Path | None = None
        self._anchor_lock_fd: int | None = None
        self._anchor_lock_pid = 0
        self._head_file = _HeldFile()
        self._anchor_out = _HeldFile()
        # (the two anchor slots' bytes, key, ledger id) -> their parsed values and the one in force
        self._anchor_memo: (
            tuple[tuple[bytes, bytes, bytes, str], list[dict[str, Any] | None], int | None] | None
        ) = None
        with self._connect():
            pass

    @property
    def ledger_id(self) -> str:
        """The id of the database this ledger reads and writes (set when its connection opens)."""
        return self._shared.ledger_id

    @contextlib.contextmanager
    def _connect(self) -> Generator[sqlite3.Connection]:
        """This process's connection to the database (one per process, shared by every `Ledger` on it and
        by their threads), held under its lock for the duration of the block."""
        with self._shared.use() as conn:
            yield conn

    def close(self) -> None:
        """Close this process's connection to the database (the next call reopens it)."""
        self._shared.close()
        with self._lock:
            pid = os.getpid()
            if self._anchor_lock_fd is not None and self._anchor_lock_pid == pid:
                os.close(self._anchor_lock_fd)
            self._anchor_lock_fd = None
            self._head_file.close(pid)
            self._anchor_out.close(pid)

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            pid = os.getpid()
            if self._anchor_lock_fd is not None and self._anchor_lock_pid == pid:
                os.close(self._anchor_lock_fd)
            self._head_file.close(pid)
            self._anchor_out.close(pid)

    # ------------------------------------------------------------------ keys and anchor

    def signing_key(self) -> SigningKey | None:
        """The trust root's key, or None when this process cannot read it (another user, none yet, or a
        corrupt key file: `key_error` says which of the last two)."""
        try:
            key = self._current_key(create=False)
        except TrustRootError as exc:
            self.key_error = exc
            return None
        self.key_error = None
        return key

    def _current_key(self, *, create: bool) -> SigningKey | None:
        """The key in the trust root's key file now, read again whenever that file is another one than
        the key in memory was read from: an operator who moves a key aside (it leaked) has the running
        server sign and check with the next one, not the old one until a restart. ``create`` makes a key
        when there is none (appends only). One ``stat`` when nothing changed.

        Raises:
            TrustRootError: the key cannot be read (or, with ``create``, made), or is corrupt.
        """
        try:
            st = os.stat(self.trust.key_path)
            seen: tuple[int, ...] | None = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
        except OSError:
            seen = None
        known, known_file = self._key
        if known is not None and seen is not None and seen == known_file:
            return known
        key = self.trust.ensure_key() if create else self.trust.key()
        self._key = (key, seen)  # ``seen`` is from before the read: a file replaced meanwhile is read again
        return key

    @property
    def verifiable(self) -> bool:
        """Whether this process can check MACs; without the key, reads return every record unverified."""
        return self.signing_key() is not None

    @property
    def anchor_path(self) -> Path:
        if self._anchor_file is None:
            self._anchor_file = self.trust.workspace_dir(self.workspace, create=False) / _ANCHOR_FILE
        return self._anchor_file

    def _record_message(self, seq: int, hash_: str) -> str:
        return f"{self.ledger_id}:{seq}:{hash_}"

    def _anchor_message(self, seq: int, hash_: str) -> str:
        return f"{self.workspace}:{self.ledger_id}:{seq}:{hash_}"

    def _anchor_raw_slots(self) -> list[bytes]:
        """The anchor file's two slots as bytes (empty when the file or the slot is absent)."""
        try:
            data = self.anchor_path.read_bytes()
        except FileNotFoundError:
            return [b"", b""]
        except OSError as exc:
            if isinstance(exc, PermissionError):
                raise TrustRootError(f"cannot read {self.anchor_path}: permission denied") from exc
            raise
        return [data[:_ANCHOR_SLOT], data[_ANCHOR_SLOT : 2 * _ANCHOR_SLOT]]

    @staticmethod
    def _parse_slot(raw: bytes) -> dict[str, Any] | None:
        try:
            value = json.loads(raw) if raw else None
        except ValueError:
            value = None
        return cast("dict[str, Any]", value) if isinstance(value, dict) else None

    def _anchor_slots(self) -> list[dict[str, Any] | None]:
        """The anchor file's two slots, each parsed (None: empty, torn or not an anchor)."""
        return [self._parse_slot(raw) for raw in self._anchor_raw_slots()]

    def _known_slots(
        self, key: SigningKey, raws: tuple[bytes, bytes]
    ) -> tuple[list[dict[str, Any] | None], int | None]:
        """`_anchor_slots` and `_best_slot` for the append path, remembered by the slots' exact bytes.

        Parsing both 8 KiB slots and checking their MACs is most of what an anchor update costs, and the
        slots almost always hold what this process wrote itself. The memo is keyed by content (the raw
        bytes read now, the key and the ledger id), so a slot written by another process, edited or torn
        is parsed and checked afresh. Its parsed values are read, never handed out.
        """
        memo_key = (*raws, key.secret, self.ledger_id)
        known = self._anchor_memo
        if known is not None and known[0] == memo_key:
            return known[1], known[2]
        slots = [self._parse_slot(raw) for raw in raws]
        best = self._best_slot(slots, key)
        self._anchor_memo = (memo_key, slots, best)
        return slots, best

    def _best_slot(self, slots: list[dict[str, Any] | None], key: SigningKey | None) -> int | None:
        """Index of the anchor in force: the newest whose MAC verifies (with a key), else the newest."""

        def rank(i: int) -> tuple[bool, int]:
            slot = slots[i]
            assert slot is not None
            return (self._slot_good(slot, key), _slot_seq(slot))

        present = [i for i in range(2) if slots[i] is not None]
        return max(present, key=rank) if present else None

    def _slot_good(self, slot: dict[str, Any], key: SigningKey | None) -> bool:
        """Whether an anchor slot is this ledger's and its MAC verifies under ``key``."""
        seq, hash_ = slot.get("seq"), slot.get("hash")
        return (
            key is not None
            and isinstance(seq, int)
            and isinstance(hash_, str)
            and slot.get("ledger_id") == self.ledger_id
            and key.check(_ANCHOR_MAC, self._anchor_message(seq, hash_), cast("str | None", slot.get("mac")))
        )

    def _read_anchor(self, key: SigningKey | None = None) -> dict[str, Any] | None:
        """The anchor in force (from an older perfgate's ``anchor.json`` when no slot is written yet)."""
        slots = self._anchor_slots()
        best = self._best_slot(slots, key)
        if best is not None:
            return slots[best]
        data = self.trust.read_json(self.anchor_path.with_name(_LEGACY_ANCHOR_FILE))
        return cast("dict[str, Any]", data) if isinstance(data, dict) else None

    def anchor(self) -> dict[str, Any] | None:
        """The anchor in force for this workspace (ledger id, sequence, hash, MAC), or None."""
        with self._connect():  # the ledger id of the database now on disk
            pass
        return self._read_anchor(self.signing_key())

    def _anchor_lock(self) -> int:
        """This process's descriptor on the anchor's lock file (an flock serializes processes)."""
        pid = _this_pid()
        if self._anchor_lock_fd is None or self._anchor_lock_pid != pid:
            folder = self.trust.workspace_dir(self.workspace)
            self._anchor_lock_fd = os.open(folder / "anchor.lock", os.O_RDWR | os.O_CREAT | _CLOEXEC, 0o600)
            self._anchor_lock_pid = pid
        return self._anchor_lock_fd

    def _write_anchor(self, key: SigningKey, seq: int, hash_: str) -> None:
        """Move the anchor forward to ``seq`` (never backwards: concurrent writers race here).

        The new anchor goes into the slot that does not hold the anchor in force, so a write torn by a
        power cut leaves the previous one readable. Not fsynced (see the module docstring).
        """
        import fcntl

        with self._lock:
            fd = self._anchor_lock()
            pid = self._anchor_lock_pid
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                held = self._anchor_out.get(self.anchor_path, pid, _any_file)
                if held is not None:
                    out = held[0]
                else:
                    try:
                        out = os.open(self.anchor_path, os.O_RDWR | os.O_CREAT | _NOFOLLOW | _CLOEXEC, 0o600)
                    except PermissionError as exc:
                        raise TrustRootError(f"cannot write {self.anchor_path}: permission denied") from exc
                    self._anchor_out.hold(out, pid)
                self._advance_anchor(out, key, seq, hash_)
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)

    def _advance_anchor(self, out: int, key: SigningKey, seq: int, hash_: str) -> None:
        """`_write_anchor` on the anchor file open as ``out``, under its lock."""
        data = b""
        while len(data) < 2 * _ANCHOR_SLOT and (
            chunk := os.pread(out, 2 * _ANCHOR_SLOT - len(data), len(data))
        ):
            data += chunk
        raws = (data[:_ANCHOR_SLOT], data[_ANCHOR_SLOT : 2 * _ANCHOR_SLOT])
        slots, best = self._known_slots(key, raws)
        current = slots[best] if best is not None else self._read_anchor(key)
        replaced: list[Any] = []
        if current is not None:
            replaced = list(cast("list[Any]", current.get("replaced") or []))
            if current.get("ledger_id") == self.ledger_id:
                if isinstance(current.get("seq"), int) and current["seq"] >= seq:
                    return
            else:  # the database was deleted or swapped: remember it, so verify keeps saying so
                replaced.append({"ledger_id": current.get("ledger_id"), "seq": current.get("seq")})
        anchor: dict[str, Any] = {
            "ledger_id": self.ledger_id,
            "workspace": str(self.workspace),
            "seq": seq,
            "hash": hash_,
            "key_id": key.key_id,
            "mac": key.mac(_ANCHOR_MAC, self._anchor_message(seq, hash_)),
            "replaced": replaced,
        }
        text = _anchor_text(anchor)
        while len(text) >= _ANCHOR_SLOT and anchor["replaced"]:  # keep the newest replacements
            anchor["replaced"] = anchor["replaced"][1:]
            text = _anchor_text(anchor)
        target = 1 - best if best is not None else 0
        raw = text.ljust(_ANCHOR_SLOT - 1) + b"\n"
        os.pwrite(out, raw[: _changed_end(raws[target], raw, len(text))], target * _ANCHOR_SLOT)
        # What the slots hold now, as the next append will read them unless another process writes: the
        # one just written, newest and MACed by this key, is in force.
        if best is not None:
            written = (raw, raws[1]) if target == 0 else (raws[0], raw)
            new_slots = list(slots)
            new_slots[target] = anchor
            self._anchor_memo = ((*written, key.secret, self.ledger_id), new_slots, target)
        else:
            self._anchor_memo = None

    def _record_problem(
        self, key: SigningKey | None, seq: int, body: str, hash_: str, key_id: str | None, mac: str | None
    ) -> str | None:
        """Why a stored row is not trustworthy evidence under ``key`` (the caller's `signing_key`, taken once
        for all the rows it checks), or None when its hash and MAC verify."""
        try:
            record = EvidenceRecord.model_validate_json(body)
        except ValueError:
            return "its body is not a valid evidence record"
        if hashlib.sha256((record.prev_hash + body).encode()).hexdigest() != hash_:
            return "edited: its hash does not match its body"
        if key is None:
            return "unverifiable: this process cannot read the trust root's signing key"
        if mac is None:
            return "unsigned: written without the trust root's key (by another process or before signing)"
        if key_id != key.key_id:
            if key_id in self.trust.retired_key_ids():
                return f"signed by retired key {key_id}: unverifiable"
            return f"signed by key {key_id}, which this trust root does not have (key lost or replaced): unverifiable"
        if not key.check(_RECORD_MAC, self._record_message(seq, hash_), mac):
            return "forged: its MAC does not verify (chain recomputed or record written without the key)"
        return None

    # ------------------------------------------------------------------ writing
    @staticmethod
    def timestamp() -> str:
        """The current UTC time as records hold it (ISO 8601 with microseconds and ``+00:00``)."""
        return _utc_now()

    @staticmethod
    def new_id(prefix: str = "ev") -> str:
        """A fresh evidence id: a UTC timestamp for humans plus randomness for uniqueness."""
        return f"{prefix}-{_utc_second()[1]}-{secrets.token_hex(4)}"

    def artifact_dir(self, evidence_id: str, *, create: bool = True) -> Path:
        """The folder where a record's artifacts are written before the record is appended (created
        unless ``create`` is false: a record without artifacts needs none)."""
        if not evidence_id or "/" in evidence_id or evidence_id.startswith("."):
            raise ValueError(f"invalid evidence id {evidence_id!r}")
        path = self.artifact_root / evidence_id
        if create:
            make_dirs(path)
        return path

    def _artifacts(self, draft: EvidenceDraft) -> list[Artifact]:
        if not draft.artifact_names:
            return []
        folder = self.artifact_root / draft.id
        artifacts: list[Artifact] = []
        for name in sorted(set(draft.artifact_names)):
            path = folder / name
            if not path.is_file():
                raise FileNotFoundError(f"artifact {name!r} of {draft.id} was not written")
            with path.open("rb", buffering=0) as f:  # made durable, then hashed as it is on disk
                os.fsync(f.fileno())
                digest, size = _digest_open(f)
            artifacts.append(
                Artifact(
                    name=name, path=str(path.relative_to(self.workspace)), sha256=digest, size_bytes=size
                )
            )
        return artifacts

    def append(self, draft: EvidenceDraft) -> EvidenceRecord:
        """Commit one record, signed with the trust root's key; returns it once it is durable on disk.

        Raises:
            FileNotFoundError: a named artifact does not exist in the record's artifact folder.
            ValueError: the id is already taken, or the draft holds values JSON cannot represent.
            TrustRootError: the trust root's key cannot be read or created (only the server and the
                operator's own commands can append evidence).
        """
        from perfgate.redaction import Scrubber

        key = self._current_key(create=True)
        assert key is not None
        artifacts = self._artifacts(draft)
        # Nothing secret is ever stored: the one redaction layer, keyed by what this record carries. Most
        # records carry no env mapping or argv list: one pass of the plain scrubber is then what
        # `Scrubber.for_tree` would give; otherwise the pass is made again by the scrubber built for them.
        scrub = Scrubber()
        scrubbed = scrub.tree(draft.inputs), scrub.tree(draft.result)
        if scrub.structured or draft.command:
            scrub = Scrubber.for_tree(draft.inputs, draft.result, {"command": draft.command or []})
            scrubbed = scrub.tree(draft.inputs), scrub.tree(draft.result)
        # Encoded once: the canonical texts are hashed and stored as they are, unless a key was not a plain
        # string (read back as one, it can sort elsewhere): then they are written again from what JSON
        # holds. The record returned is the stored body read back (what every later read gives).
        inputs_text = _canonical_tree(scrubbed[0])
        result_text = _canonical_tree(scrubbed[1])
        if scrub.keys_changed:
            inputs, result = json.loads(f"[{inputs_text},{result_text}]")
            inputs_text, result_text = canonical_json(inputs), canonical_json(result)
        input_digest = hashlib.sha256(inputs_text.encode()).hexdigest()
        command = scrub.argv(draft.command) if draft.command is not None else None
        conn, files = self._shared.acquire()  # `use`, without a context manager's cost
        try:
            conn.execute("BEGIN IMMEDIATE")
            try:
                row = conn.execute("SELECT seq, hash FROM evidence ORDER BY seq DESC LIMIT 1").fetchone()
                seq, prev_hash = (row[0] + 1, row[1]) if row else (1, GENESIS_HASH)
                body = _body_text(
                    seq=seq,
                    draft=draft,
                    created_at=_utc_now(),
                    input_digest=input_digest,
                    inputs_text=inputs_text,
                    result_text=result_text,
                    command=command,
                    artifacts=artifacts,
                    prev_hash=prev_hash,
                )
                try:  # what readers parse; strict: each value is stored as the type the record holds
                    record = EvidenceRecord.model_validate_json(body, strict=True)
                except ValidationError as exc:
                    raise ValueError(f"evidence {draft.id!r} is not a valid record: {exc}") from exc
                record.hash = hashlib.sha256((prev_hash + body).encode()).hexdigest()
                mac = key.mac(_RECORD_MAC, self._record_message(seq, record.hash))
                try:
                    conn.execute(
                        "INSERT INTO evidence (seq, id, tool, state, body, hash, key_id, mac) "
                        "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                        (seq, record.id, record.tool, record.state.value, body, record.hash, key.key_id, mac),
                    )
                except sqlite3.IntegrityError as exc:
                    raise ValueError(f"evidence id {draft.id!r} already exists") from exc
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            # Still under this process's lock: its threads move HEAD and the anchor forward in order.
            self._write_head(record.seq, record.hash)
            self._write_anchor(key, record.seq, record.hash)
        finally:
            self._shared.release(files)
        return record

    def _write_head(self, seq: int, hash_: str) -> None:
        """HEAD rewritten in place as one fixed-width line; replaced whole when it is not a plain file of
        its own (a link planted there is never written through)."""
        line = f"{seq} {hash_}".ljust(_HEAD_WIDTH - 1).encode() + b"\n"
        pid = self._shared.pid  # this process (the connection was just used, reopened after a fork)
        held = self._head_file.get(self.head_path, pid, _own_plain_file)
        if held is not None:
            fd, st = held
            os.pwrite(fd, line, 0)
            if st.st_size > len(line):
                os.ftruncate(fd, len(line))
            return
        try:
            fd = os.open(self.head_path, os.O_WRONLY | os.O_CREAT | _NOFOLLOW | _NONBLOCK | _CLOEXEC, 0o644)
        except OSError:
            fd = None
        if fd is not None:
            kept = False
            try:
                st = os.fstat(fd)
                if _own_plain_file(st):
                    os.pwrite(fd, line, 0)
                    if st.st_size > len(line):
                        os.ftruncate(fd, len(line))
                    self._head_file.hold(fd, pid)
                    kept = True
                    return
            finally:
                if not kept:
                    os.close(fd)
        write_file(self.head_path, line)

    # ------------------------------------------------------------------ reading

    _ROW = "seq, body, hash, key_id, mac"

    def _trusted(self, rows: list[tuple[Any, ...]], trusted_only: bool) -> list[EvidenceRecord]:
        out: list[EvidenceRecord] = []
        key = self.signing_key() if trusted_only else None
        for seq, body, hash_, key_id, mac in rows:
            if key is not None and self._record_problem(key, seq, body, hash_, key_id, mac) is not None:
                continue
            try:
                record = EvidenceRecord.model_validate_json(body)
            except ValueError:
                continue
            record.hash = hash_
            out.append(record)
        return out

    def get(self, evidence_id: str, *, trusted_only: bool = True) -> EvidenceRecord | None:
        """The record with this id, or None (also when its MAC does not verify: it is not evidence)."""
        with self._connect() as conn:
            rows = conn.execute(f"SELECT {self._ROW} FROM evidence WHERE id = ?", (evidence_id,)).fetchall()
        found = self._trusted(rows, trusted_only)
        return found[0] if found else None

    def get_many(self, evidence_ids: list[str]) -> list[EvidenceRecord]:
        """The records with these ids, in the order given; ids not in the ledger are skipped."""
        return [r for i in evidence_ids if (r := self.get(i)) is not None]

    def records(
        self, tool: str | None = None, limit: int | None = None, *, trusted_only: bool = True
    ) -> list[EvidenceRecord]:
        """Records in commit order (newest last); optionally one tool's, optionally the newest ``limit``.

        Only records whose MAC verifies are returned (every record when this process has no key, or
        with ``trusted_only=False``: for display, never for decisions).
        """
        query = f"SELECT {self._ROW} FROM evidence"
        params: list[Any] = []
        if tool is not None:
            query += " WHERE tool = ?"
            params.append(tool)
        query += " ORDER BY seq DESC"
        with self._connect() as conn:
            rows = conn.execute(query, params).fetchall()
        found = self._trusted(list(reversed(rows)), trusted_only)
        return found[-limit:] if limit is not None and limit > 0 else ([] if limit == 0 else found)

    def problems(self) -> dict[str, str]:
        """Evidence id -> why that record is not trusted (empty when every record verifies)."""
        with self._connect() as conn:
            rows = conn.execute("SELECT id, seq, body, hash, key_id, mac FROM evidence").fetchall()
        out: dict[str, str] = {}
        key = self.signing_key()
        for id_, seq, body, hash_, key_id, mac in rows:
            problem = self._record_problem(key, seq, body, hash_, key_id, mac)
            if problem is not None:
                out[id_] = problem
        return out

    def verify(self) -> VerifyReport:
        """Recompute the chain, every MAC and artifact sha256, and compare the head with the anchor.

        Errors name what happened: an edited record, a forged or recomputed one (MAC), a record signed by
        a key the trust root no longer has, removed records, a removed tail or a rollback; records with no
        readable key (nothing could be verified) are an error too. Records appended
        while it runs are not checked, and are no error (the anchor and HEAD are read before the records).
        """
        errors: list[str] = []
        warnings: list[str] = []
        prev_hash = GENESIS_HASH
        expected_seq = 1
        referenced: set[str] = set()
        hashes: dict[int, str] = {}
        key = self.signing_key()
        signed = 0
        anchor, head_text, rows = self._verify_inputs(key)
        if anchor is None and key is not None and rows:
            # Records and no anchor: another process may be between the very first commit and its anchor.
            # Looked at once more, a moment later (only a forger could make the anchor appear meanwhile,
            # and it needs the key).
            time.sleep(_FIRST_ANCHOR_WAIT_S)
            anchor, head_text, rows = self._verify_inputs(key)
        for seq, id_, tool, state, body, stored_hash, key_id, mac in rows:
            hashes[seq] = stored_hash
            if seq != expected_seq:
                errors.append(f"record sequence jumps from {expected_seq - 1} to {seq}: records were removed")
            expected_seq = seq + 1
            try:
                record = EvidenceRecord.model_validate_json(body)
            except ValueError:
                errors.append(f"record {seq} ({id_}): body is not a valid evidence record")
                prev_hash = stored_hash
                continue
            if hashlib.sha256((prev_hash + body).encode()).hexdigest() != stored_hash:
                errors.append(
                    f"record {seq} ({id_}): hash mismatch: the record or its predecessor was edited"
                )
            if record.prev_hash != prev_hash:
                errors.append(f"record {seq} ({id_}): chain link broken")
            if (record.seq, record.id, record.tool, record.state.value) != (seq, id_, tool, state):
                errors.append(f"record {seq} ({id_}): indexed columns differ from the hashed body")
            if key is not None:
                problem = self._record_problem(key, seq, body, stored_hash, key_id, mac)
                if problem is None:
                    signed += 1
                elif not problem.startswith("edited"):  # an edit is reported above already
                    errors.append(f"record {seq} ({id_}): {problem}; it is not used as evidence")
            referenced.add(record.id)
            for artifact in record.artifacts:
                try:
                    check_artifact(self.workspace, artifact)
                except ArtifactChanged as exc:
                    errors.append(f"record {id_}: {exc}")
            prev_hash = stored_hash
        if isinstance(self.key_error, CorruptKeyError):
            errors.append(str(self.key_error))  # damage to the trust root, not a reader without access to it
        elif key is None:
            if rows:  # a verification that checked no MAC is no pass
                errors.append(
                    f"no signing key readable in {self.trust.key_dir}: no MAC and no anchor could be checked, "
                    "so nothing here is verified (run as the operator, or pass the server's --state-dir)"
                )
        else:
            errors.extend(self._check_anchor(key, anchor, hashes))
        if head_text is not None:
            try:
                head_seq_text, head_hash = head_text.split()
                head_seq = int(head_seq_text)
            except ValueError:
                errors.append("HEAD file is corrupt")
            else:
                if hashes.get(head_seq) != head_hash:
                    errors.append(
                        f"HEAD names record {head_seq}, which is missing or different: the ledger was truncated"
                    )
        elif rows:
            warnings.append("HEAD file is missing; tail truncation cannot be checked")
        if self.artifact_root.is_dir():
            for folder in sorted(self.artifact_root.iterdir()):
                if folder.name not in referenced:
                    warnings.append(
                        f"artifact folder {folder.name} belongs to no record (a call that did not complete)"
                    )
        return VerifyReport(
            ok=not errors,
            records=len(rows),
            errors=errors,
            warnings=warnings,
            signed_records=signed,
            key_id=key.key_id if key else None,
        )

    def _verify_inputs(
        self, key: SigningKey | None
    ) -> tuple[dict[str, Any] | TrustRootError | None, str | None, list[tuple[Any, ...]]]:
        """What `verify` checks: the anchor in force, HEAD's text and every row.

        The anchor and HEAD are read first: both move forward only after a commit, so an append racing
        this leaves the rows ahead of them, never behind (read after the rows, they could name a record
        this read lacks: a removed tail, a truncated ledger, that never was).
        """
        with self._connect() as conn:
            anchor = self._anchor_to_check(key) if key is not None else None
            try:
                head_text: str | None = self.head_path.read_text()
            except FileNotFoundError:
                head_text = None
            rows = conn.execute(
                "SELECT seq, id, tool, state, body, hash, key_id, mac FROM evidence ORDER BY seq"
            ).fetchall()
        return anchor, head_text, rows

    def _anchor_to_check(self, key: SigningKey) -> dict[str, Any] | TrustRootError | None:
        """The anchor in force for `_check_anchor`, or why it cannot be read."""
        try:
            return self._read_anchor(key)
        except TrustRootError as exc:
            return exc

    def _check_anchor(
        self, key: SigningKey, anchor: dict[str, Any] | TrustRootError | None, hashes: dict[int, str]
    ) -> list[str]:
        if isinstance(anchor, TrustRootError):
            return [f"the anchor cannot be read: {anchor}"]
        last = max(hashes) if hashes else 0
        if anchor is None:
            return (
                [
                    f"the trust root holds no anchor for this workspace but the ledger has {last} records: it was "
                    "written without the server's trust root (or the trust root was reset)"
                ]
                if last
                else []
            )
        seq, hash_ = anchor.get("seq"), anchor.get("hash")
        if not isinstance(seq, int) or not isinstance(hash_, str):
            return ["the anchor in the trust root is corrupt"]
        if anchor.get("key_id") != key.key_id:
            return [
                f"the anchor was signed by key {anchor.get('key_id')}, not the current key {key.key_id}: the key "
                "was lost or replaced; records before it are unverifiable"
            ]
        if not key.check(
            _ANCHOR_MAC, self._anchor_message(seq, hash_), cast("str | None", anchor.get("mac"))
        ):
            if anchor.get("ledger_id") != self.ledger_id:
                return [
                    "the ledger database was replaced: its id differs from the anchored one (a copy of another "
                    "ledger, or a new database)"
                ]
            return ["the anchor's MAC does not verify: it was edited"]
        if seq > last:
            return [
                f"the ledger ends at record {last} but the trust root anchored record {seq}: its tail was removed "
                "or it was rolled back to an older copy"
            ]
        if hashes.get(seq) != hash_:
            return [
                f"record {seq} differs from the one anchored in the trust root: the history was rewritten or "
                "rolled back and regrown"
            ]
        return [
            f"the trust root anchored another ledger database here before (id {old.get('ledger_id')}, "
            f"{old.get('seq')} records): it was deleted or replaced, and its evidence is gone"
            for old in cast("list[dict[str, Any]]", anchor.get("replaced") or [])
        ]
