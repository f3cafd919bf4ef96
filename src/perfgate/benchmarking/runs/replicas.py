"""Do a data-parallel run's replicas agree? Every rank applies the same update to its own copy of the model,
so after an update the copies are bit-identical; a rank that skips or delays the gradient all-reduce (syncing
less often, a broken hook) drifts apart from the others while each still trains.

The harness digests each rank's parameters after the last window's last update
(`perfgate.harness.capture.replica_digest`); this module compares the digests of one launch's ranks. Ranks
that hold shards rather than replicas (tensor, pipeline, context or expert parallel, FSDP/ZeRO sharding, as
the contract declares them; or a different model structure per rank) are not compared.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

from pydantic import BaseModel, Field

from perfgate.benchmarking.reading.records import RankRecord

__all__ = ["ReplicaCheck", "replica_check"]

_SHARDING_KEYS = ("tensor_parallel", "pipeline_parallel", "context_parallel", "expert_parallel")
_SHARDED = ("sharding", "fsdp", "zero_stage")


class ReplicaCheck(BaseModel):
    """One launch's data-parallel replicas after the last measured update."""

    launch: int
    status: Literal["agree", "disagree", "not_applicable", "unavailable"] = Field(
        description="agree: every rank's parameters digest alike after the last window's last update; "
        "disagree: they differ (the ranks no longer apply the same update: no keep); not_applicable: one "
        "rank, or ranks that hold shards rather than replicas; unavailable: a rank recorded no digest."
    )
    reason: str
    groups: list[list[int]] = Field(
        default_factory=list[list[int]], description="Ranks grouped by the digest they hold (disagree only)."
    )


def _shards(execution: Mapping[str, Any]) -> str | None:
    for key in _SHARDING_KEYS:
        value = execution.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 1:
            return f"{key}={value}"
    for key in _SHARDED:
        value = execution.get(key)
        if value not in (None, False, 0, "", "none", "no", "off"):
            return f"{key}={value}"
    return None


def replica_check(launch: int, records: Sequence[RankRecord], execution: Mapping[str, Any]) -> ReplicaCheck:
    """Compare the ranks of one launch (``execution``: the contract's execution settings)."""
    if len({r.rank for r in records}) < 2:
        return ReplicaCheck(launch=launch, status="not_applicable", reason="one rank: no replicas")
    sharded = _shards(execution)
    if sharded is not None:
        return ReplicaCheck(
            launch=launch,
            status="not_applicable",
            reason=f"the contract declares {sharded}: ranks hold shards",
        )
    structures = {r.model.structure if r.model else None for r in records}
    if len(structures) > 1:
        return ReplicaCheck(
            launch=launch,
            status="not_applicable",
            reason="the ranks' models differ in structure (shards, not replicas)",
        )
    digests: dict[int, str | None] = {}
    for r in records:
        last = max(r.windows, key=lambda w: w.index, default=None)
        digests[r.rank] = last.replica_digest if last is not None else None
    missing = sorted(rank for rank, d in digests.items() if d is None)
    if missing:
        return ReplicaCheck(
            launch=launch,
            status="unavailable",
            reason=f"rank(s) {missing} recorded no parameter digest (no training module seen, or torch could not "
            "compute it)",
        )
    by_digest: dict[str, list[int]] = {}
    for rank, d in sorted(digests.items()):
        assert d is not None
        by_digest.setdefault(d, []).append(rank)
    if len(by_digest) == 1:
        return ReplicaCheck(
            launch=launch,
            status="agree",
            reason=f"{len(digests)} ranks hold identical parameters after the update",
        )
    groups = sorted(by_digest.values(), key=lambda g: (-len(g), g))
    return ReplicaCheck(
        launch=launch,
        status="disagree",
        reason="the replicas differ after the last measured update: "
        + " vs ".join(f"rank(s) {g}" for g in groups)
        + "; every rank must apply the same update (is a gradient all-reduce skipped or deferred?)",
        groups=groups,
    )
