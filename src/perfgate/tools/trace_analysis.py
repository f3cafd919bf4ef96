"""Trace analysis shared by `analyze_trace` (read-only) and `profile_segment` (the gated capture); not a
tool of its own.

Both tools take the same analysis knobs (`TraceAnalysisFields`), resolve trace paths inside the
workspace the same way, and draw the same key plot, so a captured segment and an analyzed trace answer
alike. The trace modules (numpy, msgspec) are imported where they are used, to keep start-up fast.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import anyio.from_thread
import anyio.to_thread
from pydantic import BaseModel, ConfigDict, Field

from perfgate.errors import ToolError
from perfgate.helpers.deadline import DeadlineExceeded
from perfgate.report.plots import breakdown_png, top_ops_png
from perfgate.serving.runtime import EvidenceBuilder, ToolRuntime
from perfgate.traces import RankProfile, RankSkew, TraceError
from perfgate.traces.models import Finding

if TYPE_CHECKING:
    from perfgate.traces import AnalysisOptions
    from perfgate.traces.reading.counters import KernelCounterTable

__all__ = [
    "TraceAnalysisFields",
    "TraceFile",
    "analysis_options",
    "analyze_paths",
    "counter_brief",
    "import_counters",
    "key_plot",
    "resolve_traces",
    "trace_brief",
    "trace_files",
    "with_counters",
]


class TraceAnalysisFields(BaseModel):
    """The analysis knobs both trace tools accept."""

    model_config = ConfigDict(extra="forbid")

    top_k: Annotated[int, Field(ge=1, le=100, description="Entries in top_kernels and top_ops per rank.")] = (
        10
    )
    hta_compatible: Annotated[
        bool,
        Field(
            description="Round every event to whole microseconds as HTA 0.5 does (to cross-check against it); "
            "the default keeps the traces' exact times."
        ),
    ] = False
    include_last_step: Annotated[
        bool,
        Field(
            description="Keep the last ProfilerStep in the analysis window (by default it is left out, as in "
            "HTA: it is often cut short)."
        ),
    ] = False
    short_kernel_us: Annotated[
        float, Field(gt=0, description="Kernels shorter than this count as short (launch-dominated), us.")
    ] = 10.0


class TraceFile(BaseModel):
    path: str = Field(description="Relative to the workspace when inside it.")
    bytes: int = Field(description="File size on disk.")
    rank: int


def analysis_options(inp: TraceAnalysisFields, max_events: tuple[int, str] | None = None) -> AnalysisOptions:
    from perfgate.traces import AnalysisOptions

    options = AnalysisOptions(
        top_k=inp.top_k,
        time_basis="hta_rounded" if inp.hta_compatible else "exact",
        include_last_step=inp.include_last_step,
        short_kernel_us=inp.short_kernel_us,
    )
    if max_events is None:
        return options
    return dataclasses.replace(options, max_events=max_events[0], events_how=max_events[1])


def resolve_traces(raw_paths: list[str], rt: ToolRuntime) -> list[Path]:
    """Trace files named by the agent (files or folders of per-rank traces), confined to the workspace.

    Raises:
        ToolError: a path outside the workspace, missing, or a folder without traces.
    """
    from perfgate.traces import discover_trace_files

    roots = [rt.resolve_path(p, kind="any") for p in raw_paths]
    try:
        files = discover_trace_files(roots)
    except TraceError as exc:
        raise ToolError(f"{exc}; pass trace files or folders holding them") from exc
    # A folder may hold links that point elsewhere: confine every file, not only the folder.
    return [rt.resolve_path(str(f), kind="file") for f in files]


async def analyze_paths(paths: list[Path], inp: TraceAnalysisFields, rt: ToolRuntime) -> list[RankProfile]:
    """One `RankProfile` per file, paths shown relative to the workspace.

    The reading runs off the event loop, several ranks' files in parallel (a thread
    and worker processes, `perfgate.traces.pool`), under the server's parsing deadline (one for all the files of the call);
    it stops at its next block when the call is cancelled.

    Raises:
        ToolError: a trace that cannot be read or parsed (the file is named), or the deadline passed.
    """
    from perfgate.traces.pool import Deadline, analyze_many, worker_count

    limits = rt.config.limits
    options = analysis_options(inp, limits.trace_events(worker_count(paths)))
    limit = Deadline(limits.deadline_s, time.monotonic() + limits.deadline_s)

    def progress(done: int, total: int, message: str) -> None:
        anyio.from_thread.run(rt.progress, done, total, message)

    try:
        profiles = await anyio.to_thread.run_sync(
            lambda: analyze_many(
                paths,
                options,
                progress,
                limit=limit,
                labels=[f"reading trace {rt.relative(p)}" for p in paths],
                cancellable=True,  # a cancelled call stops reading instead of running on unseen
            )
        )
    except (TraceError, DeadlineExceeded) as exc:
        raise ToolError(str(exc)) from exc
    except OSError as exc:
        name = rt.relative(Path(exc.filename)) if exc.filename else "a trace file"
        raise ToolError(f"cannot read {name}: {exc}") from exc
    await rt.progress(len(paths), len(paths), "analysis done")
    for p in profiles:
        p.path = rt.relative(Path(p.path))
    return profiles


def import_counters(
    raw_paths: list[str], profiles: list[RankProfile], rt: ToolRuntime
) -> list[KernelCounterTable]:
    """The ncu/mcu CSV exports named by the agent, read into per-kernel verdicts and joined to the kernels
    of the analyzed traces (each name's largest share of device time over the ranks' top kernels).

    Raises:
        ToolError: a path outside the workspace, or an export that cannot be read (the message says how to
            re-export it).
    """
    from perfgate.traces.reading.counters import import_counter_csv, join_trace_kernels

    shares: dict[str, float] = {}
    for prof in profiles:
        for k in prof.top_kernels:
            shares[k.name] = max(shares.get(k.name, 0.0), k.share)
    tables: list[KernelCounterTable] = []
    for raw in raw_paths:
        path = rt.resolve_path(raw, kind="file")
        try:
            table = import_counter_csv(path)
        except TraceError as exc:
            raise ToolError(str(exc)) from exc
        except OSError as exc:
            raise ToolError(f"cannot read {rt.relative(path)}: {exc}") from exc
        table.path = rt.relative(path)
        if shares:
            join_trace_kernels(table, shares)
            if not any(k.trace_kernels for k in table.kernels):
                table.warnings.append(
                    "no counter kernel matched a kernel of the traces' top lists: profile the same job, or "
                    "raise top_k to compare more of the trace's kernels"
                )
        tables.append(table)
    return tables


def counter_brief(tables: list[KernelCounterTable]) -> list[str]:
    """Lead lines of kernel counters: per export, the kernels that matter most with their verdicts."""
    lines: list[str] = []
    for t in tables:
        joined = any(k.trace_share is not None for k in t.kernels)
        head = f"kernel counters {t.path} ({t.tool}, {t.launches} launches, {len(t.kernels) + t.kernels_omitted} kernels"
        head += (
            ", ranked by trace time)"
            if joined
            else ", ranked by counter time; pass the traces too to rank by step time)"
        )
        lines.append(head)
        for k in t.kernels[:3]:
            share = f" [{k.trace_share:.0%} of device time]" if k.trace_share is not None else ""
            lines.append(f"- {k.kernel[:90]}{share}: {k.finding}")
    return lines


def with_counters(trace_lines: list[str], has_ranks: bool, tables: list[KernelCounterTable]) -> list[str]:
    """A trace brief with the kernel counters' lines after its first (walls) line; the counters alone when
    no trace was analyzed."""
    counters = counter_brief(tables)
    if not counters:
        return trace_lines
    if not has_ranks:
        return counters
    return trace_lines[:1] + counters + trace_lines[1:]


def trace_files(paths: list[Path], profiles: list[RankProfile], rt: ToolRuntime) -> list[TraceFile]:
    rank_of = {p.path: p.rank for p in profiles}
    return [
        TraceFile(path=rt.relative(p), bytes=p.stat().st_size, rank=rank_of.get(rt.relative(p), 0))
        for p in paths
    ]


async def key_plot(ev: EvidenceBuilder, profiles: list[RankProfile], rt: ToolRuntime) -> None:
    """The breakdown plot: device time per rank, or host self time by op for a CPU-only trace."""
    if any(r.span_us > 0 for r in profiles):
        ranks = [r.model_dump(mode="json") for r in profiles]
        await rt.plot(ev, "breakdown.png", lambda: breakdown_png(ranks), key=True)
    elif profiles and profiles[0].top_self_ops:
        # No device activity (a CPU-only run): show where host time went instead. The ops are chosen
        # and ordered by the time the bars draw (self time), not by inclusive time.
        ops = [(o.name, o.self_us) for o in profiles[0].top_self_ops]
        title = f"Host self time by CPU op, rank {profiles[0].rank} (no device activity)"
        await rt.plot(ev, "breakdown.png", lambda: top_ops_png(ops, title), key=True)


def _ms(us: float) -> str:
    return f"{us / 1e3:.2f} ms"


def trace_brief(
    ranks: list[RankProfile], skew: RankSkew | None, findings: list[Finding], evidence_id: str
) -> list[str]:
    """Lead lines of a trace analysis: the walls, the top findings with figures, per-rank step, next call."""
    lines: list[str] = []
    if not ranks:
        return ["no trace analyzed"]
    if findings:
        lines.append(
            "walls: "
            + "; ".join(
                f"{f.wall} {f.share_of_step:.0%} of step ({_ms(f.time_at_stake_us)}"
                + (f", rank {f.rank}" if f.rank is not None and len(ranks) > 1 else "")
                + f", {f.confidence})"
                for f in findings[:4]
            )
        )
        for i, f in enumerate(findings[:3], 1):
            lines.append(f"{i}. {f.summary}. Try: {f.candidate}. Guard: {f.guard}.")
    else:
        lines.append(
            "walls: none passed its threshold (see traces/diagnosis/diagnose.py); read host phases and categories"
        )
    steps: list[str] = []
    for r in ranks[:8]:
        step = r.host.step_us if r.host is not None else (r.steps.mean_us if r.steps else r.span_us)
        part = f"rank {r.rank} ({r.backend}) step {_ms(step)}"
        if r.span_us > 0 and r.idle_fraction is not None:
            part += f", device idle {r.idle_fraction:.0%}"
        idle = r.idle
        if idle is not None and idle.bound is not None and idle.steps_span_us > 0:
            part += (
                f", critical path {idle.bound}-bound (device {idle.device_bound_us / idle.steps_span_us:.0%}"
                f", host {idle.host_bound_us / idle.steps_span_us:.0%})"
            )
        steps.append(part)
    if len(ranks) > 8:
        steps.append(f"+{len(ranks) - 8} ranks")
    lines.append("; ".join(steps))
    load = ranks[0].host_load
    if load.measured:
        lines.append(
            f"host load during capture: other processes {load.other_cpus:g} of {load.cpus} CPUs, job "
            f"{load.job_cpus:g}" + (f" (most: {load.top_other[0].name})" if load.top_other else "")
        )
    else:
        lines.append("host load during capture: unknown (only profile_segment mode='run' measures it)")
    if skew is not None and skew.slowest_rank is not None:
        busiest = {m.rank: m for m in skew.per_rank_mean_step_us}
        slow = busiest.get(skew.slowest_rank)
        if slow is not None:
            lines.append(
                f"slowest rank {skew.slowest_rank}: busy {_ms(slow.busy_us)} per step "
                f"(spread {_ms(skew.busy_spread_us or 0.0)}; busy = step minus excess collective wait)"
            )
    # The host's contention is no change to the job: the next change is the first wall the job owns.
    contended = any(f.wall == "host_contention" for f in findings)
    top = next((f for f in findings if f.wall != "host_contention"), None)
    if top is not None:
        lines.append(
            (
                "next (the host was busy: op times are inflated; a quiet host gives truer figures): "
                if contended
                else "next: "
            )
            + f'record_decision(action="open", hypothesis="{top.wall}: ...") for one change, '
            "run_benchmark_window before and after; then analyze_trace(trace_paths=[<new traces>], "
            f'baseline_evidence_id="{evidence_id}") shows whether the wall moved'
        )
    elif contended:
        lines.append(
            "next: quiet the host (or pin the job and the other processes to disjoint CPUs) and profile again"
        )
    return lines
