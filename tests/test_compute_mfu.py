"""compute_mfu numerics, called directly (the protocol path is covered in test_protocol)."""

from __future__ import annotations

from pathlib import Path

import pytest

from perfgate.errors import ToolError
from perfgate.evidence import Ledger
from perfgate.hardware.peaks import PRECISIONS, PeakLookupError, device_names, find_device, lookup_peak
from perfgate.serving.runtime import ServerConfig, ToolRuntime
from perfgate.tools.compute_mfu import Bucket, ComputeMfuInput, ComputeMfuOutput, run

pytestmark = pytest.mark.anyio


def _rt(workspace: Path) -> ToolRuntime:
    return ToolRuntime(config=ServerConfig.create(workspace), ledger=Ledger(workspace), tool="compute_mfu")


async def _mfu(workspace: Path, **kwargs: object) -> ComputeMfuOutput:
    return await run(ComputeMfuInput.model_validate(kwargs), _rt(workspace))


async def test_mixed_buckets_aggregate_total_flops_over_total_time(workspace: Path) -> None:
    # 10 steps of 3e14 FLOPs in 1 s and 30 steps of 9e14 FLOPs in 2.5 s:
    # total = 3e15 + 2.7e16 = 3.0e16 FLOPs over 10 + 75 = 85 s -> 352.94 TFLOP/s.
    out = await _mfu(
        workspace,
        buckets=[
            {"name": "short", "flops_per_step": 3e14, "step_time_s": 1.0, "steps": 10},
            {"name": "long", "flops_per_step": 9e14, "step_time_s": 2.5, "steps": 30},
        ],
        flops_kind="model",
        device="H100",
        precision="bf16",
    )
    assert out.achieved_tflops == pytest.approx(3.0e16 / 85 / 1e12)
    assert out.utilization == pytest.approx(3.0e16 / 85 / 1e12 / 989.4)
    # the mean of per-bucket ratios would be (300 + 360) / 2 / 989.4 = 0.3335: not what we report
    mean_of_ratios = (300 + 360) / 2 / 989.4
    assert out.utilization != pytest.approx(mean_of_ratios)
    assert [b.time_share for b in out.buckets] == pytest.approx([10 / 85, 75 / 85])
    assert out.metric == "MFU"
    assert "H100 SXM" in out.peak_source


@pytest.mark.parametrize(
    ("kind", "metric"),
    [("model", "MFU"), ("hardware", "HFU"), ("profiler_attributed", "profiler_attributed_utilization")],
)
async def test_the_metric_is_named_for_the_kind_of_flops(workspace: Path, kind: str, metric: str) -> None:
    out = await _mfu(
        workspace,
        buckets=[Bucket(name="b", flops_per_step=1e14, step_time_s=1.0)],
        flops_kind=kind,
        peak_tflops=400,
    )
    assert out.metric == metric
    assert out.utilization == pytest.approx(0.25)
    assert out.peak_source.startswith("explicit")
    assert any("not MFU" in w for w in out.warnings) == (kind == "profiler_attributed")


async def test_utilization_above_one_is_withheld_with_a_reason(workspace: Path) -> None:
    out = await _mfu(
        workspace,
        buckets=[{"name": "b", "flops_per_step": 5e14, "step_time_s": 1.0}],
        flops_kind="model",
        device="MTT S4000",
        precision="bf16",
    )
    assert out.utilization is None
    assert out.utilization_reason is not None
    assert "exceeds the peak" in out.utilization_reason
    assert out.achieved_tflops == pytest.approx(500.0)


async def test_fp8_run_against_a_bf16_peak_warns(workspace: Path) -> None:
    out = await _mfu(
        workspace,
        buckets=[{"name": "b", "flops_per_step": 5e14, "step_time_s": 1.0}],
        flops_kind="model",
        device="H100",
        precision="bf16",
        training_precision="fp8",
    )
    assert any("fp8" in w and "not as MFU" in w for w in out.warnings)


async def test_an_explicit_peak_that_disagrees_with_the_table_is_flagged(workspace: Path) -> None:
    out = await _mfu(
        workspace,
        buckets=[{"name": "b", "flops_per_step": 1e14, "step_time_s": 1.0}],
        flops_kind="model",
        device="H100",
        precision="bf16",
        peak_tflops=1979,
    )
    assert out.peak_tflops == 1979
    assert any("differs from the table" in w for w in out.warnings)


