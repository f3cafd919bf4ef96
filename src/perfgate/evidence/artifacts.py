"""A record's artifacts: hashed as the ledger commits them (`hash_artifacts`, `file_digest`), and read back
only as the bytes that were recorded.

The workspace is writable by the agent, so an artifact file can be swapped after its record was written
(a flattering plot, an edited step series). Every reader here hashes what it reads against the record's
sha256 (the bytes checked are the bytes used), opens no symbolic link and no file with other names (a
link would pass a file from outside the workspace off as the artifact), and raises `ArtifactChanged`
instead of returning other bytes: `ledger verify` (`check_artifact`), `compare_benchmarks` reading a
window's steps, the HTML report and `perfgate export`.
"""

from __future__ import annotations

import hashlib
import io
import os
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path, PurePosixPath

from perfgate.evidence.records import Artifact
from perfgate.helpers.safeopen import UnsafeFileError, open_file

__all__ = [
    "ArtifactChanged",
    "check_artifact",
    "copy_artifact",
    "file_digest",
    "hash_artifacts",
    "read_artifact",
    "sha256_file",
]

_BLOCK = 1 << 20


def file_digest(
    path: Path, *, chunk_bytes: int = 4 << 20, on_chunk: Callable[[], None] | None = None
) -> tuple[str, int]:
    """Streamed sha256 (hex) and size in bytes of a file, through one reusable buffer (bounded memory
    for checkpoint-sized files). ``on_chunk`` runs before each chunk: raise from it to stop early."""
    with path.open("rb", buffering=0) as f:
        return _digest_open(f, chunk_bytes, on_chunk)


def _digest_open(
    f: io.FileIO, chunk_bytes: int = 4 << 20, on_chunk: Callable[[], None] | None = None
) -> tuple[str, int]:
    """`file_digest` of a file open unbuffered, read from where it stands. The buffer is no larger than
    the file (plus a byte, to see its end in one read): a fresh 4 MiB buffer costs a millisecond of page
    faults, more than hashing a plot. A file that grew meanwhile is still read to its end, in more reads."""
    h = hashlib.sha256()
    buffer = bytearray(max(1, min(chunk_bytes, os.fstat(f.fileno()).st_size + 1)))
    view = memoryview(buffer)
    size = 0
    while n := f.readinto(buffer):
        if on_chunk is not None:
            on_chunk()
        h.update(view[:n])
        size += n
    return h.hexdigest(), size


def sha256_file(path: Path) -> str:
    """Streamed sha256 (hex) of a file."""
    return file_digest(path)[0]


def hash_artifacts(workspace: Path, folder: Path, evidence_id: str, names: Iterable[str]) -> list[Artifact]:
    """The artifacts ``names`` of record ``evidence_id``, written in ``folder``: each made durable, then
    hashed as it is on disk, in name order.

    Raises:
        FileNotFoundError: a named artifact is not a file in ``folder``.
    """
    artifacts: list[Artifact] = []
    for name in sorted(set(names)):
        path = folder / name
        if not path.is_file():
            raise FileNotFoundError(f"artifact {name!r} of {evidence_id} was not written")
        with path.open("rb", buffering=0) as f:  # made durable, then hashed as it is on disk
            os.fsync(f.fileno())
            digest, size = _digest_open(f)
        artifacts.append(
            Artifact(name=name, path=str(path.relative_to(workspace)), sha256=digest, size_bytes=size)
        )
    return artifacts


class ArtifactChanged(ValueError):
    """An artifact is missing, is not a plain file of its own, or is not the bytes its record hashed."""


def _blocks(workspace: Path, artifact: Artifact) -> Iterator[bytes]:
    """The artifact's bytes in blocks; `ArtifactChanged` after the last block when they are not the
    recorded ones (the caller discards what it took)."""
    relative = PurePosixPath(artifact.path)
    if relative.is_absolute() or ".." in relative.parts:
        raise ArtifactChanged(f"artifact path {artifact.path!r} leaves the workspace")
    try:
        stream = open_file(workspace.resolve() / relative)
    except FileNotFoundError as exc:
        raise ArtifactChanged(f"artifact {artifact.path} is missing") from exc
    except UnsafeFileError as exc:
        raise ArtifactChanged(f"artifact {artifact.path} is not the recorded file: {exc.strerror}") from exc
    except OSError as exc:
        raise ArtifactChanged(f"artifact {artifact.path} cannot be read ({exc.strerror or exc})") from exc
    digest = hashlib.sha256()
    with stream:
        while block := stream.read(_BLOCK):
            digest.update(block)
            yield block
    if digest.hexdigest() != artifact.sha256:
        raise ArtifactChanged(
            f"artifact {artifact.path} was modified after it was recorded (its sha256 differs from the record's)"
        )


def check_artifact(workspace: Path, artifact: Artifact) -> None:
    """Read the artifact through, checking it against its record.

    Raises:
        ArtifactChanged: missing, a link or not a plain file, or other bytes than recorded.
    """
    for _ in _blocks(workspace, artifact):
        pass


def read_artifact(workspace: Path, artifact: Artifact) -> bytes:
    """The artifact's bytes, checked against its record.

    Raises:
        ArtifactChanged: missing, a link or not a plain file, or other bytes than recorded.
    """
    return b"".join(_blocks(workspace, artifact))


def copy_artifact(workspace: Path, artifact: Artifact, dest: Path) -> None:
    """Copy the artifact to ``dest`` in bounded memory, checked against its record; nothing is left at
    ``dest`` when the check fails.

    Raises:
        ArtifactChanged: missing, a link or not a plain file, or other bytes than recorded.
    """
    try:
        with dest.open("wb") as out:
            for block in _blocks(workspace, artifact):
                out.write(block)
    except ArtifactChanged:
        dest.unlink(missing_ok=True)
        raise
