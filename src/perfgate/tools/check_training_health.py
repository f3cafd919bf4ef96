"""check_training_health: a pass/fail training-health verdict over window evidence, against a baseline.

Finite values, skipped iterations, loss spikes and the loss scale are judged over the whole job the evidence
holds (``job_health``: every logged line, every step the harness recorded), the loss level and trend against
a baseline over the measured windows. The rules are `perfgate.benchmarking.runs.health`'s.

The record carries ``quality_kind: "training_health"`` so the keep gates can tell it from other
task-quality evidence: it is the evidence behind a short screen's loss health and a winner's
"at least N steps, finite, no unexplained skips" validation.
"""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal, cast

from pydantic import BaseModel, ConfigDict, Field, model_validator

from perfgate.benchmarking.runs.health import SPIKE_RULE, JobHealth, TrainingHealth, job_checks
from perfgate.errors import ToolError
from perfgate.evidence import EvidenceRecord, EvidenceState
from perfgate.serving.runtime import ToolRuntime
from perfgate.serving.spec import ToolSpec

__all__ = ["SPEC", "CheckTrainingHealthInput", "CheckTrainingHealthOutput", "run"]

_WINDOW_TOOLS = ("run_benchmark_window", "import_benchmark")
_OK = (EvidenceState.EXECUTED, EvidenceState.PASSED)


class CheckTrainingHealthInput(BaseModel):
    model_config = ConfigDict(extra="forbid")

    evidence_id: Annotated[
        str, Field(description="run_benchmark_window or import_benchmark evidence of the run to check.")
    ]
    baseline_id: Annotated[
        str | None,
        Field(description="Window evidence of the baseline over the same steps; needs loss_tolerance."),
    ] = None
    loss_tolerance: Annotated[
        float | None,
        Field(
            ge=0,
            le=1,
            allow_inf_nan=False,
            description="Declared relative tolerance: the candidate's final loss may exceed the baseline's by this "
            "fraction, and its loss trend may be this much flatter. Choose it for the task; there is no default.",
        ),
    ] = None
    min_steps: Annotated[
        int,
        Field(
            ge=0, description="Measured steps required (e.g. 50 to validate a winner over at least 50 steps)."
        ),
    ] = 0
    max_unexplained_skips: Annotated[
        int, Field(ge=0, description="Skipped iterations without a loss-scale drop that are tolerated.")
    ] = 0
    max_explained_skips: Annotated[
        int | None,
        Field(ge=0, description="AMP-overflow skips tolerated (loss scale dropped); null: any number."),
    ] = None
    max_loss_spikes: Annotated[
        int,
        Field(ge=0, description=f"Loss spikes tolerated over the whole job (a spike: {SPIKE_RULE})."),
    ] = 0

    @model_validator(mode="after")
    def _tolerance_with_baseline(self) -> CheckTrainingHealthInput:
        if (self.baseline_id is None) != (self.loss_tolerance is None):
            raise ValueError(
                "baseline_id and loss_tolerance go together: a baseline needs a declared tolerance"
            )
        return self


class HealthCheck(BaseModel):
    name: str
    passed: bool
    detail: str


class CheckTrainingHealthOutput(BaseModel):
    evidence_id: str
    state: EvidenceState = Field(description="passed when every check passed, else failed.")
    quality_kind: Literal["training_health"] = "training_health"
    checks: list[HealthCheck]
    failed_checks: list[str]
    steps_measured: int
    health: TrainingHealth | None = Field(description="Health over the measured windows.")
    job_health: JobHealth | None = Field(
        default=None,
        description="Health over every step the evidence holds, which the finite, skip, spike and loss-scale "
        "checks judge; null for evidence recorded before perfgate kept it (its windows are judged then).",
    )
    baseline_health: TrainingHealth | None
    loss_last_ratio: float | None = Field(description="Candidate final loss / baseline final loss.")
    metrics: dict[str, float] = Field(
        default_factory=dict[str, float],
        description="The task-quality metrics this check measured, by name (loss_last, loss_trend, "
        "loss_last_ratio with a baseline, and eval:<name> for each metric the launched run reported with "
        "perfgate.harness.report_metric): a training change's keep gate judges the metric declared at open "
        "against its declared direction and threshold.",
    )
    evidence: list[str] = Field(description="The window evidence this verdict is about.")
    warnings: list[str]


