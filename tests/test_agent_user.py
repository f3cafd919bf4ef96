"""The agent as a separate OS user who can write only the workspace, trying every bypass from issue 16.

The operator (this test process) owns the trust root (conftest's temp dir: keys, approvals, anchors,
policy). The agent is a throwaway user created with ``useradd``: it owns the workspace and nothing else.
Needs root and ``useradd`` (CI has both); skipped cleanly elsewhere. None of the attempts may work, and
each must be visible: refused outright, reported in the server log, or named by ``perfgate ledger verify``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import pwd
import re
import secrets
import shutil
import sqlite3
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from mcp import Client

import perfgate.tools
from _gated_tool import SPEC
from perfgate.evidence import Ledger
from perfgate.execution.approvals import ApprovalStatus, ApprovalStore
from perfgate.security.trustroot import TrustRoot
from perfgate.server import build_server
from perfgate.serving.runtime import ServerConfig

pytestmark = pytest.mark.anyio

SRC = Path(__file__).resolve().parents[1] / "src"


@dataclass(frozen=True)
class Agent:
    name: str
    uid: int
    gid: int
    home: Path
    python: str
    pythonpath: str

    def run(
        self, argv: list[str], *, env: dict[str, str] | None = None, input: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        base = {"HOME": str(self.home), "PATH": "/usr/bin:/bin", "PYTHONPATH": self.pythonpath}
        return subprocess.run(
            argv,
            env={**base, **(env or {})},
            user=self.uid,
            group=self.gid,
            extra_groups=[],
            cwd=self.home,
            capture_output=True,
            text=True,
            input=input,
            timeout=120,
        )

    def py(self, code: str, **kw: object) -> subprocess.CompletedProcess[str]:
        return self.run([self.python, "-c", code], **kw)  # type: ignore[arg-type]


def _python_for(uid: int, gid: int, pythonpath: str) -> str | None:
    """An interpreter the agent may execute that imports this perfgate (the venv's may sit under /root)."""
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    for candidate in (sys.executable, shutil.which(version, path="/usr/bin:/usr/local/bin:/bin")):
        if not candidate:
            continue
        try:
            probe = subprocess.run(
                [candidate, "-c", "import perfgate.execution.approvals, pydantic"],
                env={"PATH": "/usr/bin:/bin", "PYTHONPATH": pythonpath, "HOME": "/"},
                user=uid,
                group=gid,
                extra_groups=[],
                cwd="/",
                capture_output=True,
                timeout=60,
            )
        except OSError:  # not executable by the agent (a venv under /root, say)
            continue
        if probe.returncode == 0:
            return candidate
    return None


@pytest.fixture
def agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Agent]:
    if os.geteuid() != 0 or shutil.which("useradd") is None or shutil.which("userdel") is None:
        pytest.skip("needs root and useradd to create the agent user")
    name = f"pgagent{secrets.token_hex(3)}"
    created = subprocess.run(["useradd", "-M", "-N", "-s", "/bin/sh", name], capture_output=True, text=True)
    if created.returncode != 0:
        pytest.skip(f"useradd failed: {created.stderr.strip()}")
    home = Path(tempfile.mkdtemp(prefix="pg-agent-home-"))
    try:
        entry = pwd.getpwnam(name)
        os.chown(home, entry.pw_uid, entry.pw_gid)
        site = [p for p in sys.path if p.endswith("site-packages")]
        pythonpath = os.pathsep.join([str(SRC), *site])
        python = _python_for(entry.pw_uid, entry.pw_gid, pythonpath)
        if python is None:
            pytest.skip("no Python interpreter the agent user can execute imports this perfgate")
        yield Agent(name, entry.pw_uid, entry.pw_gid, home, python, pythonpath)
    finally:
        subprocess.run(["userdel", name], capture_output=True)
        shutil.rmtree(home, ignore_errors=True)


@pytest.fixture
def agent_workspace(agent: Agent) -> Iterator[Path]:
    """A workspace the agent owns, outside the operator's private temp dirs."""
    ws = Path(tempfile.mkdtemp(prefix="pg-agent-ws-"))
    os.chown(ws, agent.uid, agent.gid)
    yield ws
    shutil.rmtree(ws, ignore_errors=True)


def _give_to_agent(ws: Path, agent: Agent) -> None:
    """What the operator's server wrote in the workspace is the agent's to edit, like the rest of it."""
    for root, dirs, files in os.walk(ws):
        for name in [*dirs, *files]:
            os.chown(Path(root) / name, agent.uid, agent.gid)


async def _pending_approval(ws: Path) -> str:
    async with Client(build_server(ServerConfig.create(ws))) as client:
        result = await client.call_tool(SPEC.name, {"argv": [sys.executable, "train.py"]})
    text = " ".join(getattr(c, "text", "") for c in result.content)
    assert result.is_error and "perfgate approve" in text, text
    found = re.search(r"ap-[0-9a-f]{8}", text)
    assert found is not None
    return found.group(0)


