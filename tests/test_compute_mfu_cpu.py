"""compute_mfu on a CPU: the peak is measured on this machine (or unavailable with the reason), and the device,
precision and threads come from the run's evidence, never typed by the agent.

The probe process is replaced at its boundary (`run_probe`) by fakes that answer as the real one does; the
real probe runs in tests/test_harness_capture.py, on a real training run."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import pytest

from perfgate.errors import ToolError
from perfgate.evidence import EvidenceDraft, EvidenceState, Ledger
from perfgate.hardware import cpu_peak
from perfgate.hardware.cpu_peak import ProbeResult
from perfgate.serving.runtime import ServerConfig, ToolRuntime
from perfgate.tools.compute_mfu import ComputeMfuInput, ComputeMfuOutput, run

pytestmark = pytest.mark.anyio


def _answer(threads: int, fp32: float = 0.2, bf16: float = 0.4) -> ProbeResult:
    """What the real probe prints for a machine doing ``fp32``/``bf16`` TFLOP/s."""
    from importlib import metadata

    def cell(t: float) -> dict[str, float]:
        return {"tflops": t, "n": 2048, "reps": 5, "best_s": 2 * 2048**3 / t / 1e12}

    return ProbeResult(
        {
            "torch": metadata.version("torch"),
            "threads": threads,
            "results": {"fp32": cell(fp32), "bf16": cell(bf16)},
        },
        None,
    )


class Probe:
    """Counts the probe's runs and answers each with the next of ``answers`` (a callable of the threads)."""

    def __init__(self, *answers: Any) -> None:
        self.answers = list(answers)
        self.threads: list[int] = []

    def __call__(self, threads: int, *args: object, **kwargs: object) -> ProbeResult:
        self.threads.append(threads)
        return self.answers.pop(0)(threads)


@pytest.fixture
def probe(monkeypatch: pytest.MonkeyPatch) -> Probe:
    fake = Probe(_answer, _answer)
    monkeypatch.setattr(cpu_peak, "run_probe", fake)
    return fake


def _window(
    workspace: Path,
    eid: str,
    *,
    kind: str = "cpu",
    name: str | None = None,
    host: str | None = None,
    threads: str = "3",
    precision: object = "fp32",
    steps_per_s: float = 10.0,
) -> str:
    Ledger(workspace).append(
        EvidenceDraft(
            id=eid,
            tool="run_benchmark_window",
            state=EvidenceState.EXECUTED,
            inputs={"contract": {"invariants": {"precision": precision}}},
            result={
                "throughput": {"steps_per_s": steps_per_s},
                "world_size": 1,
                "environment_fingerprint": {"device_kind": kind, "device_name": name, "num_threads": threads},
                "ranks": [{"rank": 0, "hostname": host or socket.gethostname()}],
            },
        )
    )
    return eid


async def _mfu(workspace: Path, **kwargs: object) -> ComputeMfuOutput:
    rt = ToolRuntime(config=ServerConfig.create(workspace), ledger=Ledger(workspace), tool="compute_mfu")
    return await run(ComputeMfuInput.model_validate(kwargs), rt)


def _bucket(window: str) -> dict[str, Any]:
    return {"name": "b", "window_id": window, "flops_per_step": 1e10}


async def test_a_cpu_run_is_measured_against_this_machines_probe_with_its_threads(
    workspace: Path, probe: Probe
) -> None:
    w = _window(workspace, "w1", threads="3", precision="amp_bf16")
    out = await _mfu(workspace, buckets=[_bucket(w)], flops_kind="model")
    assert out.state == EvidenceState.EXECUTED
    assert probe.threads == [3]  # the run's thread count, not the server's
    assert out.peak_basis == "measured" and out.peak_tflops == pytest.approx(0.4)  # the contract's bf16
    assert out.precision == "bf16" and out.device is not None and out.device.startswith("cpu")
    assert out.peak_source is not None and out.peak_source.startswith(
        "measured on this machine by perfgate, "
    )
    assert "bfloat16" in out.peak_source and "3 threads" in out.peak_source
    assert out.utilization == pytest.approx(1e10 * 10 / 1e12 / 0.4)
    assert any("not a datasheet peak" in w for w in out.warnings)
    # measured once per machine: a second call (another run, same threads) reads the cache
    again = await _mfu(
        workspace, buckets=[_bucket(_window(workspace, "w2", threads="3"))], flops_kind="model"
    )
    assert probe.threads == [3] and again.peak_tflops == pytest.approx(0.2)
    assert (
        again.peak_source is not None and again.peak_source.split(", ")[1] == out.peak_source.split(", ")[1]
    )
    # other threads are another machine key: measured again
    await _mfu(workspace, buckets=[_bucket(_window(workspace, "w3", threads="1"))], flops_kind="model")
    assert probe.threads == [3, 1]


