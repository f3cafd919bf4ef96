"""The verdict rule of an A/B comparison (no numpy: the compare_benchmarks input schema cites its default)."""

from __future__ import annotations

from typing import Literal

__all__ = ["DEFAULT_MIN_EFFECT", "Verdict", "decide"]

Verdict = Literal["improved", "regressed", "within_noise", "insufficient_launches"]
"""``insufficient_launches``: fewer than two launches on a side, so no verdict (set by the comparison)."""
DEFAULT_MIN_EFFECT = 0.01
"""Smallest relative change reported as a change, even when the interval excludes 1."""


def decide(speedup: float, low: float, high: float, min_effect: float = DEFAULT_MIN_EFFECT) -> Verdict:
    """``improved`` when the interval lies above 1 and the effect is at least ``min_effect``;
    ``regressed`` symmetrically; otherwise ``within_noise``."""
    if low > 1.0 and speedup >= 1.0 + min_effect:
        return "improved"
    if high < 1.0 and speedup <= 1.0 / (1.0 + min_effect):
        return "regressed"
    return "within_noise"
