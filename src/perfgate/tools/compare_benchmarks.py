"""compare_benchmarks: A/B over benchmark evidence, refusing apples-to-oranges and calling noise noise.

The bootstrap (numpy) and the series reader (msgspec) are imported where they are used, to keep server
start-up fast.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, Literal

import anyio.to_thread
from pydantic import BaseModel, ConfigDict, Field

from perfgate.benchmarking import BenchmarkError, Contract, diff_contracts
from perfgate.benchmarking.contract import same_contract
from perfgate.benchmarking.verdict import DEFAULT_MIN_EFFECT
from perfgate.errors import ToolError
from perfgate.evidence import EvidenceRecord, EvidenceState, sha256_file
from perfgate.evidence.access import as_dict
from perfgate.report.plots import ab_distribution_png
from perfgate.tools._runtime import ToolRuntime
from perfgate.tools._spec import ToolSpec

if TYPE_CHECKING:
    from perfgate.benchmarking.compare import WindowSample

__all__ = ["SPEC", "CompareBenchmarksInput", "CompareBenchmarksOutput", "run"]

BENCHMARK_TOOL = "run_benchmark_window"
IMPORT_TOOL = "import_benchmark"
_WINDOW_TOOLS = (BENCHMARK_TOOL, IMPORT_TOOL)
_USABLE = {EvidenceState.EXECUTED, EvidenceState.PASSED}
_OBSERVED_EXECUTION = ("world_size",)
_OBSERVED_INVARIANTS = ("device_kind", "device_name")
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
            "['microbatch', 'accumulation']). Every actual change must be declared and every declared one must "
            "have happened."
        ),
    ] = Field(default_factory=list[str])
    min_effect: Annotated[
        float,
        Field(
            ge=0, le=0.5, description="Smallest relative change reported as improved/regressed (fraction)."
        ),
    ] = DEFAULT_MIN_EFFECT


class CompareBenchmarksOutput(BaseModel):
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
    actual_changes: list[str] = Field(description="Execution settings whose values differ between the sides.")
    declared_changes: list[str]
    warnings: list[str]
    method: str


def _contract(record: EvidenceRecord) -> Contract:
    """The declared contract: imported evidence stores the one it was read with (files carry their own)."""
    if record.tool == IMPORT_TOOL:
        return Contract.from_mapping(as_dict(record.result.get("contract")))
    return Contract.from_mapping(as_dict(record.inputs.get("contract")))


def _measured_by(record: EvidenceRecord) -> str:
    """How the step times were taken: launched by perfgate, or imported in a given format."""
    if record.tool == IMPORT_TOOL:
        return f"imported ({record.result.get('format')})"
    return "launched by perfgate"


def _observed(record: EvidenceRecord) -> dict[str, object]:
    fp = as_dict(record.result.get("environment_fingerprint"))
    out: dict[str, object] = {k: fp.get(k) for k in _OBSERVED_INVARIANTS}
    out["world_size"] = record.result.get("world_size")
    return out


def _side_reasons(side: str, records: list[EvidenceRecord]) -> list[str]:
    reasons: list[str] = []
    for r in records:
        if r.profiled:
            reasons.append(
                f"{side} evidence {r.id} is profiled: profiler overhead makes it useless for throughput"
            )
        elif r.state not in _USABLE:
            why = r.result.get("failure_reason")
            reasons.append(f"{side} evidence {r.id} is {r.state.value}" + (f" ({why})" if why else ""))
    contracts = [_contract(r) for r in records]
    reasons += [f"{side}: {p}" for p in same_contract(contracts)]
    if not any(c.invariants for c in contracts):
        reasons.append(
            f"{side} declares no contract invariants: re-run with contract.invariants (model, data, precision, "
            "shapes, global_batch, ...) so the comparison can show the workload stayed the same"
        )
    observed = {str(sorted(_observed(r).items())) for r in records}
    if len(observed) > 1:
        reasons.append(f"{side} windows ran on different devices or world sizes")
    return reasons


async def _load(rt: ToolRuntime, ids: list[str]) -> list[EvidenceRecord]:
    records: list[EvidenceRecord] = []
    for evidence_id in ids:
        record = await rt.load(evidence_id)
        if record.tool not in _WINDOW_TOOLS and not record.profiled:
            raise ToolError(
                f"evidence {evidence_id} comes from {record.tool}, not {BENCHMARK_TOOL} or {IMPORT_TOOL}: pass "
                "benchmark window ids"
            )
        records.append(record)
    return records


def _samples(rt: ToolRuntime, record: EvidenceRecord) -> list[WindowSample]:
    from perfgate.benchmarking.series import SERIES_NAME, samples_from_series

    artifact = next((a for a in record.artifacts if a.name == SERIES_NAME), None)
    if artifact is None:
        raise ToolError(f"evidence {record.id} has no {SERIES_NAME} artifact: re-run run_benchmark_window")
    path = rt.workspace / artifact.path
    if not path.is_file() or sha256_file(path) != artifact.sha256:
        raise ToolError(
            f"artifact {artifact.path} of {record.id} is missing or was modified after it was recorded "
            "(`perfgate ledger verify`): re-measure the window"
        )
    try:
        return samples_from_series(path.read_bytes(), artifact.path, launch_prefix=f"{record.id}:")
    except BenchmarkError as exc:
        raise ToolError(str(exc)) from exc


async def run(inp: CompareBenchmarksInput, rt: ToolRuntime) -> CompareBenchmarksOutput:
    from perfgate.benchmarking.compare import compare_windows

    overlap = sorted(set(inp.baseline) & set(inp.candidate))
    if overlap:
        raise ToolError(f"evidence {overlap} is on both sides: a window cannot be its own baseline")
    base = await _load(rt, inp.baseline)
    cand = await _load(rt, inp.candidate)
    reasons = _side_reasons("baseline", base) + _side_reasons("candidate", cand)
    diff = diff_contracts(_contract(base[0]), _contract(cand[0]), inp.declared_changes)
    reasons += diff.reasons()
    sources = {_measured_by(r) for r in base + cand}
    if len(sources) > 1:
        reasons.append(
            f"the windows were measured in different ways ({', '.join(sorted(sources))}): a trainer's own log "
            "timer and perfgate's window are not the same measurement; import both sides or launch both"
        )
    imported = [r.id for r in base + cand if r.tool == IMPORT_TOOL]
    b_obs, c_obs = _observed(base[0]), _observed(cand[0])
    for key in _OBSERVED_INVARIANTS:
        if b_obs.get(key) != c_obs.get(key):
            reasons.append(f"measured {key} differs: {b_obs.get(key)!r} vs {c_obs.get(key)!r}")
    actual = list(diff.actual_changes)
    for key in _OBSERVED_EXECUTION:
        declared_in_contract = key in _contract(base[0]).execution or key in _contract(cand[0]).execution
        if b_obs.get(key) != c_obs.get(key) and not declared_in_contract:
            actual.append(key)
            if key not in inp.declared_changes:
                reasons.append(
                    f"measured {key} changed ({b_obs.get(key)} -> {c_obs.get(key)}) but was not declared"
                )
    ev = rt.evidence()
    common: dict[str, Any] = {
        "evidence_id": ev.id,
        "confidence": 0.95,
        "actual_changes": sorted(set(actual)),
        "declared_changes": sorted(set(inp.declared_changes)),
        "method": "speedup = candidate / baseline throughput, each pooled as total work / total time over its "
        "windows; 95% interval = the union of a Welch t interval on per-launch log throughputs and a two-level "
        "bootstrap (launches, then steps; 2000 resamples, seed 0), widened to contain the speedup; "
        f"improved/regressed when the interval excludes 1 and the effect is at least {inp.min_effect:g}, and "
        "only with at least 2 launches per side",
    }
    if reasons:
        out = CompareBenchmarksOutput(
            **common,
            state=EvidenceState.FAILED,
            status="incomparable",
            verdict="incomparable",
            reasons=reasons,
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
            warnings=[],
        )
        return await rt.commit(ev, out)
    base_windows = [w for r in base for w in _samples(rt, r)]
    cand_windows = [w for r in cand for w in _samples(rt, r)]
    try:
        result = await anyio.to_thread.run_sync(
            lambda: compare_windows(base_windows, cand_windows, min_effect=inp.min_effect)
        )
    except BenchmarkError as exc:
        raise ToolError(str(exc)) from exc
    decisive = result.verdict in ("improved", "regressed")
    out = CompareBenchmarksOutput(
        **common,
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
        warnings=result.warnings
        + (
            [
                f"evidence {', '.join(imported)} is imported, not launched by perfgate: the step times are what "
                "the trainer logged, bound to no environment unless one was attached"
            ]
            if imported
            else []
        ),
    )
    base_ms = [t * 1e3 for w in base_windows for t in w.step_s]
    cand_ms = [t * 1e3 for w in cand_windows for t in w.step_s]
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
        "Compare baseline and candidate run_benchmark_window (or import_benchmark) evidence: speedup of "
        "pooled throughput with a 95% interval over launches and steps, and a verdict (improved / regressed "
        "/ within_noise; insufficient_launches with fewer than 2 separate launches a side). Refuses "
        "(incomparable, "
        "with reasons) when contract invariants differ, when the changed execution settings differ from "
        "declared_changes (undeclared or declared-but-absent), or when any window is profiled or failed. "
        "Warns under 3 launches per side. Its evidence is what record_decision needs for a 'keep'."
    ),
    input_model=CompareBenchmarksInput,
    output_model=CompareBenchmarksOutput,
    run=run,
    read_only=True,
    destructive=False,
    idempotent=True,
    open_world=False,
)
