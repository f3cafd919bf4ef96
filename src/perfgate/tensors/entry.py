"""What a reader knows about one stored tensor before reading its values."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["TensorEntry"]


@dataclass(frozen=True)
class TensorEntry:
    """A tensor's name, element type and shape, and the file holding it.

    ``fortran_order`` is true for NPY data stored column-major: its elements stream in that order.
    """

    key: str
    dtype: np.dtype[Any]
    shape: tuple[int, ...]
    fortran_order: bool
    file: Path

    @property
    def elements(self) -> int:
        return math.prod(self.shape)

    @property
    def size_bytes(self) -> int:
        return self.elements * self.dtype.itemsize
