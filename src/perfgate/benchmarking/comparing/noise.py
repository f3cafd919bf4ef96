"""Why a comparison could not tell, and the next calls that will: noise that explains itself.

When the spread swamps the effect (``within_noise``, or too few launches), the comparison names what made
the runs noisy, from what the server recorded of each window run (never from the process's word alone):

- **over-subscription**: the ranks this host ran times torch's intra-op threads (the harness's
  ``num_threads``) against the CPUs other processes left free. More runnable threads than free cores make
  step times depend on the scheduler: pin threads on both sides to the value proposed
  (``OMP_NUM_THREADS = max(1, free CPUs // ranks)``) and re-run both;
- **neighbours**: launches during which other processes took a quarter of the job's CPUs or more (perfgate's
  own server and supervisors are not counted: `perfgate.traces.diagnosis.hostload`);
- **host speed**: a fixed CPU probe run around each launch that varied by more than 10% (frequency scaling,
  load that came and went);
- **spread**: each side's launch-to-launch spread against the effect.

The last line is what settles it: the interleaved calls, with enough repeats, and the pinned threads when
the run was over-subscribed. Advice never undoes what is compared: where the thread count is the change
(declared, or a difference between the sides), the hint pins no thread count, says so, and asks for free
CPUs or counts that fit instead (`thread_change`).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, cast

from perfgate.benchmarking.workload.observed import Place, entries_showing, explains
from perfgate.evidence.access import as_dict

if TYPE_CHECKING:
    from perfgate.benchmarking.comparing.compare import Comparison
    from perfgate.benchmarking.comparing.differences import Difference
    from perfgate.evidence import EvidenceRecord

__all__ = ["explain_noise", "oversubscription", "pinned_threads", "thread_change"]

_SPEED_SPREAD = 0.10
_BUSY_SHARE = 0.25
"""`perfgate.traces.diagnosis.hostload.BUSY_NEIGHBOUR_SHARE` (the analyses do not import each other)."""


def pinned_threads(free_cpus: float, ranks: int) -> int:
    """The intra-op thread count that fits ``ranks`` ranks on ``free_cpus`` CPUs."""
    return max(1, math.floor(free_cpus / max(ranks, 1)))


def oversubscription(record: EvidenceRecord) -> tuple[int, int, float, int] | None:
    """(ranks on this host, torch threads per rank, CPUs left free by others, CPUs) when the window run had
    more runnable threads than free CPUs; None when it did not, or where that was not recorded."""
    result, inputs = record.result, record.inputs
    fingerprint = as_dict(result.get("environment_fingerprint"))
    try:
        threads = int(str(fingerprint.get("num_threads")))
    except ValueError:
        return None
    ranks = result.get("world_size")
    if not isinstance(ranks, int) or ranks < 1 or inputs.get("launcher") == "slurm":
        return None  # a Slurm job's ranks run on the allocation's nodes, not beside this server
    loads = [
        as_dict(x) for x in cast("list[Any]", result.get("host_load") or []) if as_dict(x).get("measured")
    ]
    if not loads:
        return None
    cpus = int(loads[0].get("cpus") or 0)
    other = max(float(x.get("other_cpus") or 0.0) for x in loads)
    free = max(cpus - other, 1.0) if cpus else 0.0
    if cpus <= 0 or ranks * threads <= free + 0.5:
        return None
    return ranks, threads, free, cpus


_THREADS = "threads"
"""The vocabulary entry a thread pin sets (`perfgate.benchmarking.workload.observed.WHERE_SHOWN`)."""
_PLACES: dict[str, Place] = {"env": "env", "measured": "fingerprint", "argv": "option"}
"""A difference's field prefix -> where its setting shows."""


