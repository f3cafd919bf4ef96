"""The evidence ledger: an append-only SQLite database with a hash chain, signed and anchored.

Every record stores its canonical JSON body (`perfgate.evidence.records`) and
``hash = sha256(prev_hash || body)``. The chain makes an edited, reordered or removed record detectable
(`Ledger.verify`, `perfgate.evidence.verify`), and each record lists its artifacts with their sha256
(`perfgate.evidence.artifacts`) so an artifact edited on disk is detected too. Each record also carries
an HMAC under the trust root's key (`perfgate.evidence.signing`), and after every append the head is
anchored in the trust root (`perfgate.evidence.anchor`). The read API (`get`, `get_many`, `records`)
returns only records whose MAC verifies, so nothing the server did not write is ever used as evidence;
without access to the key (another user, a lost key) the ledger stays readable for show, export and
report, flagged as unverified.

Each `Ledger` shares its process's one connection to the database (`perfgate.evidence._database`). HEAD
is rewritten in place, as a fixed-width line, through a descriptor kept open while its path still names
the very file opened (device, inode, type, mode and owner, by one ``lstat``; see
`perfgate.evidence._held`): a file replaced, moved, turned into a link, re-permissioned or given a second
name is opened afresh. The chain head is read inside the write transaction, never cached: a concurrent
writer's record cannot be skipped. The body is read back strictly as a record before it is stored, so a
body no reader could parse is never committed, and the record returned is exactly what every later read
gives.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import secrets
import sqlite3
import time
from collections.abc import Generator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from perfgate.evidence._database import connection
from perfgate.evidence._held import CLOEXEC, NOFOLLOW, NONBLOCK, HeldFile, own_plain_file
from perfgate.evidence.anchor import Anchor
from perfgate.evidence.artifacts import hash_artifacts
from perfgate.evidence.records import (
    GENESIS_HASH,
    EvidenceDraft,
    EvidenceRecord,
    body_text,
    canonical_json,
    canonical_tree,
)
from perfgate.evidence.signing import RecordSigner
from perfgate.evidence.verify import VerifyReport, verify_ledger
from perfgate.helpers.statefs import make_dirs, write_file
from perfgate.security.scrubber import Scrubber
from perfgate.security.trustroot import SigningKey, TrustRoot, TrustRootError

__all__ = ["STATE_DIR_NAME", "Ledger"]

STATE_DIR_NAME = ".perfgate"
_HEAD_WIDTH = 96  # "seq hash" padded with spaces, then a newline

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
        self._signer = RecordSigner(self.trust)
        self._shared = connection(self.db_path)
        self._lock = self._shared.lock
        self._anchor = Anchor(self.trust, self.workspace, self._shared)
        self._head_file = HeldFile()
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
            self._head_file.close(pid)
            self._anchor.close(pid)

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            pid = os.getpid()
            self._head_file.close(pid)
            self._anchor.close(pid)

    # ------------------------------------------------------------------ keys and anchor

    def signing_key(self) -> SigningKey | None:
        """The trust root's key, or None when this process cannot read it (another user, none yet, or a
        corrupt key file: `key_error` says which of the last two)."""
        return self._signer.signing_key()

    @property
    def key_error(self) -> TrustRootError | None:
        """Why `signing_key` found no key, when it raised (unreadable, or a corrupt key file)."""
        return self._signer.key_error

    @property
    def verifiable(self) -> bool:
        """Whether this process can check MACs; without the key, reads return every record unverified."""
        return self.signing_key() is not None

    @property
    def anchor_path(self) -> Path:
        return self._anchor.path

    def anchor(self) -> dict[str, Any] | None:
        """The anchor in force for this workspace (ledger id, sequence, hash, MAC), or None."""
        with self._connect():  # the ledger id of the database now on disk
            pass
        return self._anchor.read(self.signing_key())

    def lost(self) -> list[dict[str, Any]]:
        """The ledgers this workspace had that are gone (deleted or replaced) and not retired yet: each a
        ``ledger_id`` and the ``seq`` of its last anchored record. Empty without the key."""
        key = self.signing_key()
        with self._connect():  # the ledger id of the database now on disk
            pass
        return self._anchor.lost(key) if key is not None else []

    def retire_lost(self, by: str) -> list[dict[str, Any]]:
        """Record in the trust root that the `lost` ledgers are gone for good (the operator's word: the CLI
        asks at a terminal), so `verify` reports them instead of failing; returns what was retired.

        Raises:
            TrustRootError: no signing key is readable, or the trust root is not writable.
        """
        key = self._signer.current_key(create=False)
        if key is None:
            raise TrustRootError(f"no signing key in {self.trust.key_dir}: nothing was anchored here")
        with self._connect():
            pass
        return self._anchor.retire(key, by)

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

    def append(self, draft: EvidenceDraft) -> EvidenceRecord:
        """Commit one record, signed with the trust root's key; returns it once it is durable on disk.

        Raises:
            FileNotFoundError: a named artifact does not exist in the record's artifact folder.
            ValueError: the id is already taken, or the draft holds values JSON cannot represent.
            TrustRootError: the trust root's key cannot be read or created (only the server and the
                operator's own commands can append evidence).
        """
        key = self._signer.current_key(create=True)
        assert key is not None
        artifacts = hash_artifacts(
            self.workspace, self.artifact_root / draft.id, draft.id, draft.artifact_names
        )
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
        inputs_text = canonical_tree(scrubbed[0])
        result_text = canonical_tree(scrubbed[1])
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
                body = body_text(
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
                mac = self._signer.mac(key, self.ledger_id, seq, record.hash)
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
            self._anchor.write(key, record.seq, record.hash)
        finally:
            self._shared.release(files)
        return record

    def _write_head(self, seq: int, hash_: str) -> None:
        """HEAD rewritten in place as one fixed-width line; replaced whole when it is not a plain file of
        its own (a link planted there is never written through)."""
        line = f"{seq} {hash_}".ljust(_HEAD_WIDTH - 1).encode() + b"\n"
        pid = self._shared.pid  # this process (the connection was just used, reopened after a fork)
        held = self._head_file.get(self.head_path, pid, own_plain_file)
        if held is not None:
            fd, st = held
            os.pwrite(fd, line, 0)
            if st.st_size > len(line):
                os.ftruncate(fd, len(line))
            return
        try:
            fd = os.open(self.head_path, os.O_WRONLY | os.O_CREAT | NOFOLLOW | NONBLOCK | CLOEXEC, 0o644)
        except OSError:
            fd = None
        if fd is not None:
            kept = False
            try:
                st = os.fstat(fd)
                if own_plain_file(st):
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
            if (
                key is not None
                and self._signer.record_problem(key, self.ledger_id, seq, body, hash_, key_id, mac)
                is not None
            ):
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
            problem = self._signer.record_problem(key, self.ledger_id, seq, body, hash_, key_id, mac)
            if problem is not None:
                out[id_] = problem
        return out

    def verify(self) -> VerifyReport:
        """Recompute the chain, every MAC and artifact sha256, and compare the head with the anchor
        (`perfgate.evidence.verify.verify_ledger`)."""
        return verify_ledger(
            self._shared,
            self._signer,
            self._anchor,
            workspace=self.workspace,
            head_path=self.head_path,
            artifact_root=self.artifact_root,
        )
