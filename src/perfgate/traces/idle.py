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

``host_bound_steps``
counts the steps whose host-wait idle exceeds half of the step's device span: steps the host, not the
device, paced — the lightweight critical-path verdict.
"""

from __future__ import annotations

import numpy as np

from perfgate.traces.models import IdleBreakdown
from perfgate.traces.prepare import Prepared

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
    inside = p.step_in_window
    if p.step_numbers.size and inside.any():
        for start, dur in zip(p.step_start[inside].tolist(), p.step_dur[inside].tolist(), strict=True):
            in_step = (t >= start) & (t < start + dur)
            if not in_step.any():
                continue
            steps += 1
            span = float(e[in_step].max() - t[in_step].min())
            if span > 0 and float(gap[host_wait & in_step].sum()) > 0.5 * span:
                host_bound += 1
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
    )
