"""Secrets passed as environment changes never reach the ledger, though approvals still bind them."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import BaseModel

from perfgate.evidence import EvidenceState, Ledger
from perfgate.execution.audit import Decision, How, record_decision
from perfgate.execution.request import CommandRequest
from perfgate.security.envredactor import placeholder
from perfgate.serving.runtime import ServerConfig, ToolRuntime

pytestmark = pytest.mark.anyio
SECRET = "hf_abcdefghijklmnopqrstuvwxyz0123"


class _Out(BaseModel):
    evidence_id: str
    state: EvidenceState


def _db_bytes(workspace: Path) -> bytes:
    state = workspace / ".perfgate"
    return b"".join(p.read_bytes() for p in state.rglob("*") if p.is_file())


async def test_tool_inputs_keep_env_names_but_not_secret_values(workspace: Path) -> None:
    ledger = Ledger(workspace)
    inputs = {"command": ["python", "train.py"], "env": {"HF_TOKEN": SECRET, "OMP_NUM_THREADS": "4"}}
    rt = ToolRuntime(config=ServerConfig.create(workspace), ledger=ledger, tool="t", inputs=inputs)
    ev = rt.evidence()
    await rt.commit(ev, _Out(evidence_id=ev.id, state=EvidenceState.EXECUTED))
    record = ledger.get(ev.id)
    assert record is not None
    assert record.inputs["env"] == {"HF_TOKEN": placeholder("named", SECRET), "OMP_NUM_THREADS": "4"}
    assert SECRET.encode() not in _db_bytes(workspace)


def test_approval_records_redact_env_but_the_digest_binds_the_real_value(workspace: Path) -> None:
    ledger = Ledger(workspace)
    request = CommandRequest(
        argv=("python", "train.py"), cwd=workspace, env={"WANDB_API_KEY": SECRET}, timeout_s=60
    )
    other = CommandRequest(
        argv=("python", "train.py"), cwd=workspace, env={"WANDB_API_KEY": "x" * 32}, timeout_s=60
    )
    assert request.digest != other.digest
    evidence_id = record_decision(
        ledger, tool="t", request=request, decision=Decision.APPROVED, how=How.ALLOWLIST, who="operator"
    )
    record = ledger.get(evidence_id)
    assert record is not None
    assert record.inputs["request"]["env"] == {"WANDB_API_KEY": placeholder("named", SECRET)}
    assert SECRET.encode() not in _db_bytes(workspace)
