"""Secrets found by shape, not by name, are stored and shown nowhere (issue 43 item 6).

Planted: a random token under an ordinary env name, one inside a PYTHONPATH-like list, an AWS secret key
after an ordinary flag, a token as ``--key=VALUE`` and as a positional argument, credentials in an
uncommitted diff and a private key in an untracked file (the run's ``code.diff``), and all of it in a request
the human refused. Every file under ``.perfgate/`` and the trust root's state, the approval text the
human reads, the pending-approval error and every tool answer are searched for the raw values.
"""

from __future__ import annotations

import contextlib
import io
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from mcp import Client

import perfgate.tools
from _gated_tool import SPEC
from _trust import any_code_rules, operator_policy
from perfgate.evidence import Ledger
from perfgate.execution.approvals import ApprovalStore
from perfgate.security.trustroot import TrustRoot
from perfgate.server import build_server
from perfgate.serving.runtime import ServerConfig
from perfgate.tools import run_benchmark_window

pytestmark = pytest.mark.anyio

PY = sys.executable
PACED = str(Path(__file__).resolve().parents[1] / "examples" / "paced_loop.py")
SECRETS = {
    "ordinary_name": "Xq7vR2mK9pLw4NzT8bYc3HdF",  # MY_SETTING=<random token>
    "nested_path": "Tn5kW8qZr2Lm7XpB4vCy9JdG",  # inside a PYTHONPATH-like value
    "aws_after_flag": "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",  # --foo <aws secret key>
    "key_eq": "Vb3nM8kQ2wZr6TpL9xYc4HfJ",  # --key=VALUE
    "positional": "Gh6pD2sW9kLm4RzX7bNv3QcT",  # a positional argument
    "hex_value": "5f0c2e9a7b1d4c3e8f6a0b2d4e6f8a1c3e5d7b9f",  # a hex token as an env value
}
DIFF_SECRETS = {
    "diff_token": "Zr8mQ3kW7pLx2NvT5bYc9HdG",  # assigned in a tracked file's uncommitted change
    "diff_password": "correct-horse-battery-staple",  # password: ... in the same change
    "private_key": "MIIEpAIBAAKCAQEA7vXk2QpL",  # the body of a PEM block in an untracked file
}
SCRIPT = """
import os, sys
print("argv:", sys.argv)
print("env:", os.environ.get("MY_SETTING"), os.environ.get("MY_PATHS"), os.environ.get("BUILD_REF"))
"""


def _env() -> dict[str, str]:
    return {
        "MY_SETTING": SECRETS["ordinary_name"],
        "MY_PATHS": f"/opt/lib:/tmp/{SECRETS['nested_path']}/site:/usr/lib",
        "BUILD_REF": SECRETS["hex_value"],
        "OMP_NUM_THREADS": "2",
    }


def _argv() -> list[str]:
    return [
        PY,
        "job.py",
        "--foo",
        SECRETS["aws_after_flag"],
        f"--key={SECRETS['key_eq']}",
        SECRETS["positional"],
        "--lr",
        "3e-4",
        "--model",
        "gpt2-medium",
        "--out",
        "/data/runs/exp1",
    ]


def _leaks(text: str, secrets: dict[str, str]) -> list[str]:
    return [name for name, value in secrets.items() if value in text]


def _files_leaking(root: Path, secrets: dict[str, str]) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for path in root.rglob("*"):
        if path.is_file():
            leaks = _leaks(path.read_bytes().decode("utf-8", errors="replace"), secrets)
            if leaks:
                found[str(path)] = leaks
    return found


def _text(result: Any) -> str:
    return " ".join(getattr(c, "text", "") for c in result.content) + str(result.structured_content)


