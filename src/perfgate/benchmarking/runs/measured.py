"""What the harness measured of a run beyond its step times: the batch that reached the model, samples and
backward passes per optimizer step, the data stream, the environment and the training health.

Measured beats declared: `observe_batch` names where the run contradicts its contract.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from perfgate.benchmarking.workload.contract import Contract, check_observed

if TYPE_CHECKING:
    from perfgate.benchmarking.reading.records import RankRecord
    from perfgate.benchmarking.runs.health import HealthSummary

__all__ = [
    "BatchSource",
    "ObservedBatch",
    "backward_per_step",
    "launch_stream",
    "layout_reading",
    "measured_batch",
    "measured_environment",
    "observe_batch",
    "samples_per_step",
    "window_health",
]

BatchSource = Literal["model_inputs", "data_loader", "unverified"]


def samples_per_step(records: Sequence[RankRecord], warmup_steps: int) -> int | None:
    """Global samples per optimizer step the ranks' DataLoaders delivered over the measured steps, when
    every rank counted every step and the count is constant; ``None`` otherwise."""
    if not records:
        return None
    totals: set[int] = set()
    steps = min(r.steps.count for r in records)
    for j in range(warmup_steps, steps):
        column = [r.steps.samples[j] for r in records]
        if any(v is None for v in column):
            return None
        totals.add(sum(v or 0 for v in column))
    return totals.pop() if len(totals) == 1 else None


def measured_batch(
    records: Sequence[RankRecord], warmup_steps: int, loader: int | None, batch_first: bool | None = None
) -> tuple[int | None, BatchSource]:
    """Global samples per optimizer step that reached the model (summed over ranks and micro-batches), when
    every rank counted every measured step alike; else the DataLoader's count ``loader``; else unverified.

    The model's samples are read from the batch dimension the harness found (dimension 1 where a
    sequence-first layer saw its batch there), or from the one ``batch_first`` declares."""
    if records:
        steps = min(r.steps.count for r in records)
        columns = [_model_column(r, batch_first) for r in records]
        if all(len(c) >= steps for c in columns) and steps > warmup_steps:
            totals = {sum(c[j] or 0 for c in columns) for j in range(warmup_steps, steps)}
            known = all(c[j] is not None for c in columns for j in range(warmup_steps, steps))
            if known and len(totals) == 1 and (total := totals.pop()) > 0:
                return total, "model_inputs"
    if loader is not None:
        return loader, "data_loader"
    return None, "unverified"


def _model_column(record: RankRecord, batch_first: bool | None) -> list[int | None]:
    """The per-step samples of ``record``'s model inputs read from the declared dimension, else the harness's."""
    found = record.batch_layout.dim if record.batch_layout is not None else 0
    want = found if batch_first is None else (0 if batch_first else 1)
    if want == found:
        return record.steps.model_samples
    if want == 1:
        return record.steps.model_second_dim
    # dimension 0 declared where the harness read dimension 1: the leading dimension is not recorded
    return []


def layout_reading(records: Sequence[RankRecord], batch_first: bool | None) -> tuple[str | None, list[str]]:
    """Which dimension the batch was read from, in words (None: the leading one, found by default), and where
    a declared ``batch_first`` contradicts a sequence-first layer's reading (both readings named)."""
    layout = next((r.batch_layout for r in records if r.batch_layout is not None), None)
    problems: list[str] = []
    if layout is not None and batch_first is not None and layout.dim != (0 if batch_first else 1):
        problems.append(
            f"contract declares batch_first {str(batch_first).lower()} (the batch in dimension "
            f"{0 if batch_first else 1} of the model's input), but the sequence-first layer {layout.layer} inside "
            f"the model saw a batch of {layout.layer_batch}, dimension {layout.dim} of that input"
        )
    if batch_first is not None:
        return (
            f"dimension {0 if batch_first else 1} of the model's first input, as contract batch_first declares",
            problems,
        )
    if layout is not None and layout.dim == 1:
        return (
            f"dimension 1 of the model's first input: the sequence-first layer {layout.layer} saw its batch of "
            f"{layout.layer_batch} there",
            problems,
        )
    return None, problems


