"""Measured windows, ranks, nodes and the trained model as benchmark records report them (launched and
imported alike): rows built from window summaries and harness records."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from pydantic import BaseModel, Field

if TYPE_CHECKING:
    from perfgate.benchmarking.comparing.aggregate import RunSummary, WindowSummary
    from perfgate.benchmarking.reading.records import RankRecord

__all__ = [
    "ModelFacts",
    "NodeFacts",
    "RankResult",
    "Throughput",
    "WindowResult",
    "attach_nodes",
    "model_facts",
    "rank_results",
    "run_throughput",
    "window_result",
]


class Throughput(BaseModel):
    samples_per_s: float | None = Field(description="Global samples per second; null when not counted.")
    tokens_per_s: float | None = Field(description="Global tokens per second; null when not given.")
    steps_per_s: float = Field(description="Optimizer steps per second.")
    basis: str = Field(description="How it was computed.")


class NodeFacts(BaseModel):
    """What a rank saw of its node (read by the harness before its first window)."""

    hostname: str | None = None
    slurm_job_id: str | None = None
    slurm_node: str | None = None
    device: str | None = Field(default=None, description="Device kind and name this rank timed on.")
    cpus: int | None = Field(default=None, description="CPUs this rank may run on.")
    visible_devices: dict[str, str] = Field(
        default_factory=dict[str, str], description="Device visibility variables (CUDA_VISIBLE_DEVICES, ...)."
    )
    interconnect: list[str] = Field(
        default_factory=list[str], description="RDMA devices visible (/sys/class/infiniband); [] = none seen."
    )
    network: list[str] = Field(default_factory=list[str], description="Non-loopback network interfaces.")
    comm_env: dict[str, str] = Field(
        default_factory=dict[str, str], description="NCCL/Gloo interface settings in the rank's environment."
    )


class RankResult(BaseModel):
    rank: int
    median_step_ms: float
    p95_step_ms: float
    iqr_ratio: float
    steps_measured: int
    elapsed_s: float
    data_wait_fraction: float = Field(
        description="Share of the rank's window spent blocked on the DataLoader."
    )
    collective_wait_fraction: float = Field(
        description="Estimated share spent waiting for other ranks (backward time above the fastest rank's)."
    )
    peak_allocated_bytes: int | None
    peak_reserved_bytes: int | None
    host_peak_rss_bytes: int | None
    step_time_source: str = Field(description="'device_events', 'host' or 'log'.")
    hostname: str | None = Field(default=None, description="Host the rank ran on (first launch).")
    node: NodeFacts | None = Field(default=None, description="The rank's node as it saw it (first launch).")


class WindowResult(BaseModel):
    launch: int
    index: int
    median_step_ms: float
    p95_step_ms: float
    iqr_ratio: float
    noisy: bool
    steps: int
    elapsed_s: float
    samples_per_s: float | None
    tokens_per_s: float | None
    steps_per_s: float
    slowest_rank: int
    rank_skew: float


class ModelFacts(BaseModel):
    name: str = Field(description="Class of the top-level module that trained (module.qualname).")
    parameters: int = Field(description="Its parameter count (elements).")
    trainable_parameters: int = Field(description="Parameters with requires_grad.")
    structure: str = Field(description="Digest of every parameter's name, shape and dtype.")


def window_result(launch: int, w: WindowSummary) -> WindowResult:
    """One measured window as the tools report it (launched and imported alike)."""
    return WindowResult(
        launch=launch,
        index=w.index,
        median_step_ms=w.stats.median_ms,
        p95_step_ms=w.stats.p95_ms,
        iqr_ratio=w.stats.iqr_ratio,
        noisy=w.stats.noisy,
        steps=w.steps,
        elapsed_s=w.elapsed_s,
        samples_per_s=w.samples_per_s,
        tokens_per_s=w.tokens_per_s,
        steps_per_s=w.steps_per_s,
        slowest_rank=w.slowest_rank,
        rank_skew=w.rank_skew,
    )


def run_throughput(summary: RunSummary) -> Throughput:
    """A launched run's global throughput, pooled over its windows."""
    return Throughput(
        samples_per_s=summary.samples_per_s,
        tokens_per_s=summary.tokens_per_s,
        steps_per_s=summary.steps_per_s,
        basis="global work over the aligned steps / the longest rank's elapsed time, summed over windows",
    )


def _peak(values: Sequence[int | None]) -> int | None:
    known = [v for v in values if v is not None]
    return max(known) if known else None


def rank_results(windows: Sequence[WindowSummary]) -> list[RankResult]:
    """Each rank's step times pooled over ``windows``, with its wait shares and memory peaks."""
    from perfgate.benchmarking.comparing.stats import step_stats

    ranks = sorted({r.rank for w in windows for r in w.ranks})
    out: list[RankResult] = []
    for rank in ranks:
        rows = [r for w in windows for r in w.ranks if r.rank == rank]
        stats = step_stats([v for r in rows for v in r.step_ms])
        elapsed_ms = sum(r.elapsed_ms for r in rows)
        out.append(
            RankResult(
                rank=rank,
                median_step_ms=stats.median_ms,
                p95_step_ms=stats.p95_ms,
                iqr_ratio=stats.iqr_ratio,
                steps_measured=sum(r.steps_measured for r in rows),
                elapsed_s=elapsed_ms / 1e3,
                data_wait_fraction=sum(r.data_wait_ms for r in rows) / elapsed_ms if elapsed_ms else 0.0,
                collective_wait_fraction=sum(r.collective_wait_ms for r in rows) / elapsed_ms
                if elapsed_ms
                else 0.0,
                peak_allocated_bytes=_peak([r.peak_allocated_bytes for r in rows]),
                peak_reserved_bytes=_peak([r.peak_reserved_bytes for r in rows]),
                host_peak_rss_bytes=_peak([r.host_peak_rss_bytes for r in rows]),
                step_time_source=rows[0].step_time_source,
            )
        )
    return out


def attach_nodes(rows: Sequence[RankResult], records: Sequence[RankRecord]) -> None:
    """Each rank's host and node facts (from the first launch's ``records``) on its result row."""
    by_rank = {r.rank: r for r in records}
    for row in rows:
        rec = by_rank.get(row.rank)
        if rec is None:
            continue
        row.hostname = rec.hostname or None
        if rec.node is not None:
            facts = {k: v for k, v in rec.node.items() if k in NodeFacts.model_fields and v is not None}
            if rec.device is not None:
                facts["device"] = f"{rec.device.kind} {rec.device.name or ''}".strip()
            row.node = NodeFacts.model_validate(facts)


def model_facts(record: RankRecord | None) -> ModelFacts | None:
    """The top-level training module a record's forward hook found, when it found one."""
    if record is None or record.model is None:
        return None
    m = record.model
    return ModelFacts(
        name=m.name,
        parameters=m.parameters,
        trainable_parameters=m.trainable_parameters,
        structure=m.structure,
    )
