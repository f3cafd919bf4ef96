"""The streaming trace reader: cutting the events array at any block size, and malformed input."""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from perfgate.traces import TraceFormatError, TraceStream, TraceTooLargeError, isal_available
from perfgate.traces.reading._events import decode_args

FIXTURES = Path(__file__).parent / "fixtures" / "traces"
MUSA = FIXTURES / "musa_s4000_rank1.json"
ROCM = FIXTURES / "rocm_mi300x_rank-3.json"


def read_all(path: Path, **kwargs: Any) -> tuple[list[dict[str, Any]], TraceStream]:
    stream = TraceStream(path, **kwargs)
    events = [
        {"ph": e.ph, "cat": e.cat, "name": e.name, "ts": e.ts, "dur": e.dur}
        for batch in stream.batches()
        for e in batch
    ]
    return events, stream


def expected(path: Path) -> list[dict[str, Any]]:
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rt") as fh:
        doc = json.load(fh)
    events = doc["traceEvents"] if isinstance(doc, dict) else doc
    return [
        {k: e.get(k, "" if k in ("ph", "cat", "name") else None) for k in ("ph", "cat", "name", "ts", "dur")}
        for e in events
    ]


def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


@pytest.mark.parametrize("chunk_bytes", [1, 7, 64, 300, 4 << 20])
@pytest.mark.parametrize("fixture", [MUSA, ROCM])
def test_every_block_size_yields_exactly_the_events_json_sees(fixture: Path, chunk_bytes: int) -> None:
    events, stream = read_all(fixture, chunk_bytes=chunk_bytes, read_block=max(1, chunk_bytes // 2))
    assert events == expected(fixture)
    assert stream.decoded_bytes == fixture.stat().st_size


def test_braces_commas_and_brackets_inside_strings_do_not_cut_events(tmp_path: Path) -> None:
    tricky = [
        {"ph": "X", "cat": "kernel", "name": 'a},{"ph": "X"}, {lambda()#1}]', "ts": 1, "dur": 2},
        {"ph": "X", "cat": "cpu_op", "name": 'quote " and backslash \\ }, {', "ts": 3, "dur": 4},
        {
            "ph": "X",
            "cat": "cpu_op",
            "name": "nested",
            "ts": 5,
            "dur": 6,
            "args": {"l": [{"a": 1}, {"b": 2}]},
        },
        {"ph": "i", "name": "}]}", "ts": 7},
    ]
    path = write(tmp_path / "t.json", json.dumps({"traceEvents": tricky, "traceName": "x"}))
    for chunk in (1, 5, 16, 1 << 20):
        events, _ = read_all(path, chunk_bytes=chunk, read_block=max(1, chunk // 2))
        assert [e["name"] for e in events] == [t["name"] for t in tricky]


def test_keys_after_the_events_are_merged_into_the_header(tmp_path: Path) -> None:
    doc = (
        '{"schemaVersion": 1, "traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "a", "ts": 1, "dur": 1}],'
        ' "distributedInfo": {"rank": 5, "world_size": 8}, "deviceProperties": [{"id": 0, "name": "G"}],'
        ' "baseTimeNanoseconds": 42}'
    )
    events, stream = read_all(write(tmp_path / "t.json", doc), chunk_bytes=8, read_block=4)
    assert len(events) == 1
    assert stream.header.schema_version == 1
    assert stream.header.distributed_info == {"rank": 5, "world_size": 8}
    assert stream.header.base_time_ns == 42


def test_a_bare_array_and_an_empty_events_array_are_valid(tmp_path: Path) -> None:
    bare = write(tmp_path / "bare.json", '[{"ph": "X", "cat": "kernel", "name": "k", "ts": 1, "dur": 2}]')
    assert [e["name"] for e in read_all(bare)[0]] == ["k"]
    empty = write(tmp_path / "empty.json", '{"schemaVersion": 1, "traceEvents": [ ]}')
    assert read_all(empty)[0] == []


def test_the_key_traceEvents_inside_a_header_string_is_not_taken_for_the_array(tmp_path: Path) -> None:
    doc = '{"note": "\\"traceEvents\\": [", "traceEvents": [{"ph": "X", "name": "real", "ts": 1, "dur": 1}]}'
    assert [e["name"] for e in read_all(write(tmp_path / "t.json", doc))[0]] == ["real"]


@pytest.mark.parametrize("decompressor", ["zlib", "isal", "auto"])
def test_gzip_traces_read_the_same_with_either_decompressor(tmp_path: Path, decompressor: str) -> None:
    if decompressor == "isal" and not isal_available():
        pytest.skip("python-isal is not installed")
    gz = tmp_path / "musa.json.gz"
    gz.write_bytes(gzip.compress(MUSA.read_bytes()))
    events, stream = read_all(gz, chunk_bytes=100, read_block=50, decompressor=decompressor)
    assert events == expected(MUSA)
    assert stream.compressed


def test_without_python_isal_gzip_traces_fall_back_to_zlib(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # python-isal is a dependency only where it has wheels: elsewhere "auto" reads with zlib, and asking
    # for isal by name says what is missing.
    monkeypatch.setitem(sys.modules, "isal", None)  # `import isal` now raises ImportError
    assert not isal_available()
    gz = tmp_path / "musa.json.gz"
    gz.write_bytes(gzip.compress(MUSA.read_bytes()))
    events, stream = read_all(gz, chunk_bytes=100, read_block=50, decompressor="auto")
    assert events == expected(MUSA)
    assert stream.compressed
    with pytest.raises(TraceFormatError, match="python-isal is not installed"):
        read_all(gz, decompressor="isal")


def test_a_truncated_gzip_file_is_a_clear_error(tmp_path: Path) -> None:
    data = gzip.compress(MUSA.read_bytes())
    gz = tmp_path / "cut.json.gz"
    gz.write_bytes(data[: len(data) // 2])
    with pytest.raises(TraceFormatError, match=r"truncated|corrupt"):
        read_all(gz)


def test_a_corrupt_gzip_stream_is_a_clear_error(tmp_path: Path) -> None:
    data = bytearray(gzip.compress(MUSA.read_bytes()))
    data[30:60] = b"\x00" * 30
    gz = tmp_path / "bad.json.gz"
    gz.write_bytes(bytes(data))
    with pytest.raises(TraceFormatError, match=r"decompress|invalid JSON|truncated"):
        read_all(gz)


def test_json_truncated_mid_array_says_the_trace_is_truncated(tmp_path: Path) -> None:
    text = MUSA.read_text()
    cut = write(tmp_path / "cut.json", text[: int(len(text) * 0.6)])
    with pytest.raises(TraceFormatError, match="truncated"):
        read_all(cut, chunk_bytes=256, read_block=100)


def test_invalid_json_inside_the_events_names_the_byte_offset(tmp_path: Path) -> None:
    text = MUSA.read_text().replace('"dur": 100,', '"dur": 100 oops,', 1)
    bad = write(tmp_path / "bad.json", text)
    with pytest.raises(TraceFormatError, match=r"invalid JSON.*near byte \d+|near byte \d+.*invalid JSON"):
        read_all(bad, chunk_bytes=128, read_block=64)


@pytest.mark.parametrize(
    ("content", "match"),
    [
        ("", "empty"),
        ("   \n ", "empty"),
        ("PK\x03\x04 not json", "does not start with a JSON"),
        ('{"schemaVersion": 1, "events": []}', "no top-level 'traceEvents'"),
        ('{"traceEvents": [{"ph": "X"}], "x": }', "invalid JSON after the events"),
        ('{"traceEvents": []', "not closed"),
    ],
)
def test_files_that_are_not_traces_are_refused_with_a_reason(
    tmp_path: Path, content: str, match: str
) -> None:
    with pytest.raises(TraceFormatError, match=match):
        read_all(write(tmp_path / "t.json", content))


def test_an_enormous_single_event_is_refused_without_reading_it_whole(tmp_path: Path) -> None:
    big = {"ph": "X", "cat": "cpu_op", "name": "x" * (4 << 20), "ts": 1, "dur": 1}
    doc = {"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "small", "ts": 0, "dur": 1}, big, big]}
    path = write(tmp_path / "big.json", json.dumps(doc))
    stream = TraceStream(path, chunk_bytes=1024, max_value_bytes=1 << 20)
    with pytest.raises(TraceTooLargeError, match="larger than the limit"):
        for _ in stream.batches():
            pass
    assert stream.decoded_bytes < path.stat().st_size / 2
    # A limit above the event size reads it.
    assert len(read_all(path, max_value_bytes=16 << 20)[0]) == 3


def test_events_with_unexpected_field_types_are_converted_or_skipped(tmp_path: Path) -> None:
    doc = {
        "traceEvents": [
            {"ph": "X", "cat": "kernel", "name": "ok", "ts": "10", "dur": "2.5"},
            {"ph": "X", "cat": "kernel", "name": ["not", "a", "name"], "ts": 1, "dur": 1},
            {"ph": "X", "cat": "kernel", "name": "fine", "ts": 3, "dur": 1},
        ]
    }
    events, stream = read_all(write(tmp_path / "t.json", json.dumps(doc)))
    assert [(e["name"], e["ts"], e["dur"]) for e in events] == [("ok", 10, 2.5), ("fine", 3, 1)]
    assert stream.lenient_skipped == 1


def test_raw_args_stay_valid_after_the_reader_moves_on(tmp_path: Path) -> None:
    # Keep every batch while reading on: the raw args of early batches must still decode.
    batches = list(TraceStream(MUSA, chunk_bytes=64, read_block=32).batches())
    assert len(batches) > 3
    args = decode_args([e.args for batch in batches for e in batch])
    corr = [a.correlation for a in args if a.correlation != -1]  # -1: absent
    doc = json.loads(MUSA.read_text())
    assert corr == [
        e["args"]["correlation"] for e in doc["traceEvents"] if "correlation" in e.get("args", {})
    ]
    assert -1 not in corr and len(corr) > 10


def _complete_fields(stream: TraceStream) -> tuple[list[tuple[Any, ...]], int]:
    events: list[tuple[Any, ...]] = []
    seen = 0
    for count, batch in stream.complete_batches():
        seen += count
        events += [(e.cat, e.name, e.ts, e.dur, e.tid, bytes(e.args)) for e in batch]
    return events, seen


@pytest.mark.parametrize("chunk_bytes", [7, 300, 4 << 20])
def test_complete_batches_build_only_complete_events_and_count_the_rest(
    tmp_path: Path, chunk_bytes: int
) -> None:
    # Complete events among metadata, flows and instants; a phase outside the format and an event
    # without one (their batch is read leniently); odd field types converted or skipped as by `batches`.
    doc = {
        "traceEvents": [
            {"ph": "M", "name": "thread_name", "pid": 1, "tid": 7, "args": {"name": "main"}},
            {"ph": "X", "cat": "kernel", "name": "k", "ts": 1, "dur": 2, "tid": 7, "args": {"stream": 7}},
            {"ph": "s", "id": 1, "ts": 1, "cat": "ac2g", "name": "f"},
            {"ph": "X", "cat": "cpu_op", "name": "op", "ts": 1.5, "dur": 3, "tid": "t"},
            {"ph": "i", "name": "instant", "ts": 4, "s": "t"},
            {"ph": "Q", "name": "not a phase", "ts": 5},
            {"name": "no phase", "ts": 6, "dur": 1},
            {"ph": "X", "cat": "kernel", "name": "late", "ts": "10", "dur": "2.5", "args": {}},
            {"ph": "X", "cat": "kernel", "name": ["not", "a", "name"], "ts": 1, "dur": 1},
        ]
    }
    path = write(tmp_path / "t.json", json.dumps(doc))
    every = [e for batch in TraceStream(path, chunk_bytes=chunk_bytes).batches() for e in batch]
    lenient = TraceStream(path, chunk_bytes=chunk_bytes)
    got, seen = _complete_fields(lenient)
    assert got == [(e.cat, e.name, e.ts, e.dur, e.tid, bytes(e.args)) for e in every if e.ph == "X"]
    assert seen == len(every) == 8
    assert lenient.lenient_skipped == 1
    # A well-formed trace: the same complete events as `batches`, read by the typed decoder.
    for fixture in (MUSA, ROCM):
        plain = [e for b in TraceStream(fixture, chunk_bytes=chunk_bytes).batches() for e in b]
        typed = TraceStream(fixture, chunk_bytes=chunk_bytes)
        got, seen = _complete_fields(typed)
        assert got == [(e.cat, e.name, e.ts, e.dur, e.tid, bytes(e.args)) for e in plain if e.ph == "X"]
        assert seen == len(plain) and typed.lenient_skipped == 0


def test_a_brace_and_comma_inside_a_name_costs_no_failed_decode(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # C++ kernel names hold "}, " ("...{lambda(float)#1}, at::detail::Array<...>"): a cut there leaves the
    # run unbalanced, and its decode runs through the whole run before failing.
    name = "void k<at::native::f(at::TensorIteratorBase&)::{lambda(float)#1}, at::detail::Array<char*, 2> >"
    events = [{"ph": "X", "cat": "kernel", "name": name, "ts": i, "dur": 1, "tid": 7} for i in range(400)]
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": events}, separators=(", ", ": ")))
    failed: list[int] = []
    real = TraceStream._decode_run  # pyright: ignore[reportPrivateUsage]

    def counting(self: TraceStream, sep: int, close: int) -> list[Any]:
        try:
            return real(self, sep, close)
        except Exception:
            failed.append(close)
            raise

    monkeypatch.setattr(TraceStream, "_decode_run", counting)
    for block in (1000, 1100, 1234, 1500):
        stream = TraceStream(path, chunk_bytes=block, read_block=block)
        assert sum(len(b) for b in stream.batches()) == 400
    assert failed == []


def test_an_array_of_other_values_is_still_cut_between_them(tmp_path: Path) -> None:
    # "}, 5": not the end of an event as traces write them, but a top-level element all the same.
    body = ", ".join(f'{{"ph": "X", "name": "a", "ts": {i}, "dur": 1}}, {i}' for i in range(300))
    path = tmp_path / "t.json"
    path.write_text('{"traceEvents": [' + body + ', {"ph": "X", "name": "b", "ts": 0, "dur": 1}]}')
    stream = TraceStream(path, chunk_bytes=512, read_block=512)
    assert sum(len(b) for b in stream.batches()) == 301 and stream.lenient_skipped == 300


@given(
    st.lists(
        st.one_of(
            st.none(),
            st.integers(-(2**53), 2**53),
            # Beyond float64's exact integers, near and beyond int64's ends: exact, or absent and reported.
            st.integers(2**53 - 2, 2**53 + 2),
            st.integers(-(2**53) - 2, -(2**53) + 2),
            st.integers(2**63 - 2, 2**63 + 1),
            st.integers(-(2**63) - 1, -(2**63) + 2),
            st.integers(-(2**80), 2**80),
            st.floats(allow_nan=True, allow_infinity=True),
            st.sampled_from(
                [
                    "7",
                    "0x0",
                    "-3",
                    "1.5",
                    "",
                    "x",
                    "9007199254740993",
                    "18446744073709551615",
                    " 00000000000000000000000000012 ",
                    "-9223372036854775809",
                    "1" * 30,
                ]
            ),
        ),
        max_size=12,
    ),
    st.booleans(),
)
def test_arg_columns_convert_each_value_as_one_by_one(values: list[Any], absent: bool) -> None:
    from perfgate.traces.reading import table

    if absent:  # an arg no event of the batch has: the shortcut
        values = [None] * len(values)
    floats = np.array([table._to_float(v) for v in values], np.float64)  # pyright: ignore[reportPrivateUsage]
    ints = np.array([table._to_int(v) for v in values], np.int64)  # pyright: ignore[reportPrivateUsage]
    got_floats = table._floats(values)  # pyright: ignore[reportPrivateUsage]
    unheld: list[Any] = []
    got_ints = table._ints(values, unheld)  # pyright: ignore[reportPrivateUsage]
    assert got_floats.dtype == np.float64 and np.array_equal(got_floats, floats, equal_nan=True)
    assert got_ints.dtype == np.int64 and np.array_equal(got_ints, ints)
    # Every int64 is held exactly; what no int64 holds is reported, in row order, never wrapped.
    for got, value in zip(got_ints.tolist(), values, strict=True):
        if isinstance(value, int):
            assert got == (value if -(2**63) <= value < 2**63 else -1)
    assert unheld == [v for v in values if table.beyond_int64(v)]
