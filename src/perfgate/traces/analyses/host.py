"""Host-side view: launches, launch delay, launch-bound kernels, queue depth, synchronization."""

from __future__ import annotations

from collections import Counter

import numpy as np
import numpy.typing as npt

from perfgate.traces.classify import IMPLICIT_SYNC_OPS, host_call_role, is_polling_call
from perfgate.traces.models import Distribution, LaunchStats, SyncCall, SyncStats
from perfgate.traces.reading._group import unique_counts, unique_values
from perfgate.traces.reading._np import int_list
from perfgate.traces.reading.prepare import KIND_CODES, Prepared

__all__ = ["distribution", "launch_stats", "sync_stats"]

F64 = npt.NDArray[np.float64]
_TOP_APIS = 10


def distribution(values: F64) -> Distribution | None:
    """count/mean/p50/p90/max of a sample, or None when empty."""
    if values.size == 0:
        return None
    p50, p90 = np.percentile(values, [50, 90]).tolist()
    return Distribution(
        count=int(values.size),
        mean_us=float(values.mean()),
        p50_us=float(p50),
        p90_us=float(p90),
        max_us=float(values.max()),
    )


def _queue_depth(
    launch_ts: F64, done_ts: F64, span_start: float, span_end: float
) -> tuple[int, float, float | None]:
    """Max and time-weighted mean of outstanding launches, and the fraction of the span at zero."""
    if launch_ts.size == 0 or span_end <= span_start:
        return 0, 0.0, None
    times = np.concatenate([launch_ts, done_ts])
    delta = np.concatenate([np.ones(launch_ts.size, np.int8), np.full(done_ts.size, -1, np.int8)])
    # At equal times, completions go first so a back-to-back launch does not look like depth 2.
    order = np.lexsort((delta, times))
    clipped = times[order]
    # int32 holds any depth of a trace below 2**31 events; the products below are the same float64s.
    depth = np.cumsum(delta[order], dtype=np.int32 if times.size < 2**31 else np.int64)
    del order, delta, times
    np.maximum(clipped, span_start, out=clipped)
    np.minimum(clipped, span_end, out=clipped)
    widths = np.empty_like(clipped)
    np.subtract(clipped[1:], clipped[:-1], out=widths[:-1])
    widths[-1] = span_end - clipped[-1]
    first = float(clipped[0] - span_start)
    del clipped
    total = span_end - span_start
    # Before the first event nothing is outstanding.
    zero = float(widths[depth == 0].sum()) + first
    np.multiply(widths, depth, out=widths)  # depth-weighted widths, in place
    return int(depth.max()), float(widths.sum()) / total, zero / total


def launch_stats(p: Prepared, short_kernel_us: float) -> LaunchStats:
    """How many launches, how late the device starts them, and how often the host is the bottleneck."""
    dev, host = p.device, p.host
    rows = dev.i("launch") if len(dev) else np.empty(0, np.int64)
    matched = rows >= 0
    launch_rows = rows[matched]
    d_ts, d_dur, d_end = dev.f("ts"), dev.f("dur"), dev.f("end")
    h_ts, h_dur = host.f("ts"), host.f("dur")
    delays = d_ts[matched]
    delays -= h_ts[launch_rows]
    compute = dev.i("kind") == KIND_CODES["compute"] if len(dev) else np.empty(0, bool)

    launched = matched & compute
    launch_bound = int(np.sum(d_dur[launched] < h_dur[rows[launched]]))
    launched_kernels = int(np.sum(launched))
    del launched
    short = compute & (d_dur < short_kernel_us)

    api = Counter[str]()
    unique_rows = unique_values(launch_rows)
    names, counts = unique_counts(host.i("name")[unique_rows])
    for n, c in zip(int_list(names), int_list(counts), strict=True):
        api[p.table.names[n]] += c

    per_step: float | None = None
    in_window = p.step_in_window
    if p.step_numbers.size and in_window.any():
        starts, ends = p.step_start[in_window], (p.step_start + p.step_dur)[in_window]
        launch_times = np.sort(h_ts[unique_rows])
        n_in = np.searchsorted(launch_times, ends, side="left") - np.searchsorted(
            launch_times, starts, side="left"
        )
        per_step = float(n_in.mean())

    span_start = float(d_ts.min()) if len(dev) else 0.0
    span_end = float(d_end.max()) if len(dev) else 0.0
    qmax, qmean, qzero = _queue_depth(h_ts[launch_rows], d_end[matched], span_start, span_end)
    return LaunchStats(
        launches=int(unique_rows.size),
        launches_per_step=per_step,
        api_counts=dict(api.most_common(_TOP_APIS)),
        unmatched_device_events=int(np.sum(~matched)),
        launch_delay_us=distribution(delays),
        launch_bound_kernels=launch_bound,
        launch_bound_fraction=launch_bound / launched_kernels if launched_kernels else None,
        short_kernel_threshold_us=short_kernel_us,
        short_kernels=int(short.sum()),
        short_kernel_time_us=float(d_dur[short].sum()),
        queue_depth_max=qmax,
        queue_depth_mean=qmean,
        queue_empty_fraction=qzero,
    )


def sync_stats(p: Prepared) -> SyncStats:
    """Blocking calls, synchronous copies, implicit syncs in CPU ops, and device-side stream waits."""
    host, cpu, dev = p.host, p.cpu, p.device
    names = p.table.names
    per_name: dict[str, list[float]] = {}
    host_sync_us = 0.0
    host_sync_calls = 0
    copy_calls = 0
    copy_us = 0.0
    h_names, h_dur = host.i("name"), host.f("dur")
    present = (
        np.flatnonzero(np.bincount(h_names, minlength=len(names))) if len(host) else np.empty(0, np.int64)
    )
    for name_id in int_list(present):
        name = names[name_id]
        role = host_call_role(name)
        if role == "other":
            continue
        d = h_dur[h_names == name_id]
        per_name[name] = [float(d.size), float(d.sum()), float(d.max())]
        if role == "sync" and not is_polling_call(name):
            host_sync_us += float(d.sum())
            host_sync_calls += int(d.size)
        elif role == "blocking_copy":
            copy_calls += int(d.size)
            copy_us += float(d.sum())

    implicit_calls = 0
    implicit_us = 0.0
    c_names, c_dur = cpu.i("name"), cpu.f("dur")
    for name_id in p.table.name_ids(IMPLICIT_SYNC_OPS):
        name = names[name_id]
        d = c_dur[c_names == name_id]
        if d.size:
            implicit_calls += int(d.size)
            implicit_us += float(d.sum())
            per_name[name] = [float(d.size), float(d.sum()), float(d.max())]

    device_syncs = int(np.sum(dev.i("kind") == KIND_CODES["sync"])) if len(dev) else 0
    calls = [
        SyncCall(name=n, count=int(v[0]), total_us=v[1], max_us=v[2])
        for n, v in sorted(per_name.items(), key=lambda kv: kv[1][1], reverse=True)
    ]
    return SyncStats(
        host_sync_us=host_sync_us,
        host_sync_calls=host_sync_calls,
        blocking_copy_calls=copy_calls,
        blocking_copy_us=copy_us,
        implicit_sync_ops=implicit_calls,
        implicit_sync_us=implicit_us,
        device_sync_events=device_syncs,
        calls=calls[:20],
    )
