"""One large trace read in two halves on two cores: exactly the table and the analysis of one reader,
and only when a core is idle."""

from __future__ import annotations

import gzip
import json
import random
import shutil
import time
from multiprocessing.context import BaseContext
from multiprocessing.synchronize import Event
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from mcp import Client

from perfgate.helpers.deadline import DeadlineExceeded
from perfgate.server import build_server
from perfgate.serving.runtime import ServerConfig
from perfgate.traces import AnalysisOptions, TraceError, analyze_trace, pool
from perfgate.traces.analyze import load_table
from perfgate.traces.reading.parsecache import CACHE_ENV
from perfgate.traces.reading.reader import TraceStream
from perfgate.traces.reading.table import Columns

FIXTURES = Path(__file__).parent / "fixtures" / "traces"
PLANTED = FIXTURES / "planted"
SMALL_BATCHES = AnalysisOptions(chunk_bytes=1 << 12, read_block_bytes=1 << 12)
"""Batches of a few events: the halves meet inside a fixture, after many batches on each side."""


def _same_columns(a: Columns, b: Columns) -> None:
    assert a.data.keys() == b.data.keys() and a.sparse.keys() == b.sparse.keys()
    for key in a.data:
        assert a.data[key].dtype == b.data[key].dtype and np.array_equal(
            a.data[key], b.data[key], equal_nan=True
        )
    for key in a.sparse:
        x, y = a.sparse[key], b.sparse[key]
        assert np.array_equal(x.rows, y.rows) and np.array_equal(x.values, y.values, equal_nan=True)


@pytest.mark.parametrize(
    "name", ["planted/slow_rank_rank1.json.gz", "planted/eval_in_step_rank0.json.gz", "musa_s4000_rank1.json"]
)
def test_two_halves_build_the_table_and_the_analysis_of_one_reader(name: str) -> None:
    path = FIXTURES / name
    options = (
        SMALL_BATCHES
        if path.stat().st_size > 10_000
        else AnalysisOptions(chunk_bytes=256, read_block_bytes=256)
    )
    read = pool.load_split(path, options)
    assert read is not None
    split, stream, used = read
    assert used  # the worker's half was read and joined, not thrown away
    one, header, one_stream = load_table(path, options)
    for table in ("device", "host", "cpu"):
        _same_columns(getattr(split, table), getattr(one, table))
    assert split.names == one.names and split.cats == one.cats and split.name_index == one.name_index
    assert list(split.category_counts.items()) == list(one.category_counts.items())
    assert (split.event_count, split.complete_count, split.float_timestamps, split.dropped_without_time) == (
        one.event_count,
        one.complete_count,
        one.float_timestamps,
        one.dropped_without_time,
    )
    assert stream.header == header and stream.decoded_bytes == one_stream.decoded_bytes
    assert pool.analyze_split(path, options).model_dump() == analyze_trace(path, options).model_dump()


def _same_tables(path: Path, options: AnalysisOptions, read: tuple[Any, TraceStream, bool]) -> None:
    split, stream, used = read
    assert used
    one, header, one_stream = load_table(path, options)
    for table in ("device", "host", "cpu"):
        _same_columns(getattr(split, table), getattr(one, table))
    assert split.names == one.names and split.cats == one.cats and split.name_index == one.name_index
    assert list(split.category_counts.items()) == list(one.category_counts.items())
    assert (split.event_count, split.complete_count) == (one.event_count, one.complete_count)
    assert stream.header == header and stream.decoded_bytes == one_stream.decoded_bytes
    assert stream.lenient_skipped == one_stream.lenient_skipped


