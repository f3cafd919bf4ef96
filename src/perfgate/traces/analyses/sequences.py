"""Frequent kernel sequences: runs of kernels that follow each other on a stream, step after step.

A sequence that repeats many times and takes a large share of device time is a fusion candidate
(HTA's frequent-kernel-sequence analysis, restricted to consecutive kernels on one stream). For 2 and
3 kernels in a row, every occurrence is counted (occurrences may overlap: ``ABAB`` holds ``AB``
twice); ``time_us`` sums the member kernels' durations over occurrences and ``share`` divides it by all
device time.
"""

from __future__ import annotations

import numpy as np

from perfgate.traces.models import KernelSequence
from perfgate.traces.reading._group import pair_keys
from perfgate.traces.reading._np import int_list
from perfgate.traces.reading.prepare import KIND_CODES, Prepared

__all__ = ["frequent_sequences"]

_BITS = 21  # name ids below 2**21: three ids pack into one int64 key


def frequent_sequences(p: Prepared, k: int = 5, min_count: int = 2) -> list[KernelSequence]:
    """The ``k`` sequences of 2-3 consecutive compute kernels with the most device time."""
    dev = p.device
    if len(dev) < 2 or len(p.table.names) >= 1 << _BITS:
        return []
    compute = dev.i("kind") == KIND_CODES["compute"]
    stream = pair_keys(dev.i("device"), dev.i("stream"))[compute]
    ts, dur, name = dev.f("ts")[compute], dev.f("dur")[compute], dev.i("name")[compute]
    order = np.lexsort((ts, stream))
    stream, dur, name = stream[order], dur[order], name[order]
    total = float(dev.f("dur").sum())
    if total <= 0:
        return []
    out: list[KernelSequence] = []
    for n in (2, 3):
        if name.size < n:
            continue
        m = name.size - n + 1
        same = np.ones(m, bool)
        key = np.zeros(m, np.int64)
        time = np.zeros(m, np.float64)
        for j in range(n):
            key = (key << _BITS) | name[j : j + m]
            time += dur[j : j + m]
            if j:
                same &= stream[j : j + m] == stream[:m]
        key, time = key[same], time[same]
        if key.size == 0:
            continue
        uniq, inverse, counts = np.unique(key, return_inverse=True, return_counts=True)
        times = np.bincount(inverse, weights=time)
        for u in int_list(np.argsort(-times, kind="stable")[: k * 2]):
            if counts[u] < min_count:
                continue
            packed = int(uniq[u])
            ids = [(packed >> (_BITS * (n - 1 - j))) & ((1 << _BITS) - 1) for j in range(n)]
            out.append(
                KernelSequence(
                    kernels=[p.table.names[i] for i in ids],
                    count=int(counts[u]),
                    time_us=float(times[u]),
                    share=float(times[u]) / total,
                )
            )
    # Longer sequences first on ties of time: they are the bigger fusion.
    out.sort(key=lambda s: (-s.time_us, -len(s.kernels)))
    return out[:k]
