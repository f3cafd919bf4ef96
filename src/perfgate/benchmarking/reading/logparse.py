"""Step times parsed from a training log: the last resort when neither hooks nor the API apply.

The pattern is a regular expression with named groups ``step`` (an integer step index) and
``step_time_ms``. A line may report one step or the mean over the steps since the previous matched
line (``log every N``): each match stands for ``step - previous_step`` steps of its reported time.
The pattern comes from the agent, so it runs on RE2 (`perfgate.benchmarking.reading.userregex`): linear time,
and parsing checks for cancellation every few thousand lines so a huge log never pins the server.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from perfgate.benchmarking.errors import BenchmarkError
from perfgate.benchmarking.reading.userregex import LinearPattern, UserRegexError, compile_user_regex

__all__ = ["LogWindow", "compile_pattern", "log_window", "parse_placed_log", "parse_step_log"]


_EXAMPLE = r"'step (?P<step>\d+) .*step_time_ms (?P<step_time_ms>[0-9.]+)'"
_CHECK_EVERY_LINES = 4096
MAX_STEP_DIGITS = 18
"""A step index longer than this is not a step (and would not fit the ledger's integers): skipped."""


def compile_pattern(pattern: str) -> LinearPattern:
    """Compile ``pattern`` for linear-time search, requiring the ``step`` and ``step_time_ms`` groups.

    Raises:
        BenchmarkError: invalid or unsupported regex (RE2 syntax), or missing groups.
    """
    try:
        return compile_user_regex(pattern, field="log_pattern", required_groups=("step", "step_time_ms"))
    except UserRegexError as exc:
        raise BenchmarkError(f"{exc}; e.g. {_EXAMPLE}") from exc


def parse_step_log(
    lines: Iterable[str], pattern: LinearPattern, check: Callable[[], None] | None = None
) -> list[tuple[int, float]]:
    """``(step, step_time_ms)`` for every matching line, in log order.

    Lines whose numbers do not parse (or whose time is not a finite positive number) are skipped.
    ``check`` is called every few thousand lines; it raises to stop (e.g. `anyio.from_thread.check_cancelled`).
    """
    placed = ((line, n) for n, line in enumerate(lines))
    return [(step, ms) for step, ms, _ in parse_placed_log(placed, pattern, check)]


def parse_placed_log(
    lines: Iterable[tuple[str, int]], pattern: LinearPattern, check: Callable[[], None] | None = None
) -> list[tuple[int, float, int]]:
    """`parse_step_log` over ``(line, place)`` pairs: ``(step, step_time_ms, place)`` for every matching
    line, ``place`` being whatever the caller tags a line with (its end's byte offset in the log)."""
    out: list[tuple[int, float, int]] = []
    for n, (line, place) in enumerate(lines):
        if check is not None and n % _CHECK_EVERY_LINES == 0:
            check()
        groups = pattern.search(line)
        if groups is None:
            continue
        step_text, ms_text = groups.get("step") or "", groups.get("step_time_ms") or ""
        if len(step_text.strip().lstrip("+-")) > MAX_STEP_DIGITS:
            continue
        try:
            step, ms = int(step_text), float(ms_text)
        except ValueError:
            continue
        if 0 < ms < float("inf"):  # also drops NaN; a step takes time
            out.append((step, ms, place))
    return out


@dataclass(frozen=True)
class LogWindow:
    """Steps after warm-up: one time per step (a line's mean repeated over the steps it covers)."""

    step_ms: list[float]
    first_step: int
    last_step: int
    lines_used: int


def log_window(entries: list[tuple[int, float]], warmup_steps: int, measure_steps: int) -> LogWindow:
    """Skip the first ``warmup_steps`` steps of the log, then take ``measure_steps`` steps.

    Raises:
        BenchmarkError: no line matched, or steps go backwards (two runs in one log?).
    """
    if not entries:
        raise BenchmarkError("no log line matched log_pattern: check the pattern against the stdout log")
    origin = entries[0][0]
    prev = None
    step_ms: list[float] = []
    first = last = None
    used = 0
    for step, ms in entries:
        if prev is not None and step <= prev:
            raise BenchmarkError(
                f"log steps go backwards ({prev} then {step}): the log holds more than one run or the "
                "pattern matches unrelated lines"
            )
        covered = 1 if prev is None else step - prev
        prev = step
        if step - origin < warmup_steps:
            continue
        take = min(covered, measure_steps - len(step_ms))
        if take <= 0:
            break
        step_ms.extend([ms] * take)
        first = step if first is None else first
        last = step
        used += 1
    if not step_ms or first is None or last is None:
        raise BenchmarkError(f"the log has no steps after the {warmup_steps} warm-up steps")
    return LogWindow(step_ms=step_ms, first_step=first, last_step=last, lines_used=used)
