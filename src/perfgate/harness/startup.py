"""Name the lines that start-up spends its time on: a stack sampler from launch to the first training step.

A job whose start-up dominates (a slow tokenization, a dataset built in Python) was reported as one number.
`StartupSampler` is a daemon thread that, every `INTERVAL_S`, reads the main thread's current frame
(``sys._current_frames``: no signal, no tracer, nothing the script can see) and counts the innermost frame
of the user's own code on its stack (`perfgate.harness.line_ranges.loop_frame`: outside torch, perfgate, the
standard library and installed packages), so an ``import torch`` counts at the script's import line and a
``time.sleep`` at the line that sleeps. It stops at the first training forward or step (the end of
start-up as `perfgate.benchmarking.runs.job` reads it); the window's record carries the `TOP_LINES` lines with
the most time. Memory is bounded: at most `MAX_LINES` distinct lines are counted, the rest as other.
"""

from __future__ import annotations

import sys
import threading
import time
from collections import Counter
from typing import Any

from perfgate.harness.line_ranges import loop_frame

__all__ = ["INTERVAL_S", "MAX_LINES", "TOP_LINES", "StartupSampler"]

INTERVAL_S = 0.005
"""Seconds between two samples of the main thread's stack."""
MAX_LINES = 2000
"""Distinct lines counted at most; time at further lines counts as ``other``."""
TOP_LINES = 8
"""Lines the record keeps, most time first."""


class StartupSampler:
    """Samples the main thread's innermost user line until `stop`; each sample stands for the time since
    the one before (a thread holding the GIL delays the sampler: counts alone would favour lines that
    release it, such as a sleep, over pure Python loops)."""

    def __init__(self) -> None:
        self._main = threading.main_thread().ident
        self._ns: Counter[tuple[str, int, str]] = Counter()
        self._samples: Counter[tuple[str, int, str]] = Counter()
        self.samples = 0
        self.outside_ns = 0
        """Time at no user frame (the interpreter's, perfgate's and libraries' own start-up)."""
        self.other_ns = 0
        self._stop = threading.Event()
        self._started_ns = 0
        self._stopped_ns = 0
        self._thread = threading.Thread(target=self._run, name="perfgate-startup", daemon=True)
        self._launcher: set[str] = set()

    def start(self) -> None:
        """Sample from now on; the files on the caller's stack (the launcher's entry) are not the user's."""
        frame = sys._getframe(1)  # pyright: ignore[reportPrivateUsage] -- the launcher's own frames
        while frame is not None:
            self._launcher.add(frame.f_code.co_filename)
            frame = frame.f_back
        self._started_ns = time.perf_counter_ns()
        self._thread.start()

    def stop(self) -> None:
        """End sampling (idempotent; returns at once, the thread ends at its next wake-up)."""
        if not self._stop.is_set():
            self._stopped_ns = time.perf_counter_ns()
            self._stop.set()

    def _run(self) -> None:
        last = self._started_ns
        while not self._stop.wait(INTERVAL_S):
            frame = sys._current_frames().get(self._main or 0)  # pyright: ignore[reportPrivateUsage] -- the main thread's frame from another thread
            now = time.perf_counter_ns()
            span, last = now - last, now
            if frame is None:
                continue
            user = loop_frame(frame)
            del frame
            if user is not None and user.f_code.co_filename in self._launcher:
                user = None
            self.samples += 1
            if user is None:
                self.outside_ns += span
                continue
            key = (user.f_code.co_filename, user.f_lineno, user.f_code.co_name)
            if key in self._ns or len(self._ns) < MAX_LINES:
                self._ns[key] += span
                self._samples[key] += 1
            else:
                self.other_ns += span

    def describe(self) -> dict[str, Any]:
        """The record's ``startup`` entry: the sampled span, the samples, the lines with the most time."""
        end = self._stopped_ns or time.perf_counter_ns()
        return {
            "interval_ms": INTERVAL_S * 1e3,
            "sampled_ns": max(0, end - self._started_ns) if self._started_ns else 0,
            "samples": self.samples,
            "outside_user_code_ns": self.outside_ns,
            "other_ns": self.other_ns,
            "lines": [
                {
                    "file": file,
                    "line": line,
                    "function": func,
                    "ns": ns,
                    "samples": self._samples[(file, line, func)],
                }
                for (file, line, func), ns in self._ns.most_common(TOP_LINES)
            ],
        }
