"""Temporal breakdown of device time (HTA's definitions), plus communication/compute overlap.

Over the span from the first device activity start to the last end:

- ``idle``: no device activity at all;
- ``compute``: at least one compute kernel runs (communication or copies running at the same time
  count as compute);
- ``non_compute``: busy without compute: communication, copies/memsets, stream waits.

Streams and devices of one rank are pooled, as HTA does.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from perfgate.traces.analyses.intervals import intersection_length, union_length
from perfgate.traces.classify import CATEGORIES
from perfgate.traces.reading._group import pair_keys, unique_values
from perfgate.traces.reading.prepare import KIND_CODES, Prepared

__all__ = ["Temporal", "temporal_breakdown"]

_MEMORY_LIKE_CATEGORIES = np.array([CATEGORIES.index(c) for c in ("elementwise", "reduction")], np.int64)


@dataclass(frozen=True)
class Temporal:
    """Microseconds, see the module docstring."""

    span_us: float
    busy_us: float
    idle_us: float
    compute_us: float
    non_compute_us: float
    communication_us: float
    memory_us: float
    sync_us: float
    comm_compute_overlap_us: float
    streams: int
    memory_like_us: float = 0.0
    """Time with copies, memsets, elementwise or reduction kernels running (the union of their intervals)."""

    def fraction(self, value_us: float) -> float | None:
        """``value_us`` as a fraction of the span (None for an empty span)."""
        return value_us / self.span_us if self.span_us > 0 else None

    @property
    def comm_compute_overlap_fraction(self) -> float | None:
        """Share of communication time that overlaps compute."""
        if self.communication_us <= 0:
            return None
        return min(1.0, self.comm_compute_overlap_us / self.communication_us)


def temporal_breakdown(p: Prepared) -> Temporal:
    """The breakdown for one rank; all zeros when the trace has no device activity."""
    dev = p.device
    if len(dev) == 0:
        return Temporal(0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0)
    ts, end, kind = dev.f("ts"), dev.f("end"), dev.i("kind")
    span = float(end.max() - ts.min())
    busy = union_length(ts, end)

    def of(code: int) -> tuple[np.ndarray, np.ndarray]:  # pyright: ignore[reportMissingTypeArgument]
        mask = kind == code
        return ts[mask], end[mask]

    comp_s, comp_e = of(KIND_CODES["compute"])
    comm_s, comm_e = of(KIND_CODES["communication"])
    mem_s, mem_e = of(KIND_CODES["memory"])
    sync_s, sync_e = of(KIND_CODES["sync"])
    compute = union_length(comp_s, comp_e)
    communication = union_length(comm_s, comm_e)
    overlap = intersection_length(comm_s, comm_e, comp_s, comp_e) if comm_s.size and comp_s.size else 0.0
    streams = unique_values(pair_keys(dev.i("device"), dev.i("stream"))).size
    category = dev.i("category")
    memory_like = (kind == KIND_CODES["memory"]) | np.isin(category, _MEMORY_LIKE_CATEGORIES)
    return Temporal(
        span_us=span,
        busy_us=busy,
        idle_us=span - busy,
        compute_us=compute,
        non_compute_us=busy - compute,
        communication_us=communication,
        memory_us=union_length(mem_s, mem_e),
        sync_us=union_length(sync_s, sync_e),
        comm_compute_overlap_us=overlap,
        streams=int(streams),
        memory_like_us=union_length(ts[memory_like], end[memory_like]),
    )
