"""Element types: safetensors dtype names and the numpy dtypes that hold them.

numpy has no 16-bit brain float or 8-bit floats; `ml_dtypes` provides them as real numpy dtypes
(``bfloat16``, ``float8_e4m3fn``, ...), so every tensor is a plain numpy array here. Names shown to the
agent are numpy's (``float32``, ``bfloat16``), which are also torch's names for the same types.
"""

from __future__ import annotations

from typing import Any, Literal

import ml_dtypes
import numpy as np

__all__ = [
    "SAFETENSORS_DTYPES",
    "UNSUPPORTED_SAFETENSORS_DTYPES",
    "Category",
    "category",
    "dtype_name",
    "safetensors_name",
]

Category = Literal["bool", "int", "float", "complex"]

# safetensors stores little-endian bytes; the explicit "<" keeps that true on any host.
SAFETENSORS_DTYPES: dict[str, np.dtype[Any]] = {
    "BOOL": np.dtype(np.bool_),
    "U8": np.dtype("<u1"),
    "I8": np.dtype("<i1"),
    "U16": np.dtype("<u2"),
    "I16": np.dtype("<i2"),
    "U32": np.dtype("<u4"),
    "I32": np.dtype("<i4"),
    "U64": np.dtype("<u8"),
    "I64": np.dtype("<i8"),
    "F16": np.dtype("<f2"),
    "BF16": np.dtype(ml_dtypes.bfloat16),
    "F32": np.dtype("<f4"),
    "F64": np.dtype("<f8"),
    "C64": np.dtype("<c8"),
    "F8_E4M3": np.dtype(ml_dtypes.float8_e4m3fn),
    "F8_E5M2": np.dtype(ml_dtypes.float8_e5m2),
    "F8_E4M3FNUZ": np.dtype(ml_dtypes.float8_e4m3fnuz),
    "F8_E5M2FNUZ": np.dtype(ml_dtypes.float8_e5m2fnuz),
    "F8_E8M0": np.dtype(ml_dtypes.float8_e8m0fnu),
}

# Sub-byte types are packed several to a byte; there is no numpy view of them without unpacking.
UNSUPPORTED_SAFETENSORS_DTYPES = frozenset({"F4", "F6_E2M3", "F6_E3M2"})

_ML_FLOATS = frozenset(dt for dt in SAFETENSORS_DTYPES.values() if dt.kind == "V")
_BY_NUMPY: dict[np.dtype[Any], str] = {dt: name for name, dt in SAFETENSORS_DTYPES.items()}


def dtype_name(dtype: np.dtype[Any]) -> str:
    """The name reported for ``dtype`` (``float32``, ``bfloat16``, ``float8_e4m3fn``, ``bool``...)."""
    # numpy's stub types `name` as LiteralString, which pyright cannot resolve for Python 3.10.
    return str(dtype.name)  # pyright: ignore[reportUnknownMemberType, reportUnknownArgumentType]


def safetensors_name(dtype: np.dtype[Any]) -> str | None:
    """The safetensors dtype string for a numpy dtype, or None when safetensors has no such type."""
    # The scalar type gives the native-order dtype: byte order is handled when bytes are written.
    return _BY_NUMPY.get(np.dtype(dtype.type))


def category(dtype: np.dtype[Any]) -> Category | None:
    """How values of ``dtype`` are compared, or None when they cannot be (strings, objects, records).

    ml_dtypes floats report numpy kind ``V`` (opaque), so they are recognised by identity. Extended
    precision (``longdouble``) is refused: the comparison computes in float64, which would round it.
    """
    if dtype.kind == "b":
        return "bool"
    if dtype.kind in "iu":
        return "int"
    if dtype.kind == "f" and dtype.itemsize <= 8:
        return "float"
    if dtype.kind == "c" and dtype.itemsize <= 16:
        return "complex"
    if dtype in _ML_FLOATS:
        return "float"
    return None
