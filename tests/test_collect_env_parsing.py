"""collect_env's parsers and cross-checks, called directly: system tools, visibility, fingerprint, provenance."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from perfgate.envprobe import (
    Device,
    Fingerprint,
    compare_fingerprints,
    container_provenance,
    count_listed,
    format_cudnn_version,
    make_fingerprint,
    parse_probe_output,
    visibility,
)
from perfgate.envprobe.systools import (
    RawRun,
    collect_system_tools,
    parse_gmi_list,
    parse_gmi_query,
    parse_nvidia_smi_csv,
    parse_rocm_smi_json,
    parse_version,
    safe_which,
)

FAKES = Path(__file__).parent / "fakes"
NVIDIA_BIN = FAKES / "fake_nvidia_bin"
MTHREADS_BIN = FAKES / "fake_mthreads_bin"


def fake_path(*dirs: Path) -> dict[str, str]:
    return {**os.environ, "PATH": os.pathsep.join([*map(str, dirs), os.environ.get("PATH", "")])}


# ---------------------------------------------------------------- NVIDIA


def test_nvidia_smi_from_the_fake_on_path_yields_versions_devices_and_the_raw_transcript() -> None:
    tools, transcripts, missing = collect_system_tools(
        env=fake_path(NVIDIA_BIN), workspace=None, use_nvml=False
    )
    by_name = {t.name: t for t in tools}
    smi = by_name["nvidia-smi"]
    assert smi.found and smi.path == str(NVIDIA_BIN / "nvidia-smi")
    assert (smi.version, smi.driver_version, smi.runtime_version) == ("550.54.15", "550.54.15", "12.4")
    assert smi.devices is not None and len(smi.devices) == 8
    first = smi.devices[0]
    assert first.name == "NVIDIA H100 80GB HBM3"
    assert first.total_memory_bytes == 81559 * 1024 * 1024
    assert first.capability == "9.0"
    assert first.pci_bus_id == "00000000:18:00.0"
    assert [d.index for d in smi.devices] == list(range(8))
    assert by_name["nsys"].version == "2024.2.1.106-242134037904v0"
    assert by_name["ncu"].version == "2024.1.1.0"
    # raw output kept, one transcript per found tool, with the exact argv that ran
    assert (
        "--query-gpu=index,name,uuid,driver_version,memory.total,compute_cap,pci.bus_id"
        in transcripts["nvidia-smi"]
    )
    assert "NVIDIA H100 80GB HBM3" in transcripts["nvidia-smi"]
    assert set(transcripts) == {"nvidia-smi", "nsys", "ncu"}
    assert ("system_tools.mthreads-gmi", "not found on PATH") in missing
    assert not by_name["mthreads-gmi"].found


def test_an_old_nvidia_driver_falls_back_to_the_banner_and_drops_compute_cap() -> None:
    env = {**fake_path(NVIDIA_BIN), "PERFGATE_FAKE_SMI_OLD": "1"}
    tools, transcripts, _ = collect_system_tools(env=env, workspace=None, use_nvml=False)
    smi = next(t for t in tools if t.name == "nvidia-smi")
    assert (smi.driver_version, smi.runtime_version) == ("470.182.03", "11.4")
    assert smi.devices is not None and len(smi.devices) == 8
    assert all(d.capability is None for d in smi.devices)
    assert transcripts["nvidia-smi"].count("$ ") == 4  # --version, banner, query, query without compute_cap


def test_nvidia_smi_csv_rows_tolerate_not_available_cells_and_skip_malformed_lines() -> None:
    fields = ("index", "name", "memory.total", "compute_cap")
    text = "0, NVIDIA A100-SXM4-80GB, 81920, 8.0\n1, NVIDIA A100-SXM4-80GB, [N/A], [Not Supported]\ngarbage\n"
    devices = parse_nvidia_smi_csv(text, fields)
    assert len(devices) == 2
    assert devices[0].total_memory_bytes == 81920 * 1024 * 1024 and devices[0].capability == "8.0"
    assert devices[1].total_memory_bytes is None and devices[1].capability is None


def test_a_system_tool_that_hangs_is_killed_and_reported() -> None:
    def hanging(argv: object, timeout_s: float, env: object) -> RawRun:
        return RawRun(("nvidia-smi",), None, "", "", f"timed out after {timeout_s:g} s and was killed")

    tools, _, _ = collect_system_tools(
        env=fake_path(NVIDIA_BIN), workspace=None, run=hanging, use_nvml=False, timeout_s=0.5
    )
    smi = next(t for t in tools if t.name == "nvidia-smi")
    assert smi.devices is None and smi.driver_version is None
    assert any("timed out" in e for e in smi.errors)


def test_a_real_hanging_tool_is_killed_at_its_timeout(tmp_path: Path) -> None:
    from perfgate.envprobe.systools import run_fixed

    result = run_fixed(["sleep", "30"], 0.3, os.environ)
    assert not result.ok and result.error is not None and "timed out" in result.error


def test_nvml_is_read_through_nvidia_ml_py_when_importable(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys
    import types

    class FakeNvmlError(Exception):
        """FAKE pynvml error type."""

    memory = types.SimpleNamespace(total=85_899_345_920)
    fake = types.ModuleType("pynvml")
    fake.__doc__ = "FAKE nvidia-ml-py for this test: two H200 devices"
    vars(fake).update(
        NVMLError=FakeNvmlError,
        nvmlInit=lambda: None,
        nvmlShutdown=lambda: None,
        nvmlSystemGetDriverVersion=lambda: b"560.35.03",
        nvmlSystemGetCudaDriverVersion=lambda: 12060,
        nvmlDeviceGetCount=lambda: 2,
        nvmlDeviceGetHandleByIndex=lambda i: i,
        nvmlDeviceGetName=lambda h: "NVIDIA H200",
        nvmlDeviceGetUUID=lambda h: f"GPU-{h}",
        nvmlDeviceGetMemoryInfo=lambda h: memory,
        nvmlDeviceGetCudaComputeCapability=lambda h: (9, 0),
    )
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    tools, _, missing = collect_system_tools(env={"PATH": ""}, workspace=None)
    nvml = next(t for t in tools if t.name == "nvml")
    assert (nvml.driver_version, nvml.runtime_version) == ("560.35.03", "12.6")
    assert nvml.devices is not None and [d.name for d in nvml.devices] == ["NVIDIA H200", "NVIDIA H200"]
    assert nvml.devices[1].capability == "9.0" and nvml.devices[1].total_memory_bytes == 85_899_345_920
    assert not any(item == "system_tools.nvml" for item, _ in missing)


def test_nvml_missing_is_listed_as_unavailable_with_the_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "pynvml", None)  # import fails
    _, _, missing = collect_system_tools(env={"PATH": ""}, workspace=None)
    assert (
        "system_tools.nvml",
        "nvidia-ml-py (pynvml) is not installed in the server's environment",
    ) in missing


# ---------------------------------------------------------------- Moore Threads, ROCm, profilers


def test_mthreads_gmi_query_and_list_from_the_fake_merge_into_devices() -> None:
    tools, transcripts, _ = collect_system_tools(env=fake_path(MTHREADS_BIN), workspace=None, use_nvml=False)
    gmi = next(t for t in tools if t.name == "mthreads-gmi")
    assert (gmi.driver_version, gmi.runtime_version) == ("2.7.0", "4.0.0")
    assert gmi.devices is not None and len(gmi.devices) == 8
    assert {d.name for d in gmi.devices} == {"MTT S4000"}
    assert gmi.devices[3].index == 3 and gmi.devices[3].total_memory_bytes == 48 * 1024**3
    assert gmi.devices[3].uuid == "GPU-7d1e0003-2c4a-4b8e-9f01-5a3c6e8b0003"
    assert "Product Name" in transcripts["mthreads-gmi"] and "$ " in transcripts["mthreads-gmi"]
    msys = next(t for t in tools if t.name == "msys")
    assert msys.version == "1.4.0"


def test_mthreads_gmi_parsing_is_defensive_about_unknown_layouts() -> None:
    host, devices = parse_gmi_query("garbage\n\n: :\nProduct Name : MTT S5000\nDriver Version : 3.0.1\n")
    assert [d.name for d in devices] == ["MTT S5000"]
    assert host.get("Driver Version") == "3.0.1"
    assert parse_gmi_query("")[1] == []
    assert [
        (d.index, d.name, d.uuid)
        for d in parse_gmi_list("GPU 0: MTT S4000\nnoise\nGPU 1: MTT S4000 (UUID: GPU-x)\n")
    ] == [
        (0, "MTT S4000", None),
        (1, "MTT S4000", "GPU-x"),
    ]


def test_rocm_smi_json_is_parsed_best_effort() -> None:
    text = json.dumps(
        {
            "card0": {
                "Card series": "AMD Instinct MI300X",
                "VRAM Total Memory (B)": "206141652992",
                "GFX Version": "gfx942",
            },
            "card1": {"Card series": "AMD Instinct MI300X", "VRAM Total Memory (B)": "N/A"},
            "system": {"Driver version": "6.7.0"},
        }
    )
    driver, devices = parse_rocm_smi_json(text)
    assert driver == "6.7.0"
    assert [d.name for d in devices] == ["AMD Instinct MI300X"] * 2
    assert devices[0].total_memory_bytes == 206141652992 and devices[0].capability == "gfx942"
    assert devices[1].total_memory_bytes is None
    assert parse_rocm_smi_json("not json") == (None, [])


@pytest.mark.parametrize(
    ("text", "version"),
    [
        ("NVIDIA Nsight Systems version 2024.2.1.106-242134037904v0", "2024.2.1.106-242134037904v0"),
        ("NVIDIA (R) Nsight Compute\nCopyright (c) 2018-2024\nVersion 2024.1.1.0 (build 1)", "2024.1.1.0"),
        ("mcu 1.2.3", "1.2.3"),
        ("no digits here", None),
    ],
)
def test_profiler_versions_are_read_from_their_version_output(text: str, version: str | None) -> None:
    assert parse_version(text) == version


def test_tools_inside_the_workspace_or_on_relative_path_entries_are_ignored(tmp_path: Path) -> None:
    planted = tmp_path / "bin"
    planted.mkdir()
    tool = planted / "nvidia-smi"
    tool.write_text("#!/bin/sh\necho planted\n")
    tool.chmod(0o755)
    path = os.pathsep.join([str(planted), "bin", str(NVIDIA_BIN)])
    assert safe_which("nvidia-smi", path, workspace=tmp_path.resolve()) == str(NVIDIA_BIN / "nvidia-smi")
    assert safe_which("nvidia-smi", path, workspace=None) == str(tool)


# ---------------------------------------------------------------- visibility


@pytest.mark.parametrize(
    ("value", "count"),
    [
        (None, None),
        ("", 0),
        ("0,1,2,3", 4),
        ("0,1,-1,2", 2),
        ("GPU-3f2a,GPU-9c1b", 2),
        ("all", None),
        ("none", 0),
        ("2, 3", 2),
        ("0,x,1", 1),
    ],
)
def test_visibility_lists_are_counted_like_the_cuda_runtime_reads_them(
    value: str | None, count: int | None
) -> None:
    assert count_listed(value) == count


def test_a_list_that_names_missing_devices_is_flagged() -> None:
    vis = visibility("musa", 2, {"MUSA_VISIBLE_DEVICES": "0,1,2,3"}, system_device_count=2)
    assert vis.mismatch and vis.governing_variable == "MUSA_VISIBLE_DEVICES" and vis.listed_count == 4
    assert any("lists 4 device(s) but the process sees 2" in n for n in vis.notes)


def test_cuda_visible_devices_is_called_out_as_ineffective_on_musa() -> None:
    vis = visibility("musa", 8, {"CUDA_VISIBLE_DEVICES": "0,1"}, system_device_count=8)
    assert not vis.mismatch
    assert any("does not restrict MUSA devices" in n for n in vis.notes)


def test_a_gpu_host_running_a_cpu_process_is_flagged() -> None:
    vis = visibility("cpu", 0, {}, system_device_count=8, system_source="nvidia-smi")
    assert vis.mismatch and "nvidia-smi list 8 accelerator(s)" in vis.notes[0]


def test_agreeing_counts_are_not_flagged() -> None:
    vis = visibility("cuda", 2, {"CUDA_VISIBLE_DEVICES": "4,5"}, system_device_count=8)
    assert not vis.mismatch and vis.notes == []


def test_masking_without_a_variable_is_flagged() -> None:
    vis = visibility("cuda", 4, {}, system_device_count=8)
    assert vis.mismatch and "no visibility variable set" in vis.notes[0]


# ---------------------------------------------------------------- fingerprint


def _fp(**overrides: Any) -> Fingerprint:
    base: dict[str, Any] = {
        "backend": "cuda",
        "devices": [
            Device(index=i, name="NVIDIA H100 80GB HBM3", total_memory_bytes=1, capability="9.0")
            for i in range(8)
        ],
        "python_version": "3.11.7",
        "torch_version": "2.5.1+cu124",
        "runtime_version": "12.4",
        "driver_version": "550.54.15",
        "libraries": {"cudnn": "9.1.0", "nccl": "2.21.5"},
        "packages": {"torch": "2.5.1+cu124", "flash-attn": "2.6.3", "numpy": "2.1.0"},
        "cpu_model": "AMD EPYC 9654",
        "cpu_count": 192,
        "machine": "x86_64",
    }
    base.update(overrides)
    return make_fingerprint(**base)


def test_equal_environments_have_equal_fingerprints() -> None:
    a, b = _fp(), _fp()
    assert a.sha256 == b.sha256 and compare_fingerprints(a, b) == []
    assert a.fields["devices"] == ["8 x NVIDIA H100 80GB HBM3"]


def test_fingerprint_differences_name_each_changed_field() -> None:
    a = _fp()
    b = _fp(driver_version="560.35.03", packages={"torch": "2.5.1+cu124", "flash-attn": "2.7.0"})
    diff = {d.field: (d.baseline, d.candidate) for d in compare_fingerprints(a, b)}
    assert diff == {"driver": ("550.54.15", "560.35.03"), "pkg:flash-attn": ("2.6.3", "2.7.0")}
    # numpy is not fingerprinted: it does not change kernels
    assert (
        compare_fingerprints(a, _fp(packages={"torch": "2.5.1+cu124", "flash-attn": "2.6.3", "numpy": "1.0"}))
        == []
    )


def test_fingerprints_compare_from_their_json_and_refuse_mixed_versions() -> None:
    a = _fp()
    dumped = json.loads(a.model_dump_json())
    assert compare_fingerprints(dumped, a) == []
    other = {**dumped, "version": 99}
    assert [d.field for d in compare_fingerprints(a, other)] == ["version"]
    tampered = {**dumped, "sha256": "0" * 64}
    assert [d.field for d in compare_fingerprints(a, tampered)] == ["sha256"]


def test_device_count_and_backend_change_the_fingerprint() -> None:
    h100 = "NVIDIA H100 80GB HBM3"
    four = _fp(devices=[Device(index=i, name=h100, total_memory_bytes=1, capability="9.0") for i in range(4)])
    fields = {d.field for d in compare_fingerprints(_fp(), four)}
    assert fields == {"device_count", "devices"}
    assert "backend" in {d.field for d in compare_fingerprints(_fp(), _fp(backend="musa"))}


# ---------------------------------------------------------------- provenance, probe output, formats


def test_container_facts_come_only_from_what_the_container_shows() -> None:
    cid = "a" * 64
    digest = "sha256:" + "b" * 64
    info, missing = container_provenance(
        {
            "dockerenv": True,
            "cgroup": f"0::/system.slice/docker-{cid}.scope\n",
            "image_env": {"CONTAINER_IMAGE": f"nvcr.io/nvidia/pytorch@{digest}"},
        }
    )
    assert info.in_container and info.runtime == "docker" and info.container_id == cid
    assert info.image == f"nvcr.io/nvidia/pytorch@{digest}" and info.image_digest == digest
    assert missing == []
    podman, _ = container_provenance(
        {"containerenv": 'engine="podman-4.9"\nimage="quay.io/x/y:1"\nid="c1"\n'}
    )
    assert (podman.runtime, podman.image, podman.container_id, podman.image_digest) == (
        "podman",
        "quay.io/x/y:1",
        "c1",
        None,
    )
    bare, why = container_provenance({"dockerenv": False, "cgroup": "0::/\n", "image_env": {}})
    assert not bare.in_container and bare.image_digest is None and "no container marker" in why[0]
    k8s, why = container_provenance({"cgroup": f"11:cpu:/kubepods/burstable/pod1/{cid}\n"})
    assert k8s.runtime == "kubernetes" and k8s.image_digest is None and "not visible" in why[0]


def test_probe_output_survives_stray_lines_and_reports_where_it_stopped() -> None:
    text = "\n".join(
        [
            '{"section": "_begin", "data": {"schema": 1}}',
            "Warning: some library printed this",
            '{"section": "python", "data": {"version": "3.11.7"}}',
            '{"section": "_stage", "data": "import torch"}',
            '{"section": "torch", "data": null, "unavailable": [{"item": "torch", "reason": "No module"}]}',
            "[1, 2]",
        ]
    )
    out = parse_probe_output(text)
    assert out.began and not out.complete and out.last_stage == "import torch"
    assert out.sections["python"] == {"version": "3.11.7"} and out.sections["torch"] is None
    assert [(u.item, u.reason) for u in out.unavailable] == [("torch", "No module")]
    assert out.stray_lines == 2


@pytest.mark.parametrize(("raw", "text"), [(90100, "9.1.0"), (8902, "8.9.2"), (None, None), ("3.0", "3.0")])
def test_cudnn_versions_are_formatted_per_major_series(raw: object, text: str | None) -> None:
    assert format_cudnn_version(raw) == text


def test_git_is_run_without_the_repository_being_able_to_start_programs(tmp_path: Path) -> None:
    from perfgate.envprobe import git_snapshot

    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    marker = tmp_path / "fsmonitor-ran"
    hook = tmp_path / "monitor.sh"
    hook.write_text(f"#!/bin/sh\ntouch {marker}\n")
    hook.chmod(0o755)
    subprocess.run(["git", "-C", str(tmp_path), "config", "core.fsmonitor", str(hook)], check=True)
    (tmp_path / "a.txt").write_text("x\n")
    # A plain `git status` would run the monitor (proved in a sibling repo); the snapshot must not.
    control = tmp_path / "control"
    subprocess.run(["git", "init", "-q", str(control)], check=True)
    subprocess.run(["git", "-C", str(control), "config", "core.fsmonitor", str(hook)], check=True)
    subprocess.run(["git", "-C", str(control), "status", "--porcelain"], check=True, capture_output=True)
    assert marker.exists()
    marker.unlink()
    snap, reason = git_snapshot(tmp_path)
    assert reason is None and snap is not None
    assert snap.commit is None and snap.untracked_files == 3 and snap.dirty  # a.txt, monitor.sh, control/
    assert "unborn HEAD" in snap.notes[0]
    assert not marker.exists()
