"""The signed, anchored ledger: forged, edited, recomputed, truncated and rolled-back ledgers are caught.

Each attack is one an agent with a shell in the workspace can mount (it can write ``.perfgate/``, and it
can call perfgate's Python API); the trust root (conftest: a temp dir) is what it cannot write.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from mcp import Client

from perfgate.cli import main as cli_main
from perfgate.evidence import EvidenceDraft, EvidenceState, Ledger
from perfgate.evidence.records import GENESIS_HASH
from perfgate.security.trustroot import TrustRoot
from test_record_decision import Evidence, _honest, _keep, _open, _text

pytestmark = pytest.mark.anyio


def _append(ledger: Ledger, **result: object) -> str:
    eid = Ledger.new_id()
    ledger.append(EvidenceDraft(id=eid, tool="t", state=EvidenceState.EXECUTED, result=dict(result)))
    return eid


def _raw(ledger: Ledger, sql: str, *params: object) -> None:
    with sqlite3.connect(ledger.db_path) as conn:
        conn.execute("DROP TRIGGER IF EXISTS evidence_no_update")
        conn.execute("DROP TRIGGER IF EXISTS evidence_no_delete")
        conn.execute(sql, params)


def _verify(workspace: Path, capsys: pytest.CaptureFixture[str]) -> str:
    capsys.readouterr()
    assert cli_main(["ledger", "verify", "--workspace", str(workspace)]) == 1
    return capsys.readouterr().out


def test_records_are_signed_and_the_head_is_anchored_outside_the_workspace(
    workspace: Path, trust_root: TrustRoot
) -> None:
    ledger = Ledger(workspace)
    ids = [_append(ledger, i=i) for i in range(3)]
    report = ledger.verify()
    assert report.ok and report.signed_records == 3 and report.key_id == trust_root.key().key_id  # type: ignore[union-attr]
    anchor = ledger.anchor()
    assert anchor is not None
    assert anchor["seq"] == 3 and anchor["hash"] == ledger.records()[-1].hash
    assert trust_root.state_dir not in workspace.parents and workspace not in ledger.anchor_path.parents
    assert (trust_root.key_dir / "current").stat().st_mode & 0o077 == 0
    assert [r.id for r in ledger.records()] == ids


def test_a_record_forged_through_the_python_api_is_never_evidence(
    workspace: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An agent calling perfgate's API with a trust root of its own (it cannot read the operator's key)."""
    honest = Ledger(workspace)
    _append(honest, verdict="within_noise")
    forger = Ledger(workspace, TrustRoot.locate(state_dir=tmp_path / "agent-state"))
    forged = _append(forger, verdict="improved")
    assert honest.get(forged) is None and forged not in [r.id for r in honest.records()]
    assert forger.get(forged) is not None  # its own key verifies it: that is why the key must stay private
    out = _verify(workspace, capsys)
    assert f"record 2 ({forged}): signed by key" in out and "not used as evidence" in out
    # Display still shows it, flagged.
    assert cli_main(["ledger", "show", "--workspace", str(workspace)]) == 0
    assert "UNTRUSTED" in capsys.readouterr().out


