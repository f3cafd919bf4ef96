"""`perfgate selftest`: the CPU path end to end through the real tools; device paths on real devices only.

The judgement functions are also fed recorded-shaped inputs for CUDA, ROCm and MUSA here. Those inputs
are FAKES written for these tests (no device produced them); they test the checks' logic, never stand
in for a device result.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from perfgate.evidence import Ledger
from perfgate.selftest.checks import (
    environment_check,
    matmul_check,
    memory_check,
    parity_check,
    profile_check,
    step_time_check,
)

FAKES = Path(__file__).parent / "fakes"


# ---------------------------------------------------------------- the CPU path, for real


@pytest.mark.slow
@pytest.mark.timeout(1200)  # ~30 s of tool calls on a quiet 2-core machine, several times that loaded
def test_the_cpu_selftest_passes_through_the_real_tools_and_records_one_ledger_entry(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    from perfgate.selftest import run_selftest

    lines: list[str] = []
    result = run_selftest("cpu", quick=True, workspace=tmp_path / "st", say=lines.append)
    by_name = {c.name: c for c in result.checks}
    assert result.passed and result.exit_code == 0, result.report
    assert {n: c.status for n, c in by_name.items()} == {
        "step_time": "pass",
        "memory": "unavailable",
        "environment": "pass",
        "matmul": "unavailable",
        "profile": "pass",
        "parity_bf16": "pass",
        "parity_fp8": "pass",
    }
    # Each check names its figure and what it was compared with; unavailable ones say why.
    assert by_name["step_time"].values["source"] == "host clock"
    assert by_name["step_time"].values["steps_compared"] == 99
    assert "allocator peak" in (by_name["memory"].reason or "")
    assert by_name["matmul"].values["measured_tflops"] > 0
    assert "not in the peak table" in (by_name["matmul"].reason or "")
    assert "negative control caught" in by_name["parity_bf16"].figure
    for check in result.checks:
        assert check.figure or check.reason
    # The real tools ran over MCP and the ledger holds them and one selftest record citing them.
    ledger = Ledger(result.workspace)
    assert ledger.verify().ok
    record = ledger.get(result.record_id)
    assert record is not None and record.tool == "selftest" and record.state.value == "passed"
    assert record.environment_id == result.evidence["environment"]
    assert {a.name for a in record.artifacts} == {"selftest.json", "report.txt"}
    tools = {r.tool for r in ledger.records()}
    assert {"collect_env", "run_benchmark_window", "profile_segment", "compare_tensors"} <= tools
    assert set(record.result["evidence"]) >= {"environment", "training window", "matmul window", "profile"}
    assert result.report.splitlines()[0].startswith("perfgate selftest PASS on cpu")


@pytest.mark.slow
def test_asking_for_an_absent_accelerator_is_a_clear_error_not_a_pass(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA/ROCm device")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "perfgate",
            "selftest",
            "--device",
            "cuda",
            "--quick",
            "--workspace",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "torch.cuda.is_available() is False" in proc.stderr


# ---------------------------------------------------------------- device paths: real devices only


def _device_present(kind: str) -> str | None:
    """None when the device is usable by this interpreter's torch, else why the test is skipped."""
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    hip = getattr(torch.version, "hip", None)
    if kind in ("cuda", "rocm"):
        if not torch.cuda.is_available():
            return f"no {kind} device: torch.cuda.is_available() is False"
        if (kind == "rocm") != bool(hip):
            return f"this torch is {'a ROCm' if hip else 'a CUDA'} build"
        return None
    try:
        import torch_musa  # noqa: F401  # pyright: ignore[reportMissingImports, reportUnusedImport]
    except ImportError:
        return "no MUSA device: torch_musa is not importable"
    musa: Any = getattr(torch, "musa", None)
    return None if musa is not None and musa.is_available() else "torch.musa reports no device"


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["cuda", "rocm", "musa"])
def test_the_selftest_passes_on_each_present_accelerator(kind: str, tmp_path: Path) -> None:
    why = _device_present(kind)
    if why is not None:
        pytest.skip(why)
    from perfgate.selftest import run_selftest

    result = run_selftest(kind, quick=True, workspace=tmp_path / kind, say=lambda _: None)
    assert result.passed, result.report
    statuses = {c.name: c.status for c in result.checks}
    assert statuses["step_time"] == "pass" and statuses["memory"] == "pass"
    assert statuses["profile"] == "pass" and statuses["parity_bf16"] == "pass"


