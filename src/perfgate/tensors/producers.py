"""Which launched run produced a tensor file: a dump entry in a window record naming the same path and
bytes, matched digest to digest under the algorithm that record used."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, cast

from perfgate.security.digests import ALGORITHM, Algorithm, entry_digest, format_digest

if TYPE_CHECKING:
    from perfgate.evidence import EvidenceRecord, Ledger

__all__ = ["PRODUCER_TOOLS", "FileDigests", "Producer", "digest_algorithms", "dump_entries", "find_producers"]

Role = Literal["reference", "candidate"]

PRODUCER_TOOLS = ("run_benchmark_window",)
"""Tools whose records name the tensor files their launched runs dumped (``result.tensor_dumps``)."""


@dataclass(frozen=True)
class FileDigests:
    """One file read by a comparison: its workspace-relative path and its digests ('<algorithm>:<hex>'),
    the BLAKE3 one first."""

    role: Role
    path: str
    digest: str
    other_digests: tuple[str, ...] = ()


@dataclass(frozen=True)
class Producer:
    """The run that dumped a file's bytes, or unbound (``evidence_id`` None)."""

    role: Role
    path: str
    digest: str
    """The digest that binds the file (the producer's algorithm); the file's BLAKE3 when unbound."""
    evidence_id: str | None
    launch: int | None
    code: dict[str, Any] | None


def dump_entries(ledger: Ledger) -> Iterator[tuple[EvidenceRecord, dict[str, Any]]]:
    """Every tensor dump named by a producer record that ran (record, dump entry)."""
    for tool in PRODUCER_TOOLS:
        for record in ledger.records(tool=tool):
            dumps = record.result.get("tensor_dumps")
            if not isinstance(dumps, list) or record.state.value not in ("executed", "passed"):
                continue
            for dump in cast("list[Any]", dumps):
                if isinstance(dump, dict):
                    yield record, cast("dict[str, Any]", dump)


def digest_algorithms(ledger: Ledger, paths: set[str]) -> list[Algorithm]:
    """BLAKE3, plus each other known algorithm a producer record used for a dump at one of ``paths``
    (sha256, in records written before BLAKE3): a file binds only to a digest of its own algorithm."""
    algorithms: list[Algorithm] = [ALGORITHM]
    for _record, entry in dump_entries(ledger):
        if str(entry.get("path")) in paths:
            named = entry_digest(entry)
            if named is not None and named[0] not in algorithms:
                algorithms.append(named[0])
    return algorithms


def find_producers(ledger: Ledger, files: list[FileDigests]) -> list[Producer]:
    """Each file's producer: the newest window record whose run dumped these exact bytes at this path,
    matched digest to digest under the same algorithm (a record's algorithm name is part of the match)."""
    wanted = {(f.path, d) for f in files for d in (f.digest, *f.other_digests)}
    found: dict[tuple[str, str], tuple[str, int, dict[str, Any] | None]] = {}
    for record, entry in dump_entries(ledger):
        named = entry_digest(entry)
        if named is None:
            continue  # an unknown or malformed algorithm binds nothing
        key = (str(entry.get("path")), format_digest(*named))
        if key in wanted:
            provenance = record.result.get("provenance")
            code = cast("dict[str, Any]", provenance).get("code") if isinstance(provenance, dict) else None
            launch = entry.get("launch")
            found[key] = (
                record.id,
                launch if isinstance(launch, int) else 0,
                cast("dict[str, Any]", code) if isinstance(code, dict) else None,
            )
    out: list[Producer] = []
    for f in files:
        digest, hit = f.digest, None
        for candidate in (f.digest, *f.other_digests):
            if (f.path, candidate) in found:
                digest, hit = candidate, found[(f.path, candidate)]
                break
        out.append(
            Producer(
                role=f.role,
                path=f.path,
                digest=digest,
                evidence_id=hit[0] if hit else None,
                launch=hit[1] if hit else None,
                code=hit[2] if hit else None,
            )
        )
    return out
