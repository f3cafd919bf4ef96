"""perfgate's own files never become the user's code: ``.perfgate/`` ignores itself, and a ledger that was
committed anyway leaves the code state (and its dirty flag) alone (issue 47)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from perfgate.envprobe.provenance import code_state
from perfgate.evidence import EvidenceDraft, EvidenceState, Ledger
from perfgate.security.trustroot import TrustRoot

GIT = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]
COPY = "state/harness/0123456789abcdef"


def _git(cwd: Path, *args: str) -> str:
    return subprocess.run([*GIT, *args], cwd=cwd, check=True, capture_output=True, text=True).stdout


def _append(ledger: Ledger) -> None:
    evidence_id = Ledger.new_id()
    ledger.append(
        EvidenceDraft(
            id=evidence_id, tool="collect_env", state=EvidenceState.EXECUTED, result={"n": evidence_id}
        )
    )


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    (root / "proj").mkdir(parents=True)
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    (root / "proj" / "train.py").write_text("print('step')\n")
    _git(root, "add", "-A")
    _git(root, "commit", "-qm", "base")
    return root


def _trust(tmp_path: Path) -> TrustRoot:
    return TrustRoot.locate(state_dir=tmp_path / "trust-state", config_dir=tmp_path / "trust-config")


def test_the_state_folder_is_created_with_an_ignore_rule_so_add_all_leaves_it_out(
    repo: Path, tmp_path: Path
) -> None:
    workspace = repo / "proj"
    _append(Ledger(workspace, _trust(tmp_path)))
    assert (workspace / ".perfgate" / ".gitignore").read_text().splitlines()[-1] == "*"
    _git(repo, "add", "-A")
    assert _git(repo, "diff", "--cached", "--name-only") == ""
    assert _git(repo, "status", "--porcelain") == ""  # the ledger is not even untracked noise
    # a rule the user wrote is theirs: never overwritten
    (workspace / ".perfgate" / ".gitignore").write_text("ledger.db\n")
    Ledger(workspace, _trust(tmp_path))
    assert (workspace / ".perfgate" / ".gitignore").read_text() == "ledger.db\n"


@pytest.mark.parametrize("subdir", ["", "proj"])
def test_a_committed_ledger_does_not_change_the_code_state(repo: Path, tmp_path: Path, subdir: str) -> None:
    workspace = repo / subdir if subdir else repo
    (workspace / "train.py").write_text("print('step')\n")
    ledger = Ledger(workspace, _trust(tmp_path))
    _append(ledger)
    # the user commits everything, perfgate's state included (forced past the ignore rule)
    _git(repo, "add", "-A")
    _git(repo, "add", "-f", ".")
    _git(repo, "commit", "-qm", "everything")
    assert ".perfgate/ledger.db" in _git(workspace, "ls-files")
    base = code_state(workspace)
    assert not base.dirty
    _append(ledger)  # the ledger grows with every call
    after = code_state(workspace)
    assert (after.digest, after.dirty, after.diff_sha256) == (base.digest, False, base.diff_sha256)
    # the user's own code still counts
    (workspace / "train.py").write_text("print('faster step')\n")
    assert code_state(workspace).digest != base.digest and code_state(workspace).dirty


def test_code_in_a_folder_named_like_a_harness_copy_is_code(repo: Path) -> None:
    workspace = repo / "proj"
    for rel in ("pkg/harness/copy/perfgate/x.py", "tools/.perfgate_notes/y.py", "lib/perfgate/z.py"):
        (workspace / rel).parent.mkdir(parents=True, exist_ok=True)
        (workspace / rel).write_text("Z = 1\n")
    _git(repo, "add", "-f", ".")
    _git(repo, "commit", "-qm", "look-alikes")
    base = code_state(workspace).digest
    for rel in ("pkg/harness/copy/perfgate/x.py", "tools/.perfgate_notes/y.py", "lib/perfgate/z.py"):
        (workspace / rel).write_text("Z = 2\n")
        changed = code_state(workspace)
        assert changed.digest != base and changed.dirty, rel
        (workspace / rel).write_text("Z = 1\n")
