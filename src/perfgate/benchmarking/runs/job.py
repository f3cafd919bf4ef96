"""The whole job beside its windows: start-up, the first steps' compile or warm-up, evaluation and checkpoint
phases, the steps themselves, and the wall time to the last step and to the process's exit.

A run measured with ``job=true`` runs to its own end, and its harness keeps recording every step boundary
and the phases it sees (`perfgate.harness.hooks`: evaluation forwards under ``no_grad``, ``torch.save``, and
``perfgate.harness.phase`` markers). The totals are the server's: the launch's start and exit, and its stamps
of the step boundaries (`perfgate.execution.ticks`); the record only splits that observed time into parts:

* ``startup_s``: launch start to the first training forward, less the phases that ran before it;
* ``warmup_excess_s``: what the steps before the first window took beyond the windows' median step (compile,
  autotuning, allocator and cache warm-up), phases inside them left out;
* one part per phase kind (``eval``, ``checkpoint``, marked names): its passes and their time;
* ``steps_s``: the rest of the time to the last step, the training steps themselves;
* ``after_last_step_s``: the last step to the process's exit (a final evaluation or save, teardown).

Where the server did not observe the launch (Slurm), the parts come from the record alone, measured from
the harness's start instead of the launch's, and ``observed`` is false.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import Literal

from pydantic import BaseModel, Field

from perfgate.benchmarking.reading.records import RankRecord
from perfgate.execution.ticks import LaunchTicks

__all__ = [
    "JobComparison",
    "JobPart",
    "JobSummary",
    "JobTiming",
    "PartChange",
    "StartupLine",
    "compare_jobs",
    "job_timing",
    "summarize_jobs",
]

_PART_ORDER = ("startup", "warmup_excess", "steps", "eval", "checkpoint")
HEADLINE_GAP = 0.10
"""Relative gap between the pooled speedup and both the median step's and the job's beyond which the pooled
figure is not reported alone."""


class JobPart(BaseModel):
    name: str = Field(
        description="startup, warmup_excess (compile / warm-up beyond the steady step), steps, eval, checkpoint, "
        "a marked phase's name, or after_last_step."
    )
    seconds: float
    passes: int | None = Field(default=None, description="Phases of this kind (evaluation passes, saves).")


class StartupLine(BaseModel):
    """A line of the user's code start-up spent time at (the innermost user frame when sampled)."""

    location: str = Field(description="file:line function.")
    seconds: float = Field(description="Sampled time at this line (the calls it makes included).")
    share: float = Field(description="Of the sampled start-up (harness start to the first training forward).")


class JobTiming(BaseModel):
    """One launch's whole job."""

    launch: int
    observed: bool = Field(
        description="The totals are the server's (launch start, exit and step boundaries it stamped); false: "
        "from the harness record alone (a Slurm launch), measured from the harness's start."
    )
    wall_s: float | None = Field(description="Launch start to process exit (None: not observed).")
    time_to_last_step_s: float = Field(description="Launch start to the last optimizer step's end.")
    steps: int = Field(description="Optimizer steps the job ran.")
    steady_step_ms: float | None = Field(description="The measured windows' median step.")
    parts: list[JobPart] = Field(description="Where the time to the last step went, then after_last_step.")
    phases_in_windows: int = Field(
        default=0,
        description="Phases (evaluation, checkpoint, marked) that ran inside a measured window: their time is "
        "in that window's steps.",
    )
    phases_dropped: int = 0
    startup_lines: list[StartupLine] = Field(
        default_factory=list[StartupLine],
        description="Start-up's own costs by line of the user's code, most time first (sampled; time in "
        "the interpreter's and libraries' start-up outside the user's code is not listed).",
    )


class JobSummary(BaseModel):
    """A side's launches: each figure's median (and range) over launches."""

    launches: int
    wall_s: float | None
    wall_range_s: tuple[float, float] | None
    time_to_last_step_s: float
    time_to_last_step_range_s: tuple[float, float]
    parts: list[JobPart] = Field(description="Each part's median over launches.")
    observed: bool
    summary: str = Field(
        description="The job in one line: time to the last step, its parts, wall time, start-up's top lines."
    )
    startup_lines: list[StartupLine] = Field(
        default_factory=list[StartupLine],
        description="Start-up's own costs by line of the user's code (each figure's median over launches), "
        "most time first.",
    )


