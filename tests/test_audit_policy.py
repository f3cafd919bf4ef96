"""The audit's arithmetic and policy: checked against a plain set/dict audit, and case by case."""

from __future__ import annotations

import json
import random
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pytest

from perfgate.audit import AuditPolicy, AuditReport, audit_path
from perfgate.audit import resume as resume_module

Row = dict[str, Any]


def rec(sample_id: Any, epoch: int = 0, rank: int = 0, worker: int = -1, **extra: Any) -> Row:
    return {"sample_id": sample_id, "epoch": epoch, "rank": rank, "worker": worker, **extra}


def run(tmp_path: Path, rows: list[Row], **options: Any) -> AuditReport:
    path = tmp_path / "obs.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    expected_range = options.pop("expected_range", None)
    expected = options.pop("expected", None)
    expected_path = None
    if expected is not None:
        expected_path = tmp_path / "expected.json"
        expected_path.write_text(json.dumps(expected))
    return audit_path(path, AuditPolicy(**options), expected=expected_path, expected_range=expected_range)


def kinds(report: AuditReport) -> dict[str, tuple[str, int]]:
    return {f.kind: (f.severity, f.count) for f in report.findings}


def plain_audit(rows: list[Row], expected: set[Any]) -> dict[int, dict[str, int]]:
    """The audit done the obvious way; ids keyed with their type so 1 and "1" stay apart."""
    by_epoch: dict[int, list[Row]] = defaultdict(list)
    for r in rows:
        by_epoch[r["epoch"]].append(r)
    out: dict[int, dict[str, int]] = {}
    for epoch, group in by_epoch.items():
        counts = Counter((type(r["sample_id"]), r["sample_id"]) for r in group)
        owners: dict[Any, set[tuple[int, int]]] = defaultdict(set)
        for r in group:
            owners[(type(r["sample_id"]), r["sample_id"])].add((r["rank"], r["worker"]))
        want = {(type(i), i) for i in expected}
        out[epoch] = {
            "records": len(group),
            "unique": len(counts),
            "missing": len(want - counts.keys()),
            "extra": len(counts.keys() - want),
            "duplicates": len(group) - len(counts),
            "duplicate_ids": sum(1 for c in counts.values() if c > 1),
            "cross_owner_duplicates": sum(1 for o in owners.values() if len(o) > 1),
        }
    return out


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("layout", ["dense", "sparse", "mixed"])
def test_counts_agree_with_a_plain_set_and_dict_audit(tmp_path: Path, seed: int, layout: str) -> None:
    rng = random.Random(seed)
    universe: list[Any] = list(range(200))
    if layout == "sparse":
        universe = [rng.randrange(-(2**62), 2**62) for _ in range(200)]
    elif layout == "mixed":
        universe = list(range(100)) + [str(i) for i in range(50, 150)]
    expected = rng.sample(universe, 150)
    rows = [
        rec(rng.choice(universe), epoch=rng.randrange(3), rank=rng.randrange(4), worker=rng.randrange(-1, 2))
        for _ in range(rng.randrange(100, 600))
    ]
    report = run(tmp_path, rows, world_size=4, expected=expected, example_limit=3)
    oracle = plain_audit(rows, set(expected))
    got = {
        e.epoch: {
            k: getattr(e, k)
            for k in (
                "records",
                "unique",
                "missing",
                "extra",
                "duplicates",
                "duplicate_ids",
                "cross_owner_duplicates",
            )
        }
        for e in report.epochs
    }
    assert got == oracle
    for e in report.epochs:
        assert len(e.examples.missing) == min(3, e.missing or 0)
        assert all(i in expected for i in e.examples.missing)
        assert all(i not in expected for i in e.examples.extra)


def padded_epoch(n: int, world: int, epoch: int = 0) -> list[Row]:
    """What DistributedSampler(shuffle=False, drop_last=False) hands each rank."""
    order = list(range(n))
    order += order[: -n % world]
    return [rec(i, epoch=epoch, rank=pos % world) for pos, i in enumerate(order)]


def test_padding_must_be_exactly_what_distributed_sampler_adds(tmp_path: Path) -> None:
    rows = padded_epoch(10, 4)  # 12 records, 2 of them padding
    report = run(tmp_path, rows, world_size=4, allow_padding_repeats=True, expected_range=(0, 10))
    assert report.status == "passed"
    assert report.epochs[0].padding_repeats == 2
    short = run(tmp_path, rows[:-1], world_size=4, allow_padding_repeats=True, expected_range=(0, 10))
    assert kinds(short)["padding_mismatch"] == ("error", 1)
    assert kinds(short)["uneven_rank_records"] == ("warning", 1)
    more = run(
        tmp_path, [*rows, rec(5, rank=2)], world_size=4, allow_padding_repeats=True, expected_range=(0, 10)
    )
    assert kinds(more)["duplicate_records"] == ("error", 1)
    assert more.epochs[0].padding_repeats == 2


def test_padding_on_the_same_rank_is_not_padding(tmp_path: Path) -> None:
    rows = padded_epoch(10, 4)
    rows[-1] = rec(rows[-1]["sample_id"], rank=1)  # rank 1 already has id 1: a same-rank repeat
    rows[-2] = rec(2, rank=2)  # rank 2 already has id 2
    report = run(tmp_path, rows, world_size=4, allow_padding_repeats=True, expected_range=(0, 10))
    found = kinds(report)
    assert found["padding_mismatch"] == ("error", 2)
    assert found["duplicate_records"] == ("error", 2)


