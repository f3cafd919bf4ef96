"""Pacing helper shared by the examples: hold a loop to a known period per step."""

from __future__ import annotations

import time

__all__ = ["Pacer"]

# Sleeping wakes up late by tens to hundreds of microseconds; spinning the last stretch keeps each
# period within a few microseconds of its target while leaving most of the period idle.
_SPIN_S = 0.0015


class Pacer:
    """Make consecutive ``wait()`` calls return ``period_ms`` apart (absolute schedule, no drift)."""

    def __init__(self, period_ms: float) -> None:
        self.period_s = period_ms / 1000.0
        self._deadline: float | None = None

    def wait(self) -> None:
        if self.period_s <= 0:
            return
        now = time.perf_counter()
        if self._deadline is None:
            self._deadline = now + self.period_s
        else:
            self._deadline += self.period_s
            if self._deadline < now:  # fell behind (host contention): restart the schedule
                self._deadline = now
        while True:
            remaining = self._deadline - time.perf_counter()
            if remaining <= 0:
                return
            if remaining > _SPIN_S:
                time.sleep(remaining - _SPIN_S)
