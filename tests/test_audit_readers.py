"""Reading observed and expected ids: every format, bad lines with their numbers, clear errors."""

from __future__ import annotations

import csv
import gzip
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from perfgate.audit import (
    AuditInputError,
    AuditPolicy,
    IdRange,
    StringPool,
    audit_path,
    audit_records,
    read_expected,
    read_observed,
)
from perfgate.audit import read_jsonl as jsonl_module


def rec(sample_id: Any, epoch: int = 0, rank: int = 0, worker: int = 0, **extra: Any) -> dict[str, Any]:
    return {"sample_id": sample_id, "epoch": epoch, "rank": rank, "worker": worker, **extra}


def write_jsonl(path: Path, rows: list[Any]) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def ids_of(path: Path) -> list[Any]:
    records = read_observed(path)
    mask = records.ids.str_mask()
    return [
        records.pool.strings[v] if is_str else v
        for v, is_str in zip(records.ids.values.tolist(), mask.tolist(), strict=True)
    ]


def test_malformed_jsonl_lines_are_reported_by_number_and_the_rest_is_kept(tmp_path: Path) -> None:
    rows: list[Any] = [
        rec(0),
        '{"sample_id": 1, "epoch": 0, "rank": 0,',  # truncated: line 2
        rec(2),
        rec(1.5),  # float id: line 4
        rec(True),  # bool id: line 5
        rec(5, epoch=-1),  # negative epoch: line 6
        json.dumps(rec(6)) + " " + json.dumps(rec(7)),  # two records on one line: line 7
        {"sample_id": 8, "epoch": 0, "rank": 0},  # no worker: line 8
        rec(9),
    ]
    path = write_jsonl(tmp_path / "obs.jsonl", rows)
    records = read_observed(path)
    assert records.ids.values.tolist() == [0, 2, 9]
    assert records.malformed.count == 6
    assert [m.line for m in records.malformed.examples] == [2, 4, 5, 6, 7, 8]
    assert "worker" in records.malformed.examples[-1].reason
    report = audit_path(path, AuditPolicy(world_size=1), expected_range=(0, 10))
    bad = next(f for f in report.findings if f.kind == "malformed_records")
    assert (bad.severity, bad.count) == ("error", 6)
    assert "line 2" in bad.message
    assert report.malformed_records == 6


def test_line_numbers_stay_right_across_blocks_blank_lines_crlf_and_a_missing_last_newline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(jsonl_module, "_BLOCK_BYTES", 97)  # a block holds about one line
    lines = [json.dumps(rec(i)) for i in range(40)]
    lines[17] = "not json"
    lines[30] = ""
    path = tmp_path / "obs.jsonl"
    path.write_bytes(("\r\n".join(lines)).encode())
    records = read_observed(path)
    assert records.ids.values.tolist() == [i for i in range(40) if i not in (17, 30)]
    assert [m.line for m in records.malformed.examples] == [18]


def test_gzip_jsonl_reads_like_plain(tmp_path: Path) -> None:
    path = tmp_path / "obs.jsonl.gz"
    with gzip.open(path, "wt") as f:
        f.writelines(json.dumps(rec(i, step=i)) + "\n" for i in range(5))
    records = read_observed(path)
    assert records.ids.values.tolist() == list(range(5))
    assert records.step is not None and records.step.tolist() == list(range(5))


def test_a_field_missing_from_every_record_is_a_clear_error(tmp_path: Path) -> None:
    path = write_jsonl(
        tmp_path / "obs.jsonl", [{"id": i, "epoch": 0, "rank": 0, "worker": 0} for i in range(3)]
    )
    with pytest.raises(AuditInputError, match=r"no 'sample_id' field.*fields seen: epoch, id, rank, worker"):
        read_observed(path)


def test_int_and_string_ids_stay_distinct_and_the_mixture_is_reported(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "obs.jsonl", [rec(1), rec("1"), rec("a"), rec(2), rec(1, rank=1)])
    assert ids_of(path) == [1, "1", "a", 2, 1]
    report = audit_path(path, AuditPolicy(world_size=2), expected_range=(0, 3))
    epoch = report.epochs[0]
    assert (epoch.unique, epoch.duplicates, epoch.missing, epoch.extra) == (4, 1, 1, 2)
    assert set(epoch.examples.extra) == {"1", "a"}
    assert epoch.examples.missing == [0]
    kinds = {f.kind: f for f in report.findings}
    assert kinds["mixed_id_types"].count == 2
    assert kinds["ambiguous_ids"].count == 1
    assert "1 and '1'" in kinds["ambiguous_ids"].message
    assert report.id_types.model_dump() == {"int_records": 3, "str_records": 2}


def test_string_ids_only(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "obs.jsonl", [rec(f"img{i:03d}") for i in range(4)])
    expected = tmp_path / "expected.json"
    expected.write_text(json.dumps([f"img{i:03d}" for i in range(5)]))
    report = audit_path(path, AuditPolicy(world_size=1), expected=expected)
    assert report.epochs[0].missing == 1
    assert report.epochs[0].examples.missing == ["img004"]


