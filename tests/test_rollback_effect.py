"""The rollback gate judges what a rollback would undo, read from the two sides' recorded runs: the
commits between them, the files their diffs touched, the variables and options that differ."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from perfgate.decisions.rollback import rollback_check
from test_record_decision import Evidence


def _git(workspace: Path, *args: str) -> str:
    ident = ["-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]
    done = subprocess.run(
        ["git", "-C", str(workspace), *ident, *args], check=True, capture_output=True, text=True
    )
    return done.stdout.strip()


def _commit(workspace: Path, files: dict[str, str], message: str) -> str:
    for name, text in files.items():
        (workspace / name).write_text(text)
    _git(workspace, "add", *files)
    _git(workspace, "commit", "-q", "-m", message)
    return _git(workspace, "rev-parse", "HEAD")


def _code(commit: str, diff_files: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "argv": ["python", "train.py"],
        "cwd": ".",
        "env_changes": [],
        "files": {},
        "code": {
            "commit": commit,
            "dirty": bool(diff_files),
            "diff_sha256": None,
            "diff_files": diff_files or {},
            "diff_artifact": None,
            "unknown_reason": None,
        },
    }


class Sides:
    """Three baseline and three candidate windows as run_benchmark_window records them."""

    def __init__(
        self,
        ev: Evidence,
        base_code: dict[str, Any],
        cand_code: dict[str, Any],
        base_run: dict[str, Any] | None = None,
        cand_run: dict[str, Any] | None = None,
    ) -> None:
        self.ledger = ev.ledger
        self.base = [ev.window(provenance=base_code, run=base_run) for _ in range(3)]
        self.cand = [ev.window(provenance=cand_code, run=cand_run) for _ in range(3)]

    def judge(self, rollback: str) -> Any:
        records = [
            [r for i in ids if (r := self.ledger.get(i)) is not None] for ids in (self.base, self.cand)
        ]
        return rollback_check(rollback, self.ledger.workspace, *records)


@pytest.fixture
def repo(workspace: Path) -> tuple[str, str]:
    """A repository whose baseline commit runs train.py v1 and whose candidate commit (HEAD) runs v2."""
    _git(workspace, "init", "-q")
    base = _commit(workspace, {"train.py": "for step in range(10):\n    slow()\n"}, "baseline")
    cand = _commit(workspace, {"train.py": "for step in range(10):\n    fast()\n"}, "vectorize the loop")
    return base, cand


def test_a_committed_change_is_undone_by_reverting_its_commit_by_any_name(
    workspace: Path, repo: tuple[str, str]
) -> None:
    base, cand = repo
    _git(workspace, "branch", "opt", cand)
    sides = Sides(Evidence(workspace), _code(base), _code(cand))
    for rollback in (
        "git revert HEAD",
        "git revert --no-edit opt",
        f"git revert {cand[:9]}",
        f"git revert {base[:9]}..{cand[:9]}",
        "git checkout HEAD~1 -- train.py",
        f"git restore --source={base[:12]} train.py",
        f"git reset --hard {base[:12]}",
    ):
        check = sides.judge(rollback)
        assert check.ok, (rollback, check)
        assert "undoes the candidate's change" in check.reason


def test_a_rollback_that_restores_nothing_of_the_change_is_refused_with_the_one_that_would(
    workspace: Path, repo: tuple[str, str]
) -> None:
    base, cand = repo
    (workspace / "change.patch").write_text("--- a/other.py\n+++ b/other.py\n@@ -1 +1 @@\n-a\n+b\n")
    sides = Sides(Evidence(workspace), _code(base), _code(cand))
    for rollback, why in (
        ("revert it", "leaves the code change in train.py"),
        # names the script and a flag, restores nothing: HEAD holds the candidate's version
        ("git checkout HEAD -- train.py --num-workers 0", "leaves the code change in train.py"),
        ("git revert HEAD~1", "is not the candidate's commit"),
        ("git apply -R change.patch", "leaves the code change in train.py"),
        ("git revert 1a2b3c4", "1a2b3c4 (no commit of the workspace's repository)"),
    ):
        check = sides.judge(rollback)
        assert not check.ok, (rollback, check)
        assert why in check.reason, check.reason
        assert f"git revert --no-edit {cand[:12]}" in check.fix, check.fix
    # HEAD moved on after the candidate ran: `git revert HEAD` now reverts another commit
    _commit(workspace, {"notes.md": "later work\n"}, "later")
    check = sides.judge("git revert HEAD")
    assert not check.ok and "not the candidate's commit" in check.reason
    (workspace / "undo.patch").write_text(
        "diff --git a/train.py b/train.py\n--- a/train.py\n+++ b/train.py\n@@ -2 +2 @@\n-    fast()\n+    slow()\n"
    )
    assert sides.judge("git apply -R undo.patch").ok


def test_an_uncommitted_change_is_undone_by_restoring_its_files(
    workspace: Path, repo: tuple[str, str]
) -> None:
    _, head = repo
    sides = Sides(Evidence(workspace), _code(head), _code(head, {"train.py": "d" * 64}))
    for rollback in ("git checkout -- train.py", "git restore train.py", "git stash", "git checkout ."):
        assert sides.judge(rollback).ok, rollback
    check = sides.judge("git checkout -- other.py")
    assert not check.ok and f"git checkout {head[:12]} -- train.py" in check.fix


def test_a_setting_is_undone_by_the_baseline_value_and_an_added_variable_by_unset(
    workspace: Path, repo: tuple[str, str]
) -> None:
    _, head = repo
    code = _code(head)
    ev = Evidence(workspace)
    added = Sides(ev, code, code, cand_run={"env": {"OMP_NUM_THREADS": "2"}})
    changed = Sides(
        ev,
        code,
        code,
        base_run={"env": {"OMP_NUM_THREADS": "1"}, "command": ["python", "train.py", "--num-workers", "0"]},
        cand_run={"env": {"OMP_NUM_THREADS": "2"}, "command": ["python", "train.py", "--num-workers", "4"]},
    )
    for rollback in ("unset OMP_NUM_THREADS", "env -u OMP_NUM_THREADS python train.py"):
        assert added.judge(rollback).ok, rollback
    check = added.judge("OMP_NUM_THREADS=1")
    assert not check.ok and "environment variable OMP_NUM_THREADS" in check.reason
    assert "unset OMP_NUM_THREADS" in check.fix
    for rollback in (
        "OMP_NUM_THREADS=1 python train.py --num-workers 0",
        "export OMP_NUM_THREADS=1; run with --num-workers=0",
    ):
        assert changed.judge(rollback).ok, rollback
    check = changed.judge("OMP_NUM_THREADS=1 --num-workers 2")
    assert not check.ok and "option --num_workers" in check.reason
    assert "--num_workers 0" in check.fix


def test_a_change_of_code_and_a_variable_needs_both_undone(workspace: Path, repo: tuple[str, str]) -> None:
    base, cand = repo
    sides = Sides(Evidence(workspace), _code(base), _code(cand), cand_run={"env": {"MY_FUSED": "1"}})
    check = sides.judge("git revert HEAD")
    assert not check.ok and "environment variable MY_FUSED" in check.reason
    assert "train.py" not in check.reason
    assert sides.judge("git revert HEAD && unset MY_FUSED").ok


def test_hostile_rollbacks_are_read_never_run(workspace: Path, repo: tuple[str, str]) -> None:
    base, cand = repo
    sides = Sides(Evidence(workspace), _code(base), _code(cand))
    marker = workspace / "pwned"
    for rollback in (
        f"git revert --output={marker} HEAD~1",
        f"git revert $(touch {marker})",
        f"git -c core.pager='touch {marker}' revert HEAD~1 ; touch {marker}",
        "git revert 'HEAD:train.py' HEAD@{0}^^^^^^^^^^^^^^^^^",
        "git checkout -- ../../etc/passwd",
        "git revert " + "A" * 5000,
        '"unterminated',
    ):
        check = sides.judge(rollback)
        assert not check.ok, (rollback, check)
    assert not marker.exists()


def test_without_a_recorded_difference_a_rollback_names_a_commit_by_any_ref(
    workspace: Path, repo: tuple[str, str]
) -> None:
    """Windows without provenance (as imported ones are): the rollback must still name something real."""
    sides = Sides(Evidence(workspace), {}, {})
    assert sides.judge("git revert HEAD").ok
    assert sides.judge("git checkout HEAD -- train.py").ok
    assert sides.judge("undo the change").ok is False