async def test_secrets_under_ordinary_names_and_flags_are_stored_and_shown_nowhere(
    workspace: Path, trust_root: TrustRoot, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(perfgate.tools, "REGISTRY", (*perfgate.tools.REGISTRY, SPEC))
    (workspace / "job.py").write_text(SCRIPT)
    args = {"argv": _argv(), "env": _env()}
    answers: list[str] = []
    # 1. No rule: a pending approval (stored in the trust root before anything runs); the human refuses it.
    async with Client(build_server(ServerConfig.create(workspace))) as client:
        pending = await client.call_tool(SPEC.name, args)
    assert pending.is_error
    answers.append(_text(pending))
    (approval_id,) = re.findall(r"perfgate approve (ap-[0-9a-f]+)", answers[-1])
    from perfgate.cli import main as cli_main

    shown = io.StringIO()
    with contextlib.redirect_stdout(shown):
        assert cli_main(["approvals", "--workspace", str(workspace)]) == 0
    assert "<redacted:aws-secret-key:" in shown.getvalue()
    answers.append(shown.getvalue())
    approval = ApprovalStore.open(workspace).get(approval_id)
    assert approval is not None  # what `perfgate approve` shows the human
    answers.append(approval.request.describe(approval.tool))
    assert "MY_SETTING=" in answers[-1] and "gpt2-medium" in answers[-1]
    ApprovalStore.open(workspace).decide(approval_id, grant=False, who="human", grant_ttl_s=60)
    async with Client(build_server(ServerConfig.create(workspace))) as client:
        refused = await client.call_tool(SPEC.name, args)
    assert refused.is_error and "denied" in _text(refused).lower()
    answers.append(_text(refused))
    assert _files_leaking(trust_root.state_dir, SECRETS) == {}
    assert _files_leaking(workspace / ".perfgate", SECRETS) == {}
    # 2. Allowlisted: it runs and prints everything it was given.
    operator_policy("[execution]\nallow_env = ['*']\n" + any_code_rules([PY, "job.py"]))
    async with Client(build_server(ServerConfig.create(workspace))) as client:
        result = await client.call_tool(SPEC.name, args)
    assert not result.is_error, result.content
    answers.append(_text(result))
    assert "argv:" in (result.structured_content or {})["stdout_tail"]
    assert [a for a in answers if _leaks(a, SECRETS)] == []
    assert _files_leaking(workspace / ".perfgate", SECRETS) == {}
    assert _files_leaking(trust_root.state_dir, SECRETS) == {}
    # Ordinary values survive, and the same secret reads the same in the record and the answer.
    record = Ledger(workspace).get((result.structured_content or {})["evidence_id"])
    assert record is not None and record.command is not None
    stored = " ".join(record.command)
    assert "--lr 3e-4 --model gpt2-medium --out /data/runs/exp1" in stored and "job.py" in stored
    assert re.search(r"--foo <redacted:aws-secret-key:[0-9a-f]{8}>", stored)
    assert record.inputs["env"]["OMP_NUM_THREADS"] == "2"
    assert record.inputs["env"]["MY_PATHS"].startswith("/opt/lib:/tmp/<redacted:")
    assert record.inputs["env"]["MY_PATHS"].endswith("/site:/usr/lib")
    assert record.inputs["env"]["MY_SETTING"] in (result.structured_content or {})["stdout_tail"]


def _git(workspace: Path, *args: str) -> None:
    subprocess.run(
        ["git", "-C", str(workspace), "-c", "user.name=t", "-c", "user.email=t@example.com", *args],
        check=True,
        capture_output=True,
    )


async def test_the_runs_code_diff_holds_no_credential_and_its_commit_is_kept(
    workspace: Path, trust_root: TrustRoot, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(perfgate.tools, "REGISTRY", (*perfgate.tools.REGISTRY, run_benchmark_window.SPEC))
    operator_policy("[execution]\n" + any_code_rules([PY, PACED]))
    _git(workspace, "init", "-q")
    (workspace / "config.yaml").write_text("lr: 0.001\n")
    _git(workspace, "add", "config.yaml")
    _git(workspace, "commit", "-q", "-m", "c")
    commit = subprocess.run(
        ["git", "-C", str(workspace), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()
    (workspace / "config.yaml").write_text(
        f"lr: 0.002\nupload: {DIFF_SECRETS['diff_token']}\npassword: {DIFF_SECRETS['diff_password']}\n"
    )
    (workspace / "deploy_key.py").write_text(
        'KEY = """-----BEGIN RSA PRIVATE KEY-----\n'
        f"{DIFF_SECRETS['private_key']}\nq9Lr2Vt8Wn4Zp6Ks1Jd3Fh5Gm7Bc0Nx\n"
        '-----END RSA PRIVATE KEY-----"""\n'
    )
    args = {
        "command": [PY, PACED, "--steps", "200", "--step-ms", "2", "--samples", "4"],
        "timing": "explicit",
        "warmup_steps": 2,
        "measure_steps": 5,
        "repeats": 1,
        "same_process": True,
        "timeout_s": 60,
        "contract": {"invariants": {"workload": "paced"}},
    }
    async with Client(build_server(ServerConfig.create(workspace))) as client:
        result = await client.call_tool("run_benchmark_window", args)
    assert not result.is_error, _text(result)
    out = result.structured_content or {}
    code = out["provenance"]["code"]
    assert code["commit"] == commit and code["dirty"] is True  # a hex commit is kept as it is
    (diff_path,) = [workspace / a for a in out["artifacts"] if a.endswith("code.diff")]
    diff = diff_path.read_text()
    assert "+lr: 0.002" in diff and "deploy_key.py" in diff and "<redacted:private-key:" in diff
    assert _leaks(_text(result), DIFF_SECRETS) == []
    assert _files_leaking(workspace / ".perfgate", DIFF_SECRETS) == {}
    assert _files_leaking(trust_root.state_dir, DIFF_SECRETS) == {}
