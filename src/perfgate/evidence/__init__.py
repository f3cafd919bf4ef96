"""Evidence: states, the append-only ledger, and artifact hashing."""

from perfgate.evidence.ledger import (
    STATE_DIR_NAME,
    Artifact,
    EvidenceDraft,
    EvidenceRecord,
    Ledger,
    VerifyReport,
    canonical_json,
    digest_inputs,
    file_digest,
    sha256_file,
)
from perfgate.evidence.states import EvidenceState

__all__ = [
    "STATE_DIR_NAME",
    "Artifact",
    "EvidenceDraft",
    "EvidenceRecord",
    "EvidenceState",
    "Ledger",
    "VerifyReport",
    "canonical_json",
    "digest_inputs",
    "file_digest",
    "sha256_file",
]