def test_three_parts_meeting_anywhere_build_the_table_of_one_reader() -> None:
    # This process reads up to `at`, the worker from there up to `then`, this process again from `then`
    # to the end. Where the worker stops is fixed here (in a call it is decided while both read), so
    # every join is checked whatever the machine's load; near the end the worker's last batch begins
    # before `then` and it reads to the end itself.
    rng = random.Random(23)
    pairs = [(at, rng.uniform(at + 0.05, 0.95)) for at in (rng.uniform(0.02, 0.7) for _ in range(8))]
    taken = 0
    for k, (at, then) in enumerate([*pairs, (0.3, 0.9999), (0.3, 1.0)]):
        path = PLANTED / ("slow_rank_rank1.json.gz", "eval_in_step_rank0.json.gz")[k % 2]
        # Batches and read blocks of several sizes, so the parts meet at other places in the events.
        options = AnalysisOptions(
            chunk_bytes=rng.choice([1 << 10, 3000, 1 << 12, 1 << 14]),
            read_block_bytes=rng.choice([777, 1 << 12, 1 << 13]),
        )
        read = pool.load_split(path, options, at=at, then=then)
        assert read is not None, (at, then, options)
        _same_tables(path, options, read)
        taken += read[1].resume_meet is not None
    assert taken >= len(pairs)  # this process did read a last part after the worker's, at each pair


