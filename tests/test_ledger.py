"""The evidence ledger: append-only, hash-chained, concurrent and crash safe."""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from perfgate.cli import main as cli_main
from perfgate.evidence import EvidenceDraft, EvidenceState, Ledger


def _append(ledger: Ledger, tool: str = "t", artifact: bytes | None = None, **result: object) -> str:
    evidence_id = Ledger.new_id()
    names: list[str] = []
    if artifact is not None:
        (ledger.artifact_dir(evidence_id) / "data.bin").write_bytes(artifact)
        names.append("data.bin")
    ledger.append(
        EvidenceDraft(
            id=evidence_id, tool=tool, state=EvidenceState.EXECUTED, result=dict(result), artifact_names=names
        )
    )
    return evidence_id


def test_records_chain_and_verify(workspace: Path) -> None:
    ledger = Ledger(workspace)
    ids = [_append(ledger, value=i, artifact=bytes([i]) * 10) for i in range(5)]
    records = ledger.records()
    assert [r.id for r in records] == ids
    assert [r.seq for r in records] == [1, 2, 3, 4, 5]
    assert records[1].prev_hash == records[0].hash
    report = ledger.verify()
    assert report.ok, report.errors
    assert report.records == 5
    assert cli_main(["ledger", "verify", "--workspace", str(workspace)]) == 0


def test_the_database_refuses_updates_and_deletes(workspace: Path) -> None:
    ledger = Ledger(workspace)
    _append(ledger, value=1)
    with sqlite3.connect(ledger.db_path) as conn:
        with pytest.raises(sqlite3.IntegrityError, match="append-only"):
            conn.execute("UPDATE evidence SET state = 'passed'")
        with pytest.raises(sqlite3.IntegrityError, match="append-only"):
            conn.execute("DELETE FROM evidence")


def _force(ledger: Ledger, sql: str, *params: object) -> None:
    """What a determined editor does: drop the guard triggers, then edit."""
    with sqlite3.connect(ledger.db_path) as conn:
        conn.execute("DROP TRIGGER evidence_no_update")
        conn.execute("DROP TRIGGER evidence_no_delete")
        conn.execute(sql, params)


def test_an_edited_record_body_is_detected(workspace: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ledger = Ledger(workspace)
    _append(ledger, speedup=1.01)
    target = _append(ledger, speedup=1.02)
    _append(ledger, speedup=1.03)
    body = json.loads(ledger.get(target).model_dump_json())  # type: ignore[union-attr]
    body["result"]["speedup"] = 2.5
    del body["hash"]
    _force(ledger, "UPDATE evidence SET body = ? WHERE id = ?", json.dumps(body, sort_keys=True), target)
    report = ledger.verify()
    assert not report.ok
    assert any(target in e and "hash mismatch" in e for e in report.errors)
    assert cli_main(["ledger", "verify", "--workspace", str(workspace)]) == 1
    assert "FAILED" in capsys.readouterr().out


def test_an_edited_state_column_is_detected(workspace: Path) -> None:
    ledger = Ledger(workspace)
    target = _append(ledger)
    _force(ledger, "UPDATE evidence SET state = 'passed' WHERE id = ?", target)
    assert any("indexed columns" in e for e in ledger.verify().errors)


def test_a_removed_record_and_a_truncated_tail_are_detected(workspace: Path) -> None:
    ledger = Ledger(workspace)
    ids = [_append(ledger, i=i) for i in range(4)]
    _force(ledger, "DELETE FROM evidence WHERE id = ?", ids[1])
    assert any("removed" in e for e in ledger.verify().errors)

    other = workspace / "other"
    other.mkdir()
    ledger2 = Ledger(other)
    ids2 = [_append(ledger2, i=i) for i in range(3)]
    _force(ledger2, "DELETE FROM evidence WHERE id = ?", ids2[-1])
    assert any("truncated" in e for e in ledger2.verify().errors)


def test_an_artifact_edited_on_disk_is_detected(workspace: Path) -> None:
    ledger = Ledger(workspace)
    target = _append(ledger, artifact=b"step times")
    path = ledger.artifact_root / target / "data.bin"
    path.write_bytes(b"better step times")
    report = ledger.verify()
    assert not report.ok
    assert any("modified" in e for e in report.errors)
    path.unlink()
    assert any("missing" in e for e in ledger.verify().errors)


def test_a_missing_artifact_cannot_be_recorded(workspace: Path) -> None:
    ledger = Ledger(workspace)
    with pytest.raises(FileNotFoundError):
        ledger.append(
            EvidenceDraft(id="ev-x", tool="t", state=EvidenceState.EXECUTED, artifact_names=["nope"])
        )
    assert ledger.records() == []


def _writer(workspace: str, count: int, queue: mp.Queue) -> None:  # type: ignore[type-arg]
    ledger = Ledger(Path(workspace))
    for i in range(count):
        queue.put(_append(ledger, pid=os.getpid(), i=i))


def test_concurrent_processes_lose_no_record(workspace: Path) -> None:
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_writer, args=(str(workspace), 25, queue)) for _ in range(3)]
    for p in procs:
        p.start()
    acknowledged = [queue.get(timeout=60) for _ in range(75)]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    ledger = Ledger(workspace)
    assert sorted(r.id for r in ledger.records()) == sorted(acknowledged)
    assert ledger.verify().ok


_KILLED_WRITER = """
import sys
from pathlib import Path
from perfgate.evidence import EvidenceDraft, EvidenceState, Ledger
ledger = Ledger(Path(sys.argv[1]))
i = 0
while True:
    eid = Ledger.new_id()
    folder = ledger.artifact_dir(eid)
    (folder / "a.txt").write_text("x" * 4096)
    ledger.append(EvidenceDraft(id=eid, tool="t", state=EvidenceState.EXECUTED, result={"i": i}, artifact_names=["a.txt"]))
    print(eid, flush=True)
    i += 1
"""


def test_a_writer_killed_mid_append_leaves_a_ledger_that_verifies(workspace: Path) -> None:
    with subprocess.Popen(
        [sys.executable, "-c", _KILLED_WRITER, str(workspace)], stdout=subprocess.PIPE, text=True
    ) as proc:
        assert proc.stdout is not None
        acknowledged = [proc.stdout.readline().strip() for _ in range(40)]
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    ledger = Ledger(workspace)
    present = {r.id for r in ledger.records()}
    assert set(acknowledged) <= present
    report = ledger.verify()
    assert report.ok, report.errors