def backward_per_step(records: Sequence[RankRecord]) -> int | None:
    """backward() calls per optimizer step, counted by the harness over each measured window (host
    counter read at window edges), when every rank and window agrees on a whole number; else ``None``."""
    if not records or any(r.timing != "optimizer" for r in records):
        return None
    seen: set[float] = set()
    for r in records:
        for w in r.windows:
            if w.backward_calls is None or w.steps <= 0:
                return None
            seen.add(w.backward_calls / w.steps)
    if len(seen) != 1:
        return None
    value = seen.pop()
    return int(value) if value.is_integer() and value > 0 else None


def launch_stream(records: Sequence[RankRecord]) -> str | None:
    """One launch's sample stream: every rank's digest in rank order, or None when a rank has none."""
    ranks = sorted(records, key=lambda r: r.rank)
    if not ranks or any(r.sample_stream is None for r in ranks):
        return None
    if len(ranks) == 1:
        return ranks[0].sample_stream
    return hashlib.blake2b("|".join(str(r.sample_stream) for r in ranks).encode(), digest_size=16).hexdigest()


def measured_environment(record: RankRecord | None) -> dict[str, str | None]:
    """The environment the training process measured (rank 0's record): the window fingerprint."""
    device = record.device if record is not None else None
    return {
        "device_kind": device.kind if device else None,
        "device_name": device.name if device else None,
        "device_runtime": device.runtime_version if device else None,
        "torch_version": record.torch_version if record else None,
        "python_version": record.python if record else None,
        **((record.runtime_env or {}) if record else {}),
    }


def window_health(records: Sequence[RankRecord]) -> tuple[HealthSummary, int, int] | None:
    """Training health over the measured windows of every rank, with the first and last step it covers;
    ``None`` when no rank saw a loss."""
    from perfgate.benchmarking.runs.health import health_from_windows

    by_rank: dict[int, list[Any]] = {}
    for r in records:
        by_rank.setdefault(r.rank, []).extend(r.windows)
    h = health_from_windows(list(by_rank.items()))
    if h is None:
        return None
    steps = [s for r in records for w in r.windows for s in (w.first_step, w.last_step)]
    return h, min(steps), max(steps)


@dataclass(frozen=True)
class ObservedBatch:
    """The batch a launch measured and what it contradicts in the contract."""

    samples_per_step: int | None
    """The DataLoader's count, else what reached the model; ``None``: neither was seen on every step."""
    batch: int | None
    source: BatchSource
    problems: list[str] = field(default_factory=list[str])
    """Where the run contradicts its contract (or the declared samples per step)."""
    warnings: list[str] = field(default_factory=list[str])


def observe_batch(
    contract: Contract,
    world_size: int,
    records: Sequence[RankRecord],
    warmup_steps: int,
    declared_samples: int | None,
) -> ObservedBatch:
    """The first launch's measured batch, samples and backward passes per step and device, checked against
    ``contract`` and the declared samples per step."""
    warnings: list[str] = []
    declared_layout = contract.execution.get("batch_first", contract.invariants.get("batch_first"))
    batch_first = declared_layout if isinstance(declared_layout, bool) else None
    measured = samples_per_step(records, warmup_steps)
    batch, source = measured_batch(records, warmup_steps, measured, batch_first)
    read_from, layout_problems = layout_reading(records, batch_first)
    if read_from is not None and source == "model_inputs":
        warnings.append(f"measured_batch {batch} read from {read_from}")
    if measured is None:
        measured = batch
    elif batch is not None and batch != measured:
        warnings.append(
            f"the top-level module's inputs held {batch} samples per optimizer step, but the DataLoader "
            f"delivered {measured}: measured_batch is what reached the model"
        )
    device = records[0].device if records else None
    model = next((r.model for r in records if r.model is not None), None)
    problems = layout_problems + check_observed(
        contract,
        world_size,
        measured,
        backward_per_step=backward_per_step(records),
        device_kind=device.kind if device else None,
        device_name=device.name if device else None,
        param_dtype=model.param_dtype if model is not None else None,
        autocast=sorted({a for r in records for a in r.autocast}),
    )
    if declared_samples is not None and measured is not None and measured != declared_samples:
        problems.append(
            f"samples_per_step {declared_samples} was given, but the harness counted {measured} samples "
            "per optimizer step"
        )
    return ObservedBatch(measured, batch, source, problems, warnings)
