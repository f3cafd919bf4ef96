"""The audit's result: per-epoch coverage and findings, as pydantic models (the tool's output schema)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Literal

from pydantic import BaseModel, Field

__all__ = [
    "AuditPolicy",
    "AuditReport",
    "DuplicateExample",
    "EpochExamples",
    "EpochReport",
    "Finding",
    "IdTypes",
    "OwnerCount",
    "RankCount",
    "Severity",
]

Severity = Literal["error", "warning", "info"]
SampleId = Annotated[int | str, Field(description='A sample id; 1 and "1" are different ids.')]


@dataclass(frozen=True)
class AuditPolicy:
    """What the sampler is supposed to do.

    world_size: ranks that share each epoch (None: inferred from the highest rank seen).
    drop_last: the sampler drops the tail (N mod world_size ids) instead of padding.
    allow_padding_repeats: the sampler pads each epoch to ceil(N / world_size) * world_size records by
        repeating ids on other ranks (DistributedSampler with drop_last=False); checked to be exactly that.
    allow_repeats: sampling with replacement; repeats are not errors (missing and extra ids still are).
    shuffle: the order should change between epochs; an identical per-rank order is then an error.
    epochs: audit only these epochs (None: every epoch seen).
    example_limit: ids listed per example list; counts are always complete.
    """

    world_size: int | None = None
    drop_last: bool = False
    allow_padding_repeats: bool = False
    allow_repeats: bool = False
    shuffle: bool = True
    epochs: tuple[int, ...] | None = None
    example_limit: int = 10


class Finding(BaseModel):
    """One problem (or notable fact), with what to do about it."""

    kind: str = Field(description="Stable machine-readable name, e.g. missing_ids, order_repeated.")
    severity: Severity = Field(description="error fails the audit; warning and info do not.")
    count: int = Field(description="How many ids, records, ranks or steps the finding covers (see message).")
    message: str = Field(description="What was seen and what to fix.")
    epochs: list[int] = Field(default_factory=list[int], description="Epochs involved.")
    ranks: list[int] = Field(default_factory=list[int], description="Ranks involved, when known.")


class OwnerCount(BaseModel):
    rank: int
    worker: int = Field(description="DataLoader worker id; -1 is the main process.")
    records: int


class DuplicateExample(BaseModel):
    sample_id: SampleId
    records: int = Field(description="Records of this id in the epoch.")
    owners: list[OwnerCount]


class EpochExamples(BaseModel):
    """Capped at example_limit each; the counts in EpochReport are complete."""

    missing: list[SampleId] = Field(default_factory=list[SampleId])
    extra: list[SampleId] = Field(default_factory=list[SampleId])
    duplicates: list[DuplicateExample] = Field(default_factory=list[DuplicateExample])


class RankCount(BaseModel):
    rank: int
    records: int


class EpochReport(BaseModel):
    epoch: int
    records: int = Field(description="Records counted in this epoch (rolled-back records left out).")
    unique: int = Field(description="Distinct ids seen.")
    missing: int | None = Field(description="Expected ids never seen; null when coverage is unknown.")
    extra: int | None = Field(description="Distinct ids seen that are not expected; null when unknown.")
    extra_records: int | None = Field(description="Records of those extra ids; null when unknown.")
    duplicates: int = Field(description="Records that repeat an id already seen this epoch.")
    duplicate_ids: int = Field(description="Distinct ids seen more than once.")
    cross_owner_duplicates: int = Field(description="Distinct ids seen by more than one (rank, worker).")
    padding_repeats: int = Field(description="Repeats attributed to sampler padding (when allowed).")
    replayed: int = Field(description="Records after a resume that repeat ids consumed before it.")
    rolled_back: int = Field(description="Records before a resume whose step was redone after it.")
    records_per_rank: list[RankCount]
    examples: EpochExamples
    partial: bool = Field(
        default=False,
        description="The run ended part-way through this epoch: it is audited for the ids it read (missing "
        "ids are not counted against it).",
    )
    aligned_repeats: int = Field(
        default=0,
        description="Positions of the epoch at which two (rank, worker) owners read the same id: a "
        "duplicated shard when more than chance explains, whatever repeats the policy allows.",
    )


class IdTypes(BaseModel):
    int_records: int
    str_records: int


class AuditReport(BaseModel):
    status: Literal["passed", "failed"] = Field(description="failed when any finding is an error.")
    coverage: Literal["checked", "unknown"] = Field(
        description="unknown without expected ids: missing ids cannot be seen, so coverage is never certified."
    )
    records: int = Field(description="Readable observed records.")
    malformed_records: int
    expected_ids: int | None = Field(
        description="Distinct expected ids per epoch; null without an expected set."
    )
    world_size: int
    world_size_inferred: bool
    id_types: IdTypes
    epochs: list[EpochReport]
    findings: list[Finding]
    sources: list[str] = Field(description="Files read, in order.")
    launches: list[int] = Field(
        default_factory=list[int],
        description="The launch ids (the records' session) of the records counted: the launches the audit "
        "speaks for, which a keep binds to the candidate's runs. Empty: the records carry no session.",
    )
    partial_epochs: list[int] = Field(
        default_factory=list[int],
        description="Epochs the run ended part-way through, audited for what they cover.",
    )
