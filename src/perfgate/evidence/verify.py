"""Verifying a ledger: the hash chain, every record's MAC and artifact sha256, and the head against HEAD
and the anchor in the trust root.

Errors name what happened: an edited record, a forged or recomputed one, a record signed by a key the
trust root no longer has, removed records, a removed tail, a rollback to an older copy or a replaced
database. Artifacts are written and hashed before their record is committed, so a crash in between leaves
an unreferenced artifact folder: a warning, never an error.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from pydantic import BaseModel, Field

from perfgate.evidence._database import Connection
from perfgate.evidence.anchor import Anchor
from perfgate.evidence.artifacts import ArtifactChanged, check_artifact
from perfgate.evidence.records import GENESIS_HASH, EvidenceRecord
from perfgate.evidence.signing import RecordSigner
from perfgate.security.trustroot import CorruptKeyError, SigningKey, TrustRootError

__all__ = ["VerifyReport", "verify_ledger"]

_FIRST_ANCHOR_WAIT_S = 0.2
"""How long `Ledger.verify` waits before it looks again at records without an anchor (an append in another
process writes the anchor within a millisecond or so of its commit)."""


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
    ledger_id: str = Field(default="", description="The id of the ledger database checked.")
    format_migrated_from: int | None = Field(
        default=None, description="The format this ledger was written in, when an upgrade migrated it."
    )
    retired: list[dict[str, Any]] = Field(
        default_factory=list[dict[str, Any]],
        description="Ledgers of this workspace the operator retired (`perfgate ledger retire`): ledger_id, "
        "records, retired_at, by.",
    )
    next_step: str | None = Field(
        default=None, description="What can make this ledger verify again, when something here can."
    )


RETIRE_STEP = (
    "the operator runs `perfgate ledger retire --workspace {0}` at a terminal (it records in the trust root "
    "that the lost evidence is gone), or restores {0}/.perfgate from a backup; re-measuring cannot bring "
    "the lost ledger back"
)
"""The next step when a ledger this workspace had is gone (deleted, replaced)."""


def verify_ledger(
    db: Connection,
    signer: RecordSigner,
    trust_anchor: Anchor,
    *,
    workspace: Path,
    head_path: Path,
    artifact_root: Path,
) -> VerifyReport:
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
    key = signer.signing_key()
    signed = 0
    retired: list[dict[str, Any]] = []
    next_step: str | None = None
    anchor, head_text, rows = _verify_inputs(db, trust_anchor, head_path, key)
    if anchor is None and key is not None and rows:
        # Records and no anchor: another process may be between the very first commit and its anchor.
        # Looked at once more, a moment later (only a forger could make the anchor appear meanwhile,
        # and it needs the key).
        time.sleep(_FIRST_ANCHOR_WAIT_S)
        anchor, head_text, rows = _verify_inputs(db, trust_anchor, head_path, key)
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
            errors.append(f"record {seq} ({id_}): hash mismatch: the record or its predecessor was edited")
        if record.prev_hash != prev_hash:
            errors.append(f"record {seq} ({id_}): chain link broken")
        if (record.seq, record.id, record.tool, record.state.value) != (seq, id_, tool, state):
            errors.append(f"record {seq} ({id_}): indexed columns differ from the hashed body")
        if key is not None:
            problem = signer.record_problem(key, db.ledger_id, seq, body, stored_hash, key_id, mac)
            if problem is None:
                signed += 1
            elif not problem.startswith("edited"):  # an edit is reported above already
                errors.append(f"record {seq} ({id_}): {problem}; it is not used as evidence")
        referenced.add(record.id)
        for artifact in record.artifacts:
            try:
                check_artifact(workspace, artifact)
            except ArtifactChanged as exc:
                errors.append(f"record {id_}: {exc}")
        prev_hash = stored_hash
    if isinstance(signer.key_error, CorruptKeyError):
        errors.append(str(signer.key_error))  # damage to the trust root, not a reader without access to it
    elif key is None:
        if rows:  # a verification that checked no MAC is no pass
            errors.append(
                f"no signing key readable in {signer.trust.key_dir}: no MAC and no anchor could be checked, "
                "so nothing here is verified (run as the operator, or pass the server's --state-dir)"
            )
    else:
        checked = _check_anchor(trust_anchor, key, anchor, hashes)
        errors.extend(checked.errors)
        warnings.extend(checked.warnings)
        retired = checked.retired
        if checked.lost:
            next_step = RETIRE_STEP.format(workspace)
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
    if artifact_root.is_dir():
        for folder in sorted(artifact_root.iterdir()):
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
        ledger_id=db.ledger_id,
        format_migrated_from=_migrated_from(db),
        retired=retired,
        next_step=next_step,
    )


def _migrated_from(db: Connection) -> int | None:
    with db.use() as conn:
        row = conn.execute("SELECT value FROM meta WHERE name = 'migrated_from'").fetchone()
    return int(row[0]) if row is not None and str(row[0]).isdigit() else None


def _verify_inputs(
    db: Connection, trust_anchor: Anchor, head_path: Path, key: SigningKey | None
) -> tuple[dict[str, Any] | TrustRootError | None, str | None, list[tuple[Any, ...]]]:
    """What `verify` checks: the anchor in force, HEAD's text and every row.

    The anchor and HEAD are read first: both move forward only after a commit, so an append racing
    this leaves the rows ahead of them, never behind (read after the rows, they could name a record
    this read lacks: a removed tail, a truncated ledger, that never was).
    """
    with db.use() as conn:
        anchor = _anchor_to_check(trust_anchor, key) if key is not None else None
        try:
            head_text: str | None = head_path.read_text()
        except FileNotFoundError:
            head_text = None
        rows = conn.execute(
            "SELECT seq, id, tool, state, body, hash, key_id, mac FROM evidence ORDER BY seq"
        ).fetchall()
    return anchor, head_text, rows


def _anchor_to_check(trust_anchor: Anchor, key: SigningKey) -> dict[str, Any] | TrustRootError | None:
    """The anchor in force for `_check_anchor`, or why it cannot be read."""
    try:
        return trust_anchor.read(key)
    except TrustRootError as exc:
        return exc


@dataclass
class _AnchorCheck:
    errors: list[str] = field(default_factory=list[str])
    warnings: list[str] = field(default_factory=list[str])
    retired: list[dict[str, Any]] = field(default_factory=list[dict[str, Any]])
    lost: bool = False
    """A ledger this workspace had is gone: `RETIRE_STEP` is what helps."""


def _check_anchor(
    trust_anchor: Anchor,
    key: SigningKey,
    anchor: dict[str, Any] | TrustRootError | None,
    hashes: dict[int, str],
) -> _AnchorCheck:
    if isinstance(anchor, TrustRootError):
        return _AnchorCheck([f"the anchor cannot be read: {anchor}"])
    out = _AnchorCheck()
    retired = trust_anchor.retired(key)
    out.retired = list(retired.values())
    out.warnings.extend(
        f"ledger {r['ledger_id']} ({r.get('records')} records) was lost here and retired by the operator "
        f"({r.get('by')}) at {r.get('retired_at')}: its evidence is gone and counts for nothing"
        for r in out.retired
    )
    if trust_anchor.ledger_id in retired:
        out.errors.append(
            f"this ledger ({trust_anchor.ledger_id}) was retired by the operator as lost: a copy brought back "
            "after its retirement is not evidence"
        )
        return out
    copies = trust_anchor.copies(key)
    if anchor is None or anchor.get("ledger_id") in retired:
        out.errors.extend(_check_copies(copies, hashes, out.warnings))
        return out
    seq, hash_ = anchor.get("seq"), anchor.get("hash")
    if not isinstance(seq, int) or not isinstance(hash_, str):
        out.errors.append("the anchor in the trust root is corrupt")
        return out
    if anchor.get("key_id") != key.key_id:
        out.errors.append(
            f"the anchor was signed by key {anchor.get('key_id')}, not the current key {key.key_id}: the key "
            "was lost or replaced; records before it are unverifiable"
        )
        return out
    last = max(hashes) if hashes else 0
    if not trust_anchor.mac_verifies(key, seq, hash_, cast("str | None", anchor.get("mac"))):
        if anchor.get("ledger_id") != trust_anchor.ledger_id and not trust_anchor.lost(key):
            # the ledger anchored here lives on at another path (moved away): this one is new here
            out.errors.extend(_check_copies(copies, hashes, out.warnings))
            return out
        if anchor.get("ledger_id") != trust_anchor.ledger_id:
            out.lost = True
            out.errors.append(
                f"the ledger database was replaced: the trust root anchored ledger {anchor.get('ledger_id')} "
                f"({seq} records) here, and this is another one (a new database, or a copy of another ledger)"
            )
        else:
            out.errors.append("the anchor's MAC does not verify: it was edited")
        return out
    if seq > last:
        out.errors.append(
            f"the ledger ends at record {last} but the trust root anchored record {seq}: its tail was removed "
            "or it was rolled back to an older copy"
        )
    elif hashes.get(seq) != hash_:
        out.errors.append(
            f"record {seq} differs from the one anchored in the trust root: the history was rewritten or "
            "rolled back and regrown"
        )
    lost = trust_anchor.lost(key)
    out.lost = bool(lost)
    out.errors.extend(
        f"the trust root anchored another ledger database here before (id {old.get('ledger_id')}, "
        f"{old.get('seq')} records): it was deleted or replaced, and its evidence is gone"
        for old in lost
    )
    out.warnings.extend(_diverged(copies, hashes))
    return out


def _check_copies(
    copies: list[tuple[Path, dict[str, Any]]], hashes: dict[int, str], warnings: list[str]
) -> list[str]:
    """Errors for a ledger with no anchor at this path: fine when it holds the anchored head of a copy of
    itself at another path (the workspace was moved, renamed or copied), noted in ``warnings``."""
    last = max(hashes) if hashes else 0
    if not last:
        return []
    if not copies:
        return [
            f"the trust root holds no anchor for this workspace, nor for this ledger anywhere, but the ledger "
            f"has {last} records: it was written without the server's trust root (or the trust root was reset)"
        ]
    for where, copy in copies:
        if hashes.get(copy["seq"]) == copy["hash"]:
            warnings.append(
                f"this ledger was anchored at {where} (record {copy['seq']}): the workspace was moved or "
                "copied here, and its records up to there are the anchored ones"
            )
            warnings.extend(_diverged([c for c in copies if c[0] != where], hashes))
            return []
    older = [(where, copy) for where, copy in copies if copy["seq"] > last]
    if older and all((where / ".perfgate" / "ledger.db").exists() for where, _ in older):
        warnings.extend(
            f"this is an older copy of the ledger at {where}, which the trust root anchored at record "
            f"{copy['seq']} (this copy ends at record {last})"
            for where, copy in older
        )
        return []
    return [
        f"the ledger ends at record {last} but the trust root anchored record {copy['seq']} of it at "
        f"{where}: its tail was removed or it was rolled back to an older copy"
        if copy["seq"] > last
        else f"record {copy['seq']} differs from the one the trust root anchored for this ledger at {where}: "
        "the history was rewritten or rolled back and regrown"
        for where, copy in copies
    ]


def _diverged(copies: list[tuple[Path, dict[str, Any]]], hashes: dict[int, str]) -> list[str]:
    """Other live copies of this ledger whose anchored head is not in this one: the two grew apart."""
    last = max(hashes) if hashes else 0
    return [
        f"diverged: the copy of this ledger at {where} holds another record {copy['seq']} than this one; "
        "they are two histories now, each verified by its own anchor (neither's records count for the other)"
        if copy["seq"] <= last
        else f"diverged or behind: the copy of this ledger at {where} has grown to record {copy['seq']}; this "
        f"one ends at record {last}"
        for where, copy in copies
        if hashes.get(copy["seq"]) != copy["hash"]
    ]