def _no_torch(threads: int) -> ProbeResult:
    return ProbeResult(
        None, "the matmul probe exited with status 1: ModuleNotFoundError: No module named 'torch'"
    )


async def test_a_failed_probe_is_unavailable_with_its_reason_and_not_cached(
    workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = Probe(
        _no_torch,
        _answer,
    )
    monkeypatch.setattr(cpu_peak, "run_probe", fake)
    w = _window(workspace, "w1")
    out = await _mfu(workspace, buckets=[_bucket(w)], flops_kind="model")
    assert out.state == EvidenceState.UNAVAILABLE
    assert out.peak_basis == "unavailable" and out.peak_tflops is None and out.utilization is None
    assert out.utilization_reason is not None and "No module named 'torch'" in out.utilization_reason
    assert "peak_tflops" in out.utilization_reason  # what to do next
    assert out.achieved_tflops == pytest.approx(0.1)  # still measured
    assert all(b.utilization is None for b in out.buckets)
    # the failure was not remembered: the next call probes again and gets a peak
    out = await _mfu(workspace, buckets=[_bucket(w)], flops_kind="model")
    assert out.peak_basis == "measured" and len(fake.threads) == 2


async def test_no_torch_in_the_servers_interpreter_is_unavailable(
    workspace: Path, monkeypatch: pytest.MonkeyPatch, probe: Probe
) -> None:
    from importlib import metadata

    def missing(name: str) -> str:
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(cpu_peak.metadata, "version", missing)
    out = await _mfu(workspace, buckets=[_bucket(_window(workspace, "w1"))], flops_kind="model")
    assert out.state == EvidenceState.UNAVAILABLE and probe.threads == []
    assert out.utilization_reason is not None and "no torch" in out.utilization_reason


async def test_a_run_on_another_host_is_never_given_this_machines_peak(workspace: Path, probe: Probe) -> None:
    w = _window(workspace, "w1", host="some-other-node-17")
    out = await _mfu(workspace, buckets=[_bucket(w)], flops_kind="model")
    assert out.state == EvidenceState.UNAVAILABLE and probe.threads == []
    assert out.utilization_reason is not None and "some-other-node-17" in out.utilization_reason


async def test_a_device_that_contradicts_the_run_is_refused(workspace: Path, probe: Probe) -> None:
    cpu_run = _window(workspace, "cpu")
    with pytest.raises(ToolError, match="ran on cpu, not 'H100'"):
        await _mfu(workspace, buckets=[_bucket(cpu_run)], flops_kind="model", device="H100", precision="bf16")
    gpu_run = _window(workspace, "gpu", kind="cuda", name="NVIDIA H100 80GB HBM3", precision="bf16")
    with pytest.raises(ToolError, match="is a CPU but window gpu ran on cuda"):
        await _mfu(workspace, buckets=[_bucket(gpu_run)], flops_kind="model", device="cpu")
    with pytest.raises(ToolError, match="not 'B200'"):
        await _mfu(workspace, buckets=[_bucket(gpu_run)], flops_kind="model", device="B200", precision="bf16")
    # left out, the run's own device and precision are used: the table's sourced figure
    out = await _mfu(workspace, buckets=[_bucket(gpu_run)], flops_kind="model")
    assert out.peak_basis == "datasheet" and out.peak_tflops == 989.4 and out.device == "NVIDIA H100 SXM"
    assert probe.threads == []


async def test_runs_on_different_devices_or_precisions_need_them_named(workspace: Path, probe: Probe) -> None:
    a = _window(workspace, "a", kind="cuda", name="NVIDIA H100 80GB HBM3", precision="bf16")
    b = _window(workspace, "b", kind="cuda", name="NVIDIA A100-SXM4-80GB", precision="bf16")
    buckets = [_bucket(a), {**_bucket(b), "name": "c"}]
    with pytest.raises(ToolError, match="different devices"):
        await _mfu(workspace, buckets=buckets, flops_kind="model")
    c = _window(workspace, "c", kind="cuda", name="NVIDIA H100 80GB HBM3", precision={"params": "fp32"})
    with pytest.raises(ToolError, match="give precision"):
        await _mfu(workspace, buckets=[_bucket(c)], flops_kind="model")
    out = await _mfu(workspace, buckets=[_bucket(c)], flops_kind="model", precision="fp32")
    assert out.peak_tflops == 66.9


async def test_cpu_precisions_the_probe_does_not_measure_are_unavailable(
    workspace: Path, probe: Probe
) -> None:
    out = await _mfu(
        workspace, buckets=[_bucket(_window(workspace, "w", precision="tf32"))], flops_kind="model"
    )
    assert out.state == EvidenceState.UNAVAILABLE and probe.threads == []
    assert out.utilization_reason is not None and "fp32 and bf16 only" in out.utilization_reason
