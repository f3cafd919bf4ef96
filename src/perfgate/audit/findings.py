"""Findings gathered per kind across epochs, each with the fix an engineer would apply."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from perfgate.audit.report import Finding, Severity

__all__ = ["FindingCollector"]

_DETAILS_SHOWN = 4

ADVICE: dict[str, str] = {
    "malformed_records": "fix the writer or remove those lines; unreadable records cannot be audited",
    "coverage_unknown": "pass `expected` (a file of ids) or `expected_range` to check that no id is missing",
    "missing_ids": "check the sharding (each rank needs its own rank and the true world size), the "
    "DataLoader's drop_last, and that the epoch ran to completion (`epochs` audits only complete ones)",
    "extra_ids": "check that the expected set is this split's, and that no other source was mixed in",
    "duplicate_records": "two owners reading one shard usually means a wrong rank or world size passed "
    "to the sampler, or an IterableDataset that does not split work by worker "
    "(torch.utils.data.get_worker_info); set allow_repeats only for sampling with replacement",
    "padding_mismatch": "DistributedSampler(drop_last=False) repeats exactly ceil(N/R)*R - N ids per epoch; "
    "a different count means another sampler, a partial epoch, or lost or duplicated shards",
    "rank_without_records": "every rank must record every epoch: check that the rank ran, wrote its "
    "records, and that world_size is right",
    "rank_out_of_range": "ranks must be below world_size: check the rank the recorder was given",
    "uneven_rank_records": "ranks that load different numbers of samples run different numbers of steps "
    "(collectives then hang or mismatch); pad (DistributedSampler) or drop the tail evenly",
    "order_repeated": "call sampler.set_epoch(epoch) before every epoch: DistributedSampler shuffles with "
    "seed + epoch, so without it each epoch repeats the same order; pass shuffle=false if the order is "
    "meant to be fixed",
    "resume_replayed": "on resume, skip what the checkpoint already consumed in this epoch (restore the "
    "sampler or loader state, or skip step x batch samples) instead of restarting the epoch",
    "resume_skipped_steps": "on resume, restart at the checkpoint's step: skipping ahead drops samples",
    "resume_rolled_back": "records after the checkpoint were redone after the restart (expected when "
    "the checkpoint predates the crash); they are left out of coverage",
    "resume_no_steps": "without a step column the audit cannot tell work lost in the crash from real "
    "replays: record the training step with each sample",
    "mixed_id_types": 'ints and strings are different ids (1 is not "1"); write every id with one type',
    "ambiguous_ids": "these string ids spell int ids that also occur; they are counted as different "
    "samples: write every id with one type",
    "expected_duplicates": "the expected set lists some ids more than once (each counts once); check the "
    "dataset index for duplicated samples",
    "partial_step_column": "give every record a step, or none",
    "world_size_inferred": "pass world_size: a rank that recorded nothing is invisible otherwise",
    "epoch_not_observed": "the requested epoch has no records: check the epoch numbers",
    "dropped_by_drop_last": "drop_last=True drops N mod world_size ids per epoch, as declared",
    "drop_last_mismatch": "drop_last was declared but no id was dropped: check the sampler's drop_last",
    "partial_epoch": "the audit speaks for the ids the run read; to cover the whole epoch, record a run that "
    "finishes it (or audit only complete epochs with `epochs`)",
    "duplicated_shard": "two ranks or workers read the same shard in the same order: pass each sampler its own "
    "rank and the true world size, and split an IterableDataset by worker (torch.utils.data.get_worker_info); "
    "sampling with replacement never lines ids up position by position",
    "repeats_allowed": "repeats are allowed by allow_repeats (sampling with replacement)",
    "earlier_runs": "each launch that starts at the run's first epoch and step is a new run (repeated "
    "benchmark launches append to one folder); if one of them resumed the run instead, record the step "
    "with each sample or mark the resumed launch's records restart=true",
    "repeated_pass": "call sampler.set_epoch(epoch) before every epoch: a pass it did not announce stays "
    "in the current epoch, and DistributedSampler repeats that epoch's order",
    "abandoned_pass": "those samples were loaded twice, and trained on twice if the loop used the peeked "
    "batch: take a sample batch from the dataset (dataset[i]) or a separate loader, not from the "
    "training loader",
}


@dataclass
class _Entry:
    severity: Severity
    count: int = 0
    epochs: set[int] = field(default_factory=lambda: set[int]())
    ranks: set[int] = field(default_factory=lambda: set[int]())
    details: list[str] = field(default_factory=lambda: list[str]())


class FindingCollector:
    """Adds up one finding per kind; details from the first few epochs go into the message."""

    def __init__(self) -> None:
        self._entries: dict[str, _Entry] = {}

    def add(
        self,
        kind: str,
        severity: Severity,
        count: int,
        detail: str,
        epoch: int | None = None,
        ranks: Iterable[int] = (),
    ) -> None:
        assert kind in ADVICE, kind
        entry = self._entries.setdefault(kind, _Entry(severity))
        entry.count += count
        if epoch is not None:
            entry.epochs.add(epoch)
        entry.ranks.update(ranks)
        entry.details.append(detail)

    @property
    def failed(self) -> bool:
        return any(e.severity == "error" for e in self._entries.values())

    def findings(self) -> list[Finding]:
        order = {"error": 0, "warning": 1, "info": 2}
        out: list[Finding] = []
        for kind, entry in sorted(self._entries.items(), key=lambda kv: order[kv[1].severity]):
            shown = entry.details[:_DETAILS_SHOWN]
            more = len(entry.details) - len(shown)
            text = "; ".join(shown) + (f"; and {more} more" if more else "")
            out.append(
                Finding(
                    kind=kind,
                    severity=entry.severity,
                    count=entry.count,
                    message=f"{text}. {'Note' if entry.severity == 'info' else 'Fix'}: {ADVICE[kind]}.",
                    epochs=sorted(entry.epochs),
                    ranks=sorted(entry.ranks),
                )
            )
        return out
