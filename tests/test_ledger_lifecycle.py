# pyright: reportPrivateUsage=false
"""A workspace's evidence survives what people do to repositories: deleted, moved, copied, upgraded.

Through the server (the in-memory MCP client) as a user would: a deleted `.perfgate/` is refused until the
operator retires the lost ledger at a terminal (an agent, with no terminal and no trust root of the
server's, cannot); a moved workspace keeps its proof; two copies that grew apart are reported; a ledger
made by an older perfgate (tests/fixtures/ledger_format1) opens, verifies and supports a keep.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from mcp import Client

from _approval_pty import run_in_pty
from perfgate.cli import main as cli_main
from perfgate.evidence import Ledger
from perfgate.evidence._database import FORMAT, LedgerFormatError
from perfgate.execution.approve_cli import EXIT_NO_TTY
from perfgate.security.trustroot import TrustRoot
from perfgate.server import build_server
from perfgate.serving.runtime import ServerConfig
from test_record_decision import (
    Evidence,
    _honest,
    _keep,
    _open,
    _text,
)

pytestmark = pytest.mark.anyio

FIXTURE = Path(__file__).parent / "fixtures" / "ledger_format1"


async def _honest_keep(workspace: Path) -> Any:
    """Open an experiment in ``workspace``'s server, record honest evidence for it and decide keep."""
    async with Client(build_server(ServerConfig.create(workspace))) as client:
        exp = await _open(client)
        links, _ = _honest(Evidence(workspace))
        return await _keep(client, exp, links)


def _accepted(result: Any) -> bool:
    out: dict[str, Any] = result.structured_content or {}
    return not result.is_error and out.get("accepted") is True


def _verify(workspace: Path, capsys: pytest.CaptureFixture[str], *extra: str) -> tuple[int, str]:
    capsys.readouterr()
    code = cli_main(["ledger", "verify", "--workspace", str(workspace), *extra])
    return code, capsys.readouterr().out