def _steady_ms(record: RankRecord) -> float | None:
    times = [
        record.steps.step_time_ns[s] for w in record.windows for s in range(w.first_step, w.last_step + 1)
    ]
    return statistics.median(times) / 1e6 if times else None


def _offset(record: RankRecord, ticks: LaunchTicks | None) -> int | None:
    """Server time minus record time, from the boundaries both know (median: robust to a late stamp)."""
    if ticks is None:
        return None
    stamps = ticks.stamps.get(record.rank, {})
    ends = record.steps.end_ns
    diffs = [stamps[b] - ends[b - 1] for b in stamps if 1 <= b <= len(ends)]
    return int(statistics.median(diffs)) if diffs else None


def job_timing(launch: int, records: Sequence[RankRecord], ticks: LaunchTicks | None) -> JobTiming | None:
    """Rank 0's job (the rank that evaluates and saves in most scripts), its totals anchored on the server's
    observation of the launch; None when the launch was not measured as a job or recorded no step."""
    record = next((r for r in records if r.rank == 0), records[0] if records else None)
    if record is None or record.job is None or not record.job.measured or not record.steps.count:
        return None
    steps = record.steps
    n = steps.count
    job = record.job
    train0 = job.train_start_ns if job.train_start_ns is not None else steps.start_ns[0]
    offset = _offset(record, ticks)
    observed = offset is not None and ticks is not None and ticks.started_ns > 0
    # the launch's start and end on the record's clock (the harness's start where it was not observed)
    start = ticks.started_ns - offset if observed and ticks is not None and offset is not None else 0
    end = ticks.ended_ns - offset if observed and ticks is not None and offset is not None else None
    last = steps.end_ns[-1]

    spans = [(w.first_step, w.last_step) for w in record.windows]
    in_windows = sum(1 for p in job.phases if any(a <= p.step <= b for a, b in spans))
    per_kind: dict[str, list[float]] = {}
    before_train = 0
    inside_step: dict[int, int] = {}
    after_last = 0
    for p in job.phases:
        span = max(0, p.end_ns - p.start_ns)
        per_kind.setdefault(p.kind, []).append(span)
        if p.start_ns < train0:
            before_train += span
        elif p.step >= n:
            after_last += span
        else:
            inside_step[p.step] = inside_step.get(p.step, 0) + span
    steady = _steady_ms(record)
    first_window = min((w.first_step for w in record.windows), default=n)
    excess = 0.0
    if steady is not None:
        for i in range(min(first_window, n)):
            began = max(steps.start_ns[i], train0) if i == 0 else steps.start_ns[i]
            own = steps.end_ns[i] - began - inside_step.get(i, 0)
            excess += max(0.0, own / 1e6 - steady)
    startup_ns = max(0, train0 - start - before_train)
    phase_ns = sum(sum(v) for v in per_kind.values()) - after_last
    to_last = max(0, last - start)
    steps_ns = max(0.0, to_last - startup_ns - phase_ns - excess * 1e6)
    parts = [
        JobPart(name="startup", seconds=startup_ns / 1e9),
        JobPart(name="warmup_excess", seconds=excess / 1e3),
        JobPart(name="steps", seconds=steps_ns / 1e9, passes=n),
    ]
    for kind in sorted(per_kind, key=lambda k: (_PART_ORDER.index(k) if k in _PART_ORDER else 99, k)):
        parts.append(JobPart(name=kind, seconds=sum(per_kind[kind]) / 1e9, passes=len(per_kind[kind])))
    if end is not None:
        parts.append(JobPart(name="after_last_step", seconds=max(0, end - last) / 1e9))
    return JobTiming(
        launch=launch,
        observed=observed,
        wall_s=None if end is None else max(0, end - start) / 1e9,
        time_to_last_step_s=to_last / 1e9,
        steps=n,
        steady_step_ms=steady,
        parts=parts,
        phases_in_windows=in_windows,
        phases_dropped=job.phases_dropped,
        startup_lines=_startup_lines(record),
    )


STARTUP_LINES = 3
"""Start-up lines a job's timing ranks."""


