"""The code state of a repository the agent writes: reading it runs nothing the repository configures, and
every file Python can import is bound, whatever git is told to ignore (issue 43 items 4 and 5)."""

from __future__ import annotations

import os
import py_compile
import subprocess
import sys
import zlib
from pathlib import Path

import pytest

from perfgate.benchmarking.workload.provenance import diff_sections
from perfgate.envprobe.codefiles import import_roots, resolve_program
from perfgate.envprobe.provenance import code_state, git_snapshot

GIT = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]


def git(repo: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull}
    return subprocess.run(
        [*GIT, "-C", str(repo), *args], check=check, capture_output=True, text=True, env=env
    )


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    root.mkdir()
    git(root, "init", "-q")
    (root / "train.py").write_text("import helper\nprint(helper.X)\n")
    (root / "helper.py").write_text("X = 'tracked'\n")
    git(root, "add", "-A")
    git(root, "commit", "-qm", "base")
    return root


def _marker_command(marker: Path) -> str:
    """A shell command that leaves ``marker`` behind and passes its input through (a working filter)."""
    return f"sh -c 'touch {marker}; cat' --"


# --------------------------------------------------------------------- nothing configured runs


def _plant(repo: Path, kind: str, marker: Path) -> list[str]:
    """Configure ``kind`` to run a marker command; returns the git command that would run it."""
    cmd = _marker_command(marker)
    script = repo.parent / "prog.sh"
    script.write_text(f"#!/bin/sh\ntouch {marker}\ncat\n")
    script.chmod(0o755)
    if kind in ("clean filter", "process filter", "clean filter in .gitattributes"):
        key = "filter.x.process" if kind == "process filter" else "filter.x.clean"
        git(repo, "config", key, cmd)
        attributes = repo / (".gitattributes" if "gitattributes" in kind else ".git/info/attributes")
        attributes.parent.mkdir(exist_ok=True)
        attributes.write_text("*.py filter=x\n")
        return ["status", "--porcelain"]
    if kind == "textconv":
        git(repo, "config", "diff.x.textconv", str(script))
        (repo / ".git" / "info").mkdir(exist_ok=True)
        (repo / ".git" / "info" / "attributes").write_text("*.py diff=x\n")
        return ["diff", "HEAD"]
    if kind == "external diff":
        git(repo, "config", "diff.external", str(script))
        return ["diff", "HEAD"]
    if kind == "fsmonitor":
        git(repo, "config", "core.fsmonitor", str(script))
        return ["status", "--porcelain"]
    if kind == "hook":
        hooks = repo.parent / "hooks"
        hooks.mkdir()
        (hooks / "post-index-change").write_text(f"#!/bin/sh\ntouch {marker}\n")
        (hooks / "post-index-change").chmod(0o755)
        git(repo, "config", "core.hooksPath", str(hooks))
        return ["add", "helper.py"]
    assert kind == "pager"
    git(repo, "config", "core.pager", str(script))
    git(repo, "config", "pager.status", "true")
    return ["-p", "status"]


KINDS = [
    "clean filter",
    "clean filter in .gitattributes",
    "process filter",
    "textconv",
    "external diff",
    "fsmonitor",
    "hook",
    "pager",
]


@pytest.mark.parametrize("kind", KINDS)
def test_reading_the_code_state_runs_no_program_the_repository_configures(repo: Path, kind: str) -> None:
    marker = repo.parent / "ran"
    (repo / "helper.py").write_text("X = 'edited'\n")
    control = _plant(repo, kind, marker)
    state = code_state(repo)
    snap, reason = git_snapshot(repo)
    assert not marker.exists(), f"a {kind} ran while perfgate read the code state"
    # the state is still read right: one changed file, its edit in the diff
    assert reason is None and snap is not None and snap.changed_files == 1
    assert b"+X = 'edited'" in snap.diff and state.dirty and state.kind == "git"
    if kind != "pager":  # git starts a pager only on a terminal; the others run under plain git
        git(repo, *control, check=False)
        assert marker.exists(), f"the planted {kind} does not run under git: the test proves nothing"


