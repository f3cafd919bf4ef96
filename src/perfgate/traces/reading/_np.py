"""Typed conversions from numpy arrays to Python lists (numpy's ``tolist`` is untyped)."""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = ["bool_list", "float_list", "int_list"]


def int_list(values: npt.NDArray[np.integer[Any]]) -> list[int]:
    """The elements as Python ints."""
    out: list[int] = values.astype(np.int64).tolist()
    return out


def float_list(values: npt.NDArray[np.floating[Any]]) -> list[float]:
    """The elements as Python floats."""
    out: list[float] = values.astype(np.float64).tolist()
    return out


def bool_list(values: npt.NDArray[np.bool_]) -> list[bool]:
    """The elements as Python bools."""
    out: list[bool] = values.tolist()
    return out
