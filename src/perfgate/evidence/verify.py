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
from pathlib import Path
from typing import Any, cast

from pydantic import BaseModel, Field

from perfgate.evidence._database import Connection
from perfgate.evidence.anchor import Anchor
from perfgate.evidence.artifacts import ArtifactChanged, check_artifact
from perfgate.evidence.records import GENESIS_HASH, EvidenceRecord
from perfgate.evidence.signing import RecordSigner
from perfgate.trust import CorruptKeyError, SigningKey, TrustRootError

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
        errors.extend(_check_anchor(trust_anchor, key, anchor, hashes))
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
    )


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


def _check_anchor(
    trust_anchor: Anchor,
    key: SigningKey,
    anchor: dict[str, Any] | TrustRootError | None,
    hashes: dict[int, str],
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
    if not trust_anchor.mac_verifies(key, seq, hash_, cast("str | None", anchor.get("mac"))):
        if anchor.get("ledger_id") != trust_anchor.ledger_id:
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
