"""Element types: safetensors dtype names and the numpy dtypes that hold them.

numpy has no 16-bit brain float or 8-bit floats; `ml_dtypes` provides them as real numpy dtypes
(``bfloat16``, ``float8_e4m3fn``, ...), so every tensor is a plain numpy array here. Names shown to the
agent are numpy's (``float32``, ``bfloat16``), which are also torch's names for the same types.
"""

from __future__ import annotations

import sys
from functools import cache
from typing import Any, Literal

import numpy as np

__all__ = [
    "SAFETENSORS_NAMES",
    "UNSUPPORTED_SAFETENSORS_DTYPES",
    "Category",
    "category",
    "dtype_name",
    "safetensors_dtype",
    "safetensors_name",
]

Category = Literal["bool", "int", "float", "complex"]

# safetensors stores little-endian bytes; the explicit "<" keeps that true on any host.
_NUMPY_DTYPES: dict[str, np.dtype[Any]] = {
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
    "F32": np.dtype("<f4"),
    "F64": np.dtype("<f8"),
    "C64": np.dtype("<c8"),
}
# Types numpy lacks, by their ml_dtypes name. ml_dtypes is imported only when a file names one of them:
# its first import costs over a second of CPU (measured 1.0-1.5 s), which a float32 comparison never needs.
_ML_DTYPES: dict[str, str] = {
    "BF16": "bfloat16",
    "F8_E4M3": "float8_e4m3fn",
    "F8_E5M2": "float8_e5m2",
    "F8_E4M3FNUZ": "float8_e4m3fnuz",
    "F8_E5M2FNUZ": "float8_e5m2fnuz",
    "F8_E8M0": "float8_e8m0fnu",
}
SAFETENSORS_NAMES = frozenset(_NUMPY_DTYPES) | frozenset(_ML_DTYPES)
"""Every safetensors dtype name that can be read."""

# Sub-byte types are packed several to a byte; there is no numpy view of them without unpacking.
UNSUPPORTED_SAFETENSORS_DTYPES = frozenset({"F4", "F6_E2M3", "F6_E3M2"})


@cache
def _ml_dtypes() -> dict[str, np.dtype[Any]]:
    import ml_dtypes

    return {name: np.dtype(getattr(ml_dtypes, attr)) for name, attr in _ML_DTYPES.items()}


def safetensors_dtype(name: str) -> np.dtype[Any] | None:
    """The numpy dtype holding safetensors dtype ``name`` (bfloat16 and float8 via ml_dtypes), or None
    for a name that is not a readable dtype."""
    found = _NUMPY_DTYPES.get(name)
    if found is not None or name not in _ML_DTYPES:
        return found
    return _ml_dtypes()[name]


def dtype_name(dtype: np.dtype[Any]) -> str:
    """The name reported for ``dtype`` (``float32``, ``bfloat16``, ``float8_e4m3fn``, ``bool``...)."""
    # numpy's stub types `name` as LiteralString, which pyright cannot resolve for Python 3.10.
    return str(dtype.name)  # pyright: ignore[reportUnknownMemberType, reportUnknownArgumentType]


def safetensors_name(dtype: np.dtype[Any]) -> str | None:
    """The safetensors dtype string for a numpy dtype, or None when safetensors has no such type."""
    # The scalar type gives the native-order dtype: byte order is handled when bytes are written.
    native = np.dtype(dtype.type)
    for name, known in _NUMPY_DTYPES.items():
        if known == native:
            return name
    if native.kind != "V":
        return None
    return next((name for name, known in _ml_dtypes().items() if known == native), None)


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
    # A dtype of ml_dtypes exists only once ml_dtypes is imported: no need to import it to rule one out.
    if dtype.kind == "V" and "ml_dtypes" in sys.modules and dtype in _ml_dtypes().values():
        return "float"
    return None