def test_an_unsigned_row_inserted_with_sqlite_is_reported(
    workspace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ledger = Ledger(workspace)
    first = ledger.records() or [None]
    _append(ledger, i=0)
    prev = ledger.records()[-1]
    body = json.loads(prev.model_dump_json())
    body.update(seq=2, id="ev-forged", prev_hash=prev.hash, result={"verdict": "improved"})
    del body["hash"]
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    digest = hashlib.sha256((prev.hash + text).encode()).hexdigest()
    _raw(
        ledger,
        "INSERT INTO evidence (seq, id, tool, state, body, hash) VALUES (2, 'ev-forged', 't', 'executed', ?, ?)",
        text,
        digest,
    )
    assert ledger.get("ev-forged") is None and first
    assert "unsigned: written without the trust root's key" in _verify(workspace, capsys)


def test_an_edit_with_a_recomputed_chain_is_reported_as_forged(
    workspace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ledger = Ledger(workspace)
    ids = [_append(ledger, speedup=1.0 + i / 100) for i in range(3)]
    # Rewrite record 2 and recompute every hash after it, HEAD file included: the chain is consistent again.
    prev = ledger.records()[0].hash
    for record in ledger.records(trusted_only=False)[1:]:
        body = json.loads(record.model_dump_json())
        del body["hash"]
        body["prev_hash"] = prev
        if record.id == ids[1]:
            body["result"]["speedup"] = 2.5
        text = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        prev = hashlib.sha256((prev + text).encode()).hexdigest()
        _raw(ledger, "UPDATE evidence SET body = ?, hash = ? WHERE id = ?", text, prev, record.id)
    (ledger.state_dir / "HEAD").write_text(f"3 {prev}\n")
    assert ledger.get(ids[1]) is None and ledger.get(ids[2]) is None and ledger.get(ids[0]) is not None
    out = _verify(workspace, capsys)
    assert f"record 2 ({ids[1]}): forged: its MAC does not verify" in out
    assert "differs from the one anchored in the trust root" in out


def test_truncation_and_rollback_are_detected_even_with_head_rewritten(
    workspace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ledger = Ledger(workspace)
    _append(ledger, i=0)
    _append(ledger, i=1)
    saved = workspace.parent / "old-copy"
    shutil.copytree(ledger.state_dir, saved)
    _append(ledger, i=2)
    _append(ledger, i=3)
    # Truncation: delete the tail and make the workspace's HEAD agree.
    _raw(ledger, "DELETE FROM evidence WHERE seq > 2")
    (ledger.state_dir / "HEAD").write_text(f"2 {ledger.records()[-1].hash}\n")
    out = _verify(workspace, capsys)
    assert (
        "ends at record 2 but the trust root anchored record 4: its tail was removed or it was rolled back"
        in out
    )
    # Rollback: restore the older copy wholesale.
    shutil.rmtree(ledger.state_dir)
    shutil.copytree(saved, ledger.state_dir)
    assert "ends at record 2 but the trust root anchored record 4" in _verify(workspace, capsys)
    # Rolled back and regrown to the anchored length: record 4 is not the anchored one.
    regrown = Ledger(workspace, TrustRoot.locate(state_dir=workspace.parent / "scratch-state"))
    _append(regrown, i=20)
    _append(regrown, i=30)
    assert "differs from the one anchored" in _verify(workspace, capsys)


def test_a_replaced_database_is_reported(workspace: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ledger = Ledger(workspace)
    _append(ledger, i=0)
    ledger.db_path.unlink()
    for extra in ("-wal", "-shm"):
        ledger.db_path.with_name(ledger.db_path.name + extra).unlink(missing_ok=True)
    fresh = Ledger(workspace)
    assert fresh.records() == []
    assert "the ledger database was replaced" in _verify(workspace, capsys)
    _append(fresh, i=1)  # the server carries on in a new database: the loss stays on record
    assert "anchored another ledger database here before" in _verify(workspace, capsys)
    assert GENESIS_HASH == "0" * 64


def test_key_loss_is_a_clear_recoverable_state(
    workspace: Path, trust_root: TrustRoot, capsys: pytest.CaptureFixture[str]
) -> None:
    ledger = Ledger(workspace)
    old = [_append(ledger, i=i) for i in range(2)]
    shutil.rmtree(trust_root.key_dir)
    after = Ledger(workspace)  # the next server start: a new key is created on the first append
    new = _append(after, i=9)
    assert [r.id for r in after.records()] == [new]  # old records are not silently trusted
    assert [r.id for r in after.records(trusted_only=False)] == [*old, new]  # but still readable
    out = _verify(workspace, capsys)
    assert "which this trust root does not have (key lost or replaced): unverifiable" in out


def test_the_ledger_is_readable_without_the_key(
    workspace: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ledger = Ledger(workspace)
    ids = [_append(ledger, i=i) for i in range(2)]
    keyless = TrustRoot.locate(state_dir=tmp_path / "empty-state")
    reader = Ledger(workspace, keyless)
    assert not reader.verifiable and [r.id for r in reader.records()] == ids
    report = reader.verify()  # it verified nothing: no pass (an agent that removed the key gets no "ok")
    assert report.key_id is None and not report.ok
    assert any("no signing key readable" in e for e in report.errors)
    code = cli_main(
        ["ledger", "verify", "--workspace", str(workspace), "--state-dir", str(keyless.state_dir)]
    )
    assert code == 1 and "FAILED" in capsys.readouterr().out
    code = cli_main(["ledger", "show", "--workspace", str(workspace), "--state-dir", str(keyless.state_dir)])
    assert code == 0 and "unverified" in capsys.readouterr().err


async def test_a_forged_comparison_cannot_get_a_keep(server: Any, workspace: Path, tmp_path: Path) -> None:
    """The issue's attack: a comparison appended through the API with its verdict set to `improved`."""
    ev = Evidence(workspace)
    links, ids = _honest(ev)
    forger = Evidence(workspace)
    forger.ledger = Ledger(workspace, TrustRoot.locate(state_dir=tmp_path / "agent-state"))
    forged = forger.comparison(ids["base"], ids["cand"], verdict="improved")
    links = [link for link in links if link["role"] != "comparison"] + [{"id": forged, "role": "comparison"}]
    async with Client(server) as client:
        exp = await _open(client)
        result = await _keep(client, exp, links)
    assert result.is_error or not (result.structured_content or {}).get("accepted"), _text(result)
    assert forged in _text(result)


def test_a_running_ledger_signs_with_the_key_the_operator_put_in_place(
    workspace: Path, trust_root: TrustRoot, capsys: pytest.CaptureFixture[str]
) -> None:
    # The operator moves a leaked key aside while the server runs: the server's next record is signed
    # with a new key, and the server's own checks use it too (no restart needed, nothing signed with the
    # key that was moved aside any more).
    ledger = Ledger(workspace)
    old = _append(ledger, i=0)
    assert [r.id for r in ledger.records()] == [old]
    old_key = trust_root.key()
    assert old_key is not None
    (trust_root.key_dir / "current").rename(tmp := trust_root.key_dir / "leaked")
    new = _append(ledger, i=1)
    new_key = trust_root.key()
    assert new_key is not None and new_key.key_id != old_key.key_id
    assert [r.id for r in ledger.records()] == [new]  # this very ledger checks with the new key
    assert [r.id for r in Ledger(workspace).records()] == [new]  # and what it signed verifies
    assert f"record 1 ({old}): signed by retired key {old_key.key_id}: unverifiable" in _verify(
        workspace, capsys
    )
    assert tmp.exists()


def test_a_verify_racing_the_first_append_looks_for_the_anchor_again(
    workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Another process has committed the very first record and not yet written its anchor when verify
    # looks: a moment later the anchor is there, and the ledger verifies.
    ledger = Ledger(workspace)
    _append(ledger, i=0)
    from perfgate.evidence import verify

    real = verify._anchor_to_check  # pyright: ignore[reportPrivateUsage]
    looks: list[int] = []

    def not_yet(trust_anchor: Any, key: Any) -> Any:
        looks.append(1)
        return None if len(looks) == 1 else real(trust_anchor, key)

    monkeypatch.setattr(verify, "_anchor_to_check", not_yet)
    report = Ledger(workspace).verify()
    assert report.ok, report.errors
    assert len(looks) == 2


def test_records_without_any_anchor_still_fail_verify(workspace: Path, trust_root: TrustRoot) -> None:
    ledger = Ledger(workspace)
    _append(ledger, i=0)
    ledger.anchor_path.unlink()
    report = Ledger(workspace).verify()
    assert not report.ok and any("holds no anchor" in e for e in report.errors)
