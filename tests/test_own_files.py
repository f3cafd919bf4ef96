"""perfgate's own files never become the user's code: ``.perfgate/`` ignores itself, and a ledger or a harness
copy that was committed anyway leaves the code state (and its dirty flag) alone (issue 47)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from perfgate.envprobe.ownfiles import is_own_path
from perfgate.envprobe.provenance import code_state
from perfgate.evidence import EvidenceDraft, EvidenceState, Ledger
from perfgate.trust import TrustRoot

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
def test_a_committed_ledger_and_harness_copy_do_not_change_the_code_state(
    repo: Path, tmp_path: Path, subdir: str
) -> None:
    workspace = repo / subdir if subdir else repo
    (workspace / "train.py").write_text("print('step')\n")
    ledger = Ledger(workspace, _trust(tmp_path))
    _append(ledger)
    copy = workspace / COPY
    (copy / "perfgate").mkdir(parents=True)
    (copy / "perfgate-harness.py").write_text("# entry\n")
    (copy / "perfgate" / "window.py").write_text("X = 1\n")
    # the user commits everything, perfgate's files included (forced past the ignore rule)
    _git(repo, "add", "-A")
    _git(repo, "add", "-f", ".")
    _git(repo, "commit", "-qm", "everything")
    base = code_state(workspace)
    assert not base.dirty
    _append(ledger)  # the ledger grows with every call
    (copy / "perfgate" / "window.py").write_text("X = 2\n")
    (copy / "perfgate" / "new.py").write_text("Y = 1\n")
    after = code_state(workspace)
    assert (after.digest, after.dirty, after.diff_sha256) == (base.digest, False, base.diff_sha256)
    # the user's own code still counts
    (workspace / "train.py").write_text("print('faster step')\n")
    assert code_state(workspace).digest != base.digest and code_state(workspace).dirty


def test_look_alikes_of_perfgate_files_are_code(repo: Path) -> None:
    """Only the workspace's own .perfgate and a digest-named harness folder are left out: code the agent
    hides in a nested `.perfgate` or a `harness/` folder of another name still changes the code state."""
    workspace = repo / "proj"
    for rel in ("pkg/.perfgate/hidden.py", "pkg/harness/copy/perfgate/x.py", "harness/0123456789abcdeg/y.py"):
        (workspace / rel).parent.mkdir(parents=True, exist_ok=True)
        (workspace / rel).write_text("Z = 1\n")
    _git(repo, "add", "-f", ".")
    _git(repo, "commit", "-qm", "look-alikes")
    base = code_state(workspace).digest
    for rel in ("pkg/.perfgate/hidden.py", "pkg/harness/copy/perfgate/x.py", "harness/0123456789abcdeg/y.py"):
        assert not is_own_path(rel)
        (workspace / rel).write_text("Z = 2\n")
        changed = code_state(workspace)
        assert changed.digest != base and changed.dirty, rel
        (workspace / rel).write_text("Z = 1\n")
    assert is_own_path(".perfgate/ledger.db") and is_own_path(f"{COPY}/perfgate/x.py")


def test_without_git_a_harness_copy_is_not_code(tmp_path: Path) -> None:
    workspace = tmp_path / "plain"
    (workspace / COPY / "perfgate").mkdir(parents=True)
    (workspace / "train.py").write_text("print(1)\n")
    base = code_state(workspace)
    assert base.kind == "tree" and base.files == 1
    (workspace / COPY / "perfgate" / "window.py").write_text("X = 1\n")
    assert code_state(workspace).digest == base.digest
    (workspace / "model.py").write_text("X = 1\n")
    assert code_state(workspace).digest != base.digest
