"""Which records the audit counts: the latest run of each rank, and the last pass over each epoch.

A *launch* is one writer process: its records share a session token, the launch id the harness
recorders give every record of one process and its loader workers. A launch whose first record is
at the rank's earliest (epoch, step) and carries no restart marker started the run over (a repeated
benchmark launch, a rerun): the audit counts each rank's latest such launch and the launches after
it (resumes, which start later or are marked restart=true), and leaves earlier ones out.

A *pass* is one iteration over the loader. When an epoch holds several passes of one launch and
rank, every pass but the last was abandoned part-way (a one-batch peek with ``next(iter(loader))``,
a loop that broke out): those records are left out of coverage and reported as what they are.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from perfgate.audit.findings import FindingCollector
from perfgate.audit.records import ObservedRecords

__all__ = ["select_records"]


def select_records(records: ObservedRecords, found: FindingCollector) -> ObservedRecords:
    """The records the audit counts; what it leaves out is reported in ``found``."""
    records = _latest_runs(records, found)
    return _last_passes(records, found)


def _group(*keys: NDArray[np.int64]) -> tuple[NDArray[np.intp], int]:
    """Dense group index per record for the combination of ``keys`` (any int64 values)."""
    stacked = np.stack(keys, axis=1)
    _, inverse = np.unique(stacked, axis=0, return_inverse=True)
    inverse = np.ravel(inverse)
    return inverse, int(inverse.max()) + 1 if inverse.shape[0] else 0


def _latest_runs(records: ObservedRecords, found: FindingCollector) -> ObservedRecords:
    session = records.session
    if session is None or session.shape[0] == 0 or bool(np.all(session == session[0])):
        return records
    rank = records.rank.astype(np.int64)
    launch, n_launch = _group(rank, session)
    n = int(launch.shape[0])
    # per launch: its rank, first record in file order, earliest (epoch, step), any restart marker
    first_at = np.full(n_launch, n, dtype=np.int64)
    np.minimum.at(first_at, launch, np.arange(n, dtype=np.int64))
    epoch = records.epoch.astype(np.int64)
    step = records.step if records.step is not None else np.zeros(n, dtype=np.int64)
    order = np.lexsort((step, epoch, launch))
    heads = order[np.flatnonzero(np.r_[True, launch[order][1:] != launch[order][:-1]])]
    start_epoch = np.empty(n_launch, dtype=np.int64)
    start_step = np.empty(n_launch, dtype=np.int64)
    launch_rank = np.empty(n_launch, dtype=np.int64)
    start_epoch[launch[heads]] = epoch[heads]
    start_step[launch[heads]] = step[heads]
    launch_rank[launch[heads]] = rank[heads]
    restarted = np.zeros(n_launch, dtype=np.bool_)
    if records.restart is not None:
        restarted[np.unique(launch[records.restart])] = True
    spans = _stream_spans(records, launch)
    keep_launch = np.ones(n_launch, dtype=np.bool_)
    left_out: list[tuple[int, int, int]] = []  # (rank, launches, records)
    counts = np.bincount(launch, minlength=n_launch)
    for r in np.unique(launch_rank).tolist():
        mine = np.flatnonzero(launch_rank == r)
        mine = mine[np.argsort(first_at[mine], kind="stable")]
        earliest = min(zip(start_epoch[mine].tolist(), start_step[mine].tolist(), strict=True))
        order_of = {int(k): i for i, k in enumerate(mine.tolist())}
        fresh = [
            int(k)
            for k in mine.tolist()
            if not restarted[k]
            and (int(start_epoch[k]), int(start_step[k])) == earliest
            and _replaces_earlier(int(k), spans, order_of)
        ]
        latest = mine.tolist().index(fresh[-1]) if fresh else 0
        dropped = mine[:latest]
        if dropped.shape[0]:
            keep_launch[dropped] = False
            left_out.append((int(r), int(dropped.shape[0]), int(counts[dropped].sum())))
    if not left_out:
        return records
    launches = sum(k for _, k, _ in left_out)
    n_records = sum(c for _, _, c in left_out)
    ranks = [r for r, _, _ in left_out]
    found.add(
        "earlier_runs",
        "info",
        launches,
        f"{launches} earlier launch(es) ({n_records} records, ranks {ranks[:8]}) started the run over from "
        "its first epoch and step and were left out: the audit covers each rank's latest run",
        ranks=ranks,
    )
    return records.take(keep_launch[launch])


def _stream_spans(
    records: ObservedRecords, launch: NDArray[np.intp]
) -> dict[int, list[tuple[int, int, int]]]:
    """Per launch: (stream, first index, last index) of its records in each writer stream it has."""
    stream, _ = _group(records.rank.astype(np.int64), records.worker.astype(np.int64))
    pairs = np.stack([stream.astype(np.int64), launch.astype(np.int64)], axis=1)
    keys, first = np.unique(pairs, axis=0, return_index=True)
    _, last_rev = np.unique(pairs[::-1], axis=0, return_index=True)
    last = pairs.shape[0] - 1 - last_rev
    spans: dict[int, list[tuple[int, int, int]]] = {}
    for (s, k), a, b in zip(keys.tolist(), first.tolist(), last.tolist(), strict=True):
        spans.setdefault(int(k), []).append((int(s), int(a), int(b)))
    return spans


def _replaces_earlier(k: int, spans: dict[int, list[tuple[int, int, int]]], order_of: dict[int, int]) -> bool:
    """Launch ``k`` took over its streams: no earlier launch of the rank wrote to any of them after
    ``k``'s first record there (a writer that restarted alone, beside one that goes on, is a resume)."""
    mine = {s: a for s, a, _ in spans[k]}
    for other, places in spans.items():
        if other == k or order_of.get(other, order_of[k]) >= order_of[k]:
            continue
        if any(s in mine and b > mine[s] for s, _, b in places):
            return False
    return True


