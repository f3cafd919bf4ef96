"""A rank-based A/B decision over launches, for when a few wild launches swamp the pooled interval.

Launch throughputs on a shared host are not normal: most launches sit close together and a few run far
slower (a neighbour took the cores, the frequency dropped, a stall landed in a window). A t interval on
them is as wide as its worst launch, so one wild launch can hide a speedup many times the spread of the
rest. The Mann-Whitney (Wilcoxon rank-sum) test needs no distribution: under "no change" the launches of
both sides are exchangeable, and a wild launch counts by its rank, not by how far off it is. Its inverse
is the Hodges-Lehmann estimate of the shift in log throughput (the median of every candidate-minus-baseline
pair of launches) with a distribution-free interval from the order statistics of those pairs.

Exact null distribution up to `EXACT_MAX` launches a side (a count over rank arrangements), the normal
approximation above it. Ties (equal throughputs) are split by order, which is conservative for neither
side; with float throughputs they do not occur in practice.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache

__all__ = ["EXACT_MAX", "RankShift", "rank_shift"]

EXACT_MAX = 25
"""Launches per side up to which the rank-sum distribution is counted exactly."""


@dataclass(frozen=True)
class RankShift:
    """Candidate over baseline as a rank test over launches sees it (throughput ratios, not logs)."""

    estimate: float
    """Hodges-Lehmann: the median of candidate/baseline over every pair of launches."""
    low: float
    high: float
    """The distribution-free interval at ``confidence`` (two-sided)."""
    u: float
    """Pairs in which the candidate launch is faster (Mann-Whitney U)."""
    pairs: int
    p_faster: float
    """One-sided p that the candidate is not faster (exact below `EXACT_MAX`)."""
    p_slower: float


@cache
def _counts(m: int, n: int) -> tuple[int, ...]:
    """How many arrangements of m and n ranks give U = 0, 1, ..., m * n (``U`` counts pairs x > y)."""
    if m == 0 or n == 0:
        return (1,)
    # f(m, n, u) = f(m - 1, n, u - n) + f(m, n - 1, u): the largest value is an x (n pairs) or a y
    a, b = _counts(m - 1, n), _counts(m, n - 1)
    out = [0] * (m * n + 1)
    for u, c in enumerate(a):
        out[u + n] += c
    for u, c in enumerate(b):
        out[u] += c
    return tuple(out)


def _p_at_least(u: float, m: int, n: int) -> float:
    """P(U >= u) under exchangeability."""
    if m <= EXACT_MAX and n <= EXACT_MAX:
        counts = _counts(m, n)
        k = math.ceil(u - 1e-9)
        return sum(counts[max(k, 0) :]) / sum(counts)
    mean, sd = m * n / 2, math.sqrt(m * n * (m + n + 1) / 12)
    z = (u - 0.5 - mean) / sd
    return 0.5 * math.erfc(z / math.sqrt(2))


def _critical(m: int, n: int, alpha: float) -> int:
    """The largest c with P(U <= c) <= alpha (-1 when none): the interval drops c pairs at each end."""
    if m <= EXACT_MAX and n <= EXACT_MAX:
        counts = _counts(m, n)
        total, acc = sum(counts), 0
        for c, k in enumerate(counts):
            acc += k
            if acc / total > alpha:
                return c - 1
        return m * n
    mean, sd = m * n / 2, math.sqrt(m * n * (m + n + 1) / 12)
    z = -math.sqrt(2) * _erfc_inv(2 * alpha)
    return max(-1, math.floor(mean + z * sd - 0.5))


def _erfc_inv(y: float) -> float:
    lo, hi = -10.0, 10.0
    for _ in range(100):
        mid = (lo + hi) / 2
        if math.erfc(mid) > y:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def rank_shift(
    baseline: Sequence[float], candidate: Sequence[float], confidence: float = 0.95
) -> RankShift | None:
    """The rank test and Hodges-Lehmann shift of ``candidate`` over ``baseline`` launch throughputs (positive
    numbers); None without two launches on each side."""
    m, n = len(candidate), len(baseline)
    if m < 2 or n < 2 or min(*baseline, *candidate) <= 0:
        return None
    diffs = sorted(math.log(c) - math.log(b) for c in candidate for b in baseline)
    u = sum(1.0 if d > 0 else 0.5 if d == 0 else 0.0 for d in diffs)
    mid = len(diffs) // 2
    centre = diffs[mid] if len(diffs) % 2 else (diffs[mid - 1] + diffs[mid]) / 2
    pairs = m * n
    # test inversion: a shift d is rejected when at most c pairs lie at or below it (or above it), where
    # P(U <= c) <= (1 - confidence) / 2; too few launches reject none (an unbounded interval)
    c = _critical(m, n, (1 - confidence) / 2)
    low, high = (diffs[c], diffs[pairs - c - 1]) if c >= 0 else (-math.inf, math.inf)
    return RankShift(
        estimate=math.exp(centre),
        low=math.exp(min(low, centre)),
        high=math.exp(max(high, centre)),
        u=u,
        pairs=pairs,
        p_faster=_p_at_least(u, m, n),
        p_slower=_p_at_least(pairs - u, m, n),
    )
