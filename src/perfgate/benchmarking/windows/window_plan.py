"""What a window run measures: warm-up and window lengths, windows per launch, how steps are timed, and
what the caller declared (contract, samples and tokens per step, a tensor capture)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from perfgate.benchmarking.workload.contract import Contract

__all__ = ["Capture", "Timing", "WindowPlan"]

Timing = Literal["harness", "explicit", "log"]
"""'harness': optimizer updates are steps; 'explicit': the script times itself; 'log': step times from stdout."""


@dataclass(frozen=True)
class Capture:
    """Tensors the harness writes itself after optimizer step ``step`` (``what`` of the model, at ``path``)."""

    step: int
    what: tuple[str, ...] = ("parameters",)
    path: str = "captures/{label}-{launch}.safetensors"


@dataclass(frozen=True)
class WindowPlan:
    """One call's measurement: ``repeats`` windows of ``measure_steps`` after ``warmup_steps``, each its own
    launch unless ``same_process``."""

    warmup_steps: int
    measure_steps: int
    repeats: int = 1
    same_process: bool = False
    timing: Timing = "harness"
    log_pattern: str | None = None
    samples_per_step: int | None = None
    """Declared global samples per optimizer step (all ranks)."""
    tokens_per_step: int | None = None
    label: str | None = None
    contract: Contract = field(default_factory=Contract)
    capture: Capture | None = None
    job: bool = False
    """Each launch runs to its own end and the whole job is measured beside the windows
    (`perfgate.benchmarking.runs.job`)."""

    @property
    def launches(self) -> int:
        return 1 if self.same_process else self.repeats

    @property
    def windows_per_launch(self) -> int:
        return self.repeats if self.same_process else 1

    def describe(self) -> str:
        """The request's default reason, shown to the approver."""
        return (
            f"run_benchmark_window: {self.launches} launch(es), {self.repeats} window(s) of {self.measure_steps} "
            f"steps after {self.warmup_steps} warm-up steps ({self.timing} timing)"
            + (", each run to its end (whole job)" if self.job else "")
        )
