"""Links the agent plants in ``.perfgate/`` never make the server create, write or delete outside the workspace.

The agent can write the whole workspace, ``.perfgate/`` included (it can rename the folder away and put its
own in place). Each test plants symbolic links where the server keeps its own folders and lock files,
pointing at a folder outside the workspace (standing for a root-only directory), runs the tool that uses
them through the protocol, and asserts that nothing in that folder changed.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest
from mcp import Client

import perfgate.tools
from _trust import any_code_rules, operator_policy
from perfgate.helpers import statefs
from perfgate.helpers.safeopen import UnsafeFileError
from perfgate.server import build_server
from perfgate.serving.runtime import ServerConfig
from perfgate.tools import run_benchmark_window
from perfgate.tools.run_benchmark_window_models import RunBenchmarkWindowInput

pytestmark = pytest.mark.anyio

PY = sys.executable
PACED = str(Path(__file__).resolve().parents[1] / "examples" / "paced_loop.py")
LOGS = Path(__file__).parent / "fixtures" / "logs"


@pytest.fixture(autouse=True)
def registry_with_benchmark_tools(monkeypatch: pytest.MonkeyPatch) -> None:
    if run_benchmark_window.SPEC not in perfgate.tools.REGISTRY:
        monkeypatch.setattr(perfgate.tools, "REGISTRY", (*perfgate.tools.REGISTRY, run_benchmark_window.SPEC))


@pytest.fixture
def outside(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder outside the workspace holding a file and a folder: what a root-only directory would hold."""
    root = tmp_path_factory.mktemp("outside")
    (root / "precious.txt").write_text("keep me\n")
    (root / "records").mkdir()
    (root / "records" / "rank0.json").write_text("{}\n")
    return root


def _snapshot(folder: Path) -> dict[str, str | None]:
    """Every name under ``folder`` with the content of each file (None for a folder)."""
    out: dict[str, str | None] = {}
    for path in sorted(folder.rglob("*")):
        out[str(path.relative_to(folder))] = None if path.is_dir() else path.read_text(errors="replace")
    return out


def _text(result: Any) -> str:
    return " ".join(getattr(c, "text", "") for c in result.content)


def _paced_args() -> dict[str, Any]:
    return {
        "command": [PY, PACED, "--steps", "200", "--step-ms", "1", "--samples", "8"],
        "timing": "explicit",
        "warmup_steps": 1,
        "measure_steps": 3,
        "repeats": 1,
        "timeout_s": 60,
        "contract": {
            "invariants": {"workload": "paced"},
            "execution": {"step_ms": 1},
            "classes": {"step_ms": "execution"},
        },
    }


async def test_links_at_the_run_folder_and_its_lock_touch_nothing_outside(
    workspace: Path, outside: Path
) -> None:
    """``bench-runs/<key>`` linked to a folder elsewhere (the run would empty and refill ``records/`` there,
    then remove it) and ``<key>.lock`` linked to a missing file elsewhere (the lock would create it): the run
    goes ahead in a folder of its own and nothing outside changes."""
    operator_policy("[execution]\n" + any_code_rules([PY, "-m", "perfgate.harness"], [PY, PACED]))
    args = _paced_args()
    inp = RunBenchmarkWindowInput.model_validate(args)
    key = hashlib.sha256(json.dumps(inp.model_dump(mode="json"), sort_keys=True).encode()).hexdigest()[:16]
    runs = workspace / ".perfgate" / "bench-runs"
    runs.mkdir(parents=True)
    (runs / key).symlink_to(outside, target_is_directory=True)
    (runs / f"{key}.lock").symlink_to(outside / "created-by-the-lock")
    before = _snapshot(outside)

    async with Client(build_server(ServerConfig.create(workspace))) as client:
        result = await client.call_tool("run_benchmark_window", args)

    assert _snapshot(outside) == before
    assert not result.is_error, _text(result)
    assert result.structured_content is not None and result.structured_content["state"] == "executed"
    # the run folder and its lock are in the trust root now: the links planted here are not even looked at
    assert (runs / key).is_symlink() and (runs / f"{key}.lock").is_symlink()


async def test_a_linked_decisions_lock_creates_nothing_outside(workspace: Path, outside: Path) -> None:
    state = workspace / ".perfgate"
    state.mkdir()
    (state / "decisions.lock").symlink_to(outside / "created-by-the-lock")
    before = _snapshot(outside)
    async with Client(build_server(ServerConfig.create(workspace))) as client:
        result = await client.call_tool("record_decision", {"action": "show", "experiment_id": "exp-nope"})
        assert "no experiment 'exp-nope'" in _text(result)
    assert _snapshot(outside) == before


async def test_a_linked_artifact_folder_receives_no_evidence(workspace: Path, outside: Path) -> None:
    """``.perfgate/artifacts`` swapped for a link while the server runs: the evidence of the next call is
    refused with the reason, never written into the folder the link names."""
    shutil.copytree(LOGS, workspace / "logs")
    before = _snapshot(outside)
    async with Client(build_server(ServerConfig.create(workspace))) as client:
        artifacts = workspace / ".perfgate" / "artifacts"
        artifacts.rename(workspace / "moved-away")
        artifacts.symlink_to(outside, target_is_directory=True)
        result = await client.call_tool(
            "import_benchmark",
            {
                "paths": ["logs/nanogpt.log"],
                "format": "nanogpt",
                "warmup_steps": 10,
                "windows": 1,
                "world_size": 8,
            },
        )
    assert _snapshot(outside) == before
    assert result.is_error and "symbolic link" in _text(result), _text(result)


