"""The harness side of sample audits: what the recorders write, and how they number epochs."""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from perfgate.audit import AuditPolicy, audit_path, read_observed
from perfgate.harness.samples import RecordingDataset, RecordingSampler, SampleLog, sample_log_path


def lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_sample_log_writes_typed_ids_one_line_each(tmp_path: Path) -> None:
    log = SampleLog(tmp_path, rank=3, worker=1, session=42)
    log.record([1, np.int64(2), "3", 'quote " and \\ and é'], epoch=5, step=9)
    log.record(np.array([7, 8]), epoch=6)
    log.record([], epoch=7)
    log.close()
    assert log.path == sample_log_path(tmp_path, 3, 1) == tmp_path / "samples-r00003-w001.jsonl"
    rows = lines(log.path)
    assert [r["sample_id"] for r in rows] == [1, 2, "3", 'quote " and \\ and é', 7, 8]
    assert rows[0] == {"sample_id": 1, "epoch": 5, "rank": 3, "worker": 1, "session": 42, "step": 9}
    assert "step" not in rows[-1]
    assert read_observed(tmp_path).ids.counts_by_type() == (4, 2)


@pytest.mark.parametrize("bad", [True, 1.5, None, (1, 2)])
def test_sample_log_refuses_ids_that_are_not_ints_or_strings(tmp_path: Path, bad: Any) -> None:
    with pytest.raises(TypeError, match="ints or strings"):
        SampleLog(tmp_path, rank=0).record([bad], epoch=0)


def test_a_copied_log_reopens_its_file_and_appends(tmp_path: Path) -> None:
    log = SampleLog(tmp_path, rank=0)
    log.record([1], epoch=0)
    copy = pickle.loads(pickle.dumps(log))
    copy.record([2], epoch=0)
    log.record([3], epoch=0)
    copy.close()
    log.close()
    assert [r["sample_id"] for r in lines(log.path)] == [1, 2, 3]


def test_the_sampler_numbers_passes_from_set_epoch_or_by_counting(tmp_path: Path) -> None:
    class Inner:
        def __init__(self) -> None:
            self.epochs: list[int] = []

        def set_epoch(self, epoch: int) -> None:
            self.epochs.append(epoch)

        def __iter__(self) -> Any:
            return iter([10, 11, 12])

        def __len__(self) -> int:
            return 3

    inner = Inner()
    sampler = RecordingSampler(inner, tmp_path, rank=1, start_epoch=4)
    assert len(sampler) == 3 and sampler.rank == 1
    assert list(sampler) == [10, 11, 12]  # epoch 4 (start_epoch)
    list(sampler)  # set_epoch never called: counting, epoch 5
    sampler.set_epoch(9)
    list(sampler)  # epoch 9
    list(sampler)  # set_epoch not called again after it was: epoch 9 read again, as pass 1
    assert inner.epochs == [9]
    rows = lines(sample_log_path(tmp_path, 1))
    assert [(r["epoch"], r["pass"]) for r in rows] == [(4, 0)] * 3 + [(5, 0)] * 3 + [(9, 0)] * 3 + [
        (9, 1)
    ] * 3
    report = audit_path(tmp_path, AuditPolicy(world_size=1), expected_range=(10, 13))
    (repeated,) = [f for f in report.findings if f.kind == "repeated_pass"]
    assert repeated.severity == "error" and repeated.epochs == [9]
    assert repeated.message.startswith("epoch 9, rank 1: the loader was read in full 2 times in this epoch")
    assert {r["worker"] for r in rows} == {-1}


def test_an_abandoned_pass_writes_what_it_handed_out(tmp_path: Path) -> None:
    sampler = RecordingSampler(list(range(5000)), tmp_path, rank=0)
    it = iter(sampler)
    taken = [next(it) for _ in range(1500)]
    assert len(lines(sample_log_path(tmp_path, 0))) == 1024  # one full batch so far
    del it  # the loader drops its iterator: the generator closes and writes the rest
    assert [r["sample_id"] for r in lines(sample_log_path(tmp_path, 0))] == taken


