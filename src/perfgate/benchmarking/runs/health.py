"""Training health: what a run's losses, gradient norms, loss scale and skipped iterations say.

Two scopes are judged with the same rules. The *measured windows* (``health``: the loss level and trend a
baseline comparison reads) and the *whole job* (``job_health``: every step the log or the harness records
hold: the warm-up, the windows, a discarded window, the steps after the last window). check_training_health
fails on what the whole job shows, so a NaN in the last lines of a log or in the warm-up is never dropped by
the window split.

Rules, over the steps in order:

- a non-finite loss or gradient norm, or a NaN iteration the trainer reports, is unhealthy (the step is named);
- a skipped iteration is *explained* (an AMP overflow) when the loss scale dropped at that line, or drops by
  the next line (a dynamic scaler with hysteresis lowers the scale one overflow late), or, on the first line,
  is below where the scale started (Megatron's ``initial_loss_scale``); any other skip is unexplained. Every
  skip the harness records is a GradScaler step that found inf/NaN gradients: explained;
- a loss-scale *collapse* is the scale reaching `LOSS_SCALE_FLOOR` (1.0) after being above it: the
  gradients overflow even unscaled (a bf16 run that logs a constant 1.0 never collapses);
- a loss *spike* is a finite loss above the median of the previous `SPIKE_HISTORY` finite losses by more
  than ``max(SPIKE_MADS x sigma, SPIKE_MIN_RISE x |median|)``, where sigma is their median absolute deviation
  scaled to a standard deviation (x 1.4826), once `SPIKE_MIN_HISTORY` losses precede it. The rule is the
  run's own: its recent median and spread, robust to the spike itself; a falling loss never spikes, and the
  floor keeps a flat, quantised loss from flagging its last digit. For a log that prints the mean of an
  interval (Megatron, torchtitan), "losses" are the logged values.
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, Field

if TYPE_CHECKING:
    from perfgate.benchmarking.reading.logformats import LogEntry
    from perfgate.benchmarking.reading.records import RankRecord, WindowRecord

__all__ = [
    "HARNESS_COVERS",
    "LOSS_SCALE_FLOOR",
    "SPIKE_HISTORY",
    "SPIKE_MADS",
    "SPIKE_MIN_HISTORY",
    "SPIKE_MIN_RISE",
    "SPIKE_RULE",
    "HealthSummary",
    "JobHealth",
    "LossSpike",
    "TrainingHealth",
    "health_from_windows",
    "health_model",
    "health_of",
    "job_checks",
    "job_health_model",
    "job_health_of_launches",
    "loss_spikes",
]

SPIKE_HISTORY = 20
"""Previous finite losses a spike is judged against."""
SPIKE_MIN_HISTORY = 8
"""Finite losses that must precede a loss before it can be a spike."""
SPIKE_MADS = 6.0
"""How many scaled median absolute deviations above the median make a spike."""
SPIKE_MIN_RISE = 0.10
"""The smallest rise over the median that is a spike, relative to the median."""
LOSS_SCALE_FLOOR = 1.0
"""A loss scale that falls to this (Megatron's default ``--min-loss-scale``) has collapsed."""
_MAD_SIGMA = 1.4826
SPIKE_RULE = (
    f"loss > median of the previous {SPIKE_HISTORY} losses + max({SPIKE_MADS:g} x 1.4826 x their median "
    f"absolute deviation, {SPIKE_MIN_RISE:g} x |median|), after at least {SPIKE_MIN_HISTORY} losses"
)
_NAMED = 10
HARNESS_COVERS = (
    "every step the harness recorded in each launch: the warm-up, the measured windows, a discarded window "
    "and the steps after the last window"
)


@dataclass(frozen=True)
class LossSpike:
    """A loss above its limit (see the module docstring): the median and limit it was judged against."""

    step: int
    loss: float
    median: float
    limit: float


def loss_spikes(points: Iterable[tuple[int, float]]) -> list[LossSpike]:
    """The spikes among ``(step, loss)`` in order (non-finite losses are skipped: they fail on their own)."""
    out: list[LossSpike] = []
    history: deque[float] = deque(maxlen=SPIKE_HISTORY)
    for step, value in points:
        if not math.isfinite(value):
            continue
        if len(history) >= SPIKE_MIN_HISTORY:
            median = statistics.median(history)
            sigma = _MAD_SIGMA * statistics.median(abs(v - median) for v in history)
            limit = median + max(SPIKE_MADS * sigma, SPIKE_MIN_RISE * abs(median))
            if value > limit:
                out.append(LossSpike(step, value, median, limit))
        history.append(value)
    return out


@dataclass
class HealthSummary:
    """Training health over a sequence of steps (see the module docstring)."""

    lines: int
    losses_seen: int
    nonfinite_loss_steps: list[int] = field(default_factory=list[int])
    nonfinite_grad_norm_steps: list[int] = field(default_factory=list[int])
    nan_iterations: int = 0
    skipped_iterations: int = 0
    explained_skips: int = 0
    unexplained_skips: int = 0
    loss_first: float | None = None
    loss_last: float | None = None
    loss_trend: float | None = None
    min_loss_scale: float | None = None
    max_grad_norm: float | None = None
    findings: list[str] = field(default_factory=list[str])
    first_step: int | None = None
    last_step: int | None = None
    spikes: list[LossSpike] = field(default_factory=list[LossSpike])
    scale_drops: int = 0
    """Lines (or windows) at which the loss scale fell."""
    scale_collapse_step: int | None = None
    unread_step_lines: int = 0
    """Step lines of a log refused as not whole (they hold no health: said, never guessed)."""

    @property
    def finite(self) -> bool:
        return not (self.nonfinite_loss_steps or self.nonfinite_grad_norm_steps or self.nan_iterations)

    @property
    def verdict(self) -> str:
        """unhealthy: non-finite values, NaN iterations or unexplained skips; unknown: no loss."""
        if not self.finite or self.unexplained_skips:
            return "unhealthy"
        if self.losses_seen == 0:
            return "unknown"
        return "healthy"

    @property
    def job_verdict(self) -> str:
        """`verdict`, and unhealthy on a loss spike or a loss-scale collapse too."""
        if self.verdict == "unhealthy" or self.spikes or self.scale_collapse_step is not None:
            return "unhealthy"
        return self.verdict


def _quarter_mean(values: Sequence[float], last: bool) -> float:
    q = max(1, len(values) // 4)
    part = values[-q:] if last else values[:q]
    return math.fsum(part) / len(part)


def _skip_explained(scales: Sequence[float | None], i: int, initial_scale: float | None) -> str | None:
    """How the loss scale explains the skips of line ``i``; None when it does not."""
    here = scales[i]
    if here is None:
        return None
    before = next((s for s in reversed(scales[:i]) if s is not None), None)
    if before is not None and here < before:
        return f"the loss scale dropping {before:g} -> {here:g}"
    if before is None and initial_scale is not None and here < initial_scale:
        return f"the loss scale below where it started ({initial_scale:g} -> {here:g})"
    after = next((s for s in scales[i + 1 :] if s is not None), None)
    if after is not None and after < here:
        return f"the loss scale dropping {here:g} -> {after:g} by the next line"
    return None


def health_of(entries: Sequence[LogEntry], initial_scale: float | None = None) -> HealthSummary:
    """Health over ``entries`` (steps in order). ``initial_scale``: where the dynamic loss scale started."""
    h = HealthSummary(lines=len(entries), losses_seen=0)
    if entries:
        h.first_step, h.last_step = entries[0].step, entries[-1].step
    finite_losses: list[float] = []
    explained: list[str] = []
    unexplained: list[str] = []
    scales = [e.loss_scale for e in entries]
    previous_scale: float | None = None
    peak_scale = 0.0
    for i, e in enumerate(entries):
        if e.loss is not None:
            h.losses_seen += 1
            if math.isfinite(e.loss):
                finite_losses.append(e.loss)
            else:
                h.nonfinite_loss_steps.append(e.step)
        if e.grad_norm is not None:
            if math.isfinite(e.grad_norm):
                h.max_grad_norm = max(h.max_grad_norm or 0.0, e.grad_norm)
            else:
                h.nonfinite_grad_norm_steps.append(e.step)
        h.nan_iterations += e.nan
        if e.skipped:
            h.skipped_iterations += e.skipped
            why = _skip_explained(scales, i, initial_scale)
            if why is not None:
                h.explained_skips += e.skipped
                explained.append(f"step {e.step}: {e.skipped} skipped iteration(s) with {why} (AMP overflow)")
            else:
                h.unexplained_skips += e.skipped
                unexplained.append(
                    f"step {e.step}: {e.skipped} skipped iteration(s) without a loss-scale drop (unexplained)"
                )
        scale = e.loss_scale
        if scale is not None and math.isfinite(scale):
            h.min_loss_scale = scale if h.min_loss_scale is None else min(h.min_loss_scale, scale)
            if previous_scale is not None and scale < previous_scale:
                h.scale_drops += 1
            if scale <= LOSS_SCALE_FLOOR < peak_scale and h.scale_collapse_step is None:
                h.scale_collapse_step = e.step
            peak_scale = max(peak_scale, scale)
            previous_scale = scale
    h.spikes = loss_spikes((e.step, e.loss) for e in entries if e.loss is not None)
    findings = h.findings
    if h.nonfinite_loss_steps:
        findings.append(f"non-finite loss at step(s) {h.nonfinite_loss_steps[:_NAMED]}")
    if h.nonfinite_grad_norm_steps:
        findings.append(f"non-finite gradient norm at step(s) {h.nonfinite_grad_norm_steps[:_NAMED]}")
    if h.nan_iterations:
        findings.append(f"{h.nan_iterations} NaN iteration(s) reported by the trainer")
    if h.scale_collapse_step is not None:
        findings.append(
            f"step {h.scale_collapse_step}: the loss scale collapsed to {h.min_loss_scale:g} (it overflows even "
            "unscaled)"
        )
    findings += unexplained[:_NAMED]
    findings += [
        f"step {s.step}: loss spike {s.loss:.4g} over the limit {s.limit:.4g} (median {s.median:.4g} of "
        f"the previous {SPIKE_HISTORY} losses)"
        for s in h.spikes[:_NAMED]
    ]
    if len(h.spikes) > _NAMED:
        findings.append(f"{len(h.spikes) - _NAMED} more loss spike(s)")
    findings += explained[:_NAMED]
    if finite_losses:
        h.loss_first = _quarter_mean(finite_losses, last=False)
        h.loss_last = _quarter_mean(finite_losses, last=True)
        if h.loss_first != 0:
            h.loss_trend = h.loss_last / h.loss_first - 1.0
    return h


# --------------------------------------------------------------------------- harness records


def _window_entries(windows: Sequence[WindowRecord]) -> list[LogEntry]:
    from perfgate.benchmarking.reading.logformats import LogEntry

    entries: list[LogEntry] = []
    for w in windows:
        skipped = {s: n for s, n in (w.skipped_steps or [])}
        bad = set(w.nonfinite_loss_steps or [])
        losses = w.loss or []
        for i, step in enumerate(range(w.first_step, w.last_step + 1)):
            value = losses[i] if i < len(losses) else None
            loss = math.nan if step in bad else value
            entries.append(LogEntry(step=step, step_ms=None, line=0, loss=loss, skipped=skipped.get(step, 0)))
    return entries


def _amp_skips(h: HealthSummary, scales: Sequence[float | None]) -> None:
    """Harness skips are GradScaler steps that found inf/NaN gradients: all explained."""
    if not h.skipped_iterations:
        return
    h.findings = [f for f in h.findings if "skipped iteration" not in f]
    h.explained_skips, h.unexplained_skips = h.skipped_iterations, 0
    known = [s for s in scales if s is not None]
    scale = f"; loss scale {known[0]:g} -> {known[-1]:g}" if len(known) >= 2 else ""
    h.findings.append(
        f"GradScaler skipped {h.skipped_iterations} update(s) on inf/NaN gradients (AMP overflow){scale}"
    )


def _scales(windows: Sequence[WindowRecord]) -> list[float | None]:
    return [s for w in windows for s in (w.loss_scale_start, w.loss_scale_end)]


def _scale_facts(h: HealthSummary, windows: Sequence[WindowRecord]) -> None:
    """The smallest loss scale at any window edge, drops between edges and a collapse."""
    edges = [((w.first_step, w.loss_scale_start), (w.last_step, w.loss_scale_end)) for w in windows]
    known = [(step, s) for pair in edges for step, s in pair if s is not None]
    h.min_loss_scale = min((s for _, s in known), default=None)
    h.scale_drops = sum(1 for (_, a), (_, b) in itertools.pairwise(known) if b < a)
    peak = 0.0
    for step, s in known:
        if s <= LOSS_SCALE_FLOOR < peak and h.scale_collapse_step is None:
            h.scale_collapse_step = step
            h.findings.append(
                f"by step {step}: the loss scale collapsed to {s:g} (it overflows even unscaled)"
            )
        peak = max(peak, s)


def health_from_windows(by_rank: Sequence[tuple[int, Sequence[WindowRecord]]]) -> HealthSummary | None:
    """Health of harness windows: the lowest rank's losses for the trend, non-finite losses of any rank.

    A harness skip is a GradScaler step that did not reach the optimizer, which only happens on
    inf/NaN gradients: every such skip is an AMP overflow (explained). None when no rank saw a loss.
    """
    with_loss = [(rank, wins) for rank, wins in sorted(by_rank) if any(w.loss for w in wins)]
    if not with_loss:
        return None
    _, reference = with_loss[0]
    h = health_of(_window_entries(reference))
    others = sorted({s for _, wins in by_rank for w in wins for s in (w.nonfinite_loss_steps or [])})
    extra = [s for s in others if s not in h.nonfinite_loss_steps]
    if extra:
        h.nonfinite_loss_steps = sorted([*h.nonfinite_loss_steps, *extra])
        h.findings.append(f"non-finite loss on another rank at step(s) {extra[:_NAMED]}")
    _amp_skips(h, _scales(reference))
    _scale_facts(h, reference)
    return h


def _record_entries(record: RankRecord) -> list[LogEntry]:
    """Every step of one rank's record with a loss or a skip: its windows and the steps outside them."""
    from perfgate.benchmarking.reading.logformats import LogEntry

    entries = _window_entries(record.windows)
    outside = record.outside_windows
    if outside is not None:
        skipped = {s: n for s, n in outside.skipped_steps}
        bad = set(outside.nonfinite_loss_steps)
        steps = sorted({s for s, _ in outside.loss} | bad | set(skipped))
        losses = dict(outside.loss)
        for step in steps:
            loss = math.nan if step in bad else losses.get(step)
            entries.append(LogEntry(step=step, step_ms=None, line=0, loss=loss, skipped=skipped.get(step, 0)))
    entries.sort(key=lambda e: e.step)
    return entries


def _launch_health(records: Sequence[RankRecord]) -> HealthSummary | None:
    by_rank = sorted(records, key=lambda r: r.rank)
    entries = {r.rank: _record_entries(r) for r in by_rank}
    reference = next((r for r in by_rank if any(e.loss is not None for e in entries[r.rank])), None)
    if reference is None:
        return None
    h = health_of(entries[reference.rank])
    others = sorted(
        {e.step for r in by_rank for e in entries[r.rank] if e.loss is not None and not math.isfinite(e.loss)}
    )
    extra = [s for s in others if s not in h.nonfinite_loss_steps]
    if extra:
        h.nonfinite_loss_steps = sorted([*h.nonfinite_loss_steps, *extra])
        h.findings.append(f"non-finite loss on another rank at step(s) {extra[:_NAMED]}")
    _amp_skips(h, _scales(reference.windows))
    _scale_facts(h, reference.windows)
    return h


def job_health_of_launches(launches: Sequence[Sequence[RankRecord]]) -> HealthSummary | None:
    """Health over every step the harness recorded in each launch (windows, warm-up, a discarded window,
    steps after the last window), launches judged apart (a new launch's first loss is no spike) and summed.
    None when no launch saw a loss."""
    parts = [(i, h) for i, recs in enumerate(launches) if (h := _launch_health(recs)) is not None]
    if not parts:
        return None
    if len(parts) == 1:
        return parts[0][1]
    out = HealthSummary(lines=0, losses_seen=0)
    for i, h in parts:
        out.lines += h.lines
        out.losses_seen += h.losses_seen
        out.nonfinite_loss_steps += h.nonfinite_loss_steps
        out.nonfinite_grad_norm_steps += h.nonfinite_grad_norm_steps
        out.nan_iterations += h.nan_iterations
        out.skipped_iterations += h.skipped_iterations
        out.explained_skips += h.explained_skips
        out.unexplained_skips += h.unexplained_skips
        out.scale_drops += h.scale_drops
        out.spikes += h.spikes
        if h.min_loss_scale is not None:
            out.min_loss_scale = min(out.min_loss_scale or h.min_loss_scale, h.min_loss_scale)
        if h.max_grad_norm is not None:
            out.max_grad_norm = max(out.max_grad_norm or 0.0, h.max_grad_norm)
        if out.scale_collapse_step is None:
            out.scale_collapse_step = h.scale_collapse_step
        out.findings += [f"launch {i}: {f}" for f in h.findings]
        out.first_step = h.first_step if out.first_step is None else min(out.first_step, h.first_step or 0)
        out.last_step = h.last_step if out.last_step is None else max(out.last_step, h.last_step or 0)
    return out


# --------------------------------------------------------------------------- wire form


class LossSpikeResult(BaseModel):
    step: int
    loss: float
    median: float = Field(description="Median of the previous losses it was judged against.")
    limit: float = Field(description="The loss above which it is a spike.")


class JobHealth(BaseModel):
    """Health over every step the run or its log holds: what check_training_health judges."""

    verdict: Literal["healthy", "unhealthy", "unknown"] = Field(
        description="unhealthy: a non-finite loss or gradient norm, a NaN iteration, an unexplained skipped "
        "iteration, a loss spike or a loss-scale collapse anywhere in the job; unknown: no loss seen."
    )
    covers: str = Field(description="Which steps were looked at.")
    first_step: int | None
    last_step: int | None
    losses_seen: int
    nonfinite_loss_steps: list[int]
    nonfinite_grad_norm_steps: list[int]
    nan_iterations: int
    skipped_iterations: int
    explained_skips: int = Field(description="Skipped iterations the loss scale explains (AMP overflow).")
    unexplained_skips: int
    loss_scale_drops: int
    min_loss_scale: float | None
    loss_scale_collapse_step: int | None = Field(
        description=f"Where the loss scale fell to {LOSS_SCALE_FLOOR:g} after being above it."
    )
    loss_spikes: list[LossSpikeResult] = Field(description=f"Losses over the spike rule: {SPIKE_RULE}.")
    unread_step_lines: int = Field(
        default=0, description="Step lines of the log refused as not whole: their values are not judged."
    )
    findings: list[str]


def job_health_model(h: HealthSummary, covers: str) -> JobHealth:
    """The wire form of a whole-job health summary."""
    verdict = h.job_verdict
    return JobHealth(
        verdict="healthy" if verdict == "healthy" else "unhealthy" if verdict == "unhealthy" else "unknown",
        covers=covers,
        first_step=h.first_step,
        last_step=h.last_step,
        losses_seen=h.losses_seen,
        nonfinite_loss_steps=h.nonfinite_loss_steps[:100],
        nonfinite_grad_norm_steps=h.nonfinite_grad_norm_steps[:100],
        nan_iterations=h.nan_iterations,
        skipped_iterations=h.skipped_iterations,
        explained_skips=h.explained_skips,
        unexplained_skips=h.unexplained_skips,
        loss_scale_drops=h.scale_drops,
        min_loss_scale=h.min_loss_scale,
        loss_scale_collapse_step=h.scale_collapse_step,
        loss_spikes=[
            LossSpikeResult(step=s.step, loss=s.loss, median=s.median, limit=s.limit) for s in h.spikes[:100]
        ],
        unread_step_lines=h.unread_step_lines,
        findings=h.findings[:20],
    )


def job_checks(
    job: JobHealth, *, max_unexplained_skips: int, max_explained_skips: int | None, max_loss_spikes: int
) -> list[tuple[str, bool, str]]:
    """``(check, passed, detail)`` over the whole job: finite values, skipped iterations, loss spikes and the
    loss scale (a check whose evidence is absent, a spike check without losses, is left out)."""
    out: list[tuple[str, bool, str]] = []
    span = f"steps {job.first_step}..{job.last_step}" if job.first_step is not None else "no step"
    bad = sorted({*job.nonfinite_loss_steps, *job.nonfinite_grad_norm_steps})
    finite = not bad and not job.nan_iterations
    out.append(
        (
            "finite",
            finite,
            f"every loss and gradient norm finite, no NaN iteration over the whole job ({span})"
            if finite
            else f"non-finite loss or gradient norm at step(s) {bad[:_NAMED]}, {job.nan_iterations} NaN "
            f"iteration(s) (whole job, {span})",
        )
    )
    out.append(
        (
            "unexplained_skips",
            job.unexplained_skips <= max_unexplained_skips,
            f"{job.unexplained_skips} skipped iteration(s) without a loss-scale drop over the whole job "
            f"(at most {max_unexplained_skips})",
        )
    )
    if max_explained_skips is not None:
        out.append(
            (
                "amp_overflow_skips",
                job.explained_skips <= max_explained_skips,
                f"{job.explained_skips} AMP-overflow skip(s) over the whole job (at most {max_explained_skips})",
            )
        )
    if job.losses_seen:
        spikes = job.loss_spikes
        shown = "; ".join(
            f"step {x.step}: {x.loss:.4g} > {x.limit:.4g} (median {x.median:.4g})" for x in spikes[:3]
        )
        out.append(
            (
                "loss_spikes",
                len(spikes) <= max_loss_spikes,
                f"{len(spikes)} loss spike(s) (at most {max_loss_spikes}): {shown}; rule: {SPIKE_RULE}"
                if spikes
                else f"no loss spike over the whole job ({span})",
            )
        )
    if job.min_loss_scale is not None:
        collapsed = job.loss_scale_collapse_step
        out.append(
            (
                "loss_scale",
                collapsed is None,
                f"the loss scale fell to {job.min_loss_scale:g} at step {collapsed}: gradients overflow even "
                "unscaled"
                if collapsed is not None
                else f"no loss-scale collapse (lowest {job.min_loss_scale:g}, {job.loss_scale_drops} drop(s))",
            )
        )
    return out


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
