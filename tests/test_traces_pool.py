"""Several ranks' traces analyzed in parallel worker processes: same results, bounded in flight."""

from __future__ import annotations

import multiprocessing
import shutil
import time
from multiprocessing.context import BaseContext
from multiprocessing.synchronize import Event
from pathlib import Path

import pytest

from perfgate.helpers.deadline import DeadlineExceeded
from perfgate.traces import AnalysisOptions, TraceError, analyze_trace, pool
from perfgate.traces.pool import Deadline, analyze_many, estimated_peak_bytes, worker_count

PLANTED = Path(__file__).parent / "fixtures" / "traces" / "planted"


def test_one_worker_per_core_bounded_by_files_and_memory(tmp_path: Path) -> None:
    paths = []
    for r in range(32):
        path = tmp_path / f"rank{r}.json"
        path.write_bytes(b"x" * 1000)
        paths.append(path)
    assert worker_count(paths, cpus=16, available=1 << 40) == 16
    assert worker_count(paths[:3], cpus=16, available=1 << 40) == 3
    # Memory for five peaks (three quarters of it kept free of estimates' error): five at once.
    peak = estimated_peak_bytes(paths[0])
    assert worker_count(paths, cpus=16, available=int(peak * 5 / 0.75) + 1) == 5
    assert worker_count(paths, cpus=16, available=1) == 1


def test_parallel_results_equal_serial_ones_in_file_order(tmp_path: Path) -> None:
    sources = [PLANTED / "slow_rank_rank0.json.gz", PLANTED / "slow_rank_rank1.json.gz"] * 2
    paths = []
    for i, src in enumerate(sources):
        paths.append(tmp_path / f"copy{i}_{src.name}")
        shutil.copy(src, paths[-1])
    seen: list[tuple[int, int]] = []
    parallel = analyze_many(paths, workers=2, progress=lambda done, total, _: seen.append((done, total)))
    serial = [analyze_trace(p) for p in paths]
    assert [p.model_dump() for p in parallel] == [p.model_dump() for p in serial]
    assert [d for d, _ in seen] == [1, 2, 3, 4] and {t for _, t in seen} == {4}


def test_a_bad_file_among_many_names_itself(tmp_path: Path) -> None:
    good = tmp_path / "rank0.json.gz"
    shutil.copy(PLANTED / "slow_rank_rank0.json.gz", good)
    bad = tmp_path / "rank1.json"
    bad.write_text('{"traceEvents": [{"ph": "X", "ts": 1, "dur": 2}')
    with pytest.raises(TraceError, match=r"rank1\.json"):
        analyze_many([good, bad, good], workers=2)


def test_the_deadline_holds_in_the_workers_and_names_the_file(tmp_path: Path) -> None:
    paths = []
    for r in range(2):
        paths.append(tmp_path / f"rank{r}.json.gz")
        shutil.copy(PLANTED / f"slow_rank_rank{r}.json.gz", paths[-1])
    past = Deadline(seconds=5.0, ends_at=time.monotonic() - 1.0)
    # Serially the first file stops; in parallel either worker may report first, naming its own file.
    for workers, rank in ((1, "0"), (2, "[01]")):
        with pytest.raises(DeadlineExceeded, match=rf"reading trace rank{rank}\.json\.gz ran past the 5 s"):
            analyze_many(
                paths, workers=workers, limit=past, labels=[f"reading trace {p.name}" for p in paths]
            )
    # Time left: both read, in parallel.
    later = Deadline(seconds=600.0, ends_at=time.monotonic() + 600.0)
    assert len(analyze_many(paths, workers=2, limit=later)) == 2


def test_a_worker_stops_at_its_next_block_once_the_caller_gives_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "rank0.json.gz"
    shutil.copy(PLANTED / "slow_rank_rank0.json.gz", path)
    stop = multiprocessing.get_context("spawn").Event()
    monkeypatch.setattr(pool, "_worker_stop", stop)
    assert pool._analyze_one(path, AnalysisOptions(), None, f"reading trace {path.name}").steps
    stop.set()
    with pytest.raises(DeadlineExceeded, match=r"reading trace rank0\.json\.gz stopped: the call"):
        pool._analyze_one(path, AnalysisOptions(), None, f"reading trace {path.name}")


def test_the_pool_tells_its_workers_to_stop_on_failure_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    good = tmp_path / "rank0.json.gz"
    shutil.copy(PLANTED / "slow_rank_rank0.json.gz", good)
    bad = tmp_path / "rank1.json"
    bad.write_text('{"traceEvents": [{"ph": "X", "ts": 1, "dur": 2}')
    events: list[Event] = []

    def recorded(ctx: BaseContext) -> Event:
        events.append(ctx.Event())
        return events[-1]

    monkeypatch.setattr(pool, "_stop_event", recorded)
    assert len(analyze_many([good, good], workers=2)) == 2
    assert not events[-1].is_set()
    with pytest.raises(TraceError, match=r"rank1\.json"):
        analyze_many([bad, good, good], workers=2)
    assert events[-1].is_set()

    # The event reaches the workers: one set before the call stops every file they read.
    def already_set(ctx: BaseContext) -> Event:
        event = recorded(ctx)
        event.set()
        return event

    monkeypatch.setattr(pool, "_stop_event", already_set)
    with pytest.raises(DeadlineExceeded, match=r"stopped: the call that asked for it has ended"):
        analyze_many([good, good], workers=2)


def test_this_process_reads_files_beside_its_workers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Two cores: one worker process and a thread of this process take the files from one queue (this
    # process would otherwise only wait). The worker's first file is handed over before the thread can
    # take them all, and the thread takes files while the worker reads: both read some.
    paths = []
    for r in range(6):
        paths.append(tmp_path / f"rank{r}.json.gz")
        shutil.copy(PLANTED / f"slow_rank_rank{r % 2}.json.gz", paths[-1])
    here: list[Path] = []
    real = pool.analyze_trace

    def spy(path: Path, options: AnalysisOptions) -> object:
        here.append(path)
        return real(path, options)

    monkeypatch.setattr(pool, "analyze_trace", spy)  # this process only: the workers import their own
    seen: list[int] = []
    parallel = analyze_many(paths, workers=2, progress=lambda done, total, _: seen.append(done))
    assert 1 <= len(here) < len(paths)
    assert [p.model_dump() for p in parallel] == [real(p, AnalysisOptions()).model_dump() for p in paths]
    assert seen == [1, 2, 3, 4, 5, 6]