def _health(record: EvidenceRecord) -> TrainingHealth | None:
    raw = record.result.get("health")
    return TrainingHealth.model_validate(raw) if isinstance(raw, dict) else None


def _job_health(record: EvidenceRecord) -> JobHealth | None:
    raw = record.result.get("job_health")
    return JobHealth.model_validate(raw) if isinstance(raw, dict) else None


async def _window(rt: ToolRuntime, evidence_id: str, role: str) -> EvidenceRecord:
    record = await rt.load(evidence_id)
    if record.tool not in _WINDOW_TOOLS:
        raise ToolError(
            f"{role} {evidence_id} is a {record.tool} record; pass run_benchmark_window or import_benchmark ids"
        )
    return record


async def run(inp: CheckTrainingHealthInput, rt: ToolRuntime) -> CheckTrainingHealthOutput:
    cand = await _window(rt, inp.evidence_id, "evidence_id")
    base = await _window(rt, inp.baseline_id, "baseline_id") if inp.baseline_id else None
    checks: list[HealthCheck] = []
    warnings: list[str] = []

    def check(name: str, passed: bool, detail: str) -> None:
        checks.append(HealthCheck(name=name, passed=passed, detail=detail))

    check("run_executed", cand.state in _OK, f"the run's evidence is {cand.state.value}")
    h = _health(cand)
    steps_value = cand.result.get("steps_measured")
    steps = steps_value if isinstance(steps_value, int) else 0
    check("steps", steps >= inp.min_steps, f"{steps} measured step(s), {inp.min_steps} required")
    job = _job_health(cand)
    if h is None or h.losses_seen == 0:
        check(
            "losses_visible",
            False,
            "no loss was seen: the harness reads the scalar passed to backward(); a log needs a loss field",
        )
    else:
        check(
            "losses_visible", True, f"{h.losses_seen} loss value(s) over steps {h.first_step}..{h.last_step}"
        )
    if job is not None:
        for name, passed, detail in job_checks(
            job,
            max_unexplained_skips=inp.max_unexplained_skips,
            max_explained_skips=inp.max_explained_skips,
            max_loss_spikes=inp.max_loss_spikes,
        ):
            check(name, passed, detail)
        if job.unread_step_lines:
            warnings.append(
                f"{job.unread_step_lines} step line(s) of the log were not read whole (import_benchmark's "
                "warnings name them): their values are not judged"
            )
    elif h is not None and h.losses_seen:
        warnings.append(
            "this evidence predates whole-job health: only its measured windows were checked (re-import or "
            "re-run it to check every step)"
        )
        bad = h.nonfinite_loss_steps + h.nonfinite_grad_norm_steps
        check(
            "finite",
            h.finite,
            "every loss and gradient norm finite, no NaN iteration"
            if h.finite
            else f"non-finite at step(s) {bad[:10]}, {h.nan_iterations} NaN iteration(s)",
        )
        check(
            "unexplained_skips",
            h.unexplained_skips <= inp.max_unexplained_skips,
            f"{h.unexplained_skips} skipped iteration(s) without a loss-scale drop "
            f"(at most {inp.max_unexplained_skips})",
        )
        if inp.max_explained_skips is not None:
            check(
                "amp_overflow_skips",
                h.explained_skips <= inp.max_explained_skips,
                f"{h.explained_skips} AMP-overflow skip(s) (at most {inp.max_explained_skips})",
            )
    ratio: float | None = None
    bh = _health(base) if base is not None else None
    if base is not None:
        tol = inp.loss_tolerance or 0.0
        if bh is None or bh.loss_last is None or h is None or h.loss_last is None:
            check("loss_vs_baseline", False, "both runs need finite losses to compare")
        elif (bh.first_step, bh.last_step) != (h.first_step, h.last_step):
            check(
                "loss_vs_baseline",
                False,
                f"the runs cover different steps ({h.first_step}..{h.last_step} vs {bh.first_step}..{bh.last_step}): "
                "measure the same steps (same warm-up, measure steps and windows)",
            )
        else:
            ratio = h.loss_last / bh.loss_last if bh.loss_last else None
            level_ok = h.loss_last <= bh.loss_last + tol * abs(bh.loss_last)
            check(
                "loss_vs_baseline",
                level_ok,
                f"final loss {h.loss_last:.6g} vs baseline {bh.loss_last:.6g} (tolerance {tol:g} relative)",
            )
            if h.loss_trend is not None and bh.loss_trend is not None:
                check(
                    "loss_trend_vs_baseline",
                    h.loss_trend <= bh.loss_trend + tol,
                    f"loss trend {h.loss_trend:+.4f} vs baseline {bh.loss_trend:+.4f} (tolerance {tol:g})",
                )
        if base.tool != cand.tool:
            warnings.append("one run is imported, the other launched: their losses may be logged differently")
    if cand.tool == "import_benchmark":
        warnings.append("the losses are what the trainer logged (imported), not read by perfgate's harness")
    failed = [c.name for c in checks if not c.passed]
    metrics: dict[str, float] = {}
    if h is not None and h.loss_last is not None:
        metrics["loss_last"] = h.loss_last
    if h is not None and h.loss_trend is not None:
        metrics["loss_trend"] = h.loss_trend
    if ratio is not None:
        metrics["loss_last_ratio"] = ratio
    reported = cand.result.get("reported_metrics")
    if cand.tool == "run_benchmark_window" and isinstance(reported, dict):
        for name, value in cast("dict[str, Any]", reported).items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                metrics[f"eval:{name}"] = float(value)
    ev = rt.evidence()
    out = CheckTrainingHealthOutput(
        evidence_id=ev.id,
        state=EvidenceState.FAILED if failed else EvidenceState.PASSED,
        checks=checks,
        failed_checks=failed,
        steps_measured=steps,
        health=h,
        job_health=job,
        baseline_health=bh,
        loss_last_ratio=ratio,
        metrics={k: v for k, v in metrics.items() if math.isfinite(v)},
        evidence=[i for i in (inp.evidence_id, inp.baseline_id) if i is not None],
        warnings=warnings,
    )
    return await rt.commit(ev, out)


