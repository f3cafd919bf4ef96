"""Device work by category and by kernel name."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from perfgate.traces.classify import CATEGORIES, category_kind
from perfgate.traces.models import CategoryStats, KernelStats
from perfgate.traces.reading._group import unique_counts, unique_values
from perfgate.traces.reading._np import int_list
from perfgate.traces.reading.prepare import Prepared

__all__ = ["category_stats", "top_kernels"]

F64 = npt.NDArray[np.float64]


def _total_device_us(p: Prepared) -> float:
    return float(p.device.f("dur").sum())


def category_stats(p: Prepared) -> list[CategoryStats]:
    """One entry per category present, largest total time first."""
    dev = p.device
    if len(dev) == 0:
        return []
    dur, category, nbytes = dev.f("dur"), dev.i("category"), dev.f("nbytes")
    total_all = _total_device_us(p)
    out: list[CategoryStats] = []
    for code in int_list(unique_values(category)):
        mask = category == code
        d = dur[mask]
        name = CATEGORIES[code]
        b = nbytes[mask]
        has_bytes = ~np.isnan(b)
        moved: float | None = None
        bandwidth: float | None = None
        if has_bytes.any():
            moved = float(b[has_bytes].sum())
            time_us = float(d[has_bytes].sum())
            bandwidth = moved / (time_us * 1e-6) / 1e9 if time_us > 0 else None
        total = float(d.sum())
        out.append(
            CategoryStats(
                category=name,
                kind=category_kind(name),
                count=int(d.size),
                total_us=total,
                mean_us=total / d.size,
                p50_us=float(np.median(d)),
                max_us=float(d.max()),
                share=total / total_all if total_all > 0 else 0.0,
                bytes=moved,
                bandwidth_gb_per_s=bandwidth,
            )
        )
    out.sort(key=lambda c: c.total_us, reverse=True)
    return out


def top_kernels(p: Prepared, k: int) -> list[KernelStats]:
    """The ``k`` device event names with the largest total time."""
    dev = p.device
    if len(dev) == 0 or k <= 0:
        return []
    names, dur, category = dev.i("name"), dev.f("dur"), dev.i("category")
    counts = np.bincount(names, minlength=len(p.table.names))
    totals = np.bincount(names, weights=dur, minlength=len(p.table.names))
    present = np.flatnonzero(counts)
    best = present[np.argsort(-totals[present], kind="stable")[:k]]
    total_all = _total_device_us(p)
    out: list[KernelStats] = []
    for u in int_list(best):
        mask = names == u
        d = dur[mask]
        cats, cat_counts = unique_counts(category[mask])
        out.append(
            KernelStats(
                name=p.table.names[u],
                category=CATEGORIES[int(cats[np.argmax(cat_counts)])],
                count=int(counts[u]),
                total_us=float(totals[u]),
                mean_us=float(totals[u] / counts[u]),
                p50_us=float(np.median(d)),
                max_us=float(d.max()),
                share=float(totals[u] / total_all) if total_all > 0 else 0.0,
            )
        )
    return out
