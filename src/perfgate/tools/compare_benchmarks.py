"""compare_benchmarks: A/B over benchmark evidence, refusing apples-to-oranges and calling noise noise.

The A/B itself is `perfgate.benchmarking.comparing.ab` (comparability, differences, argv, sides behind it), imported
when called: the bootstrap (numpy) and the series reader (msgspec) stay out of server start-up.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Annotated, Any, Literal

import anyio.to_thread
from pydantic import BaseModel, ConfigDict, Field, field_validator

from perfgate.benchmarking import BenchmarkError
from perfgate.benchmarking.comparing.differences import Classification, DifferenceKind
from perfgate.benchmarking.comparing.screen import Screen
from perfgate.benchmarking.comparing.sides import BENCHMARK_TOOL, IMPORT_TOOL, WINDOW_TOOLS
from perfgate.benchmarking.comparing.verdict import DEFAULT_MIN_EFFECT
from perfgate.benchmarking.runs.job import JobComparison, JobTiming, compare_jobs
from perfgate.benchmarking.runs.training import caution
from perfgate.benchmarking.workload.vocabulary import vocabulary_name
from perfgate.errors import ToolError
from perfgate.evidence import EvidenceRecord, EvidenceState
from perfgate.report.plots import ab_distribution_png
from perfgate.serving.runtime import ToolRuntime
from perfgate.serving.spec import ToolSpec

__all__ = ["SPEC", "CompareBenchmarksInput", "CompareBenchmarksOutput", "run"]

Verdict = Literal["improved", "regressed", "within_noise", "insufficient_launches", "incomparable"]


class CompareBenchmarksInput(BaseModel):
    model_config = ConfigDict(extra="forbid")

    baseline: Annotated[
        list[str], Field(min_length=1, description="run_benchmark_window evidence ids of the baseline.")
    ]
    candidate: Annotated[
        list[str], Field(min_length=1, description="run_benchmark_window evidence ids of the candidate.")
    ]
    declared_changes: Annotated[
        list[str],
        Field(
            description="Names of the contract execution settings the candidate changed on purpose (e.g. "
            "['microbatch', 'accumulation']), and the measurement-protocol fields it changed as "
            "'protocol.<field>' (e.g. 'protocol.warmup_steps'). Every actual change must be declared and every "
            "declared one must have happened."
        ),
    ] = Field(default_factory=list[str])
    per_device: Annotated[
        bool,
        Field(
            description="Normalize throughput per device (work per device-second: step time x world size). "
            "Required when the world size or a parallel degree changed: a topology change is never an "
            "equivalent speedup of total throughput."
        ),
    ] = False
    min_effect: Annotated[
        float,
        Field(
            ge=0, le=0.5, description="Smallest relative change reported as improved/regressed (fraction)."
        ),
    ] = DEFAULT_MIN_EFFECT

    @field_validator("declared_changes")
    @classmethod
    def _canonical(cls, declared: list[str]) -> list[str]:
        """Each name under its vocabulary entry ('micro_batch_size' is 'microbatch'), as recorded and gated;
        an environment variable ('env:NAME') keeps its own spelling."""
        return [f"env:{d[4:]}" if d.lower().startswith("env:") else vocabulary_name(d) for d in declared]


class Difference(BaseModel):
    field: str = Field(
        description="What differs, e.g. 'contract.execution.workers', 'env.OMP_NUM_THREADS', "
        "'argv', 'code', 'file:train.py', 'measured.torch_version', 'protocol.warmup_steps'."
    )
    kind: DifferenceKind
    baseline: Any
    candidate: Any
    classification: Classification = Field(
        description="declared_execution: covered by declared_changes and allowed; declared_semantic: a "
        "declared change of what is learned (comparable, but only a training_change can be kept on it); "
        "declared_protocol: a measurement-boundary field (warm-up, measured steps, timing, ...) declared as "
        "'protocol.<field>'; undeclared or semantic: the comparison is incomparable."
    )
    note: str


class DriftReport(BaseModel):
    design: Literal["interleaved", "blocks", "unknown"] = Field(
        description="interleaved: the sides' launches alternate in time, so the host's drift hits both; blocks: "
        "each side ran in its own block (separate calls), so the drift between them is measured and folded into "
        "the interval; unknown: launch times not recorded."
    )
    order: str = Field(description="Launches by start time, A baseline and B candidate (e.g. 'AABBBBAA').")
    drift_factor: float = Field(
        description="The measured drift folded into the interval (x/÷ this); 1.0: none. An effect no larger is "
        "within_noise."
    )
    sources: list[str] = Field(
        description="What was measured (trend, A/A across calls, host load), each sized."
    )
    unmeasured: list[str] = Field(description="What could not be measured.")
    summary: str


class RankTest(BaseModel):
    """Mann-Whitney over launch throughputs, with the Hodges-Lehmann speedup and its distribution-free
    interval (`perfgate.benchmarking.comparing.robust`)."""

    speedup: float = Field(description="Median of candidate/baseline over every pair of launches.")
    ci_low: float | None = Field(
        description="None: too few launches for any interval at 95% (3 a side or fewer)."
    )
    ci_high: float | None
    candidate_ahead: float = Field(description="Launch pairs in which the candidate was faster (ties half).")
    pairs: int
    p_value: float = Field(description="One-sided, in the direction of the pooled speedup.")
    decided: bool = Field(description="The verdict is this test's (the pooled interval crossed 1).")


class CompareBenchmarksOutput(BaseModel):
    caution: str | None = Field(
        default=None,
        description="Leads the answer when the candidate may train differently (model size, data, loss): the "
        "speedup is then not an equivalent one until correctness evidence shows it.",
    )
    evidence_id: str
    state: EvidenceState = Field(
        description="passed: comparable and decisive (improved/regressed); executed: comparable, within "
        "noise or fewer than 2 launches on a side (insufficient_launches); failed: incomparable."
    )
    status: Literal["comparable", "incomparable"]
    verdict: Verdict
    reasons: list[str] = Field(description="Why the sides are incomparable (empty when comparable).")
    speedup: float | None = Field(description="Candidate / baseline pooled throughput (>1 is faster).")
    ci_low: float | None = Field(
        description="Lower end of the 95% interval of the speedup (launch-to-launch and step variation); "
        "the interval always contains the speedup."
    )
    ci_high: float | None
    confidence: float
    unit: Literal["samples", "tokens", "steps"] | None = Field(description="Work unit of the throughput.")
    baseline_throughput: float | None = Field(description="Units per second, total work / total time.")
    candidate_throughput: float | None
    baseline_windows: int
    candidate_windows: int
    baseline_launches: int = Field(description="Separate launches (processes) behind the baseline windows.")
    candidate_launches: int
    median_step_speedup: float | None = Field(
        description="Speedup from each side's median step (stalls ignored); compare with speedup."
    )
    differences: list[Difference] = Field(
        description="Every difference between the first baseline and candidate windows (argv, env, code, "
        "files the argv names, measured environment, contract, measurement protocol), each classified; any "
        "undeclared or semantic one makes the comparison incomparable."
    )
    unverified: list[str] = Field(
        description="What could not be compared because a side does not know it (never counted as 'same')."
    )
    actual_changes: list[str] = Field(description="Execution settings whose values differ between the sides.")
    declared_changes: list[str]
    warnings: list[str]
    method: str
    drift: DriftReport | None = Field(
        default=None,
        description="How the sides' launches lay in time and the host drift measured between them (comparable "
        "sides only).",
    )
    training_may_differ: list[str] = Field(
        default_factory=list[str],
        description="Ways the candidate's training may differ from the baseline's, from what the harness "
        "recorded: model size or structure, first training inputs, loss of the same steps.",
    )
    training_unchecked: list[str] = Field(
        default_factory=list[str],
        description="Which of model, data and loss could not be compared (never counted as the same).",
    )
    noise: list[str] = Field(
        default_factory=list[str],
        description="When the comparison could not tell: what made the runs noisy (launch spread, "
        "over-subscribed threads, neighbours, host speed), then 'next: ' and the calls that settle it.",
    )
    rank_test: RankTest | None = Field(
        default=None,
        description="The rank test over launches (two or more a side): it decides when a few wild launches "
        "swamp the pooled interval (decided=true).",
    )
    screen: Screen | None = Field(
        default=None,
        description="The candidate windows came from several candidates (they differ in argv less the output "
        "paths each run wrote, env, execution settings or code; `differs` says which): each was compared with the baseline, ranked, and the winner's validation is the "
        "next step. A screen is never a keep's comparison.",
    )
    job: JobComparison | None = Field(
        default=None,
        description="Both sides measured with job=true: the whole jobs (wall time, start-up, compile/warm-up, "
        "steps, evaluation, checkpoints) side by side; a job that got slower while its steps got faster leads "
        "the answer.",
    )


async def _load(rt: ToolRuntime, ids: list[str]) -> list[EvidenceRecord]:
    records: list[EvidenceRecord] = []
    for evidence_id in ids:
        record = await rt.load(evidence_id)
        if record.tool not in WINDOW_TOOLS and not record.profiled:
            raise ToolError(
                f"evidence {evidence_id} comes from {record.tool}, not {BENCHMARK_TOOL} or {IMPORT_TOOL}: pass "
                "benchmark window ids"
            )
        records.append(record)
    return records


def _add_screen(out: CompareBenchmarksOutput, screen: Screen | None) -> None:
    """A screen leads with its ranking and what to run next; its figures are the winner's, not a keep's."""
    if screen is None:
        return
    out.screen = screen
    if out.state == EvidenceState.PASSED:
        out.state = EvidenceState.EXECUTED
    out.caution = "; ".join(x for x in (screen.headline(), out.caution) if x)
    out.warnings.insert(0, screen.next)


def _job_launches(records: list[EvidenceRecord]) -> list[JobTiming]:
    """Every launch of a side measured as a whole job; empty unless all its windows were (job=true)."""
    out: list[JobTiming] = []
    for record in records:
        launches = record.result.get("job_launches")
        if not isinstance(launches, list) or not launches:
            return []
        out += [JobTiming.model_validate(j) for j in launches]  # pyright: ignore[reportUnknownVariableType]
    return out


async def run(inp: CompareBenchmarksInput, rt: ToolRuntime) -> CompareBenchmarksOutput:
    from perfgate.benchmarking.comparing.ab import EvidenceComparison, compare_evidence
    from perfgate.benchmarking.comparing.screen import candidate_groups, rank_screen
    from perfgate.traces.diagnosis.hostload import BUSY_NEIGHBOUR_SHARE

    overlap = sorted(set(inp.baseline) & set(inp.candidate))
    if overlap:
        raise ToolError(f"evidence {overlap} is on both sides: a window cannot be its own baseline")
    base = await _load(rt, inp.baseline)
    cand = await _load(rt, inp.candidate)
    ev = rt.evidence()
    groups = candidate_groups(cand)

    def against(side: list[EvidenceRecord]) -> EvidenceComparison:
        return compare_evidence(
            rt.workspace,
            base,
            side,
            inp.declared_changes,
            per_device=inp.per_device,
            min_effect=inp.min_effect,
            busy_share=BUSY_NEIGHBOUR_SHARE,
        )

    try:
        each = await anyio.to_thread.run_sync(lambda: [against(g) for g in groups])
    except BenchmarkError as exc:
        raise ToolError(str(exc)) from exc
    screen: Screen | None = None
    ab = each[0]
    if len(groups) > 1:
        # several candidates: each against the baseline, ranked; the answer's figures are the winner's (or the
        # best one's), and the record is never a keep's comparison
        screen, shown = rank_screen(groups, each, inp.baseline)
        ab, cand = each[shown], groups[shown]
    judged = ab.comparability
    common: dict[str, Any] = {
        "evidence_id": ev.id,
        "differences": [Difference(**dataclasses.asdict(d)) for d in judged.differences],
        "unverified": judged.unverified,
        "confidence": 0.95,
        "actual_changes": judged.actual_changes,
        "declared_changes": sorted(set(inp.declared_changes)),
        "method": "speedup = candidate / baseline throughput, each pooled as total work / total time over its "
        + ("windows, per device (step time x measured world size);" if inp.per_device else "windows;")
        + " 95% interval = the union of a Welch t interval on per-launch log throughputs and a two-level "
        "bootstrap (launches, then steps; 2000 resamples, seed 0), widened to contain the speedup; "
        f"improved/regressed when the interval excludes 1 and the effect is at least {inp.min_effect:g}, and "
        "only with at least 2 launches per side; when that interval crosses 1, a Mann-Whitney rank test over "
        "launch throughputs (distribution-free: a wild launch counts by rank, not size) decides if its "
        "Hodges-Lehmann interval, widened by any drift, excludes 1 and the pooled and median-step speedups "
        "agree",
    }
    result, training = ab.comparison, ab.training
    if result is None or training is None:
        out = CompareBenchmarksOutput(
            **common,
            state=EvidenceState.FAILED,
            status="incomparable",
            verdict="incomparable",
            reasons=judged.reasons,
            speedup=None,
            ci_low=None,
            ci_high=None,
            unit=None,
            baseline_throughput=None,
            candidate_throughput=None,
            baseline_windows=0,
            candidate_windows=0,
            baseline_launches=0,
            candidate_launches=0,
            median_step_speedup=None,
            warnings=ab.warnings,
        )
        _add_screen(out, screen)
        return await rt.commit(ev, out)
    decisive = result.verdict in ("improved", "regressed")
    drift = result.drift
    common["method"] += "; " + (
        "the sides' launches are interleaved in time, so host drift hits both"
        if drift is not None and drift.design == "interleaved"
        else "the sides were not interleaved: the drift measured between them (time trend, A/A across calls, "
        "host load) widens the interval, and an effect no larger than it is within_noise"
    )
    out = CompareBenchmarksOutput(
        **common,
        caution=caution(training.differs, result.verdict),
        drift=None
        if drift is None
        else DriftReport(
            design=drift.design,
            order=drift.order,
            drift_factor=drift.factor,
            sources=drift.sources,
            unmeasured=drift.unmeasured,
            summary=drift.describe(),
        ),
        training_may_differ=training.differs,
        training_unchecked=training.unchecked,
        state=EvidenceState.PASSED if decisive else EvidenceState.EXECUTED,
        status="comparable",
        verdict=result.verdict,
        reasons=[],
        speedup=result.speedup,
        ci_low=result.ci_low,
        ci_high=result.ci_high,
        unit=result.unit,
        baseline_throughput=result.baseline_throughput,
        candidate_throughput=result.candidate_throughput,
        baseline_windows=result.baseline_windows,
        candidate_windows=result.candidate_windows,
        baseline_launches=result.baseline_launches,
        candidate_launches=result.candidate_launches,
        median_step_speedup=result.median_step_speedup,
        warnings=ab.warnings + ab.noise[-1:],
        noise=ab.noise,
        rank_test=None
        if (rank := result.rank) is None
        else RankTest(
            speedup=rank.estimate,
            ci_low=rank.low if rank.low > 0 else None,
            ci_high=rank.high if math.isfinite(rank.high) else None,
            candidate_ahead=rank.u,
            pairs=rank.pairs,
            p_value=rank.p_faster if result.speedup >= 1 else rank.p_slower,
            decided=result.decided_by_rank,
        ),
    )
    out.job = compare_jobs(
        _job_launches(base),
        _job_launches(cand),
        result.speedup,
        result.median_step_speedup,
        inp.min_effect,
    )
    if out.job is not None:
        leads = [
            x
            for x in (out.job.headline_contradicted, out.job.summary if out.job.contradicts_steps else None)
            if x
        ]
        if leads:
            out.caution = "; ".join([*leads, *([out.caution] if out.caution else [])])
        out.warnings.insert(0, out.job.summary)
        if out.job.unlike_windows:
            out.warnings.insert(1, out.job.unlike_windows)
    _add_screen(out, screen)
    base_ms, cand_ms = ab.baseline_step_ms, ab.candidate_step_ms
    interval = (result.ci_low, result.ci_high)
    await rt.plot(
        ev,
        "ab_step_times.png",
        lambda: ab_distribution_png(base_ms, cand_ms, result.speedup, interval),
        key=True,
    )
    return await rt.commit(ev, out)


SPEC = ToolSpec(
    name="compare_benchmarks",
    title="Compare benchmark windows (A/B)",
    description=(
        "A/B of baseline and candidate windows: speedup with a 95% interval and a verdict; refuses undeclared "
        "differences. A keep needs it. Setting names: skill://perfgate/references/vocabulary.md"
    ),
    details=(
        "Compare baseline and candidate run_benchmark_window (or import_benchmark) evidence: speedup of "
        "pooled throughput with a 95% interval over launches and steps, and a verdict (improved / regressed "
        "/ within_noise; insufficient_launches with fewer than 2 separate launches a side). Refuses "
        "(incomparable, "
        "with reasons) when contract invariants differ, when the changed execution settings or measurement "
        "protocol (warm-up, measured steps, timing, samples per step, log pattern) differ from "
        "declared_changes (undeclared or declared-but-absent), or when any window is profiled or failed. "
        "Windows of one candidate pool, whatever calls and launches measured them; candidate windows that "
        "differ in what ran (argv less the output paths each run wrote, env, execution settings, code) are a "
        "screen, which names what differs. Warns under 3 launches per side. Its evidence is what record_decision needs for a 'keep'. Setting "
        "names: skill://perfgate/references/vocabulary.md."
    ),
    input_model=CompareBenchmarksInput,
    output_model=CompareBenchmarksOutput,
    run=run,
    read_only=True,
    destructive=False,
    idempotent=True,
    open_world=False,
)
