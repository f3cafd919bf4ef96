"""Idle-time breakdown of the device (HTA 0.5's definition) and a per-step bound classification.

HTA classifies the gaps between consecutive kernels of each stream. Here the streams are pooled, as
in the temporal breakdown: a gap is a stretch with no device activity at all, so the three parts sum
to ``idle_us`` of the temporal breakdown (per-stream sums can exceed the span when a side stream waits
while others run). The gap before a device event is its start minus the latest end of any earlier
event; it is classified by that event, with HTA's rules:

- ``host_wait`` when the runtime call that launched the kernel started after the previous kernel
  ended: the device sat idle because the CPU had not enqueued the work yet;
- ``kernel_wait`` when it is shorter than ``consecutive_kernel_delay_us`` (30 us, HTA's default):
  launch overhead between back-to-back kernels;
- ``other`` otherwise (waits on events, syncs, the host doing something else).

The lightweight critical path splits the device span of every step inside the window (first kernel
start to last kernel end of the step) into the time the device was busy (``device_bound_us``: the
device was on the critical path), the host-wait gaps (``host_bound_us``: the CPU was, because the
next kernel had not been launched yet) and the remaining gaps (``other_wait_us``: launch latency,
event waits, syncs). The three add up to ``steps_span_us``. ``host_bound_steps`` counts the steps whose
host-wait idle exceeds half of their device span: steps the host, not the device, paced; ``bound``
names the side that paced the majority of the checked time.
"""

from __future__ import annotations

from typing import Literal

import numpy as np

from perfgate.traces.models import IdleBreakdown
from perfgate.traces.reading.prepare import Prepared

__all__ = ["CONSECUTIVE_KERNEL_DELAY_US", "idle_breakdown"]

CONSECUTIVE_KERNEL_DELAY_US = 30.0


def idle_breakdown(
    p: Prepared, consecutive_kernel_delay_us: float = CONSECUTIVE_KERNEL_DELAY_US
) -> IdleBreakdown | None:
    """The breakdown for one rank, or None without device activity."""
    dev, host = p.device, p.host
    if len(dev) < 2:
        return None
    ts, end = dev.f("ts"), dev.f("end")
    order = np.argsort(ts, kind="stable")
    t, e = ts[order], end[order]
    launch = dev.i("launch")[order]
    prev = np.r_[np.nan, np.maximum.accumulate(e)[:-1]]
    gap = t - prev
    valid = ~np.isnan(gap) & (gap > 0)
    h_ts = host.f("ts") if len(host) else np.empty(0, np.float64)
    launched_at = np.full(t.size, np.nan)
    if h_ts.size:
        has = launch >= 0
        launched_at[has] = h_ts[launch[has]]
    host_wait = valid & (launched_at > prev)
    kernel_wait = valid & ~host_wait & (gap < consecutive_kernel_delay_us)
    other = valid & ~host_wait & ~kernel_wait
    total = float(gap[valid].sum())

    host_bound = 0
    steps = 0
    span_total = host_total = other_total = 0.0
    inside = p.step_in_window
    if p.step_numbers.size and inside.any():
        for start, dur in zip(p.step_start[inside].tolist(), p.step_dur[inside].tolist(), strict=True):
            in_step = (t >= start) & (t < start + dur)
            if not in_step.any():
                continue
            steps += 1
            first = int(np.argmax(in_step))
            inner = valid & in_step
            inner[first] = False  # the gap before a step's first kernel lies outside its span
            span = float(e[in_step].max() - t[in_step].min())
            waited_host = float(gap[host_wait & inner].sum())
            span_total += span
            host_total += waited_host
            other_total += float(gap[inner & ~host_wait].sum())
            if span > 0 and waited_host > 0.5 * span:
                host_bound += 1
    device_total = max(span_total - host_total - other_total, 0.0)
    bound: Literal["host", "device", "mixed"] | None = None
    if span_total > 0:
        if host_total > 0.5 * span_total:
            bound = "host"
        elif device_total > 0.5 * span_total:
            bound = "device"
        else:
            bound = "mixed"
    return IdleBreakdown(
        basis="gaps with no device activity, classified by the event that ends them (HTA's rules, streams pooled)",
        consecutive_kernel_delay_us=consecutive_kernel_delay_us,
        idle_us=total,
        host_wait_us=float(gap[host_wait].sum()),
        kernel_wait_us=float(gap[kernel_wait].sum()),
        other_us=float(gap[other].sum()),
        host_wait_fraction=float(gap[host_wait].sum()) / total if total > 0 else None,
        steps_checked=steps,
        host_bound_steps=host_bound,
        steps_span_us=span_total,
        device_bound_us=device_total,
        host_bound_us=host_total,
        other_wait_us=other_total,
        bound=bound,
    )
