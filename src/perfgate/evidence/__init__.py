"""Evidence: states, the records and their canonical form, the append-only ledger, and artifact hashing."""

from perfgate.evidence.artifacts import file_digest, sha256_file
from perfgate.evidence.ledger import STATE_DIR_NAME, Ledger
from perfgate.evidence.records import Artifact, EvidenceDraft, EvidenceRecord, canonical_json, digest_inputs
from perfgate.evidence.states import EvidenceState
from perfgate.evidence.verify import VerifyReport

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
