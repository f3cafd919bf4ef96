"""The two-thread layout: one thread reads chunk pairs ahead while the calling thread computes them.

What must hold whatever the timing: every pair reaches the consumer once and in order, a read error
reaches it in order too, the reader never runs more than a few pairs ahead (memory stays bounded), and
once the comparison returns (finished, failed or cancelled) no thread is reading the files any more."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from perfgate.harness.dump import dump_tensors
from perfgate.tensors import (
    CompareOptions,
    ComparisonCancelled,
    ComparisonReport,
    _engine,  # pyright: ignore[reportPrivateUsage]
    compare_sources,
    open_tensor_source,
)

_ReadAhead = _engine._ReadAhead  # pyright: ignore[reportPrivateUsage]
AHEAD = _engine._READ_AHEAD + _engine._FIRST_HERE  # pyright: ignore[reportPrivateUsage]


def _pairs(count: int, produced: list[int], fail_at: int | None = None) -> Iterator[tuple[Any, Any]]:
    for i in range(count):
        if i == fail_at:
            raise OSError(f"read failed at pair {i}")
        produced.append(i)
        yield np.array([i]), np.array([-i])


def _reading_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "perfgate-read"]


def test_every_pair_arrives_once_in_order_and_the_reader_stays_a_few_pairs_ahead() -> None:
    produced: list[int] = []
    reader = _ReadAhead(_pairs(200, produced))
    got: list[int] = []
    lead = 0
    try:
        for a, b in reader:
            got.append(int(a[0]))
            assert int(b[0]) == -int(a[0])
            lead = max(lead, len(produced) - len(got))
            if len(got) % 20 == 0:
                time.sleep(0.005)  # a slow consumer: the reader fills the queue and must wait
    finally:
        reader.close()
    assert got == list(range(200))
    assert lead <= _engine._READ_AHEAD + 2  # pyright: ignore[reportPrivateUsage]
    assert not _reading_threads()


def test_a_read_error_reaches_the_consumer_after_the_pairs_before_it() -> None:
    produced: list[int] = []
    reader = _ReadAhead(_pairs(50, produced, fail_at=17))
    got: list[int] = []

    def consume() -> None:
        try:
            for a, _ in reader:
                got.append(int(a[0]))
        finally:
            reader.close()

    with pytest.raises(OSError, match="pair 17"):
        consume()
    assert got == list(range(17))
    assert not _reading_threads()


def test_a_consumer_that_stops_early_stops_the_reader() -> None:
    produced: list[int] = []
    reader = _ReadAhead(_pairs(10_000, produced))
    for a, _ in reader:
        if int(a[0]) == 5:
            break
    reader.close()
    assert not _reading_threads()
    assert len(produced) <= 6 + AHEAD  # it read at most a queue's worth past the consumer
    stopped_at = len(produced)
    time.sleep(0.02)
    assert len(produced) == stopped_at


def test_two_workers_give_the_figures_of_one(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    ref: np.ndarray[Any, Any] = rng.standard_normal(20_000).astype(np.float32)
    cand: np.ndarray[Any, Any] = np.array(ref)
    cand[rng.choice(ref.size, 40, replace=False)] += 1.0
    dump_tensors(tmp_path / "r.safetensors", {"x": ref})
    dump_tensors(tmp_path / "c.safetensors", {"x": cand})
    reports: list[ComparisonReport] = []
    for workers in (1, 2):
        with (
            open_tensor_source(tmp_path / "r.safetensors") as r,
            open_tensor_source(tmp_path / "c.safetensors") as c,
        ):
            r.start_digests(["blake3"])  # reads that hash: two workers read ahead
            options = CompareOptions(atol=1e-3, rtol=0.0, chunk_elements=333, workers=workers)
            reports.append(compare_sources(r, c, options))
    assert reports[0] == reports[1]
    assert reports[0].tensors[0].mismatched == 40


def test_a_cancelled_comparison_leaves_no_thread_reading(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from perfgate.tensors import _mapped  # pyright: ignore[reportPrivateUsage]

    dump_tensors(tmp_path / "r.safetensors", {"x": np.zeros(50_000, np.float32)})
    reads: list[int] = []
    read_into = _mapped.ChunkedFile.read_into

    def counted(self: _mapped.ChunkedFile, out: Any, offset: int) -> None:
        reads.append(offset)
        read_into(self, out, offset)

    monkeypatch.setattr(_mapped.ChunkedFile, "read_into", counted)
    polls: list[int] = []

    def cancelled() -> bool:
        polls.append(1)
        return len(polls) > 6

    with (
        open_tensor_source(tmp_path / "r.safetensors") as r,
        open_tensor_source(tmp_path / "r.safetensors") as c,
    ):
        r.start_digests(["blake3"])
        options = CompareOptions(atol=0, rtol=0, chunk_elements=100, workers=2)
        with pytest.raises(ComparisonCancelled):
            compare_sources(r, c, options, cancelled=cancelled)
    assert not _reading_threads()
    done = len(reads)
    assert done < 2 * (7 + AHEAD + 1)  # the reader stopped a queue's worth past the cancel, not at the end
    time.sleep(0.02)
    assert len(reads) == done


def test_a_second_thread_that_does_not_pay_gives_way_to_one_then_is_tried_again() -> None:
    layout = _engine._Layout()  # pyright: ignore[reportPrivateUsage]
    assert layout.read_ahead()
    layout.measured(1.9)  # it got nearly two cores: keep it
    assert layout.read_ahead()
    layout.measured(1.0)  # the two threads shared one core: one thread does everything
    retry = _engine._RETRY_AFTER  # pyright: ignore[reportPrivateUsage]
    assert [layout.read_ahead() for _ in range(retry + 1)] == [False] * retry + [True]


def test_switching_layouts_between_tensors_changes_no_figure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rng = np.random.default_rng(5)
    ref: dict[str, np.ndarray[Any, Any]] = {
        f"t{i}": rng.standard_normal(6_000).astype(np.float32) for i in range(8)
    }
    cand: dict[str, np.ndarray[Any, Any]] = {
        k: v + np.float32(1e-3) * rng.standard_normal(v.size).astype(np.float32) for k, v in ref.items()
    }
    dump_tensors(tmp_path / "r.safetensors", ref)
    dump_tensors(tmp_path / "c.safetensors", cand)
    layouts: list[bool] = []
    read_ahead = _engine._Layout.read_ahead  # pyright: ignore[reportPrivateUsage]

    def recorded(self: Any) -> bool:
        layouts.append(read_ahead(self))
        return layouts[-1]

    monkeypatch.setattr(_engine._Layout, "read_ahead", recorded)  # pyright: ignore[reportPrivateUsage]
    monkeypatch.setattr(_engine, "_MEASURED_CHUNKS", 1)
    reports: list[ComparisonReport] = []
    for paying in (0.0, float("inf")):  # every measure pays; none does
        monkeypatch.setattr(_engine, "_PAYING_PARALLELISM", paying)
        with (
            open_tensor_source(tmp_path / "r.safetensors") as r,
            open_tensor_source(tmp_path / "c.safetensors") as c,
        ):
            r.start_digests(["blake3"])
            options = CompareOptions(atol=1e-3, rtol=0.0, chunk_elements=500, workers=2)
            reports.append(compare_sources(r, c, options))
    assert layouts[:8] == [True] * 8
    assert layouts[8:] == [True, False, False, False, False, True, False, False]
    assert reports[0] == reports[1]
    assert 0 < (reports[0].tensors[0].mismatched or 0) < 6_000
