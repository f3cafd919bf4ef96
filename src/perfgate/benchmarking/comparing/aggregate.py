"""From per-rank records to one summary per measured window, and pooled over windows.

Ranks are aligned by step index: window *k* covers the same steps on every rank. Global work (samples,
tokens, optimizer steps) over those steps is divided by the longest rank's elapsed time over them, so
overlapping ranks are never summed as time.

The slowest rank is the one with the most *busy* time: elapsed time minus the estimated wait for other
ranks (one definition for every tool: `perfgate.benchmarking.comparing.stragglers`). Under data-parallel training
ranks run in lockstep, so their elapsed times agree and only the wait tells the straggler apart; the
wait is estimated per step as the rank's host time inside ``backward()`` (which holds the gradient
all-reduce) above the fastest rank's backward in that step.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from perfgate.benchmarking.comparing.stats import StepStats, step_stats
from perfgate.benchmarking.comparing.stragglers import excess_wait, slowest_rank
from perfgate.benchmarking.errors import BenchmarkError
from perfgate.benchmarking.reading.records import RankRecord, WindowRecord

__all__ = [
    "RankWindow",
    "RunSummary",
    "WindowSummary",
    "summarize_run",
    "summarize_window",
    "windows_from_series",
]


@dataclass(frozen=True)
class RankWindow:
    """One rank over one window. Times in milliseconds, memory in bytes."""

    rank: int
    steps_measured: int
    step_ms: list[float]
    step_time_source: str
    stats: StepStats
    elapsed_ms: float
    data_wait_ms: float
    backward_ms: float
    collective_wait_ms: float
    busy_ms: float
    samples: int | None
    tokens: int | None
    peak_allocated_bytes: int | None
    peak_reserved_bytes: int | None
    host_peak_rss_bytes: int | None

    @property
    def data_wait_fraction(self) -> float:
        return self.data_wait_ms / self.elapsed_ms if self.elapsed_ms > 0 else 0.0


@dataclass(frozen=True)
class WindowSummary:
    """All ranks over one window: global work over the longest rank's elapsed time.

    ``host_step_s`` (the host step times of the longest rank, summing to ``elapsed_s``) and the
    per-step global work columns feed the comparison bootstrap.
    """

    index: int
    ranks: list[RankWindow]
    slowest_rank: int
    rank_skew: float
    elapsed_s: float
    steps: int
    samples: int | None
    tokens: int | None
    host_step_s: list[float]
    samples_per_step: list[float] | None
    tokens_per_step: list[float] | None

    @property
    def stats(self) -> StepStats:
        """Step-time statistics of the slowest rank."""
        return next(r.stats for r in self.ranks if r.rank == self.slowest_rank)

    @property
    def samples_per_s(self) -> float | None:
        return None if self.samples is None else self.samples / self.elapsed_s

    @property
    def tokens_per_s(self) -> float | None:
        return None if self.tokens is None else self.tokens / self.elapsed_s

    @property
    def steps_per_s(self) -> float:
        return self.steps / self.elapsed_s

    @property
    def data_wait_fraction(self) -> float:
        """The worst rank's share of elapsed time spent waiting for the input pipeline."""
        return max(r.data_wait_fraction for r in self.ranks)

    @property
    def peak_memory_bytes(self) -> int | None:
        """Largest device peak allocation over the ranks (host peak RSS when no device tracks memory)."""
        device = [r.peak_allocated_bytes for r in self.ranks if r.peak_allocated_bytes is not None]
        if device:
            return max(device)
        host = [r.host_peak_rss_bytes for r in self.ranks if r.host_peak_rss_bytes is not None]
        return max(host) if host else None


def _ns_to_ms(values: Sequence[int]) -> list[float]:
    return [v / 1e6 for v in values]


def _sum_known(values: Sequence[int | None]) -> int | None:
    if any(v is None for v in values):
        return None
    return sum(v for v in values if v is not None)


