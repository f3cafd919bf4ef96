"""``perfgate approve`` and ``perfgate approvals``: a human at a terminal decides, nobody else."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

from _approval_pty import run_in_pty
from perfgate.errors import ToolError
from perfgate.evidence import Ledger
from perfgate.execution.approvals import ApprovalStatus, ApprovalStore
from perfgate.execution.approve_cli import EXIT_NO_TTY, approve, list_approvals
from perfgate.execution.audit import APPROVAL_TOOL
from perfgate.execution.gate import ApprovalGate
from perfgate.execution.policy import load_policy
from perfgate.execution.request import CommandRequest


def pending(workspace: Path, *argv: str) -> str:
    """Open a pending approval the way the server does for a client without elicitation."""
    ledger = Ledger(workspace)
    store = ApprovalStore.open(workspace)
    gate = ApprovalGate(workspace, ledger, store, load_policy(workspace))
    request = CommandRequest(
        argv=argv or ("python", "train.py"), cwd=workspace, timeout_s=60, reason="baseline"
    )
    with pytest.raises(ToolError):
        gate.require_human(request, "run_benchmark_window")
    return store.list((ApprovalStatus.PENDING,))[-1].id


def status(workspace: Path, approval_id: str) -> ApprovalStatus:
    approval = ApprovalStore.open(workspace).get(approval_id)
    assert approval is not None
    return approval.status


class FakeTerminalStdin(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_yes_at_the_terminal_grants_and_records_who(workspace: Path) -> None:
    approval_id = pending(workspace)
    code, shown = run_in_pty(["approve", approval_id, "--workspace", str(workspace)], "yes")
    assert code == 0, shown
    assert '["python", "train.py"]' in shown and "baseline" in shown and "run_benchmark_window" in shown
    assert status(workspace, approval_id) is ApprovalStatus.GRANTED
    record = Ledger(workspace).records(tool=APPROVAL_TOOL)[-1]
    assert record.result["decision"] == "approved" and record.result["event"] == "granted"
    assert " on /dev/" in record.result["who"]


def test_no_at_the_terminal_denies_and_anything_else_leaves_it_pending(workspace: Path) -> None:
    kept = pending(workspace, "python", "a.py")
    code, shown = run_in_pty(["approve", kept, "--workspace", str(workspace)], "maybe")
    assert code == 1 and "left pending" in shown
    assert status(workspace, kept) is ApprovalStatus.PENDING
    code, shown = run_in_pty(["approve", kept, "--workspace", str(workspace)], "no")
    assert code == 0 and f"denied {kept}" in shown
    assert status(workspace, kept) is ApprovalStatus.DENIED


def test_approve_refuses_without_a_terminal_and_changes_nothing(workspace: Path) -> None:
    approval_id = pending(workspace)
    piped = subprocess.run(
        [sys.executable, "-m", "perfgate", "approve", approval_id, "--workspace", str(workspace)],
        input="yes\n",
        capture_output=True,
        text=True,
        timeout=60,
        start_new_session=True,
    )
    assert piped.returncode == EXIT_NO_TTY and "not a TTY" in piped.stderr
    # stdin claims to be a terminal, but there is no terminal to read the answer from.
    no_tty = approve(
        workspace, approval_id, stdin=FakeTerminalStdin("yes\n"), tty_path=str(workspace / "no-tty")
    )
    assert no_tty == EXIT_NO_TTY
    assert status(workspace, approval_id) is ApprovalStatus.PENDING
    assert [r.result["decision"] for r in Ledger(workspace).records(tool=APPROVAL_TOOL)] == ["pending"]


def test_deny_needs_no_terminal(workspace: Path, capsys: pytest.CaptureFixture[str]) -> None:
    approval_id = pending(workspace)
    assert approve(workspace, approval_id, deny=True, stdin=io.StringIO()) == 0
    assert status(workspace, approval_id) is ApprovalStatus.DENIED
    assert approve(workspace, approval_id, stdin=FakeTerminalStdin()) == 2
    assert "is denied, not pending" in capsys.readouterr().err


def test_unknown_ids_and_missing_state_are_reported(
    workspace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert approve(workspace, "ap-00000000", stdin=FakeTerminalStdin()) == 2
    assert "no perfgate state" in capsys.readouterr().err
    pending(workspace)
    assert approve(workspace, "ap-00000000", stdin=FakeTerminalStdin()) == 2
    assert "no approval 'ap-00000000'" in capsys.readouterr().err


def test_approvals_lists_pending_and_granted_and_all_on_request(workspace: Path) -> None:
    out = io.StringIO()
    assert list_approvals(workspace, out=out) == 0 and "no approvals" in out.getvalue()
    waiting = pending(workspace, "python", "a.py")
    denied = pending(workspace, "python", "b.py")
    approve(workspace, denied, deny=True, stdin=io.StringIO())
    out = io.StringIO()
    list_approvals(workspace, out=out)
    listed = out.getvalue()
    assert waiting in listed and denied not in listed
    assert f"perfgate approve {waiting} --workspace {workspace}" in listed
    out = io.StringIO()
    list_approvals(workspace, include_closed=True, as_json=True, out=out)
    rows = json.loads(out.getvalue())
    assert {(r["id"], r["status"]) for r in rows} == {(waiting, "pending"), (denied, "denied")}
    assert rows[0]["request"]["argv"] == ["python", "a.py"]
