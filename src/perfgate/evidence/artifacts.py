"""Reading a record's artifacts back: only the bytes that were recorded.

The workspace is writable by the agent, so an artifact file can be swapped after its record was written
(a flattering plot, an edited step series). Every reader here hashes what it reads against the record's
sha256 (the bytes checked are the bytes used), opens no symbolic link and no file with other names (a
link would pass a file from outside the workspace off as the artifact), and raises `ArtifactChanged`
instead of returning other bytes: `ledger verify` (`check_artifact`), `compare_benchmarks` reading a
window's steps, the HTML report and `perfgate export`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING

from perfgate._safeopen import UnsafeFileError, open_file

if TYPE_CHECKING:  # the ledger checks artifacts with this module
    from perfgate.evidence.ledger import Artifact

__all__ = ["ArtifactChanged", "check_artifact", "copy_artifact", "read_artifact"]

_BLOCK = 1 << 20


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
