"""Pending approvals and human grants, kept in the trust root (``<state>/workspaces/<id>/approvals.db``).

A row is created when a command needs a human and the client cannot ask one (no elicitation). A human
grants or denies it with ``perfgate approve ID`` in a terminal; the grant then lets the same digest run
until it expires. Rows change state (pending -> granted | denied | expired), so they live in their own
SQLite file rather than in the append-only evidence ledger; every decision is also a ledger record.

The database is outside the workspace, and every row carries an HMAC under the trust root's key over all
its fields: a row edited by anything but perfgate (``UPDATE approvals SET status='granted'``) no longer
verifies and is ignored (`ApprovalStore.rejected` lists such rows, for ``perfgate approvals``). The stored
request has its secrets redacted; the digest still binds the real values.

Each method opens its own connection and writes in one ``BEGIN IMMEDIATE`` transaction, so the server
and the ``perfgate`` command line can use the store at the same time.
"""

from __future__ import annotations

import contextlib
import json
import secrets
import sqlite3
import time
from collections.abc import Callable, Generator
from enum import Enum
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from perfgate.execution.request import CommandRequest, redact_request
from perfgate.execution.scope import ApprovalScope, request_print
from perfgate.helpers.sqlite import retry_while_busy
from perfgate.security.trustroot import SigningKey, TrustRoot

