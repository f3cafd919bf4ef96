"""Turning coverage counts into findings under the declared sampler policy."""

from __future__ import annotations

import re
from collections import Counter

import numpy as np
from numpy.typing import NDArray

from perfgate.audit.codes import IdCodes
from perfgate.audit.coverage import EpochCoverage
from perfgate.audit.findings import FindingCollector
from perfgate.audit.records import ObservedRecords
from perfgate.audit.report import AuditPolicy
from perfgate.security.quoting import file_text

__all__ = ["check_epoch", "check_inputs"]

_CANONICAL_INT = re.compile(r"-?(0|[1-9][0-9]*)")
_SHOWN = 3


def _ids_text(ids: IdCodes, codes: NDArray[np.int64]) -> str:
    return ", ".join(file_text(repr(v)) for v in ids.decode(codes[:_SHOWN]))


def check_inputs(
    records: ObservedRecords, ids: IdCodes, policy: AuditPolicy, world_size: int, found: FindingCollector
) -> None:
    """Findings about the inputs as a whole: unreadable lines, id types, ranks, unknown coverage."""
    bad = records.malformed
    if bad.count:
        where = "; ".join(f"{m.source} line {m.line}: {m.reason}" for m in bad.examples[:_SHOWN])
        found.add(
            "malformed_records", "error", bad.count, f"{bad.count} unreadable records skipped ({where})"
        )
    if ids.expected_count is None:
        found.add("coverage_unknown", "warning", 1, "no expected ids: missing ids cannot be detected")
    for note in records.notes:
        found.add("partial_step_column", "warning", 1, note)
    if policy.world_size is None:
        found.add(
            "world_size_inferred", "info", world_size, f"world size {world_size} inferred from the ranks seen"
        )
    else:
        outside = records.rank >= world_size
        if outside.any():
            ranks = np.unique(records.rank[outside]).tolist()
            found.add(
                "rank_out_of_range",
                "error",
                int(np.count_nonzero(outside)),
                f"{int(np.count_nonzero(outside))} records from ranks {ranks[:8]} with world_size {world_size}",
                ranks=ranks,
            )
    n_int, n_str = records.ids.counts_by_type()
    if n_int and n_str:
        found.add(
            "mixed_id_types",
            "warning",
            n_str,
            f"{n_int} records have int ids and {n_str} string ids; they are kept apart",
        )
        spelled = [s for s in records.pool.strings if _CANONICAL_INT.fullmatch(s)]
        observed_ints = records.ids.values[~records.ids.str_mask()]
        if spelled:
            as_ints = np.array([int(s) for s in spelled if -(2**63) <= int(s) < 2**63], dtype=np.int64)
            clash = as_ints[np.isin(as_ints, observed_ints)]
            if clash.shape[0]:
                found.add(
                    "ambiguous_ids",
                    "warning",
                    int(clash.shape[0]),
                    f"{clash.shape[0]} string ids spell int ids that also occur (e.g. "
                    + ", ".join(f"{int(v)} and '{int(v)}'" for v in clash[:_SHOWN].tolist())
                    + ")",
                )
    if ids.expected_duplicates:
        found.add(
            "expected_duplicates",
            "warning",
            ids.expected_duplicates,
            f"{ids.expected_duplicates} repeated expected ids",
        )


