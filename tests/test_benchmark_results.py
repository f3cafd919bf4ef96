"""Windows, ranks, nodes and the trained model as benchmark records report them
(`perfgate.benchmarking.comparing.results`), and the run's tensor dumps (`perfgate.benchmarking.runs.dumps`)."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from _window_records import rank_record
from perfgate.benchmarking import summarize_run, summarize_window
from perfgate.benchmarking.comparing.results import (
    attach_nodes,
    model_facts,
    rank_results,
    run_throughput,
    window_result,
)
from perfgate.benchmarking.reading.records import DeviceRecord, ModelRecord, RankRecord, TensorDumpRecord
from perfgate.benchmarking.runs.dumps import tensor_dumps


def _with_peak(record: RankRecord, peak: int | None) -> RankRecord:
    return msgspec.structs.replace(
        record, windows=[msgspec.structs.replace(w, peak_allocated_bytes=peak) for w in record.windows]
    )


def test_each_rank_pools_its_steps_over_the_windows_and_keeps_its_highest_peak() -> None:
    ranks = [
        _with_peak(rank_record(0, world=2, windows=2), 100),
        _with_peak(rank_record(1, world=2, windows=2), None),
    ]
    windows = [summarize_window(ranks, k) for k in range(2)]
    r0, r1 = rank_results(windows)
    assert (r0.rank, r1.rank) == (0, 1)
    assert r0.steps_measured == 8 and r0.elapsed_s == pytest.approx(0.08)
    assert r0.median_step_ms == pytest.approx(10.0) and r0.iqr_ratio == pytest.approx(0.0)
    assert (r0.peak_allocated_bytes, r1.peak_allocated_bytes) == (100, None)
    assert r0.data_wait_fraction == 0.0 and r0.step_time_source == "host"


def test_a_window_row_carries_its_launch_and_figures() -> None:
    w = summarize_window([rank_record(samples=8)], 0)
    row = window_result(3, w)
    assert (row.launch, row.index, row.steps) == (3, 0, 4)
    assert row.median_step_ms == pytest.approx(10.0) and row.samples_per_s == pytest.approx(800.0)
    throughput = run_throughput(summarize_run([w]))
    assert throughput.samples_per_s == pytest.approx(800.0) and throughput.steps_per_s == pytest.approx(100.0)


def test_node_facts_come_from_the_first_launch_and_unknown_keys_are_dropped() -> None:
    record = rank_record(
        hostname="node-1",
        node={"slurm_job_id": "42", "cpus": 16, "network": ["eth0"], "unknown_key": "x", "slurm_node": None},
        device=DeviceRecord(kind="cuda", name="H100"),
    )
    (row,) = rank_results([summarize_window([record], 0)])
    attach_nodes([row], [record])
    assert row.hostname == "node-1" and row.node is not None
    assert (row.node.slurm_job_id, row.node.cpus, row.node.network) == ("42", 16, ["eth0"])
    assert row.node.device == "cuda H100" and row.node.slurm_node is None


def test_model_facts_are_absent_when_no_training_forward_was_seen() -> None:
    assert model_facts(None) is None and model_facts(rank_record()) is None
    seen = rank_record(
        model=ModelRecord(name="GPT", parameters=10, trainable_parameters=8, structure="a" * 32)
    )
    facts = model_facts(seen)
    assert facts is not None and (facts.name, facts.parameters, facts.trainable_parameters) == ("GPT", 10, 8)


def test_dumps_are_listed_relative_to_the_workspace_and_only_with_a_digest(tmp_path: Path) -> None:
    inside = TensorDumpRecord(
        path=str(tmp_path / "caps" / "a.safetensors"), size_bytes=5, step=2, digest="blake3:" + "0" * 64
    )
    outside = TensorDumpRecord(path="/elsewhere/b.safetensors", size_bytes=6, step=2, sha256="1" * 64)
    undigested = TensorDumpRecord(path=str(tmp_path / "c.safetensors"), size_bytes=7)
    dumps = tensor_dumps(tmp_path, 1, [rank_record(tensor_dumps=[inside, outside, undigested])])
    assert [(d.path, d.digest, d.launch, d.rank, d.step) for d in dumps] == [
        ("caps/a.safetensors", "blake3:" + "0" * 64, 1, 0, 2),
        ("/elsewhere/b.safetensors", "sha256:" + "1" * 64, 1, 0, 2),
    ]
