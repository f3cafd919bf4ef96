"""Robust statistics of a series of step times, and the Student t quantile the intervals use."""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["NOISY_IQR_RATIO", "StepStats", "step_stats", "t975"]

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


# Two-sided 95% Student t quantiles (0.975) by degrees of freedom; interpolated in 1/df.
_T975 = (
    (1.0, 12.706),
    (2.0, 4.303),
    (3.0, 3.182),
    (4.0, 2.776),
    (5.0, 2.571),
    (6.0, 2.447),
    (7.0, 2.365),
    (8.0, 2.306),
    (9.0, 2.262),
    (10.0, 2.228),
    (12.0, 2.179),
    (15.0, 2.131),
    (20.0, 2.086),
    (30.0, 2.042),
    (60.0, 2.000),
    (120.0, 1.980),
    (math.inf, 1.960),
)


def t975(df: float) -> float:
    """The two-sided 95% Student t quantile for ``df`` degrees of freedom (table, interpolated in 1/df)."""
    if df <= 1.0:
        return _T975[0][1]
    for (d0, t0), (d1, t1) in itertools.pairwise(_T975):
        if df <= d1:
            x0, x1 = 1.0 / d0, (0.0 if math.isinf(d1) else 1.0 / d1)
            return t0 + (t1 - t0) * (x0 - 1.0 / df) / (x0 - x1)
    return _T975[-1][1]