def summarize_window(
    records: Sequence[RankRecord],
    index: int,
    samples_per_step: int | None = None,
    tokens_per_step: int | None = None,
) -> WindowSummary:
    """Summarise window ``index`` over all ranks.

    ``samples_per_step`` / ``tokens_per_step`` are *global* (all ranks) per optimizer step and override
    what the ranks recorded.

    Raises:
        BenchmarkError: a rank lacks the window, or the ranks' windows cover different steps.
    """
    if not records:
        raise BenchmarkError("no rank records to summarise")
    wins: list[WindowRecord] = []
    for r in records:
        if index >= len(r.windows):
            raise BenchmarkError(f"rank {r.rank} measured {len(r.windows)} window(s), not window {index}")
        wins.append(r.windows[index])
    first, last = wins[0].first_step, wins[0].last_step
    for r, w in zip(records, wins, strict=True):
        if (w.first_step, w.last_step) != (first, last):
            raise BenchmarkError(
                f"rank {r.rank} window {index} covers steps {w.first_step}..{w.last_step}, rank "
                f"{records[0].rank} covers {first}..{last}: give every rank the same warmup/measure settings"
            )
    span = slice(first, last + 1)
    n = last - first + 1
    backward = np.array([r.steps.backward_ns[span] for r in records], dtype=np.float64) / 1e6
    # Excess backward over the fastest rank, per step: the estimated wait for slower ranks.
    excess = excess_wait(backward.tolist())

    ranks: list[RankWindow] = []
    for i, (r, w) in enumerate(zip(records, wins, strict=True)):
        host_ms = _ns_to_ms(r.steps.step_time_ns[span])
        device_ms = w.device_step_ms
        use_device = device_ms is not None and len(device_ms) == n
        series = list(device_ms) if use_device and device_ms is not None else host_ms
        elapsed_ms = w.elapsed_ns / 1e6
        collective = float(excess[i])
        ranks.append(
            RankWindow(
                rank=r.rank,
                steps_measured=n,
                step_ms=series,
                step_time_source="device_events" if use_device else "host",
                stats=step_stats(series),
                elapsed_ms=elapsed_ms,
                data_wait_ms=sum(r.steps.data_wait_ns[span]) / 1e6,
                backward_ms=float(backward[i].sum()),
                collective_wait_ms=collective,
                busy_ms=elapsed_ms - collective,
                samples=_sum_known(r.steps.samples[span]),
                tokens=_sum_known(r.steps.tokens[span]),
                peak_allocated_bytes=w.peak_allocated_bytes,
                peak_reserved_bytes=w.peak_reserved_bytes,
                host_peak_rss_bytes=w.host_peak_rss_bytes,
            )
        )
    slowest_id = slowest_rank([x.rank for x in ranks], [x.busy_ms for x in ranks])
    slowest = next(x for x in ranks if x.rank == slowest_id)
    fastest_busy = min(x.busy_ms for x in ranks)
    longest_i = max(range(len(ranks)), key=lambda i: ranks[i].elapsed_ms)
    longest = records[longest_i]
    host_step_s = [v / 1e9 for v in longest.steps.step_time_ns[span]]

    def global_work(column: str, override: int | None) -> tuple[int | None, list[float] | None]:
        if override is not None:
            return override * n, [float(override)] * n
        per_rank: list[list[int | None]] = [
            (r.steps.samples if column == "samples" else r.steps.tokens)[span] for r in records
        ]
        if column == "samples" and any(v is None for col in per_rank for v in col):
            # no DataLoader batch on every step: the samples that reached the model's forward, where counted
            # (`perfgate.benchmarking.runs.measured.measured_batch` reads the same column)
            per_rank = [r.steps.model_samples[span] for r in records]
        if any(len(col) != n or any(v is None for v in col) for col in per_rank):
            return None, None
        per_step = [float(sum(col[j] or 0 for col in per_rank)) for j in range(n)]
        return int(sum(per_step)), per_step

    samples, samples_col = global_work("samples", samples_per_step)
    tokens, tokens_col = global_work("tokens", tokens_per_step)
    return WindowSummary(
        index=index,
        ranks=ranks,
        slowest_rank=slowest.rank,
        rank_skew=(slowest.busy_ms / fastest_busy - 1.0) if fastest_busy > 0 else 0.0,
        elapsed_s=ranks[longest_i].elapsed_ms / 1e3,
        steps=n,
        samples=samples,
        tokens=tokens,
        host_step_s=host_step_s,
        samples_per_step=samples_col,
        tokens_per_step=tokens_col,
    )


