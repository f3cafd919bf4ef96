"""The approval store and the gate's decisions, without the protocol."""

from __future__ import annotations

import re
import sqlite3
import threading
from pathlib import Path

import pytest

from _races import open_twice_after_both_looked
from perfgate.errors import ToolError
from perfgate.evidence import Ledger
from perfgate.execution.approvals import ApprovalStatus, ApprovalStore, ApprovalStoreError
from perfgate.execution.audit import APPROVAL_TOOL
from perfgate.execution.gate import ApprovalGate
from perfgate.execution.policy import AllowRule, ExecutionPolicy
from perfgate.execution.request import CommandRequest


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def ledger(tmp_path: Path) -> Ledger:
    return Ledger(tmp_path)


@pytest.fixture
def store(ledger: Ledger, clock: Clock) -> ApprovalStore:
    return ApprovalStore.open(ledger.workspace, clock=clock)


def req(ws: Path, *argv: str) -> CommandRequest:
    return CommandRequest(argv=argv or ("python", "train.py"), cwd=ws, timeout_s=60, reason="baseline")


def gate_for(ws: Path, ledger: Ledger, store: ApprovalStore, *rules: AllowRule, **kw: float) -> ApprovalGate:
    return ApprovalGate(ws, ledger, store, ExecutionPolicy(workspace=ws, allow=rules, **kw))


def decisions(ledger: Ledger) -> list[tuple[str, str, str]]:
    return [
        (r.result["decision"], r.result["how"], r.state.value) for r in ledger.records(tool=APPROVAL_TOOL)
    ]


def test_repeating_a_pending_request_reuses_its_id(tmp_path: Path, store: ApprovalStore) -> None:
    first, created = store.open_pending(req(tmp_path), "run_x", ttl_s=100)
    again, created_again = store.open_pending(req(tmp_path), "run_x", ttl_s=100)
    other, _ = store.open_pending(req(tmp_path, "python", "other.py"), "run_x", ttl_s=100)
    assert created and not created_again and again.id == first.id and other.id != first.id
    assert re.fullmatch(r"ap-[0-9a-f]{8}", first.id)
    assert [a.id for a in store.list((ApprovalStatus.PENDING,))] == [first.id, other.id]


def test_a_grant_is_reusable_for_the_same_digest_until_it_expires(
    tmp_path: Path, store: ApprovalStore, clock: Clock
) -> None:
    pending, _ = store.open_pending(req(tmp_path), "run_x", ttl_s=100)
    assert store.use_grant(req(tmp_path)) is None
    granted = store.decide(pending.id, grant=True, who="alice", grant_ttl_s=50)
    assert granted.status is ApprovalStatus.GRANTED and granted.expires_at == clock.now + 50
    assert store.use_grant(req(tmp_path, "python", "other.py")) is None
    first = store.use_grant(req(tmp_path))
    second = store.use_grant(req(tmp_path))
    assert first is not None and second is not None and (first.uses, second.uses) == (1, 2)
    clock.now += 51
    assert store.use_grant(req(tmp_path)) is None
    expired = store.expire_due()
    assert [a.id for a in expired] == [pending.id] and expired[0].status is ApprovalStatus.EXPIRED
    assert store.expire_due() == []


def test_only_a_live_pending_approval_can_be_decided(
    tmp_path: Path, store: ApprovalStore, clock: Clock
) -> None:
    with pytest.raises(ApprovalStoreError, match="no approval"):
        store.decide("ap-00000000", grant=True, who="a", grant_ttl_s=1)
    pending, _ = store.open_pending(req(tmp_path), "run_x", ttl_s=10)
    store.decide(pending.id, grant=False, who="bob", grant_ttl_s=1)
    with pytest.raises(ApprovalStoreError, match="already denied"):
        store.decide(pending.id, grant=True, who="a", grant_ttl_s=1)
    late, _ = store.open_pending(req(tmp_path, "x"), "run_x", ttl_s=10)
    clock.now += 11
    with pytest.raises(ApprovalStoreError, match="expired"):
        store.decide(late.id, grant=True, who="a", grant_ttl_s=1)