def check_epoch(
    epoch: int,
    cov: EpochCoverage,
    ids: IdCodes,
    policy: AuditPolicy,
    world_size: int,
    replayed: int,
    rank_records: NDArray[np.int64],
    found: FindingCollector,
    *,
    last: bool = False,
) -> tuple[int, bool]:
    """Add this epoch's findings; returns the repeats attributed to sampler padding, and whether the epoch
    is audited as a partial one: the run's last epoch, ended part-way (ids missing, nothing extra, every
    rank at the same count short of its share), is accepted for the ids it covers, and a finding says so."""
    n_ids = ids.expected_count if ids.expected_count is not None else cov.unique
    tail = n_ids % world_size
    partial = False
    if cov.missing is not None:
        allowed = tail if policy.drop_last else 0
        # a run stopped after k steps leaves every rank at the same count, short of its share; a lost
        # sample or shard leaves the ranks uneven (or one of them empty)
        counts = rank_records[:world_size]
        share = -(-n_ids // world_size)
        stopped = (
            bool(counts.shape[0]) and int(counts.min()) == int(counts.max()) and 0 < int(counts[0]) < share
        )
        if cov.missing > allowed and last and not cov.extra_ids and stopped:
            partial = True
            found.add(
                "partial_epoch",
                "warning",
                cov.missing,
                f"epoch {epoch}: the run ended part-way through it: {cov.unique} of {n_ids} expected ids were "
                "read; the audit covers those (duplicates, extra ids, ranks) and cannot see ids the run never "
                "reached",
                epoch,
            )
        elif cov.missing > allowed:
            extra_note = f", {allowed} of them dropped by drop_last" if allowed else ""
            found.add(
                "missing_ids",
                "error",
                cov.missing - allowed,
                f"epoch {epoch}: {cov.missing} expected ids never seen{extra_note} "
                f"(e.g. {_ids_text(ids, cov.missing_examples)})",
                epoch,
            )
        elif policy.drop_last and cov.missing == allowed and allowed:
            found.add("dropped_by_drop_last", "info", allowed, f"epoch {epoch}: {allowed} ids dropped", epoch)
        elif policy.drop_last and cov.missing < allowed:
            found.add(
                "drop_last_mismatch",
                "warning",
                allowed - cov.missing,
                f"epoch {epoch}: {cov.missing} ids missing where drop_last drops {allowed}",
                epoch,
            )
    if cov.extra_ids:
        found.add(
            "extra_ids",
            "error",
            cov.extra_ids,
            f"epoch {epoch}: {cov.extra_ids} unexpected ids in {cov.extra_records} records "
            f"(e.g. {_ids_text(ids, cov.extra_examples)})",
            epoch,
        )
    padding = _check_repeats(epoch, cov, ids, policy, world_size, n_ids, replayed, found, partial=partial)
    _check_ranks(epoch, rank_records, world_size, found)
    return padding, partial


def _check_repeats(
    epoch: int,
    cov: EpochCoverage,
    ids: IdCodes,
    policy: AuditPolicy,
    world_size: int,
    n_ids: int,
    replayed: int,
    found: FindingCollector,
    *,
    partial: bool = False,
) -> int:
    pad = -n_ids % world_size  # ceil(N / R) * R - N
    padding = 0
    if policy.allow_padding_repeats and not policy.drop_last and not policy.allow_repeats:
        padding = min(cov.cross_rank_repeats, pad)
        if cov.cross_rank_repeats < pad and not partial:  # the padding comes at the end of an epoch
            found.add(
                "padding_mismatch",
                "error",
                pad - cov.cross_rank_repeats,
                f"epoch {epoch}: padding {n_ids} ids over {world_size} ranks repeats exactly {pad} on other "
                f"ranks, found {cov.cross_rank_repeats}",
                epoch,
            )
    unexplained = cov.duplicates - replayed - padding
    if unexplained <= 0:
        return padding
    if policy.allow_repeats:
        found.add(
            "repeats_allowed", "info", unexplained, f"epoch {epoch}: {unexplained} repeated records", epoch
        )
        return padding
    cross = cov.cross_rank_repeats - padding
    owners = sorted({(r, w) for _, _, who in cov.duplicate_examples for r, w, _ in who})
    example = "; ".join(
        f"{file_text(repr(ids.decode([code])[0]))} x{count} by "
        + ", ".join(f"rank {r} worker {w}" for r, w, _ in who)
        for code, count, who in cov.duplicate_examples[:_SHOWN]
    )
    hint = ""
    if not policy.allow_padding_repeats and not policy.drop_last and pad and cov.cross_rank_repeats == pad:
        hint = f"; this is exactly a DistributedSampler padding of {pad}: set allow_padding_repeats=true"
    found.add(
        "duplicate_records",
        "error",
        unexplained,
        f"epoch {epoch}: {unexplained} repeated records ({cross} on another rank or worker, "
        f"{cov.same_rank_repeats} on the same rank; {cov.cross_owner_ids} ids seen by several owners), "
        f"e.g. {example}{hint}",
        epoch,
        sorted({r for r, _ in owners}),
    )
    return padding


def _check_ranks(
    epoch: int, rank_records: NDArray[np.int64], world_size: int, found: FindingCollector
) -> None:
    counts = rank_records[:world_size].tolist()
    empty = [r for r, n in enumerate(counts) if n == 0]
    if empty:
        found.add(
            "rank_without_records",
            "error",
            len(empty),
            f"epoch {epoch}: ranks {empty} recorded nothing (world_size {world_size})",
            epoch,
            empty,
        )
    loaded = [n for n in counts if n]
    if len(set(loaded)) > 1:
        common = Counter(loaded).most_common(1)[0][0]
        odd = [r for r, n in enumerate(counts) if n and n != common]
        found.add(
            "uneven_rank_records",
            "warning",
            len(odd),
            f"epoch {epoch}: ranks {odd} loaded "
            + ", ".join(f"{counts[r]}" for r in odd)
            + f" records where the others loaded {common}",
            epoch,
            odd,
        )