def windows_from_series(
    step_ms: Sequence[float],
    samples_per_step: int | None = None,
    tokens_per_step: int | None = None,
    index: int = 0,
) -> WindowSummary:
    """A single-rank window from step times alone (log-parsed timing); elapsed is their sum."""
    if not step_ms:
        raise BenchmarkError("no step times in the window")
    bad = [v for v in step_ms if not math.isfinite(v) or v < 0]
    if bad:
        raise BenchmarkError(
            f"invalid step time {bad[0]!r} ms in the log: step times must be finite and non-negative; fix the "
            "log pattern or the script's timing"
        )
    n = len(step_ms)
    elapsed_ms = float(sum(step_ms))
    stats = step_stats(step_ms)
    rank = RankWindow(
        rank=0,
        steps_measured=n,
        step_ms=list(step_ms),
        step_time_source="log",
        stats=stats,
        elapsed_ms=elapsed_ms,
        data_wait_ms=0.0,
        backward_ms=0.0,
        collective_wait_ms=0.0,
        busy_ms=elapsed_ms,
        samples=None if samples_per_step is None else samples_per_step * n,
        tokens=None if tokens_per_step is None else tokens_per_step * n,
        peak_allocated_bytes=None,
        peak_reserved_bytes=None,
        host_peak_rss_bytes=None,
    )
    return WindowSummary(
        index=index,
        ranks=[rank],
        slowest_rank=0,
        rank_skew=0.0,
        elapsed_s=elapsed_ms / 1e3,
        steps=n,
        samples=rank.samples,
        tokens=rank.tokens,
        host_step_s=[v / 1e3 for v in step_ms],
        samples_per_step=None if samples_per_step is None else [float(samples_per_step)] * n,
        tokens_per_step=None if tokens_per_step is None else [float(tokens_per_step)] * n,
    )


@dataclass(frozen=True)
class RunSummary:
    """Windows pooled: statistics over every window's slowest-rank steps, throughput as sum/sum."""

    windows: list[WindowSummary]
    stats: StepStats
    steps: int
    elapsed_s: float
    samples_per_s: float | None
    tokens_per_s: float | None
    steps_per_s: float
    slowest_rank: int
    rank_skew: float
    data_wait_fraction: float
    peak_memory_bytes: int | None


def summarize_run(windows: Sequence[WindowSummary]) -> RunSummary:
    """Pool ``windows`` (repeats of the same measurement).

    Raises:
        BenchmarkError: no windows.
    """
    if not windows:
        raise BenchmarkError("no complete window was measured")
    pooled = [v for w in windows for r in w.ranks if r.rank == w.slowest_rank for v in r.step_ms]
    elapsed = sum(w.elapsed_s for w in windows)
    steps = sum(w.steps for w in windows)
    samples = None if any(w.samples is None for w in windows) else sum(w.samples or 0 for w in windows)
    tokens = None if any(w.tokens is None for w in windows) else sum(w.tokens or 0 for w in windows)
    skews = [w.rank_skew for w in windows]
    slowest = [w.slowest_rank for w in windows]
    peaks = [w.peak_memory_bytes for w in windows if w.peak_memory_bytes is not None]
    return RunSummary(
        windows=list(windows),
        stats=step_stats(pooled),
        steps=steps,
        elapsed_s=elapsed,
        samples_per_s=None if samples is None else samples / elapsed,
        tokens_per_s=None if tokens is None else tokens / elapsed,
        steps_per_s=steps / elapsed,
        slowest_rank=max(set(slowest), key=slowest.count),
        rank_skew=float(np.median(skews)),
        data_wait_fraction=max(w.data_wait_fraction for w in windows),
        peak_memory_bytes=max(peaks) if peaks else None,
    )
