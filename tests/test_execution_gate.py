"""The approval gate through the MCP protocol, on both protocol generations.

A test-only tool (`_gated_tool.SPEC`) is added to the registry, so it goes through the same registration
path as the real command tools. Each command creates a marker file: its absence proves it did not run.
"""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client
from mcp.types import ElicitRequestParams, ElicitResult

import perfgate.tools
from _approval_pty import run_in_pty
from _gated_tool import SPEC, marker_argv
from _trust import any_code_rules, operator_policy
from perfgate.evidence import Ledger
from perfgate.execution.approve_cli import approve
from perfgate.execution.audit import APPROVAL_TOOL
from perfgate.server import build_server
from perfgate.serving.runtime import ServerConfig

pytestmark = pytest.mark.anyio

PY = sys.executable
TOOL = SPEC.name


@pytest.fixture(autouse=True)
def registry_with_test_tool(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(perfgate.tools, "REGISTRY", (*perfgate.tools.REGISTRY, SPEC))


def allowlist(workspace: Path, *prefixes: list[str], extra: str = "") -> None:
    operator_policy(f"[execution]\n{extra}\n{any_code_rules(*prefixes)}")


def server_for(workspace: Path, read_only: bool = False) -> Any:
    return build_server(ServerConfig.create(workspace, read_only=read_only))


class Human:
    """An elicitation callback answering with a fixed action, keeping what it was shown."""

    def __init__(self, action: str, note: str = "") -> None:
        self.action = action
        self.note = note
        self.asked: list[str] = []

    async def __call__(self, context: Any, params: ElicitRequestParams) -> ElicitResult:
        self.asked.append(params.message)
        content = {"note": self.note} if self.action == "accept" else None
        return ElicitResult(action=self.action, content=content)  # type: ignore[arg-type]


def text(result: Any) -> str:
    return result.content[0].text


def approval_records(workspace: Path) -> list[dict[str, Any]]:
    return [r.result for r in Ledger(workspace).records(tool=APPROVAL_TOOL)]


async def test_read_only_servers_do_not_register_command_tools(workspace: Path, mode: str) -> None:
    async with Client(server_for(workspace, read_only=True), mode=mode) as client:
        names = [t.name for t in (await client.list_tools()).tools]
    assert TOOL not in names
    async with Client(server_for(workspace), mode=mode) as client:
        tools = {t.name: t for t in (await client.list_tools()).tools}
    schema = tools[TOOL].input_schema
    assert set(schema["properties"]) == {"argv", "cwd", "env", "timeout_s", "reason"}
    assert not any("perfgate_" in name for name in schema["properties"])


async def test_an_allowlisted_command_runs_without_asking(workspace: Path, mode: str) -> None:
    allowlist(workspace, [PY, "-c"])
    human = Human("decline")
    marker = workspace / "marker"
    async with Client(server_for(workspace), mode=mode, elicitation_callback=human) as client:
        result = await client.call_tool(TOOL, {"argv": marker_argv(PY, marker)})
    assert not result.is_error, text(result)
    out = result.structured_content
    assert out is not None and out["approved_how"] == "allowlist" and out["state"] == "executed"
    assert marker.read_text() == "ran" and human.asked == []
    (decision,) = approval_records(workspace)
    assert decision["how"] == "allowlist" and decision["decision"] == "approved"
    assert decision["evidence_id"] == out["approval_evidence_id"]
    assert decision["who"].startswith("operator policy") and "policy.toml" in decision["who"]
    record = Ledger(workspace).get(out["evidence_id"])
    assert record is not None and record.exit_code == 0 and record.command == marker_argv(PY, marker)
    assert {a.name for a in record.artifacts} == {"stdout.log", "stderr.log"}
    assert Ledger(workspace).verify().ok


async def test_elicitation_accept_shows_the_request_and_runs_it(workspace: Path, mode: str) -> None:
    human = Human("accept", note="fine by me")
    marker = workspace / "marker"
    args = {
        "argv": marker_argv(PY, marker),
        "env": {"PG_X": "1"},
        "timeout_s": 30,
        "reason": "baseline window",
    }
    async with Client(server_for(workspace), mode=mode, elicitation_callback=human) as client:
        result = await client.call_tool(TOOL, args)
    assert not result.is_error, text(result)
    assert marker.read_text() == "ran"
    (message,) = human.asked
    assert json.dumps(marker_argv(PY, marker)) in message
    assert f"cwd:      {workspace}" in message and 'PG_X="1"' in message
    assert "30 s" in message and "baseline window" in message
    (decision,) = approval_records(workspace)
    assert (decision["decision"], decision["how"], decision["note"]) == (
        "approved",
        "elicitation",
        "fine by me",
    )
    assert "MCP client" in decision["who"]
    assert (
        result.structured_content is not None and result.structured_content["approved_how"] == "elicitation"
    )


@pytest.mark.parametrize(("action", "decision"), [("decline", "declined"), ("cancel", "cancelled")])
async def test_elicitation_decline_or_cancel_does_not_run(
    workspace: Path, mode: str, action: str, decision: str
) -> None:
    human = Human(action)
    marker = workspace / "marker"
    async with Client(server_for(workspace), mode=mode, elicitation_callback=human) as client:
        result = await client.call_tool(TOOL, {"argv": marker_argv(PY, marker)})
    assert result.is_error and ("did not run" in text(result) or "declined" in text(result))
    assert not marker.exists() and len(human.asked) == 1
    assert [(d["decision"], d["how"]) for d in approval_records(workspace)] == [(decision, "elicitation")]
    assert [r.tool for r in Ledger(workspace).records()] == [APPROVAL_TOOL]


def pending_id(message: str) -> str:
    found = re.search(r"perfgate approve (ap-[0-9a-f]{8}) --workspace (\S+)", message)
    assert found is not None, message
    return found.group(1)


async def test_without_elicitation_a_terminal_approval_lets_the_same_call_run(
    workspace: Path, mode: str
) -> None:
    marker = workspace / "marker"
    args = {"argv": marker_argv(PY, marker)}
    async with Client(server_for(workspace), mode=mode) as client:
        first = await client.call_tool(TOOL, args)
        assert first.is_error and not marker.exists()
        approval_id = pending_id(text(first))
        assert f"--workspace {workspace}" in text(first)
        # Asking again before the human answered keeps the same id.
        again = await client.call_tool(TOOL, args)
        assert pending_id(text(again)) == approval_id and not marker.exists()

        code, shown = await anyio.to_thread.run_sync(
            run_in_pty, ["approve", approval_id, "--workspace", str(workspace)], "yes"
        )
        assert code == 0, shown
        assert json.dumps(marker_argv(PY, marker)) in shown and f"approved {approval_id}" in shown

        retried = await client.call_tool(TOOL, args)
        assert not retried.is_error, text(retried)
        assert marker.read_text() == "ran"
        assert (
            retried.structured_content is not None
            and retried.structured_content["approved_how"] == "cli_grant"
        )

        # A changed command is not covered by that approval: it gets its own pending id and does not run.
        other = workspace / "other"
        changed = await client.call_tool(TOOL, {"argv": marker_argv(PY, other)})
        assert changed.is_error and pending_id(text(changed)) != approval_id and not other.exists()
        timeout_changed = await client.call_tool(TOOL, {**args, "timeout_s": 61})
        assert timeout_changed.is_error and "perfgate approve" in text(timeout_changed)

    steps = [(d["decision"], d["how"], d.get("event")) for d in approval_records(workspace)]
    assert steps == [
        ("pending", "cli_pending", None),
        ("approved", "cli_grant", "granted"),
        ("approved", "cli_grant", "used"),
        ("pending", "cli_pending", None),
        ("pending", "cli_pending", None),
    ]
    assert Ledger(workspace).verify().ok


async def test_an_approved_script_edited_afterwards_needs_a_new_approval(workspace: Path) -> None:
    """The approval binds the code: the issue's 'edit the approved script after approval' bypass."""
    script = workspace / "train.py"
    marker = workspace / "marker"
    script.write_text(f"open({str(marker)!r}, 'a').write('honest ')\n")
    args = {"argv": [PY, "train.py"]}
    async with Client(server_for(workspace)) as client:
        approval_id = pending_id(text(await client.call_tool(TOOL, args)))
        code, shown = await anyio.to_thread.run_sync(
            run_in_pty, ["approve", approval_id, "--workspace", str(workspace)], "yes"
        )
        assert code == 0 and "train.py sha256" in shown, shown
        assert not (await client.call_tool(TOOL, args)).is_error
        script.write_text(f"open({str(marker)!r}, 'a').write('evil ')\n")  # edited after approval
        edited = await client.call_tool(TOOL, args)
        assert edited.is_error and pending_id(text(edited)) != approval_id, text(edited)
        (workspace / "helper.py").write_text("X = 1\n")  # new code anywhere in the workspace counts too
        script.write_text(f"open({str(marker)!r}, 'a').write('honest ')\n")
        assert (await client.call_tool(TOOL, args)).is_error
    assert marker.read_text() == "honest "


async def test_approve_without_a_terminal_refuses(workspace: Path, mode: str) -> None:
    marker = workspace / "marker"
    async with Client(server_for(workspace), mode=mode) as client:
        first = await client.call_tool(TOOL, {"argv": marker_argv(PY, marker)})
        approval_id = pending_id(text(first))
        # What an agent's shell tool does: no terminal, the answer piped in.
        refused = subprocess.run(
            [PY, "-m", "perfgate", "approve", approval_id, "--workspace", str(workspace)],
            input="yes\n",
            capture_output=True,
            text=True,
            timeout=60,
            start_new_session=True,
        )
        assert refused.returncode == 3 and "refusing to approve" in refused.stderr
        retried = await client.call_tool(TOOL, {"argv": marker_argv(PY, marker)})
    assert retried.is_error and pending_id(text(retried)) == approval_id
    assert not marker.exists()


async def test_a_failing_command_is_recorded_as_failed_evidence(workspace: Path, mode: str) -> None:
    allowlist(workspace, [PY, "-c"])
    async with Client(server_for(workspace), mode=mode) as client:
        result = await client.call_tool(TOOL, {"argv": [PY, "-c", "print('boom'); raise SystemExit(7)"]})
    out = result.structured_content
    assert not result.is_error and out is not None
    assert (out["state"], out["exit_code"], out["stdout_tail"]) == ("failed", 7, "boom\n")
    record = Ledger(workspace).get(out["evidence_id"])
    assert record is not None and record.state.value == "failed" and record.exit_code == 7


async def test_a_cwd_outside_the_workspace_is_refused_before_asking(workspace: Path, mode: str) -> None:
    allowlist(workspace, [PY, "-c"])
    human = Human("accept")
    marker = workspace / "marker"
    async with Client(server_for(workspace), mode=mode, elicitation_callback=human) as client:
        result = await client.call_tool(TOOL, {"argv": marker_argv(PY, marker), "cwd": ".."})
    assert result.is_error and "outside the allowed roots" in text(result)
    assert not marker.exists() and human.asked == [] and approval_records(workspace) == []


async def test_progress_is_reported_while_the_command_runs(workspace: Path, mode: str) -> None:
    allowlist(workspace, [PY, "-c"])
    seen: list[tuple[float, float | None, str | None]] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        seen.append((progress, total, message))

    async with Client(server_for(workspace), mode=mode) as client:
        result = await client.call_tool(
            TOOL, {"argv": [PY, "-c", "print('step 1')"], "timeout_s": 20}, progress_callback=on_progress
        )
    assert not result.is_error
    assert seen and all(total == 20 for _, total, _ in seen)
    assert "1 stdout" in (seen[-1][2] or "") and "step 1" in (seen[-1][2] or "")


async def test_the_policy_is_read_at_start_so_a_run_cannot_widen_its_own_allowlist(
    workspace: Path, mode: str
) -> None:
    marker = workspace / "marker"
    async with Client(server_for(workspace), mode=mode) as client:
        allowlist(workspace, [PY, "-c"])
        result = await client.call_tool(TOOL, {"argv": marker_argv(PY, marker)})
    assert result.is_error and "perfgate approve" in text(result) and not marker.exists()


async def test_an_invalid_policy_disables_commands_with_the_reason(workspace: Path, mode: str) -> None:
    operator_policy("[execution]\nmax_timeout = 5\n")
    marker = workspace / "marker"
    async with Client(server_for(workspace), mode=mode, elicitation_callback=Human("accept")) as client:
        result = await client.call_tool(TOOL, {"argv": marker_argv(PY, marker)})
    assert result.is_error and "commands are disabled" in text(result) and "max_timeout" in text(result)
    assert not marker.exists()


async def test_a_pending_approval_leads_with_what_is_wrong_and_the_next_call(
    workspace: Path, mode: str
) -> None:
    marker = workspace / "marker"
    async with Client(server_for(workspace), mode=mode) as client:
        result = await client.call_tool(TOOL, {"argv": marker_argv(PY, marker)})
    assert result.is_error and not marker.exists()
    message = text(result)
    lines = message[message.index("approval needed") :].splitlines()
    approval_id = pending_id(message)
    assert lines[0].startswith(f"approval needed: pending approval {approval_id} (expires ")
    assert lines[0].endswith("this MCP client cannot ask the user, so the command did not run")
    assert lines[1].startswith(f"next: ask the user to run `perfgate approve {approval_id} --workspace ")
    assert "then repeat this exact call" in lines[1]


def _refusal_lines(result: Any) -> list[str]:
    """The refusal's own lines, after the SDK's "Error executing tool ...: " prefix where there is one."""
    message = text(result)
    prefix = f"Error executing tool {TOOL}: "
    return (message[len(prefix) :] if message.startswith(prefix) else message).splitlines()


@pytest.mark.parametrize(
    ("case", "first", "next_line"),
    [
        ("cwd", "this command cannot run here: working directory ", "next: change the request to fit"),
        (
            "timeout",
            "this command cannot run here: timeout 100000 s exceeds",
            "next: change the request to fit",
        ),
        (
            "bad_policy",
            "commands are disabled: the operator's execution policy is invalid (",
            "next: ask the user to fix",
        ),
        (
            "unpinned_rule",
            "commands are disabled: the operator's execution policy is invalid (",
            "next: ask the user to fix",
        ),
        ("denied", "a human denied this exact command (approval ap-", "next: ask the user what to change"),
        (
            "decline",
            "the user declined to run this command (recorded as ev-",
            "next: ask the user what they would",
        ),
        ("cancel", "the user dismissed the approval question without deciding", "next: ask the user before"),
    ],
)
async def test_every_refusal_is_two_lines_what_is_wrong_then_the_next_call(
    workspace: Path, case: str, first: str, next_line: str
) -> None:
    marker = workspace / "marker"
    args: dict[str, Any] = {"argv": marker_argv(PY, marker)}
    human: Human | None = None
    if case in ("cwd", "timeout"):
        allowlist(workspace, [PY, "-c"])
        args |= {"cwd": ".."} if case == "cwd" else {"timeout_s": 100000}
    elif case == "bad_policy":
        operator_policy("[execution]\nmax_timeout = 5\n")
    elif case == "unpinned_rule":  # the old README example: a harness-prefix rule that pins no code
        operator_policy(
            '[execution]\n[[execution.allow]]\nargv = ["python", "-m", "perfgate.harness", "*"]\n'
        )
    elif case == "denied":
        async with Client(server_for(workspace)) as client:
            approval_id = pending_id(text(await client.call_tool(TOOL, args)))
        assert approve(workspace, approval_id, deny=True, stdin=io.StringIO()) == 0
    else:
        human = Human(case)
    async with Client(server_for(workspace), elicitation_callback=human) as client:
        result = await client.call_tool(TOOL, args)
    assert result.is_error and not marker.exists()
    lines = _refusal_lines(result)
    assert lines[0].startswith(first), lines
    assert len(lines) == 2 and lines[1].startswith(next_line), lines
    if case == "unpinned_rule":
        assert "pins no code" in lines[0]
    assert "Traceback" not in text(result) and "pydantic" not in text(result)
