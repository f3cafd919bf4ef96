"""The step-series artifact of a benchmark record: what a later comparison resamples.

``{"schema": "perfgate.benchmark.series", "version": 1, "windows": [...]}``; each window holds the
host seconds per step of its longest rank (they sum to the window's elapsed time), the global samples
and tokens per step (or null), the slowest rank and every rank's step times in milliseconds.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec

from perfgate.benchmarking.comparing.aggregate import WindowSummary
from perfgate.benchmarking.comparing.compare import WindowSample
from perfgate.benchmarking.errors import BenchmarkError

__all__ = ["SERIES_NAME", "SERIES_SCHEMA", "samples_from_series", "series_document"]

SERIES_SCHEMA = "perfgate.benchmark.series"
SERIES_NAME = "step_series.json"


def series_document(windows: Sequence[tuple[int, WindowSummary]]) -> dict[str, Any]:
    """The artifact for ``(launch index, window)`` pairs."""
    return {
        "schema": SERIES_SCHEMA,
        "version": 1,
        "windows": [
            {
                "launch": launch,
                "index": w.index,
                "host_step_s": w.host_step_s,
                "samples_per_step": w.samples_per_step,
                "tokens_per_step": w.tokens_per_step,
                "slowest_rank": w.slowest_rank,
                "step_ms_by_rank": {str(r.rank): r.step_ms for r in w.ranks},
            }
            for launch, w in windows
        ],
    }


class _Window(msgspec.Struct):
    host_step_s: list[float]
    launch: int = 0
    samples_per_step: list[float] | None = None
    tokens_per_step: list[float] | None = None


class _Series(msgspec.Struct):
    schema: str
    version: int
    windows: list[_Window]


def samples_from_series(data: bytes, source: str, launch_prefix: str = "") -> list[WindowSample]:
    """Windows of a series artifact as comparison samples, tagged ``<launch_prefix><launch index>``.

    Raises:
        BenchmarkError: the artifact is not a step series of a known version.
    """
    try:
        doc = msgspec.json.decode(data, type=_Series)
    except msgspec.DecodeError as exc:
        raise BenchmarkError(f"{source} is not a step series: {exc}") from exc
    if doc.schema != SERIES_SCHEMA or doc.version != 1:
        raise BenchmarkError(
            f"{source} has schema {doc.schema!r} v{doc.version}, expected {SERIES_SCHEMA!r} v1"
        )
    return [
        WindowSample(w.host_step_s, w.samples_per_step, w.tokens_per_step, f"{launch_prefix}{w.launch}")
        for w in doc.windows
    ]