# ---------------------------------------------------------------- the allowlist it writes


@pytest.mark.parametrize("device", ["cpu", "cuda", "musa"])
def test_the_selftest_pre_approves_exactly_its_own_commands(tmp_path: Path, device: str) -> None:
    from perfgate.execution import load_policy
    from perfgate.execution.binding import bind_code
    from perfgate.execution.request import CommandRequest
    from perfgate.security.trustroot import TrustRoot
    from perfgate.selftest import _commands, _write_workspace  # pyright: ignore[reportPrivateUsage]

    policy_file = _write_workspace(tmp_path, device, quick=True)
    policy = load_policy(tmp_path, TrustRoot.locate(policy=policy_file))
    env = {"PERFGATE_WARMUP_STEPS": "3"}

    def allowed(argv: list[str], extra_env: dict[str, str] | None = None) -> bool:
        request = CommandRequest(
            argv=tuple(argv), cwd=tmp_path, env={**env, **(extra_env or {})}, timeout_s=600
        )
        return policy.match(bind_code(request, tmp_path)) is not None

    commands = [argv for _, argv in _commands(device, quick=True)]
    assert len(commands) == (6 if device == "cpu" else 7)  # torchrun only where devices may be 2+
    for argv in commands:
        assert allowed(argv)
        assert not allowed([*argv, "--steps", "100000"])  # nothing appended
        assert not allowed(argv, {"LD_PRELOAD": "/tmp/x.so"})  # no other variables
    assert not allowed([sys.executable, "-m", "perfgate.harness", "--", "train.py"])
    assert not allowed([sys.executable, "-c", "print(1)"])


# ---------------------------------------------------------------- the job's device resolution


def test_the_job_finds_musa_through_torch_musa_and_reports_what_torch_sees(tmp_path: Path) -> None:
    """With the FAKE torch_musa on the path (tests/fakes), the job resolves and describes musa."""
    pytest.importorskip("torch")
    code = (
        "import json; from perfgate.selftest import job; "
        "k, t, m, why = job.resolve_device('musa'); print(json.dumps([k, t, why, job.facts(k)]))"
    )
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(FAKES / "fake_torch_musa_site"), *sys.path]),
        "PERFGATE_FAKE_MUSA_PHYSICAL": "2",
    }
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    kind, torch_type, why, facts = json.loads(proc.stdout.strip().splitlines()[-1])
    assert (kind, torch_type, why) == ("musa", "musa", None)
    assert facts["backend"] == "musa" and facts["device_names"] == ["MTT S4000", "MTT S4000"]
    assert facts["runtime_version"] is not None and facts["driver_api_version"] is None


def test_the_job_refuses_a_device_the_torch_build_does_not_have(monkeypatch: pytest.MonkeyPatch) -> None:
    torch = pytest.importorskip("torch")
    from perfgate.selftest import job

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.version, "hip", "6.2.41133")
    assert job.resolve_device("auto")[0] == "rocm"
    assert "ROCm build" in job.resolve_device("cuda")[3]
    monkeypatch.setattr(torch.version, "hip", None)
    assert job.resolve_device("auto")[0] == "cuda"
    assert "not a ROCm build" in job.resolve_device("rocm")[3]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert job.resolve_device("auto")[:3] == ("cpu", "cpu", None)


# ---------------------------------------------------------------- the checks, on FAKE device inputs


