"""What one launch of a window run yields: its rank records (kept as artifacts) and the windows they or
its log measured, or why it yields none (`WindowFailure`)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from perfgate.benchmarking.errors import BenchmarkError, RecordError
from perfgate.benchmarking.windows.window_plan import WindowPlan

if TYPE_CHECKING:
    from perfgate.benchmarking.comparing.aggregate import WindowSummary
    from perfgate.benchmarking.reading.records import RankRecord
    from perfgate.benchmarking.windows.corroborate import TimingCheck
    from perfgate.execution.executor import CommandResult
    from perfgate.execution.service import ArtifactWriter

__all__ = [
    "WindowFailure",
    "collect_records",
    "harness_windows",
    "launch_failure",
    "log_windows",
    "no_step_failure",
]


class WindowFailure(BenchmarkError):
    """A launch did not yield the windows asked for; the evidence is recorded as failed."""


def launch_failure(result: CommandResult) -> str:
    """Why a launch that did not succeed failed, with what to do where perfgate can tell."""
    from perfgate.security.quoting import file_text

    tail = result.stderr.tail
    if "No module named perfgate" in tail or "No module named 'perfgate'" in tail:
        return (
            "the training interpreter cannot import perfgate: `pip install perfgate` in that environment, or "
            "call again with harness_on_path=true"
        )
    last = tail.strip().splitlines()[-1] if tail.strip() else ""
    return f"{result.summary()}" + (f"; last stderr line: {file_text(last)}" if last else "")


def no_step_failure(record_dir: Path) -> str | None:
    """Why the harness stopped a launch for want of a step (what it looked for, the line to add), as its
    record says; None when no rank was stopped so (or the records cannot be read)."""
    from perfgate.benchmarking.reading.records import load_records

    try:
        found = load_records(record_dir)
    except RecordError:
        return None
    for r in found.records:
        if r.stop_reason == "no_step_found" and r.error:
            return f"rank {r.rank}: {r.error}"
    return None


def collect_records(
    artifacts: ArtifactWriter, record_dir: Path, launch: int
) -> tuple[list[RankRecord], list[str]]:
    """The rank records of ``launch`` in ``record_dir`` and the set's problems; each file is kept as the
    artifact ``launch<N>_rank<R>.json``; both are scrubbed by the scrubber of the record's artifacts.

    Raises:
        WindowFailure: a record is missing, unreadable or of an unknown format.
    """
    from perfgate.benchmarking.reading.records import load_records, scrubbed_record

    scrub = artifacts.scrubber()
    try:
        found = load_records(record_dir, scrub)
        for path in sorted(record_dir.glob("rank*.json")):  # kept as decoded: scrubbed
            artifacts.write_bytes(
                f"launch{launch}_{path.name}", scrubbed_record(path.read_bytes(), path, scrub)
            )
    except RecordError as exc:
        raise WindowFailure(str(exc)) from exc
    return found.records, found.problems


def harness_windows(plan: WindowPlan, records: list[RankRecord], problems: list[str]) -> list[WindowSummary]:
    """The windows one launch's harness records measured.

    Raises:
        WindowFailure: the record set has problems, a rank ran under the profiler, or a rank measured
            fewer windows than the plan asks of a launch.
    """
    from perfgate.benchmarking.comparing.aggregate import summarize_window

    if problems:
        raise WindowFailure("; ".join(problems))
    want = plan.windows_per_launch
    for r in records:
        if r.profiled:
            raise WindowFailure(
                f"rank {r.rank} ran under the profiler: profiled runs are not throughput evidence"
            )
        if not r.steps.count and r.stop_reason != "window_complete":
            from perfgate.harness.steps import LOOKED_FOR

            raise WindowFailure(
                f"rank {r.rank} found no training step before the script ended ({r.error or r.stop_reason}); "
                f"looked for {LOOKED_FOR}. Add the line `perfgate.harness.step()` (with `import perfgate.harness`) "
                "at the end of each training iteration and measure again"
            )
        if len(r.windows) < want:
            measured = max(0, r.steps.count - r.warmup_steps)
            why = r.error or r.stop_reason or "unknown"
            restarted = [n for n in r.notes if "restarts at step" in n]
            raise WindowFailure(
                f"rank {r.rank} measured {measured} of {want * r.measure_steps} steps after warm-up "
                f"(the script ended: {why}); run more steps or lower warmup_steps/measure_steps"
                + (f"; {restarted[0]}" if restarted else "")
            )
    return [summarize_window(records, k, plan.samples_per_step, plan.tokens_per_step) for k in range(want)]


def log_windows(plan: WindowPlan, stdout: Path, launch: int = 0) -> tuple[list[WindowSummary], TimingCheck]:
    """The windows one launch's stdout log measured (timing='log'), and the check of its step times against
    the server's stamps of the log's lines (`perfgate.execution.linestamps`, kept beside the log); call it in
    a worker thread (it checks for cancellation between lines).

    Raises:
        WindowFailure: the log holds fewer steps than a window needs.
    """
    import anyio.from_thread

    from perfgate.benchmarking.comparing.aggregate import windows_from_series
    from perfgate.benchmarking.reading.logparse import compile_pattern, log_window, parse_placed_log
    from perfgate.benchmarking.windows.corroborate import corroborate_log
    from perfgate.execution.linestamps import OutputStamps, stamps_path
    from perfgate.helpers.cappedlines import placed_lines

    pattern = compile_pattern(plan.log_pattern or "")
    with stdout.open("rb") as fh:
        placed = parse_placed_log(placed_lines(fh), pattern, check=anyio.from_thread.check_cancelled)
    entries = [(step, ms) for step, ms, _ in placed]
    out: list[WindowSummary] = []
    spans: list[tuple[int, int]] = []
    for k in range(plan.windows_per_launch):
        window = log_window(entries, plan.warmup_steps + k * plan.measure_steps, plan.measure_steps)
        if len(window.step_ms) < plan.measure_steps:
            raise WindowFailure(
                f"the log holds {len(window.step_ms)} of {plan.measure_steps} steps for window {k}: run more steps"
            )
        out.append(windows_from_series(window.step_ms, plan.samples_per_step, plan.tokens_per_step, index=k))
        spans.append((window.first_step, window.last_step))
    return out, corroborate_log(launch, placed, spans, OutputStamps.load(stamps_path(stdout)))