async def test_a_linked_ledger_database_is_refused_not_written(workspace: Path, outside: Path) -> None:
    """A ``ledger.db`` that is a link to an empty file elsewhere: SQLite would write a database into it."""
    state = workspace / ".perfgate"
    state.mkdir()
    (outside / "empty.db").write_bytes(b"")
    (state / "ledger.db").symlink_to(outside / "empty.db")
    before = _snapshot(outside)
    with pytest.raises(UnsafeFileError, match="symbolic link"):
        async with Client(build_server(ServerConfig.create(workspace))) as client:
            await client.call_tool("record_decision", {"action": "show", "experiment_id": "exp-nope"})
    assert _snapshot(outside) == before


# --------------------------------------------------------------------------- the primitives


def test_remove_tree_removes_links_inside_and_never_what_they_name(tmp_path: Path, outside: Path) -> None:
    tree = tmp_path / "run"
    (tree / "records").mkdir(parents=True)
    (tree / "records" / "to-dir").symlink_to(outside, target_is_directory=True)
    (tree / "to-file").symlink_to(outside / "precious.txt")
    before = _snapshot(outside)
    statefs.remove_tree(tree.resolve())
    assert not tree.exists() and _snapshot(outside) == before


def test_a_link_above_the_path_is_refused_by_every_operation(tmp_path: Path, outside: Path) -> None:
    base = tmp_path.resolve()
    (base / "state").symlink_to(outside, target_is_directory=True)
    before = _snapshot(outside)
    target = base / "state" / "records"
    for operation in (
        lambda: statefs.remove_tree(target),
        lambda: statefs.fresh_dir(target),
        lambda: statefs.make_dirs(target / "deeper"),
        lambda: statefs.write_file(base / "state" / "new.txt", b"x"),
        lambda: os.close(statefs.open_lock(base / "state" / "new.lock")),
    ):
        with pytest.raises(UnsafeFileError, match="symbolic link"):
            operation()
    assert _snapshot(outside) == before


def test_a_planted_lock_file_is_replaced_by_the_servers_own(tmp_path: Path, outside: Path) -> None:
    """A hard link to a file elsewhere (the agent's own file, the only kind it may link) or a FIFO at the
    lock's name is set aside: the lock is taken on a file the server made, with one name."""
    base = tmp_path.resolve()
    os.link(outside / "precious.txt", base / "hard.lock")
    os.mkfifo(base / "fifo.lock")
    for name in ("hard.lock", "fifo.lock"):
        fd = statefs.open_lock(base / name)
        try:
            st = os.fstat(fd)
            assert st.st_nlink == 1 and st.st_ino != (outside / "precious.txt").stat().st_ino
        finally:
            os.close(fd)
    assert (outside / "precious.txt").stat().st_nlink == 1 and (
        outside / "precious.txt"
    ).read_text() == "keep me\n"


def test_perfgate_report_never_writes_through_a_linked_report_folder(
    workspace: Path, outside: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The operator's ``perfgate report`` writes ``.perfgate/report`` by default: a link planted there makes
    it refuse with what to do, not write its pages where the link leads."""
    from perfgate.cli import main as cli_main
    from perfgate.evidence import Ledger

    Ledger(workspace)
    (workspace / ".perfgate" / "report").symlink_to(outside, target_is_directory=True)
    before = _snapshot(outside)
    assert cli_main(["report", "all", "--workspace", str(workspace)]) == 2
    err = capsys.readouterr().err
    assert "symbolic link" in err and "next: remove the link, or pass --out" in err
    assert _snapshot(outside) == before
    # The operator's own --out is taken where it leads.
    assert (
        cli_main(["report", "all", "--workspace", str(workspace), "--out", str(workspace / "elsewhere")]) == 0
    )
    assert (workspace / "elsewhere" / "index.html").is_file()


def test_an_artifact_copied_in_replaces_a_link_at_its_name_and_never_writes_through_it(
    workspace: Path, outside: Path
) -> None:
    """Artifacts copied into a record's folder (logs, records, imported sources) are written aside and
    renamed over the name: a link planted at the name is replaced, the file it names is left alone."""
    import io

    from perfgate.evidence import Ledger
    from perfgate.serving.runtime import EvidenceBuilder

    ev = EvidenceBuilder(
        id=Ledger.new_id(), tool="t", dir=Ledger(workspace).artifact_dir("ev-x"), started_at=""
    )
    target = ev.path("launch0_stdout.log")
    target.symlink_to(outside / "precious.txt")
    before = _snapshot(outside)
    assert ev.copy_in("launch0_stdout.log", io.BytesIO(b"step 1\n" * 300_000)) == target
    assert _snapshot(outside) == before
    assert not target.is_symlink() and target.read_bytes() == b"step 1\n" * 300_000
