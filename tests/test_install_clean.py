"""`pip install .` and `pip install -e .` leave the source tree as git had it: no build/, no *.egg-info
(issue 47). Offline: the build runs with this environment's setuptools (--no-build-isolation --no-deps)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
GIT = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]


def _checkout(tmp_path: Path) -> Path:
    """A fresh repository holding the files this checkout tracks, as a user's clone would."""
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout
    tree = tmp_path / "perfgate"
    for rel in filter(None, listed.decode().split("\0")):
        source = REPO / rel
        if source.is_file():
            (tree / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, tree / rel)
    subprocess.run(["git", "init", "-q", str(tree)], check=True)
    subprocess.run([*GIT, "add", "-A"], cwd=tree, check=True)
    subprocess.run([*GIT, "commit", "-qm", "clone"], cwd=tree, check=True)
    return tree


def _pip(tree: Path, *args: str) -> None:
    """pip install into a --target folder: the environment running the tests is never touched (an install with
    --prefix would first uninstall its perfgate)."""
    assert "--target" in args
    env = {k: v for k, v in os.environ.items() if k != "PIP_REQUIRE_VIRTUALENV"}
    out = subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", *args],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]


def _left_behind(tree: Path) -> str:
    return subprocess.run(
        ["git", "status", "--porcelain", "--ignored"], cwd=tree, capture_output=True, text=True, check=True
    ).stdout


def _imports_from(site: Path, expected: Path) -> None:
    """Where ``import perfgate`` finds the package with ``site`` as the only site folder (``-S``: not the
    environment running the tests, which has perfgate installed itself)."""
    code = (
        f"import importlib.util, site; site.addsitedir({str(site)!r}); "
        "print(importlib.util.find_spec('perfgate').origin)"
    )
    out = subprocess.run(
        [sys.executable, "-S", "-c", code], capture_output=True, text=True, check=True, cwd=site
    )
    assert Path(out.stdout.strip()).resolve().is_relative_to(expected.resolve()), out.stdout


def test_an_install_leaves_the_source_tree_clean(tmp_path: Path) -> None:
    tree = _checkout(tmp_path)
    target = tmp_path / "installed"
    _pip(tree, ".", "--target", str(target))
    assert _left_behind(tree) == ""
    assert (target / "perfgate" / "schemas" / "tools_list.json").is_file()  # package data came along
    assert (target / "perfgate" / "skills" / "SKILL.md").is_file()
    _imports_from(target, target)


def test_an_editable_install_leaves_the_source_tree_clean(tmp_path: Path) -> None:
    tree = _checkout(tmp_path)
    target = tmp_path / "installed"
    _pip(tree, "-e", ".", "--target", str(target))
    assert _left_behind(tree) == ""
    _imports_from(target, tree / "src")