def test_csv_reads_canonical_integers_as_ints_and_reports_bad_rows(tmp_path: Path) -> None:
    path = tmp_path / "obs.csv"
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["sample_id", "epoch", "rank", "worker", "step"])
        w.writerows(
            [["7", 0, 0, 0, 1], ["007", 0, 0, 0, 1], ["x", "one", 0, 0, 1], ["9", 0, 0], ["-3", 0, 0, 0, 2]]
        )
    assert ids_of(path) == [7, "007", -3]
    records = read_observed(path)
    assert [m.line for m in records.malformed.examples] == [4, 5]
    assert records.step is not None and records.step.tolist() == [1, 1, 2]


def test_csv_without_a_required_column_names_it(tmp_path: Path) -> None:
    path = tmp_path / "obs.csv"
    path.write_text("sample_id,epoch,worker\n1,0,0\n")
    with pytest.raises(AuditInputError, match="no 'rank' column"):
        read_observed(path)


def test_npz_columns_int_and_unicode_ids(tmp_path: Path) -> None:
    path = tmp_path / "obs.npz"
    n = 6
    zeros = np.zeros(n, dtype=np.int32)
    np.savez(
        path, sample_id=np.array(["a", "b", "a", "c", "d", "e"]), epoch=zeros, rank=zeros, worker=zeros - 1
    )
    assert ids_of(path) == ["a", "b", "a", "c", "d", "e"]
    np.savez(
        tmp_path / "ints.npz", sample_id=np.arange(n, dtype=np.uint16), epoch=zeros, rank=zeros, worker=zeros
    )
    assert ids_of(tmp_path / "ints.npz") == list(range(n))


@pytest.mark.parametrize(
    ("columns", "error"),
    [
        ({"sample_id": np.array([1, "a"], dtype=object)}, "pickle"),
        ({"sample_id": np.arange(2)}, "no 'epoch', 'rank', 'worker' array"),
        ({"sample_id": np.arange(2.0)}, "dtype float64"),
        ({"sample_id": np.arange(3)}, "one length"),
    ],
)
def test_npz_problems_are_clear_errors(tmp_path: Path, columns: dict[str, Any], error: str) -> None:
    base = {"epoch": np.zeros(2, np.int64), "rank": np.zeros(2, np.int64), "worker": np.zeros(2, np.int64)}
    if "no 'epoch'" in error:
        base = {}
    path = tmp_path / "obs.npz"
    np.savez(path, **{**base, **columns})
    with pytest.raises(AuditInputError, match=error):
        read_observed(path)


def test_parquet_int_string_and_dictionary_ids_with_null_rows_reported(tmp_path: Path) -> None:
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    table = pa.table(
        {
            "sample_id": pa.array(["a", None, "b", "a"]).dictionary_encode(),
            "epoch": pa.array([0, 0, 0, 1], pa.int16()),
            "rank": pa.array([0, 0, 1, 0]),
            "worker": pa.array([-1, -1, -1, -1]),
            "step": pa.array([0, 1, 2, 3]),
        }
    )
    pq.write_table(table, tmp_path / "obs.parquet", row_group_size=2)
    records = read_observed(tmp_path / "obs.parquet")
    assert [records.pool.strings[v] for v in records.ids.values.tolist()] == ["a", "b", "a"]
    assert [m.line for m in records.malformed.examples] == [2]
    assert records.epoch.tolist() == [0, 0, 1]
    pq.write_table(pa.table({"sample_id": [1, 2], "epoch": [0, 0], "rank": [0, 0]}), tmp_path / "bad.parquet")
    with pytest.raises(AuditInputError, match="no 'worker' column"):
        read_observed(tmp_path / "bad.parquet")


def test_parquet_without_pyarrow_says_how_to_install_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "obs.parquet"
    path.write_bytes(b"PAR1")
    for name in ("pyarrow", "pyarrow.parquet", "pyarrow.compute"):
        monkeypatch.setitem(sys.modules, name, None)  # what an environment without pyarrow looks like
    with pytest.raises(AuditInputError, match=r"perfgate\[parquet\]"):
        read_observed(path)


def test_a_folder_reads_every_record_file_in_name_order(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "b.jsonl", [rec(2), rec(3)])
    write_jsonl(tmp_path / "a.jsonl", [rec(0), rec(1)])
    (tmp_path / "notes.md").write_text("ignored")
    assert ids_of(tmp_path) == [0, 1, 2, 3]
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(AuditInputError, match="holds no observed record files"):
        read_observed(empty)
    with pytest.raises(AuditInputError, match="does not exist"):
        read_observed(tmp_path / "nope")
    with pytest.raises(AuditInputError, match="unsupported suffix"):
        read_observed(tmp_path / "notes.md")


def test_a_file_with_no_readable_record_is_an_error_that_quotes_the_first_problems(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "obs.jsonl", ["garbage", "more garbage"])
    with pytest.raises(AuditInputError, match=r"no readable observed records.*2 malformed; line 1"):
        audit_path(path, AuditPolicy())


