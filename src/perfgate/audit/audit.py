"""The audit: did every rank and worker see the ids it should, each epoch, under the declared policy?"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
from numpy.typing import NDArray

from perfgate.audit.codes import IdCodes, encode_ids
from perfgate.audit.coverage import EpochCoverage, OwnerTable, epoch_coverage
from perfgate.audit.errors import AuditInputError
from perfgate.audit.expected import ExpectedIds
from perfgate.audit.findings import FindingCollector
from perfgate.audit.order import rank_sequences, repeated_orders
from perfgate.audit.policy_checks import check_epoch, check_inputs
from perfgate.audit.records import ObservedRecords
from perfgate.audit.report import (
    AuditPolicy,
    AuditReport,
    DuplicateExample,
    EpochExamples,
    EpochReport,
    IdTypes,
    OwnerCount,
    RankCount,
)
from perfgate.audit.resume import ResumeFindings, find_resumes
from perfgate.audit.runs import select_records
from perfgate.audit.shards import aligned_repeats
from perfgate.helpers.deadline import checkpoint

__all__ = ["audit_records"]

_MASK_GROUPING_MAX_EPOCHS = 8


def audit_records(records: ObservedRecords, expected: ExpectedIds | None, policy: AuditPolicy) -> AuditReport:
    """Audit observed records against the expected ids (applied to every epoch) and the policy.

    Raises:
        AuditInputError: no readable record, or a world_size below 1.
    """
    if len(records) == 0:
        first = "; ".join(f"line {m.line}: {m.reason}" for m in records.malformed.examples[:3])
        raise AuditInputError(
            f"no readable observed records in {', '.join(records.sources) or 'the input'}"
            + (f" ({records.malformed.count} malformed; {first})" if first else "")
        )
    if policy.world_size is not None and policy.world_size < 1:
        raise AuditInputError(f"world_size must be >= 1, got {policy.world_size}")
    found = FindingCollector()
    readable = len(records)
    records = select_records(records, found)
    ids = encode_ids(records.ids, records.pool, expected)
    world_size = policy.world_size if policy.world_size is not None else int(records.rank.max()) + 1
    owner, owners = _owners(records.rank, records.worker)
    check_inputs(records, ids, policy, world_size, found)
    resume = find_resumes(
        ids.codes,
        records.epoch,
        records.rank,
        owner,
        len(owners),
        records.step,
        records.session,
        records.restart,
    )
    if resume is not None:
        _resume_findings(resume, records.step is not None, found)

    seen = np.unique(records.epoch) if records.epoch.shape[0] else np.empty(0, np.int32)
    wanted = [int(e) for e in seen.tolist()] if policy.epochs is None else sorted(set(policy.epochs))
    absent = [e for e in wanted if e not in set(seen.tolist())]
    if absent:
        found.add("epoch_not_observed", "error", len(absent), f"no records for epochs {absent}")
    reports: list[EpochReport] = []
    previous: dict[int, NDArray[np.int64]] | None = None
    width = max(world_size, int(records.rank.max()) + 1)
    audited = [e for e in wanted if e not in absent]
    last_seen = int(seen.max()) if seen.shape[0] else None
    for epoch, idx in _epoch_groups(records.epoch, audited):
        checkpoint()
        if resume is not None:
            idx = idx[~resume.rolled_back[idx]]
        # one epoch at a time in int64: products of codes below must not overflow
        codes, rank = ids.codes[idx].astype(np.int64), records.rank[idx]
        replayed = None if resume is None else resume.replayed[idx]
        cov = epoch_coverage(ids, codes, rank, owner[idx], replayed, owners, width, policy.example_limit)
        n_replayed = 0 if replayed is None else int(np.count_nonzero(replayed))
        replayed_per_rank = (
            np.zeros(width, np.int64) if replayed is None else np.bincount(rank[replayed], minlength=width)
        )
        padding, partial = check_epoch(
            epoch,
            cov,
            ids,
            policy,
            world_size,
            n_replayed,
            cov.records_per_rank - replayed_per_rank,
            found,
            last=epoch == last_seen and not _resume_gap(resume, epoch),
        )
        n_ids = ids.expected_count if ids.expected_count is not None else cov.unique
        shard = aligned_repeats(codes, owner[idx], owners.rank, owners.worker, n_ids)
        if shard.duplicated:
            found.add(
                "duplicated_shard",
                "error",
                shard.aligned,
                f"epoch {epoch}: {shard.aligned} positions where two owners read the same id at the same place "
                f"in their streams (chance explains {shard.chance:.1f}): owners "
                + ", ".join(f"rank {r} worker {w}" for r, w in shard.owners)
                + " read one shard; allow_repeats does not excuse this",
                epoch,
                sorted({r for r, _ in shard.owners}),
            )
        current = rank_sequences(codes, rank)
        if previous is not None and policy.shuffle:
            ranks = repeated_orders(previous, current)
            if ranks:
                found.add(
                    "order_repeated",
                    "error",
                    len(ranks),
                    f"epoch {epoch}: ranks {ranks} read the same ids in the same order as the epoch before",
                    epoch,
                    ranks,
                )
        previous = current
        rolled = 0 if resume is None else sum(g.rolled_back for g in resume.groups if g.epoch == epoch)
        report = _epoch_report(epoch, cov, ids, padding, n_replayed, rolled)
        report.partial, report.aligned_repeats = partial, shard.aligned
        reports.append(report)
    n_int, n_str = records.ids.counts_by_type()
    return AuditReport(
        status="failed" if found.failed else "passed",
        coverage="checked" if ids.expected_count is not None else "unknown",
        records=readable,
        malformed_records=records.malformed.count,
        expected_ids=ids.expected_count,
        world_size=world_size,
        world_size_inferred=policy.world_size is None,
        id_types=IdTypes(int_records=n_int, str_records=n_str),
        epochs=reports,
        findings=found.findings(),
        sources=list(records.sources),
        launches=[]
        if records.session is None
        else sorted({int(v) for v in np.unique(records.session).tolist()}),
        partial_epochs=[r.epoch for r in reports if r.partial],
    )


def _owners(rank: NDArray[np.int32], worker: NDArray[np.int32]) -> tuple[NDArray[np.int32], OwnerTable]:
    """Dense owner index per record, and the (rank, worker) of each owner."""
    slots = int(worker.max()) + 2
    if (int(rank.max()) + 1) * slots < (1 << 24):
        # small keys: build them in int32, in place, and map through a lookup table
        raw = rank * np.int32(slots)
        raw += worker
        raw += np.int32(1)
        present = np.bincount(raw) > 0
        table = np.flatnonzero(present).astype(np.int64)
        lookup = (np.cumsum(present) - 1).astype(np.int32)
        return lookup[raw], OwnerTable(rank=table // slots, worker=table % slots - 1)
    wide = rank.astype(np.int64) * slots + (worker.astype(np.int64) + 1)
    table, inverse = np.unique(wide, return_inverse=True)
    dense = np.ravel(inverse).astype(np.int32)
    return dense, OwnerTable(rank=table // slots, worker=table % slots - 1)


def _epoch_groups(epoch: NDArray[np.int32], wanted: list[int]) -> Iterator[tuple[int, NDArray[np.intp]]]:
    """Record indices of each wanted epoch, in file order."""
    if len(wanted) <= _MASK_GROUPING_MAX_EPOCHS:
        for e in wanted:
            yield e, np.flatnonzero(epoch == e)
        return
    order = np.argsort(epoch, kind="stable")
    sorted_epochs = epoch[order]
    for e in wanted:
        lo, hi = np.searchsorted(sorted_epochs, [e, e + 1])
        yield e, order[int(lo) : int(hi)]


def _resume_gap(resume: ResumeFindings | None, epoch: int) -> bool:
    """A restart in ``epoch`` skipped or replayed work: its missing ids are that, not an unfinished run."""
    return resume is not None and any(
        g.epoch == epoch and (g.skipped_steps or g.replayed) for g in resume.groups
    )


def _resume_findings(resume: ResumeFindings, has_steps: bool, found: FindingCollector) -> None:
    for g in resume.groups:
        where = f"epoch {g.epoch}, rank {g.rank}"
        if g.replayed:
            found.add(
                "resume_replayed",
                "error",
                g.replayed,
                f"{where}: {g.replayed} records ({g.replayed_ids} ids) after {g.boundaries} restart(s) "
                "repeat ids consumed before it",
                g.epoch,
                [g.rank],
            )
        if g.skipped_steps:
            found.add(
                "resume_skipped_steps",
                "error",
                g.skipped_steps,
                f"{where}: {g.skipped_steps} steps were never run around a restart",
                g.epoch,
                [g.rank],
            )
        if g.rolled_back:
            found.add(
                "resume_rolled_back",
                "info",
                g.rolled_back,
                f"{where}: {g.rolled_back} records before a restart were redone after it",
                g.epoch,
                [g.rank],
            )
    if not has_steps and any(g.replayed for g in resume.groups):
        found.add(
            "resume_no_steps", "warning", resume.boundaries, f"{resume.boundaries} restarts without steps"
        )


def _epoch_report(
    epoch: int,
    cov: EpochCoverage,
    ids: IdCodes,
    padding: int,
    replayed: int,
    rolled_back: int,
) -> EpochReport:
    return EpochReport(
        epoch=epoch,
        records=cov.records,
        unique=cov.unique,
        missing=cov.missing,
        extra=cov.extra_ids,
        extra_records=cov.extra_records,
        duplicates=cov.duplicates,
        duplicate_ids=cov.duplicate_ids,
        cross_owner_duplicates=cov.cross_owner_ids,
        padding_repeats=padding,
        replayed=replayed,
        rolled_back=rolled_back,
        records_per_rank=[
            RankCount(rank=r, records=int(n)) for r, n in enumerate(cov.records_per_rank.tolist())
        ],
        examples=EpochExamples(
            missing=ids.decode(cov.missing_examples),
            extra=ids.decode(cov.extra_examples),
            duplicates=[
                DuplicateExample(
                    sample_id=ids.decode([code])[0],
                    records=count,
                    owners=[OwnerCount(rank=r, worker=w, records=c) for r, w, c in who],
                )
                for code, count, who in cov.duplicate_examples
            ],
        ),
    )