def test_drop_last_excuses_exactly_the_dropped_tail(tmp_path: Path) -> None:
    rows = [rec(i, rank=i % 4) for i in range(8)]  # 10 ids, 4 ranks: 2 dropped
    report = run(tmp_path, rows, world_size=4, drop_last=True, expected_range=(0, 10))
    assert report.status == "passed"
    assert kinds(report)["dropped_by_drop_last"] == ("info", 2)
    worse = run(tmp_path, rows[:-1], world_size=4, drop_last=True, expected_range=(0, 10))
    assert kinds(worse)["missing_ids"] == ("error", 1)
    assert worse.epochs[0].missing == 3


def test_allow_repeats_excuses_repeats_but_never_missing_or_extra_ids(tmp_path: Path) -> None:
    rows = [rec(i % 5) for i in range(12)] + [rec(99)]
    report = run(tmp_path, rows, world_size=1, allow_repeats=True, expected_range=(0, 6))
    found = kinds(report)
    assert found["repeats_allowed"][0] == "info"
    assert found["missing_ids"] == ("error", 1)
    assert found["extra_ids"] == ("error", 1)
    assert "duplicate_records" not in found


def test_without_expected_ids_coverage_is_unknown(tmp_path: Path) -> None:
    report = run(tmp_path, [rec(i, rank=i % 2) for i in range(6)], world_size=2)
    assert (report.status, report.coverage) == ("passed", "unknown")
    assert report.epochs[0].missing is None
    assert kinds(report)["coverage_unknown"][0] == "warning"


def test_ranks_epochs_and_example_caps(tmp_path: Path) -> None:
    rows = [rec(i, epoch=e, rank=r) for e in range(2) for r in range(3) for i in range(r, 60, 3)]
    report = run(tmp_path, rows, expected_range=(0, 100), example_limit=5)
    assert report.world_size_inferred and report.world_size == 3
    assert kinds(report)["world_size_inferred"] == ("info", 3)
    assert report.epochs[0].missing == 40
    assert report.epochs[0].examples.missing == [60, 61, 62, 63, 64]
    only = run(tmp_path, rows, world_size=3, epochs=[1, 7], expected_range=(0, 60))
    assert [e.epoch for e in only.epochs] == [1]
    assert kinds(only)["epoch_not_observed"] == ("error", 1)
    narrow = run(tmp_path, rows, world_size=2, expected_range=(0, 60))
    assert kinds(narrow)["rank_out_of_range"] == ("error", 40)
    wide = run(tmp_path, rows, world_size=4, expected_range=(0, 60))
    assert kinds(wide)["rank_without_records"] == ("error", 2)


@pytest.fixture(params=[1 << 22, 3], ids=["one-chunk", "3-record-chunks"])
def chunked(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Run the stream scan in one chunk, and in chunks far smaller than a stream."""
    monkeypatch.setattr(resume_module, "_CHUNK", request.param)


@pytest.mark.usefixtures("chunked")
def test_restart_markers_and_backward_steps_are_resume_boundaries(tmp_path: Path) -> None:
    before = [rec(i, step=i // 2) for i in range(10)]  # steps 0..4
    marker = [rec(i, step=3 + (i - 6) // 2, restart=i == 6) for i in range(6, 10)]  # resumes at step 3
    report = run(tmp_path, before + marker, world_size=1, expected_range=(0, 10))
    assert report.status == "passed"
    assert report.epochs[0].rolled_back == 4  # steps 3 and 4 were redone
    assert report.epochs[0].replayed == 0
    # no marker, but the step goes back to 3 while the loader restarts the epoch from its first id
    replay = [rec(i, step=3 + i // 2) for i in range(10)]
    report = run(tmp_path, before + replay, world_size=1, expected_range=(0, 10))
    assert kinds(report)["resume_replayed"] == ("error", 6)  # ids 0-5, consumed by steps 0-2
    assert "duplicate_records" not in kinds(report)
    assert report.epochs[0].rolled_back == 4


@pytest.mark.usefixtures("chunked")
def test_a_resume_that_jumps_ahead_reports_the_skipped_steps(tmp_path: Path) -> None:
    rows = [rec(i, step=i, session=1) for i in range(5)] + [rec(i, step=i, session=2) for i in range(3, 10)]
    report = run(tmp_path, rows, world_size=1, expected_range=(0, 12))
    assert report.epochs[0].rolled_back == 2
    rows = [rec(i, step=i, session=1) for i in range(5)] + [rec(i, step=i, session=2) for i in range(8, 12)]
    report = run(tmp_path, rows, world_size=1, expected_range=(0, 12))
    found = kinds(report)
    assert found["resume_skipped_steps"] == ("error", 3)
    assert found["missing_ids"] == ("error", 3)


@pytest.mark.usefixtures("chunked")
def test_interleaved_writers_are_followed_stream_by_stream(tmp_path: Path) -> None:
    # two workers of one rank write into one file, their lines interleaved; worker 1 restarts its
    # session and re-reads its first two ids, worker 0 never restarts
    w0 = [rec(i, worker=0, session=1) for i in range(0, 10, 2)]
    w1 = [rec(i, worker=1, session=1) for i in range(1, 10, 2)]
    rows = [r for pair in zip(w0, w1, strict=True) for r in pair]
    rows[7:7] = [rec(1, worker=1, session=2), rec(3, worker=1, session=2)]
    report = run(tmp_path, rows, world_size=1, expected_range=(0, 10))
    assert kinds(report)["resume_replayed"] == ("error", 2)
    assert report.epochs[0].replayed == 2
    assert "duplicate_records" not in kinds(report)