@pytest.mark.parametrize(
    ("name", "content"),
    [
        ("e.json", json.dumps([0, 1, 2, "x"])),
        ("e.json", json.dumps({"ids": [0, 1, 2, "x"]})),
        ("e.jsonl", '0\n1\n\n{"sample_id": 2}\n"x"\n'),
        ("e.txt", "0\n1\n2\nx\n"),
        ("e.csv", "sample_id,label\n0,a\n1,b\n2,c\nx,d\n"),
    ],
)
def test_expected_ids_from_text_formats(tmp_path: Path, name: str, content: str) -> None:
    path = tmp_path / name
    path.write_text(content)
    pool = StringPool()
    ids = read_expected(path, pool)
    assert ids.counts_by_type() == (3, 1)
    assert pool.strings == ["x"]


def test_expected_ids_from_array_formats(tmp_path: Path) -> None:
    np.save(tmp_path / "e.npy", np.arange(5))
    np.savez(tmp_path / "e.npz", sample_id=np.array(["a", "b"]))
    pool = StringPool()
    assert read_expected(tmp_path / "e.npy", pool).values.tolist() == list(range(5))
    assert read_expected(tmp_path / "e.npz", pool).all_str
    with pytest.raises(AuditInputError, match="unknown suffix"):
        read_expected(tmp_path / "e.yaml", pool)
    (tmp_path / "bad.json").write_text(json.dumps([1, 2.5]))
    with pytest.raises(AuditInputError, match="JSON list of int or string ids"):
        read_expected(tmp_path / "bad.json", pool)
    with pytest.raises(AuditInputError, match="stop must be >= start"):
        IdRange(5, 3)


def test_expected_parquet_ids(tmp_path: Path) -> None:
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    pq.write_table(pa.table({"sample_id": ["p", "q"]}), tmp_path / "e.parquet")
    pool = StringPool()
    assert read_expected(tmp_path / "e.parquet", pool).all_str
    assert pool.strings == ["p", "q"]


def test_expected_duplicates_are_reported_and_counted_once(tmp_path: Path) -> None:
    obs = write_jsonl(tmp_path / "obs.jsonl", [rec(i) for i in range(3)])
    expected = tmp_path / "e.json"
    expected.write_text(json.dumps([0, 1, 2, 2]))
    records = read_observed(obs)
    report = audit_records(records, read_expected(expected, records.pool), AuditPolicy(world_size=1))
    assert report.expected_ids == 3
    assert report.status == "passed"
    assert {f.kind: f.count for f in report.findings}["expected_duplicates"] == 1


def test_parquet_rows_beyond_32_bit_ranks_are_malformed_and_step_nulls_are_refused(tmp_path: Path) -> None:
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    base = {"sample_id": [1, 2, 3], "epoch": [0, 0, 0], "worker": [0, 0, 0]}
    pq.write_table(pa.table({**base, "rank": [0, 2**40, 1]}), tmp_path / "wide.parquet")
    records = read_observed(tmp_path / "wide.parquet")
    assert records.ids.values.tolist() == [1, 3]
    assert [(m.line, m.reason) for m in records.malformed.examples] == [(2, "rank beyond 32 bits")]
    pq.write_table(pa.table({**base, "rank": [0, 0, 0], "step": [1, None, 2]}), tmp_path / "steps.parquet")
    with pytest.raises(AuditInputError, match="'step' has nulls"):
        read_observed(tmp_path / "steps.parquet")


def test_parquet_integer_columns_of_every_width_read_as_their_values(tmp_path: Path) -> None:
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    table = pa.table(
        {
            "sample_id": pa.array([5, 6, 7], pa.int64()),
            "epoch": pa.array([0, 3, 120], pa.int8()),
            "rank": pa.array([0, 65535, 7], pa.uint16()),
            "worker": pa.array([-1, 2**31 - 1, 0], pa.int32()),
            "step": pa.array([2**40, 1, 2], pa.uint64()),
        }
    )
    pq.write_table(table, tmp_path / "widths.parquet")
    records = read_observed(tmp_path / "widths.parquet")
    assert records.epoch.tolist() == [0, 3, 120]
    assert records.rank.tolist() == [0, 65535, 7]
    assert records.worker.tolist() == [-1, 2**31 - 1, 0]
    assert records.step is not None and records.step.tolist() == [2**40, 1, 2]
    pq.write_table(
        table.set_column(2, "rank", pa.array([0, 2**31, 1], pa.uint32())), tmp_path / "u32.parquet"
    )
    records = read_observed(tmp_path / "u32.parquet")
    assert [(m.line, m.reason) for m in records.malformed.examples] == [(2, "rank beyond 32 bits")]


def test_explicit_null_steps_count_as_absent(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "obs.jsonl", [rec(0, step=0), rec(1, step=None), rec(2, session=None)])
    records = read_observed(path)
    assert records.step is None
    assert records.notes == ("2 of 3 records have no step: step-based resume checks are off",)
    assert records.session is None


def test_expected_file_and_range_together_are_refused(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "obs.jsonl", [rec(0)])
    with pytest.raises(AuditInputError, match="not both"):
        audit_path(path, AuditPolicy(), expected=path, expected_range=(0, 1))
