"""`perfgate demo` end to end: real tools, real CPU training, a decision the ledger supports.

The real run's verdict depends on the machine's load, so no test here asserts it: test_report's demo
run is checked to end kept or inconclusive, and this run forces the comparison to come out inside
the noise to check the inconclusive path (recorded, explained, not a failure).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from perfgate.evidence import Ledger

pytest.importorskip("torch")


@pytest.mark.slow
@pytest.mark.timeout(1800)  # about 90 s on a quiet 2-core machine, 6-8 min with two CPU burners and more
def test_an_inconclusive_comparison_is_recorded_explained_and_not_a_failure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from perfgate.benchmarking.comparing import compare
    from perfgate.demo import run_demo

    monkeypatch.setattr(compare, "decide", lambda *args, **kwargs: "within_noise")
    lines: list[str] = []
    result = run_demo(tmp_path / "demo", say=lines.append)
    printed = "\n".join(lines)
    assert result.decision == "inconclusive" and result.verdict == "within_noise", printed
    assert not result.accepted
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
    assert profile is not None and profile.profiled
    assert "INCONCLUSIVE" in result.decisions_md
    assert result.experiment_id in result.decisions_md
    # what it would do next, in two lines
    (next_at,) = [i for i, line in enumerate(lines) if "Next:" in line]
    assert len(lines[next_at].strip().splitlines()) == 2
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
    # the parity dump is taken in the warm-up: no window was restarted for it
    assert "dump_tensors ran inside" not in printed
