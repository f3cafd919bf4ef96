"""Server-side benchmarking: read harness records, summarise windows, check contracts, compare A/B.

Pure functions over data; the tools ``run_benchmark_window`` and ``compare_benchmarks`` wrap them.
"""

from perfgate.benchmarking.aggregate import (
    RankWindow,
    RunSummary,
    WindowSummary,
    summarize_run,
    summarize_window,
)
from perfgate.benchmarking.compare import Comparison, WindowSample, compare_windows, decide
from perfgate.benchmarking.contract import Contract, ContractDiff, check_contract, diff_contracts
from perfgate.benchmarking.errors import BenchmarkError, ContractError, RecordError
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