def _record(device_ms: list[float] | None, host_ms: list[float], first: int, last: int) -> dict[str, Any]:
    return {
        "device": {"kind": "cuda" if device_ms else "cpu"},
        "steps": {"step_time_ns": [int(v * 1e6) for v in host_ms]},
        "windows": [
            {
                "first_step": first,
                "last_step": last,
                "elapsed_ns": int(sum(host_ms[first : last + 1]) * 1e6),
                "device_step_ms": device_ms,
                "device_elapsed_ms": None if device_ms is None else sum(device_ms),
            }
        ],
    }


def _clock(step_ms: list[float]) -> dict[str, Any]:
    stamps = [0]
    for v in step_ms:
        stamps.append(stamps[-1] + int(v * 1e6))
    return {"stamps_ns": stamps}


UNEVEN = [3.0, 1.0, 4.0, 1.0, 5.0, 9.0, 2.0, 6.0] * 5  # 40 steps


def test_device_events_that_match_the_wall_clock_pass_and_a_shifted_window_fails() -> None:
    first, last = 4, 23
    events = [v * 1.001 for v in UNEVEN[first : last + 1]]
    ok = step_time_check(_record(events, UNEVEN, first, last), _clock(UNEVEN))
    assert (
        ok.status == "pass" and ok.values["source"] == "device events" and ok.values["steps_compared"] == 19
    )
    shifted = UNEVEN[first + 1 : last + 2]
    bad = step_time_check(_record(shifted, UNEVEN, first, last), _clock(UNEVEN))
    assert bad.status == "fail" and bad.values["median_step_diff_ms"] > bad.values["median_step_allowed_ms"]
    microseconds = [v * 1000 for v in UNEVEN[first : last + 1]]  # a unit slip
    assert step_time_check(_record(microseconds, UNEVEN, first, last), _clock(UNEVEN)).status == "fail"


def test_on_the_host_the_harness_clock_is_compared_and_the_report_says_so() -> None:
    check = step_time_check(_record(None, UNEVEN, 3, 22), _clock(UNEVEN))
    assert check.status == "pass" and check.values["source"] == "host clock"
    assert "no device timing events" in check.values["note"]
    missing = step_time_check(_record(None, UNEVEN, 3, 22), _clock(UNEVEN[:10]))
    assert missing.status == "fail" and "stamps" in (missing.reason or "")


def test_peak_memory_must_cover_the_ballast_and_stay_within_what_the_job_allocates() -> None:
    clock = {"ballast_bytes": 64 << 20, "param_bytes": 8 << 20, "activation_bytes": 2 << 20}
    good = memory_check({"peak_allocated_bytes": 100 << 20, "peak_reserved_bytes": 128 << 20}, clock, "cuda")
    assert good.status == "pass"
    low = memory_check({"peak_allocated_bytes": 10 << 20, "peak_reserved_bytes": 128 << 20}, clock, "cuda")
    assert low.status == "fail" and "below the live ballast" in (low.reason or "")
    high = memory_check({"peak_allocated_bytes": 4 << 30, "peak_reserved_bytes": 4 << 30}, clock, "musa")
    assert high.status == "fail" and "exceeds" in (high.reason or "")
    inverted = memory_check(
        {"peak_allocated_bytes": 100 << 20, "peak_reserved_bytes": 90 << 20}, clock, "cuda"
    )
    assert inverted.status == "fail" and "reserved" in (inverted.reason or "")
    host = memory_check({"peak_allocated_bytes": None, "host_peak_rss_bytes": 1 << 28}, clock, "cpu")
    assert host.status == "unavailable" and "RSS" in host.figure


