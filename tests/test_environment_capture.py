"""An environment capture below the tool: the interpreter named, the probe run judged, the redacted record."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest

from perfgate.envprobe import SystemTool
from perfgate.envprobe import capture as capture_module
from perfgate.envprobe.capture import (
    HostFacts,
    capture,
    host_facts,
    host_facts_failed,
    probe_failure,
    rewrite_redacted,
)
from perfgate.envprobe.probe import InterpreterError, ProbeOutput, resolve_interpreter
from perfgate.envprobe.provenance import GitSnapshot
from perfgate.execution.executor import CommandResult, StreamCapture
from perfgate.security.envredactor import Redactor

SECRET = "hunter2-very-secret-token"


def _stream(tail: str = "") -> StreamCapture:
    return StreamCapture(
        path="/dev/null",
        bytes_total=len(tail),
        bytes_logged=len(tail),
        lines=0,
        tail=tail,
        tail_truncated=False,
    )


def _result(**changes: Any) -> CommandResult:
    fields: dict[str, Any] = {
        "argv": ["python", "probe.py"],
        "cwd": "/",
        "env": {},
        "digest": "d",
        "pid": 1,
        "exit_code": 0,
        "signal": None,
        "timed_out": False,
        "duration_s": 1.23456,
        "stragglers_killed": False,
        "stdout": _stream(),
        "stderr": _stream(),
    }
    fields.update(changes)
    return CommandResult(**fields)


def _probe(began: bool = True, complete: bool = True, stages: list[str] | None = None) -> ProbeOutput:
    return ProbeOutput(began=began, complete=complete, stages=stages or [])


def _redactor() -> Redactor:
    return Redactor({"API_TOKEN": SECRET})


# ----------------------------------------------------------------------------- the interpreter


def test_an_interpreter_is_found_by_path_or_on_path_and_kept_unresolved(tmp_path: Path) -> None:
    script = tmp_path / "bin" / "python"
    script.parent.mkdir()
    script.write_text("#!/bin/sh\n")
    script.chmod(0o755)
    link = tmp_path / "venv-python"
    link.symlink_to(script)
    assert resolve_interpreter("bin/python", tmp_path) == str(script)
    assert resolve_interpreter(str(link), tmp_path) == str(link), "a venv's link is kept, not resolved"
    assert resolve_interpreter(sys.executable, tmp_path) == os.path.abspath(sys.executable)


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda d: "no-such-python-anywhere", "on the server's PATH"),
        (lambda d: "missing/python", "does not exist"),
        (lambda d: str(d), "is not a file"),
        (lambda d: _write(d / "plain", b"#!/bin/sh\n", 0o644), "is not executable"),
        (
            lambda d: _write(d / "data", b"\x00\x01\x02\x03", 0o755),
            "neither a native executable nor a script",
        ),
        (lambda d: " ", "non-empty path"),
    ],
)
def test_what_cannot_be_an_interpreter_is_refused_with_what_to_give(
    tmp_path: Path, make: Any, message: str
) -> None:
    with pytest.raises(InterpreterError, match=message):
        resolve_interpreter(make(tmp_path), tmp_path)


def _write(path: Path, data: bytes, mode: int) -> str:
    path.write_bytes(data)
    path.chmod(mode)
    return str(path)


# ----------------------------------------------------------------------------- the probe run judged


def test_a_probe_that_ran_to_its_end_counts() -> None:
    assert probe_failure(_result(), _probe(), _redactor(), 120) is None


@pytest.mark.parametrize(
    ("result", "probe", "expected"),
    [
        (
            _result(timed_out=True, exit_code=None),
            _probe(stages=["torch"]),
            "killed at its 120 s timeout during 'torch'",
        ),
        (
            _result(signal="SIGSEGV", exit_code=None),
            _probe(complete=False),
            "killed by SIGSEGV during 'start-up'",
        ),
        (_result(exit_code=1, stderr=_stream("SyntaxError: bad\n")), _probe(), "needs Python 3.7 or newer"),
        (_result(), _probe(began=False, complete=False), "does not behave like a Python 3 interpreter"),
        (
            _result(),
            _probe(complete=False, stages=["devices"]),
            "stops during 'devices' without its end record",
        ),
    ],
)
def test_a_probe_that_did_not_finish_says_how_and_where(
    result: CommandResult, probe: ProbeOutput, expected: str
) -> None:
    failure = probe_failure(result, probe, _redactor(), 120)
    assert failure is not None and expected in failure


def test_the_last_error_line_is_quoted_redacted() -> None:
    failure = probe_failure(
        _result(exit_code=2, stderr=_stream(f"boom {SECRET}\n")), _probe(), _redactor(), 120
    )
    assert failure is not None and failure.startswith("the probe exited with status 2: ")
    assert SECRET not in failure and "boom" in failure


# ----------------------------------------------------------------------------- host facts and logs


UNREADABLE = "is not readable here (not Linux, or sysfs not mounted)"


def test_host_facts_say_what_was_not_queried(tmp_path: Path) -> None:
    facts = host_facts(tmp_path, {}, system_tools=False, root=tmp_path)
    assert facts.tools == [] and facts.tool_missing == [
        ("system_tools", "not queried (system_tools=false)"),
        ("topology.nvlink", "nvidia-smi not found on PATH (or system_tools=false)"),
        ("topology.rdma_ports", f"{tmp_path / 'sys' / 'class'} {UNREADABLE}"),
        ("topology.peer_memory_module", f"{tmp_path / 'sys' / 'module'} {UNREADABLE}"),
    ]
    assert facts.topology is not None and facts.topology.rdma_ports is None
    assert facts.git is None and facts.git_reason
    failed = host_facts_failed(OSError("disk gone"))
    assert failed.tool_missing == [("system_tools", "host queries failed: OSError: disk gone")]
    assert failed.git_reason == "not queried: the host queries failed"


def test_a_log_is_rewritten_redacted_and_cut_with_a_note(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rewrite_redacted(tmp_path / "absent.log", str.upper)
    assert not (tmp_path / "absent.log").exists()
    log = tmp_path / "probe.log"
    log.write_text("abcdefghij")
    rewrite_redacted(log, str.upper)
    assert log.read_text() == "ABCDEFGHIJ"
    monkeypatch.setattr(capture_module, "MAX_LOG_REWRITE_BYTES", 4)
    rewrite_redacted(log, lambda text: text)
    assert log.read_text() == "ABCD\n[perfgate: log cut at 4 bytes of 10 before redaction]\n"


# ----------------------------------------------------------------------------- the capture


def test_a_capture_redacts_its_artifacts_and_names_each_tools_transcript() -> None:
    diff = f"+token = '{SECRET}'\n".encode()
    facts = HostFacts(
        tools=[SystemTool(name="nvidia-smi", found=True), SystemTool(name="nsys", found=False)],
        transcripts={"nvidia-smi": f"smi output {SECRET}"},
        git=GitSnapshot(
            root="/r", commit="c" * 40, branch="main", changed_files=1, untracked_files=0, diff=diff
        ),
    )
    got = capture(
        _probe(complete=False),
        _result(),
        facts,
        _redactor(),
        timeout_s=60,
        launch_command=["torchrun", "train.py"],
    )
    assert got.failure is not None and "without its end record" in got.failure
    assert [name for name, _ in got.artifacts] == ["git.diff", "systool_nvidia-smi.txt"]
    assert all(SECRET not in text for _, text in got.artifacts)
    assert got.assembled.warnings[0] == got.failure
    tools = {t.name: t.artifact for t in got.assembled.system_tools}
    assert tools == {"nvidia-smi": "systool_nvidia-smi.txt", "nsys": None}
    assert got.assembled.provenance.git is not None
    assert got.assembled.provenance.git.diff_artifact == "git.diff"
    assert got.assembled.provenance.git.diff_artifact_redacted is True
    assert SECRET not in str(got.assembled.document)
