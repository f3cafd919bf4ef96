"""analyze_trace: read existing Kineto traces (one per rank) and name where step time goes.

Read-only: it runs nothing, so a ``--read-only`` server serves it. The gated capture lives in
`profile_segment`, which returns the same analysis for the traces it records.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, Field

from perfgate.evidence import EvidenceState
from perfgate.tools._runtime import ToolRuntime
from perfgate.tools._spec import ToolSpec
from perfgate.tools._traces import (
    TraceAnalysisFields,
    TraceFile,
    analyze_paths,
    key_plot,
    resolve_traces,
    trace_brief,
    trace_files,
)
from perfgate.traces import Finding, RankProfile, RankSkew

__all__ = ["SPEC", "AnalyzeTraceInput", "AnalyzeTraceOutput", "run"]


class AnalyzeTraceInput(TraceAnalysisFields):
    trace_paths: Annotated[
        list[str],
        Field(
            min_length=1,
            description="Trace files (.json / .json.gz) or folders of per-rank traces, relative to the "
            "workspace (e.g. ['profiles/'] or the trace_artifacts of a profile_segment run).",
        ),
    ]
    environment_id: Annotated[
        str | None, Field(description="collect_env evidence id of the environment the traces came from.")
    ] = None


class AnalyzeTraceOutput(BaseModel):
    evidence_id: str
    state: EvidenceState
    time_basis: Literal["exact", "hta_rounded"]
    ranks: list[RankProfile] = Field(description="One entry per trace file, sorted by rank.")
    rank_skew: RankSkew | None = Field(description="Cross-rank comparison; null for a single rank.")
    findings: list[Finding] = Field(
        description="The walls, ranked: figures, events, time at stake per step (an upper bound), the first "
        "candidate and its guard, confidence."
    )
    trace_files: list[TraceFile]
    warnings: list[str]


async def run(inp: AnalyzeTraceInput, rt: ToolRuntime) -> AnalyzeTraceOutput:
    from perfgate.traces import combine

    paths = resolve_traces(inp.trace_paths, rt)
    profiles = await analyze_paths(paths, inp, rt)
    report = combine(profiles)
    ev = rt.evidence()
    out = AnalyzeTraceOutput(
        evidence_id=ev.id,
        state=EvidenceState.EXECUTED,
        time_basis="hta_rounded" if inp.hta_compatible else "exact",
        ranks=report.ranks,
        rank_skew=report.rank_skew,
        findings=report.findings,
        trace_files=trace_files(paths, profiles, rt),
        warnings=report.warnings,
    )
    await key_plot(ev, report.ranks, rt)
    return await rt.commit(ev, out, environment_id=inp.environment_id)


SPEC = ToolSpec(
    name="analyze_trace",
    title="Analyze PyTorch profiler traces",
    description=(
        "Read existing PyTorch profiler (Kineto) traces — .json/.json.gz files or a folder of per-rank "
        "traces; CUDA, ROCm, MUSA, MTIA, XPU or CPU-only — and report where step time goes, per rank: "
        "host phases (data loading, forward, backward, optimizer, no-grad passes, collectives incl. gloo, "
        "syncs), device idle / compute / communication / memory time (HTA's definitions), kernel "
        "categories, top kernels and ops, launch and sync costs, per-step times and the slowest rank. "
        "Runs nothing (served by --read-only servers too); to capture a new trace use profile_segment."
    ),
    input_model=AnalyzeTraceInput,
    output_model=AnalyzeTraceOutput,
    run=run,
    read_only=True,
    destructive=False,
    idempotent=True,
    open_world=False,
    brief=lambda out: trace_brief(out.ranks, out.rank_skew, out.findings, [f.path for f in out.trace_files]),
)
