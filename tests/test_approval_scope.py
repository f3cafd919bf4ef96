"""Approvals a human can read and live with (issue 43 item 3, issue 47 item 4), through the real gate path.

The approval shows what changed since the last approved run (a monkeypatch committed in an imported
helper included), the programs the argv resolves to (a workspace ``bin/python`` on PATH highlighted and
bound), code reaching into perfgate's internals; one approval covers a scope (this command, this code,
N calls, a time limit), so identical re-runs do not ask, and anything outside the scope does.
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
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
from _gated_tool import SPEC
from _trust import operator_policy
from perfgate.evidence import Ledger
from perfgate.execution.approvals import ApprovalStatus, ApprovalStore
from perfgate.execution.audit import APPROVAL_TOOL
from perfgate.execution.changes import MAX_DIFF_FILES, MAX_DIFF_LINES, internal_references
from perfgate.server import build_server
from perfgate.serving.runtime import ServerConfig

pytestmark = pytest.mark.anyio

PY = sys.executable
TOOL = SPEC.name
MONKEYPATCH = "import perfgate.harness.window as _w; _w._now = lambda: _w.time.perf_counter() / 3"


@pytest.fixture(autouse=True)
def registry_with_test_tool(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(perfgate.tools, "REGISTRY", (*perfgate.tools.REGISTRY, SPEC))


class Human:
    """Answers every question with ``action``, keeping what it was shown; ``during`` runs while asked."""

    def __init__(self, action: str = "accept", during: Any = None) -> None:
        self.action = action
        self.during = during
        self.asked: list[str] = []

    async def __call__(self, context: Any, params: ElicitRequestParams) -> ElicitResult:
        self.asked.append(params.message)
        if self.during is not None:
            self.during()
        content = {"note": ""} if self.action == "accept" else None
        return ElicitResult(action=self.action, content=content)  # type: ignore[arg-type]


def server(workspace: Path) -> Any:
    return build_server(ServerConfig.create(workspace))


def text(result: Any) -> str:
    return result.content[0].text


def git(workspace: Path, *args: str) -> None:
    subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@t", *args],
        cwd=workspace,
        check=True,
        capture_output=True,
        timeout=60,
    )


def repo(workspace: Path) -> Path:
    """A git workspace whose train.py imports helper.py and appends one line to ``runs.txt`` per run."""
    (workspace / "helper.py").write_text("def work():\n    return sum(range(1000))\n")
    (workspace / "train.py").write_text(
        "import helper\nhelper.work()\nopen('runs.txt', 'a').write('ran\\n')\n"
    )
    (workspace / ".gitignore").write_text("runs.txt\n.perfgate/\n")
    git(workspace, "init", "-q")
    git(workspace, "add", "-A")
    git(workspace, "commit", "-qm", "baseline")
    return workspace / "runs.txt"


def runs(marker: Path) -> int:
    return len(marker.read_text().splitlines()) if marker.exists() else 0


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


async def test_a_monkeypatch_committed_in_an_imported_helper_shows_as_its_diff_line(workspace: Path) -> None:
    marker = repo(workspace)
    human = Human()
    args = {"argv": [PY, "train.py"]}
    async with Client(server(workspace), elicitation_callback=human) as client:
        assert not (await client.call_tool(TOOL, args)).is_error
        # The candidate: one line in the imported helper, committed, so `git diff HEAD` is empty.
        helper = workspace / "helper.py"
        helper.write_text(helper.read_text() + MONKEYPATCH + "\n# \x1b[2K\x1b[1A hidden?\n")
        git(workspace, "commit", "-qam", "faster")
        assert not (await client.call_tool(TOOL, args)).is_error
    assert runs(marker) == 2
    first, second = human.asked
    assert first.splitlines()[1].startswith("code: no change since commit "), first
    lines = second.splitlines()
    argv_at = next(i for i, line in enumerate(lines) if line.startswith("argv:"))
    lead = lines[:argv_at]
    # The lines that decide come first: perfgate's internals, then what changed, then the scope.
    assert lead[1].startswith("! code reaches into perfgate's internals"), lead
    assert "helper.py:3 perfgate.harness.window" in lead[1]
    assert any(
        line.startswith("code: 1 file(s) changed since the last approved run (ap-")
        and "helper.py (+2 -0)" in line
        for line in lead
    ), lead
    assert any(
        line.startswith(
            "Accepting grants this command with this code (timed, profiled or captured by perfgate), up to 8"
        )
        for line in lead
    )
    diff = lines[lines.index("the change (unified diff, at most the first lines):") + 1 :]
    assert diff[:2] == ["--- a/helper.py", "+++ b/helper.py"]
    assert f"+{MONKEYPATCH}" in diff
    # A file cannot redraw the human's terminal: its control characters are shown escaped.
    assert "\x1b" not in second and "+# \\x1b[2K\\x1b[1A hidden?" in diff


async def test_a_workspace_python_on_path_is_highlighted_bound_and_a_swap_is_refused(workspace: Path) -> None:
    bin_dir = workspace / "bin"
    bin_dir.mkdir()
    python = bin_dir / "python"
    python.write_text(f'#!/bin/sh\nexec {PY} "$@"\n')
    python.chmod(0o755)
    good, evil = workspace / "good", workspace / "evil"
    args = {
        "argv": ["python", "-c", f"open({str(good)!r}, 'a').write('x')"],
        "env": {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"},
    }

    def swap() -> None:
        python.write_text(f'#!/bin/sh\ntouch {evil}\nexec {PY} "$@"\n')

    human = Human()
    async with Client(server(workspace), elicitation_callback=human) as client:
        assert not (await client.call_tool(TOOL, args)).is_error
        (message,) = human.asked
        assert message.splitlines()[1] == (
            f"! program {python} (sha256 {sha(python)[:16]}): a file in the workspace, which the agent can write"
        )
        assert good.read_text() == "x"
        swap()  # after the approval: the same call is no longer covered, the human is asked again
        human.action = "decline"
        refused = await client.call_tool(TOOL, args)
        assert refused.is_error and "declined" in text(refused)
        assert len(human.asked) == 2 and f"(sha256 {sha(python)[:16]})" in human.asked[1]
    assert not evil.exists() and good.read_text() == "x"


async def test_a_program_swapped_while_the_human_reads_the_question_does_not_run_unseen(
    workspace: Path, mode: str
) -> None:
    bin_dir = workspace / "bin"
    bin_dir.mkdir()
    python = bin_dir / "python"
    python.write_text(f'#!/bin/sh\nexec {PY} "$@"\n')
    python.chmod(0o755)
    evil = workspace / "evil"
    human = Human(during=lambda: python.write_text(f'#!/bin/sh\ntouch {evil}\nexec {PY} "$@"\n'))
    async with Client(server(workspace), mode=mode, elicitation_callback=human) as client:
        result = await client.call_tool(
            TOOL,
            {"argv": ["python", "-c", "pass"], "env": {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}},
        )
    if mode == "legacy":  # asked mid-call: the runner binds again before the start and refuses
        assert result.is_error and "the code changed after this command was approved" in text(result)
        assert not evil.exists() and len(human.asked) == 1
    else:  # the answer rides the next round, which binds again: a changed question is asked again
        assert len(human.asked) == 2 and f"(sha256 {sha(python)[:16]})" in human.asked[1]
        assert f"(sha256 {sha(python)[:16]})" not in human.asked[0]


async def test_one_approval_covers_identical_reruns_and_nothing_outside_its_scope(workspace: Path) -> None:
    operator_policy("[execution]\ngrant_runs = 3\n")
    marker = repo(workspace)
    human = Human()
    args = {"argv": [PY, "train.py"]}
    async with Client(server(workspace), elicitation_callback=human) as client:
        for _ in range(3):
            assert not (await client.call_tool(TOOL, args)).is_error
        assert len(human.asked) == 1 and runs(marker) == 3
        assert "up to 3 call(s) within 2 h" in human.asked[0]
        # A fourth call is more than was granted.
        human.action = "decline"
        assert (await client.call_tool(TOOL, args)).is_error
        assert len(human.asked) == 2 and "(asking again: approval ap-" in human.asked[1].splitlines()[0]
        assert "allowed 3 call(s), all used" in human.asked[1].splitlines()[0]
        # A new grant; then another argv, and other code, each ask again.
        human.action = "accept"
        assert not (await client.call_tool(TOOL, args)).is_error
        assert not (await client.call_tool(TOOL, args)).is_error
        assert len(human.asked) == 3
        human.action = "decline"
        assert (await client.call_tool(TOOL, {"argv": [PY, "train.py", "--steps", "2"]})).is_error
        assert len(human.asked) == 4
        (workspace / "helper.py").write_text("def work():\n    return 0\n")
        assert (await client.call_tool(TOOL, args)).is_error
        assert len(human.asked) == 5 and "covered other code" in human.asked[4].splitlines()[0]
        assert "-    return sum(range(1000))" in human.asked[4] and "+    return 0" in human.asked[4]
    assert runs(marker) == 5
    uses = [
        (r.result.get("event"), r.result.get("use"), r.result.get("of"))
        for r in Ledger(workspace).records(tool=APPROVAL_TOOL)
        if r.result.get("event") == "used"
    ]
    assert uses == [("used", 2, 3), ("used", 3, 3), ("used", 2, 3)]


async def test_an_expired_grant_asks_again(workspace: Path) -> None:
    operator_policy("[execution]\ngrant_ttl_s = 0.5\n")
    marker = repo(workspace)
    human = Human()
    async with Client(server(workspace), elicitation_callback=human) as client:
        assert not (await client.call_tool(TOOL, {"argv": [PY, "train.py"]})).is_error
        await anyio.sleep(1.0)  # past the grant's validity, whatever the machine's load
        assert not (await client.call_tool(TOOL, {"argv": [PY, "train.py"]})).is_error
    assert len(human.asked) == 2 and runs(marker) == 2
    assert "expired" in human.asked[1].splitlines()[0]


def pending_id(message: str) -> str:
    import re

    found = re.search(r"perfgate approve (ap-[0-9a-f]{8})", message)
    assert found is not None, message
    return found.group(1)


async def test_a_terminal_grant_with_vary_covers_that_flag_and_counts_uses(workspace: Path) -> None:
    marker = repo(workspace)
    args = {"argv": [PY, "train.py", "--lr", "0.1", "--steps=5"]}
    async with Client(server(workspace)) as client:
        approval_id = pending_id(text(await client.call_tool(TOOL, args)))
        code, shown = await anyio.to_thread.run_sync(
            run_in_pty,
            ["approve", approval_id, "--workspace", str(workspace), "--runs", "3", "--vary=--lr"],
            "yes",
        )
        assert code == 0, shown
        assert '"yes" grants this command, any value of --lr with this code, up to 3 call(s)' in shown
        assert "up to 3 call(s)" in shown.splitlines()[-1]
        for lr in ("0.1", "0.2"):
            ok = await client.call_tool(TOOL, {"argv": [PY, "train.py", "--lr", lr, "--steps=5"]})
            assert not ok.is_error, text(ok)
        other = await client.call_tool(TOOL, {"argv": [PY, "train.py", "--lr", "0.3", "--steps=6"]})
        assert other.is_error and pending_id(text(other)) != approval_id
        assert not (
            await client.call_tool(TOOL, {"argv": [PY, "train.py", "--lr", "0.4", "--steps=5"]})
        ).is_error
        over = await client.call_tool(TOOL, args)
        assert over.is_error and "allowed 3 call(s), all used" in text(over)
    assert runs(marker) == 3
    (grant,) = [a for a in ApprovalStore.open(workspace).list() if a.id == approval_id]
    assert grant.uses == 3 and grant.scope is not None and grant.scope.vary == ("--lr",)


async def test_a_scope_edited_in_the_store_is_not_honoured(workspace: Path) -> None:
    marker = repo(workspace)
    operator_policy("[execution]\ngrant_runs = 1\n")
    human = Human()
    async with Client(server(workspace), elicitation_callback=human) as client:
        assert not (await client.call_tool(TOOL, {"argv": [PY, "train.py"]})).is_error
        store = ApprovalStore.open(workspace)
        with sqlite3.connect(store.db_path) as conn:
            conn.execute("UPDATE approvals SET scope = replace(scope, '\"runs\":1', '\"runs\":99')")
        human.action = "decline"
        assert (await client.call_tool(TOOL, {"argv": [PY, "train.py"]})).is_error
    assert len(human.asked) == 2 and runs(marker) == 1
    assert store.list((ApprovalStatus.GRANTED,)) == [] and store.rejected


def test_internal_references_name_what_reaches_past_the_public_harness_api() -> None:
    source = (
        "import perfgate.harness\n"
        "from perfgate.harness import dump_tensors, report_metric, Window\n"
        "from perfgate.harness import (dump_tensors,\n    hooks)\n"
        "from perfgate import harness\n"
        "import importlib; importlib.import_module('perfgate.harness._state')\n"
        "perfgate.harness.dump_tensors('x', {})\n"
        "from perfgate.tools import run_benchmark_window\n"
    )
    assert internal_references(source) == [
        (3, "perfgate.harness.hooks"),
        (6, "perfgate.harness._state"),
        (8, "perfgate.tools"),
    ]


async def test_a_long_change_is_cut_at_the_named_limit_with_what_was_left_out(workspace: Path) -> None:
    repo(workspace)
    human = Human()
    async with Client(server(workspace), elicitation_callback=human) as client:
        assert not (await client.call_tool(TOOL, {"argv": [PY, "train.py"]})).is_error
        (workspace / "big.py").write_text("".join(f"x{i} = {i}\n" for i in range(400)))
        assert not (await client.call_tool(TOOL, {"argv": [PY, "train.py"]})).is_error
    message = human.asked[1]
    assert "! importable files git does not track (they run too): big.py" in message
    diff = message[message.index("the change (unified diff") :].split("\n\n")[0].splitlines()[1:]
    assert len(diff) == MAX_DIFF_LINES + 1
    left = 400 + 3 - MAX_DIFF_LINES  # the file's lines plus its three header lines
    assert diff[-1] == f"... {left} more diff lines and 0 more files not shown"
    assert json.dumps([PY, "train.py"]) in message


TRAIN = """\
import torch