def test_matmul_utilization_needs_a_peak_and_a_plausible_ratio() -> None:
    spec = {"flops_per_step": 4 * 2 * 8192**3, "n": 8192, "reps": 4, "dtype": "bf16"}
    mfu = {"peak_tflops": 989.4, "utilization": 0.62, "peak_source": "NVIDIA H100 SXM, bf16 (FAKE)"}
    assert matmul_check(spec, 7.1, mfu, None, "NVIDIA H100 80GB HBM3").status == "pass"
    low = matmul_check(spec, 7.1, {**mfu, "utilization": 0.01}, None, "NVIDIA H100 80GB HBM3")
    assert low.status == "fail" and "implausibly low" in (low.reason or "")
    over = {**mfu, "utilization": None, "utilization_reason": "achieved exceeds the peak"}
    assert matmul_check(spec, 7.1, over, None, "X").status == "fail"
    unknown = matmul_check(spec, 7.1, None, "device 'RTX 9999' is not in the peak table", "RTX 9999")
    assert unknown.status == "unavailable" and unknown.values["measured_tflops"] > 0
    assert matmul_check(spec, None, None, None, "X").status == "fail"


def _profile(
    categories: dict[str, int], ranks: int = 1, span: float = 1000.0, parts: float = 1000.0
) -> dict[str, Any]:
    rank = {
        "categories": [{"category": c, "count": n} for c, n in categories.items()],
        "span_us": span,
        "idle_us": parts * 0.2,
        "compute_us": parts * 0.7,
        "non_compute_us": parts * 0.1,
        "steps": {
            "mean_us": 1500.0,
            "steps": [
                {"duration_us": 1500.0, "in_window": True},
                {"duration_us": 1900.0, "in_window": True},
                {"duration_us": 90000.0, "in_window": False},
            ],
        },
        "top_ops": [],
    }
    return {"state": "executed", "ranks": [rank] * ranks}


def test_a_device_profile_needs_kernels_copies_a_collective_on_two_ranks_and_a_consistent_breakdown() -> None:
    full = {"gemm": 40, "elementwise": 60, "memcpy_h2d": 4, "communication": 2}
    steps = [1.1, 1.2, 1.3]
    assert profile_check(_profile(full, ranks=2), steps, "cuda", 2).status == "pass"
    no_comm = profile_check(_profile({"gemm": 40, "memcpy_h2d": 4}, ranks=2), steps, "cuda", 2)
    assert no_comm.status == "fail" and "no collective" in (no_comm.reason or "")
    no_copy = profile_check(_profile({"gemm": 40}), steps, "musa", 1)
    assert no_copy.status == "fail" and "memcpy" in (no_copy.reason or "")
    broken = profile_check(_profile(full, span=1000.0, parts=700.0), steps, "rocm", 1)
    assert broken.status == "fail" and "span" in (broken.reason or "")
    slow = profile_check(_profile(full), [0.1, 0.12], "cuda", 1)  # 12x the window's slowest step
    assert slow.status == "fail" and "outside" in (slow.reason or "")
    assert profile_check(_profile(full), [1500.0, 1600.0], "cuda", 1).status == "fail"  # a ms/us slip
    failed = {"state": "failed", "failure_reason": "boom", "ranks": []}
    assert profile_check(failed, steps, "cuda", 1).status == "fail"


def test_parity_fails_when_the_negative_control_is_not_caught() -> None:
    match = {"status": "match", "tensors": [{"key": "exact", "atol": 0.0, "rtol": 0.0, "max_abs_error": 0.0}]}
    caught = {"status": "mismatch", "tensors": [{"key": "exact", "mismatched": 1}]}
    assert parity_check("parity_bf16", match, caught).status == "pass"
    missed = parity_check(
        "parity_bf16", match, {"status": "match", "tensors": [{"key": "exact", "mismatched": 0}]}
    )
    assert missed.status == "fail" and "negative control" in (missed.reason or "")
    assert parity_check("parity_fp8", None, None, "no float8 on this device").status == "unavailable"


