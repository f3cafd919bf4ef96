"""The vector JSONL decoder reads uniform record blocks, declines the rest, and never disagrees with msgspec."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from perfgate.audit import AuditInputError, read_observed
from perfgate.audit import read_jsonl as jsonl_module
from perfgate.audit._jsonl_columns import uniform_columns
from perfgate.audit.read_jsonl import (
    _LINE_DECODER,  # pyright: ignore[reportPrivateUsage]  # the schema the reader passes
)

INT64_MAX = 2**63 - 1


def columns_of(text: str) -> Any:
    block = text.encode()
    return uniform_columns(block, block.count(b"\n"), _LINE_DECODER)


def no_columns(*_: object) -> None:
    return None


def read_both(path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Any, Any]:
    """What the reader gives with the vector decoder, and with msgspec alone."""

    def outcome() -> Any:
        try:
            r = read_observed(path)
        except AuditInputError as exc:
            return ("error", str(exc))
        optional = (r.step, r.session, r.restart, r.pass_index)
        return (
            r.ids.values.tolist(),
            None if r.ids.is_str is None else r.ids.is_str.tolist(),
            r.ids.all_str,
            r.pool.strings,
            r.epoch.tolist(),
            r.rank.tolist(),
            r.worker.tolist(),
            [None if c is None else (str(c.dtype), c.tolist()) for c in optional],
            r.malformed.count,
            r.malformed.examples,
            r.notes,
        )

    fast = outcome()
    with monkeypatch.context() as m:
        m.setattr(jsonl_module, "uniform_columns", no_columns)
        slow = outcome()
    return fast, slow


def test_harness_and_json_dumps_lines_are_read_as_columns() -> None:
    harness = "".join(
        f'{{"sample_id":{i},"epoch":1,"rank":3,"worker":-1,"session":1764620000123456789,"step":{i // 4},"pass":0}}\n'
        for i in range(1000)
    )
    cols = columns_of(harness)
    assert cols is not None
    assert cols.sample_id.tolist() == list(range(1000))
    assert cols.worker.tolist() == [-1] * 1000
    assert cols.session.tolist() == [1764620000123456789] * 1000
    assert cols.step.tolist() == [i // 4 for i in range(1000)]
    assert cols.restart is None
    dumps = "".join(
        json.dumps({"sample_id": -i, "epoch": 0, "rank": 0, "worker": 0, "step": None, "restart": True})
        + "\r\n"
        for i in range(50)
    )
    cols = columns_of(dumps)
    assert cols is not None
    assert cols.sample_id.tolist() == [-i for i in range(50)]
    assert cols.step is None
    assert cols.restart is not None and cols.restart.all()
    edges = f'{{"sample_id":{INT64_MAX},"epoch":0,"rank":0,"worker":0}}\n{{"sample_id":{-(2**63)},"epoch":0,"rank":0,"worker":0}}\n'
    cols = columns_of(edges)
    assert cols is not None and cols.sample_id.tolist() == [INT64_MAX, -(2**63)]


GOOD = '{"sample_id":7,"epoch":0,"rank":0,"worker":0}\n'


@pytest.mark.parametrize(
    "line",
    [
        '{"sample_id":"7","epoch":0,"rank":0,"worker":0}',  # string id
        '{"epoch":0,"sample_id":7,"rank":0,"worker":0}',  # other key order
        '{"sample_id":07,"epoch":0,"rank":0,"worker":0}',  # leading zero
        '{"sample_id":-07,"epoch":0,"rank":0,"worker":0}',
        '{"sample_id":7-1,"epoch":0,"rank":0,"worker":0}',  # minus inside a number
        '{"sample_id":--7,"epoch":0,"rank":0,"worker":0}',
        '{"sample_id":-,"epoch":0,"rank":0,"worker":0}',  # lone minus
        '{"sample_id":7.5,"epoch":0,"rank":0,"worker":0}',  # float
        '{"sample_id":7e3,"epoch":0,"rank":0,"worker":0}',
        f'{{"sample_id":{2**63},"epoch":0,"rank":0,"worker":0}}',  # beyond int64
        f'{{"sample_id":{-(2**63) - 1},"epoch":0,"rank":0,"worker":0}}',
        '{"sample_id":77777777777777777777,"epoch":0,"rank":0,"worker":0}',  # 20 digits
        '{"sample_id":7,"epoch":0,"rank":0,"worker":0,"restart":true}',  # another constant
        '{"sample_id":7,"epoch":0,"rank":0,"worker":0} ',  # trailing space
        "",  # blank line
        '{"sample_id":7,"epoch":0,"rank":0,"worker":0}{"sample_id":7,"epoch":0,"rank":0,"worker":0}',
    ],
)
def test_a_line_unlike_the_first_sends_the_block_to_msgspec(line: str) -> None:
    assert columns_of(GOOD * 3) is not None
    assert columns_of(GOOD + line + "\n" + GOOD) is None


def test_a_byte_that_stands_for_a_number_in_the_skeleton_is_not_taken_for_one() -> None:
    block = (GOOD + GOOD.replace("7", "\xff") + GOOD).encode("latin-1")  # 0xFF where a number was
    assert uniform_columns(block, 3, _LINE_DECODER) is None


@pytest.mark.parametrize(
    "first",
    [
        '{"sample_id":7,"epoch":0,"rank":0}',  # no worker
        '{"sample_id":7,"epoch":0,"rank":0,"worker":true}',  # msgspec refuses it
        '{"sample_id":7, "epoch":0,"rank":0,"worker":0}',  # neither encoder's spacing
        '{"sample_id":7,"epoch":0,"rank":0,"worker":0,"host":"a"}',  # a string field
        '{"sample_id":7,"epoch":0,"rank":0,"worker":0,"x1":1}',  # digits in a key
        '{"sample_id":7,"epoch":0,"rank":0,"worker":0,"epoch":1}',  # a key twice
        '{"sample_id":7,"epoch":0,"rank":0,"worker":0,"t":[1]}',  # nested
        "[7,0,0,0]",
    ],
)
def test_a_first_line_that_is_no_flat_integer_record_is_no_template(first: str) -> None:
    assert columns_of(first + "\n" + GOOD) is None


_KEYS = ["sample_id", "epoch", "rank", "worker", "step", "session", "restart", "pass", "extra"]
_NUMBERS = st.one_of(st.integers(-3, 40), st.integers(-(2**63), INT64_MAX))
_EDGES = st.one_of(
    st.integers(-(2**64), 2**64),
    st.sampled_from([INT64_MAX, INT64_MAX + 1, -(2**63), -(2**63) - 1, 10**18, 10**19 - 1, 10**19]),
)
_VALUES = st.one_of(_NUMBERS, _EDGES, st.none(), st.booleans(), st.sampled_from(["7", "a-1", 1.5]))
_RAW_NUMBERS = st.sampled_from(["07", "-0", "-01", "1-2", "--3", "-", "1e3", "00", "3.0", "0" * 19])


def rare(n: int) -> st.SearchStrategy[bool]:
    """True about once in `n` draws, False in the simplest example (where hypothesis starts)."""
    return st.integers(0, n - 1).map(lambda x: x == n - 1)


@st.composite
def jsonl_files(draw: st.DrawFn) -> bytes:
    """Lines of one template with their numbers changed; now and then a number JSON does not allow,
    a value of another type, or a line of another shape."""
    keys = draw(st.permutations(_KEYS[:4] + draw(st.lists(st.sampled_from(_KEYS[4:]), unique=True))))
    if draw(rare(10)):
        keys = keys[1:]  # a required field left out
    template = {k: draw(_VALUES if draw(rare(6)) else _NUMBERS) for k in keys}
    numeric = [k for k, v in template.items() if type(v) is int]
    compact = draw(st.booleans())
    lines: list[str] = []
    for _ in range(draw(st.integers(1, 12))):
        record = {k: draw(_NUMBERS) if k in numeric else v for k, v in template.items()}
        raw = None
        if numeric and draw(rare(8)):
            record[draw(st.sampled_from(numeric))] = draw(_EDGES)
        if numeric and draw(rare(8)):
            record[draw(st.sampled_from(numeric))] = "RAW"
            raw = draw(_RAW_NUMBERS)
        elif draw(rare(16)):
            record[draw(st.sampled_from(keys))] = draw(_VALUES)
        text = json.dumps(record, separators=(",", ":") if compact else None)
        if raw is not None:
            text = text.replace('"RAW"', raw)
        if draw(rare(20)):
            text = draw(st.sampled_from(["", " ", "{", "[1]", text + text]))
        lines.append(text)
    ending = draw(st.sampled_from(["\n", "\r\n"]))
    return (ending.join(lines) + ending).encode()


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=jsonl_files(), block=st.sampled_from([60, 200, 8 << 20]))
def test_the_reader_gives_what_msgspec_alone_gives(
    data: bytes, block: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(jsonl_module, "_BLOCK_BYTES", block)
    path = tmp_path / "records.jsonl"
    path.write_bytes(data)
    fast, slow = read_both(path, monkeypatch)
    assert fast == slow


def test_large_uniform_file_reads_the_same_both_ways(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(3)
    ids = rng.permutation(40_000)
    text = "".join(
        f'{{"sample_id":{i},"epoch":{e},"rank":{i % 8},"worker":{i % 3 - 1},"step":{n}}}\n'
        for n, (i, e) in enumerate(zip(ids.tolist(), (np.arange(40_000) // 9_000).tolist(), strict=True))
    )
    path = tmp_path / "records.jsonl"
    path.write_text(text)
    monkeypatch.setattr(jsonl_module, "_BLOCK_BYTES", 1 << 18)  # several blocks
    fast, slow = read_both(path, monkeypatch)
    assert fast == slow
    assert fast[0] == ids.tolist()


def test_auditing_jsonl_does_not_import_the_tensors_package(tmp_path: Path) -> None:
    # perfgate.tensors pulls in ml_dtypes, which takes seconds to import on a loaded machine: an audit
    # of records needs none of it (only NPZ/NPY readers borrow its header helpers, on first use)
    path = tmp_path / "records.jsonl"
    path.write_text(GOOD * 4)
    code = (
        "import sys; from pathlib import Path; from perfgate.audit import AuditPolicy, audit_path; "
        f"audit_path(Path({str(path)!r}), AuditPolicy(world_size=1), expected_range=(0, 8)); "
        "print(sorted(m for m in sys.modules if m.startswith(('perfgate.tensors', 'ml_dtypes'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    assert out.stdout.strip() == "[]"


def test_a_long_line_is_named_by_number_while_earlier_blocks_are_still_decoding(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(jsonl_module, "_BLOCK_BYTES", 120)  # two or three lines a block, many in flight
    monkeypatch.setattr(jsonl_module, "MAX_LINE_BYTES", 200)
    path = tmp_path / "records.jsonl"
    path.write_text(GOOD * 40 + '{"sample_id":1,"pad":"' + "x" * 300 + '"}\n' + GOOD)
    with pytest.raises(AuditInputError, match="line 41 is longer than 200 bytes"):
        read_observed(path)
