"""What counts as code for the state that binds a run: tracked files, every file Python can import, and
untracked configs a run reaches; never scratch that cannot run (notes, outputs)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from perfgate.envprobe.codefiles import imported_names
from perfgate.envprobe.provenance import code_state

GIT = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / "src" / "model").mkdir(parents=True)
    (tmp_path / "train.py").write_text("import model\nprint(1)\n")
    (tmp_path / "src" / "model" / "__init__.py").write_text("X = 1\n")
    (tmp_path / ".gitignore").write_text("outputs/\n")
    subprocess.run([*GIT, "add", "-A"], cwd=tmp_path, check=True)
    subprocess.run([*GIT, "commit", "-qm", "base"], cwd=tmp_path, check=True)
    return tmp_path


def test_import_names_are_the_top_level_modules() -> None:
    source = "import a.b, c\nfrom d.e import f\n  import g\n# import h\nx = 'import i'\n"
    assert imported_names(source) >= {"a", "c", "d", "g"}


def test_scratch_that_cannot_run_leaves_the_code_state_alone(repo: Path) -> None:
    before = code_state(repo).digest
    (repo / "notes").mkdir()
    (repo / "notes" / "plan.md").write_text("# what I will try\n")
    (repo / "outputs").mkdir()
    (repo / "outputs" / "run.yaml").write_text("lr: 1\n")  # ignored, and no Python file
    (repo / "notes.md").write_text("scratch\n")
    after = code_state(repo)
    assert after.digest == before and after.untracked_code_files == 0


def test_a_python_file_in_any_folder_is_code_since_python_can_import_it(repo: Path) -> None:
    # `import notes.plan` finds notes/ as a namespace package from the run's directory: it can run.
    before = code_state(repo).digest
    (repo / "notes").mkdir()
    (repo / "notes" / "plan.py").write_text("# what I will try\n")
    after = code_state(repo)
    assert after.digest != before and after.uncommitted.keys() == {"notes/plan.py"} and after.dirty


def test_untracked_code_a_run_can_import_changes_the_code_state(repo: Path) -> None:
    base = code_state(repo).digest
    (repo / "helpers.py").write_text("Y = 1\n")  # a new module beside tracked code
    beside = code_state(repo).digest
    assert beside != base
    (repo / "fastlib").mkdir()
    (repo / "fastlib" / "__init__.py").write_text("")  # a new package
    (repo / "fastlib" / "ops.py").write_text("Z = 1\n")
    package = code_state(repo).digest
    assert package != beside
    (repo / "fastlib" / "ops.py").write_text("Z = 2\n")
    edited = code_state(repo).digest
    assert edited != package
    (repo / "src" / "model" / "new").mkdir()
    (repo / "src" / "model" / "new" / "kernels.py").write_text("K = 1\n")  # inside the project's tree
    assert code_state(repo).digest != edited


def test_an_untracked_config_becomes_code_once_code_that_counts_imports_its_folder(repo: Path) -> None:
    (repo / "scratch").mkdir()
    (repo / "scratch" / "tweak.yaml").write_text("t: 1\n")
    untouched = code_state(repo)
    assert untouched.untracked_code_files == 0
    # the tracked script now imports the namespace folder: its configs are code from here on
    (repo / "train.py").write_text("import model\nfrom scratch.tweak import T\nprint(T)\n")
    imported = code_state(repo)
    assert imported.untracked_code_files == 1
    (repo / "scratch" / "tweak.yaml").write_text("t: 2\n")
    assert code_state(repo).digest != imported.digest
