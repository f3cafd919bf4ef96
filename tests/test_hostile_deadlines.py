"""Parsing runs off the event loop under a deadline, stops when cancelled, and counts what it reads."""

from __future__ import annotations

import gzip
import json
import threading
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import pytest
from mcp import Client

from perfgate.audit.errors import AuditInputError
from perfgate.audit.read import read_observed
from perfgate.audit.read_csv import MAX_ROW_BYTES
from perfgate.evidence import Ledger
from perfgate.helpers import deadline as deadline_module
from perfgate.helpers.deadline import DeadlineExceeded, ParseLimits, checkpoint, deadline
from perfgate.server import build_server
from perfgate.serving.runtime import ServerConfig
from perfgate.traces import AnalysisOptions, TraceTooLargeError, analyze_trace

pytestmark = pytest.mark.anyio


def _text(result: Any) -> str:
    return "\n".join(getattr(c, "text", "") for c in result.content)


def _trace(path: Path, steps: int) -> Path:
    events: list[dict[str, Any]] = []
    for step in range(steps):
        t = step * 1000
        events.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{step}", "ts": t, "dur": 900, "pid": 1, "tid": 1})  # fmt: skip
        events.append({"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": t + 10, "dur": 100, "pid": 1, "tid": 1})  # fmt: skip
        events.append({"ph": "X", "cat": "kernel", "name": "gemm", "ts": t + 50, "dur": 300, "pid": 0, "tid": 7, "args": {"device": 0, "stream": 7}})  # fmt: skip
    path.write_bytes(gzip.compress(json.dumps({"traceEvents": events}).encode(), compresslevel=1))
    return path


def _records_csv(path: Path, rows: int) -> Path:
    lines = ["sample_id,epoch,rank,worker"] + [f"{i},0,0,-1" for i in range(rows)]
    path.write_text("\n".join(lines) + "\n")
    return path