def test_an_included_config_file_names_programs_that_do_not_run_either(repo: Path) -> None:
    marker = repo.parent / "ran"
    extra = repo.parent / "extra.cfg"
    extra.write_text(
        f'[filter "x"]\n\tclean = {_marker_command(marker)}\n[core]\n\tfsmonitor = {marker}.sh\n'
    )
    git(repo, "config", "include.path", str(extra))
    (repo / ".gitattributes").write_text("*.py filter=x\n")
    (repo / "helper.py").write_text("X = 'edited'\n")
    assert code_state(repo).dirty
    assert not marker.exists()


def test_a_change_hidden_from_git_by_the_index_still_makes_the_state_dirty(repo: Path) -> None:
    clean = code_state(repo)
    (repo / "helper.py").write_text("X = 'slow clock'\n")
    git(repo, "update-index", "--assume-unchanged", "helper.py")
    (repo / "train.py").write_text("import helper\nprint(helper.X, 1)\n")
    git(repo, "update-index", "--skip-worktree", "train.py")
    assert git(repo, "status", "--porcelain").stdout == ""  # git itself now reports nothing
    state = code_state(repo)
    assert state.dirty and state.digest != clean.digest
    snap, _ = git_snapshot(repo)
    assert snap is not None and set(diff_sections(snap.diff)) == {"helper.py", "train.py"}


def test_a_forged_object_file_cannot_stand_in_for_the_commit(repo: Path) -> None:
    """The agent rewrites HEAD's tree object so it names the edited helper: the id no longer matches the
    content, so the repository is not read as a clean checkout of that commit."""
    clean = code_state(repo)
    tree = git(repo, "rev-parse", "HEAD^{tree}").stdout.strip()
    (repo / "helper.py").write_text("X = 'forged'\n")
    blob = git(repo, "hash-object", "-w", "helper.py").stdout.strip()
    train = git(repo, "rev-parse", "HEAD:train.py").stdout.strip()
    body = b"".join(
        b"100644 " + name + b"\0" + bytes.fromhex(oid)
        for name, oid in ((b"helper.py", blob), (b"train.py", train))
    )
    path = repo / ".git" / "objects" / tree[:2] / tree[2:]
    path.chmod(0o644)
    path.write_bytes(zlib.compress(b"tree %d\0" % len(body) + body))
    state = code_state(repo)
    assert state.digest != clean.digest
    assert state.kind == "tree" or state.dirty


# --------------------------------------------------------------------- everything that can run is bound


def _shadow(repo: Path) -> None:
    (repo / "helper").mkdir()
    (repo / "helper" / "__init__.py").write_text("X = 'ignored package'\n")


@pytest.mark.parametrize("how", ["info/exclude", "core.excludesFile", ".gitignore"])
def test_an_ignored_package_shadowing_a_tracked_module_is_bound_and_dirty(repo: Path, how: str) -> None:
    clean = code_state(repo)
    assert not clean.dirty and not clean.uncommitted
    if how == "info/exclude":
        (repo / ".git" / "info").mkdir(exist_ok=True)
        (repo / ".git" / "info" / "exclude").write_text("helper/\n")
    elif how == "core.excludesFile":
        excludes = repo.parent / "global-ignore"
        excludes.write_text("helper/\n")
        git(repo, "config", "core.excludesFile", str(excludes))
    else:
        (repo / ".gitignore").write_text("helper/\n")
        git(repo, "add", ".gitignore")
        git(repo, "commit", "-qm", "ignore")
        clean = code_state(repo)
    _shadow(repo)
    assert "helper" not in git(repo, "status", "--porcelain").stdout  # git does not see it
    ran = subprocess.run([sys.executable, "train.py"], cwd=repo, capture_output=True, text=True, check=True)
    assert ran.stdout.strip() == "ignored package"  # and it is what the run imports
    state = code_state(repo)
    snap, _ = git_snapshot(repo)
    assert state.dirty and state.digest != clean.digest
    assert set(state.uncommitted) == {"helper/__init__.py"}
    assert snap is not None and snap.dirty and "helper/__init__.py" in diff_sections(snap.diff)
    (repo / "helper" / "__init__.py").write_text("X = 'swapped after approval'\n")
    assert code_state(repo).digest != state.digest