def _brief(out: CheckTrainingHealthOutput) -> list[str]:
    if not out.failed_checks:
        return [f"training health passed ({len(out.checks)} checks, {out.steps_measured} steps)"]
    return [f"training health failed: {', '.join(out.failed_checks)}"] + [
        f"- {c.name}: {c.detail}" for c in out.checks if not c.passed
    ]


SPEC = ToolSpec(
    name="check_training_health",
    title="Check training health (task-quality evidence)",
    description=(
        "Pass/fail training health of a window or imported run over all its steps: finite losses, no "
        "unexplained skips or spikes, enough steps, loss vs a baseline. Role 'quality'."
    ),
    details=(
        "Pass/fail training health of a run_benchmark_window or import_benchmark record. Over every step it "
        "holds (warm-up and steps after the windows included): losses and gradient norms finite, no NaN "
        "iterations, no unexplained skipped iterations (AMP-overflow skips optional), no loss spike (above the "
        "run's own recent median by more than its spread allows; max_loss_spikes tolerates some), no loss-scale "
        "collapse. Over the measured windows: at least min_steps, and with a baseline the final loss and loss "
        "trend within a declared tolerance. The "
        "record has quality_kind 'training_health': attach it with role 'quality' (short screens, and the "
        "'run the winner >= 50 steps' validation with min_steps=50)."
    ),
    input_model=CheckTrainingHealthInput,
    output_model=CheckTrainingHealthOutput,
    run=run,
    read_only=True,
    destructive=False,
    idempotent=True,
    open_world=False,
    brief=_brief,
)
