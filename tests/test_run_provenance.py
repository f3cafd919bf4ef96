"""What a launched run was (`perfgate.benchmarking.workload.provenance.run_provenance`), and the run directory a
call's input names and holds (`perfgate.execution.rundir`)."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
from pathlib import Path

import pytest

from _window_records import Artifacts
from perfgate.benchmarking.workload.provenance import run_provenance
from perfgate.errors import ToolError
from perfgate.execution.rundir import hold_run_dir, input_run_dir, one_run


def test_a_run_outside_a_repository_records_argv_env_names_and_file_digests(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "train.py").write_text("print('hi')\n")
    art = Artifacts(tmp_path / "ev")
    p = run_provenance(["python", "train.py", "--lr=1"], ".", ws, {"B": "1", "A": "2"}, ws, art)
    assert (p.argv, p.cwd, p.env_changes) == (["python", "train.py", "--lr=1"], ".", ["A", "B"])
    assert p.files == {"train.py": hashlib.sha256(b"print('hi')\n").hexdigest()}
    assert p.code.commit is None and p.code.unknown_reason and art.names == []


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_a_dirty_repository_keeps_its_diff_as_an_artifact_without_the_runs_secrets(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    git = ["git", "-C", str(ws), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    (ws / "train.py").write_text("x = 1\n")
    subprocess.run([*git, "add", "train.py"], check=True)
    subprocess.run([*git, "commit", "-qm", "base"], check=True)
    secret = "hunter2-very-secret-token"
    (ws / "train.py").write_text(f"x = 2  # {secret}\n")
    art = Artifacts(ws / ".perfgate" / "ev")
    p = run_provenance(["python", "train.py"], ".", ws, {"API_TOKEN": secret}, ws, art)
    assert p.code.commit and p.code.dirty is True and "train.py" in p.code.diff_files
    assert p.code.diff_artifact == ".perfgate/ev/code.diff" and art.names == ["code.diff"]
    diff = (ws / p.code.diff_artifact).read_text()
    assert "x = 2" in diff and secret not in diff


def test_a_run_directory_is_named_by_the_input_alone(tmp_path: Path) -> None:
    a = input_run_dir(tmp_path, {"command": ["python", "t.py"], "repeats": 3})
    assert a == input_run_dir(tmp_path, {"repeats": 3, "command": ["python", "t.py"]})
    assert a.parent == tmp_path and len(a.name) == 16
    assert a != input_run_dir(tmp_path, {"command": ["python", "t.py"], "repeats": 4})


def test_a_second_run_of_the_same_input_is_refused_while_one_holds_the_folder(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    with (
        hold_run_dir(run_dir, wait=False),
        pytest.raises(ToolError, match="a run_benchmark_window run of this"),
        one_run(run_dir, "run_benchmark_window", "the-folder"),
    ):
        pass
    with one_run(run_dir, "run_benchmark_window", "the-folder"):  # free again
        pass