class _Clock:
    """A monotonic clock that moves one second per reading: the n-th checkpoint sees n seconds pass."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        self.now += 1.0
        return self.now


# ----------------------------------------------------------------------------- the mechanism


def test_checkpoint_does_nothing_outside_a_deadline() -> None:
    checkpoint()


def test_the_readers_reach_a_checkpoint_block_by_block(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A reader that checked only once (before or after the whole file) would make as few checkpoints
    # for a large file as for a tiny one.
    clock = _Clock()
    monkeypatch.setattr(deadline_module.time, "monotonic", clock)

    def checkpoints(read: Any, path: Path) -> float:
        before = clock.now
        with deadline(1e9, "reading", cancellable=False):
            read(path)
        return clock.now - before

    tiny, large = _trace(tmp_path / "tiny.json.gz", 1), _trace(tmp_path / "large.json.gz", 10_000)
    assert checkpoints(analyze_trace, large) >= checkpoints(analyze_trace, tiny) + 3  # 3.4 MB, 1 MB blocks
    tiny, large = _records_csv(tmp_path / "tiny.csv", 1), _records_csv(tmp_path / "large.csv", 200_000)
    assert checkpoints(read_observed, large) >= checkpoints(read_observed, tiny) + 20  # 2 MB, 64 kB blocks
    with (
        pytest.raises(DeadlineExceeded, match=r"auditing large\.csv ran past the 5 s parsing deadline"),
        deadline(5, "auditing large.csv", cancellable=False),
    ):
        read_observed(large)


async def test_a_cancelled_call_stops_its_worker_thread_at_the_next_checkpoint() -> None:
    started, stopped = threading.Event(), threading.Event()

    def work() -> None:
        with deadline(3600, "test work"):
            started.set()
            try:
                while True:
                    checkpoint()
                    stopped.wait(0.001)
            finally:
                stopped.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(anyio.to_thread.run_sync, work)
        await anyio.to_thread.run_sync(started.wait, 30)
        tg.cancel_scope.cancel()
    # run_sync does not abandon the thread: leaving the group means the worker has returned.
    assert stopped.is_set()


def test_limits_come_from_the_environment_and_refuse_nonsense() -> None:
    limits = ParseLimits.from_env({"PERFGATE_PARSE_DEADLINE_S": "2.5", "PERFGATE_MAX_TRACE_EVENTS": "1000"})
    assert limits == ParseLimits(deadline_s=2.5, max_trace_events=1000)
    assert ParseLimits.from_env({}) == ParseLimits()
    for bad in ("0", "-1", "nan", "inf", "soon"):
        with pytest.raises(ValueError, match="PERFGATE_PARSE_DEADLINE_S"):
            ParseLimits.from_env({"PERFGATE_PARSE_DEADLINE_S": bad})


# ----------------------------------------------------------------------------- through the tools


def _server(workspace: Path, limits: ParseLimits) -> Any:
    return build_server(ServerConfig.create(workspace, limits=limits))


async def test_a_trace_past_the_deadline_is_a_sentence_naming_the_limit(workspace: Path) -> None:
    _trace(workspace / "t.json.gz", 20)
    server = _server(workspace, ParseLimits(deadline_s=1e-9))
    async with Client(server) as client:
        result = await client.call_tool("analyze_trace", {"trace_paths": ["t.json.gz"]})
    text = _text(result)
    assert result.is_error
    assert "reading trace t.json.gz ran past the 1e-09 s parsing deadline" in text, text
    assert "perfgate serve --parse-deadline-s" in text and "PERFGATE_PARSE_DEADLINE_S" in text
    assert Ledger(workspace).records() == []


async def test_the_trace_tools_read_under_a_cancellable_deadline(
    workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from perfgate.traces import pool

    seen: list[Any] = []
    real = pool.load_table

    def watched(path: Path, options: AnalysisOptions) -> Any:
        seen.append(deadline_module._current.get())  # pyright: ignore[reportPrivateUsage]
        return real(path, options)

    monkeypatch.setattr(pool, "load_table", watched)  # the read (its parse is then kept for later calls)
    _trace(workspace / "t.json.gz", 20)
    async with Client(_server(workspace, ParseLimits(deadline_s=3600))) as client:
        result = await client.call_tool("analyze_trace", {"trace_paths": ["t.json.gz"]})
    assert not result.is_error, _text(result)
    assert len(seen) == 1 and seen[0] is not None
    assert seen[0].cancellable and seen[0].seconds == 3600


async def test_an_audit_past_the_deadline_is_a_sentence_naming_the_limit(workspace: Path) -> None:
    _records_csv(workspace / "r.csv", 100)
    server = _server(workspace, ParseLimits(deadline_s=1e-9))
    async with Client(server) as client:
        result = await client.call_tool("audit_samples", {"observed": "r.csv"})
    text = _text(result)
    assert result.is_error
    assert "auditing r.csv ran past the 1e-09 s parsing deadline" in text, text
    assert "--parse-deadline-s" in text
    assert Ledger(workspace).records() == []


async def test_a_trace_with_more_events_than_the_limit_is_refused_naming_it(workspace: Path) -> None:
    _trace(workspace / "t.json.gz", 20)  # 60 events
    server = _server(workspace, ParseLimits(max_trace_events=50))
    async with Client(server) as client:
        result = await client.call_tool("analyze_trace", {"trace_paths": ["t.json.gz"]})
    text = _text(result)
    assert result.is_error
    assert "more than 50 events" in text and "perfgate serve --max-trace-events N" in text, text
    assert "PERFGATE_MAX_TRACE_EVENTS" in text
    assert Ledger(workspace).records() == []


def test_the_event_limit_stops_the_read_at_the_batch_that_passes_it(tmp_path: Path) -> None:
    trace = _trace(tmp_path / "t.json.gz", 20_000)  # 60,000 events, about 8 MB of JSON
    total = len(gzip.decompress(trace.read_bytes()))
    options = AnalysisOptions(chunk_bytes=64 << 10, max_events=1000)
    with pytest.raises(TraceTooLargeError, match=r"more than 1000 events \(read \d+ by byte (\d+)") as info:
        analyze_trace(trace, options)
    read_to = int(str(info.value).split("by byte ")[1].split()[0])
    assert read_to < total // 2  # it stopped at the first megabyte, not after tabling every event


# ----------------------------------------------------------------------------- CSV rows


def test_a_csv_line_longer_than_the_limit_stops_with_its_line(tmp_path: Path) -> None:
    path = tmp_path / "r.csv"
    path.write_bytes(
        b"sample_id,epoch,rank,worker\n1,0,0,-1\n" + b"," * (MAX_ROW_BYTES * 3) + b"\n2,0,0,-1\n"
    )
    with pytest.raises(AuditInputError, match=r"the row after line 2 is longer than 1048576 bytes") as info:
        read_observed(path)
    assert "audit.read_csv.MAX_ROW_BYTES" in str(info.value)


def test_an_unclosed_quote_spanning_many_short_lines_is_a_long_row(tmp_path: Path) -> None:
    # Every line is short and so is every field, but quoted fields holding a line break join the lines
    # into one row that would grow without end.
    path = tmp_path / "r.csv.gz"
    body = b"sample_id,epoch,rank,worker\n1,0,0,-1\n" + b'"a\n' + b'b","a\n' * MAX_ROW_BYTES
    path.write_bytes(gzip.compress(body))
    with pytest.raises(AuditInputError, match=r"the row after line 2 .* unclosed quote"):
        read_observed(path)


def test_csv_rows_at_the_limit_are_read(tmp_path: Path) -> None:
    path = tmp_path / "r.csv"
    wide = ",".join(["7"] * 400_000)  # an 800 kB row (too many fields: malformed, but under the cap)
    rows = "".join(f"{i},0,0,-1\n" for i in range(5))
    path.write_text(f"sample_id,epoch,rank,worker\n{wide}\n{rows}")
    records = read_observed(path)
    assert len(records) == 5 and records.malformed.count == 1
