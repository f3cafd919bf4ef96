"""A profiled segment below the tool: its harness set-up, external capture plans, and what its outcome earns."""

from __future__ import annotations

import gzip
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from perfgate.harness.config import ProfileConfig
from perfgate.traces.diagnosis.segment import (
    annotate_profiles,
    capture_failure,
    keep_trace,
    kept_name,
    samples_per_step_by_rank,
    segment_harness,
    segment_reason,
    segment_state,
    segment_warnings,
)
from perfgate.traces.reading.external import capture_plans


def test_the_harness_measures_one_step_and_traces_on_the_schedule(tmp_path: Path) -> None:
    profile = ProfileConfig(trace_dir=str(tmp_path / "traces"), skip_first=2, wait=1, warmup=1, active=3)
    cfg = segment_harness(tmp_path, profile)
    assert (cfg.record_dir, cfg.warmup_steps, cfg.measure_steps) == (str(tmp_path / "records"), 0, 1)
    assert cfg.profile is profile
    assert segment_reason(profile).startswith(
        "profile_segment: torch.profiler over 3 step(s) after 4 skipped"
    )


def test_captures_are_the_vendors_or_those_installed(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import perfgate.traces.reading.external as external

    monkeypatch.setattr(external.shutil, "which", lambda name: "/usr/bin/ncu" if name == "ncu" else None)
    chosen = capture_plans(["system", "kernel"], "auto", ["python", "train.py"], tmp_path)
    # system: neither installed, so both are prepared; kernel: only the installed one
    assert [p.tool for p in chosen] == ["nsys", "msys", "ncu"]
    mthreads = capture_plans(["kernel"], "mthreads", ["python", "train.py"], tmp_path)
    assert [(p.tool, p.available) for p in mthreads] == [("mcu", False)]
    assert capture_plans([], "auto", ["python"], tmp_path) == []


def test_a_failed_command_or_a_missing_trace_is_no_capture() -> None:
    assert capture_failure(True, "exited 0", traces=2) is None
    assert capture_failure(False, "exited 3", traces=2) == "the training command failed: exited 3"
    missing = capture_failure(True, "exited 0", traces=0)
    assert missing is not None and missing.startswith("the run wrote no trace")


def test_the_state_is_failed_executed_or_only_scaffolded() -> None:
    assert segment_state("boom", analyzed=True) == "failed"
    assert segment_state(None, analyzed=True) == "executed"
    assert segment_state(None, analyzed=False) == "scaffolded"


def _profile(rank: int, flops: Any = None, code: Any = None) -> Any:
    return SimpleNamespace(
        rank=rank, flops=flops, flops_unavailable="no with_flops ops", code=code, host_load=None
    )


def test_profiled_runs_warn_they_are_no_throughput_and_missing_flops_are_named() -> None:
    profiles = [_profile(0), _profile(1)]
    warnings = segment_warnings(["from the report"], profiles, profiled=True, with_flops=True)
    assert warnings[0] == "from the report"
    assert warnings[1].startswith("profiled run: step times include profiler overhead")
    assert warnings[2] == "with_flops=true but no FLOPs came back: no with_flops ops"
    assert segment_warnings([], [_profile(0, flops=1.0)], profiled=False, with_flops=True) == []
    assert segment_warnings([], [], profiled=True, with_flops=True) == []


def test_each_profile_gets_the_host_load_and_its_ranks_samples() -> None:
    with_code = _profile(1, code=SimpleNamespace(samples_per_step=None))
    profiles = [_profile(0), with_code]
    load: Any = object()
    annotate_profiles(profiles, load, {1: 32.0})
    assert all(p.host_load is load for p in profiles)
    assert with_code.code.samples_per_step == 32.0


def test_samples_per_step_is_the_median_of_the_steps_that_counted_any() -> None:
    records: Any = [
        SimpleNamespace(rank=0, steps=SimpleNamespace(samples=[0, 8, 8, 16])),
        SimpleNamespace(rank=1, steps=SimpleNamespace(samples=[0, 0])),
        SimpleNamespace(rank=2, steps=SimpleNamespace(samples=[4, 12])),
    ]
    assert samples_per_step_by_rank(records) == {0: 8.0, 2: 12.0}


def test_traces_are_kept_gzipped_whether_or_not_they_were(tmp_path: Path) -> None:
    plain = tmp_path / "rank0.pt.trace.json"
    plain.write_text('{"traceEvents": []}')
    packed = tmp_path / "rank1.pt.trace.json.gz"
    packed.write_bytes(gzip.compress(b'{"traceEvents": [1]}'))
    assert (kept_name(plain), kept_name(packed)) == ("rank0.pt.trace.json.gz", "rank1.pt.trace.json.gz")
    out = tmp_path / "out"
    out.mkdir()
    keep_trace(plain, out / kept_name(plain))
    keep_trace(packed, out / kept_name(packed))
    assert gzip.decompress((out / "rank0.pt.trace.json.gz").read_bytes()) == b'{"traceEvents": []}'
    assert (out / "rank1.pt.trace.json.gz").read_bytes() == packed.read_bytes()
