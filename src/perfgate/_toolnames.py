"""The names of the tools perfgate ships, in registry order: each a module of `perfgate.tools` defining
``SPEC``. Here, apart from the tools, so the skill's catalog can name a reference page per tool without
importing the tools package."""

from __future__ import annotations

__all__ = ["TOOL_MODULES"]

TOOL_MODULES: tuple[str, ...] = (
    "collect_env",
    "run_benchmark_window",
    "run_benchmark_pair",
    "benchmark_run",
    "import_benchmark",
    "compare_benchmarks",
    "check_training_health",
    "profile_segment",
    "analyze_trace",
    "estimate_flops",
    "compute_mfu",
    "compare_tensors",
    "audit_samples",
    "plan_parallel_layout",
    "record_decision",
)
