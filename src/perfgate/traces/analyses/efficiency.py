"""Per-op efficiency from recorded shapes: achieved TFLOP/s of GEMM and attention ops, GB/s of copies.

The work of each op comes from its shapes (`shapes`); its time is the device time of the kernels it
launched (device kernel -> runtime launch call by correlation id -> the shape op on the same thread
that encloses the call), or, on CPU-only traces, the op's own duration. Achieved figures are compared
with the dense peak of the trace's device in ``hardware/peaks.json`` at the op's precision; when the
device is not in the table, or the cell is unknown, the peak is null with the reason (another device's
peak is never borrowed). fp32 GEMMs are compared with the fp32 peak: with TF32 enabled they can beat it.
The table holds no memory bandwidth, so copies report GB/s without a peak.

Arithmetic intensity (FLOPs per byte of the operands) tells a GEMM that is small enough to be
memory-bound (low intensity) from one that is compute-bound but inefficient (high intensity, low
share of peak).
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from perfgate.traces.analyses.ops import cpu_parents
from perfgate.traces.models import OpEfficiency, OpEfficiencySummary
from perfgate.traces.reading._group import unique_inverse
from perfgate.traces.reading._np import int_list
from perfgate.traces.reading.prepare import Prepared
from perfgate.traces.reading.shapes import ATTENTION_OPS, GEMM_OPS, PRECISION_CODES

__all__ = ["op_efficiency"]

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]


def _device_time(p: Prepared, rows: I64) -> F64:
    """Device time launched from inside each of the shape-op ``rows`` (CPU table rows)."""
    out = np.zeros(rows.size)
    dev, host, cpu = p.device, p.host, p.cpu
    launch = dev.i("launch") if len(dev) else np.zeros(0, np.int64)
    has = launch >= 0
    if rows.size == 0 or not has.any():
        return out
    dur = dev.f("dur")[has]
    h = launch[has]
    h_ts, h_tid = host.f("ts")[h], host.i("tid")[h]
    s_ts, s_end, s_tid = cpu.f("ts")[rows], cpu.f("end")[rows], cpu.i("tid")[rows]
    span = float(max(np.max(s_end), np.max(h_ts))) + 1.0
    key_s = s_tid * span + s_ts
    order = np.argsort(key_s, kind="stable")
    pos = np.searchsorted(key_s[order], h_tid * span + h_ts, side="right") - 1
    ok = pos >= 0
    idx = order[np.maximum(pos, 0)]
    ok &= (s_tid[idx] == h_tid) & (s_end[idx] >= h_ts)
    got: F64 = np.bincount(idx[ok], weights=dur[ok], minlength=rows.size).astype(np.float64)
    return got


def op_efficiency(p: Prepared, device: str, on_device: bool) -> OpEfficiencySummary | None:
    """Efficiency per (op, precision); None when no op of the trace has usable shapes."""
    from perfgate.hardware.peaks import PeakLookupError, lookup_peak

    cpu = p.cpu
    if len(cpu) == 0:
        return None
    flops, nbytes = cpu.f("shape_flops"), cpu.f("shape_bytes")
    rows = np.flatnonzero(np.isfinite(nbytes))
    if rows.size == 0:
        return None
    # Nested shape ops are counted once: a copy inside a GEMM (addmm's bias) is part of the GEMM;
    # otherwise the innermost is kept (a flash attention op under its sdpa wrapper).
    parent = cpu_parents(p)[rows]
    is_flop = flops[rows] > 0
    inside = np.isin(parent, rows)
    parent_flop = np.zeros(rows.size, bool)
    parent_flop[inside] = flops[parent[inside]] > 0
    drop_self = inside & parent_flop & ~is_flop
    drop_parent = parent[inside & ~drop_self]
    rows = rows[~drop_self & ~np.isin(rows, drop_parent)]
    time = _device_time(p, rows) if on_device else cpu.f("dur")[rows]
    names: list[str] = p.table.names
    name_ids, prec = cpu.i("name")[rows], cpu.i("shape_prec")[rows]
    key = name_ids.astype(np.int64) * len(PRECISION_CODES) + np.maximum(prec, 0)
    uniq, inv = unique_inverse(key)
    count = np.bincount(inv)
    f_sum = np.bincount(inv, weights=flops[rows])
    b_sum = np.bincount(inv, weights=nbytes[rows])
    t_sum = np.bincount(inv, weights=time)
    out: list[OpEfficiency] = []
    unknown: set[str] = set()
    keys: list[int] = int_list(uniq)
    counts: list[int] = int_list(count)
    for u, c, f, b, t in zip(keys, counts, f_sum.tolist(), b_sum.tolist(), t_sum.tolist(), strict=True):
        name: str = names[u // len(PRECISION_CODES)]
        precision: str = PRECISION_CODES[u % len(PRECISION_CODES)]
        kind = "gemm" if name in GEMM_OPS else "attention" if name in ATTENTION_OPS else "copy"
        peak: float | None = None
        if kind != "copy" and t > 0:
            if not on_device:
                unknown.add("CPU-only trace: the peak table holds accelerators only")
            elif precision == "other":
                unknown.add(f"{name}: a precision the peak table does not list")
            else:
                try:
                    peak = lookup_peak(device, precision)[0]  # pyright: ignore[reportArgumentType]
                except PeakLookupError as exc:
                    unknown.add(str(exc).split(". ")[0])
        tflops = f / t / 1e6 if kind != "copy" and t > 0 else None
        out.append(
            OpEfficiency(
                op=name,
                kind=kind,
                precision=precision,
                count=c,
                time_us=t,
                flops=f,
                bytes=b,
                achieved_tflops=tflops,
                achieved_gbps=b / t / 1e3 if t > 0 else None,
                intensity=f / b if kind != "copy" and b > 0 else None,
                peak_tflops=peak,
                efficiency=tflops / peak if tflops is not None and peak else None,
            )
        )
    out.sort(key=lambda r: -r.time_us)
    return OpEfficiencySummary(
        basis="device time of the kernels each op launched"
        if on_device
        else "CPU op duration (CPU-only trace)",
        device=device,
        ops=out,
        peak_unknown=sorted(unknown),
    )
