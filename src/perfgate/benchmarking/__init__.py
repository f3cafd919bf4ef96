"""Server-side benchmarking: read harness records, summarise windows, check contracts, compare A/B.

Functions over data, and `window_run`, which takes a window run from its launches (the caller's) to its
figures; the tools ``run_benchmark_window`` and ``compare_benchmarks`` wrap them.
The modules that need numpy or msgspec (records, statistics, aggregation, the bootstrap) load on first
use, so importing the package (the MCP server does at start-up) stays cheap.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from perfgate.benchmarking.comparing.verdict import decide
from perfgate.benchmarking.errors import BenchmarkError, ContractError, RecordError
from perfgate.benchmarking.workload.contract import Contract, ContractDiff, check_contract, diff_contracts
from perfgate.helpers.lazy import lazy_exports

if TYPE_CHECKING:
    from perfgate.benchmarking.comparing.aggregate import (
        RankWindow,
        RunSummary,
        WindowSummary,
        summarize_run,
        summarize_window,
    )
    from perfgate.benchmarking.comparing.compare import Comparison, WindowSample, compare_windows
    from perfgate.benchmarking.comparing.stats import NOISY_IQR_RATIO, StepStats, step_stats
    from perfgate.benchmarking.reading.records import RankRecord, RecordSet, load_records, read_record

__all__ = [
    "NOISY_IQR_RATIO",
    "BenchmarkError",
    "Comparison",
    "Contract",
    "ContractDiff",
    "ContractError",
    "RankRecord",
    "RankWindow",
    "RecordError",
    "RecordSet",
    "RunSummary",
    "StepStats",
    "WindowSample",
    "WindowSummary",
    "check_contract",
    "compare_windows",
    "decide",
    "diff_contracts",
    "load_records",
    "read_record",
    "step_stats",
    "summarize_run",
    "summarize_window",
]

# Names served lazily: attribute -> module that defines it.
_LAZY: dict[str, str] = {
    "RankWindow": "perfgate.benchmarking.comparing.aggregate",
    "RunSummary": "perfgate.benchmarking.comparing.aggregate",
    "WindowSummary": "perfgate.benchmarking.comparing.aggregate",
    "summarize_run": "perfgate.benchmarking.comparing.aggregate",
    "summarize_window": "perfgate.benchmarking.comparing.aggregate",
    "Comparison": "perfgate.benchmarking.comparing.compare",
    "WindowSample": "perfgate.benchmarking.comparing.compare",
    "compare_windows": "perfgate.benchmarking.comparing.compare",
    "RankRecord": "perfgate.benchmarking.reading.records",
    "RecordSet": "perfgate.benchmarking.reading.records",
    "load_records": "perfgate.benchmarking.reading.records",
    "read_record": "perfgate.benchmarking.reading.records",
    "NOISY_IQR_RATIO": "perfgate.benchmarking.comparing.stats",
    "StepStats": "perfgate.benchmarking.comparing.stats",
    "step_stats": "perfgate.benchmarking.comparing.stats",
}


__getattr__, __dir__ = lazy_exports(__name__, _LAZY, globals())
