"""The evidence ledger: an append-only SQLite database with a hash chain.

Every record stores its canonical JSON body and ``hash = sha256(prev_hash || body)``. The chain makes an
edited, reordered or removed record detectable (`Ledger.verify`), and each record lists its artifacts with
their sha256 so an artifact edited on disk is detected too. A small ``HEAD`` file, written after every
commit, catches truncation of the chain's tail.

Durability: WAL journal with ``synchronous=FULL``, one short ``BEGIN IMMEDIATE`` transaction per append, so
concurrent writers (threads or processes) serialize on SQLite's lock, and a record is on disk before the
tool that produced it answers. Artifacts are written and hashed before their record is committed; a crash
in between leaves an unreferenced artifact folder, which `verify` reports as a warning, never an error.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import secrets
import sqlite3
from collections.abc import Callable, Generator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from perfgate.evidence.states import EvidenceState

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
    hash TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS evidence_tool ON evidence(tool);
CREATE TRIGGER IF NOT EXISTS evidence_no_update BEFORE UPDATE ON evidence
BEGIN SELECT RAISE(ABORT, 'the evidence ledger is append-only'); END;
CREATE TRIGGER IF NOT EXISTS evidence_no_delete BEFORE DELETE ON evidence
BEGIN SELECT RAISE(ABORT, 'the evidence ledger is append-only'); END;
"""


def canonical_json(value: Any) -> str:
    """JSON with sorted keys and no whitespace: the form that is hashed."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def digest_inputs(inputs: Any) -> str:
    """sha256 of the canonical JSON of a tool's validated inputs."""
    return hashlib.sha256(canonical_json(inputs).encode()).hexdigest()


def file_digest(
    path: Path, *, chunk_bytes: int = 4 << 20, on_chunk: Callable[[], None] | None = None
) -> tuple[str, int]:
    """Streamed sha256 (hex) and size in bytes of a file, through one reusable buffer (bounded memory
    for checkpoint-sized files). ``on_chunk`` runs before each chunk: raise from it to stop early."""
    h = hashlib.sha256()
    buffer = bytearray(chunk_bytes)
    view = memoryview(buffer)
    size = 0
    with path.open("rb", buffering=0) as f:
        while n := f.readinto(buffer):
            if on_chunk is not None:
                on_chunk()
            h.update(view[:n])
            size += n
    return h.hexdigest(), size


def sha256_file(path: Path) -> str:
    """Streamed sha256 (hex) of a file."""
    return file_digest(path)[0]


def _utc_now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="microseconds")


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


class VerifyReport(BaseModel):
    """Outcome of `Ledger.verify`: ``ok`` is false when anything was edited or lost."""

    ok: bool
    records: int
    errors: list[str]
    warnings: list[str]


