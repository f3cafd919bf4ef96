"""Bounded memory: a trace far larger than the read block is analyzed without holding its JSON."""

from __future__ import annotations

import json
import tracemalloc
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from perfgate.traces import AnalysisOptions, analyze_trace
from perfgate.traces.analyses import ops, phases
from perfgate.traces.analyses.intervals import clip, difference, merge, merge_merged
from perfgate.traces.analyze import load_table
from perfgate.traces.reading.prepare import prepare
from perfgate.traces.reading.table import Columns

MUSA = Path(__file__).parent / "fixtures" / "traces" / "musa_s4000_rank1.json"


def replicate(path: Path, copies: int, pad: int) -> tuple[int, int]:
    """Write ``copies`` shifted copies of the MUSA fixture's step 3/4 work (padded names); returns
    (file bytes, complete events per copy)."""
    doc = json.loads(MUSA.read_text())
    events: list[dict[str, Any]] = [
        e
        for e in doc["traceEvents"]
        if e.get("ph") == "X" and not str(e.get("name", "")).startswith("Profiler")
    ]
    events = [e for e in events if e.get("cat") != "Trace" and e["ts"] < 1800]
    span = 1000.0
    with path.open("w") as out:
        out.write('{"schemaVersion": 1, "traceEvents": [\n')
        for k in range(copies):
            shift = k * span
            step = {"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{k}", "pid": 500, "tid": 100,
                    "ts": 1000 + shift, "dur": 800}  # fmt: skip
            rows = [step]
            for e in events:
                e2 = {**e, "ts": e["ts"] + shift}
                if "args" in e and "correlation" in e["args"]:
                    e2["args"] = {**e["args"], "correlation": e["args"]["correlation"] + 100 * k}
                if e.get("cat") == "cpu_op":
                    e2["name"] = e["name"] + "#" * pad  # bulk, as real stacks and shapes are
                rows.append(e2)
            out.write((",\n" if k else "") + ",\n".join(json.dumps(r) for r in rows))
        out.write("\n]}\n")
    return path.stat().st_size, len(events)


def test_a_large_trace_is_streamed_with_memory_far_below_its_size(tmp_path: Path) -> None:
    path = tmp_path / "large.json"
    copies = 1000
    size, per_copy = replicate(path, copies, pad=8000)
    assert size > 30e6
    tracemalloc.start()
    try:
        profile = analyze_trace(path, AnalysisOptions(chunk_bytes=1 << 20, include_last_step=True))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # Everything is counted...
    assert profile.event_counts["complete"] == copies * (per_copy + 1)
    assert profile.steps is not None and len(profile.steps.steps) == copies
    gemm = next(c for c in profile.categories if c.category == "gemm")
    assert gemm.count == copies
    assert profile.launch.launches == copies * 8
    # ...while Python allocations peak at a small fraction of the JSON size (json.load would need
    # several times the file size).
    assert peak < 0.25 * size, f"peak {peak / 1e6:.1f} MB for a {size / 1e6:.1f} MB trace"


@pytest.mark.parametrize("chunk_bytes", [4096, 1 << 20])
def test_results_do_not_depend_on_the_block_size(tmp_path: Path, chunk_bytes: int) -> None:
    path = tmp_path / "t.json"
    replicate(path, 50, pad=0)
    small = analyze_trace(path, AnalysisOptions(chunk_bytes=chunk_bytes))
    whole = analyze_trace(path, AnalysisOptions(chunk_bytes=64 << 20))
    assert small.model_dump(exclude={"event_counts"}) == whole.model_dump(exclude={"event_counts"})


# -- memory per kept event -----------------------------------------------------------------------
# Deterministic checks (byte counts of arrays, allocations traced by tracemalloc): machine load cannot
# flip them. They fail if the columns widen back to 64 bits per value or the parent pass holds the
# whole trace's walk at once.


