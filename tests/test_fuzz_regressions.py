"""Inputs the long fuzz run (tests/test_fuzz.py, PERFGATE_FUZZ_COLLECT=1) found crashing a reader, kept as
regression tests: each must now end in the reader's own error, with a sentence."""

from __future__ import annotations

import io
import struct
from pathlib import Path

import numpy as np
import pytest

from perfgate.audit.errors import AuditInputError
from perfgate.audit.expected import read_expected
from perfgate.audit.ids import StringPool
from perfgate.audit.read import read_observed

_CENTRAL = b"PK\x01\x02"
_LOCAL = b"PK\x03\x04"


def _npz(**arrays: np.ndarray) -> bytearray:
    buf = io.BytesIO()
    np.savez(buf, **arrays)  # pyright: ignore[reportArgumentType]
    return bytearray(buf.getvalue())


def _patch_members(data: bytearray, *, method: int | None = None, flags: int | None = None) -> bytes:
    """Rewrite every member's compression method / flag bits in both the local and central headers."""
    for signature, flag_at, method_at in ((_LOCAL, 6, 8), (_CENTRAL, 8, 10)):
        at = data.find(signature)
        while at >= 0:
            if flags is not None:
                struct.pack_into("<H", data, at + flag_at, flags)
            if method is not None:
                struct.pack_into("<H", data, at + method_at, method)
            at = data.find(signature, at + 4)
    return bytes(data)


def _records() -> bytearray:
    return _npz(
        sample_id=np.arange(4),
        epoch=np.zeros(4, np.int64),
        rank=np.zeros(4, np.int64),
        worker=-np.ones(4, np.int64),
    )


@pytest.mark.parametrize(
    ("patch", "expected"),
    [
        # Found by the fuzz run: method 8192 made zipfile raise NotImplementedError on opening the member.
        ({"method": 8192}, "compression method 8192; numpy.savez writes only stored or deflated"),
        ({"method": 14}, "compression method 14"),  # LZMA: zipfile reads it, numpy never writes it
        ({"flags": 1}, "the member is encrypted"),  # zipfile would raise RuntimeError (password required)
    ],
)
def test_npz_members_zipfile_cannot_open_are_refused_by_name(
    tmp_path: Path, patch: dict[str, int], expected: str
) -> None:
    observed = tmp_path / "records.npz"
    observed.write_bytes(_patch_members(_records(), **patch))
    with pytest.raises(AuditInputError, match=expected) as info:
        read_observed(observed)
    assert "records.npz:" in str(info.value)  # the file and the member are named
    ids = tmp_path / "expected.npz"
    ids.write_bytes(_patch_members(_npz(sample_id=np.arange(4)), **patch))
    with pytest.raises(AuditInputError, match=expected):
        read_expected(ids, StringPool())


FUZZ_FIXTURES = Path(__file__).parent / "fixtures" / "fuzz"


def test_a_parquet_file_whose_row_groups_yield_fewer_rows_than_declared_is_an_error(tmp_path: Path) -> None:
    # Found by the fuzz run: the metadata and its row group say 8 rows, reading yields none; an assert
    # fired (AssertionError reached the agent as a perfgate bug).
    pytest.importorskip("pyarrow")
    path = tmp_path / "records.parquet"
    path.write_bytes((FUZZ_FIXTURES / "parquet_rows_vanish.parquet").read_bytes())
    with pytest.raises(AuditInputError, match="declares 8 rows but the row groups yielded 0"):
        read_observed(path)


class _Group:
    def __init__(self, rows: int) -> None:
        self.num_rows = rows


class _Meta:
    def __init__(self, rows: int, groups: list[int]) -> None:
        self.num_rows, self._groups = rows, groups
        self.num_row_groups = len(groups)

    def row_group(self, i: int) -> _Group:
        return _Group(self._groups[i])


class _File:
    def __init__(self, rows: int, groups: list[int]) -> None:
        self.metadata = _Meta(rows, groups)


def test_parquet_row_counts_are_checked_before_columns_are_allocated(tmp_path: Path) -> None:
    from perfgate.audit.read_parquet import _row_count  # pyright: ignore[reportPrivateUsage]

    path = tmp_path / "r.parquet"
    path.write_bytes(b"x" * 1000)
    # A 1 kB file claiming ten billion rows would have np.empty ask for 240 GB.
    with pytest.raises(AuditInputError, match=r"declares 10000000000 rows .* audit\._files\.MAX_GZIP_RATIO"):
        _row_count(_File(10**10, [10**10]), str(path))
    with pytest.raises(AuditInputError, match="declares 8 rows but its row groups hold 5"):
        _row_count(_File(8, [5]), str(path))
    assert _row_count(_File(1000, [600, 400]), str(path)) == 1000