class Ledger:
    """The append-only evidence store of one workspace.

    Methods are synchronous and cheap; call them from a worker thread in async code. Each call opens
    its own connection, so one `Ledger` is safe to share between threads and processes.
    """

    def __init__(self, workspace: Path) -> None:
        self.workspace = workspace.resolve()
        self.state_dir = self.workspace / STATE_DIR_NAME
        self.db_path = self.state_dir / "ledger.db"
        self.head_path = self.state_dir / "HEAD"
        self.artifact_root = self.state_dir / "artifacts"
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.artifact_root.mkdir(exist_ok=True)
        with self._connect() as conn:
            conn.execute("PRAGMA journal_mode=WAL")
            conn.executescript(_SCHEMA)

    @contextlib.contextmanager
    def _connect(self) -> Generator[sqlite3.Connection]:
        conn = sqlite3.connect(self.db_path, timeout=60.0, isolation_level=None)
        try:
            conn.execute("PRAGMA synchronous=FULL")
            conn.execute("PRAGMA busy_timeout=60000")
            yield conn
        finally:
            conn.close()

    @staticmethod
    def new_id(prefix: str = "ev") -> str:
        """A fresh evidence id: a UTC timestamp for humans plus randomness for uniqueness."""
        return f"{prefix}-{datetime.now(timezone.utc).strftime('%Y%m%dT%H%M%S')}-{secrets.token_hex(4)}"

    def artifact_dir(self, evidence_id: str) -> Path:
        """The folder where a record's artifacts are written before the record is appended."""
        if not evidence_id or "/" in evidence_id or evidence_id.startswith("."):
            raise ValueError(f"invalid evidence id {evidence_id!r}")
        path = self.artifact_root / evidence_id
        path.mkdir(parents=True, exist_ok=True)
        return path

    def _artifacts(self, draft: EvidenceDraft) -> list[Artifact]:
        folder = self.artifact_root / draft.id
        artifacts: list[Artifact] = []
        for name in sorted(set(draft.artifact_names)):
            path = folder / name
            if not path.is_file():
                raise FileNotFoundError(f"artifact {name!r} of {draft.id} was not written")
            with path.open("rb") as f:
                os.fsync(f.fileno())
            artifacts.append(
                Artifact(
                    name=name,
                    path=str(path.relative_to(self.workspace)),
                    sha256=sha256_file(path),
                    size_bytes=path.stat().st_size,
                )
            )
        return artifacts

    def append(self, draft: EvidenceDraft) -> EvidenceRecord:
        """Commit one record; returns it once it is durable on disk.

        Raises:
            FileNotFoundError: a named artifact does not exist in the record's artifact folder.
            ValueError: the id is already taken, or the draft holds values JSON cannot represent.
        """
        artifacts = self._artifacts(draft)
        inputs = json.loads(canonical_json(draft.inputs))
        result = json.loads(canonical_json(draft.result))
        with self._connect() as conn:
            conn.execute("BEGIN IMMEDIATE")
            try:
                row = conn.execute("SELECT seq, hash FROM evidence ORDER BY seq DESC LIMIT 1").fetchone()
                seq, prev_hash = (row[0] + 1, row[1]) if row else (1, GENESIS_HASH)
                record = EvidenceRecord(
                    seq=seq,
                    id=draft.id,
                    tool=draft.tool,
                    state=draft.state,
                    created_at=_utc_now(),
                    started_at=draft.started_at,
                    input_digest=digest_inputs(inputs),
                    inputs=inputs,
                    result=result,
                    profiled=draft.profiled,
                    command=draft.command,
                    exit_code=draft.exit_code,
                    environment_id=draft.environment_id,
                    artifacts=artifacts,
                    prev_hash=prev_hash,
                )
                body = canonical_json(record.model_dump(mode="json", exclude={"hash"}))
                record.hash = hashlib.sha256((prev_hash + body).encode()).hexdigest()
                try:
                    conn.execute(
                        "INSERT INTO evidence (seq, id, tool, state, body, hash) VALUES (?, ?, ?, ?, ?, ?)",
                        (seq, record.id, record.tool, record.state.value, body, record.hash),
                    )
                except sqlite3.IntegrityError as exc:
                    raise ValueError(f"evidence id {draft.id!r} already exists") from exc
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise
        self._write_head(record.seq, record.hash)
        return record

    def _write_head(self, seq: int, hash_: str) -> None:
        tmp = self.head_path.with_name(f"HEAD.{os.getpid()}.{secrets.token_hex(3)}")
        tmp.write_text(f"{seq} {hash_}\n")
        os.replace(tmp, self.head_path)

    @staticmethod
    def _from_row(body: str, hash_: str) -> EvidenceRecord:
        record = EvidenceRecord.model_validate_json(body)
        record.hash = hash_
        return record

    def get(self, evidence_id: str) -> EvidenceRecord | None:
        """The record with this id, or None."""
        with self._connect() as conn:
            row = conn.execute("SELECT body, hash FROM evidence WHERE id = ?", (evidence_id,)).fetchone()
        return None if row is None else self._from_row(row[0], row[1])

    def get_many(self, evidence_ids: list[str]) -> list[EvidenceRecord]:
        """The records with these ids, in the order given; ids not in the ledger are skipped."""
        return [r for i in evidence_ids if (r := self.get(i)) is not None]

    def records(self, tool: str | None = None, limit: int | None = None) -> list[EvidenceRecord]:
        """Records in commit order (newest last); optionally one tool's, optionally the newest ``limit``."""
        query = "SELECT body, hash FROM evidence"
        params: list[Any] = []
        if tool is not None:
            query += " WHERE tool = ?"
            params.append(tool)
        query += " ORDER BY seq DESC"
        if limit is not None:
            query += " LIMIT ?"
            params.append(limit)
        with self._connect() as conn:
            rows = conn.execute(query, params).fetchall()
        return [self._from_row(body, h) for body, h in reversed(rows)]

    def verify(self) -> VerifyReport:
        """Recompute the hash chain and every artifact's sha256; report edits, gaps and truncation."""
        errors: list[str] = []
        warnings: list[str] = []
        prev_hash = GENESIS_HASH
        expected_seq = 1
        referenced: set[str] = set()
        hashes: dict[int, str] = {}
        with self._connect() as conn:
            rows = conn.execute(
                "SELECT seq, id, tool, state, body, hash FROM evidence ORDER BY seq"
            ).fetchall()
        for seq, id_, tool, state, body, stored_hash in rows:
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
            referenced.add(record.id)
            for artifact in record.artifacts:
                path = self.workspace / artifact.path
                if not path.is_file():
                    errors.append(f"record {id_}: artifact {artifact.path} is missing")
                elif sha256_file(path) != artifact.sha256:
                    errors.append(
                        f"record {id_}: artifact {artifact.path} was modified after it was recorded"
                    )
            prev_hash = stored_hash
        if self.head_path.exists():
            try:
                head_seq_text, head_hash = self.head_path.read_text().split()
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
        return VerifyReport(ok=not errors, records=len(rows), errors=errors, warnings=warnings)
