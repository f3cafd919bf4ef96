"""The evidence ledger: append-only, hash-chained, concurrent and crash safe."""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import queue as queue_module
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from _races import open_twice_after_both_looked
from perfgate.cli import main as cli_main
from perfgate.evidence import EvidenceDraft, EvidenceState, Ledger
from perfgate.evidence.signing import RecordSigner


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


@pytest.mark.parametrize("text", ["", "zz", "00" * 31])
def test_verify_fails_when_the_signing_key_file_is_corrupt(
    workspace: Path, text: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A key file that holds no key is damage to the trust root, not a reader without access to it: verify
    reports an error and the CLI exits 1 naming the corrupt key (it used to say the key was "not readable
    here" and exit 0 with every record unverified)."""
    ledger = Ledger(workspace)
    _append(ledger, value=1)
    (ledger.trust.key_dir / "current").write_text(text)
    report = Ledger(workspace).verify()
    assert not report.ok and any("is corrupt" in e for e in report.errors), report
    capsys.readouterr()
    assert cli_main(["ledger", "verify", "--workspace", str(workspace)]) == 1
    out, err = capsys.readouterr()
    assert "is corrupt" in err and "not readable here" not in err
    assert "FAILED" in out


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


@pytest.mark.parametrize("size", [0, 1, 4095, 4096, 4097, 3 * 4096 + 5])
def test_file_digests_are_exact_whatever_the_buffer(tmp_path: Path, size: int) -> None:
    """The buffer follows the file's size (and ``chunk_bytes``): the digest and size are the file's at every
    boundary, an empty file included."""
    import hashlib

    from perfgate.evidence import file_digest

    data = bytes(i % 251 for i in range(size))
    path = tmp_path / "f.bin"
    path.write_bytes(data)
    want = (hashlib.sha256(data).hexdigest(), size)
    assert file_digest(path) == want
    assert file_digest(path, chunk_bytes=4096) == want
    assert file_digest(path, chunk_bytes=1) == want


def test_a_recorded_artifact_holds_the_digest_and_size_of_its_bytes(workspace: Path) -> None:
    import hashlib

    ledger = Ledger(workspace)
    data = os.urandom(70_001)
    record = ledger.get(_append(ledger, artifact=data))
    assert record is not None
    (artifact,) = record.artifacts
    assert (artifact.sha256, artifact.size_bytes) == (hashlib.sha256(data).hexdigest(), len(data))


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
    # Spawned writers import perfgate afresh; on a busy machine that alone can take a minute, so the wait
    # is bounded generously and a writer that died is reported at once instead of as a timeout.
    acknowledged: list[str] = []
    deadline = time.monotonic() + 600
    while len(acknowledged) < 75:
        try:
            acknowledged.append(queue.get(timeout=2))
        except queue_module.Empty:
            dead = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
            assert not dead, f"a writer failed with exit code {dead[0]}"
            assert time.monotonic() < deadline, f"only {len(acknowledged)} of 75 appends acknowledged"
    for p in procs:
        p.join(timeout=120)
        assert p.exitcode == 0
    ledger = Ledger(workspace)
    assert sorted(r.id for r in ledger.records()) == sorted(acknowledged)
    assert ledger.verify().ok


def test_opening_a_new_ledger_waits_out_another_connections_write_lock(workspace: Path) -> None:
    # A process that opens a fresh ledger while another holds its write lock (as when several start at
    # once and one is already creating the schema) must wait, not fail: SQLite refuses the switch to WAL
    # at once, without its busy handler.
    db_path = workspace / ".perfgate" / "ledger.db"
    db_path.parent.mkdir(parents=True)
    other = sqlite3.connect(db_path, isolation_level=None, check_same_thread=False)
    other.execute("CREATE TABLE unrelated (x)")
    other.execute("BEGIN IMMEDIATE")
    release = threading.Timer(0.3, lambda: other.execute("COMMIT"))
    release.start()
    try:
        ledger = Ledger(workspace)
        assert ledger.db_path == db_path
        _append(ledger)
        assert len(ledger.records()) == 1
    finally:
        release.join()
        other.close()


def _opener(workspace: str, barrier: Any, queue: mp.Queue) -> None:  # type: ignore[type-arg]
    barrier.wait()
    try:
        Ledger(Path(workspace))
        queue.put("ok")
    except Exception as exc:  # noqa: BLE001 - reported to the parent, which names it
        queue.put(repr(exc))


def test_processes_opening_a_new_ledger_at_once_all_succeed(tmp_path: Path) -> None:
    ctx = mp.get_context("fork")
    for trial in range(8):
        workspace = tmp_path / f"ws{trial}"
        workspace.mkdir()
        barrier = ctx.Barrier(4)
        queue = ctx.Queue()
        procs = [ctx.Process(target=_opener, args=(str(workspace), barrier, queue)) for _ in range(4)]
        for p in procs:
            p.start()
        outcomes = [queue.get(timeout=600) for _ in procs]
        for p in procs:
            p.join(timeout=120)
        assert outcomes == ["ok"] * 4, outcomes


_KILLED_WRITER = """
import sys
import time
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


def test_one_connection_per_process_keeps_the_wal_and_serves_threads(workspace: Path) -> None:
    """Appends reuse the ledger's connection (the WAL is not checkpointed and deleted per record), and
    threads sharing one `Ledger` lose nothing and keep the chain whole."""
    import threading

    ledger = Ledger(workspace)
    _append(ledger, i=-1)
    wal = ledger.db_path.with_name(ledger.db_path.name + "-wal")
    assert wal.exists()  # a connection closed per record would have checkpointed and removed it
    acknowledged: list[str] = []
    errors: list[BaseException] = []

    def writer(n: int) -> None:
        try:
            for i in range(n):
                acknowledged.append(_append(ledger, i=i, thread=threading.get_ident()))
                assert ledger.get(acknowledged[-1]) is not None
        except BaseException as exc:  # noqa: BLE001  (reported below)
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(15,)) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors, errors
    assert wal.exists()
    fresh = Ledger(workspace)
    assert {r.id for r in fresh.records()} >= set(acknowledged) and len(fresh.records()) == 61
    assert [r.seq for r in fresh.records()] == list(range(1, 62))
    report = fresh.verify()
    assert report.ok, report.errors


def test_a_database_deleted_under_a_live_ledger_loses_no_later_record(
    workspace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A long-lived connection must not keep writing into a file that is gone from the folder."""
    ledger = Ledger(workspace)
    _append(ledger, i=0)
    for suffix in ("", "-wal", "-shm"):
        ledger.db_path.with_name(ledger.db_path.name + suffix).unlink(missing_ok=True)
    later = _append(ledger, i=1)
    assert Ledger(workspace).get(later) is not None  # written into the file now on disk
    assert cli_main(["ledger", "verify", "--workspace", str(workspace)]) == 1
    assert "anchored another ledger database here before" in capsys.readouterr().out


def test_a_torn_anchor_slot_falls_back_to_the_previous_anchor(workspace: Path) -> None:
    """A power cut mid-write can tear the slot being written; the other slot still holds the anchor
    one record behind, which verify accepts (the ledger is never shorter than it)."""
    ledger = Ledger(workspace)
    _append(ledger, i=0)
    _append(ledger, i=1)
    newest = ledger.anchor()
    assert newest is not None and newest["seq"] == 2
    data = bytearray(ledger.anchor_path.read_bytes())
    slot = 8192
    index = next(i for i in range(2) if b'"seq":2,' in data[i * slot : (i + 1) * slot])
    data[index * slot + 40 : index * slot + 60] = b"\0" * 20  # torn
    ledger.anchor_path.write_bytes(bytes(data))
    anchor = Ledger(workspace).anchor()
    assert anchor is not None and anchor["seq"] == 1
    report = Ledger(workspace).verify()
    assert report.ok, report.errors
    _append(ledger, i=2)  # the next append rewrites the torn slot
    anchor = Ledger(workspace).anchor()
    assert anchor is not None and anchor["seq"] == 3


def test_head_is_never_written_through_a_planted_link(workspace: Path, tmp_path: Path) -> None:
    ledger = Ledger(workspace)
    _append(ledger, i=0)
    outside = tmp_path / "outside.txt"
    outside.write_text("operator data\n")
    ledger.head_path.unlink()
    ledger.head_path.symlink_to(outside)
    _append(ledger, i=1)
    assert outside.read_text() == "operator data\n"
    assert not ledger.head_path.is_symlink()
    ledger.head_path.unlink()
    os.link(outside, ledger.head_path)  # a second hard link: writing in place would change outside.txt
    _append(ledger, i=2)
    assert outside.read_text() == "operator data\n"
    assert ledger.head_path.read_text().split()[0] == "3"
    assert ledger.verify().ok


def test_an_anchor_written_by_an_older_version_is_still_checked(workspace: Path) -> None:
    ledger = Ledger(workspace)
    _append(ledger, i=0)
    _append(ledger, i=1)
    anchor = ledger.anchor()
    assert anchor is not None
    legacy = ledger.anchor_path.with_name("anchor.json")
    legacy.write_text(json.dumps(anchor))
    ledger.anchor_path.unlink()
    assert Ledger(workspace).verify().ok
    _force(ledger, "DELETE FROM evidence WHERE seq = 2")
    assert any("anchored record 2" in e for e in Ledger(workspace).verify().errors)


def test_ledgers_dropped_release_their_connection(tmp_path: Path) -> None:
    """One connection per process and database, but only while some `Ledger` uses it: a process that
    opens many workspaces (a test run, a long-lived operator shell) does not keep their files open."""
    import gc

    def open_fds() -> int:
        return len(os.listdir("/proc/self/fd"))

    if not Path("/proc/self/fd").is_dir():
        pytest.skip("needs /proc")
    before = open_fds()
    for i in range(30):
        ws = tmp_path / f"ws{i}"
        ws.mkdir()
        _append(Ledger(ws), i=i)
    gc.collect()
    assert open_fds() - before < 10
    first, second = Ledger(tmp_path / "ws0"), Ledger(tmp_path / "ws0")
    assert first._shared is second._shared  # one connection for both


def test_an_append_racing_verify_is_not_a_removed_tail(
    workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A record committed while verify checks the records it read (another tool call, another process)
    moves HEAD and the anchor past them: that is not a removed tail or a truncated ledger (before, verify
    read both after the records and failed, and with it the keep decision's ledger_integrity gate)."""
    ledger = Ledger(workspace)
    for i in range(3):
        _append(ledger, value=i)
    real = RecordSigner.record_problem
    raced: list[str] = []

    def record_problem(self: RecordSigner, *args: Any) -> str | None:
        if not raced:  # once verify holds its read of the records: another append commits
            raced.append(_append(Ledger(workspace), value=99))
        return real(self, *args)

    monkeypatch.setattr(RecordSigner, "record_problem", record_problem)
    report = ledger.verify()
    assert raced and report.ok, report.errors
    assert report.records == 3
    monkeypatch.undo()
    assert ledger.verify().records == 4


def test_processes_opening_an_unsigned_ledger_at_once_both_open_it(
    workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A ledger from before records were signed gains its key_id and mac columns once: before, two
    processes opening it at once both found them missing, and the second one's ALTER TABLE failed
    ("duplicate column name"), so it could not open its ledger."""
    import contextlib

    from perfgate.evidence._database import SCHEMA, Connection

    db = workspace / ".perfgate" / "ledger.db"
    db.parent.mkdir()
    with contextlib.closing(sqlite3.connect(db)) as old:
        old.executescript(
            SCHEMA.replace("    key_id TEXT,\n    mac TEXT\n", "").replace(
                "hash TEXT NOT NULL,", "hash TEXT NOT NULL"
            )
        )
        assert {r[1] for r in old.execute("PRAGMA table_info(evidence)")} & {"key_id", "mac"} == set()

    def open_ledger() -> str:  # what a process opening the ledger does: a connection of its own
        with Connection(db).use():
            pass
        return "ok"

    # Both look for the columns before either adds them.
    assert open_twice_after_both_looked(monkeypatch, "evidence", open_ledger) == ["ok", "ok"]
    ledger = Ledger(workspace)
    _append(ledger, value=1)
    assert ledger.verify().ok
