"""Step times parsed from a training log: the last resort when neither hooks nor the API apply.

The pattern is a regular expression with named groups ``step`` (an integer step index) and
``step_time_ms``. A line may report one step or the mean over the steps since the previous matched
line (``log every N``): each match stands for ``step - previous_step`` steps of its reported time.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from perfgate.benchmarking.errors import BenchmarkError

__all__ = ["LogWindow", "compile_pattern", "log_window", "parse_step_log"]


def compile_pattern(pattern: str) -> re.Pattern[str]:
    """Compile ``pattern``, requiring the ``step`` and ``step_time_ms`` named groups.

    Raises:
        BenchmarkError: invalid regex or missing groups.
    """
    try:
        compiled = re.compile(pattern)
    except re.error as exc:
        raise BenchmarkError(f"log_pattern is not a valid regular expression: {exc}") from exc
    missing = {"step", "step_time_ms"} - set(compiled.groupindex)
    if missing:
        raise BenchmarkError(
            f"log_pattern lacks the named group(s) {sorted(missing)}; e.g. "
            r"'step (?P<step>\d+) .*step_time_ms (?P<step_time_ms>[0-9.]+)'"
        )
    return compiled


def parse_step_log(lines: Iterable[str], pattern: re.Pattern[str]) -> list[tuple[int, float]]:
    """``(step, step_time_ms)`` for every matching line, in log order; unparsable numbers are skipped."""
    out: list[tuple[int, float]] = []
    for line in lines:
        m = pattern.search(line)
        if m is None:
            continue
        try:
            out.append((int(m.group("step")), float(m.group("step_time_ms"))))
        except ValueError:
            continue
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