__all__ = ["Approval", "ApprovalStatus", "ApprovalStore", "ApprovalStoreError"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS approvals (
    id TEXT PRIMARY KEY,
    digest TEXT NOT NULL,
    tool TEXT NOT NULL,
    request TEXT NOT NULL,
    status TEXT NOT NULL,
    created_at REAL NOT NULL,
    expires_at REAL NOT NULL,
    decided_at REAL,
    decided_by TEXT,
    uses INTEGER NOT NULL DEFAULT 0,
    evidence_id TEXT,
    mac TEXT,
    scope TEXT,
    print TEXT
);
CREATE INDEX IF NOT EXISTS approvals_digest ON approvals(digest, status);
"""
_COLUMNS = (
    "id, digest, tool, request, status, created_at, expires_at, decided_at, decided_by, uses, evidence_id, "
    "scope, print"
)


class ApprovalStoreError(ValueError):
    """An approval id is unknown, or the approval is not in a state that allows the operation."""


class ApprovalStatus(str, Enum):
    PENDING = "pending"
    GRANTED = "granted"
    DENIED = "denied"
    EXPIRED = "expired"


class Approval(BaseModel):
    """One approval: the request it is for, its status, and who decided (epoch seconds for times)."""

    id: str
    digest: str
    tool: str
    request: CommandRequest
    status: ApprovalStatus
    created_at: float
    expires_at: float
    decided_at: float | None = None
    decided_by: str | None = None
    uses: int = 0
    evidence_id: str | None = None
    scope: ApprovalScope | None = None
    printed: dict[str, Any] | None = None


_KEYS = _COLUMNS.split(", ")
_MAC_PURPOSE = "perfgate-approval"


def _row(row: tuple[object, ...]) -> Approval:
    data = dict(zip(_KEYS, row, strict=True))
    data["request"] = CommandRequest.model_validate_json(str(data["request"]))
    scope, printed = data.get("scope"), data.pop("print", None)
    data["scope"] = ApprovalScope.model_validate_json(str(scope)) if scope is not None else None
    data["printed"] = json.loads(str(printed)) if printed is not None else None
    return Approval.model_validate(data)


def _mac_text(row: tuple[object, ...] | list[object]) -> str:
    """What a row's MAC signs: its fields, the scope and print only where they are set (rows signed before
    those columns existed still verify)."""
    fields = list(row)
    extra = {
        name: value for name, value in zip(("scope", "print"), fields[11:], strict=False) if value is not None
    }
    return json.dumps(fields[:11] + ([extra] if extra else []), separators=(",", ":"))


def _stored_request(request: CommandRequest) -> str:
    """The request as kept in the store: secret values redacted (the digest column binds the real ones)."""
    return redact_request(request).model_dump_json()


class ApprovalStore:
    """Approvals of one workspace, signed with the trust root's key.

    ``folder`` is the workspace's directory in the trust root; ``clock`` returns epoch seconds
    (injectable for expiry tests). `open` builds one from a workspace.
    """

    def __init__(self, folder: Path, key: SigningKey, clock: Callable[[], float] = time.time) -> None:
        self.db_path = folder / "approvals.db"
        self.key = key
        self.clock = clock
        self.rejected: list[str] = []
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        retry_while_busy(self._create, 30.0)
        self.db_path.chmod(0o600)

    def _create(self) -> None:
        with self._connect() as conn:
            conn.execute("PRAGMA journal_mode=WAL")
            conn.executescript(_SCHEMA)
        # A store written before rows were signed gains the column once: checked and added in one write
        # transaction, since two processes opening it at once both find it missing.
        with self._write() as conn:
            columns = {row[1] for row in conn.execute("PRAGMA table_info(approvals)")}
            if "mac" not in columns:
                conn.execute("ALTER TABLE approvals ADD COLUMN mac TEXT")
            for column in ("scope", "print"):
                if column not in columns:
                    conn.execute(f"ALTER TABLE approvals ADD COLUMN {column} TEXT")

    @classmethod
    def open(
        cls, workspace: Path, trust: TrustRoot | None = None, clock: Callable[[], float] = time.time
    ) -> ApprovalStore:
        """The store of ``workspace`` in ``trust`` (default: from the environment), creating the key if needed.

        Raises:
            TrustRootError: the trust root is not writable by this user.
        """
        trust = trust or TrustRoot.locate()
        return cls(trust.workspace_dir(workspace), trust.ensure_key(), clock)

    def _mac(self, row: tuple[object, ...] | list[object]) -> str:
        return self.key.mac(_MAC_PURPOSE, _mac_text(row))

    def _sign(self, conn: sqlite3.Connection, approval_id: str) -> None:
        row = conn.execute(f"SELECT {_COLUMNS} FROM approvals WHERE id = ?", (approval_id,)).fetchone()
        if row is not None:
            conn.execute("UPDATE approvals SET mac = ? WHERE id = ?", (self._mac(tuple(row)), approval_id))

    @contextlib.contextmanager
    def _connect(self) -> Generator[sqlite3.Connection, None, None]:
        conn = sqlite3.connect(self.db_path, timeout=30.0, isolation_level=None)
        try:
            conn.execute("PRAGMA busy_timeout=30000")
            yield conn
        finally:
            conn.close()

    @contextlib.contextmanager
    def _write(self) -> Generator[sqlite3.Connection, None, None]:
        with self._connect() as conn:
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield conn
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")

    def _select(self, conn: sqlite3.Connection, where: str, params: tuple[object, ...]) -> list[Approval]:
        """Rows matching ``where`` whose MAC verifies; the others are skipped and listed in `rejected`."""
        rows = conn.execute(
            f"SELECT {_COLUMNS}, mac FROM approvals WHERE {where} ORDER BY created_at", params
        )
        out: list[Approval] = []
        for *fields, mac in rows.fetchall():
            if not self.key.check(_MAC_PURPOSE, _mac_text(fields), mac):
                if fields[0] not in self.rejected:
                    self.rejected.append(str(fields[0]))
                continue
            out.append(_row(tuple(fields)))
        return out

    def expire_due(self) -> list[Approval]:
        """Mark pending and granted approvals past their expiry as expired; returns those just expired."""
        now = self.clock()
        with self._write() as conn:
            due = self._select(conn, "status IN ('pending', 'granted') AND expires_at <= ?", (now,))
            for approval in due:
                conn.execute("UPDATE approvals SET status = 'expired' WHERE id = ?", (approval.id,))
                self._sign(conn, approval.id)
        return [a.model_copy(update={"status": ApprovalStatus.EXPIRED}) for a in due]

    def get(self, approval_id: str) -> Approval | None:
        with self._connect() as conn:
            found = self._select(conn, "id = ?", (approval_id,))
        return found[0] if found else None

    def list(self, statuses: tuple[ApprovalStatus, ...] = tuple(ApprovalStatus)) -> list[Approval]:
        """Approvals with one of ``statuses``, oldest first."""
        marks = ", ".join("?" for _ in statuses)
        with self._connect() as conn:
            return self._select(conn, f"status IN ({marks})", tuple(s.value for s in statuses))

    def live_for(self, digest: str) -> Approval | None:
        """The newest unexpired pending, granted or denied approval for ``digest``."""
        now = self.clock()
        with self._connect() as conn:
            found = self._select(
                conn,
                "digest = ? AND status IN ('pending', 'granted', 'denied') AND expires_at > ?",
                (digest, now),
            )
        return found[-1] if found else None

    def use_grant(self, request: CommandRequest) -> Approval | None:
        """Count one use of an unexpired grant whose scope covers ``request`` (a grant without a scope:
        the same digest) and has calls left; return it, None when there is none."""
        now = self.clock()
        with self._write() as conn:
            for grant in reversed(self._select(conn, "status = 'granted' AND expires_at > ?", (now,))):
                if grant.scope is None:
                    if grant.digest != request.digest:
                        continue
                elif grant.scope.why_not(request) is not None or grant.uses >= grant.scope.runs:
                    continue
                conn.execute("UPDATE approvals SET uses = uses + 1 WHERE id = ?", (grant.id,))
                self._sign(conn, grant.id)
                return grant.model_copy(update={"uses": grant.uses + 1})
        return None

    def last_grant(self, tool: str) -> Approval | None:
        """The newest grant a human decided in this workspace (expired or used up included), of ``tool``
        where there is one: the last approved run an approval's difference is shown against."""
        with self._connect() as conn:
            rows = self._select(conn, "status IN ('granted', 'expired') AND decided_at IS NOT NULL", ())
        rows.sort(key=lambda a: a.decided_at or 0.0)
        same = [a for a in rows if a.tool == tool]
        return (same or rows or [None])[-1]

    def why_asked_again(self, request: CommandRequest) -> str | None:
        """Why the newest grant for this command (same template) does not cover ``request``; None when
        no grant was ever made for it."""
        with self._connect() as conn:
            rows = self._select(conn, "status IN ('granted', 'expired') AND decided_at IS NOT NULL", ())
        now = self.clock()
        for grant in reversed(rows):
            scope = grant.scope
            if scope is None or not scope.same_command(request):
                continue
            if grant.status is ApprovalStatus.EXPIRED or grant.expires_at <= now:
                return f"approval {grant.id} for this command expired"
            if scope.why_not(request) is not None:
                return f"approval {grant.id} for this command covered other code"
            if grant.uses >= scope.runs:
                return f"approval {grant.id} for this command allowed {scope.runs} call(s), all used"
        return None

    def record_grant(
        self,
        request: CommandRequest,
        tool: str,
        who: str,
        scope: ApprovalScope,
        ttl_s: float,
        evidence_id: str,
    ) -> Approval:
        """Store a grant the human gave in the client (elicitation), its first use counted (this call)."""
        now = self.clock()
        approval = Approval(
            id=f"ap-{secrets.token_hex(4)}",
            digest=request.digest,
            tool=tool,
            request=request,
            status=ApprovalStatus.GRANTED,
            created_at=now,
            expires_at=now + ttl_s,
            decided_at=now,
            decided_by=who,
            uses=1,
            evidence_id=evidence_id,
            scope=scope,
            printed=request_print(request),
        )
        with self._write() as conn:
            conn.execute(
                f"INSERT INTO approvals ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    approval.id,
                    approval.digest,
                    tool,
                    _stored_request(request),
                    approval.status.value,
                    now,
                    approval.expires_at,
                    now,
                    who,
                    1,
                    evidence_id,
                    scope.model_dump_json(),
                    json.dumps(approval.printed),
                ),
            )
            self._sign(conn, approval.id)
        return approval

    def open_pending(self, request: CommandRequest, tool: str, ttl_s: float) -> tuple[Approval, bool]:
        """The pending approval for this request, created if there is none; True when created now.

        Repeating a call before the human answered returns the same id instead of piling up new ones.
        """
        now = self.clock()
        with self._write() as conn:
            found = self._select(
                conn, "digest = ? AND status = 'pending' AND expires_at > ?", (request.digest, now)
            )
            if found:
                return found[-1], False
            approval = Approval(
                id=f"ap-{secrets.token_hex(4)}",
                digest=request.digest,
                tool=tool,
                request=request,
                status=ApprovalStatus.PENDING,
                created_at=now,
                expires_at=now + ttl_s,
                printed=request_print(request),
            )
            conn.execute(
                f"INSERT INTO approvals ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, NULL, NULL, 0, NULL, NULL, ?)",
                (
                    approval.id,
                    approval.digest,
                    tool,
                    _stored_request(request),
                    approval.status.value,
                    approval.created_at,
                    approval.expires_at,
                    json.dumps(approval.printed),
                ),
            )
            self._sign(conn, approval.id)
        return approval, True

    def decide(
        self,
        approval_id: str,
        *,
        grant: bool,
        who: str,
        grant_ttl_s: float,
        runs: int | None = None,
        vary: tuple[str, ...] = (),
    ) -> Approval:
        """Grant or deny a pending approval.

        A grant covers the approved command and code for ``runs`` calls (None: unlimited, the same digest
        only) with ``vary`` flags free, for ``grant_ttl_s`` from now; a denial keeps the pending row's
        expiry, so the same command is refused until then.

        Raises:
            ApprovalStoreError: the id is unknown, or the approval is no longer pending (or just expired).
        """
        now = self.clock()
        with self._write() as conn:
            found = self._select(conn, "id = ?", (approval_id,))
            if not found:
                raise ApprovalStoreError(f"no approval {approval_id!r}; list them with `perfgate approvals`")
            current = found[0]
            if current.status is not ApprovalStatus.PENDING:
                raise ApprovalStoreError(f"approval {approval_id} is already {current.status.value}")
            if current.expires_at <= now:
                raise ApprovalStoreError(f"approval {approval_id} has expired; the agent must ask again")
            status = ApprovalStatus.GRANTED if grant else ApprovalStatus.DENIED
            expires_at = now + grant_ttl_s if grant else current.expires_at
            code = current.request.code
            scope = (
                ApprovalScope.make(current.printed, code.digest, runs, vary)
                if grant and runs is not None and current.printed is not None and code is not None
                else None
            )
            conn.execute(
                "UPDATE approvals SET status = ?, decided_at = ?, decided_by = ?, expires_at = ?, scope = ? "
                "WHERE id = ?",
                (status.value, now, who, expires_at, scope.model_dump_json() if scope else None, approval_id),
            )
            self._sign(conn, approval_id)
        return current.model_copy(
            update={
                "status": status,
                "decided_at": now,
                "decided_by": who,
                "expires_at": expires_at,
                "scope": scope,
            }
        )

    def set_evidence(self, approval_id: str, evidence_id: str) -> None:
        """Link the ledger record of the latest decision on this approval."""
        with self._write() as conn:
            if self._select(conn, "id = ?", (approval_id,)):
                conn.execute("UPDATE approvals SET evidence_id = ? WHERE id = ?", (evidence_id, approval_id))
                self._sign(conn, approval_id)
