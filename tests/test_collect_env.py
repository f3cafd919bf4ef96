"""collect_env end to end: the server's own interpreter, another interpreter through the approval gate,
the NVIDIA and MUSA branches with fakes, git provenance, and every way the probe can fail."""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import platform
import re
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client

import perfgate.tools
from _trust import operator_policy
from perfgate.envprobe import compare_fingerprints, probe_script
from perfgate.errors import ToolError
from perfgate.evidence import Ledger
from perfgate.security.trustroot import TrustRoot
from perfgate.server import build_server
from perfgate.serving.runtime import ServerConfig, ToolRuntime
from perfgate.tools import collect_env
from perfgate.tools.collect_env import CollectEnvInput, CollectEnvOutput, command, run

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

FAKES = Path(__file__).parent / "fakes"
TOOL = "collect_env"


def runtime(workspace: Path, inp: CollectEnvInput) -> ToolRuntime:
    rt = ToolRuntime(config=ServerConfig.create(workspace), ledger=Ledger(workspace), tool=TOOL)
    rt.inputs = inp.model_dump(mode="json")
    return rt


async def collect(workspace: Path, **kwargs: Any) -> CollectEnvOutput:
    inp = CollectEnvInput.model_validate(kwargs)
    return await run(inp, runtime(workspace, inp))


def artifact_dir(workspace: Path, evidence_id: str) -> Path:
    return Ledger(workspace).artifact_dir(evidence_id)


def environment_json(workspace: Path, evidence_id: str) -> dict[str, Any]:
    return json.loads((artifact_dir(workspace, evidence_id) / "environment.json").read_text())


def plain_python() -> str:
    """A second real interpreter without torch (the system python), or skip."""
    for candidate in (
        os.environ.get("PERFGATE_TEST_PLAIN_PYTHON"),
        "/root/.pyenv/shims/python3",
        "/usr/bin/python3",
    ):
        if (
            candidate
            and os.path.exists(candidate)
            and subprocess.run([candidate, "-c", "import torch"], capture_output=True).returncode != 0
        ):
            return candidate
    pytest.skip("no interpreter without torch on this machine")


def fake_interpreter(tmp_path: Path, name: str, body: str) -> Path:
    path = tmp_path / name
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(0o755)
    return path


def allowlist(workspace: Path, python: str | Path) -> None:
    rule = json.dumps([str(python), str(probe_script())])
    operator_policy(f'[execution]\n\n[[execution.allow]]\nargv = {rule}\nexact = true\ncode = "any"\n')