model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for _ in range(40):
    opt.zero_grad()
    model(torch.randn(8, 4)).sum().backward()
    opt.step()
"""


async def test_an_identical_training_window_rerun_is_not_asked_again(workspace: Path) -> None:
    """Issue 47's user answered a prompt for every run, identical re-runs included: through
    run_benchmark_window (harness wrapper, record folder, bytecode cache in the request), one answer."""
    (workspace / "train.py").write_text(TRAIN)
    human = Human()
    args = {
        "command": [PY, "train.py"],
        "warmup_steps": 3,
        "measure_steps": 5,
        "repeats": 1,
        "timeout_s": 300,
        "label": "baseline",
        "contract": {
            "invariants": {"model": "linear", "dataset": "random", "precision": "fp32", "global_batch": 8},
            "execution": {"microbatch": 8, "accumulation": 1, "data_parallel": 1},
        },
    }
    async with Client(server(workspace), elicitation_callback=human) as client:
        for _ in range(2):
            result = await client.call_tool("run_benchmark_window", args)
            assert not result.is_error, text(result)
    assert len(human.asked) == 1
    assert "train.py" in human.asked[0] and "up to 8 call(s) within 2 h" in human.asked[0]


def test_one_scope_covers_timing_profiling_and_capturing_the_same_command(tmp_path: Path) -> None:
    """perfgate's harness variables (windows, profile schedule, capture, output folders) say how it measures
    the approved command, not what runs: they leave the template. The agent cannot set them itself, and a
    variable of its own, or perfgate's log pattern, still changes the template."""
    from perfgate.benchmarking.windows.launch import BenchmarkError, launch_env
    from perfgate.execution.request import CommandRequest
    from perfgate.execution.scope import request_print, template_digest

    def template(env: dict[str, str]) -> str:
        request = CommandRequest(argv=(PY, "train.py"), cwd=tmp_path, env=env, timeout_s=600)
        return template_digest(request_print(request))

    user = {"OMP_NUM_THREADS": "1"}
    window = template(
        {**user, "PERFGATE_WARMUP_STEPS": "10", "PERFGATE_RECORD_DIR": "/a", "PERFGATE_CAPTURE_STEP": "1"}
    )
    profile = template({**user, "PERFGATE_PROFILE_DIR": "/b", "PERFGATE_PROFILE_ACTIVE": "3"})
    assert window == profile == template(user)
    assert template({"OMP_NUM_THREADS": "2"}) != window
    assert template({**user, "PERFGATE_LOG_PATTERN": "step (\\d+)"}) != window
    with pytest.raises(BenchmarkError, match="PERFGATE_STOP: perfgate sets its harness's variables itself"):
        launch_env({"PERFGATE_STOP": "0"}, tmp_path / "pycache", None)