def thread_change(declared: Sequence[str], differences: Sequence[Difference] = ()) -> str | None:
    """What makes the thread count the change being compared (so a hint must not pin it), or None: a
    declared change that explains torch's thread count or its variables, or a difference between the sides
    where the thread count shows (an environment variable, the measured fingerprint, an option, the
    contract's ``threads``)."""
    shows: tuple[tuple[Place, str], ...] = (
        ("fingerprint", "num_threads"),
        ("env", "OMP_NUM_THREADS"),
        ("option", _THREADS),
    )
    for d in declared:
        if any(explains([d.lstrip("-")], place, name) for place, name in shows):
            return f"{d!r} is the declared change"
    for d in differences:
        kind, _, name = d.field.partition(".")
        place = _PLACES.get(kind)
        if d.field == f"contract.execution.{_THREADS}" or (
            place is not None and _THREADS in entries_showing(place, name)
        ):
            return f"{d.field} differs between the sides"
    return None


def _spread(values: Sequence[float]) -> float:
    """Largest relative distance of a launch from its side's median."""
    mid = statistics.median(values)
    return max(abs(v / mid - 1) for v in values) if mid > 0 else 0.0


def explain_noise(
    base: Sequence[EvidenceRecord],
    cand: Sequence[EvidenceRecord],
    comparison: Comparison,
    rates: tuple[Sequence[float], Sequence[float]],
    settle: str,
    changed: str | None = None,
    afresh: str | None = None,
) -> list[str]:
    """The lines that say why ``comparison`` could not tell and what to run next; empty when it could.

    ``changed``: what makes the thread count the compared change (`thread_change`); the next call then
    keeps each side's own count rather than pinning one. ``afresh``: the calls that settle it without the
    calls already made, where ``settle`` reuses them; an over-subscribed run is not reused (its threads,
    or the CPUs it had, are what the next calls change)."""
    if comparison.verdict not in ("within_noise", "insufficient_launches"):
        return []
    out: list[str] = []
    effect = abs(comparison.speedup - 1)
    spreads = [
        (side, _spread(r)) for side, r in zip(("baseline", "candidate"), rates, strict=True) if len(r) > 1
    ]
    if spreads:
        out.append(
            "spread: "
            + ", ".join(f"{side} launches up to {s:.0%} from their median" for side, s in spreads)
            + f", against an effect of {effect:.0%}"
        )
    pins: list[int] = []
    crowded: list[int] = []
    for side, records in (("baseline", base), ("candidate", cand)):
        for r in records:
            over = oversubscription(r)
            if over is not None:
                ranks, threads, free, cpus = over
                pins.append(pinned_threads(free, ranks))
                crowded.append(ranks * threads)
                out.append(
                    f"over-subscribed: {side} {r.id} ran {ranks} rank(s) x {threads} torch threads on {free:.1f} "
                    f"free of {cpus} CPUs, so its steps waited on the scheduler"
                )
            loads = [as_dict(x) for x in cast("list[Any]", r.result.get("host_load") or [])]
            busy = [
                k
                for k, x in enumerate(loads)
                if x.get("measured") and float(x.get("other_share") or 0) >= _BUSY_SHARE
            ]
            if busy:
                out.append(
                    f"neighbours: {side} {r.id} launch(es) {', '.join(map(str, busy))} shared the CPUs with other "
                    "processes (a quarter or more of them)"
                )
            speeds = [
                float(v)
                for v in cast("list[Any]", r.result.get("launch_host_speed") or [])
                if isinstance(v, int | float)
            ]
            if len(speeds) > 1 and max(speeds) > (1 + _SPEED_SPREAD) * min(speeds) > 0:
                out.append(
                    f"host speed: a fixed CPU probe ran {max(speeds) / min(speeds):.2f}x faster at one {side} launch of "
                    f"{r.id} than at another (frequency scaling or load that came and went)"
                )
    if not pins:
        pin = ""
    elif changed is not None:
        pin = (
            f"keep each side's own thread count ({changed}: pinning it would undo the change) and hold everything "
            f"else as it was; run both sides while other work leaves at least {max(crowded)} CPUs free, or compare "
            f"counts that fit the {min(pins)} CPU(s) per rank left free, then "
        )
    else:
        pin = f'pin threads on both sides (env {{"OMP_NUM_THREADS": "{min(pins)}"}} in every call), then '
    out.append("next: " + pin + (afresh or settle if pins else settle))
    return out
