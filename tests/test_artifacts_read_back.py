"""Artifacts read back (`ledger verify`, the HTML report, `perfgate export`) are the bytes their record
hashed: a file swapped after recording, replaced by a link (even to the same bytes), or removed is
refused, never shown."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest

from perfgate.evidence import EvidenceDraft, EvidenceState, Ledger
from perfgate.evidence.artifacts import ArtifactChanged, copy_artifact, read_artifact
from perfgate.report.html import _figures  # pyright: ignore[reportPrivateUsage]

RECORDED = b"\x89PNG recorded plot bytes" * 100
SWAPPED = b"\x89PNG a flattering plot!!" * 100  # the same size


def _record(workspace: Path) -> tuple[Ledger, str]:
    ledger = Ledger(workspace)
    evidence_id = Ledger.new_id()
    (ledger.artifact_dir(evidence_id) / "plot.png").write_bytes(RECORDED)
    ledger.append(
        EvidenceDraft(
            id=evidence_id, tool="t", state=EvidenceState.EXECUTED, result={}, artifact_names=["plot.png"]
        )
    )
    return ledger, evidence_id


def _tamper(path: Path, how: str, outside: Path) -> None:
    if how == "swapped":
        path.write_bytes(SWAPPED)
    elif how == "link":  # the recorded bytes, but from a file outside the workspace
        outside.write_bytes(RECORDED)
        path.unlink()
        path.symlink_to(outside)
    elif how == "folder link":  # the record's whole folder swapped for a link to a copy outside
        copy = outside.parent / "outside-folder"
        copy.mkdir()
        (copy / path.name).write_bytes(RECORDED)
        folder = path.parent
        folder.rename(outside.parent / "moved-aside")
        folder.symlink_to(copy)
    elif how == "hard link":
        outside.write_bytes(RECORDED)
        path.unlink()
        path.hardlink_to(outside)
    else:
        path.unlink()


@pytest.mark.parametrize("how", ["swapped", "link", "folder link", "hard link", "removed"])
def test_a_changed_artifact_is_refused_where_it_is_shown_or_copied(
    workspace: Path, tmp_path: Path, how: str
) -> None:
    ledger, evidence_id = _record(workspace)
    record = ledger.get(evidence_id)
    assert record is not None
    [artifact] = record.artifacts
    assert read_artifact(workspace, artifact) == RECORDED
    assert base64.b64encode(RECORDED).decode() in _figures(ledger, record)
    copy_artifact(workspace, artifact, tmp_path / "copy.png")
    assert (tmp_path / "copy.png").read_bytes() == RECORDED

    _tamper(workspace / artifact.path, how, tmp_path / "outside.png")
    with pytest.raises(ArtifactChanged, match=artifact.path):
        read_artifact(workspace, artifact)
    shown = _figures(ledger, record)
    assert "<img" not in shown and "not shown" in shown and artifact.path in shown
    report = Ledger(workspace).verify()
    assert not report.ok and any(
        e.startswith(f"record {evidence_id}: artifact {artifact.path}") for e in report.errors
    )
    dest = tmp_path / "copied-after.png"
    with pytest.raises(ArtifactChanged):
        copy_artifact(workspace, artifact, dest)
    assert not dest.exists()  # nothing half-copied or swapped is left behind


def test_an_artifact_path_that_leaves_the_workspace_is_refused(workspace: Path) -> None:
    ledger, evidence_id = _record(workspace)
    record = ledger.get(evidence_id)
    assert record is not None
    for path in ("../outside.png", "/etc/passwd"):
        forged = record.artifacts[0].model_copy(update={"path": path})
        with pytest.raises(ArtifactChanged, match="leaves the workspace"):
            read_artifact(workspace, forged)
