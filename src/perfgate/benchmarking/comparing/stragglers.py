"""One definition of the slowest rank, shared by run_benchmark_window and the trace analyses.

Under data-parallel training ranks run in lockstep: every collective ends when the last rank joins
it, so elapsed step times agree and the fast ranks show the straggler's extra work as time spent
waiting in collectives. The slowest rank is therefore the one with the most **busy time**: its elapsed
time minus its *excess wait*, the time it spent in collective waits beyond the rank that waited least,
step by step.

What counts as the collective wait depends on the evidence: the harness records host time inside
``backward()`` (which holds the gradient all-reduce); a trace gives the host time in collective calls
not covered by a computing op, or device communication not overlapped with compute, whichever is larger.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["busy_times", "excess_wait", "slowest_rank"]


def excess_wait(wait: Sequence[Sequence[float]]) -> list[float]:
    """Per rank: the sum over steps of its wait minus the smallest wait of any rank in that step.

    ``wait[r][s]`` is rank ``r``'s collective wait in step ``s`` (all ranks cover the same steps).
    """
    if not wait:
        return []
    steps = min(len(w) for w in wait)
    floor = [min(w[s] for w in wait) for s in range(steps)]
    return [sum(w[s] - floor[s] for s in range(steps)) for w in wait]


def busy_times(elapsed: Sequence[float], wait: Sequence[Sequence[float]]) -> list[float]:
    """Per rank: elapsed time minus excess wait (see the module docstring)."""
    return [e - x for e, x in zip(elapsed, excess_wait(wait), strict=True)]


def slowest_rank(ranks: Sequence[int], busy: Sequence[float]) -> int:
    """The rank with the most busy time (the lowest rank number on a tie)."""
    best = max(range(len(ranks)), key=lambda i: (busy[i], -ranks[i]))
    return ranks[best]