@pytest.mark.parametrize("name", ["evil.pth", "fast.cpython-311-x86_64-linux-gnu.so", "fast.pyd", "fast.pyc"])
def test_ignored_start_up_files_extension_modules_and_sourceless_bytecode_are_bound(
    repo: Path, name: str
) -> None:
    excludes = repo.parent / "global-ignore"
    excludes.write_text("*.pth\n*.so\n*.pyd\n*.pyc\n")
    git(repo, "config", "core.excludesFile", str(excludes))
    clean = code_state(repo)
    if name.endswith(".pyc"):
        source = repo.parent / "fast.py"
        source.write_text("X = 'sourceless'\n")
        py_compile.compile(str(source), cfile=str(repo / name))
        ran = subprocess.run(
            [sys.executable, "-c", "import fast; print(fast.X)"], cwd=repo, capture_output=True, text=True
        )
        assert ran.stdout.strip() == "sourceless"  # Python imports a .pyc with no source beside it
    else:
        (repo / name).write_bytes(b"\x7fELF not really" if name != "evil.pth" else b"import os\n")
    assert git(repo, "status", "--porcelain").stdout == ""
    state = code_state(repo)
    assert state.dirty and name in state.uncommitted and state.digest != clean.digest


def test_a_planted_pyvenv_cfg_does_not_hide_a_package(repo: Path) -> None:
    _shadow(repo)
    (repo / "helper" / "pyvenv.cfg").write_text("home = /usr/bin\n")
    (repo / ".git" / "info").mkdir(exist_ok=True)
    (repo / ".git" / "info" / "exclude").write_text("helper/\n")
    assert "helper/__init__.py" in code_state(repo).uncommitted


def test_a_honest_checkout_with_state_venvs_and_bytecode_stays_clean(repo: Path) -> None:
    clean = code_state(repo)
    (repo / ".gitignore").write_text(".perfgate/\n.venv/\nvenv/\n__pycache__/\n*.log\n")
    git(repo, "add", ".gitignore")
    git(repo, "commit", "-qm", "ignores")
    clean = code_state(repo)
    (repo / ".perfgate" / "artifacts").mkdir(parents=True)
    (repo / ".perfgate" / "artifacts" / "probe.py").write_text("# perfgate's own\n")
    for venv in (".venv", "venv"):
        site = repo / venv / "lib" / "python3.11" / "site-packages"
        site.mkdir(parents=True)
        (repo / venv / "pyvenv.cfg").write_text("home = /usr/bin\n")
        (repo / venv / "bin").mkdir()
        (repo / venv / "bin" / "activate_this.py").write_text("# virtualenv's\n")
        (site / "torch.py").write_text("# installed\n")
        (site / "distutils-precedence.pth").write_text("import os\n")
    # what a plain `python train.py` outside perfgate leaves (runs perfgate starts never read it)
    py_compile.compile(str(repo / "helper.py"), cfile=str(repo / "__pycache__" / "helper.cpython-311.pyc"))
    (repo / "train.log").write_text("step 1\n")
    state = code_state(repo)
    snap, _ = git_snapshot(repo)
    assert not state.dirty and not state.uncommitted and state.complete
    assert state.digest == clean.digest
    assert snap is not None and not snap.dirty and snap.diff == b""


