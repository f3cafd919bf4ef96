"""NPZ reader: one array per column, loaded without pickle (object arrays are refused)."""

from __future__ import annotations

import math
import zipfile
import zlib
from pathlib import Path
from typing import IO, Any

import numpy as np
from numpy.typing import NDArray

from perfgate.audit._files import MAX_GZIP_RATIO, RATIO_EXEMPT_BYTES
from perfgate.audit.errors import AuditInputError
from perfgate.audit.ids import SampleIds, StringPool
from perfgate.audit.records import REQUIRED_COLUMNS, RecordBuilder
from perfgate.helpers.safeopen import open_file

__all__ = ["check_array_file", "ids_from_array", "load_array_file", "read_npz"]

_ENCRYPTED = 0x1
"""General-purpose flag bit 0 of a zip member: encrypted."""


def load_array_file(path: Path, f: IO[bytes]) -> Any:
    """`numpy.load` of the open file ``f`` once `check_array_file` passed (no pickle, ever)."""
    from perfgate.tensors._npy import quiet_py2_header  # here: the tensors package is slow to import

    check_array_file(path, f)
    f.seek(0)
    with quiet_py2_header():
        return np.load(f, allow_pickle=False)


def _load_checked(path: Path, f: IO[bytes]) -> Any:
    loaded = load_array_file(path, f)
    if isinstance(loaded, np.ndarray):
        raise AuditInputError(f"{path}: a single NPY array, not an NPZ archive of columns")
    return loaded


def _npy_bytes(stream: IO[bytes], where: str) -> int:
    """Header plus data bytes that an NPY header declares (read from ``stream``, nothing else)."""
    from perfgate.tensors._npy import NPY_HEADER_ERRORS, quiet_py2_header

    try:
        with quiet_py2_header():
            version = np.lib.format.read_magic(stream)
            if version == (1, 0):
                shape, _, dtype = np.lib.format.read_array_header_1_0(stream, max_header_size=10_000)
            else:
                shape, _, dtype = np.lib.format.read_array_header_2_0(stream, max_header_size=10_000)
    except (*NPY_HEADER_ERRORS, zlib.error, zipfile.BadZipFile) as exc:
        raise AuditInputError(f"{where}: malformed NPY header ({type(exc).__name__}: {exc})") from exc
    if dtype.hasobject:
        raise AuditInputError(
            f"{where}: object array: it needs pickle, which is never loaded; save ids as an integer or "
            "unicode array"
        )
    return stream.tell() + math.prod(int(d) for d in shape) * dtype.itemsize


def check_array_file(path: Path, f: IO[bytes]) -> None:
    """Refuse an NPY/NPZ file whose headers claim more than the file can hold, before numpy allocates.

    An NPY header may claim any shape (numpy would allocate it); an NPZ member may inflate to any size.
    Each array's declared size must match what the file (or the member's declared size) holds, and a
    deflated member may expand at most MAX_GZIP_RATIO times (the same cap as ``.gz`` record files).

    ``f`` is the open file (`perfgate.helpers.safeopen.open_file`); it is left at an unspecified position.

    Raises:
        AuditInputError: naming the file, the member and the limit.
    """
    try:
        if not zipfile.is_zipfile(f):
            size = f.seek(0, 2)
            f.seek(0)
            declared = _npy_bytes(f, str(path))
            if declared != size:
                raise AuditInputError(
                    f"{path}: the NPY header declares {declared} bytes but the file holds {size}: truncated or "
                    "not an array numpy.save wrote"
                )
            return
        with zipfile.ZipFile(f) as zf:
            for info in zf.infolist():
                where = f"{path}:{info.filename}"
                # zipfile would fail on these only when the member is opened, with errors no caller expects.
                if info.flag_bits & _ENCRYPTED:
                    raise AuditInputError(f"{where}: the member is encrypted; numpy.savez never encrypts")
                if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
                    raise AuditInputError(
                        f"{where}: compression method {info.compress_type}; numpy.savez writes only stored or "
                        "deflated members. Re-save the arrays with numpy.savez or numpy.savez_compressed"
                    )
                limit = max(RATIO_EXEMPT_BYTES, MAX_GZIP_RATIO * info.compress_size)
                if info.file_size > limit:
                    raise AuditInputError(
                        f"{where} declares {info.file_size} bytes from {info.compress_size} compressed, over "
                        f"{MAX_GZIP_RATIO}x (limit audit._files.MAX_GZIP_RATIO): refusing a possible "
                        "decompression bomb. If the file is genuine, save it with numpy.savez (uncompressed)"
                    )
                if info.filename.endswith(".npy"):
                    with zf.open(info) as member:
                        declared = _npy_bytes(member, where)  # pyright: ignore[reportArgumentType]  # a binary stream
                    if declared != info.file_size:
                        raise AuditInputError(
                            f"{where}: the NPY header declares {declared} bytes but the member holds "
                            f"{info.file_size}: a truncated or lying member"
                        )
    except (OSError, zipfile.BadZipFile, EOFError, zlib.error, NotImplementedError) as exc:
        raise AuditInputError(f"cannot read {path}: {exc}") from exc


