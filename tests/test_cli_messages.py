"""The CLI never ends in a traceback: every error is one line saying what is wrong, one saying what to do."""

from __future__ import annotations

import builtins
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import perfgate.demo
from perfgate.cli import main as cli_main
from perfgate.demo import DemoError, DemoResult


def _two_lines(err: str) -> tuple[str, str]:
    lines = err.strip().splitlines()
    assert len(lines) == 2, err
    assert "Traceback" not in err
    assert lines[1].startswith("next: "), err
    return lines[0], lines[1]


def test_an_exception_group_from_a_command_is_two_lines_naming_the_inner_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    def explode(workspace: Path | None = None, say: Any = print) -> DemoResult:
        try:
            raise ValueError("the thing inside broke\nsecond line of internals")
        except ValueError as inner:
            raise RuntimeError("task group") from inner

    def grouped(workspace: Path | None = None, say: Any = print) -> DemoResult:
        try:
            explode()
        except RuntimeError as exc:
            group_type: Any = (
                getattr(builtins, "ExceptionGroup", None)
                or pytest.importorskip("exceptiongroup").ExceptionGroup
            )
            raise group_type("unhandled errors in a TaskGroup", [exc]) from None
        raise AssertionError("unreachable")

    monkeypatch.setattr(perfgate.demo, "run_demo", grouped)
    monkeypatch.delenv("PERFGATE_DEBUG", raising=False)
    assert cli_main(["demo", "--workspace", str(tmp_path)]) == 1
    first, second = _two_lines(capsys.readouterr().err)
    assert first == "perfgate demo: failed: RuntimeError: task group"
    assert "PERFGATE_DEBUG=1" in second


def test_perfgate_debug_adds_the_traceback(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    def broken(workspace: Path | None = None, say: Any = print) -> DemoResult:
        raise KeyError("x")

    monkeypatch.setattr(perfgate.demo, "run_demo", broken)
    monkeypatch.setenv("PERFGATE_DEBUG", "1")
    assert cli_main(["demo", "--workspace", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("perfgate demo: failed: KeyError: 'x'") and "Traceback" in err


def test_a_failed_demo_step_names_the_step_and_where_to_look(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    def refused(workspace: Path | None = None, say: Any = print) -> DemoResult:
        error = DemoError("9. Decide: record_decision failed: keep refused for exp-1\n- comparison: ...")
        error.workspace = tmp_path
        raise error

    monkeypatch.setattr(perfgate.demo, "run_demo", refused)
    assert cli_main(["demo"]) == 1
    first, second = _two_lines(capsys.readouterr().err)
    assert first == "perfgate demo: 9. Decide: record_decision failed: keep refused for exp-1"
    assert (
        second
        == f"next: read the full answer and the evidence with `perfgate ledger show --workspace {tmp_path}`"
    )


def test_an_inconclusive_demo_succeeds_and_says_so(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    def inconclusive(workspace: Path | None = None, say: Any = print) -> DemoResult:
        return DemoResult(tmp_path, "exp-1", "inconclusive", False, 1.1, "within_noise", "", {})

    monkeypatch.setattr(perfgate.demo, "run_demo", inconclusive)
    assert cli_main(["demo"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("demo: inconclusive (speedup 1.10x, verdict within_noise)")
    assert "recorded as inconclusive" in out[1]


def test_ctrl_c_is_one_line_and_status_130(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def interrupted(workspace: Path | None = None, say: Any = print) -> DemoResult:
        raise KeyboardInterrupt

    monkeypatch.setattr(perfgate.demo, "run_demo", interrupted)
    assert cli_main(["demo"]) == 130
    assert capsys.readouterr().err == "perfgate demo: interrupted\n"


@pytest.mark.parametrize(
    ("argv", "first"),
    [
        (["ledger", "show"], "perfgate: no ledger in "),
        (["ledger", "verify"], "perfgate: no ledger in "),
        (["export", "exp-1", "out"], "perfgate: no ledger in "),
        (["report"], "perfgate: no ledger in "),
    ],
)
def test_commands_on_a_workspace_without_a_ledger(
    argv: list[str], first: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli_main([*argv, "--workspace", str(tmp_path)]) == 2
    line, _ = _two_lines(capsys.readouterr().err)
    assert line.startswith(first)
    assert not (tmp_path / ".perfgate").exists()  # reading never creates a ledger


def test_serve_on_a_missing_workspace(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["serve", "--workspace", str(tmp_path / "nope")]) == 2
    line, _ = _two_lines(capsys.readouterr().err)
    assert line == f"perfgate: workspace {tmp_path / 'nope'} is not a directory"


def test_serve_refuses_a_token_file_others_can_read(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("PERFGATE_TOKEN", raising=False)
    token = tmp_path / "token"
    token.write_text("abc")
    token.chmod(0o644)
    argv = ["serve", "--workspace", str(tmp_path), "--transport", "http", "--token-file", str(token)]
    assert cli_main(argv) == 2
    line, _ = _two_lines(capsys.readouterr().err)
    assert line == f"perfgate: the token file {token} is readable by other users: chmod 600 it"


def test_skill_install_over_another_skill(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "SKILL.md").write_text("---\nname: other\n---\nsomething else\n")
    assert cli_main(["skill", "install", str(tmp_path)]) == 1
    line, nxt = _two_lines(capsys.readouterr().err)
    assert line.startswith(f"perfgate: {tmp_path} already holds") and "--force" in nxt


def test_a_usage_error_is_two_lines() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "perfgate", "ledger", "show", "--limit", "many"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2
    line, nxt = _two_lines(out.stderr)
    assert "--limit: invalid int value: 'many'" in line
    assert nxt == "next: perfgate ledger show --help"
