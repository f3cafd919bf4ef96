"""analyze_trace: read existing Kineto traces (one per rank) and name where step time goes.

Read-only: it runs nothing, so a ``--read-only`` server serves it. The gated capture lives in
`profile_segment`, which returns the same analysis for the traces it records.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, Field, ValidationError, model_validator

from perfgate.errors import ToolError
from perfgate.evidence import EvidenceState
from perfgate.evidence.access import as_list
from perfgate.serving.runtime import ToolRuntime
from perfgate.serving.spec import ToolSpec
from perfgate.tools.trace_analysis import (
    TraceAnalysisFields,
    TraceFile,
    analyze_paths,
    import_counters,
    key_plot,
    resolve_traces,
    trace_brief,
    trace_files,
    with_counters,
)
from perfgate.traces import Finding, RankProfile, RankSkew
from perfgate.traces.models import ProfileDiff
from perfgate.traces.reading.counters import KernelCounterTable

__all__ = ["SPEC", "AnalyzeTraceInput", "AnalyzeTraceOutput", "run"]


class AnalyzeTraceInput(TraceAnalysisFields):
    trace_paths: Annotated[
        list[str],
        Field(
            min_length=1,
            description="Trace files (.json / .json.gz) or folders of per-rank traces, relative to the "
            "workspace (e.g. ['profiles/'] or the trace_artifacts of a profile_segment run). Also kernel "
            "counter exports of ncu / mcu (.csv: `--csv --page details` or `--page raw`): per kernel, memory- / "
            "compute- / latency-bound and its occupancy limiter, joined to the traces' kernels.",
        ),
    ]
    baseline_paths: Annotated[
        list[str],
        Field(
            description="Diff against these baseline traces (files or folders, like trace_paths): what got "
            "faster or slower per step, by host phase, device time, category, kernel and op; new and vanished "
            "kernels and ops; launches and syncs per step."
        ),
    ] = Field(default_factory=list[str])
    baseline_evidence_id: Annotated[
        str | None,
        Field(
            description="Diff against an earlier analyze_trace or profile_segment result (its evidence_id)."
        ),
    ] = None
    environment_id: Annotated[
        str | None, Field(description="collect_env evidence id of the environment the traces came from.")
    ] = None

    @model_validator(mode="after")
    def _one_baseline(self) -> AnalyzeTraceInput:
        if self.baseline_paths and self.baseline_evidence_id:
            raise ValueError("pass baseline_paths or baseline_evidence_id, not both")
        return self


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
    diff: ProfileDiff | None = Field(
        default=None, description="Candidate (trace_paths) minus baseline, per step; null without a baseline."
    )
    baseline: str | None = Field(default=None, description="What the diff compares against.")
    trace_files: list[TraceFile]
    kernel_counters: list[KernelCounterTable] = Field(
        default_factory=list[KernelCounterTable],
        description="The ncu/mcu exports among trace_paths, read: per-kernel verdicts, ranked by trace time.",
    )
    warnings: list[str]


_DIFF_TOP_K = 30
_TRACE_TOOLS = ("analyze_trace", "profile_segment")


async def _baseline(
    inp: AnalyzeTraceInput, rt: ToolRuntime
) -> tuple[list[RankProfile], list[Finding], str] | None:
    if inp.baseline_paths:
        paths = resolve_traces(inp.baseline_paths, rt)
        profiles = await analyze_paths(paths, _with_top_k(inp), rt)
        from perfgate.traces import combine

        report = combine(profiles)
        return report.ranks, report.findings, "traces " + ", ".join(rt.relative(p) for p in paths)
    if inp.baseline_evidence_id:
        record = await rt.load(inp.baseline_evidence_id)
        if record.tool not in _TRACE_TOOLS or not record.result.get("ranks"):
            raise ToolError(
                f"evidence {inp.baseline_evidence_id} comes from {record.tool} and holds no trace analysis: pass "
                "the evidence_id of an analyze_trace or profile_segment result that analyzed traces"
            )
        try:
            ranks = [RankProfile.model_validate(r) for r in as_list(record.result.get("ranks"))]
            findings = [Finding.model_validate(f) for f in as_list(record.result.get("findings"))]
        except ValidationError as exc:
            raise ToolError(
                f"evidence {inp.baseline_evidence_id} was recorded by an older perfgate and cannot be diffed: "
                "pass its traces as baseline_paths instead"
            ) from exc
        return ranks, findings, f"evidence {inp.baseline_evidence_id} ({record.tool})"
    return None


def _split(raw_paths: list[str]) -> tuple[list[str], list[str]]:
    """Trace paths, and the kernel counter exports (.csv) among them."""
    csvs = [p for p in raw_paths if p.lower().endswith(".csv")]
    return [p for p in raw_paths if p not in csvs], csvs


def _brief(out: AnalyzeTraceOutput) -> list[str]:
    lines = [f"diff vs {out.baseline}: " + " | ".join(out.diff.summary)] if out.diff else []
    trace = trace_brief(out.ranks, out.rank_skew, out.findings, out.evidence_id)
    return lines + with_counters(trace, bool(out.ranks), out.kernel_counters)


def _with_top_k(inp: AnalyzeTraceInput) -> AnalyzeTraceInput:
    """A diff compares top lists: both sides keep at least _DIFF_TOP_K kernels and ops."""
    if not (inp.baseline_paths or inp.baseline_evidence_id) or inp.top_k >= _DIFF_TOP_K:
        return inp
    return inp.model_copy(update={"top_k": _DIFF_TOP_K})


async def run(inp: AnalyzeTraceInput, rt: ToolRuntime) -> AnalyzeTraceOutput:
    from perfgate.traces import combine

    traces, counters = _split(inp.trace_paths)
    paths = resolve_traces(traces, rt) if traces else []
    base = await _baseline(inp, rt)
    profiles = await analyze_paths(paths, _with_top_k(inp), rt)
    report = combine(profiles)
    tables = import_counters(counters, report.ranks, rt)
    diff = None
    if base is not None:
        from perfgate.traces.diagnosis.diff import diff_profiles

        diff = diff_profiles(base[0], report.ranks, base[1], report.findings)
    ev = rt.evidence()
    out = AnalyzeTraceOutput(
        evidence_id=ev.id,
        state=EvidenceState.EXECUTED,
        time_basis="hta_rounded" if inp.hta_compatible else "exact",
        ranks=report.ranks,
        rank_skew=report.rank_skew,
        findings=report.findings,
        diff=diff,
        baseline=base[2] if base is not None else None,
        trace_files=trace_files(paths, profiles, rt),
        kernel_counters=tables,
        warnings=report.warnings,
    )
    await key_plot(ev, report.ranks, rt)
    return await rt.commit(ev, out, environment_id=inp.environment_id)


SPEC = ToolSpec(
    name="analyze_trace",
    title="Analyze PyTorch profiler traces",
    description=(
        "Read existing PyTorch profiler traces (files or per-rank folders): where step time goes, findings "
        "naming the module and file:line, a diff against a baseline profile. Runs nothing."
    ),
    details=(
        "Read existing PyTorch profiler (Kineto) traces — .json/.json.gz files or a folder of per-rank "
        "traces; CUDA, ROCm, MUSA, MTIA, XPU or CPU-only — and report where step time goes, per rank: "
        "host phases (data loading, forward, backward, optimizer, no-grad passes, collectives incl. gloo, "
        "syncs), device idle / compute / communication / memory time (HTA's definitions), kernel "
        "categories, top kernels and ops, launch and sync costs, idle-time causes, frequent kernel sequences, "
        "per-step times and the slowest rank; ranked findings name the wall with the time at stake, the first "
        "change to try and its guard. Kernel counter exports of ncu / mcu (.csv) among trace_paths add a verdict "
        "per kernel (memory-, compute- or latency-bound from SpeedOfLight, occupancy limited by registers, "
        "shared memory, warps or block slots), joined to the traces' kernel names. With baseline_paths or baseline_evidence_id it also diffs the two "
        "profiles per step (did the change do what you think it did?). "
        "Runs nothing (served by --read-only servers too); to capture a new trace use profile_segment."
    ),
    input_model=AnalyzeTraceInput,
    output_model=AnalyzeTraceOutput,
    run=run,
    read_only=True,
    destructive=False,
    idempotent=True,
    open_world=False,
    brief=_brief,
)
