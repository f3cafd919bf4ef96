"""Robust statistics of a series of step times."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["NOISY_IQR_RATIO", "StepStats", "step_stats"]

NOISY_IQR_RATIO = 0.10
"""A window is noisy when IQR / median reaches this (torch.utils.benchmark warns at the same ratio)."""


@dataclass(frozen=True)
class StepStats:
    """Order statistics of step times in milliseconds (linear-interpolated percentiles)."""

    n: int
    median_ms: float
    p95_ms: float
    q1_ms: float
    q3_ms: float
    mean_ms: float
    min_ms: float
    max_ms: float

    @property
    def iqr_ms(self) -> float:
        return self.q3_ms - self.q1_ms

    @property
    def iqr_ratio(self) -> float:
        """IQR / median: a scale-free spread; 0 for a perfectly steady window."""
        return self.iqr_ms / self.median_ms if self.median_ms > 0 else 0.0

    @property
    def noisy(self) -> bool:
        return self.iqr_ratio >= NOISY_IQR_RATIO


def step_stats(step_ms: Sequence[float]) -> StepStats:
    """Median, p95, quartiles, mean and extremes of ``step_ms``.

    Raises:
        ValueError: the series is empty.
    """
    if len(step_ms) == 0:
        raise ValueError("no step times to summarise")
    a = np.asarray(step_ms, dtype=np.float64)
    q1, median, q3, p95 = np.percentile(a, [25.0, 50.0, 75.0, 95.0])
    return StepStats(
        n=int(a.size),
        median_ms=float(median),
        p95_ms=float(p95),
        q1_ms=float(q1),
        q3_ms=float(q3),
        mean_ms=float(a.mean()),
        min_ms=float(a.min()),
        max_ms=float(a.max()),
    )
