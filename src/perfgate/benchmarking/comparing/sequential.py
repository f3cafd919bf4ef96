"""When a paired run may stop: a sequential test on the log ratios of adjacent launches' median steps.

A paired run launches baseline (A) and candidate (B) in turn, A B B A A B ..., and looks after every pair
from the third on. Each pair gives one figure, ``log(median step of A / median step of B)`` (positive: the
candidate is faster), and the look asks whether their mean excludes zero:

- **launch medians**: a stall or a periodic checkpoint inside a window moves a launch's mean, not its
  median; the median of 10-50 steps is close to normal across launches;
- **logs**: step time is multiplicative and right-skewed (a slower host scales every step); the log of a
  ratio is symmetric, and a 3x change is the same distance whichever side is slower;
- **adjacent pairs**: a slow drift of the host (thermal, a neighbour's job) hits both launches of a pair
  alike and cancels in their ratio, which is why the order alternates (A B, then B A).

Stopping when the answer looks settled inflates the error rate of a fixed-sample test, so the confidence
is spent across the looks (Bonferroni): with at most ``K`` pairs and looks at pairs ``MIN_PAIRS..K``, each
look is a two-sided Student t test at ``alpha / looks``. Whatever the data and whenever it stops, the
chance that any look declares a change that is not there is at most ``alpha`` (for normal log ratios;
`tests/test_paired_stopping.py` checks it by simulation on skewed, stalling, drifting step times).
Bonferroni is the plainest alpha-spending rule; with at most a dozen looks it costs little against
O'Brien-Fleming, and a 3x change clears even its first look.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

__all__ = ["MIN_PAIRS", "Look", "look", "t_quantile"]

MIN_PAIRS = 3
"""The first look: three pairs, so each side has the three launches compare_benchmarks wants."""


@dataclass(frozen=True)
class Look:
    """One look at ``pairs`` pairs: the speedup (candidate over baseline, from the mean log ratio), its
    interval at the look's share of the confidence, and whether the run may stop."""

    pairs: int
    speedup: float
    low: float
    high: float
    level: float
    """The two-sided confidence of this look's interval (1 - alpha / looks)."""
    settled: Literal["improved", "regressed"] | None

    def describe(self) -> str:
        state = f"settled {self.settled}" if self.settled else "not settled"
        return (
            f"{state} after {self.pairs} pair(s): speedup {self.speedup:.3f}x, interval "
            f"{self.low:.3f}-{self.high:.3f} at {self.level:.2%} (the confidence spent across the looks)"
        )


def looks(max_pairs: int) -> int:
    """How many looks a run of at most ``max_pairs`` pairs takes (one per pair from `MIN_PAIRS`)."""
    return max(1, max_pairs - MIN_PAIRS + 1)


def look(
    log_ratios: Sequence[float], *, max_pairs: int, alpha: float = 0.05, min_effect: float = 0.01
) -> Look:
    """The look after ``len(log_ratios)`` pairs of a run of at most ``max_pairs``: settled ``improved``
    when its interval lies above 1 and the speedup is at least ``1 + min_effect``, ``regressed``
    symmetrically, else not settled (before `MIN_PAIRS` never)."""
    n = len(log_ratios)
    mean = math.fsum(log_ratios) / n if n else 0.0
    level = 1.0 - alpha / looks(max_pairs)
    if n < MIN_PAIRS:
        return Look(n, math.exp(mean), 0.0, math.inf, level, None)
    sd = math.sqrt(math.fsum((x - mean) ** 2 for x in log_ratios) / (n - 1))
    half = t_quantile(1.0 - alpha / looks(max_pairs), n - 1) * sd / math.sqrt(n)
    low, high = math.exp(mean - half), math.exp(mean + half)
    speedup = math.exp(mean)
    settled: Literal["improved", "regressed"] | None = None
    if low > 1.0 and speedup >= 1.0 + min_effect:
        settled = "improved"
    elif high < 1.0 and speedup <= 1.0 / (1.0 + min_effect):
        settled = "regressed"
    return Look(n, speedup, low, high, level, settled)


def _t_two_sided_p(t: float, df: int) -> float:
    """P(|T| >= t) for Student t with integer ``df`` (Abramowitz & Stegun 26.7.3-4: a finite series)."""
    theta = math.atan(abs(t) / math.sqrt(df))
    c2, s = math.cos(theta) ** 2, math.sin(theta)
    if df % 2 == 1:
        term, total = math.cos(theta), 0.0
        for k in range(1, (df - 1) // 2 + 1):
            total += term
            term *= c2 * (2 * k) / (2 * k + 1)
        inside = (2.0 / math.pi) * (theta + s * total) if df > 1 else 2.0 * theta / math.pi
    else:
        term, total = 1.0, 0.0
        for k in range(1, df // 2 + 1):
            total += term
            term *= c2 * (2 * k - 1) / (2 * k)
        inside = s * total
    return max(0.0, 1.0 - inside)


def t_quantile(level: float, df: int) -> float:
    """The two-sided Student t critical value: P(|T| >= it) = 1 - ``level``, by bisection on the exact
    distribution of integer ``df`` (no SciPy in the server)."""
    p = 1.0 - level
    lo, hi = 0.0, 1.0
    while _t_two_sided_p(hi, df) > p:
        hi *= 2.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if _t_two_sided_p(mid, df) > p:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-9 * hi:
            break
    return hi
