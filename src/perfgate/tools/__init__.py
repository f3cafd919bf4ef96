"""The ordered tool registry: the server registers exactly these, in this order."""

from __future__ import annotations

from perfgate.tools import (
    analyze_trace,
    audit_samples,
    benchmark_run,
    check_training_health,
    collect_env,
    compare_benchmarks,
    compare_tensors,
    compute_mfu,
    estimate_flops,
    import_benchmark,
    plan_parallel_layout,
    profile_segment,
    record_decision,
    run_benchmark_window,
)
from perfgate.tools._spec import AnySpec, ToolSpec

__all__ = ["REGISTRY", "ToolSpec", "registered_specs"]

REGISTRY: tuple[AnySpec, ...] = (
    collect_env.SPEC,
    run_benchmark_window.SPEC,
    benchmark_run.SPEC,
    import_benchmark.SPEC,
    compare_benchmarks.SPEC,
    check_training_health.SPEC,
    profile_segment.SPEC,
    analyze_trace.SPEC,
    estimate_flops.SPEC,
    compute_mfu.SPEC,
    compare_tensors.SPEC,
    audit_samples.SPEC,
    plan_parallel_layout.SPEC,
    record_decision.SPEC,
)


def registered_specs(read_only: bool) -> list[AnySpec]:
    """The specs a server exposes: read-only servers drop tools that run commands or write decisions."""
    return [s for s in REGISTRY if not (read_only and (s.runs_commands or s.writes))]
