"""A profiled training segment: the harness configuration that captures it, and what its outcome earns (why
a capture failed, the warnings its report carries, the evidence state)."""

from __future__ import annotations

import gzip
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from perfgate.harness.config import HarnessConfig, ProfileConfig

if TYPE_CHECKING:
    from perfgate.benchmarking.reading.records import RankRecord
    from perfgate.traces.diagnosis.hostload import HostLoad
    from perfgate.traces.models import RankProfile

__all__ = [
    "TRACE_GLOB",
    "SegmentState",
    "annotate_profiles",
    "capture_failure",
    "keep_trace",
    "kept_name",
    "samples_per_step_by_rank",
    "segment_harness",
    "segment_reason",
    "segment_state",
    "segment_warnings",
]

SegmentState = Literal["failed", "executed", "scaffolded"]

TRACE_GLOB = "rank*.pt.trace.json*"
"""The traces the harness writes, one per rank, in the profile's trace folder."""


def segment_harness(run_dir: Path, profile: ProfileConfig) -> HarnessConfig:
    """The harness configuration of a profiled run writing under ``run_dir`` (records/, ``profile``'s
    trace folder). Timing windows are not the point: one measured step keeps the harness satisfied, and
    the schedule decides when the harness stops the script."""
    return HarnessConfig(
        record_dir=str(run_dir / "records"), warmup_steps=0, measure_steps=1, profile=profile
    )


def segment_reason(profile: ProfileConfig) -> str:
    """What the approval request says the run is for, when the caller gives no reason."""
    skipped = profile.total_steps - profile.active
    return (
        f"profile_segment: torch.profiler over {profile.active} step(s) after {skipped} skipped/warm-up step(s); "
        "the script is stopped once the trace is written"
    )


def samples_per_step_by_rank(records: Sequence[RankRecord]) -> dict[int, float]:
    """Each rank's samples per step, from the harness's DataLoader counter: the median over the steps that
    counted any (ranks that counted none are left out)."""
    samples: dict[int, float] = {}
    for record in records:
        counted = sorted(n for n in record.steps.samples if n)
        if counted:
            samples[record.rank] = float(counted[len(counted) // 2])
    return samples


def capture_failure(succeeded: bool, summary: str, traces: int) -> str | None:
    """Why a profiled run is no capture: the command failed (``summary`` says how), or it wrote no trace."""
    if not succeeded:
        return f"the training command failed: {summary}"
    if not traces:
        return (
            "the run wrote no trace: did the script run skip_first + wait + warmup + active optimizer "
            "steps? Lower the schedule or run more steps."
        )
    return None


def annotate_profiles(
    profiles: Sequence[RankProfile], host_load: HostLoad, samples: dict[int, float]
) -> None:
    """Give each rank's profile the host load seen during the run and its samples per step."""
    for p in profiles:
        p.host_load = host_load
        if p.code is not None:
            p.code.samples_per_step = samples.get(p.rank)


def kept_name(trace: Path) -> str:
    """The artifact name a captured trace is kept under: gzipped."""
    return trace.name if trace.name.endswith(".gz") else trace.name + ".gz"


def keep_trace(trace: Path, dst: Path) -> None:
    """Copy ``trace`` to ``dst`` gzipped (compressing it unless it already is)."""
    if trace.name.endswith(".gz"):
        shutil.copyfile(trace, dst)
        return
    with trace.open("rb") as fin, gzip.open(dst, "wb", compresslevel=3) as fout:
        shutil.copyfileobj(fin, fout, 1 << 20)


def segment_warnings(
    report_warnings: Sequence[str], profiles: Sequence[RankProfile], *, profiled: bool, with_flops: bool
) -> list[str]:
    """The report's warnings, then: a profiled run's step times are never throughput, and FLOPs asked for
    that no trace gave."""
    warnings = list(report_warnings)
    if profiled and profiles:
        warnings.append(
            "profiled run: step times include profiler overhead; use run_benchmark_window for throughput"
        )
    if with_flops and profiles and all(p.flops is None for p in profiles):
        warnings.append(f"with_flops=true but no FLOPs came back: {profiles[0].flops_unavailable}")
    return warnings


def segment_state(failure: str | None, analyzed: bool) -> SegmentState:
    """failed with a failure; executed when traces or summaries were analyzed; else scaffolded (only
    external captures prepared)."""
    if failure is not None:
        return "failed"
    return "executed" if analyzed else "scaffolded"
