"""collect_env's interconnect facts (issue 45 item 2): NVLink from a fake nvidia-smi on PATH, RDMA ports and
the GPUDirect RDMA module from fake sysfs trees, what is fingerprinted, and the notes for DeepEP/HybridEP.

The fakes stand in only for the hardware boundary: `tests/fakes/fake_nvidia_bin/nvidia-smi` prints the
``topo -m`` and ``nvlink --status`` layouts its docstring cites, and the sysfs trees below hold the files
the kernel's InfiniBand class exposes (``ports/<n>/state``, ``rate``, ``link_layer``)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from perfgate.envprobe import Device, Fingerprint, compare_fingerprints, make_fingerprint
from perfgate.envprobe.systools import safe_which
from perfgate.envprobe.topology import (
    collect_topology,
    fingerprint_facts,
    parse_nvlink_status,
    parse_topo_matrix,
    topology_notes,
)

FAKES = Path(__file__).parent / "fakes"
NVIDIA_BIN = FAKES / "fake_nvidia_bin"


def smi_env(**extra: str) -> dict[str, str]:
    return {**os.environ, "PATH": f"{NVIDIA_BIN}{os.pathsep}{os.environ.get('PATH', '')}", **extra}


def smi() -> str:
    path = safe_which("nvidia-smi", smi_env()["PATH"], None)
    assert path is not None and path == str(NVIDIA_BIN / "nvidia-smi")
    return path


def sysfs(
    root: Path, ports: dict[str, tuple[str, str, str]] | None = None, modules: tuple[str, ...] = ()
) -> Path:
    """A fake /sys under ``root``: ``ports`` maps 'device/port' to (state, rate, link_layer)."""
    (root / "sys" / "class" / "net").mkdir(parents=True)
    for name in ("nvidia", *modules):
        (root / "sys" / "module" / name).mkdir(parents=True)
    for key, (state, rate, layer) in (ports or {}).items():
        device, port = key.split("/")
        folder = root / "sys" / "class" / "infiniband" / device / "ports" / port
        folder.mkdir(parents=True)
        (folder / "state").write_text(state + "\n")
        (folder / "rate").write_text(rate + "\n")
        (folder / "link_layer").write_text(layer + "\n")
    return root


NDR = ("4: ACTIVE", "400 Gb/sec (4X NDR)", "InfiniBand")
UNREADABLE = "is not readable here (not Linux, or sysfs not mounted)"


def test_an_nvlink_host_with_infiniband_and_peer_memory_is_read_whole(tmp_path: Path) -> None:
    root = sysfs(tmp_path, {"mlx5_0/1": NDR, "mlx5_1/1": NDR}, modules=("nvidia_peermem",))
    topo, transcript, missing = collect_topology(env=smi_env(), nvidia_smi=smi(), root=root)
    assert missing == []
    assert topo.gpu_links == {"NV18": 28}  # 8 GPUs: every one of the 28 pairs bonds 18 NVLinks
    assert (topo.nvlink_active_links, topo.nvlink_inactive_links) == (8 * 18, 0)
    assert topo.rdma_ports is not None
    assert [(p.device, p.port, p.state, p.rate, p.link_layer) for p in topo.rdma_ports] == [
        ("mlx5_0", 1, *NDR),
        ("mlx5_1", 1, *NDR),
    ]
    assert topo.peer_memory_module == "nvidia_peermem"
    assert "topo -m" in transcript and "NV18" in transcript and "Link 17: 26.562 GB/s" in transcript
    assert topology_notes(topo, deep_ep_installed=True) == []


def test_a_pcie_only_host_without_rdma_gets_the_notes_deepep_needs(tmp_path: Path) -> None:
    root = sysfs(tmp_path)
    topo, _, missing = collect_topology(
        env=smi_env(PERFGATE_FAKE_SMI_TOPO="pcie"), nvidia_smi=smi(), root=root
    )
    assert missing == []
    assert topo.gpu_links == {"NODE": 8, "PIX": 4, "SYS": 16}
    assert (topo.nvlink_active_links, topo.nvlink_inactive_links) == (0, 0)
    assert topo.rdma_ports == [] and topo.peer_memory_module is None
    assert topology_notes(topo, deep_ep_installed=True) == [
        "intranode DeepEP/HybridEP expects NVLink between GPUs: nvidia-smi topo -m shows none",
        "internode DeepEP/HybridEP needs RDMA: none found (/sys/class/infiniband)",
    ]
    # Without deep_ep in the training environment none of this limits anything: no notes.
    assert topology_notes(topo, deep_ep_installed=False) == []


def test_ports_that_are_down_or_lack_peer_memory_are_named(tmp_path: Path) -> None:
    down = ("1: DOWN", "10 Gb/sec (4X SDR)", "InfiniBand")
    topo, _, _ = collect_topology(env={}, nvidia_smi=None, root=sysfs(tmp_path / "a", {"mlx5_0/1": down}))
    assert "internode DeepEP/HybridEP needs RDMA: 1 port(s) found, none ACTIVE" in topology_notes(topo, True)
    roce = ("4: ACTIVE", "200 Gb/sec (4X HDR)", "Ethernet")
    topo, _, _ = collect_topology(env={}, nvidia_smi=None, root=sysfs(tmp_path / "b", {"mlx5_2/1": roce}))
    assert topology_notes(topo, True) == [
        "RDMA ports are up but no GPUDirect RDMA module (nvidia_peermem, nv_peer_mem) is loaded"
    ]
    older = sysfs(tmp_path / "c", {"mlx5_2/1": roce}, modules=("nv_peer_mem",))
    topo, _, _ = collect_topology(env={}, nvidia_smi=None, root=older)
    assert topo.peer_memory_module == "nv_peer_mem" and topology_notes(topo, True) == []
    hybrid_less = topo.model_copy(update={"hybrid_ep": False})
    assert topology_notes(hybrid_less, True) == [
        "deep_ep is installed without HybridEP (no hybrid_ep files): the hybridep backend cannot load"
    ]


def test_no_nvidia_smi_and_no_sysfs_report_not_found_cleanly(tmp_path: Path) -> None:
    topo, transcript, missing = collect_topology(env={"PATH": str(tmp_path)}, nvidia_smi=None, root=tmp_path)
    assert transcript == ""
    assert (topo.gpu_links, topo.nvlink_active_links, topo.rdma_ports, topo.peer_memory_module) == (
        None,
        None,
        None,
        None,
    )
    assert dict(missing) == {
        "topology.nvlink": "nvidia-smi not found on PATH (or system_tools=false)",
        "topology.rdma_ports": f"{tmp_path / 'sys' / 'class'} {UNREADABLE}",
        "topology.peer_memory_module": f"{tmp_path / 'sys' / 'module'} {UNREADABLE}",
    }
    # Not observed is not "none": no note claims RDMA or NVLink is missing.
    assert topology_notes(topo, deep_ep_installed=True) == []


def test_a_failing_nvidia_smi_subcommand_is_unavailable_with_its_error(tmp_path: Path) -> None:
    fake = tmp_path / "bin" / "nvidia-smi"
    fake.parent.mkdir()
    failed = "NVIDIA-SMI has failed because it could not communicate with the driver"
    fake.write_text(f"#!/bin/sh\necho '{failed}' >&2\nexit 9\n")
    fake.chmod(0o755)
    topo, _, missing = collect_topology(env={}, nvidia_smi=str(fake), root=sysfs(tmp_path / "root"))
    assert topo.gpu_links is None and topo.nvlink_active_links is None
    reasons = dict(missing)
    assert reasons["topology.gpu_links"].startswith(
        "nvidia-smi topo -m: exit status 9: NVIDIA-SMI has failed"
    )
    assert reasons["topology.nvlink"].startswith("nvidia-smi nvlink --status: exit status 9")


def test_the_matrix_parser_reads_space_separated_output_and_ignores_nic_rows() -> None:
    text = (
        "        GPU0    GPU1    GPU2    NIC0    CPU Affinity    NUMA Affinity\n"
        "GPU0     X      NV4     SYS     PXB     0-31            0\n"
        "GPU1    NV4      X      SYS     PXB     0-31            0\n"
        "GPU2    SYS     SYS      X      SYS     32-63           1\n"
        "NIC0    PXB     PXB     SYS      X\n"
    )
    assert parse_topo_matrix(text) == {"NV4": 1, "SYS": 2}
    assert parse_topo_matrix("No devices were found\n") is None
    status = (
        "GPU 0: A100 (UUID: GPU-1)\n\t Link 0: 25 GB/s\n\t Link 1: <inactive>\nGPU 1: A100 (UUID: GPU-2)\n"
    )
    assert parse_nvlink_status(status) == (1, 1)
    assert parse_nvlink_status("GPU 0: A100 (UUID: GPU-1)\n") is None


def _fingerprint(root: Path, env: dict[str, str]) -> Fingerprint:
    topo, _, _ = collect_topology(env=env, nvidia_smi=smi(), root=root)
    return make_fingerprint(
        backend="cuda",
        devices=[Device(index=0, name="NVIDIA H100 80GB HBM3", total_memory_bytes=1, capability="9.0")],
        python_version="3.11.7",
        torch_version="2.5.1",
        runtime_version="12.4",
        driver_version="550.54.15",
        libraries={},
        packages={},
        cpu_model="x",
        cpu_count=1,
        machine="x86_64",
        interconnect=fingerprint_facts(topo),
    )


@pytest.mark.parametrize(
    ("change", "differs"),
    [
        ({"mlx5_0/1": ("1: DOWN", "400 Gb/sec (4X NDR)", "InfiniBand")}, set[str]()),
        ({"mlx5_0/1": ("4: ACTIVE", "100 Gb/sec (4X EDR)", "InfiniBand")}, set[str]()),
        ({"mlx5_0/1": ("4: ACTIVE", "400 Gb/sec", "Ethernet")}, {"rdma_ports"}),
        ({}, {"rdma_ports"}),
    ],
)
def test_the_fingerprint_holds_the_machines_shape_not_its_link_state(
    tmp_path: Path, change: dict[str, tuple[str, str, str]], differs: set[str]
) -> None:
    base = _fingerprint(sysfs(tmp_path / "a", {"mlx5_0/1": NDR}, modules=("nvidia_peermem",)), smi_env())
    other = _fingerprint(sysfs(tmp_path / "b", change), smi_env())  # no peer-memory module either
    assert {d.field for d in compare_fingerprints(base, other)} == differs
    assert base.fields["gpu_links"] == ["28 x NV18"]
    assert base.fields["rdma_ports"] == ["mlx5_0/1 InfiniBand"]


def test_nvlink_against_pcie_is_another_machine(tmp_path: Path) -> None:
    root = sysfs(tmp_path)
    nv = _fingerprint(root, smi_env())
    pcie = _fingerprint(root, smi_env(PERFGATE_FAKE_SMI_TOPO="pcie"))
    assert [d.field for d in compare_fingerprints(nv, pcie)] == ["gpu_links"]