def _env(backend: str, names: list[str], runtime: str | None, tools: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "summary": {
            "backend": backend,
            "devices": [{"index": i, "name": n} for i, n in enumerate(names)],
            "torch_version": "2.5.1+cu124",
            "runtime_version": runtime,
            "driver_version": "550.54.15",
            "driver_source": "nvidia-smi",
        },
        "system_tools": tools,
    }


def test_collect_env_must_agree_with_torch_on_backend_devices_and_versions() -> None:
    h100 = ["NVIDIA H100 80GB HBM3"] * 2
    facts = {
        "kind": "cuda",
        "backend": "cuda",
        "device_count": 2,
        "device_names": h100,
        "torch_version": "2.5.1+cu124",
        "runtime_version": "12.4",
        "driver_api_version": "12.4",
    }
    smi = {"name": "nvidia-smi", "found": True, "runtime_version": "12.4"}
    assert environment_check(_env("cuda", h100, "12.4", [smi]), facts).status == "pass"
    drifted = environment_check(_env("cuda", h100, "12.4", [{**smi, "runtime_version": "12.2"}]), facts)
    assert drifted.status == "fail" and "driver CUDA version" in (drifted.reason or "")
    one = environment_check(_env("cuda", h100[:1], "12.4", [smi]), facts)
    assert one.status == "fail" and "device count" in (one.reason or "")
    musa = {
        **facts,
        "kind": "musa",
        "backend": "musa",
        "runtime_version": "4.0.0",
        "device_names": ["MTT S4000"] * 2,
    }
    checked = environment_check(_env("musa", ["MTT S4000"] * 2, "4.0.0", []), musa)
    assert checked.status == "pass" and "torch reports no musa driver version" in checked.values["note"]


def test_a_job_that_cannot_read_the_driver_api_version_is_a_note_not_a_mismatch() -> None:
    h100 = ["NVIDIA H100 80GB HBM3"]
    facts = {
        "kind": "cuda",
        "backend": "cuda",
        "device_count": 1,
        "device_names": h100,
        "torch_version": "2.5.1+cu124",
        "runtime_version": "12.4",
        "driver_api_version": None,
    }
    smi = {"name": "nvidia-smi", "found": True, "runtime_version": "13.0"}
    checked = environment_check(_env("cuda", h100, "12.4", [smi]), facts)
    assert checked.status == "pass", checked.reason
    assert "not compared" in checked.values["note"] and "13.0" in checked.values["note"]


def _fake_libcuda(tmp_path: Path, version: int) -> Path:
    """A libcuda.so.1 whose cuDriverGetVersion reports `version` (no driver here; stands in for one)."""
    import shutil

    if shutil.which("gcc") is None:
        pytest.skip("gcc is needed to build the stand-in libcuda")
    src = tmp_path / "cuda.c"
    src.write_text(f"int cuDriverGetVersion(int *v) {{ *v = {version}; return 0; }}\n")
    lib = tmp_path / "libcuda.so.1"
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(lib), str(src)], check=True, timeout=120)
    return tmp_path


def test_without_torchs_private_wrapper_the_driver_api_version_comes_from_libcuda(tmp_path: Path) -> None:
    libdir = _fake_libcuda(tmp_path, 13000)
    probe = Path(__file__).parents[1] / "src/perfgate/envprobe/script/perfgate_envprobe.py"
    code = (
        "import json, sys, types, importlib.util\n"
        "from perfgate.selftest import job\n"
        f"spec = importlib.util.spec_from_file_location('probe', {str(probe)!r})\n"
        "probe = importlib.util.module_from_spec(spec); spec.loader.exec_module(probe)\n"
        "torch = types.SimpleNamespace(_C=types.SimpleNamespace())\n"
        "print(json.dumps([job._driver_api_version(torch, 'cuda'), probe.cuda_driver_api_version(),"
        " job._driver_api_version(torch, 'rocm')]))\n"
    )
    env = {**os.environ, "LD_LIBRARY_PATH": str(libdir)}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == ["13.0", 13000, None]
