"""Diagnosis: on CPU jobs with a planted bottleneck the top finding names it; on real traces it is sane.

The planted traces are tiny CPU training jobs profiled with torch.profiler (see
tests/fixtures/traces/planted/make_planted.py for how each was made and which wall it plants).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from perfgate.traces import analyze_trace, analyze_traces
from perfgate.traces.diagnosis.diagnose import THRESHOLDS

PLANTED = Path(__file__).parent / "fixtures" / "traces" / "planted"


def planted(name: str, ranks: int = 1) -> list[Path]:
    return [PLANTED / f"{name}_rank{r}.json.gz" for r in range(ranks)]


@pytest.mark.parametrize(
    ("scenario", "ranks", "wall", "rank"),
    [
        ("slow_loader", 1, "input_pipeline", 0),
        # A per-element .item() loop on CPU: the Python loop around the calls is the wall, not the calls
        # (their own time, the host's wait, is a smaller synchronization finding).
        ("item_sync", 1, "host_overhead", 0),
        ("tiny_ops", 1, "host_overhead", 0),
        ("eval_in_step", 1, "evaluation_in_step", 0),
        ("ddp_allreduce", 2, "exposed_communication", None),
        ("slow_rank", 2, "rank_imbalance", 1),
    ],
)
def test_the_top_finding_names_the_planted_wall(
    scenario: str, ranks: int, wall: str, rank: int | None
) -> None:
    report = analyze_traces(planted(scenario, ranks))
    top = report.findings[0]
    assert top.wall == wall, [(f.wall, f.share_of_step) for f in report.findings]
    if rank is not None:
        assert top.rank == rank
    assert top.candidate and top.guard and top.confidence_reason and top.summary
    # The time at stake is an upper bound inside the step, and it is what the share reports.
    assert top.time_at_stake_us > 0 and 0 < top.share_of_step <= 1.0


def test_the_data_wait_finding_carries_its_figures_and_events() -> None:
    (f, *_) = analyze_traces(planted("slow_loader")).findings
    assert f.figures["share"] >= THRESHOLDS["input_pipeline"]
    assert f.time_at_stake_us == pytest.approx(f.figures["data_loading_us_per_step"])
    assert any("DataLoader" in e for e in f.events) and f.confidence == "high"
    assert "num_workers" in f.candidate and "audit_samples" in f.guard


def test_a_slow_rank_is_not_mistaken_for_slow_communication() -> None:
    findings = analyze_traces(planted("slow_rank", 2)).findings
    imbalance = next(f for f in findings if f.wall == "rank_imbalance")
    comm = [f for f in findings if f.wall == "exposed_communication"]
    # Rank 0 waits ~65% of its step for rank 1; only the wait every rank shares is communication.
    assert all(f.time_at_stake_us < imbalance.time_at_stake_us for f in comm)
    assert imbalance.figures["busy_us_rank1"] > imbalance.figures["busy_us_rank0"]


def test_findings_on_the_real_traces_stay_inside_the_step(hta_traces: Path) -> None:
    # The traces under 1.2 MB (the larger ones add seconds and no new kind of trace).
    for path in sorted(p for p in hta_traces.glob("*.json.gz") if p.stat().st_size < 1_200_000):
        for f in analyze_traces([path]).findings:
            assert f.time_at_stake_us >= 0 and f.share_of_step <= 1.0 + 1e-9, (path.name, f)


def test_real_traces_name_their_known_walls(hta_traces: Path) -> None:
    # A toy model on an MI250: the device is idle 98% of its span, waiting for launches.
    amd = analyze_traces([hta_traces / "amd_trace_mi250_minitoy_train_ROCm6_2_kineto.json.gz"])
    assert amd.findings[0].wall == "host_overhead" and amd.findings[0].confidence == "high"
    # A 2-rank DDP ResNet step on A100s: 77% device idle behind late launches.
    nccl = analyze_trace(hta_traces / "nccl_parser_config_nccl_data.json.gz")
    assert nccl.idle is not None and nccl.idle.host_wait_us > 0.9 * nccl.idle.idle_us
    # The idle breakdown partitions device idle time (streams pooled).
    assert nccl.idle.idle_us == pytest.approx(nccl.idle_us, rel=1e-6)


def test_the_lightweight_critical_path_partitions_each_step_and_names_the_side(hta_traces: Path) -> None:
    # The MI250 toy step waits on launches: the host is on the critical path.
    amd = analyze_trace(hta_traces / "amd_trace_mi250_minitoy_train_ROCm6_2_kineto.json.gz").idle
    assert amd is not None and amd.steps_checked > 0 and amd.bound == "host"
    assert amd.host_bound_us > 0.5 * amd.steps_span_us
    for path in sorted(p for p in hta_traces.glob("*.json.gz") if p.stat().st_size < 1_200_000):
        for rank in analyze_traces([path]).ranks:
            idle = rank.idle
            if idle is None or not idle.steps_checked:
                continue
            parts = idle.device_bound_us + idle.host_bound_us + idle.other_wait_us
            assert parts == pytest.approx(idle.steps_span_us, rel=1e-6, abs=1e-3), path.name
            assert min(idle.device_bound_us, idle.host_bound_us, idle.other_wait_us) >= 0, path.name
            assert idle.bound in ("host", "device", "mixed"), path.name


def test_the_diff_of_dataloader_workers_0_to_2_shows_the_change_where_it_happened() -> None:
    from perfgate.traces import AnalysisOptions
    from perfgate.traces.diagnosis.diff import diff_profiles

    options = AnalysisOptions(top_k=30)
    before = analyze_traces(planted("slow_loader"), options)
    after = analyze_traces(planted("slow_loader_workers"), options)
    d = diff_profiles(before.ranks, after.ranks, before.findings, after.findings)
    # The biggest host-phase change is the DataLoader wait, and it went down.
    assert d.phases[0].name == "data_loading" and d.phases[0].delta < 0
    assert d.step.delta < 0
    # The single-process iterator vanished and the multi-process one appeared.
    assert any("_SingleProcessDataLoaderIter" in o for o in d.vanished_ops)
    assert any("_MultiProcessingDataLoaderIter" in o for o in d.new_ops)
    wall = next(r for r in d.walls if r.name == "input_pipeline")
    assert wall.delta < 0 and any("data_loading" in line for line in d.summary)


def test_the_diff_of_two_real_traces_finds_the_added_sync_and_copies(hta_traces: Path) -> None:
    from perfgate.traces.diagnosis.diff import diff_profiles

    control = analyze_traces([hta_traces / "trace_diff_control_control.json.gz"])
    test = analyze_traces([hta_traces / "trace_diff_test_test.json.gz"])
    d = diff_profiles(control.ranks, test.ranks, control.findings, test.findings)
    assert d.step.delta > 0 and d.phases[0].name == "sync" and d.phases[0].delta > 0
    assert {r.name for r in d.device} == {"idle", "compute", "communication", "memory"}
    assert d.new_kernels and d.vanished_kernels


def test_frequent_kernel_sequences_repeat_and_carry_their_share(hta_traces: Path) -> None:
    p = analyze_trace(hta_traces / "nccl_parser_config_nccl_data.json.gz")
    assert p.kernel_sequences
    times = [s.time_us for s in p.kernel_sequences]
    assert times == sorted(times, reverse=True)
    for s in p.kernel_sequences:
        assert 2 <= len(s.kernels) <= 3 and s.count >= 2 and 0 < s.share <= 1
    # A CPU-only trace has no device sequences.
    assert analyze_trace(planted("tiny_ops")[0]).kernel_sequences == []
