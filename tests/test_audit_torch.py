"""audit_samples on ids recorded from real DistributedSampler + DataLoader runs (4 ranks simulated)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from perfgate.audit import AuditPolicy, AuditReport, Finding, audit_path
from perfgate.harness.samples import RecordingDataset, RecordingSampler, SampleLog

torch = pytest.importorskip("torch")
from torch.utils.data import DataLoader, Dataset, DistributedSampler  # noqa: E402

N, R, EPOCHS, BATCH, WORKERS = 103, 4, 3, 8, 2
PAD = -N % R  # DistributedSampler repeats this many ids per epoch (drop_last=False)


class Ids(Dataset[int]):
    """Sample i is the integer i."""

    def __len__(self) -> int:
        return N

    def __getitem__(self, index: int) -> int:
        return index


def distributed(rank: int, shard: int | None = None) -> Any:
    """Rank `rank`'s sampler; `shard` overrides the rank it is built with (the bug under test)."""
    return DistributedSampler(Ids(), num_replicas=R, rank=rank if shard is None else shard, seed=7)


def shard_of(rank: int, epoch: int) -> list[int]:
    sampler = distributed(rank)
    sampler.set_epoch(epoch)
    return list(sampler)


def make_loader(sampler: Any, dataset: Any = None) -> Any:
    return DataLoader(
        Ids() if dataset is None else dataset,
        batch_size=BATCH,
        sampler=sampler,
        num_workers=WORKERS,
        persistent_workers=True,
    )


def run_ranks(
    out: Path, *, set_epoch: bool = True, ranks: range = range(R), shard: dict[int, int] | None = None
) -> None:
    for rank in ranks:
        sampler = RecordingSampler(distributed(rank, (shard or {}).get(rank)), out, rank=rank)
        loader = make_loader(sampler)
        for epoch in range(EPOCHS):
            if set_epoch:
                sampler.set_epoch(epoch)
            for _ in loader:
                pass


def audit(out: Path, **policy: Any) -> AuditReport:
    settings: dict[str, Any] = {"world_size": R, "allow_padding_repeats": True, **policy}
    return audit_path(out, AuditPolicy(**settings), expected_range=(0, N))


def by_kind(report: AuditReport) -> dict[str, Finding]:
    return {f.kind: f for f in report.findings}


def errors(report: AuditReport) -> dict[str, int]:
    return {f.kind: f.count for f in report.findings if f.severity == "error"}


