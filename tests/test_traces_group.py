"""Linear grouping equals np.unique, the launch link is the same with or without its lookup table, and
the grad-mode column found in the joined args equals a test per op."""

from __future__ import annotations

import msgspec
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from perfgate.traces.reading import _group, prepare
from perfgate.traces.reading.table import _SEQ, Columns, _has_key  # pyright: ignore[reportPrivateUsage]

keys = st.lists(st.integers(-5, 60), max_size=200) | st.lists(st.integers(0, 2**40), max_size=50)


@settings(max_examples=60, deadline=None)
@given(keys)
def test_grouping_equals_np_unique(values: list[int]) -> None:
    key = np.array(values, np.int64)
    assert np.array_equal(_group.unique_values(key), np.unique(key))
    unique, inverse = _group.unique_inverse(key)
    ref_unique, ref_inverse = np.unique(key, return_inverse=True)
    assert np.array_equal(unique, ref_unique) and np.array_equal(inverse, ref_inverse)
    unique, counts = _group.unique_counts(key)
    ref_unique, ref_counts = np.unique(key, return_counts=True)
    assert np.array_equal(unique, ref_unique) and np.array_equal(counts, ref_counts)


@settings(max_examples=50, deadline=None)
@given(
    st.lists(st.tuples(st.integers(-1, 30), st.integers(0, 50)), min_size=1, max_size=60),
    st.lists(st.integers(-1, 35), max_size=60),
)
def test_launch_rows_with_a_table_equal_the_sorted_search(
    host_rows: list[tuple[int, int]], device_corr: list[int]
) -> None:
    host = Columns(
        {
            "corr": np.array([c for c, _ in host_rows], np.int64),
            "ts": np.array([float(t) for _, t in host_rows], np.float64),
        }
    )
    device = Columns({"corr": np.array(device_corr, np.int64)})
    linear = prepare._launch_rows(device, host)
    with pytest.MonkeyPatch.context() as m:
        m.setattr(prepare, "TABLE_LIMIT", 0)  # force the sort-based path
        sorted_search = prepare._launch_rows(device, host)
    assert np.array_equal(linear, sorted_search)


# Pieces of the key and the key itself, twice in a row too: a match found across two ops' args, or a
# piece counted as the key, would mark the wrong op.
args_text = st.lists(
    st.sampled_from([b"", b'"Sequence', b' number"', _SEQ, _SEQ * 2, b": 7, ", b'"x"']), max_size=5
)


@settings(max_examples=80, deadline=None)
@given(st.lists(args_text, max_size=40))
def test_grad_mode_column_equals_a_test_per_op(ops: list[list[bytes]]) -> None:
    raws = [msgspec.Raw(b"{" + b"".join(parts) + b"}") for parts in ops]
    got = _has_key(raws, _SEQ, b"".join(raws))
    assert got.tolist() == [int(_SEQ in bytes(r)) for r in raws]
