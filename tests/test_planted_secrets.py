"""Planted secrets (argv flags, env of any name, URL credentials, printed by the script) are stored nowhere.

Checked everywhere perfgate writes or answers: every file under ``.perfgate/`` (ledger, artifacts, logs),
the approvals in the trust root, the pending-approval error, the tool result, a report, an export and
the server's log.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Any

import pytest
from mcp import Client

import perfgate.tools
from _gated_tool import SPEC
from _trust import any_code_rules, operator_policy
from perfgate.security.scrubber import install_log_filter
from perfgate.security.trustroot import TrustRoot
from perfgate.server import build_server
from perfgate.serving.runtime import ServerConfig

pytestmark = pytest.mark.anyio

PY = sys.executable
SECRETS = {
    "flag": "Zq8vFLAGsecret1w7",
    "flag_eq": "Kp3xEQUALSsecret9",
    "url": "Ur1PASSWORDinURL5",
    "named": "Nm4APIKEYvalue22x",
    "server": "Sv7SERVERtokenXY8",
}
SCRIPT = """
import os, sys
print("argv:", sys.argv)
print("env:", os.environ.get("DATA_URL"), os.environ.get("MY_API_KEY"), os.environ.get("HF_TOKEN"))
print("connecting to", os.environ["DATA_URL"], file=sys.stderr)
"""


def _leaks(text: str) -> list[str]:
    return [name for name, value in SECRETS.items() if value in text]


def _files_leaking(root: Path) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for path in root.rglob("*"):
        if path.is_file():
            leaks = _leaks(path.read_bytes().decode("utf-8", errors="replace"))
            if leaks:
                found[str(path)] = leaks
    return found


async def test_planted_secrets_appear_nowhere(
    workspace: Path,
    trust_root: TrustRoot,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setattr(perfgate.tools, "REGISTRY", (*perfgate.tools.REGISTRY, SPEC))
    monkeypatch.setenv("HF_TOKEN", SECRETS["server"])
    (workspace / "job.py").write_text(SCRIPT)
    args = {
        "argv": [PY, "job.py", "--token", SECRETS["flag"], f"--password={SECRETS['flag_eq']}"],
        "env": {"DATA_URL": f"s3://AKID:{SECRETS['url']}@bucket/data", "MY_API_KEY": SECRETS["named"]},
    }
    install_log_filter()
    caplog.set_level(logging.INFO)
    # 1. No allowlist, no elicitation: a pending approval, whose error the agent reads.
    async with Client(build_server(ServerConfig.create(workspace))) as client:
        pending = await client.call_tool(SPEC.name, args)
    assert pending.is_error
    error_text = " ".join(getattr(c, "text", "") for c in pending.content)
    assert "perfgate approve" in error_text and _leaks(error_text) == []
    # 2. Allowlisted: it runs, prints everything it was given.
    operator_policy("[execution]\nallow_env = ['*']\n" + any_code_rules([PY, "job.py"]))
    async with Client(build_server(ServerConfig.create(workspace))) as client:
        result = await client.call_tool(SPEC.name, args)
        assert not result.is_error, result.content
        out: dict[str, Any] = result.structured_content or {}
        assert "argv:" in out["stdout_tail"] and _leaks(str(result.content) + str(out)) == []
        exp = await client.call_tool(
            "record_decision",
            {
                "action": "open",
                "hypothesis": f"try --token {SECRETS['flag']}",
                "classification": "system_optimization",
                "changed_variable": "x",
            },
        )
        exp_id = (exp.structured_content or {})["experiment_id"]
    from perfgate.cli import main as cli_main

    assert cli_main(["report", "all", "--workspace", str(workspace)]) == 0
    assert cli_main(["export", exp_id, str(tmp_path / "export"), "--workspace", str(workspace)]) == 0
    assert _files_leaking(workspace / ".perfgate") == {}
    assert _files_leaking(tmp_path / "export") == {}
    assert _files_leaking(trust_root.state_dir) == {}  # approvals, anchors
    logging.getLogger("perfgate").warning("a command failed: --api-key %s", SECRETS["named"])
    assert _leaks(caplog.text) == [] and "<redacted:named:" in caplog.text