def test_allowlisted_requests_are_approved_and_recorded(
    tmp_path: Path, ledger: Ledger, store: ApprovalStore
) -> None:
    gate = gate_for(tmp_path, ledger, store, AllowRule(argv=("python", "train.py")))
    grant = gate.preapproved(req(tmp_path), "run_x")
    assert grant is not None and grant.how.value == "allowlist" and grant.digest == req(tmp_path).digest
    assert gate.preapproved(req(tmp_path, "python", "other.py"), "run_x") is None
    record = ledger.get(grant.evidence_id)
    assert record is not None and record.tool == APPROVAL_TOOL and record.state.value == "passed"
    assert record.result["rule"] == "python train.py" and record.command == ["python", "train.py"]
    assert record.inputs["request"]["reason"] == "baseline"


def test_the_pending_path_records_once_and_tells_the_agent_the_exact_command(
    tmp_path: Path, ledger: Ledger, store: ApprovalStore
) -> None:
    gate = gate_for(tmp_path, ledger, store)
    with pytest.raises(ToolError) as first:
        gate.require_human(req(tmp_path), "run_x")
    with pytest.raises(ToolError) as second:
        gate.require_human(req(tmp_path), "run_x")
    (approval,) = store.list()
    assert f"perfgate approve {approval.id} --workspace {tmp_path}" in str(first.value)
    assert "repeat this exact call" in str(first.value)
    assert approval.id in str(second.value)
    assert decisions(ledger) == [("pending", "cli_pending", "scaffolded")]
    assert store.get(approval.id).evidence_id == ledger.records(tool=APPROVAL_TOOL)[0].id  # type: ignore[union-attr]


def test_a_cli_grant_approves_the_same_digest_and_each_use_is_recorded(
    tmp_path: Path, ledger: Ledger, store: ApprovalStore
) -> None:
    gate = gate_for(tmp_path, ledger, store)
    with pytest.raises(ToolError):
        gate.require_human(req(tmp_path), "run_x")
    (approval,) = store.list()
    store.decide(approval.id, grant=True, who="alice@host on /dev/pts/1", grant_ttl_s=100)
    grant = gate.preapproved(req(tmp_path), "run_x")
    assert grant is not None and grant.how.value == "cli_grant" and grant.who.startswith("alice")
    assert gate.preapproved(req(tmp_path, "python", "train.py", "--more"), "run_x") is None
    assert decisions(ledger)[-1] == ("approved", "cli_grant", "passed")


def test_a_denied_command_is_refused_until_the_denial_expires(
    tmp_path: Path, ledger: Ledger, store: ApprovalStore, clock: Clock
) -> None:
    gate = gate_for(tmp_path, ledger, store, pending_ttl_s=100)
    with pytest.raises(ToolError):
        gate.require_human(req(tmp_path), "run_x")
    (approval,) = store.list()
    store.decide(approval.id, grant=False, who="bob", grant_ttl_s=100)
    with pytest.raises(ToolError, match="denied this exact command"):
        gate.preapproved(req(tmp_path), "run_x")
    clock.now += 101
    assert gate.preapproved(req(tmp_path), "run_x") is None


def test_expiry_is_recorded_as_evidence(
    tmp_path: Path, ledger: Ledger, store: ApprovalStore, clock: Clock
) -> None:
    gate = gate_for(tmp_path, ledger, store, pending_ttl_s=10)
    with pytest.raises(ToolError):
        gate.require_human(req(tmp_path), "run_x")
    clock.now += 11
    (evidence_id,) = gate.expire_due()
    record = ledger.get(evidence_id)
    assert record is not None and record.result["decision"] == "expired" and record.state.value == "failed"
    assert store.list((ApprovalStatus.PENDING,)) == []
    with pytest.raises(ToolError) as again:
        gate.require_human(req(tmp_path), "run_x")
    (new,) = store.list((ApprovalStatus.PENDING,))
    assert new.id in str(again.value)
    assert ledger.verify().ok