def read_npz(path: Path, builder: RecordBuilder) -> None:
    """Add the records of one NPZ file whose arrays are the columns.

    Raises:
        AuditInputError: unreadable file, pickled/object arrays, a missing column, columns of
            different lengths or of the wrong dtype.
    """
    from perfgate.tensors._npy import quiet_py2_header

    source = str(path)
    builder.sources.append(source)
    try:
        with open_file(path) as f, _load_checked(path, f) as npz:
            names = set(npz.files)
            missing = [c for c in REQUIRED_COLUMNS if c not in names]
            if missing:
                raise AuditInputError(
                    f"{source}: no {', '.join(repr(c) for c in missing)} array (arrays: "
                    f"{', '.join(sorted(names)) or 'none'}). Required: {', '.join(REQUIRED_COLUMNS)}; "
                    "optional: step, session, restart."
                )
            with quiet_py2_header():
                cols: dict[str, NDArray[Any]] = {
                    name: npz[name]
                    for name in (*REQUIRED_COLUMNS, "step", "session", "restart")
                    if name in names
                }
    except AuditInputError:
        raise
    except (OSError, zipfile.BadZipFile, EOFError, zlib.error) as exc:
        raise AuditInputError(f"cannot read {source} as NPZ: {exc}") from exc
    except ValueError as exc:
        raise AuditInputError(
            f"{source}: {exc}. Object arrays need pickle, which is never loaded: save ids as an "
            "integer or unicode array"
        ) from exc
    lengths = {name: arr.shape for name, arr in cols.items()}
    n = int(cols["sample_id"].shape[0]) if cols["sample_id"].ndim == 1 else -1
    if any(shape != (n,) for shape in lengths.values()):
        raise AuditInputError(f"{source}: columns must be 1-D arrays of one length, got shapes {lengths}")
    ids = ids_from_array(cols.pop("sample_id"), builder.pool, source)
    ints = {name: _int_column(arr, name, source) for name, arr in cols.items() if name != "restart"}
    restart = cols.get("restart")
    if restart is not None and restart.dtype != np.bool_:
        raise AuditInputError(f"{source}: 'restart' must be a bool array, got {restart.dtype}")
    builder.add(
        source,
        1,
        ids,
        epoch=ints["epoch"],
        rank=ints["rank"],
        worker=ints["worker"],
        step=None if "step" not in ints else ints["step"].astype(np.int64, copy=False),
        session=None if "session" not in ints else ints["session"].astype(np.int64, copy=False),
        restart=restart,
    )


def ids_from_array(arr: NDArray[Any], pool: StringPool, source: str) -> SampleIds:
    """Sample ids from a typed array: integers, or unicode strings interned in `pool`.

    Raises:
        AuditInputError: floats, bools, bytes or uint64 values beyond int64.
    """
    kind = arr.dtype.kind
    if kind == "i":
        return SampleIds.of_ints(arr.astype(np.int64, copy=False))
    if kind == "u":
        if arr.size and int(arr.max()) > np.iinfo(np.int64).max:
            raise AuditInputError(f"{source}: sample ids beyond int64: write them as strings")
        return SampleIds.of_ints(arr.astype(np.int64))
    if kind == "U":
        uniques, inverse = np.unique(arr, return_inverse=True)
        mapping = pool.codes(uniques.tolist())
        return SampleIds.of_strings(mapping[np.ravel(inverse)])
    raise AuditInputError(
        f"{source}: sample_id has dtype {arr.dtype}; use an integer or unicode string array "
        "(floats and bytes are ambiguous ids)"
    )


def _int_column(arr: NDArray[Any], name: str, source: str) -> NDArray[np.integer[Any]]:
    if arr.dtype.kind not in "iu":
        raise AuditInputError(f"{source}: '{name}' must be an integer array, got {arr.dtype}")
    if arr.dtype == np.uint64:
        return arr.astype(np.int64)
    return arr
