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
    sampler.set_epoch(9)
    list(sampler)  # epoch 9
    list(sampler)  # set_epoch not called again: epoch 10
    assert inner.epochs == [9]
    rows = lines(sample_log_path(tmp_path, 1))
    assert [r["epoch"] for r in rows] == [4] * 3 + [9] * 3 + [10] * 3
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


def test_a_new_process_is_a_new_session_and_the_audit_sees_the_restart(tmp_path: Path) -> None:
    first = SampleLog(tmp_path, rank=0)
    first.record(range(6), epoch=0)
    second = SampleLog(tmp_path, rank=0)
    assert second.session != first.session
    second.record(range(10), epoch=0)  # restarted the epoch from the beginning
    report = audit_path(tmp_path, AuditPolicy(world_size=1), expected_range=(0, 10))
    assert {f.kind: f.count for f in report.findings if f.severity == "error"} == {"resume_replayed": 6}
