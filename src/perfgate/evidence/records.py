"""The evidence record: what a tool hands the ledger, what the ledger commits, and the canonical JSON that
is hashed.

A record's inputs and result, most of its bytes, are encoded to canonical JSON once: the input digest
hashes that text and the body is spliced from it (`body_text`), byte for byte what encoding the whole
record gives.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from typing import Any, cast

from pydantic import BaseModel, ConfigDict, Field

from perfgate.evidence.states import EvidenceState

__all__ = [
    "GENESIS_HASH",
    "Artifact",
    "EvidenceDraft",
    "EvidenceRecord",
    "body_text",
    "canonical_json",
    "canonical_tree",
    "digest_inputs",
]

GENESIS_HASH = "0" * 64
"""The ``prev_hash`` of a ledger's first record."""

_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)

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


def canonical_tree(value: Any) -> str:
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


def body_text(
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


# `body_text` writes these fields, in this order: a field added to the record must be added there.
assert tuple(sorted(_BODY_FIELDS)) == (
    "artifacts", "command", "created_at", "environment_id", "exit_code", "id", "input_digest", "inputs",
    "prev_hash", "profiled", "result", "seq", "started_at", "state", "tool",
)  # fmt: skip