def _last_passes(records: ObservedRecords, found: FindingCollector) -> ObservedRecords:
    passes = records.pass_index
    if passes is None or not bool(passes.any()):
        return records
    n = int(passes.shape[0])
    session = records.session if records.session is not None else np.zeros(n, dtype=np.int64)
    epoch = records.epoch.astype(np.int64)
    rank = records.rank.astype(np.int64)
    group, n_group = _group(session, epoch, rank)
    last = np.zeros(n_group, dtype=np.int64)
    np.maximum.at(last, group, passes)
    keep = passes == last[group]
    if bool(keep.all()):
        return records
    # records per (group, pass): an earlier pass shorter than the last was abandoned part-way; one at
    # least as long read the whole epoch again
    pair, pair_of = np.unique(np.stack([group, passes], axis=1), axis=0, return_inverse=True)
    sizes = np.bincount(np.ravel(pair_of), minlength=pair.shape[0])
    size = {(int(g), int(k)): int(c) for (g, k), c in zip(pair.tolist(), sizes.tolist(), strict=True)}
    first_of = np.full(n_group, n, dtype=np.int64)
    np.minimum.at(first_of, group, np.arange(n, dtype=np.int64))
    for g in np.unique(group[~keep]).tolist():
        at = int(first_of[g])
        e, r, final = int(epoch[at]), int(rank[at]), int(last[g])
        final_size = size[(g, final)]
        earlier = sorted(k for (gg, k) in size if gg == g and k != final)
        short = [k for k in earlier if size[(g, k)] < final_size]
        full = [k for k in earlier if size[(g, k)] >= final_size]
        if short:
            count = sum(size[(g, k)] for k in short)
            found.add(
                "abandoned_pass",
                "warning",
                count,
                f"epoch {e}, rank {r}: pass(es) {short[:4]} stopped after {count} records and pass {final} "
                "read the epoch again (a peek such as next(iter(loader)), or a loop that broke out); the "
                "earlier records are left out of coverage",
                e,
                [r],
            )
        if full:
            count = sum(size[(g, k)] for k in full)
            found.add(
                "repeated_pass",
                "error",
                count,
                f"epoch {e}, rank {r}: the loader was read in full {len(full) + 1} times in this epoch "
                f"(passes {[*full[:4], final]}); only the last is counted",
                e,
                [r],
            )
    return records.take(keep)