def _table_bytes(cols: Columns) -> int:
    dense = sum(v.nbytes for v in cols.data.values())
    return dense + sum(s.rows.nbytes + s.values.nbytes for s in cols.sparse.values())


def test_event_columns_are_narrow_and_empty_columns_sparse(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    replicate(path, 20, pad=0)
    table, _, _ = load_table(path)
    for cols in (table.device, table.host, table.cpu):
        assert cols.data["name"].dtype == np.int32 and cols.data["cat"].dtype == np.int32
    assert table.cpu.data["tid"].dtype == np.int32 and table.cpu.data["grad"].dtype == np.int8
    assert table.device.data["direction"].dtype == np.int8
    # Profiler FLOPs and the work of shape ops are held only where present...
    assert set(table.cpu.sparse) == {"flops", "shape_flops", "shape_bytes", "shape_prec"}
    assert table.cpu.sparse["shape_flops"].rows.size == 20  # the one GEMM per copy
    # ...and read back as the dense columns they stand for.
    dense = table.cpu.f("shape_flops")
    assert dense.shape == (len(table.cpu),) and int(np.sum(~np.isnan(dense))) == 20
    assert table.cpu.i("shape_prec").dtype == np.int8
    # Bytes per kept event (64-bit ids and dense NaN columns cost 80, 56 and 72; here one CPU op in
    # five is a GEMM with shapes, far more than in real traces).
    assert _table_bytes(table.cpu) / len(table.cpu) <= 44
    assert _table_bytes(table.host) / len(table.host) <= 44
    assert _table_bytes(table.device) / len(table.device) <= 60


def _call_trees(rng: np.random.Generator, threads: int, per_thread: int) -> tuple[Any, Any, Any]:
    """Random nested calls on several threads, with equal starts, equal ends, zero-length events and
    some imperfect nesting (a child that outlives its parent)."""
    rows: list[tuple[float, float, int]] = []
    for tid in range(threads):
        t = 0.0
        first = len(rows)
        while len(rows) - first < per_thread:
            top = float(rng.integers(1, 40))
            rows.append((t, top, tid))
            inner = t
            for _ in range(int(rng.integers(0, 6))):
                start = inner + float(rng.integers(0, 3))
                dur = float(rng.integers(0, 12))
                rows.append((start, dur, tid))
                if rng.random() < 0.3:
                    rows.append((start, dur, tid))  # an exact duplicate
                inner = start + float(rng.integers(0, 4))
            t += top + float(rng.integers(0, 2))  # 0: the next tree starts where this one ends
    arr = np.array(rows)[rng.permutation(len(rows))]
    return arr[:, 0].copy(), arr[:, 1].copy(), arr[:, 2].astype(np.int32)


@pytest.mark.parametrize("chunk", [1, 2, 7, 64])
def test_the_parent_walk_in_pieces_finds_the_parents_of_one_walk(
    monkeypatch: pytest.MonkeyPatch, chunk: int
) -> None:
    rng = np.random.default_rng(chunk)
    for _ in range(5):
        ts, dur, tid = _call_trees(rng, threads=3, per_thread=300)
        monkeypatch.setattr(ops, "PARENT_CHUNK", 1 << 30)
        whole = ops.parent_rows(ts, dur, tid)
        monkeypatch.setattr(ops, "PARENT_CHUNK", chunk)
        pieces = ops.parent_rows(ts, dur, tid)
        assert (whole >= 0).sum() > len(ts) // 3
        np.testing.assert_array_equal(pieces, whole)


def test_the_parent_walk_holds_a_few_bytes_per_event(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(0)
    ts, dur, tid = _call_trees(rng, threads=2, per_thread=40_000)
    # Pieces far smaller than the trace, as on a trace of millions of ops with the default size.
    monkeypatch.setattr(ops, "PARENT_CHUNK", 2048)
    m = ts.size
    tracemalloc.start()
    try:
        parent = ops.parent_rows(ts, dur, tid)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert parent.dtype == np.int32
    # One walk over the whole trace held ~100 bytes per event (opens and closes, 64-bit keys).
    assert peak / m < 48, f"{peak / m:.1f} bytes per event"


def _runs(cells: Any) -> tuple[list[float], list[float]]:
    """Maximal runs of covered unit cells as [start, end) intervals."""
    padded = np.concatenate([[False], cells, [False]]).astype(np.int8)
    edges = np.flatnonzero(np.diff(padded))
    return edges[::2].astype(float).tolist(), edges[1::2].astype(float).tolist()


def _random_intervals(rng: np.random.Generator, n: int, span: int) -> tuple[Any, Any]:
    start = rng.integers(0, span, n).astype(float)
    return start, start + rng.integers(0, 12, n)


def _cells(start: Any, end: Any, span: int) -> Any:
    out = np.zeros(span + 12, bool)
    for s, e in zip(start.tolist(), end.tolist(), strict=True):
        out[int(s) : int(e)] = True
    return out


def test_difference_skips_the_intervals_that_cannot_cut_and_stays_exact() -> None:
    rng = np.random.default_rng(3)
    for _ in range(200):
        a_s, a_e = _random_intervals(rng, int(rng.integers(1, 6)), 300)
        b_s, b_e = _random_intervals(rng, int(rng.integers(1, 80)), 300)  # B far larger than A
        s, e = difference(a_s, a_e, b_s, b_e)
        assert (s.tolist(), e.tolist()) == _runs(_cells(a_s, a_e, 300) & ~_cells(b_s, b_e, 300))


def test_a_phase_union_built_in_chunks_equals_one_merge(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(5)
    for _ in range(50):
        s, e = _random_intervals(rng, 500, 2000)
        dur = e - s
        mask = rng.random(500) < 0.7
        lo, hi = 100.0, 1800.0
        whole = merge(*clip(s[mask], (s + dur)[mask], lo, hi))
        monkeypatch.setattr(phases, "UNION_CHUNK", int(rng.integers(1, 64)))
        chunked = phases._union(s, dur, mask, lo, hi)  # pyright: ignore[reportPrivateUsage]
        assert chunked[0].tolist() == whole[0].tolist() and chunked[1].tolist() == whole[1].tolist()


def test_end_times_are_derived_not_stored(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    replicate(path, 5, pad=0)
    for basis in ("exact", "hta_rounded"):
        table, _, _ = load_table(path)
        prepared = prepare(table, time_basis=basis, release=True)
        for cols in (prepared.device, prepared.host, prepared.cpu):
            assert "end" not in cols.data
            np.testing.assert_array_equal(cols.f("end"), cols.f("ts") + cols.f("dur"))


def test_merging_two_merged_sets_equals_merging_their_concatenation() -> None:
    rng = np.random.default_rng(11)
    for _ in range(300):
        a = merge(*_random_intervals(rng, int(rng.integers(0, 30)), 200))
        b = merge(*_random_intervals(rng, int(rng.integers(0, 30)), 200))
        got = merge_merged(*a, *b)
        want = merge(np.concatenate([a[0], b[0]]), np.concatenate([a[1], b[1]]))
        assert got[0].tolist() == want[0].tolist() and got[1].tolist() == want[1].tolist()


# -- the collectives' difference -----------------------------------------------------------------


def _ops_near(rng: np.random.Generator, a_s: Any, n: int) -> tuple[Any, Any]:
    """Random ops on a small grid, some ending or starting one float below a start of A (where
    `difference` decides a one-float piece by its rounded midpoint)."""
    ts = rng.integers(0, 400, n).astype(float)
    dur = rng.integers(0, 15, n).astype(float)
    if a_s.size:
        below = np.nextafter(a_s[rng.integers(0, a_s.size, n)], -np.inf)
        ends_below = rng.random(n) < 0.15
        ts[ends_below] = np.floor(below[ends_below]) - rng.integers(0, 4, int(ends_below.sum()))
        dur[ends_below] = below[ends_below] - ts[ends_below]
        starts_below = rng.random(n) < 0.1
        ts[starts_below] = below[starts_below]
    return ts, dur


def test_the_collectives_difference_merges_only_the_ops_that_reach_them_and_stays_exact() -> None:
    rng = np.random.default_rng(7)
    lo, hi = 20.0, 380.0
    quirks = 0
    for _ in range(400):
        a_s, a_e = merge(*clip(*_random_intervals(rng, int(rng.integers(1, 8)), 400), lo, hi))
        if a_s.size == 0:
            continue
        if rng.random() < 0.5:  # A intervals one float apart
            a_e[:-1] = np.minimum(a_e[:-1], np.nextafter(a_s[1:], -np.inf))
            a_s, a_e = merge(a_s, a_e)
        ts, dur = _ops_near(rng, a_s, int(rng.integers(1, 120)))
        mask = rng.random(ts.size) < 0.7
        all_ops = phases._union(ts, dur, mask, lo, hi)  # pyright: ignore[reportPrivateUsage]
        want = difference(a_s, a_e, *all_ops)
        got = phases._uncovered_by_ops(a_s, a_e, ts, dur, mask, lo, hi)  # pyright: ignore[reportPrivateUsage]
        assert got[0].tolist() == want[0].tolist() and got[1].tolist() == want[1].tolist()
        quirks += any(not np.any((a_s <= x) & (x < a_e)) for x in want[0].tolist())
    assert quirks > 0  # some results start one float before A: the midpoint's edge was exercised


def test_the_collectives_difference_does_not_merge_every_op_of_the_trace(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A few collectives in a trace of many ops: memory a byte or two per op, not the union of all ops
    (16 bytes per interval, and the sort of it)."""
    rng = np.random.default_rng(1)
    n = 300_000
    ts = np.cumsum(rng.integers(1, 5, n)).astype(np.float64)  # ops one after another, seldom touching
    dur = np.ones(n)
    mask = np.ones(n, bool)
    a_s = np.array([100.0, 5000.0, 90_000.0])
    a_e = a_s + 50.0
    monkeypatch.setattr(phases, "UNION_CHUNK", 4096)
    tracemalloc.start()
    try:
        s, e = phases._uncovered_by_ops(a_s, a_e, ts, dur, mask, 0.0, float(ts[-1]) + 10)  # pyright: ignore[reportPrivateUsage]
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    want = difference(a_s, a_e, ts, ts + dur)
    assert s.tolist() == want[0].tolist() and e.tolist() == want[1].tolist()
    assert peak / n < 4, f"{peak / n:.1f} bytes per op"


@pytest.mark.parametrize("rows_for_trims", [1, 1 << 20])
def test_analyses_return_freed_memory_only_for_a_million_row_table(
    monkeypatch: pytest.MonkeyPatch, rows_for_trims: int
) -> None:
    # Every trace counts as large by its bytes here; the analysis trims (after cutting the window and
    # between the analyses) only when the tables of the trace hold `TRIM_ROWS` rows (the MUSA fixture
    # holds a few hundred): each trim costs milliseconds and faults the next analysis's pages in again.
    from perfgate.traces import analyze

    trims: list[int] = []
    expected = analyze_trace(MUSA)
    monkeypatch.setattr(analyze, "TRIM_EVERY_BYTES", 1)
    monkeypatch.setattr(analyze, "TRIM_ROWS", rows_for_trims)
    table, header, stream = load_table(MUSA)
    monkeypatch.setattr(analyze, "release_free_memory", lambda: trims.append(1) or True)
    assert analyze.analyze_table(table, header, stream, MUSA, AnalysisOptions()) == expected
    assert len(trims) > 5 if rows_for_trims == 1 else not trims