def test_the_sampler_takes_its_rank_from_the_wrapped_sampler_or_the_launcher(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    class Ranked(list[int]):
        rank = 6

    assert RecordingSampler(Ranked([1]), tmp_path).rank == 6
    monkeypatch.setenv("RANK", "2")
    assert RecordingSampler([1], tmp_path).rank == 2


def test_the_dataset_wrapper_records_fetches_in_the_loading_process(tmp_path: Path) -> None:
    class Squares:
        def __init__(self) -> None:
            self.epoch = -1

        def __getitem__(self, index: int) -> int:
            return index * index

        def __len__(self) -> int:
            return 10

        def set_epoch(self, epoch: int) -> None:
            self.epoch = epoch

    inner = Squares()
    data = RecordingDataset(inner, tmp_path, rank=2, sample_id=lambda index, item: f"sq{item}")
    assert len(data) == 10
    data.set_epoch(3)
    assert inner.epoch == 3
    assert data[4] == 16
    assert data.__getitems__([1, 2]) == [1, 4]
    rows = lines(sample_log_path(tmp_path, 2, -1))
    assert [(r["sample_id"], r["epoch"], r["worker"]) for r in rows] == [
        ("sq16", 3, -1),
        ("sq1", 3, -1),
        ("sq4", 3, -1),
    ]


def test_a_dataset_that_follows_a_sampler_takes_its_epochs_and_its_place(tmp_path: Path) -> None:
    sampler = RecordingSampler(list(range(4)), tmp_path, rank=0)
    data = RecordingDataset(list(range(100, 104)), tmp_path, sampler=sampler)
    for epoch in range(2):
        sampler.set_epoch(epoch)
        assert data.__getitems__(list(sampler)) == [100, 101, 102, 103]
    rows = lines(sample_log_path(tmp_path, 0, -1))
    assert [r["epoch"] for r in rows] == [0] * 4 + [1] * 4  # recorded once, by the dataset
    assert len({r["session"] for r in rows}) == 1
    assert data.__getstate__()["_logs"] == {}  # loader workers open their own files


def test_a_resumed_launch_says_so_and_the_audit_sees_its_replays(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PERFGATE_LAUNCH_ID", "1")
    first = SampleLog(tmp_path, rank=0)
    first.record(range(6), epoch=0)
    monkeypatch.setenv("PERFGATE_LAUNCH_ID", "2")  # the next process
    second = SampleLog(tmp_path, rank=0, resumed=True)
    assert (first.session, second.session) == (1, 2)
    second.record(range(10), epoch=0)  # restarted the epoch from the beginning
    rows = lines(second.path)
    assert [r.get("restart", False) for r in rows[6:8]] == [True, False]  # its first record only
    report = audit_path(tmp_path, AuditPolicy(world_size=1), expected_range=(0, 10))
    assert {f.kind: f.count for f in report.findings if f.severity == "error"} == {"resume_replayed": 6}


def test_repeated_launches_into_one_folder_are_new_runs_not_resumes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for launch in (1, 2, 3):  # three benchmark launches of the same job, each from step 0
        monkeypatch.setenv("PERFGATE_LAUNCH_ID", str(launch))
        log = SampleLog(tmp_path, rank=0)
        for step in range(5):
            log.record(range(step * 2, step * 2 + 2), epoch=0, step=step)
        log.close()
    report = audit_path(tmp_path, AuditPolicy(world_size=1), expected_range=(0, 10))
    assert report.status == "passed", report.findings
    assert report.records == 30 and report.epochs[0].records == 10 and report.epochs[0].duplicates == 0
    (earlier,) = [f for f in report.findings if f.kind == "earlier_runs"]
    assert earlier.severity == "info" and earlier.count == 2
    assert earlier.message.startswith("2 earlier launch(es) (20 records, ranks [0]) started the run over")


def test_the_launch_id_is_shared_with_processes_started_later(monkeypatch: pytest.MonkeyPatch) -> None:
    from perfgate.harness.samples import launch_id

    monkeypatch.delenv("PERFGATE_LAUNCH_ID", raising=False)
    first = launch_id()
    assert launch_id() == first
    import os

    assert os.environ["PERFGATE_LAUNCH_ID"] == str(first)  # loader workers inherit it


def test_a_peek_keeps_the_epoch_and_counts_the_next_pass(tmp_path: Path) -> None:
    sampler = RecordingSampler(list(range(6)), tmp_path, rank=0)
    for epoch in range(2):
        sampler.set_epoch(epoch)
        peek = iter(sampler)
        next(peek)
        del peek  # next(iter(loader)): the peek's iterator is dropped part-way
        list(sampler)  # the real pass
    rows = lines(sample_log_path(tmp_path, 0))
    assert [(r["epoch"], r["pass"]) for r in rows] == [(0, 0)] + [(0, 1)] * 6 + [(1, 0)] + [(1, 1)] * 6
    never_announced = RecordingSampler(list(range(6)), tmp_path / "b", rank=0)
    peek = iter(never_announced)
    next(peek)
    del peek
    list(never_announced)  # after an abandoned pass: the same epoch, next pass
    list(never_announced)  # after a finished one, without set_epoch ever: the next epoch
    rows = lines(sample_log_path(tmp_path / "b", 0))
    assert [(r["epoch"], r["pass"]) for r in rows] == [(0, 0)] + [(0, 1)] * 6 + [(1, 0)] * 6