@pytest.mark.parametrize(
    ("fixture", "expected"),
    [
        ("parquet_int_under_8_bits.parquet", "Integers with less than 8 bits"),
        ("parquet_int_over_64_bits.parquet", "Integers with more than 64 bits"),
    ],
)
def test_parquet_schemas_pyarrow_cannot_convert_are_input_errors(
    tmp_path: Path, fixture: str, expected: str
) -> None:
    # Found by the fuzz run after the row-count fix: a flipped bit in the schema gives an integer column
    # of 3 or 128 bits; pyarrow raises ArrowNotImplementedError, neither an OSError nor a ValueError.
    pytest.importorskip("pyarrow")
    path = tmp_path / "records.parquet"
    path.write_bytes((FUZZ_FIXTURES / fixture).read_bytes())
    with pytest.raises(AuditInputError, match=f"cannot read .*records.parquet as Parquet: {expected}"):
        read_observed(path)
    with pytest.raises(AuditInputError, match=expected):
        read_expected(path, StringPool())


def _read_every_chunk_or_refuse(path: Path) -> None:
    """Read every tensor of ``path`` through; refusing the file (`TensorInputError`) is an accepted
    outcome, any other exception (a warning escaping under warnings-as-errors) fails the test."""
    from perfgate.tensors import TensorInputError
    from perfgate.tensors.source import open_tensor_source

    try:
        with open_tensor_source(path) as source:
            for key in source.entries:
                for _ in source.chunks(key, 1 << 12):
                    pass
    except TensorInputError:
        pass


def test_an_npy_header_in_python_2_syntax_is_read_without_a_warning_escaping(tmp_path: Path) -> None:
    # Found by the fuzz run: a mutated header that numpy parses only with its Python 2 fallback makes
    # it warn; under warnings-as-errors (this suite's setting) the UserWarning escaped every NPY reader.
    blob = (FUZZ_FIXTURES / "npy_python2_header.npy").read_bytes()
    path = tmp_path / "x.npy"
    path.write_bytes(blob)
    _read_every_chunk_or_refuse(path)
    (tmp_path / "ids.npy").write_bytes(blob[:-1])
    with pytest.raises(AuditInputError):  # read as expected ids: a sentence, whatever the header says
        read_expected(tmp_path / "ids.npy", StringPool())


def test_a_jsonl_integer_id_beyond_64_bits_is_an_input_error(tmp_path: Path) -> None:
    # Found by the fuzz run: an all-integer block decodes ids of any size; numpy's int64 column overflowed.
    path = tmp_path / "records.jsonl"
    lines = ['{"sample_id": -9999999999999999999999999999990, "epoch": 0, "rank": 0, "worker": -1}']
    lines += [f'{{"sample_id": {i}, "epoch": 0, "rank": 0, "worker": -1}}' for i in range(1, 8)]
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(
        AuditInputError, match="does not fit in a signed 64-bit int: write such ids as strings"
    ):
        read_observed(path)


def test_an_npz_member_with_a_deprecated_dtype_alias_is_refused_as_input(tmp_path: Path) -> None:
    # Found by the fuzz run: a header with dtype 'a' makes numpy 2 warn (DeprecationWarning), which
    # escaped the tensor reader under warnings-as-errors.
    path = tmp_path / "x.npz"
    path.write_bytes((FUZZ_FIXTURES / "npz_dtype_alias_a.npz").read_bytes())
    _read_every_chunk_or_refuse(path)


def test_a_zip_needing_an_unsupported_zip_version_is_an_input_error(tmp_path: Path) -> None:
    # Found by the fuzz run: a directory entry asking for zip version 12.8 made zipfile raise
    # NotImplementedError, which escaped the tensor reader.
    from perfgate.tensors import TensorInputError
    from perfgate.tensors.source import open_tensor_source

    blob = (FUZZ_FIXTURES / "zip_version_12_8.npy").read_bytes()
    path = tmp_path / "x.npy"
    path.write_bytes(blob)
    with pytest.raises(TensorInputError, match=r"zip file version 12\.8"), open_tensor_source(path):
        pass
    observed = tmp_path / "records.npz"
    observed.write_bytes(blob)
    with pytest.raises(AuditInputError, match=r"zip file version 12\.8"):
        read_observed(observed)