def test_an_error_in_a_part_this_process_takes_over_reads_as_from_one_reader(tmp_path: Path) -> None:
    text = gzip.decompress((PLANTED / "slow_rank_rank1.json.gz").read_bytes())
    at = text.index(b'"ph"', len(text) * 3 // 4)
    bad = tmp_path / "rank1.json"
    bad.write_bytes(text[:at] + b"!!" + text[at:])
    with pytest.raises(TraceError) as one:
        load_table(bad, SMALL_BATCHES)
    # After the worker's part: one reader might have failed earlier, in the worker's part; read again.
    assert pool.load_split(bad, SMALL_BATCHES, at=0.2, then=0.5) is None
    # In the worker's part, before where this process takes over: the worker's error is one reader's.
    with pytest.raises(TraceError) as split:
        pool.load_split(bad, SMALL_BATCHES, at=0.2, then=0.9)
    assert str(split.value) == str(one.value)


def test_the_worker_is_left_about_as_much_as_this_process_takes() -> None:
    chunk, block, end = 1 << 20, 1 << 20, 100 << 20
    # Not begun yet, no skipping cost: this process takes half of what the worker has left.
    cut = pool.steal_point(30 << 20, -1, end, chunk, block, 0.0)
    assert cut is not None and abs(cut - (end + (30 << 20) + chunk // 2) // 2) <= 1
    # Skipping to the cut costs this process: the worker is left more; the join's lag: less.
    costly = pool.steal_point(30 << 20, -1, end, chunk, block, 0.1)
    lagging = pool.steal_point(30 << 20, -1, end, chunk, block, 0.0, lag=4 << 20)
    assert costly is not None and lagging is not None and lagging < cut < costly
    # Further on, the worker is left less; the batch it reads now is always its own.
    ahead = pool.steal_point(30 << 20, 60 << 20, end, chunk, block, 0.1)
    assert ahead is not None and ahead > 60 << 20 and end - ahead >= chunk
    assert pool.steal_point(30 << 20, 98 << 20, end, chunk, block, 0.1) is None  # under a batch left
    assert pool.steal_point(30 << 20, 1 << 62, end, chunk, block, 0.1) is None  # the worker is done


def test_a_large_shared_trace_reads_the_same_in_two_halves(hta_traces: Path) -> None:
    path = hta_traces / "ns_resolution_trace_rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz"
    if not path.exists():
        pytest.skip("the shared ns_resolution trace is not present")
    read = pool.load_split(path, AnalysisOptions())
    assert read is not None and read[2]
    assert pool.analyze_split(path, AnalysisOptions()).model_dump() == analyze_trace(path).model_dump()


def _fails_as_one_reader(path: Path, options: AnalysisOptions) -> None:
    with pytest.raises(TraceError) as one:
        analyze_trace(path, options)
    with pytest.raises(TraceError) as split:
        pool.analyze_split(path, options)
    assert str(split.value) == str(one.value)


def test_an_error_in_the_second_half_reads_as_from_one_reader(tmp_path: Path) -> None:
    text = gzip.decompress((PLANTED / "slow_rank_rank1.json.gz").read_bytes())
    at = text.index(b'"ph"', len(text) * 3 // 4)
    bad = tmp_path / "rank1.json"
    bad.write_bytes(text[:at] + b"!!" + text[at:])  # invalid JSON well after the middle
    _fails_as_one_reader(bad, SMALL_BATCHES)


def test_too_many_events_is_told_as_one_reader_tells_it() -> None:
    path = PLANTED / "slow_rank_rank1.json.gz"
    options = AnalysisOptions(
        chunk_bytes=1 << 12,
        read_block_bytes=1 << 12,
        max_events=analyze_trace(path).event_counts["events"] - 1,
    )
    _fails_as_one_reader(path, options)


def test_a_second_core_is_used_only_when_idle_now() -> None:
    assert pool.idle_core(2, "0.40 0.50 0.60 1/300 999")
    assert not pool.idle_core(1, "0.00 0.00 0.00 1/300 999")  # one core: nothing to split onto
    assert not pool.idle_core(2, "0.40 0.50 0.60 2/300 999")  # another thread runs now
    assert pool.idle_core(2, "1.60 0.50 0.60 1/300 999")  # this process's own earlier calls
    assert not pool.idle_core(2, "2.10 0.50 0.60 1/300 999")  # kept busy over the last minute
    assert not pool.idle_core(2, "garbled")


def test_one_large_trace_is_split_only_on_an_idle_machine(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    path = tmp_path / "rank0.json"
    path.write_bytes((PLANTED / "slow_rank_rank1.json.gz").read_bytes())

    def large(_: Path) -> int:
        return pool.SPLIT_MIN_BYTES

    monkeypatch.setattr(pool, "_json_bytes", large)
    monkeypatch.setattr(pool._forkserver_started, "is_set", lambda: True)  # pyright: ignore[reportPrivateUsage]
    monkeypatch.setenv(CACHE_ENV, "0")  # each call reads the file (not the parse kept by the first)
    calls: list[Path] = []
    real = pool.analyze_split

    def spy(p: Path, *args: object, **kwargs: object) -> object:
        calls.append(p)
        return real(p, *args, **kwargs)  # pyright: ignore[reportArgumentType]

    monkeypatch.setattr(pool, "analyze_split", spy)
    monkeypatch.setattr(pool, "idle_core", lambda: False)
    busy = pool.analyze_many([path])
    assert calls == []
    monkeypatch.setattr(pool, "idle_core", lambda: True)
    idle = pool.analyze_many([path])
    assert calls == [path]
    assert idle[0].model_dump() == busy[0].model_dump()
    # Several files are never split: they use the cores one file each.
    pool.analyze_many([path, path], workers=1)
    assert calls == [path]


def _names_like_cuts(tmp_path: Path) -> Path:
    """A trace whose names hold "}, {" (which a skipping reader's guessed cuts take for the end of an
    event) followed by a long tail: at some offsets the guesses fall inside a string, at others they meet
    the true cuts again."""
    events: list[dict[str, object]] = []
    for i in range(300):
        events.append({"ph": "X", "cat": "cpu_op", "name": f"op{i % 7}}}, {{" + "y" * 300, "ts": i * 10,
                       "dur": 5, "tid": 1, "pid": 1})  # fmt: skip
        events.append({"ph": "X", "cat": "kernel", "name": f"k{i % 5}", "ts": i * 10 + 1, "dur": 3, "tid": 7,
                       "pid": 0, "args": {"stream": 7, "correlation": i, "device": 0}})  # fmt: skip
    path = tmp_path / "rank0.json"
    path.write_text(json.dumps({"traceEvents": events}, separators=(", ", ": ")))
    return path


def test_a_worker_that_began_elsewhere_is_not_used(tmp_path: Path) -> None:
    # At some meeting points the worker begins inside a name, at others where one reader cuts; either
    # way the table is one reader's.
    path = _names_like_cuts(tmp_path)
    options = AnalysisOptions(chunk_bytes=1 << 10, read_block_bytes=1 << 10)
    one, _, _ = load_table(path, options)
    outcomes: set[str] = set()
    for at in (0.15, 0.3, 0.5, 0.55):
        read = pool.load_split(path, options, at=at, then=1.0)
        if read is None:
            outcomes.add("read again in one piece")
            continue
        assert read[2]
        outcomes.add("joined")
        for table in ("device", "host", "cpu"):
            _same_columns(getattr(read[0], table), getattr(one, table))
        assert read[0].names == one.names
    assert outcomes == {"joined", "read again in one piece"}
    assert pool.analyze_split(path, options).model_dump() == analyze_trace(path, options).model_dump()


def test_a_last_part_that_began_elsewhere_than_the_worker_stopped_is_not_used(tmp_path: Path) -> None:
    # As above, for where this process takes over from the worker: its guessed cuts from where its
    # first part ended to where the worker stops fall inside names at some offsets.
    path = _names_like_cuts(tmp_path)
    options = AnalysisOptions(chunk_bytes=1 << 10, read_block_bytes=1 << 10)
    assert pool.load_split(path, options, at=0.1, then=1.0) is not None  # the worker began right there
    outcomes: set[str] = set()
    for then in (0.3, 0.42, 0.5, 0.55, 0.61, 0.7, 0.78, 0.85):
        read = pool.load_split(path, options, at=0.1, then=then)
        if read is None:
            outcomes.add("read again in one piece")
            continue
        _same_tables(path, options, read)
        outcomes.add("joined")
    assert outcomes == {"joined", "read again in one piece"}


def test_the_deadline_holds_in_both_parts_and_the_worker_is_told_to_stop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    events: list[Event] = []

    def recorded(ctx: BaseContext) -> Event:
        events.append(ctx.Event())
        return events[-1]

    monkeypatch.setattr(pool, "_stop_event", recorded)
    pool.release_workers()  # a worker kept from an earlier read holds the stop event it started with
    path = PLANTED / "slow_rank_rank1.json.gz"
    past = pool.Deadline(seconds=5.0, ends_at=time.monotonic() - 1.0)
    with pytest.raises(DeadlineExceeded, match=r"reading trace rank1 ran past the 5 s"):
        pool.analyze_split(path, SMALL_BATCHES, past, "reading trace rank1")
    assert events[-1].is_set()  # the worker stops at its next block (and was waited for)
    assert pool._kept is None  # pyright: ignore[reportPrivateUsage]  # a stopped worker is never kept
    later = pool.Deadline(seconds=600.0, ends_at=time.monotonic() + 600.0)
    assert (
        pool.analyze_split(path, SMALL_BATCHES, later).model_dump()
        == analyze_trace(path, SMALL_BATCHES).model_dump()
    )
    assert not events[-1].is_set()


def test_a_worker_that_read_another_file_is_not_used(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # Same bytes, another file (as when the path is replaced between the two opens): the parts would
    # meet, but the answer must be about one file.
    path = PLANTED / "slow_rank_rank1.json.gz"
    copy = tmp_path / path.name
    copy.write_bytes(path.read_bytes())
    real = pool.part_stream

    def on_copy(_: Path, *args: Any) -> TraceStream:
        return real(copy, *args)

    monkeypatch.setattr(pool, "part_stream", on_copy)  # this process reads the copy, the worker the file
    assert pool.load_split(path, SMALL_BATCHES) is None
    monkeypatch.setattr(pool, "part_stream", real)
    read = pool.load_split(path, SMALL_BATCHES)
    assert read is not None and read[2] and read[1].identity


def test_the_running_threads_are_the_fewest_of_a_few_samples(monkeypatch: pytest.MonkeyPatch) -> None:
    samples = iter(["0.50 0.40 0.30 2/300 9", "0.50 0.40 0.30 1/300 9", "0.50 0.40 0.30 3/300 9"])

    class FakePath:
        def __init__(self, name: str) -> None:
            assert name == "/proc/loadavg"

        def read_text(self, encoding: str) -> str:
            return next(samples)

    monkeypatch.setattr(pool, "Path", FakePath)
    # One of this process's threads was still runnable at the first sample: the core is idle all the same.
    assert pool._read_loadavg() == "0.50 0.40 0.30 1/300 9"  # pyright: ignore[reportPrivateUsage]


def test_an_idle_first_sample_of_the_load_is_the_only_one(monkeypatch: pytest.MonkeyPatch) -> None:
    read: list[str] = []
    samples = iter(["0.50 0.40 0.30 1/300 9", "0.50 0.40 0.30 3/300 9", "0.50 0.40 0.30 3/300 9"])

    class FakePath:
        def __init__(self, name: str) -> None:
            assert name == "/proc/loadavg"

        def read_text(self, encoding: str) -> str:
            read.append(next(samples))
            return read[-1]

    monkeypatch.setattr(pool, "Path", FakePath)
    monkeypatch.setattr(pool.time, "sleep", lambda _: pytest.fail("an idle first sample waits for no other"))
    assert pool._read_loadavg(fewer_than=2) == "0.50 0.40 0.30 1/300 9"  # pyright: ignore[reportPrivateUsage]
    assert len(read) == 1
    # A busy first sample is sampled again: the fewest runnable threads of all three.
    samples = iter(["0.50 0.40 0.30 2/300 9", "0.50 0.40 0.30 3/300 9", "0.50 0.40 0.30 2/300 9"])
    read.clear()
    monkeypatch.setattr(pool.time, "sleep", lambda _: None)
    assert pool._read_loadavg(fewer_than=2) == "0.50 0.40 0.30 2/300 9"  # pyright: ignore[reportPrivateUsage]
    assert len(read) == 3


@pytest.mark.anyio
async def test_the_tool_call_takes_the_split_path_on_an_idle_machine(
    monkeypatch: pytest.MonkeyPatch, workspace: Path
) -> None:
    shutil.copy(PLANTED / "slow_rank_rank1.json.gz", workspace / "rank1.json.gz")

    def large(_: Path) -> int:
        return pool.SPLIT_MIN_BYTES

    monkeypatch.setattr(pool, "_json_bytes", large)
    monkeypatch.setattr(pool._forkserver_started, "is_set", lambda: True)  # pyright: ignore[reportPrivateUsage]
    calls: list[bool] = []
    real = pool.load_split

    def spy(*args: Any, **kwargs: Any) -> Any:
        calls.append(bool(kwargs.get("cancellable")))
        return real(*args, **kwargs)

    monkeypatch.setattr(pool, "load_split", spy)
    monkeypatch.setenv(CACHE_ENV, "0")  # the second call reads the file again, on a busy machine: not split
    answers: list[Any] = []
    async with Client(build_server(ServerConfig.create(workspace))) as client:
        for idle in (True, False):
            monkeypatch.setattr(pool, "idle_core", lambda idle=idle: idle)
            result = await client.call_tool("analyze_trace", {"trace_paths": ["rank1.json.gz"]})
            assert not result.is_error
            assert result.structured_content is not None
            answers.append(result.structured_content["ranks"])
    assert calls == [True]  # read off the event loop, cancellable, under the call's deadline
    assert answers[0] == answers[1]


def _kept_pid() -> int | None:
    kept = pool._kept  # pyright: ignore[reportPrivateUsage]
    if kept is None:
        return None
    (pid,) = kept.pool._processes  # pyright: ignore[reportPrivateUsage]
    return pid


def test_the_next_split_read_takes_the_kept_worker_and_reads_as_one_reader() -> None:
    # Three reads in a row by one worker process: each starts it afresh (not begun, told where to stop
    # now), so each is exactly one reader's table, whatever the read before it left in the shared cells.
    pool.release_workers()
    path = PLANTED / "slow_rank_rank1.json.gz"
    pids: list[int | None] = []
    for then in (None, 0.6, None):
        read = pool.load_split(path, SMALL_BATCHES, at=0.2, then=then)
        assert read is not None
        _same_tables(path, SMALL_BATCHES, read)
        pids.append(_kept_pid())
    assert pids[0] is not None and pids == [pids[0]] * 3
    pool.release_workers()
    assert pool._kept is None  # pyright: ignore[reportPrivateUsage]


def test_an_idle_kept_worker_is_shut_down(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pool, "KEEP_WORKER_S", 0.05)
    pool.release_workers()
    read = pool.load_split(PLANTED / "slow_rank_rank1.json.gz", SMALL_BATCHES)
    assert read is not None and read[2]
    pid = _kept_pid()
    assert pid is not None
    deadline = time.monotonic() + 30
    while pool._kept is not None and time.monotonic() < deadline:  # pyright: ignore[reportPrivateUsage]
        time.sleep(0.02)
    assert pool._kept is None  # pyright: ignore[reportPrivateUsage]
    while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
        time.sleep(0.02)  # the executor's last join of its process is on its own thread
    assert _dead(pid)


def test_two_split_reads_at_once_each_have_a_worker() -> None:
    # The kept worker serves one read at a time: a read while it is taken starts its own, and the two
    # reads end with one worker kept.
    import threading

    pool.release_workers()
    path = PLANTED / "slow_rank_rank1.json.gz"
    reads: list[Any] = []
    threads = [
        threading.Thread(target=lambda: reads.append(pool.load_split(path, SMALL_BATCHES))) for _ in range(2)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(reads) == 2
    for read in reads:
        assert read is not None
        _same_tables(path, SMALL_BATCHES, read)
    assert _kept_pid() is not None
    pool.release_workers()


def _dead(pid: int) -> bool:
    """Gone or a zombie (it may be reaped between looking and reading, which a read then says)."""
    try:
        return "zombie" in Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return True


def test_a_kept_worker_that_died_while_idle_is_replaced() -> None:
    import os
    import signal

    pool.release_workers()
    path = PLANTED / "slow_rank_rank1.json.gz"
    assert pool.load_split(path, SMALL_BATCHES) is not None
    pid = _kept_pid()
    assert pid is not None
    os.kill(pid, signal.SIGKILL)  # killed for memory while it waited
    deadline = time.monotonic() + 30
    while not _dead(pid) and time.monotonic() < deadline:
        time.sleep(0.01)
    read = pool.load_split(path, SMALL_BATCHES)
    assert read is not None
    _same_tables(path, SMALL_BATCHES, read)
    assert _kept_pid() not in (None, pid)
    pool.release_workers()


def test_a_kept_worker_that_dies_before_it_begins_its_part_costs_no_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Between a kept worker's death and its pool noticing (the forkserver reaps it, then writes its status)
    # alive() still passes; the part submitted to it fails before it began. Under load in CI that read
    # failed with "the worker reading its second half died".
    import os
    import signal

    pool.release_workers()
    path = PLANTED / "slow_rank_rank1.json.gz"
    assert pool.load_split(path, SMALL_BATCHES) is not None
    pid = _kept_pid()
    assert pid is not None
    monkeypatch.setattr(pool._SplitWorker, "alive", lambda self: True)  # killed in the moment after the look
    os.kill(pid, signal.SIGKILL)
    read = pool.load_split(path, SMALL_BATCHES)  # None: the caller reads it in one piece
    if read is not None:
        _same_tables(path, SMALL_BATCHES, read)
    pool.release_workers()


def test_a_kept_worker_that_dies_as_it_is_taken_leaves_a_read_in_one_piece(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import os
    import signal

    pool.release_workers()
    path = PLANTED / "slow_rank_rank1.json.gz"
    assert pool.load_split(path, SMALL_BATCHES) is not None
    kept = pool._kept  # pyright: ignore[reportPrivateUsage]
    pid = _kept_pid()
    assert kept is not None and pid is not None
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while not getattr(kept.pool, "_broken", False) and time.monotonic() < deadline:
        time.sleep(0.01)
    monkeypatch.setattr(pool._SplitWorker, "alive", lambda self: True)  # pyright: ignore[reportPrivateUsage]  # looked alive
    assert pool.load_split(path, SMALL_BATCHES) is None  # read again in one piece, by the caller
    assert (
        pool.analyze_split(path, SMALL_BATCHES).model_dump()
        == analyze_trace(path, SMALL_BATCHES).model_dump()
    )
    pool.release_workers()


@pytest.mark.anyio
async def test_a_server_closing_shuts_the_kept_worker_down(workspace: Path) -> None:
    pool.release_workers()
    assert pool.load_split(PLANTED / "slow_rank_rank1.json.gz", SMALL_BATCHES) is not None
    assert _kept_pid() is not None
    async with Client(build_server(ServerConfig.create(workspace))) as client:
        await client.list_tools()
    assert pool._kept is None  # pyright: ignore[reportPrivateUsage]