@pytest.mark.parametrize(
    ("device", "precision", "message"),
    [
        ("A100-PCIE-12GB-imaginary", "bf16", "not in the peak table"),
        ("AMD EPYC 9999 of another machine", "fp32", "pass device='cpu'"),
        ("MTT S5000", "bf16", "unknown to the table"),
        ("B200", "fp32", "unknown to the table"),
        ("MTT S4000", "fp8", "no FP8"),
    ],
)
async def test_unknown_devices_and_cells_are_errors_not_fallbacks(
    workspace: Path, device: str, precision: str, message: str
) -> None:
    with pytest.raises(ToolError, match=message):
        await _mfu(
            workspace,
            buckets=[{"name": "b", "flops_per_step": 1e14, "step_time_s": 1.0}],
            flops_kind="model",
            device=device,
            precision=precision,
        )
    assert Ledger(workspace).records() == []


async def test_duplicate_bucket_names_are_refused(workspace: Path) -> None:
    with pytest.raises(ToolError, match="unique"):
        await _mfu(
            workspace,
            buckets=[{"name": "b", "flops_per_step": 1, "step_time_s": 1.0}] * 2,
            flops_kind="model",
            peak_tflops=1,
        )


def test_every_known_cell_has_a_source_and_a_dense_basis() -> None:
    for name in device_names():
        row = find_device(name)
        assert row.source
        assert "dense" in row.basis
        for precision in PRECISIONS:
            cell = row.peaks.get(precision, "missing")
            assert cell != "missing", f"{name} lacks a {precision} cell (use null for unknown)"
            if isinstance(cell, float):
                peak, _ = lookup_peak(name, precision)
                assert peak > 0


def test_table_figures_match_the_datasheets() -> None:
    assert lookup_peak("H100 SXM", "bf16")[0] == 989.4
    assert lookup_peak("H200", "fp8")[0] == 1978.9
    assert lookup_peak("MI300X", "bf16")[0] == 1307.4
    assert lookup_peak("A100", "tf32")[0] == 156.0
    assert lookup_peak("MTT S4000", "int8")[0] == 200.0
    assert lookup_peak("H100 PCIe", "bf16")[0] == 756.0
    with pytest.raises(PeakLookupError):
        lookup_peak("H100 PCIe", "fp32")


# --------------------------------------------------------------------------- bucket forms and evidence


async def test_a_bucket_weighted_by_samples_and_global_batch_counts(workspace: Path) -> None:
    # seed-000 style mixed config: one bucket by step weight, one by sample count + global batch.
    # short: 100 steps of 5.996e14 FLOPs in 1 s (60.6% of 989.4 alone); long: 51200 samples at a global
    # batch of 512 = 100 steps of 7.213e14 FLOPs in 2 s. Together: 1.3209e17 FLOPs / 300 s = 44.5%.
    out = await _mfu(
        workspace,
        buckets=[
            {"name": "short", "flops_per_step": 5.996e14, "step_time_s": 1.0, "steps": 100},
            {
                "name": "long",
                "flops_per_step": 7.213e14,
                "step_time_s": 2.0,
                "samples": 51200,
                "global_batch": 512,
            },
        ],
        flops_kind="model",
        device="H100 SXM",
        precision="bf16",
    )
    assert out.utilization == pytest.approx(0.445, abs=5e-4)
    assert out.buckets[0].utilization == pytest.approx(0.606, abs=5e-4)  # what dropping "long" would report
    assert [b.steps for b in out.buckets] == [100, 100]
    assert out.total_time_s == pytest.approx(300.0)


@pytest.mark.parametrize(
    "bucket",
    [
        {"name": "b", "flops_per_step": 1e14, "step_time_s": 1.0, "sample_count": 512},  # a misspelt weight
        {"name": "b", "flops_per_step": 1e14, "step_time_s": 1.0, "samples": 512},  # no global batch
        {
            "name": "b",
            "flops_per_step": 1e14,
            "step_time_s": 1.0,
            "steps": 2,
            "samples": 4,
            "global_batch": 2,
        },
        {"name": "b", "step_time_s": 1.0},  # no FLOPs
        {"name": "b", "flops_per_step": 1e14, "flops_id": "ev-x", "step_time_s": 1.0},
    ],
)
async def test_unknown_or_ambiguous_bucket_fields_are_refused(
    workspace: Path, bucket: dict[str, object]
) -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError):
        ComputeMfuInput.model_validate({"buckets": [bucket], "flops_kind": "model", "peak_tflops": 400})
