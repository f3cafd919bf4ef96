"""Read and validate the per-rank record files the harness writes (``rank<N>.json``)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from perfgate.benchmarking.errors import RecordError
from perfgate.harness.record import RECORD_SCHEMA, RECORD_VERSION

__all__ = [
    "DeviceRecord",
    "RankRecord",
    "RecordSet",
    "StepColumns",
    "WindowRecord",
    "load_records",
    "read_record",
]


class DeviceRecord(msgspec.Struct, frozen=True):
    kind: str
    index: int | None = None
    name: str | None = None
    runtime_version: str | None = None
    synchronized: bool = False
    events: bool = False


class StepColumns(msgspec.Struct, frozen=True):
    """One entry per step, warm-up included; times in integer nanoseconds."""

    count: int
    warmup: int
    start_ns: list[int]
    end_ns: list[int]
    step_time_ns: list[int]
    data_wait_ns: list[int]
    backward_ns: list[int]
    samples: list[int | None]
    tokens: list[int | None]


class WindowRecord(msgspec.Struct, frozen=True):
    """One measured window of one rank: steps ``first_step..last_step`` (inclusive)."""

    index: int
    first_step: int
    last_step: int
    steps: int
    start_ns: int
    end_ns: int
    elapsed_ns: int
    start_unix_ns: int
    end_unix_ns: int
    device_elapsed_ms: float | None = None
    device_step_ms: list[float] | None = None
    peak_allocated_bytes: int | None = None
    peak_reserved_bytes: int | None = None
    host_rss_bytes: int | None = None
    host_peak_rss_bytes: int | None = None
    loss: list[float | None] | None = None
    nonfinite_loss_steps: list[int] | None = None
    skipped_steps: list[list[int]] | None = None
    loss_scale_start: float | None = None
    loss_scale_end: float | None = None


class RankRecord(msgspec.Struct, frozen=True):
    """A whole record file (schema ``perfgate.harness.record``, version 1); unknown fields are ignored."""

    schema: str
    version: int
    rank: int
    world_size: int
    timing: str
    warmup_steps: int
    measure_steps: int
    windows_requested: int
    complete: bool
    profiled: bool
    steps: StepColumns
    windows: list[WindowRecord]
    origin_unix_ns: int
    local_rank: int = 0
    hostname: str = ""
    pid: int = 0
    label: str | None = None
    stop_reason: str | None = None
    error: str | None = None
    profile: dict[str, Any] | None = None
    device: DeviceRecord | None = None
    other_optimizer_steps: int = 0
    notes: list[str] = msgspec.field(default_factory=list[str])
    python: str | None = None
    torch_version: str | None = None


@dataclass(frozen=True)
class RecordSet:
    """The records of one launch, sorted by rank, and what is wrong with the set as a whole."""

    records: list[RankRecord]
    problems: list[str]

    @property
    def world_size(self) -> int:
        return max((r.world_size for r in self.records), default=0)


_decoder = msgspec.json.Decoder(RankRecord)


def read_record(path: Path) -> RankRecord:
    """Decode one record file.

    Raises:
        RecordError: unreadable, not JSON, or not a harness record of a known version.
    """
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise RecordError(f"cannot read harness record {path}: {exc}") from exc
    try:
        record = _decoder.decode(data)
    except msgspec.DecodeError as exc:
        raise RecordError(f"{path} is not a valid harness record: {exc}") from exc
    if record.schema != RECORD_SCHEMA or record.version != RECORD_VERSION:
        raise RecordError(
            f"{path} has schema {record.schema!r} v{record.version}; this perfgate reads "
            f"{RECORD_SCHEMA!r} v{RECORD_VERSION}: run the training with the same perfgate version"
        )
    n = record.steps.count
    columns = (
        record.steps.start_ns,
        record.steps.end_ns,
        record.steps.step_time_ns,
        record.steps.data_wait_ns,
    )
    if any(len(c) != n for c in columns) or len(record.steps.samples) != n or len(record.steps.tokens) != n:
        raise RecordError(f"{path}: step columns disagree with steps.count={n} (the file is corrupt)")
    return record


def load_records(directory: Path) -> RecordSet:
    """All ``rank*.json`` records in ``directory``, with problems such as missing or duplicate ranks.

    Raises:
        RecordError: a file cannot be decoded.
    """
    records = [read_record(p) for p in sorted(directory.glob("rank*.json"))]
    records.sort(key=lambda r: r.rank)
    problems: list[str] = []
    if not records:
        problems.append(f"no harness record was written to {directory}")
        return RecordSet(records, problems)
    ranks = [r.rank for r in records]
    if len(set(ranks)) != len(ranks):
        problems.append(f"duplicate ranks among the records: {ranks}")
    sizes = {r.world_size for r in records}
    if len(sizes) > 1:
        problems.append(f"records disagree on the world size: {sorted(sizes)}")
    world = max(sizes)
    missing = sorted(set(range(world)) - set(ranks))
    if missing:
        problems.append(f"no record from rank(s) {missing} of world size {world}")
    return RecordSet(records, problems)