@pytest.mark.parametrize(("action", "decision"), [("decline", "declined"), ("cancel", "cancelled")])
def test_elicitation_refusals_are_recorded_and_raise(
    tmp_path: Path, ledger: Ledger, store: ApprovalStore, action: str, decision: str
) -> None:
    gate = gate_for(tmp_path, ledger, store)
    with pytest.raises(ToolError, match=r"did not run|declined"):
        gate.settle_elicitation(req(tmp_path), "run_x", action, "client X")  # type: ignore[arg-type]
    assert decisions(ledger) == [(decision, "elicitation", "failed")]
    grant = gate.settle_elicitation(req(tmp_path), "run_x", "accept", "client X", "looks fine")
    record = ledger.get(grant.evidence_id)
    assert record is not None and record.result["note"] == "looks fine" and record.result["who"] == "client X"


def test_limits_bind_every_path_and_a_broken_policy_disables_commands(
    tmp_path: Path, ledger: Ledger, store: ApprovalStore
) -> None:
    gate = gate_for(tmp_path, ledger, store, AllowRule(argv=("python",)), max_timeout_s=30)
    with pytest.raises(ToolError, match="exceeds the operator's max_timeout_s"):
        gate.preapproved(req(tmp_path), "run_x")
    outside = CommandRequest(argv=("python",), cwd=tmp_path.parent, timeout_s=5)
    with pytest.raises(ToolError, match="outside the allowed roots"):
        gate.preapproved(outside, "run_x")
    broken = ApprovalGate(tmp_path, ledger, store, None, "bad key")
    with pytest.raises(ToolError, match="commands are disabled"):
        broken.preapproved(req(tmp_path), "run_x")
    assert decisions(ledger) == []


def test_opening_a_new_store_waits_out_another_connections_write_lock(tmp_path: Path) -> None:
    # The server and `perfgate approve` may create the store at the same moment; the one that finds the
    # other holding the lock waits (SQLite refuses the switch to WAL at once, without its busy handler).
    from perfgate.security.trustroot import TrustRoot

    trust = TrustRoot.locate()
    folder = trust.workspace_dir(tmp_path)
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    other = sqlite3.connect(folder / "approvals.db", isolation_level=None, check_same_thread=False)
    other.execute("CREATE TABLE unrelated (x)")
    other.execute("BEGIN IMMEDIATE")
    release = threading.Timer(0.3, lambda: other.execute("COMMIT"))
    release.start()
    try:
        store = ApprovalStore.open(tmp_path)
        _, created = store.open_pending(req(tmp_path), "run_x", ttl_s=100)
        assert created
    finally:
        release.join()
        other.close()


def test_processes_opening_an_unsigned_store_at_once_both_open_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A store from before rows were signed gains its mac column once, whoever opens it: before, two
    openers (the server and `perfgate approve`) both found the column missing, and the second one's
    ALTER TABLE failed ("duplicate column name"), so it could not start."""
    import contextlib

    from perfgate.execution.approvals import _SCHEMA  # pyright: ignore[reportPrivateUsage]
    from perfgate.security.trustroot import TrustRoot

    folder = tmp_path / "store"
    folder.mkdir()
    with contextlib.closing(sqlite3.connect(folder / "approvals.db")) as old:
        old.executescript(_SCHEMA.replace(",\n    mac TEXT\n", "\n"))
    key = TrustRoot.locate().ensure_key()
    # Both look for the column before either adds it.
    opened = open_twice_after_both_looked(monkeypatch, "approvals", lambda: ApprovalStore(folder, key))
    assert (
        len(opened) == 2 and isinstance(opened[0], ApprovalStore) and isinstance(opened[1], ApprovalStore)
    ), opened
    approval, created = opened[1].open_pending(req(tmp_path), "run_x", ttl_s=100)
    assert created and opened[0].get(approval.id) == approval