def _retire_piped(workspace: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    """`perfgate ledger retire` as an agent's shell runs it: no terminal."""
    return subprocess.run(
        [sys.executable, "-m", "perfgate", "ledger", "retire", "--workspace", str(workspace), *extra],
        input="retire\n",
        capture_output=True,
        text=True,
        timeout=120,
        start_new_session=True,
    )


async def test_a_deleted_ledger_is_refused_until_the_operator_retires_it(
    workspace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _accepted(first := await _honest_keep(workspace)), _text(first)
    shutil.rmtree(workspace / ".perfgate")  # starting over, as `git clean -xdf` does
    refused = await _honest_keep(workspace)
    assert not _accepted(refused)
    said = _text(refused)
    assert "ledger_integrity: the trust root anchored another ledger database here before" in said
    assert f"-> the operator runs `perfgate ledger retire --workspace {workspace}`" in said
    assert "or re-measure" not in said  # a new measurement cannot bring the old ledger back
    code, out = _verify(workspace, capsys)
    assert code == 1 and "next: the operator runs" in out and "perfgate ledger retire" in out

    code, shown = run_in_pty(["ledger", "retire", "--workspace", str(workspace)], "no", b"to confirm:")
    assert code == 1 and "nothing retired" in shown
    code, shown = run_in_pty(["ledger", "retire", "--workspace", str(workspace)], "retire", b"to confirm:")
    assert code == 0 and "retired ledger" in shown and "records)" in shown, shown

    kept = await _honest_keep(workspace)
    assert _accepted(kept), _text(kept)
    code, out = _verify(workspace, capsys)
    assert code == 0, out
    assert "retired by the operator" in out and " on /dev/" in out
    report = Ledger(workspace).verify()
    assert report.retired and report.retired[0]["records"] > 0
    code, shown = run_in_pty(["ledger", "retire", "--workspace", str(workspace)], None)
    assert code == 0 and "nothing to retire" in shown


async def test_an_agent_confined_to_the_workspace_cannot_retire_a_ledger(
    workspace: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    Evidence(workspace).env()
    shutil.rmtree(workspace / ".perfgate")
    Evidence(workspace).env()
    # No terminal: refused, and nothing recorded.
    piped = _retire_piped(workspace)
    assert piped.returncode == EXIT_NO_TTY and "not a TTY" in piped.stderr, piped.stderr
    assert "perfgate ledger retire --workspace" in piped.stderr
    # A trust root of its own (the one it can write), even at a terminal: nothing there to retire, and the
    # server's trust root still refuses.
    own = tmp_path / "agent-state"
    code, shown = run_in_pty(
        ["ledger", "retire", "--workspace", str(workspace), "--state-dir", str(own)], "retire", b"to confirm:"
    )
    assert code == 0 and "nothing to retire" in shown
    code, out = _verify(workspace, capsys)
    assert code == 1 and "anchored another ledger database here before" in out
    assert Ledger(workspace).lost()


async def test_a_moved_workspace_verifies_and_keeps(
    workspace: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ev = Evidence(workspace)
    ids = [ev.env(), ev.window()]
    ev.ledger.close()
    moved = tmp_path / "renamed"
    shutil.move(workspace, moved)
    code, out = _verify(moved, capsys)
    assert code == 0, out
    assert f"anchored at {workspace}" in out
    assert [r.id for r in Ledger(moved).records()] == ids  # signed records verify at the new path
    kept = await _honest_keep(moved)
    assert _accepted(kept), _text(kept)
    code, out = _verify(moved, capsys)
    assert code == 0 and "diverged" not in out, out
    # A rollback of the moved copy is still caught: the anchor of its old path says how far it went.
    shutil.rmtree(workspace, ignore_errors=True)
    other = tmp_path / "rolled-back"
    shutil.copytree(moved, other)
    with sqlite3.connect(other / ".perfgate" / "ledger.db") as conn:
        conn.execute("DROP TRIGGER evidence_no_delete")
        conn.execute("DELETE FROM evidence WHERE seq > 1")
    shutil.rmtree(moved)
    code, out = _verify(other, capsys)
    assert code == 1 and "rolled back" in out, out


async def test_two_copies_that_grow_apart_are_told_apart_and_reported(
    workspace: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    Evidence(workspace).env()
    clone = tmp_path / "clone"
    shutil.copytree(workspace, clone)
    mine = Evidence(workspace).env()
    theirs = Evidence(clone).env()
    for here, there, own, foreign in ((workspace, clone, mine, theirs), (clone, workspace, theirs, mine)):
        code, out = _verify(here, capsys)
        assert code == 0, out
        assert f"diverged: the copy of this ledger at {there}" in out
        ids = [r.id for r in Ledger(here).records()]
        assert own in ids and foreign not in ids  # never merged
    kept = await _honest_keep(clone)
    assert _accepted(kept), _text(kept)


def _fixture_workspace(workspace: Path, trust: TrustRoot) -> dict[str, Any]:
    """The format-1 ledger of tests/fixtures/ledger_format1 in ``workspace``, its key and anchor in
    ``trust`` (anchored at the path it was made in, which does not exist here)."""
    shutil.copytree(FIXTURE / "state_dir", workspace / ".perfgate")
    shutil.copy(FIXTURE / "train.py", workspace / "train.py")
    shutil.copytree(FIXTURE / "trust" / "keys", trust.key_dir)
    made_in = Path((FIXTURE / "trust" / "anchor" / "workspace").read_text().strip())
    shutil.copytree(
        FIXTURE / "trust" / "anchor", trust.state_dir / "workspaces" / trust.workspace_id(made_in)
    )
    return json.loads((FIXTURE / "links.json").read_text())


async def test_a_ledger_from_an_older_format_opens_verifies_and_supports_a_keep(
    workspace: Path, trust_root: TrustRoot, capsys: pytest.CaptureFixture[str]
) -> None:
    made = _fixture_workspace(workspace, trust_root)
    with sqlite3.connect(workspace / ".perfgate" / "ledger.db") as conn:
        assert conn.execute("SELECT value FROM meta WHERE name = 'format'").fetchone() is None
    report = Ledger(workspace).verify()
    assert report.ok, report.errors
    assert report.format_migrated_from == 1 and report.signed_records == report.records == 10
    code, out = _verify(workspace, capsys)
    assert code == 0 and "upgraded: written in ledger format 1" in out, out
    async with Client(build_server(ServerConfig.create(workspace))) as client:
        kept = await _keep(client, made["experiment"], made["links"])
    assert _accepted(kept), _text(kept)
    with sqlite3.connect(workspace / ".perfgate" / "ledger.db") as conn:
        assert conn.execute("SELECT value FROM meta WHERE name = 'format'").fetchone() == (str(FORMAT),)


def test_a_ledger_from_a_newer_perfgate_is_refused_unchanged(workspace: Path) -> None:
    Evidence(workspace).env()
    db = workspace / ".perfgate" / "ledger.db"
    Ledger(workspace).close()
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE meta SET value = ? WHERE name = 'format'", (str(FORMAT + 1),))
    before = db.read_bytes()
    with pytest.raises(LedgerFormatError, match="upgrade perfgate"):
        Ledger(workspace)
    assert db.read_bytes() == before