async def test_the_agent_cannot_approve_its_own_commands(
    agent: Agent,
    agent_workspace: Path,
    trust_root: TrustRoot,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    ws = agent_workspace
    monkeypatch.setattr(perfgate.tools, "REGISTRY", (*perfgate.tools.REGISTRY, SPEC))
    policy = '[execution]\nmax_timeout_s = 99999\n[[execution.allow]]\nargv = ["*"]\ncode = "any"\n'
    # 1. A policy file written into the workspace, then a server restart.
    written = agent.run(
        [
            "/bin/sh",
            "-c",
            f"mkdir -p {ws}/.perfgate && printf '%s' '{policy}' > {ws}/perfgate.toml"
            f" && cp {ws}/perfgate.toml {ws}/.perfgate/policy.toml",
        ]
    )
    assert written.returncode == 0, written.stderr
    (ws / "train.py").write_text("print('trained')\n")
    caplog.set_level(logging.WARNING, logger="perfgate")
    approval_id = await _pending_approval(ws)  # not allowlisted: the workspace file was not obeyed
    assert "ignoring" in caplog.text and "perfgate.toml" in caplog.text
    _give_to_agent(ws, agent)
    store_db = trust_root.workspace_dir(ws) / "approvals.db"
    operator_env = {"PERFGATE_STATE_DIR": str(trust_root.state_dir)}

    def still_pending() -> bool:
        found = ApprovalStore.open(ws, trust_root).get(approval_id)
        return found is not None and found.status is ApprovalStatus.PENDING

    # 2. UPDATE approvals SET status='granted' (the store is in the operator's trust root).
    update = agent.run(["sqlite3", str(store_db), "UPDATE approvals SET status='granted'"])
    assert update.returncode != 0 and still_pending()
    # 3. ApprovalStore(...).decide(...) from Python, pointed at the operator's trust root.
    decide = agent.py(
        "from pathlib import Path; from perfgate.execution.approvals import ApprovalStore\n"
        f"ApprovalStore.open(Path({str(ws)!r})).decide({approval_id!r}, grant=True, who='me', grant_ttl_s=9e9)",
        env=operator_env,
    )
    assert decide.returncode != 0 and still_pending()
    # 4. `perfgate approve` under a pseudo-terminal (script), "yes" typed by the agent.
    approve = [agent.python, "-m", "perfgate", "approve", approval_id, "--workspace", str(ws)]
    for env in (operator_env, {}):  # the operator's trust root, then the agent's own
        faked = agent.run(["script", "-qec", " ".join(approve), "/dev/null"], env=env, input="yes\n")
        assert faked.returncode != 0 and still_pending(), faked.stdout + faked.stderr
    # The approval was opened and is still pending, as the ledger says too.
    assert Ledger(ws).verify().ok


async def test_the_agent_cannot_forge_or_roll_back_evidence(
    agent: Agent, agent_workspace: Path, trust_root: TrustRoot, capsys: pytest.CaptureFixture[str]
) -> None:
    from perfgate.cli import main as cli_main
    from perfgate.evidence import EvidenceDraft, EvidenceState

    ws = agent_workspace
    ledger = Ledger(ws)
    honest = Ledger.new_id()
    ledger.append(
        EvidenceDraft(
            id=honest,
            tool="compare_benchmarks",
            state=EvidenceState.EXECUTED,
            result={"verdict": "within_noise"},
        )
    )
    # A whole copy: the database and its write-ahead log (the server keeps the WAL between records).
    # A whole copy: the database and its write-ahead log (the server keeps the WAL between records).
    # Copying also closes a descriptor on ledger.db in this process, which drops SQLite's locks: the
    # agent's process below then removes the WAL on exit, and the ledger must notice and reopen.
    shutil.copy(ledger.db_path, ws / "old-ledger.db")
    shutil.copy(ledger.db_path.with_name("ledger.db-wal"), ws / "old-ledger.db-wal")
    shutil.copy(ledger.db_path.with_name("ledger.db-wal"), ws / "old-ledger.db-wal")
    for i in range(2):
        ledger.append(
            EvidenceDraft(id=Ledger.new_id(), tool="t", state=EvidenceState.EXECUTED, result={"i": i})
        )
    _give_to_agent(ws, agent)

    def verify() -> str:
        capsys.readouterr()
        assert cli_main(["ledger", "verify", "--workspace", str(ws)]) == 1
        return capsys.readouterr().out

    # 5. A comparison appended through perfgate's Python API, verdict `improved` (its own trust root).
    forged = agent.py(
        "from pathlib import Path; from perfgate.evidence import Ledger, EvidenceDraft, EvidenceState\n"
        f"Ledger(Path({str(ws)!r})).append(EvidenceDraft(id='ev-forged', tool='compare_benchmarks', "
        "state=EvidenceState.PASSED, result={'verdict': 'improved'}))"
    )
    assert forged.returncode == 0, forged.stderr  # it wrote, with a key of its own...
    assert ledger.get("ev-forged") is None  # ...which the operator's server does not trust
    assert "record 4 (ev-forged): signed by key" in verify()
    # 6. Edit the honest comparison and recompute the whole chain (and HEAD) with sqlite and sha256.
    rewrite = f"""
import hashlib, json, sqlite3
db = sqlite3.connect({str(ledger.db_path)!r})
db.execute("DROP TRIGGER evidence_no_update")
prev = "0" * 64
for seq, body in db.execute("SELECT seq, body FROM evidence ORDER BY seq").fetchall():
    record = json.loads(body)
    record["prev_hash"] = prev
    if record["id"] == {honest!r}:
        record["result"]["verdict"] = "improved"
    text = json.dumps(record, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    prev = hashlib.sha256((prev + text).encode()).hexdigest()
    db.execute("UPDATE evidence SET body = ?, hash = ? WHERE seq = ?", (text, prev, seq))
db.commit()
open({str(ledger.head_path)!r}, "w").write(f"{{seq}} {{prev}}\\n")
"""
    edited = agent.py(rewrite)
    assert edited.returncode == 0, edited.stderr
    assert ledger.get(honest) is None
    out = verify()
    assert f"record 1 ({honest}): forged: its MAC does not verify" in out
    # 7. Roll the ledger back to the older copy. The operator verifies from another process; this test
    # is one process, whose ledger connection is shared, so the server's is closed first. (Files copied
    # over a database while a server holds it open are corrupted by SQLite itself: verify fails too.)
    ledger.close()
    rolled = agent.run(
        [
            "/bin/sh",
            "-c",
            f"cp {ws}/old-ledger.db {ledger.db_path} && cp {ws}/old-ledger.db-wal {ledger.db_path}-wal "
            f"&& rm -f {ledger.db_path}-shm",
        ]
    )
    assert rolled.returncode == 0, rolled.stderr
    assert "but the trust root anchored record 3" in verify()
    # The trust root itself was out of reach all along.
    peek = agent.run(["/bin/sh", "-c", f"cat {trust_root.key_dir / 'current'}"])
    assert peek.returncode != 0
    assert hashlib.sha256(b"").hexdigest() and json.dumps({}) == "{}" and sqlite3.sqlite_version


async def test_links_the_agent_plants_in_perfgate_change_nothing_outside(
    agent: Agent, agent_workspace: Path
) -> None:
    """Issue 38: links the agent plants in ``.perfgate/`` (the lock of the decisions, the artifact folder)
    pointing into a directory only the operator may read and write: the operator's server refuses or
    replaces them, and nothing in that directory is created, written or removed."""
    ws = agent_workspace
    secret = Path(tempfile.mkdtemp(prefix="pg-operator-only-"))  # 0700, the operator's
    try:
        (secret / "precious.txt").write_text("keep me\n")
        before = sorted((p.name, p.read_bytes()) for p in secret.iterdir())
        Ledger(ws)  # the server made .perfgate/ first; what is in the workspace is the agent's to edit
        logs = ws / "logs"
        logs.mkdir()
        shutil.copy(Path(__file__).parent / "fixtures" / "logs" / "nanogpt.log", logs / "nanogpt.log")
        _give_to_agent(ws, agent)
        state = ws / ".perfgate"
        lock = agent.py(
            f"import os; os.symlink({str(secret / 'made-by-the-lock')!r}, {str(state / 'decisions.lock')!r})"
        )
        assert lock.returncode == 0, lock.stderr
        swap = (  # once the server runs (at start-up it refuses a linked artifact folder outright)
            "import os\n"
            f"os.rename({str(state / 'artifacts')!r}, {str(ws / 'artifacts-away')!r})\n"
            f"os.symlink({str(secret)!r}, {str(state / 'artifacts')!r})\n"
        )
        args = {
            "paths": ["logs/nanogpt.log"],
            "format": "nanogpt",
            "warmup_steps": 10,
            "windows": 1,
            "world_size": 8,
        }
        async with Client(build_server(ServerConfig.create(ws))) as client:
            shown = await client.call_tool("record_decision", {"action": "show", "experiment_id": "exp-nope"})
            swapped = agent.py(swap)
            assert swapped.returncode == 0, swapped.stderr
            imported = await client.call_tool("import_benchmark", args)
        assert shown.is_error and "no experiment" in shown.content[0].text  # type: ignore[union-attr]
        assert imported.is_error and "symbolic link" in imported.content[0].text  # type: ignore[union-attr]
        assert sorted((p.name, p.read_bytes()) for p in secret.iterdir()) == before
    finally:
        shutil.rmtree(secret, ignore_errors=True)
