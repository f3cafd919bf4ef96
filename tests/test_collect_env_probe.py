"""The probe script itself, run directly (subprocess) under real interpreters and with fakes on PYTHONPATH."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from perfgate.envprobe import ProbeOutput, parse_probe_output, probe_script, probe_source

pytestmark = pytest.mark.slow

FAKES = Path(__file__).parent / "fakes"
TORCH_PYTHON = sys.executable  # the test venv: real torch (CPU build)


def has_torch(python: str) -> bool:
    return subprocess.run([python, "-c", "import torch"], capture_output=True, timeout=120).returncode == 0


def python_without_torch() -> str:
    """A second, real interpreter that lacks torch (the system python), or skip."""
    for candidate in (
        os.environ.get("PERFGATE_TEST_PLAIN_PYTHON"),
        "/root/.pyenv/shims/python3",
        "/usr/bin/python3",
    ):
        if candidate and os.path.exists(candidate) and not has_torch(candidate):
            return candidate
    pytest.skip("no interpreter without torch on this machine")


def run_probe(
    python: str, env: dict[str, str] | None = None
) -> tuple[ProbeOutput, subprocess.CompletedProcess[str]]:
    proc = subprocess.run(
        [python, str(probe_script())],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **(env or {})},
    )
    return parse_probe_output(proc.stdout), proc


@pytest.fixture(scope="module")
def torch_probe() -> ProbeOutput:
    if not has_torch(TORCH_PYTHON):
        pytest.skip("the test interpreter has no torch")
    out, proc = run_probe(TORCH_PYTHON)
    assert proc.returncode == 0, proc.stderr
    return out


def test_the_probe_is_python_3_7_syntax_and_imports_only_the_standard_library() -> None:
    source = probe_source()
    ast.parse(source, feature_version=(3, 7))
    tree = ast.parse(source)
    top_level = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            top_level |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            top_level.add(node.module.split(".")[0])
    assert top_level <= set(sys.stdlib_module_names) | {"__future__"}, top_level - set(
        sys.stdlib_module_names
    )
    # torch and vendor modules are loaded by name at run time, inside guarded sections
    assert 'import_module("torch")' in source and 'import_module("torch_musa")' in source


def test_under_the_torch_venv_the_probe_reports_what_that_interpreter_reports(
    torch_probe: ProbeOutput,
) -> None:
    oracle_code = (
        "import json, platform, sys, importlib.metadata as m, torch;"
        "print(json.dumps({'python': platform.python_version(), 'torch': torch.__version__,"
        " 'git': torch.version.git_version, 'cuda': torch.version.cuda, 'numpy': m.version('numpy'),"
        " 'executable': sys.executable, 'prefix': sys.prefix, 'cuda_available': torch.cuda.is_available()}))"
    )
    oracle = json.loads(
        subprocess.run([TORCH_PYTHON, "-c", oracle_code], capture_output=True, text=True, check=True).stdout
    )
    s = torch_probe.sections
    assert torch_probe.complete and torch_probe.stray_lines == 0
    assert s["python"]["version"] == oracle["python"]
    assert s["python"]["executable"] == oracle["executable"] and s["python"]["prefix"] == oracle["prefix"]
    assert s["torch"]["version"] == oracle["torch"] == s["packages"]["torch"]
    assert s["torch"]["git_version"] == oracle["git"]
    assert s["packages"]["numpy"] == oracle["numpy"]
    assert s["accelerator"]["cuda_available"] is oracle["cuda_available"]
    if oracle["cuda"] is None and not oracle["cuda_available"]:
        assert s["accelerator"]["backend"] == "cpu"
        assert "CPU build" in s["accelerator"]["backend_reason"]
        assert s["accelerator"]["device_count"] == 0
    assert s["cpu"]["logical_count"] == os.cpu_count()
    assert s["accelerator"]["distributed"]["gloo"] is True
    assert torch_probe.stages == ["import torch", "query accelerator"]


def test_a_second_interpreter_without_torch_gives_a_different_honest_report(torch_probe: ProbeOutput) -> None:
    plain = python_without_torch()
    out, proc = run_probe(plain)
    assert proc.returncode == 0 and out.complete
    version = subprocess.run(
        [plain, "-c", "import platform; print(platform.python_version())"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert out.sections["python"]["version"] == version
    assert out.sections["python"]["executable"] != torch_probe.sections["python"]["executable"]
    assert out.sections["torch"] is None and out.sections["packages"]["torch"] is None
    reasons = {u.item: u.reason for u in out.unavailable}
    assert reasons["torch"] == "ModuleNotFoundError: No module named 'torch'"
    assert out.sections["accelerator"]["backend"] == "cpu"
    assert "accelerator" in reasons


def test_with_the_fake_torch_musa_the_probe_detects_musa_from_inside_the_process() -> None:
    env = {
        "PYTHONPATH": str(FAKES / "fake_torch_musa_site"),
        "MUSA_VISIBLE_DEVICES": "0,1,2,3",
        "CUDA_VISIBLE_DEVICES": "0",
        "MCCL_DEBUG": "WARN",
        "PYTORCH_MUSA_ALLOC_CONF": "expandable_segments:True",
    }
    out, proc = run_probe(TORCH_PYTHON, env)
    assert proc.returncode == 0 and out.complete, proc.stderr
    accel = out.sections["accelerator"]
    assert accel["backend"] == "musa" and accel["musa_available"] and not accel["cuda_available"]
    assert accel["device_count"] == 4 and [d["name"] for d in accel["devices"]] == ["MTT S4000"] * 4
    assert (
        accel["devices"][0]["total_memory_bytes"] == 48 * 1024**3
        and accel["devices"][0]["capability"] == "2.2"
    )
    assert accel["runtime_version"] == "4.0.0"
    assert accel["libraries"] == {"mccl_version": "2.11.4", "mudnn_version": "2900"}
    assert accel["precision"]["bf16_supported"] is True and accel["precision"]["tf32_mudnn_allowed"] is False
    assert out.sections["torch_musa"]["version"] == "2.0.0+fake"
    assert out.sections["packages"]["torch_musa"] == "2.0.0+fake"
    assert out.sections["torch"]["musa"] is None  # read before torch_musa was imported
    assert "import torch_musa" in out.stages
    assert out.sections["switches"]["MCCL_DEBUG"] == "WARN"
    assert out.sections["switches"]["PYTORCH_MUSA_ALLOC_CONF"] == "expandable_segments:True"
    assert out.sections["visibility_env"]["MUSA_VISIBLE_DEVICES"] == "0,1,2,3"


def test_with_the_fake_cuda_build_the_probe_reads_devices_libraries_and_attention() -> None:
    env = {"PYTHONPATH": str(FAKES / "fake_torch_cuda_site"), "CUDA_VISIBLE_DEVICES": "2,3"}
    out, proc = run_probe(TORCH_PYTHON, env)
    assert proc.returncode == 0 and out.complete, proc.stderr
    accel = out.sections["accelerator"]
    assert accel["backend"] == "cuda" and accel["device_count"] == 2
    assert accel["devices"][1] | {"uuid": None} == {
        "index": 1,
        "name": "NVIDIA H100 80GB HBM3",
        "total_memory_bytes": 85_045_870_592,
        "capability": "9.0",
        "multi_processor_count": 132,
        "gcn_arch_name": None,
        "uuid": None,
    }
    assert accel["runtime_version"] == "12.4" and accel["driver_api_version"] == 12040
    assert accel["libraries"] == {"cudnn_available": True, "cudnn_version": 90100, "nccl_version": "2.21.5"}
    assert accel["precision"]["bf16_supported"] is True and accel["precision"]["tf32_hardware"] is True
    assert accel["attention"]["flash_attention_available"] is True
    assert set(accel["attention"]) == {
        "flash_sdp_enabled",
        "mem_efficient_sdp_enabled",
        "cudnn_sdp_enabled",
        "math_sdp_enabled",
        "flash_attention_available",
    }


def test_output_printed_by_imported_code_cannot_corrupt_the_json_stream(tmp_path: Path) -> None:
    site = tmp_path / "noisy"
    (site / "torch_musa").mkdir(parents=True)
    # A vendor extension that prints on import, from Python and from "C" (a raw write to fd 1).
    (site / "torch_musa" / "__init__.py").write_text(
        "import os\nprint('torch_musa: hello')\nos.write(1, b'raw bytes from C code\\n')\n"
    )
    out, proc = run_probe(TORCH_PYTHON, {"PYTHONPATH": str(site)})
    assert out.complete and out.stray_lines == 0
    assert all(line.startswith("{") for line in proc.stdout.splitlines())
    assert "torch_musa: hello" in proc.stderr and "raw bytes from C code" in proc.stderr
    assert out.sections["torch_musa"]["torch_musa_registered"] is False
    assert out.sections["accelerator"]["backend"] == "cpu"


def test_lines_printed_before_the_probe_starts_are_skipped_not_fatal(tmp_path: Path) -> None:
    site = tmp_path / "early"
    site.mkdir()
    (site / "sitecustomize.py").write_text("print('printed by sitecustomize before the probe runs')\n")
    out, _ = run_probe(TORCH_PYTHON, {"PYTHONPATH": str(site)})
    assert out.complete and out.stray_lines == 1


def test_a_torch_that_fails_to_import_is_reported_not_fatal(tmp_path: Path) -> None:
    broken = tmp_path / "broken" / "torch"
    broken.mkdir(parents=True)
    (broken / "__init__.py").write_text("raise RuntimeError('libcuda.so: driver version is insufficient')\n")
    out, proc = run_probe(TORCH_PYTHON, {"PYTHONPATH": str(broken.parent)})
    assert proc.returncode == 0 and out.complete
    reasons = {u.item: u.reason for u in out.unavailable}
    assert reasons["torch"] == "RuntimeError: libcuda.so: driver version is insufficient"
    assert out.sections["packages"]["torch"] is not None  # the distribution is still installed


def test_only_switch_variables_are_read_from_the_environment() -> None:
    out, proc = run_probe(TORCH_PYTHON, {"PERFGATE_TEST_UNRELATED": "should-not-appear", "NCCL_ALGO": "Ring"})
    assert "should-not-appear" not in proc.stdout
    assert out.sections["switches"]["NCCL_ALGO"] == "Ring"


def test_the_probe_script_lives_outside_any_workspace_in_a_folder_of_its_own() -> None:
    script = probe_script()
    assert script.is_file() and script.is_absolute()
    assert sorted(p.name for p in script.parent.iterdir() if p.name != "__pycache__") == [
        "__init__.py",
        script.name,
    ]


def test_deepep_and_nvshmem_are_reported_from_package_metadata_without_importing_them(tmp_path: Path) -> None:
    """The MoE exchange stack (issue 45 item 2): DeepEP's distribution and NVSHMEM's wheel are read from
    their metadata (a fake dist-info here; the module would fail if imported), NVSHMEM's switches reported."""
    site = tmp_path / "site"
    for dist, version in (("deep_ep", "1.2.1+abc"), ("nvidia_nvshmem_cu12", "3.3.9")):
        info = site / f"{dist}-{version}.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
    (site / "deep_ep").mkdir()
    (site / "deep_ep" / "__init__.py").write_text("raise RuntimeError('imported')\n")
    out, proc = run_probe(sys.executable, {"PYTHONPATH": str(site), "NVSHMEM_IB_ENABLE_IBGDA": "1"})
    assert proc.returncode == 0, proc.stderr
    assert out.sections["packages"]["deep_ep"] == "1.2.1+abc"
    assert out.sections["packages"]["nvidia-nvshmem-cu12"] == "3.3.9"
    assert out.sections["packages"]["nvidia-nvshmem-cu13"] is None
    assert out.sections["switches"]["NVSHMEM_IB_ENABLE_IBGDA"] == "1"


