"""Record signatures: every record carries an HMAC under the trust root's signing key, over this ledger's
id, the record's sequence number and its hash.

The workspace is writable by the agent, so the hash chain alone proves nothing: anyone can recompute it.
The key lives in the trust root (`perfgate.security.trustroot`, outside the workspace), so a MAC that verifies tells
a record the server wrote from an edited one, a recomputed chain or a record written without the key (a
forgery), and a record signed by a key the trust root no longer has (key lost or replaced: unverifiable).
"""

from __future__ import annotations

import hashlib
import os

from perfgate.evidence.records import EvidenceRecord
from perfgate.security.trustroot import SigningKey, TrustRoot, TrustRootError

__all__ = ["RecordSigner"]

_RECORD_MAC = "perfgate-ledger-record"


def _record_message(ledger_id: str, seq: int, hash_: str) -> str:
    return f"{ledger_id}:{seq}:{hash_}"


class RecordSigner:
    """The trust root's key as a `Ledger` signs and checks records with it, read again when its file
    changes."""

    def __init__(self, trust: TrustRoot) -> None:
        self.trust = trust
        self._key: tuple[SigningKey | None, tuple[int, ...] | None] = (None, None)
        """The key last read, and what identified its file then (one value: threads replace it whole)."""
        self.key_error: TrustRootError | None = None
        """Why `signing_key` found no key, when it raised (unreadable, or a corrupt key file)."""

    def signing_key(self) -> SigningKey | None:
        """The trust root's key, or None when this process cannot read it (another user, none yet, or a
        corrupt key file: `key_error` says which of the last two)."""
        try:
            key = self.current_key(create=False)
        except TrustRootError as exc:
            self.key_error = exc
            return None
        self.key_error = None
        return key

    def current_key(self, *, create: bool) -> SigningKey | None:
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

    @staticmethod
    def mac(key: SigningKey, ledger_id: str, seq: int, hash_: str) -> str:
        """The MAC a record with this sequence number and hash carries in the ledger ``ledger_id``."""
        return key.mac(_RECORD_MAC, _record_message(ledger_id, seq, hash_))

    def record_problem(
        self,
        key: SigningKey | None,
        ledger_id: str,
        seq: int,
        body: str,
        hash_: str,
        key_id: str | None,
        mac: str | None,
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
        if not key.check(_RECORD_MAC, _record_message(ledger_id, seq, hash_), mac):
            return "forged: its MAC does not verify (chain recomputed or record written without the key)"
        return None
