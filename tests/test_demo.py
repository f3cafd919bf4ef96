"""`perfgate demo` end to end: real tools, real CPU training, a kept decision the ledger supports."""

from __future__ import annotations

from pathlib import Path

import pytest

from perfgate.evidence import Ledger

pytest.importorskip("torch")


@pytest.mark.slow
def test_the_demo_keeps_a_real_speedup_with_every_gate_passed(tmp_path: Path) -> None:
    from perfgate.demo import run_demo

    lines: list[str] = []
    result = run_demo(tmp_path / "demo", say=lines.append)
    assert result.accepted, "\n".join(lines)
    assert result.speedup is not None
    assert result.speedup > 1.0
    assert set(result.evidence) == {
        "environment",
        "baseline",
        "profile",
        "candidate",
        "comparison",
        "correctness",
        "audit",
    }
    ledger = Ledger(result.workspace)
    assert ledger.verify().ok
    profile = ledger.get(result.evidence["profile"])
    assert profile is not None
    assert profile.profiled
    assert "KEEP" in result.decisions_md
    assert result.experiment_id in result.decisions_md
    printed = "\n".join(lines)
    for tool in (
        "collect_env",
        "run_benchmark_window",
        "profile_segment",
        "compare_benchmarks",
        "compare_tensors",
        "audit_samples",
        "record_decision",
    ):
        assert f"-> {tool}(" in printed