def _deep_ep_site(root: Path, files: list[str]) -> Path:
    """A site folder with a deep_ep dist-info whose RECORD lists ``files`` (its module fails on import)."""
    info = root / "deep_ep-1.2.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: deep_ep\nVersion: 1.2.1\n")
    record = [*files, "deep_ep/__init__.py,,", "deep_ep-1.2.1.dist-info/METADATA,,"]
    (info / "RECORD").write_text("\n".join(record) + "\n")
    (root / "deep_ep").mkdir()
    (root / "deep_ep" / "__init__.py").write_text("raise RuntimeError('imported')\n")
    return root


@pytest.mark.parametrize(
    ("files", "hybrid"),
    [
        (["deep_ep/hybrid_ep_buffer.py,,", "hybrid_ep_cpp.cpython-312-x86_64-linux-gnu.so,,"], True),
        (["hybrid_ep_cpp.cpython-310-x86_64-linux-gnu.so,,"], True),
        (["deep_ep/buffer.py,,", "deep_ep_cpp.cpython-312-x86_64-linux-gnu.so,,"], False),
    ],
)
def test_hybrid_ep_is_found_in_deep_eps_file_list_without_importing_it(
    tmp_path: Path, files: list[str], hybrid: bool
) -> None:
    site = _deep_ep_site(tmp_path / "site", files)
    out, proc = run_probe(sys.executable, {"PYTHONPATH": str(site)})
    assert proc.returncode == 0, proc.stderr
    section = out.sections["deep_ep"]
    assert section["installed"] is True and section["hybrid_ep"] is hybrid
    assert bool(section["hybrid_ep_files"]) is hybrid


def test_without_deep_ep_hybrid_ep_is_unknown_not_false() -> None:
    out, proc = run_probe(sys.executable)
    assert proc.returncode == 0, proc.stderr
    assert out.sections["deep_ep"] == {"installed": False, "hybrid_ep": None, "hybrid_ep_files": []}
