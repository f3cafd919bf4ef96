"""MFU below the tool: bucket figures from evidence, the peak of the runs' device, the figure and its cautions."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import pytest

from perfgate.evidence import EvidenceState
from perfgate.flops.bucket_sources import BucketEvidenceError, resolve_bucket
from perfgate.flops.utilization import BucketInput, judge_utilization, utilization
from perfgate.hardware.device_peak import RunDevice
from perfgate.hardware.peaks import PeakLookupError
from perfgate.hardware.run_peak import RunRecord, choose_device, choose_precision, resolve_peak, run_record

H100 = "NVIDIA H100 80GB HBM3"


@dataclass
class _Record:
    id: str
    tool: str
    result: dict[str, Any]
    inputs: dict[str, Any] = field(default_factory=dict[str, Any])
    state: EvidenceState = EvidenceState.EXECUTED
    profiled: bool = False


def _loader(*records: _Record) -> Any:
    by_id = {r.id: r for r in records}

    async def load(evidence_id: str) -> Any:
        return by_id[evidence_id]

    return load


def _resolve(load: Any, **bucket: Any) -> tuple[BucketInput, list[str]]:
    args: dict[str, Any] = {
        "name": "b",
        "weight": 1.0,
        "flops_per_step": None,
        "flops_id": None,
        "step_time_s": None,
        "window_id": None,
        "flops_kind": "model",
        "load": load,
    }
    args.update(bucket)

    async def go() -> tuple[BucketInput, list[str]]:
        return await resolve_bucket(**args)

    return anyio.run(go)


# ----------------------------------------------------------------------------- the figure


def test_utilization_is_total_flops_over_total_time_not_a_mean_of_ratios() -> None:
    short = BucketInput("short", flops_per_step=1e15, step_time_s=1.0, weight=3.0)
    long = BucketInput("long", flops_per_step=4e15, step_time_s=8.0, weight=1.0)
    got = utilization([short, long], peak_tflops=1000.0)
    assert (got.total_flops, got.total_time_s) == (7e15, 11.0)
    assert got.achieved_tflops == pytest.approx(7e15 / 11.0 / 1e12)
    assert got.ratio == pytest.approx(got.achieved_tflops / 1000.0)
    assert [b.time_share for b in got.buckets] == pytest.approx([3 / 11, 8 / 11])
    assert got.buckets[0].utilization == pytest.approx(1.0)
    assert (
        utilization([short], None).ratio is None and utilization([short], None).buckets[0].utilization is None
    )


def test_a_figure_above_the_peak_is_withheld_with_the_reason() -> None:
    figures = utilization([BucketInput("b", 2e15, 1.0, 1.0)], peak_tflops=1000.0)
    verdict = judge_utilization(
        figures,
        peak_tflops=1000.0,
        no_peak_reason="-",
        flops_kind="model",
        precision="bf16",
        training_precision=None,
    )
    assert verdict.value is None and verdict.reason is not None
    assert verdict.reason.startswith("achieved 2000 TFLOP/s exceeds the peak 1000")
    assert verdict.warnings == [verdict.reason]


def test_no_peak_gives_the_reason_passed_and_the_cautions_still_apply() -> None:
    figures = utilization([BucketInput("b", 1e12, 1.0, 1.0)], peak_tflops=None)
    verdict = judge_utilization(
        figures,
        peak_tflops=None,
        no_peak_reason="no peak for cpu: probe failed",
        flops_kind="profiler_attributed",
        precision=None,
        training_precision="bf16",
    )
    assert (verdict.value, verdict.reason) == (None, "no peak for cpu: probe failed")
    assert len(verdict.warnings) == 1 and "not MFU" in verdict.warnings[0]


@pytest.mark.parametrize(
    ("training", "denominator", "expected"),
    [
        ("fp8", "bf16", "overstates utilization"),
        ("fp32", "bf16", "could never reach"),
        ("bf16", "bf16", None),
    ],
)
def test_a_denominator_of_another_precision_is_named(
    training: str, denominator: str, expected: str | None
) -> None:
    figures = utilization([BucketInput("b", 5e14, 1.0, 1.0)], peak_tflops=1000.0)
    verdict = judge_utilization(
        figures,
        peak_tflops=1000.0,
        no_peak_reason="-",
        flops_kind="model",
        precision=denominator,
        training_precision=training,
    )
    assert verdict.value == pytest.approx(0.5)
    if expected is None:
        assert verdict.warnings == []
    else:
        assert len(verdict.warnings) == 1 and expected in verdict.warnings[0]


def test_a_model_utilization_under_one_percent_asks_for_per_device_flops() -> None:
    figures = utilization([BucketInput("b", 5e12, 1.0, 1.0)], peak_tflops=1000.0)
    model = judge_utilization(
        figures,
        peak_tflops=1000.0,
        no_peak_reason="-",
        flops_kind="model",
        precision=None,
        training_precision=None,
    )
    hardware = judge_utilization(
        figures,
        peak_tflops=1000.0,
        no_peak_reason="-",
        flops_kind="hardware",
        precision=None,
        training_precision=None,
    )
    assert model.warnings and model.warnings[0].startswith("utilization under 1%")
    assert hardware.warnings == []


# ----------------------------------------------------------------------------- bucket sources


def _window(evidence_id: str = "w1", tool: str = "run_benchmark_window", **result: Any) -> _Record:
    base: dict[str, Any] = {"throughput": {"steps_per_s": 4.0, "tokens_per_s": 4096.0}, "world_size": 8}
    base.update(result)
    return _Record(evidence_id, tool, base)


def _estimate(inputs: dict[str, Any] | None = None, **result: Any) -> _Record:
    return _Record("f1", "estimate_flops", result, inputs or {})


def test_a_window_gives_the_step_time_and_an_estimate_the_per_device_flops() -> None:
    load = _loader(
        _window(), _estimate({"tokens_per_step": 1024}, model_flops_per_step_per_device=3e14, devices=8)
    )
    bucket, notes = _resolve(load, window_id="w1", flops_id="f1", weight=2.0)
    assert bucket == BucketInput("b", 3e14, 0.25, 2.0, "f1", "w1")
    assert notes == []


def test_whole_batch_flops_are_split_over_the_windows_world_size_and_said_so() -> None:
    load = _loader(_window(tool="import_benchmark"), _estimate(hardware_flops_per_step=8e15))
    bucket, notes = _resolve(load, window_id="w1", flops_id="f1", flops_kind="hardware")
    assert bucket.flops_per_step == 1e15
    assert "imported from a log" in notes[0]
    assert notes[1] == "bucket 'b': whole-batch FLOPs divided by the window's world size 8"


@pytest.mark.parametrize(
    ("window", "estimate", "message"),
    [
        (_window(tool="analyze_trace"), None, "is a analyze_trace record"),
        (_window(throughput={}), None, "has no step rate"),
        (
            _window(),
            _estimate(model_flops_per_step_per_device=1e14, devices=4),
            "spreads a step over 4 devices",
        ),
        (
            _window(),
            _estimate({"tokens_per_step": 2048}, model_flops_per_step_per_device=1e14),
            "different steps",
        ),
        (_window(world_size=None), _estimate(model_flops_per_step=1e15), "no window world size is known"),
    ],
)
def test_evidence_that_cannot_give_or_contradicts_a_bucket_is_refused(
    window: _Record, estimate: _Record | None, message: str
) -> None:
    load = _loader(window, *([estimate] if estimate else []))
    with pytest.raises(BucketEvidenceError, match=message):
        _resolve(
            load,
            window_id="w1",
            flops_id="f1" if estimate else None,
            flops_per_step=None if estimate else 1e12,
        )


def test_profiled_or_failed_windows_are_never_mfu_evidence() -> None:
    profiled = _window()
    profiled.profiled = True
    with pytest.raises(BucketEvidenceError, match="was profiled"):
        _resolve(_loader(profiled), window_id="w1", flops_per_step=1e12)
    failed = _window()
    failed.state = EvidenceState.FAILED
    with pytest.raises(BucketEvidenceError, match="is failed"):
        _resolve(_loader(failed), window_id="w1", flops_per_step=1e12)


# ----------------------------------------------------------------------------- the peak


def _run(evidence_id: str, kind: str | None, name: str | None, precision: object = "bf16") -> RunRecord:
    return RunRecord(evidence_id, RunDevice(kind=kind, name=name), precision)


def test_a_window_record_says_its_device_host_threads_and_precision() -> None:
    record: Any = _Record(
        "w1",
        "run_benchmark_window",
        {
            "environment_fingerprint": {"device_kind": "cpu", "num_threads": "3", "torch_version": "2.5"},
            "ranks": [{"hostname": "node-1"}],
        },
        {"contract": {"invariants": {"precision": "amp_bf16"}}},
    )
    got = run_record(record)
    assert got.device == RunDevice(kind="cpu", name=None, hostname="node-1", threads=3, torch_version="2.5")
    assert (got.evidence_id, got.precision) == ("w1", "amp_bf16")


def test_the_precision_is_the_given_one_else_the_one_all_runs_declare() -> None:
    assert choose_precision("fp32", [_run("a", "cuda", H100, "bf16")]) == "fp32"
    assert (
        choose_precision(None, [_run("a", "cuda", H100, "amp_bf16"), _run("b", "cuda", H100, "bf16")])
        == "bf16"
    )
    with pytest.raises(PeakLookupError, match="declare bf16, fp16"):
        choose_precision(None, [_run("a", "cuda", H100, "bf16"), _run("b", "cuda", H100, "fp16")])
    with pytest.raises(PeakLookupError, match="declare nothing"):
        choose_precision(None, [])


def test_the_device_is_the_runs_and_a_named_one_must_be_it() -> None:
    runs = [_run("a", "cuda", H100)]
    assert choose_device(None, runs) == runs[0].device
    assert choose_device("H100 SXM", runs).name == "H100 SXM"
    with pytest.raises(PeakLookupError, match=r"window a ran on cuda .*not 'A100 SXM'"):
        choose_device("A100 SXM", runs)
    with pytest.raises(PeakLookupError, match="is a CPU but window a ran on cuda"):
        choose_device("cpu", runs)
    with pytest.raises(PeakLookupError, match="ran on different devices"):
        choose_device(None, [*runs, _run("b", "cuda", "NVIDIA A100-SXM4-80GB")])
    with pytest.raises(PeakLookupError, match="record no device"):
        choose_device(None, [_run("a", None, None)])
    assert choose_device("H100", []) == RunDevice(kind=None, name="H100")


def test_the_peak_comes_from_the_table_for_the_runs_device(tmp_path: Path) -> None:
    choice = resolve_peak(
        peak_tflops=None, device=None, precision=None, runs=[_run("a", "cuda", H100)], state_dir=tmp_path
    )
    assert (choice.peak.tflops, choice.peak.basis, choice.precision) == (989.4, "datasheet", "bf16")
    assert choice.warnings == []


def test_an_explicit_peak_wins_and_is_warned_when_the_table_differs(tmp_path: Path) -> None:
    choice = resolve_peak(peak_tflops=900.0, device="H100 SXM", precision="bf16", runs=[], state_dir=tmp_path)
    assert (choice.peak.tflops, choice.peak.basis) == (900.0, "explicit")
    assert len(choice.warnings) == 1 and "differs from the table's 989.4" in choice.warnings[0]
    same = resolve_peak(peak_tflops=989.4, device="H100 SXM", precision="bf16", runs=[], state_dir=tmp_path)
    assert same.warnings == []


def test_an_unknown_named_device_points_at_the_measured_cpu_peak(tmp_path: Path) -> None:
    with pytest.raises(PeakLookupError, match="For this machine's CPU pass device='cpu'"):
        resolve_peak(
            peak_tflops=None, device="Frobnicator 9000", precision="bf16", runs=[], state_dir=tmp_path
        )