def test_a_git_lfs_pointer_matches_the_file_it_names(repo: Path) -> None:
    import hashlib

    weights = b"\x00\x01" * 1000
    pointer = (
        "version https://git-lfs.github.com/spec/v1\n"
        f"oid sha256:{hashlib.sha256(weights).hexdigest()}\nsize {len(weights)}\n"
    )
    (repo / "weights.bin").write_text(pointer)
    git(repo, "add", "weights.bin")
    git(repo, "commit", "-qm", "lfs")
    (repo / "weights.bin").write_bytes(weights)  # what `git lfs pull` leaves in the work tree
    assert not code_state(repo).dirty
    (repo / "weights.bin").write_bytes(weights[:-1] + b"\x09")
    assert code_state(repo).dirty


def test_import_roots_and_workspace_programs_are_bound(repo: Path) -> None:
    hidden = repo / ".lib"
    hidden.mkdir()
    (hidden / "helper.py").write_text("X = 'from PYTHONPATH'\n")
    roots = import_roots(repo, repo, repo / "train.py", {"PYTHONPATH": f".lib{os.pathsep}/usr/lib"})
    assert roots == [repo.resolve(), hidden.resolve()]
    assert code_state(repo).uncommitted == {}  # a hidden folder is no import root of its own
    assert ".lib/helper.py" in code_state(repo, roots=roots).uncommitted
    (repo / "bin").mkdir()
    (repo / "bin" / "python").write_text("#!/bin/sh\necho not python\n")
    (repo / "bin" / "python").chmod(0o755)
    program = resolve_program("python", repo, f"{repo / 'bin'}{os.pathsep}/usr/bin")
    assert program == repo / "bin" / "python"
    state = code_state(repo, roots=roots, programs=[program])
    assert "bin/python" in state.uncommitted and state.dirty


def test_a_bound_that_leaves_files_out_says_so_and_changes_the_digest(
    repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import perfgate.envprobe.provenance as provenance

    for i in range(4):
        (repo / f"m{i}.py").write_text(f"I = {i}\n")
    whole = code_state(repo)
    monkeypatch.setattr(provenance, "MAX_CODE_FILES", 3)
    cut = code_state(repo)
    assert whole.complete and not cut.complete and cut.digest != whole.digest
    assert any("more than 3 importable files" in note for note in cut.notes)
    assert "INCOMPLETE" in cut.short()


def test_the_written_diff_has_git_s_layout(repo: Path) -> None:
    (repo / "helper.py").write_text("X = 'edited'")  # no newline at the end
    (repo / "train.py").unlink()
    (repo / "new.py").write_text("N = 1\n")
    git(repo, "add", "new.py")
    snap, _ = git_snapshot(repo)
    assert snap is not None and snap.changed_files == 3
    text = snap.diff.decode()
    assert "--- a/helper.py\n+++ b/helper.py\n" in text and "\\ No newline at end of file\n" in text
    assert "deleted file mode 100644\n" in text and "new file mode 100644\n" in text
    assert list(diff_sections(snap.diff)) == ["helper.py", "new.py", "train.py"]


def test_a_run_s_provenance_binds_its_python_path_and_its_workspace_python(repo: Path) -> None:
    from perfgate.benchmarking.workload.provenance import run_code_scope

    (repo / ".lib").mkdir()
    (repo / ".lib" / "helper.py").write_text("X = 'from PYTHONPATH'\n")
    (repo / "bin").mkdir()
    (repo / "bin" / "python").write_text('#!/bin/sh\nexec python3 "$@"\n')
    (repo / "bin" / "python").chmod(0o755)
    env = {"PYTHONPATH": ".lib", "PATH": f"{repo / 'bin'}{os.pathsep}/usr/bin"}
    roots, programs = run_code_scope(["python", "train.py"], repo, env, repo)
    assert repo / ".lib" in roots and programs == [repo / "bin" / "python"]
    plain, _ = git_snapshot(repo)
    snap, _ = git_snapshot(repo, roots=roots, programs=programs)
    assert plain is not None and snap is not None
    assert {".lib/helper.py", "bin/python"} <= set(diff_sections(snap.diff))
    assert ".lib/helper.py" not in diff_sections(plain.diff)