def _startup_lines(record: RankRecord) -> list[StartupLine]:
    sampled = record.startup
    if sampled is None or sampled.sampled_ns <= 0:
        return []
    lines = sorted(sampled.lines, key=lambda x: -x.ns)[:STARTUP_LINES]
    return [
        StartupLine(
            location=f"{x.file}:{x.line} {x.function}",
            seconds=x.ns / 1e9,
            share=min(1.0, x.ns / sampled.sampled_ns),
        )
        for x in lines
    ]


def summarize_jobs(jobs: Sequence[JobTiming]) -> JobSummary | None:
    """Medians over a side's launches (None without any)."""
    if not jobs:
        return None
    walls = [j.wall_s for j in jobs if j.wall_s is not None]
    to_last = [j.time_to_last_step_s for j in jobs]
    names: list[str] = []
    for j in jobs:
        names += [p.name for p in j.parts if p.name not in names]
    parts: list[JobPart] = []
    for name in names:
        found = [next((p for p in j.parts if p.name == name), None) for j in jobs]
        seconds = [p.seconds if p is not None else 0.0 for p in found]
        passes = [p.passes for p in found if p is not None and p.passes is not None]
        parts.append(
            JobPart(
                name=name,
                seconds=statistics.median(seconds),
                passes=round(statistics.median(passes)) if passes else None,
            )
        )
    wall = statistics.median(walls) if len(walls) == len(jobs) else None
    shown = ", ".join(
        f"{p.name} {p.seconds:.2f} s" + (f" x{p.passes}" if p.passes is not None else "")
        for p in parts
        if p.name != "after_last_step"
    )
    lines = _median_lines(jobs)
    at = ", ".join(f"{x.location} {x.seconds:.2f} s ({x.share:.0%})" for x in lines)
    return JobSummary(
        summary=f"job ({len(jobs)} launch(es), medians): {statistics.median(to_last):.2f} s to the last step "
        f"({shown})"
        + (f"; wall {wall:.2f} s" if wall is not None else "; wall not observed")
        + (f"; startup spent at {at}" if at else ""),
        startup_lines=lines,
        launches=len(jobs),
        wall_s=wall,
        wall_range_s=(min(walls), max(walls)) if len(walls) == len(jobs) else None,
        time_to_last_step_s=statistics.median(to_last),
        time_to_last_step_range_s=(min(to_last), max(to_last)),
        parts=parts,
        observed=all(j.observed for j in jobs),
    )


def _median_lines(jobs: Sequence[JobTiming]) -> list[StartupLine]:
    """Each start-up line's median over the launches (0 where a launch did not rank it), most time first."""
    found: dict[str, list[StartupLine]] = {}
    for j in jobs:
        for x in j.startup_lines:
            found.setdefault(x.location, []).append(x)
    out = [
        StartupLine(
            location=where,
            seconds=statistics.median([x.seconds for x in xs] + [0.0] * (len(jobs) - len(xs))),
            share=statistics.median([x.share for x in xs] + [0.0] * (len(jobs) - len(xs))),
        )
        for where, xs in found.items()
    ]
    return sorted(out, key=lambda x: -x.seconds)[:STARTUP_LINES]


class PartChange(BaseModel):
    name: str
    baseline_s: float
    candidate_s: float
    change_s: float = Field(description="candidate - baseline (negative: the candidate spent less).")


class JobComparison(BaseModel):
    """The sides' whole jobs (every launch measured with job=true), medians over launches."""

    baseline: JobSummary
    candidate: JobSummary
    figure: Literal["wall", "time_to_last_step"] = Field(
        description="What speedup compares: wall time where both sides' exits were observed, else the time to "
        "the last step."
    )
    speedup: float = Field(description="Baseline / candidate job time (>1: the candidate's job is faster).")
    verdict: Literal["faster", "slower", "same"] = Field(
        description="faster/slower: the medians differ by at least min_effect and the sides' ranges over "
        "launches do not overlap; same otherwise."
    )
    parts: list[PartChange] = Field(description="Each part of the job, largest change first.")
    contradicts_steps: bool = Field(
        description="The steps got faster (median step) but the job got slower, or the reverse."
    )
    unlike_windows: str | None = Field(
        default=None,
        description="The sides' windows held different amounts of periodic work (evaluation, checkpoints): "
        "their pooled throughput is not like for like.",
    )
    headline_contradicted: str | None = Field(
        default=None,
        description="The pooled speedup points elsewhere than both the median step and the job: say the "
        "latter two, never the pooled figure alone.",
    )
    summary: str