@pytest.fixture
def with_collect_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make sure the server registers collect_env (whether or not the registry lists it yet)."""
    if collect_env.SPEC not in perfgate.tools.REGISTRY:
        monkeypatch.setattr(perfgate.tools, "REGISTRY", (*perfgate.tools.REGISTRY, collect_env.SPEC))


def text(result: Any) -> str:
    return " ".join(getattr(c, "text", "") for c in result.content)


# ---------------------------------------------------------------- the server's own interpreter


@pytest.fixture(scope="module")
def own_runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, CollectEnvOutput, CollectEnvOutput]:
    """Two collections with the server's own interpreter in a workspace that is not a git repository,
    signed by a trust root of their own beside it (`_own_trust`): each test has another."""
    workspace = tmp_path_factory.mktemp("own") / "ws"
    workspace.mkdir()
    trust = _own_trust(workspace)
    with pytest.MonkeyPatch.context() as env:
        env.setenv("PERFGATE_STATE_DIR", str(trust.state_dir))
        env.setenv("PERFGATE_CONFIG_DIR", str(trust.config_dir))
        first = anyio.run(
            lambda: collect(workspace, launch_command=["torchrun", "--nproc-per-node=1", "train.py"])
        )
        second = anyio.run(lambda: collect(workspace, system_tools=False))
    return workspace, first, second


def _own_trust(workspace: Path) -> TrustRoot:
    return TrustRoot.locate(state_dir=workspace.parent / "state", config_dir=workspace.parent / "config")


def test_the_servers_own_interpreter_needs_no_approval(workspace: Path) -> None:
    inp = CollectEnvInput()
    assert command(inp, runtime(workspace, inp)) is None
    assert command(CollectEnvInput(python=sys.executable), runtime(workspace, inp)) is None


def test_extra_variables_or_another_interpreter_make_the_probe_gated(workspace: Path) -> None:
    inp = CollectEnvInput(env={"PYTHONPATH": str(workspace)})
    request = command(inp, runtime(workspace, inp))
    assert request is not None and request.argv == (sys.executable, str(probe_script()))
    assert request.env == {"PYTHONPATH": str(workspace)} and request.cwd == workspace.resolve()
    other = CollectEnvInput(python=plain_python())
    gated = command(other, runtime(workspace, other))
    assert gated is not None and gated.argv[0] == plain_python()


def test_own_interpreter_versions_match_what_it_reports(
    own_runs: tuple[Path, CollectEnvOutput, CollectEnvOutput],
) -> None:
    _, out, _ = own_runs
    assert out.state == "executed" and out.failure is None and out.server_interpreter
    assert out.environment_id == out.evidence_id
    s = out.summary
    assert s.python_version == platform.python_version()
    assert s.torch_version == importlib.metadata.version("torch")
    assert s.packages["numpy"] == importlib.metadata.version("numpy")
    assert s.packages["torch"] == s.torch_version
    assert s.backend == "cpu" and s.devices == [] and s.cpu_count == len(os.sched_getaffinity(0))
    assert out.fingerprint.fields["torch"] == s.torch_version and out.fingerprint.fields["backend"] == "cpu"
    assert out.provenance.launch_command == ["torchrun", "--nproc-per-node=1", "train.py"]
    assert out.probe_exit_code == 0 and not out.probe_timed_out


def test_the_record_and_its_artifacts_are_in_the_ledger(
    own_runs: tuple[Path, CollectEnvOutput, CollectEnvOutput],
) -> None:
    workspace, out, _ = own_runs
    ledger = Ledger(workspace, _own_trust(workspace))
    record = ledger.get(out.evidence_id)
    assert record is not None and record.tool == TOOL and record.state == "executed"
    assert record.environment_id == out.evidence_id and record.exit_code == 0
    assert record.command is not None and record.command[-1] == str(probe_script())
    assert (
        {a.name for a in record.artifacts}
        == set(out.artifacts)
        >= {
            "environment.json",
            "probe_stdout.log",
            "probe_stderr.log",
        }
    )
    doc = environment_json(workspace, out.evidence_id)
    assert doc["environment_id"] == out.evidence_id and doc["state"] == "executed"
    assert doc["fingerprint"] == out.fingerprint.model_dump(mode="json")
    assert doc["observed"]["host"]["hostname"] == "<hostname>"
    assert ledger.verify().ok


def test_the_fingerprint_is_stable_between_collections(
    own_runs: tuple[Path, CollectEnvOutput, CollectEnvOutput],
) -> None:
    _, first, second = own_runs
    assert first.evidence_id != second.evidence_id
    assert first.fingerprint == second.fingerprint
    assert compare_fingerprints(first.fingerprint, second.fingerprint) == []


def test_a_workspace_that_is_not_a_git_repo_is_reported_not_fatal(
    own_runs: tuple[Path, CollectEnvOutput, CollectEnvOutput],
) -> None:
    workspace, out, _ = own_runs
    assert out.provenance.git is None
    reasons = {u.item: u.reason for u in out.unavailable}
    assert reasons["git"] == f"the workspace {workspace.resolve()} is not inside a git repository"


def test_everything_not_observed_is_listed_with_a_reason(
    own_runs: tuple[Path, CollectEnvOutput, CollectEnvOutput],
) -> None:
    _, first, second = own_runs
    items = {u.item for u in second.unavailable}
    assert {"system_tools", "git", "launch_command", "attention", "precision.bf16_supported"} <= items
    assert all(u.reason for u in second.unavailable)
    assert first.summary.bf16_supported is None and first.summary.attention is None


async def test_git_provenance_records_commit_dirty_state_and_the_diff(workspace: Path) -> None:
    def git(*args: str) -> str:
        return subprocess.run(
            ["git", "-C", str(workspace), "-c", "user.name=t", "-c", "user.email=t@example.com", *args],
            check=True,
            capture_output=True,
            text=True,
        ).stdout

    git("init", "-q")
    (workspace / "train.py").write_text("lr = 1e-3\n")
    git("add", "train.py")
    git("commit", "-q", "-m", "baseline")
    (workspace / "train.py").write_text("lr = 2e-3\n")
    (workspace / "notes.txt").write_text("untracked\n")
    out = await collect(workspace, system_tools=False)
    prov = out.provenance.git
    assert prov is not None
    assert prov.commit == git("rev-parse", "HEAD").strip()
    assert prov.dirty and prov.changed_files == 1 and prov.untracked_files == 1  # .perfgate/ is not counted
    # the diff is written by perfgate (no git runs), in git's layout with full blob ids
    blob = git("rev-parse", "HEAD:train.py").strip()
    raw = (artifact_dir(workspace, out.evidence_id) / "git.diff").read_bytes()
    assert prov.diff_sha256 == hashlib.sha256(raw).hexdigest() and prov.diff_bytes == len(raw)
    assert raw.decode().startswith(f"diff --git a/train.py b/train.py\nindex {blob}..")
    assert b"-lr = 1e-3\n+lr = 2e-3\n" in raw
    assert prov.diff_artifact == "git.diff" and not prov.diff_artifact_redacted


# ---------------------------------------------------------------- NVIDIA and MUSA branches (fakes)


async def test_nvidia_branch_with_fake_smi_and_fake_cuda_build(
    workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", f"{FAKES / 'fake_nvidia_bin'}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("PYTHONPATH", str(FAKES / "fake_torch_cuda_site"))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    monkeypatch.setenv("NCCL_IB_DISABLE", "1")
    out = await collect(workspace)
    s = out.summary
    assert out.state == "executed" and s.backend == "cuda"
    assert [d.name for d in s.devices] == ["NVIDIA H100 80GB HBM3"] * 2
    assert (s.runtime_version, s.driver_version, s.driver_source) == ("12.4", "550.54.15", "nvidia-smi")
    assert s.libraries == {"cudnn": "9.1.0", "nccl": "2.21.5"}
    assert s.bf16_supported is True and s.tf32["tf32_hardware"] is True
    assert s.attention is not None and s.attention["flash_attention_available"] is True
    vis = out.visibility
    assert (vis.governing_variable, vis.listed_count, vis.process_device_count, vis.system_device_count) == (
        "CUDA_VISIBLE_DEVICES",
        2,
        2,
        8,
    )
    assert not vis.mismatch
    assert out.switches["NCCL_IB_DISABLE"] == "1"
    assert out.fingerprint.fields["devices"] == ["2 x NVIDIA H100 80GB HBM3"]
    assert out.fingerprint.fields["driver"] == "550.54.15" and out.fingerprint.fields["cudnn"] == "9.1.0"
    tools = {t.name: t for t in out.system_tools}
    assert tools["nvidia-smi"].artifact == "systool_nvidia-smi.txt"
    assert "systool_nvidia-smi.txt" in out.artifacts and "systool_nsys.txt" in out.artifacts
    raw = (artifact_dir(workspace, out.evidence_id) / "systool_nvidia-smi.txt").read_text()
    assert "NVIDIA H100 80GB HBM3" in raw and "--query-gpu" in raw
    assert tools["nsys"].version == "2024.2.1.106-242134037904v0"
    # The interconnect: NVLink from the fake's topo -m and nvlink --status, fingerprinted by shape only.
    assert out.topology.gpu_links == {"NV18": 28} and out.topology.nvlink_active_links == 8 * 18
    assert out.fingerprint.fields["gpu_links"] == ["28 x NV18"]
    assert out.topology.hybrid_ep is None and out.topology.notes == []  # no deep_ep: nothing to note
    assert "systool_nvidia-smi-topology.txt" in out.artifacts
    topo = (artifact_dir(workspace, out.evidence_id) / "systool_nvidia-smi-topology.txt").read_text()
    assert "$ " in topo and "topo -m" in topo and "nvlink --status" in topo
    assert environment_json(workspace, out.evidence_id)["topology"]["gpu_links"] == {"NV18": 28}


async def test_a_deep_ep_build_without_hybrid_ep_on_pcie_gpus_is_noted(
    workspace: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The training environment has DeepEP (no HybridEP files in its RECORD); the host's GPUs are PCIe only."""
    site = tmp_path / "site"
    info = site / "deep_ep-1.2.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: deep_ep\nVersion: 1.2.1\n")
    (info / "RECORD").write_text("deep_ep/__init__.py,,\ndeep_ep/buffer.py,,\n")
    monkeypatch.setenv("PATH", f"{FAKES / 'fake_nvidia_bin'}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("PERFGATE_FAKE_SMI_TOPO", "pcie")
    monkeypatch.setenv("PYTHONPATH", str(site))
    out = await collect(workspace)
    assert out.summary.packages["deep_ep"] == "1.2.1"
    assert out.topology.hybrid_ep is False and out.topology.gpu_links == {"NODE": 8, "PIX": 4, "SYS": 16}
    assert out.topology.notes[0] == (
        "intranode DeepEP/HybridEP expects NVLink between GPUs: nvidia-smi topo -m shows none"
    )
    assert out.topology.notes[-1] == (
        "deep_ep is installed without HybridEP (no hybrid_ep files): the hybridep backend cannot load"
    )


async def test_a_gpu_host_with_a_cpu_only_torch_is_flagged(
    workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", f"{FAKES / 'fake_nvidia_bin'}{os.pathsep}{os.environ['PATH']}")
    out = await collect(workspace)
    assert out.summary.backend == "cpu" and out.visibility.mismatch
    assert out.visibility.system_device_count == 8
    assert any(
        "nvidia-smi list 8 accelerator(s) on this host but the process runs on CPU" in w for w in out.warnings
    )
    assert out.summary.driver_version is None  # the host's driver is not the process's


async def test_musa_branch_with_fake_gmi_and_fake_torch_musa(
    workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", f"{FAKES / 'fake_mthreads_bin'}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("PYTHONPATH", str(FAKES / "fake_torch_musa_site"))
    monkeypatch.setenv("PERFGATE_FAKE_MUSA_PHYSICAL", "2")  # the host has 2 cards...
    monkeypatch.setenv("MUSA_VISIBLE_DEVICES", "0,1,2,3")  # ...but the launch script lists 4
    monkeypatch.setenv("MCCL_ALGO", "Ring")
    out = await collect(workspace)
    s = out.summary
    assert out.state == "executed" and s.backend == "musa"
    assert [d.name for d in s.devices] == ["MTT S4000", "MTT S4000"]
    assert (s.runtime_version, s.driver_version, s.driver_source) == ("4.0.0", "2.7.0", "mthreads-gmi")
    assert s.libraries == {"mudnn": "2900", "mccl": "2.11.4"}
    assert s.packages["torch_musa"] == "2.0.0+fake"
    assert s.tf32 == {"float32_matmul_precision": "highest", "tf32_mudnn_allowed": False}
    vis = out.visibility
    assert (
        vis.mismatch
        and vis.listed_count == 4
        and vis.process_device_count == 2
        and vis.system_device_count == 2
    )
    assert any(
        "MUSA_VISIBLE_DEVICES='0,1,2,3' lists 4 device(s) but the process sees 2" in w for w in out.warnings
    )
    assert out.switches["MCCL_ALGO"] == "Ring"
    assert (
        out.fingerprint.fields["pkg:torch_musa"] == "2.0.0+fake"
        and out.fingerprint.fields["mccl"] == "2.11.4"
    )
    assert "systool_mthreads-gmi.txt" in out.artifacts and "systool_msys.txt" in out.artifacts


def fake_musa_home(root: Path, toolkit: str, mublas: str | None = "1.6.0") -> Path:
    """An SDK tree as the MUSA installer lays it out: version.json (components with their versions) and
    versioned libraries with their links in lib/."""
    root.mkdir()
    (root / "version.json").write_text(
        json.dumps(
            {
                "musa_runtime": {"version": toolkit, "commitid": "0" * 40},
                "musa_toolkits": {"version": toolkit, "gitbranch": f"rc{toolkit}"},
                "mudnn": {"version": "2.9.0"},
            }
        )
    )
    lib = root / "lib"
    lib.mkdir()
    names = [f"libmusart.so.{toolkit}"] + ([f"libmublas.so.{mublas}"] if mublas else [])
    for name in names:
        (lib / name).write_bytes(b"\x7fELF")
        short = name.rsplit(".", 2)[0]  # libmublas.so.1.6.0 -> libmublas.so.1
        (lib / short).symlink_to(name)
    return root


async def test_the_installed_musa_sdk_and_mublas_are_reported_apart_from_torchs_build(
    workspace: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", f"{FAKES / 'fake_mthreads_bin'}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("PYTHONPATH", str(FAKES / "fake_torch_musa_site"))
    home = fake_musa_home(tmp_path / "musa-4.2.0", "4.2.0")
    monkeypatch.setenv("MUSA_HOME", str(home))
    out = await collect(workspace)
    s = out.summary
    # torch_musa (the fake) was built with MUSA 4.0.0; the SDK on disk is 4.2.0: both said, and the mismatch.
    assert (s.runtime_version, s.sdk_version) == ("4.0.0", "4.2.0")
    assert s.libraries["mublas"] == "1.6.0" and s.libraries["musart"] == "4.2.0"
    assert any(
        "built against MUSA 4.0.0 but the installed MUSA SDK (version.json) is 4.2.0" in w
        for w in out.warnings
    )
    # The SDK facts name where the root came from, not its path (MUSA_HOME's value stays in `switches`).
    assert str(home) not in json.dumps(s.model_dump(mode="json"))

    monkeypatch.setenv("MUSA_HOME", str(fake_musa_home(tmp_path / "musa-4.0.0", "4.0.0", mublas=None)))
    out = await collect(workspace)
    assert out.summary.sdk_version == "4.0.0" and "mublas" not in out.summary.libraries
    assert not any("built against MUSA" in w for w in out.warnings)
    assert any(u.item == "mublas.version" and "libmublas" in u.reason for u in out.unavailable)

    monkeypatch.setenv("MUSA_HOME", str(tmp_path / "nowhere"))
    out = await collect(workspace)
    assert out.summary.sdk_version is None
    assert any(u.item == "musa_sdk" and u.reason == "MUSA_HOME is not a directory" for u in out.unavailable)


# ---------------------------------------------------------------- another interpreter, through the gate


async def test_a_second_interpreter_runs_through_the_gate_and_reports_differently(
    workspace: Path, mode: str, with_collect_env: None
) -> None:
    python = plain_python()
    allowlist(workspace, python)
    async with Client(build_server(ServerConfig.create(workspace)), mode=mode) as client:
        other = await client.call_tool(TOOL, {"python": python, "system_tools": False})
        own = await client.call_tool(TOOL, {"system_tools": False})
    assert not other.is_error, text(other)
    assert not own.is_error, text(own)
    a, b = other.structured_content, own.structured_content
    assert a is not None and b is not None
    assert a["state"] == "executed" and not a["server_interpreter"] and b["server_interpreter"]
    assert a["summary"]["torch_version"] is None and b["summary"]["torch_version"] is not None
    assert {"item": "torch", "reason": "ModuleNotFoundError: No module named 'torch'"} in a["unavailable"]
    version = subprocess.run(
        [python, "-c", "import platform; print(platform.python_version())"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert a["summary"]["python_version"] == version
    assert "torch" in {d.field for d in compare_fingerprints(a["fingerprint"], b["fingerprint"])}
    record = Ledger(workspace).get(a["evidence_id"])
    assert record is not None and record.command is not None
    doc = environment_json(workspace, a["evidence_id"])
    assert doc["probe"]["approved_how"] == "allowlist" and doc["probe"]["approval_evidence_id"]


async def test_another_interpreter_without_approval_does_not_run(
    workspace: Path, mode: str, with_collect_env: None
) -> None:
    async with Client(build_server(ServerConfig.create(workspace)), mode=mode) as client:
        result = await client.call_tool(TOOL, {"python": plain_python()})
    assert result.is_error and "perfgate approve" in text(result)
    assert Ledger(workspace).records(tool=TOOL) == []


async def test_read_only_servers_do_not_offer_collect_env(
    workspace: Path, mode: str, with_collect_env: None
) -> None:
    async with Client(build_server(ServerConfig.create(workspace, read_only=True)), mode=mode) as client:
        names = [t.name for t in (await client.list_tools()).tools]
    assert TOOL not in names


# ---------------------------------------------------------------- interpreters that are missing, broken or hang


def unusable(workspace: Path, kind: str) -> Path:
    if kind == "missing":
        return workspace / "no-such-python"
    if kind == "directory":
        return workspace
    path = workspace / kind
    if kind == "not-executable":
        path.write_text("#!/bin/sh\n")
    else:  # "not-a-program": executable bit, but neither ELF nor #!
        path.write_bytes(b"\x00\x01 data")
        path.chmod(0o755)
    return path


@pytest.mark.parametrize(
    ("kind", "message"),
    [
        ("missing", "does not exist"),
        ("directory", "is not a file"),
        ("not-executable", "is not executable"),
        ("not-a-program", "neither a native executable"),
    ],
)
async def test_an_unusable_interpreter_path_is_a_clear_error(
    workspace: Path, mode: str, with_collect_env: None, kind: str, message: str
) -> None:
    target = unusable(workspace, kind)
    async with Client(build_server(ServerConfig.create(workspace)), mode=mode) as client:
        result = await client.call_tool(TOOL, {"python": str(target)})
    assert result.is_error and message in text(result), text(result)
    inp = CollectEnvInput(python=str(target))
    with pytest.raises(ToolError, match=message):
        command(inp, runtime(workspace, inp))
    assert Ledger(workspace).records(tool=TOOL) == []


async def test_a_missing_command_name_is_a_clear_error(workspace: Path) -> None:
    inp = CollectEnvInput(python="no-such-python-anywhere")
    with pytest.raises(ToolError, match="on the server's PATH"):
        command(inp, runtime(workspace, inp))


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ("echo 'fatal: not really python' >&2; exit 3", "exited with status 3: ⟦fatal: not really python⟧"),
        ("exit 0", "does not behave like a Python 3 interpreter"),
    ],
)
async def test_a_broken_interpreter_gives_failed_evidence_with_the_reason(
    workspace: Path, tmp_path: Path, mode: str, with_collect_env: None, body: str, expected: str
) -> None:
    broken = fake_interpreter(tmp_path, "broken-python", body)
    allowlist(workspace, broken)
    async with Client(build_server(ServerConfig.create(workspace)), mode=mode) as client:
        result = await client.call_tool(TOOL, {"python": str(broken), "system_tools": False})
    assert not result.is_error, text(result)
    out = result.structured_content
    assert out is not None and out["state"] == "failed" and expected in out["failure"]
    assert out["summary"]["python_version"] is None
    record = Ledger(workspace).get(out["evidence_id"])
    assert record is not None and record.state == "failed"


async def test_a_hanging_probe_is_killed_at_its_timeout_and_keeps_what_it_saw(
    workspace: Path, tmp_path: Path, mode: str, with_collect_env: None
) -> None:
    # A fake interpreter: the real one, with a torch whose import never returns.
    hanging = fake_interpreter(
        tmp_path,
        "python-with-hanging-torch",
        f'PYTHONPATH={FAKES / "fake_hanging_torch_site"} exec {sys.executable} "$@"',
    )
    allowlist(workspace, hanging)
    # The probe must reach 'import torch' before the timeout: about 0.3 s quiet, close to 2 s on a loaded
    # 2-core machine (it starts Python and reads every installed package's metadata first).
    async with Client(build_server(ServerConfig.create(workspace)), mode=mode) as client:
        result = await client.call_tool(TOOL, {"python": str(hanging), "timeout_s": 8, "system_tools": False})
    assert not result.is_error, text(result)
    out = result.structured_content
    assert out is not None and out["state"] == "failed" and out["probe_timed_out"]
    assert "timeout during 'import torch'" in out["failure"]
    # facts gathered before the hang survive
    assert out["summary"]["python_version"] == platform.python_version()
    assert out["summary"]["packages"]["torch"] == importlib.metadata.version("torch")
    assert {"item": "probe", "reason": "the probe stopped during: import torch"} in out["unavailable"]


async def test_a_probe_log_replaced_in_the_workspace_mid_run_is_not_what_the_record_says(
    workspace: Path, mode: str, with_collect_env: None
) -> None:
    # The agent's move: while the server's own probe runs, a thread replaces every probe log it finds
    # under .perfgate/ with a copy claiming another Python. The facts must come from the server's own
    # capture, which the agent cannot reach.
    real = subprocess.run(
        [sys.executable, str(probe_script())], capture_output=True, text=True, check=True, timeout=300
    ).stdout
    forged = re.sub(r'"version": "3[.][0-9.]*"', '"version": "0.0.1"', real)
    assert forged != real
    done = threading.Event()

    def forge() -> None:
        seen: set[Path] = set()
        while not done.is_set():
            for log in workspace.glob(".perfgate/artifacts/*/probe_stdout.log"):
                if log not in seen:
                    aside = log.with_name("forged.tmp")
                    aside.write_text(forged)
                    os.replace(aside, log)
                    seen.add(log)
            time.sleep(0.001)

    forger = threading.Thread(target=forge, daemon=True)
    forger.start()
    try:
        async with Client(build_server(ServerConfig.create(workspace)), mode=mode) as client:
            result = await client.call_tool(TOOL, {"system_tools": False})
    finally:
        done.set()
        forger.join(timeout=10)
    assert not result.is_error, text(result)
    out = result.structured_content
    assert out is not None and out["state"] == "executed", out
    assert out["summary"]["python_version"] == platform.python_version()
