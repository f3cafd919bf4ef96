"""Server-side benchmarking: read harness records, summarise windows, check contracts, compare A/B.

Functions over data, and `window_run`, which takes a window run from its launches (the caller's) to its
figures; the tools ``run_benchmark_window`` and ``compare_benchmarks`` wrap them.
The modules that need numpy or msgspec (records, statistics, aggregation, the bootstrap) load on first
use, so importing the package (the MCP server does at start-up) stays cheap.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from perfgate._lazy import lazy_exports
from perfgate.benchmarking.contract import Contract, ContractDiff, check_contract, diff_contracts
from perfgate.benchmarking.errors import BenchmarkError, ContractError, RecordError
from perfgate.benchmarking.verdict import decide

if TYPE_CHECKING:
    from perfgate.benchmarking.aggregate import (
        RankWindow,
        RunSummary,
        WindowSummary,
        summarize_run,
        summarize_window,
    )
    from perfgate.benchmarking.compare import Comparison, WindowSample, compare_windows
    from perfgate.benchmarking.records import RankRecord, RecordSet, load_records, read_record
    from perfgate.benchmarking.stats import NOISY_IQR_RATIO, StepStats, step_stats

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
    "RankWindow": "perfgate.benchmarking.aggregate",
    "RunSummary": "perfgate.benchmarking.aggregate",
    "WindowSummary": "perfgate.benchmarking.aggregate",
    "summarize_run": "perfgate.benchmarking.aggregate",
    "summarize_window": "perfgate.benchmarking.aggregate",
    "Comparison": "perfgate.benchmarking.compare",
    "WindowSample": "perfgate.benchmarking.compare",
    "compare_windows": "perfgate.benchmarking.compare",
    "RankRecord": "perfgate.benchmarking.records",
    "RecordSet": "perfgate.benchmarking.records",
    "load_records": "perfgate.benchmarking.records",
    "read_record": "perfgate.benchmarking.records",
    "NOISY_IQR_RATIO": "perfgate.benchmarking.stats",
    "StepStats": "perfgate.benchmarking.stats",
    "step_stats": "perfgate.benchmarking.stats",
}


__getattr__, __dir__ = lazy_exports(__name__, _LAZY, globals())