def compare_jobs(
    baseline: Sequence[JobTiming],
    candidate: Sequence[JobTiming],
    pooled_speedup: float | None,
    median_step_speedup: float | None,
    min_effect: float,
) -> JobComparison | None:
    """The two sides' jobs compared (None unless both have launches measured as a whole job)."""
    base, cand = summarize_jobs(baseline), summarize_jobs(candidate)
    if base is None or cand is None:
        return None
    if base.wall_s is not None and cand.wall_s is not None and base.wall_range_s and cand.wall_range_s:
        figure: Literal["wall", "time_to_last_step"] = "wall"
        b, c, b_range, c_range = base.wall_s, cand.wall_s, base.wall_range_s, cand.wall_range_s
    else:
        figure = "time_to_last_step"
        b, c = base.time_to_last_step_s, cand.time_to_last_step_s
        b_range, c_range = base.time_to_last_step_range_s, cand.time_to_last_step_range_s
    speedup = b / c if c > 0 else float("inf")
    verdict: Literal["faster", "slower", "same"] = "same"
    if speedup >= 1 + min_effect and c_range[1] < b_range[0]:
        verdict = "faster"
    elif speedup <= 1 / (1 + min_effect) and c_range[0] > b_range[1]:
        verdict = "slower"
    names = [p.name for p in base.parts] + [
        p.name for p in cand.parts if p.name not in {q.name for q in base.parts}
    ]
    found = {(side, p.name): p.seconds for side, s in (("b", base), ("c", cand)) for p in s.parts}
    parts = [
        PartChange(
            name=n,
            baseline_s=found.get(("b", n), 0.0),
            candidate_s=found.get(("c", n), 0.0),
            change_s=found.get(("c", n), 0.0) - found.get(("b", n), 0.0),
        )
        for n in names
    ]
    parts.sort(key=lambda p: -abs(p.change_s))
    steps_faster = median_step_speedup is not None and median_step_speedup >= 1 + min_effect
    steps_slower = median_step_speedup is not None and median_step_speedup <= 1 / (1 + min_effect)
    contradicts = (steps_faster and verdict == "slower") or (steps_slower and verdict == "faster")
    moved = ", ".join(f"{p.name} {p.change_s:+.2f} s" for p in parts[:3] if abs(p.change_s) >= 0.005)
    word = {
        "faster": f"{speedup:.3f}x faster",
        "slower": f"{1 / speedup:.3f}x slower",
        "same": "no clear change",
    }
    summary = (
        f"job ({figure.replace('_', ' ')}) {b:.2f} s -> {c:.2f} s, {word[verdict]} (launches "
        f"{b_range[0]:.2f}-{b_range[1]:.2f} vs {c_range[0]:.2f}-{c_range[1]:.2f} s)"
        + (f": {moved}" if moved else "")
    )
    if contradicts:
        summary = (
            f"the steps got {'faster' if steps_faster else 'slower'} (median step {median_step_speedup:.3f}x) but "
            f"the whole job got {verdict}: " + summary
        )
    inside = [statistics.mean(j.phases_in_windows for j in side) for side in (baseline, candidate)]
    unlike = (
        f"periodic work ran inside the measured windows unequally (per launch: baseline {inside[0]:g}, candidate "
        f"{inside[1]:g} evaluation/checkpoint phases): the pooled figure is not like for like; align the windows "
        "to the job's period (warm-up and measure_steps so that both sides' windows hold the same phases, or "
        "none) or judge by the median step and the job"
        if inside[0] != inside[1]
        else None
    )
    contradicted = None
    if pooled_speedup is not None and median_step_speedup is not None:
        apart = [
            abs(math.log(pooled_speedup / x)) > math.log1p(HEADLINE_GAP)
            for x in (median_step_speedup, speedup)
        ]
        if all(apart):
            contradicted = (
                f"the pooled speedup {pooled_speedup:.3f}x is contradicted by the median step "
                f"({median_step_speedup:.3f}x) and the whole job ({speedup:.3f}x): the job's figure is the one "
                "to report"
            )
    return JobComparison(
        baseline=base,
        candidate=cand,
        unlike_windows=unlike,
        headline_contradicted=contradicted,
        figure=figure,
        speedup=speedup,
        verdict=verdict,
        parts=parts,
        contradicts_steps=contradicts,
        summary=summary,
    )
