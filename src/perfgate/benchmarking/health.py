"""Training health as evidence reports it: a health summary (`benchmarking.importing.HealthSummary`) as
the model the results of import_benchmark, run_benchmark_window and check_training_health carry."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, Field

if TYPE_CHECKING:
    from perfgate.benchmarking.importing import HealthSummary

__all__ = ["TrainingHealth", "health_model"]


class TrainingHealth(BaseModel):
    verdict: Literal["healthy", "unhealthy", "unknown"] = Field(
        description="unhealthy: non-finite loss/gradients, NaN iterations or unexplained skipped iterations; "
        "unknown: the source shows no loss."
    )
    finite: bool
    lines: int = Field(description="Logged lines (or harness steps) inside the measured windows.")
    losses_seen: int
    nonfinite_loss_steps: list[int]
    nonfinite_grad_norm_steps: list[int]
    nan_iterations: int
    skipped_iterations: int
    explained_skips: int = Field(description="Skipped iterations with a loss-scale drop (AMP overflow).")
    unexplained_skips: int
    loss_first: float | None = Field(description="Mean of the first quarter of the finite losses.")
    loss_last: float | None = Field(description="Mean of the last quarter of the finite losses.")
    loss_trend: float | None = Field(description="loss_last / loss_first - 1 (negative: the loss falls).")
    min_loss_scale: float | None
    max_grad_norm: float | None
    findings: list[str]
    whole_log_nan_iterations: int | None = Field(
        description="NaN iterations over the whole log (null: not a log)."
    )
    whole_log_skipped_iterations: int | None
    first_step: int | None = Field(default=None, description="First step the health covers.")
    last_step: int | None = Field(default=None, description="Last step the health covers.")


def health_model(
    h: HealthSummary,
    whole_nan: int | None,
    whole_skipped: int | None,
    first_step: int | None = None,
    last_step: int | None = None,
) -> TrainingHealth:
    """The tool-facing form of a health summary (whole-run counts where the source has them)."""
    return TrainingHealth(
        verdict=h.verdict,  # type: ignore[arg-type]  # one of the three literals
        finite=h.finite,
        lines=h.lines,
        losses_seen=h.losses_seen,
        nonfinite_loss_steps=h.nonfinite_loss_steps,
        nonfinite_grad_norm_steps=h.nonfinite_grad_norm_steps,
        nan_iterations=h.nan_iterations,
        skipped_iterations=h.skipped_iterations,
        explained_skips=h.explained_skips,
        unexplained_skips=h.unexplained_skips,
        loss_first=h.loss_first,
        loss_last=h.loss_last,
        loss_trend=h.loss_trend,
        min_loss_scale=h.min_loss_scale,
        max_grad_norm=h.max_grad_norm,
        findings=h.findings,
        whole_log_nan_iterations=whole_nan,
        whole_log_skipped_iterations=whole_skipped,
        first_step=first_step,
        last_step=last_step,
    )
