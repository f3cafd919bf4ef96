"""Per-op efficiency from recorded shapes: FLOPs from "Input Dims", time from the launched kernels, peaks
only from the trace's own device."""

from __future__ import annotations

from pathlib import Path

import pytest

from perfgate.hardware.peaks import lookup_peak
from perfgate.traces import analyze_trace, combine
from perfgate.traces.analyses.efficiency import op_efficiency
from perfgate.traces.analyze import AnalysisOptions, load_table
from perfgate.traces.models import OpEfficiency, OpEfficiencySummary
from perfgate.traces.reading.prepare import prepare

PLANTED = Path(__file__).parent / "fixtures" / "traces" / "planted"


def _shaped(hta_traces: Path) -> Path:
    path = hta_traces / "trace_diff_control_control.json.gz"
    if not path.is_file():
        pytest.skip("the shared HTA trace with recorded shapes is absent")
    return path


def test_real_gemms_get_achieved_tflops_but_no_borrowed_peak(hta_traces: Path) -> None:
    eff = analyze_trace(_shaped(hta_traces)).op_efficiency
    assert eff is not None and eff.basis.startswith("device time")
    gemm = {o.op: o for o in eff.ops if o.kind == "gemm"}
    assert {"aten::mm", "aten::addmm"} <= set(gemm)
    mm = gemm["aten::mm"]
    assert mm.count > 100 and mm.time_us > 0 and mm.flops > 1e11
    assert mm.achieved_tflops == pytest.approx(mm.flops / mm.time_us / 1e6)
    assert mm.intensity is not None and mm.intensity > 10
    # "A100-PG509-200" is not a row of the peak table: no peak, and the reason says so.
    assert all(o.peak_tflops is None and o.efficiency is None for o in eff.ops)
    assert any("not in the peak table" in r for r in eff.peak_unknown)
    copies = [o for o in eff.ops if o.kind == "copy"]
    assert copies and all((o.achieved_gbps or 0) > 0 and o.achieved_tflops is None for o in copies)


def test_a_device_in_the_table_gets_its_own_peak(hta_traces: Path) -> None:
    table, _, _ = load_table(_shaped(hta_traces), AnalysisOptions())
    eff = op_efficiency(prepare(table), "NVIDIA H100 SXM", True)
    assert eff is not None and not eff.peak_unknown
    mm = next(o for o in eff.ops if o.op == "aten::mm")
    peak, row = lookup_peak("NVIDIA H100 SXM", "fp32")
    assert row.name == "NVIDIA H100 SXM" and mm.precision == "fp32" and mm.peak_tflops == peak
    assert mm.efficiency == pytest.approx((mm.achieved_tflops or 0) / peak)


def _with_ops(ops: list[OpEfficiency]):
    profiles = [analyze_trace(PLANTED / "tiny_ops_rank0.json.gz")]
    profiles[0].op_efficiency = OpEfficiencySummary(
        basis="recorded", device="NVIDIA H100 SXM", ops=ops, peak_unknown=[]
    )
    return combine(profiles)


def _op(intensity: float, time_us: float, tflops: float) -> OpEfficiency:
    return OpEfficiency(op="aten::mm", kind="gemm", precision="bf16", count=10, time_us=time_us,
                        flops=tflops * time_us * 1e6, bytes=tflops * time_us * 1e6 / intensity,
                        achieved_tflops=tflops, achieved_gbps=None, intensity=intensity, peak_tflops=989.0,
                        efficiency=tflops / 989.0)  # fmt: skip


def test_inefficient_gemms_are_told_apart_by_arithmetic_intensity() -> None:
    base = combine([analyze_trace(PLANTED / "tiny_ops_rank0.json.gz")])
    steps = base.ranks[0].steps
    assert steps is not None
    step = base.ranks[0].host.step_us if base.ranks[0].host else steps.mean_us
    big = step * steps.count  # GEMM time over the window: the whole step, every step
    compute = _with_ops([_op(intensity=400.0, time_us=big, tflops=100.0)])
    f = next(f for f in compute.findings if f.wall == "compute_efficiency")
    assert "compute-bound but inefficient" in f.summary and f.figures["peak_tflops"] == pytest.approx(989.0)
    # Time at stake: the time over the time the same FLOPs take at peak.
    assert f.time_at_stake_us == pytest.approx(min(step * (1 - 100.0 / 989.0), step), rel=1e-3)
    memory = _with_ops([_op(intensity=8.0, time_us=big, tflops=100.0)])
    assert "memory-bound" in next(f for f in memory.findings if f.wall == "memory_bound").summary
    efficient = _with_ops([_op(intensity=400.0, time_us=big, tflops=800.0)])
    assert not any("TFLOP/s achieved" in f.summary for f in efficient.findings)


def test_a_cpu_capture_with_record_shapes_counts_gemm_flops_exactly(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    from torch.profiler import ProfilerActivity, profile

    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 16))
    x = torch.randn(8, 32)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        for _ in range(3):
            model(x).sum().backward()
    out = tmp_path / "shapes.json"
    prof.export_chrome_trace(str(out))
    eff = analyze_trace(out).op_efficiency
    assert eff is not None and eff.basis.startswith("CPU op duration")
    addmm = next(o for o in eff.ops if o.op == "aten::addmm")
    # Forward: two Linear layers, 3 iterations: 2 * 8 * (32*64 + 64*16) * 3 FLOPs.
    assert addmm.count == 6 and addmm.flops == 2 * 8 * (32 * 64 + 64 * 16) * 3
    assert addmm.precision == "fp32" and addmm.peak_tflops is None
    assert any("CPU-only" in r for r in eff.peak_unknown)
    # Backward GEMMs are plain mm ops; none is counted twice through aten::linear or aten::matmul.
    assert {o.op for o in eff.ops} <= {"aten::addmm", "aten::mm", "aten::copy_"}
    assert next(o for o in eff.ops if o.op == "aten::mm").flops > 0