def test_correct_distributed_loading_passes_with_exact_padding(tmp_path: Path) -> None:
    run_ranks(tmp_path)
    report = audit(tmp_path)
    assert report.status == "passed", report.findings
    assert report.coverage == "checked"
    assert errors(report) == {}
    assert [e.epoch for e in report.epochs] == list(range(EPOCHS))
    for epoch in report.epochs:
        assert (epoch.records, epoch.unique, epoch.missing, epoch.extra) == (N + PAD, N, 0, 0)
        assert epoch.duplicates == epoch.padding_repeats == PAD
        assert [c.records for c in epoch.records_per_rank] == [(N + PAD) // R] * R
    assert len(list(tmp_path.glob("samples-r*-wmain.jsonl"))) == R


def test_padding_is_an_error_unless_allowed_and_the_message_says_so(tmp_path: Path) -> None:
    run_ranks(tmp_path)
    report = audit(tmp_path, allow_padding_repeats=False)
    assert errors(report) == {"duplicate_records": PAD * EPOCHS}
    assert "allow_padding_repeats=true" in by_kind(report)["duplicate_records"].message


def test_forgetting_set_epoch_repeats_each_ranks_order_and_is_found(tmp_path: Path) -> None:
    run_ranks(tmp_path, set_epoch=False)
    report = audit(tmp_path)
    assert report.status == "failed"
    # every rank, in every epoch after the first
    assert errors(report) == {"order_repeated": R * (EPOCHS - 1)}
    assert by_kind(report)["order_repeated"].ranks == list(range(R))
    assert "set_epoch" in by_kind(report)["order_repeated"].message
    assert all(e.missing == 0 for e in report.epochs)


def test_an_order_fixed_on_purpose_passes_with_shuffle_off(tmp_path: Path) -> None:
    run_ranks(tmp_path, set_epoch=False)
    assert audit(tmp_path, shuffle=False).status == "passed"


def test_a_dropped_rank_shard_is_found_with_exact_counts(tmp_path: Path) -> None:
    run_ranks(tmp_path, ranks=range(R - 1))
    report = audit(tmp_path)
    assert report.status == "failed"
    lost = []
    for epoch in range(EPOCHS):
        seen = {i for r in range(R - 1) for i in shard_of(r, epoch)}
        lost.append(N - len(seen))
        assert report.epochs[epoch].missing == N - len(seen)
        assert set(report.epochs[epoch].examples.missing) <= set(shard_of(R - 1, epoch))
        assert report.epochs[epoch].records_per_rank[R - 1].records == 0
    found = errors(report)
    assert found["missing_ids"] == sum(lost)
    assert found["rank_without_records"] == EPOCHS
    assert by_kind(report)["rank_without_records"].ranks == [R - 1]


def test_a_duplicated_shard_is_found_with_exact_counts(tmp_path: Path) -> None:
    run_ranks(tmp_path, shard={1: 0})  # rank 1 built its sampler with rank=0
    report = audit(tmp_path)
    assert report.status == "failed"
    total_repeats = total_missing = 0
    for epoch in range(EPOCHS):
        counts = Counter(i for r in (0, 0, 2, 3) for i in shard_of(r, epoch))
        repeats = sum(c - 1 for c in counts.values())
        stats = report.epochs[epoch]
        assert stats.duplicates == repeats
        assert stats.missing == N - len(counts)
        assert stats.cross_owner_duplicates == sum(1 for c in counts.values() if c > 1)
        owners = {(o.rank, o.worker) for d in stats.examples.duplicates for o in d.owners}
        assert {(0, -1), (1, -1)} <= owners
        total_repeats += repeats - stats.padding_repeats
        total_missing += N - len(counts)
    found = errors(report)
    assert found["duplicate_records"] == total_repeats
    assert found["missing_ids"] == total_missing


def test_dataset_recording_names_the_loader_worker_and_follows_the_samplers_epochs(tmp_path: Path) -> None:
    for rank in range(R):
        sampler = RecordingSampler(distributed(rank), tmp_path, rank=rank)
        loader = make_loader(sampler, RecordingDataset(Ids(), tmp_path, sampler=sampler))
        for epoch in range(EPOCHS):
            sampler.set_epoch(epoch)
            for _ in loader:
                pass
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files == [f"samples-r{r:05d}-w{w:03d}.jsonl" for r in range(R) for w in range(WORKERS)]
    rows = [json.loads(line) for p in tmp_path.iterdir() for line in p.read_text().splitlines()]
    assert Counter(row["epoch"] for row in rows) == {e: N + PAD for e in range(EPOCHS)}
    report = audit(tmp_path)
    assert report.status == "passed", report.findings
    assert all(e.unique == N and e.padding_repeats == PAD for e in report.epochs)


class Process:
    """One training process of one rank: its sampler, its loader (persistent workers), its log."""

    def __init__(self, out: Path, rank: int, session: int) -> None:
        self.sampler = distributed(rank)
        self.loader = make_loader(self.sampler)
        self.log = SampleLog(out, rank=rank, session=session)

    def train(self, epoch: int, *, first_step: int, stop_after: int | None = None, skip: int = 0) -> int:
        """Record the batches one epoch consumes; returns the next global step."""
        self.sampler.set_epoch(epoch)
        step = first_step
        for i, batch in enumerate(self.loader):
            if i < skip:
                continue
            if stop_after is not None and step >= stop_after:
                break
            self.log.record(batch, epoch=epoch, step=step)
            step += 1
        return step


def resume_run(out: Path, *, skip_consumed: bool) -> int:
    """Epochs 0-1 complete; epoch 2 crashes after `crash` steps and resumes from checkpoint step `ckpt`."""
    steps_per_epoch = -(-(N + PAD) // R // BATCH)
    ckpt, crash = 2 * steps_per_epoch + 1, 2 * steps_per_epoch + 3
    for rank in range(R):
        first = Process(out, rank, session=1)
        step = 0
        for epoch in range(EPOCHS - 1):
            step = first.train(epoch, first_step=step)
        first.train(EPOCHS - 1, first_step=step, stop_after=crash)
        consumed = ckpt - step
        restarted = Process(out, rank, session=2)
        restarted.train(EPOCHS - 1, first_step=ckpt, skip=consumed if skip_consumed else 0)
    return ckpt - 2 * steps_per_epoch


def test_a_resume_that_restarts_the_epoch_replays_exactly_the_checkpointed_samples(tmp_path: Path) -> None:
    consumed_steps = resume_run(tmp_path, skip_consumed=False)
    report = audit(tmp_path)
    last = report.epochs[-1]
    # each rank replays the batches it had consumed before the checkpoint
    assert last.replayed == R * consumed_steps * BATCH
    # the two steps between checkpoint and crash were lost with the crash, not replayed
    assert last.rolled_back == R * 2 * BATCH
    assert errors(report)["resume_replayed"] == R * consumed_steps * BATCH
    assert by_kind(report)["resume_rolled_back"].count == R * 2 * BATCH
    assert {f.kind for f in report.findings if f.severity == "error"} == {"resume_replayed"}
    assert all(e.replayed == 0 for e in report.epochs[:-1])


def test_a_resume_that_skips_what_the_checkpoint_consumed_passes(tmp_path: Path) -> None:
    resume_run(tmp_path, skip_consumed=True)
    report = audit(tmp_path)
    assert report.status == "passed", report.findings
    assert report.epochs[-1].replayed == 0
    assert report.epochs[-1].rolled_back == R * 2 * BATCH
    assert report.epochs[-1].missing == 0


def test_a_sampler_level_resume_without_steps_counts_every_repeat_after_the_restart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for rank in range(R):
        monkeypatch.setenv("PERFGATE_LAUNCH_ID", f"{rank}1")
        sampler = RecordingSampler(distributed(rank), tmp_path, rank=rank)
        sampler.set_epoch(0)
        for i, _ in enumerate(make_loader(sampler)):
            if i == 1:
                break  # the process dies here; its loader is gone
        monkeypatch.setenv("PERFGATE_LAUNCH_ID", f"{rank}2")  # the restarted process, which says so
        restarted = RecordingSampler(distributed(rank), tmp_path, rank=rank, resumed=True)
        restarted.set_epoch(0)
        for _ in make_loader(restarted):
            pass
    sessions = Counter()
    for path in tmp_path.iterdir():
        rows = [json.loads(line) for line in path.read_text().splitlines()]
        first = rows[0]["session"]
        sessions[path.name] = sum(1 for row in rows if row["session"] == first)
    report = audit(tmp_path)
    assert report.epochs[0].replayed == sum(sessions.values())
    assert errors(report)["resume_replayed"] == sum(sessions.values())
    assert "resume_no_steps" in by_kind(report)


def test_a_one_batch_peek_per_epoch_is_reported_as_a_peek_not_as_duplicates(tmp_path: Path) -> None:
    for rank in range(R):
        sampler = RecordingSampler(distributed(rank), tmp_path, rank=rank)
        # small batches, so that the peek's prefetch (2 workers x 2 batches) is a part of the epoch
        data = RecordingDataset(Ids(), tmp_path, sampler=sampler)
        loader = DataLoader(data, batch_size=2, sampler=sampler, num_workers=WORKERS, persistent_workers=True)
        for epoch in range(EPOCHS):
            sampler.set_epoch(epoch)
            next(iter(loader))  # look at one batch first
            for _ in loader:
                pass
    report = audit(tmp_path)
    assert report.status == "passed", report.findings
    assert all(e.unique == N and e.padding_repeats == PAD and e.duplicates == PAD for e in report.epochs)
    peeks = by_kind(report)["abandoned_pass"]
    assert (
        peeks.severity == "warning" and peeks.epochs == list(range(EPOCHS)) and peeks.ranks == list(range(R))
    )
    assert "epoch 0, rank 0: pass(es) [0] stopped after" in peeks.message
    assert "next(iter(loader))" in peeks.message


class Stream(torch.utils.data.IterableDataset[int]):
    """Ids 0..N-1; splits the stream between loader workers only when told to."""

    def __init__(self, split: bool) -> None:
        self.split = split

    def __iter__(self) -> Any:
        info = torch.utils.data.get_worker_info()
        if self.split and info is not None:
            return iter(range(info.id, N, info.num_workers))
        return iter(range(N))


@pytest.mark.parametrize("split", [True, False])
def test_an_iterable_dataset_that_ignores_its_workers_is_found_duplicated_per_worker(
    tmp_path: Path, split: bool
) -> None:
    from perfgate.harness.samples import record_iterable

    data = record_iterable(Stream(split), tmp_path, sample_id=int, rank=0)
    loader = DataLoader(data, batch_size=BATCH, num_workers=WORKERS, persistent_workers=True)
    for epoch in range(EPOCHS):
        data.set_epoch(epoch)
        for _ in loader:
            pass
    # a stream in a fixed order: the same order each epoch is intended here
    report = audit_path(tmp_path, AuditPolicy(world_size=1, shuffle=False), expected_range=(0, N))
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        f"samples-r00000-w{w:03d}.jsonl" for w in range(WORKERS)
    ]
    if split:
        assert report.status == "passed", report.findings
        return
    for epoch in report.epochs:
        assert (epoch.records, epoch.unique, epoch.duplicates) == (WORKERS * N, N, (WORKERS - 1) * N)
        assert epoch.cross_owner_duplicates == N
        owners = {(o.rank, o.worker) for d in epoch.examples.duplicates for o in d.owners}
        assert owners == {(0, w) for w in range(WORKERS)}
    # every worker read the whole stream in the same order: duplicates, and the duplicated-shard bug by name
    dup = (WORKERS - 1) * N * EPOCHS
    assert errors(report) == {"duplicate_records": dup, "duplicated_shard": dup}