async def test_a_file_past_the_screen_is_a_warning_naming_it_and_where_the_whole_diff_is(
    workspace: Path,
) -> None:
    """Twelve files of diff fill the screen; a one-line payload in a thirteenth is a `!` line with its count
    and the file that holds the whole diff. Invisible characters in a diff line are escaped."""
    repo(workspace)
    human = Human()
    async with Client(server(workspace), elicitation_callback=human) as client:
        assert not (await client.call_tool(TOOL, {"argv": [PY, "train.py"]})).is_error
        for i in range(MAX_DIFF_FILES):
            (workspace / f"mod{i:02d}.py").write_text("".join(f"v{j} = {j}\n" for j in range(20)))
        (workspace / "zz_helper.py").write_text("import os\nos.system('id')\u200b\n")
        assert not (await client.call_tool(TOOL, {"argv": [PY, "train.py"]})).is_error
    message = human.asked[1]
    warning = next(line for line in message.splitlines() if line.startswith("! zz_helper.py"))
    assert "2 added line(s) not shown here; the whole diff is in " in warning
    whole = Path(warning.rsplit(" ", 1)[1]).read_text()
    assert "+os.system('id')\\u200b" in whole and "\u200b" not in whole
    assert "\u200b" not in message


async def test_returning_to_an_approved_code_state_reuses_its_grant_and_nothing_unseen_does(
    workspace: Path,
) -> None:
    """Issue 59 item 7: interleaved A B B A calls switch the code with git stash between them. Each code
    state the human was shown is covered by its own grant, so going back to the baseline (or to the
    candidate again) asks nothing; a code state, argv or environment the human never saw still asks."""
    marker = repo(workspace)
    human = Human()
    args = {"argv": [PY, "train.py"]}
    helper = workspace / "helper.py"
    async with Client(server(workspace), elicitation_callback=human) as client:

        async def call(request: dict[str, Any] = args) -> None:
            result = await client.call_tool(TOOL, request)
            assert not result.is_error, text(result)

        await call()  # A: the baseline, asked
        helper.write_text("def work():\n    return sum(range(10))\n")
        await call()  # B: the candidate, asked
        assert len(human.asked) == 2
        git(workspace, "stash")
        await call()  # A again
        git(workspace, "stash", "pop")
        await call()  # B B
        await call()
        git(workspace, "stash")
        await call()  # A
        assert len(human.asked) == 2 and runs(marker) == 6
        # outside what was shown: a third code state, then the baseline's code with another argv or env
        git(workspace, "stash", "pop")
        helper.write_text("def work():\n    return 1\n")
        await call()
        assert len(human.asked) == 3 and "covered other code" in human.asked[2].splitlines()[0]
        git(workspace, "checkout", "helper.py")
        await call({"argv": [PY, "train.py", "--steps", "2"]})
        await call({**args, "env": {"OMP_NUM_THREADS": "2"}})
        assert len(human.asked) == 5
        argv_lead, env_lead = (message.split("\n\n")[0] for message in human.asked[3:])
        assert (
            "arguments: changed since the last approved run" in argv_lead and '+ "--steps" "2"' in argv_lead
        )
        assert 'environment: changed since then: + OMP_NUM_THREADS="2"' in env_lead, env_lead
    assert runs(marker) == 9
    uses = {a.id: a.uses for a in ApprovalStore.open(workspace).list((ApprovalStatus.GRANTED,))}
    assert sorted(uses.values()) == [1, 1, 1, 3, 3], uses
