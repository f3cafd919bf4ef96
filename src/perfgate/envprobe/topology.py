"""Interconnect facts DeepEP and HybridEP depend on: NVLink between GPUs, RDMA ports, GPUDirect RDMA.

Everything is feature-detected on the host, without importing anything heavy:

- NVLink from ``nvidia-smi topo -m`` (the GPU connection matrix) and ``nvidia-smi nvlink --status`` (each
  link's speed, or ``<inactive>``), run like the other system tools (fixed argv, timeout, no shell);
- RDMA ports from sysfs, ``<root>/sys/class/infiniband/<device>/ports/<n>/{state,rate,link_layer}``;
- the GPUDirect RDMA kernel module from ``<root>/sys/module/nvidia_peermem`` (or the older ``nv_peer_mem``).

``root`` is ``/`` on a real host; tests point it at a fake tree. Whether HybridEP is installed is the
probe's finding (it reads deep_ep's file list inside the training interpreter) and is merged in by
`perfgate.envprobe.collect.assemble`.
"""

from __future__ import annotations

import os
import re
from collections import Counter
from collections.abc import Mapping
from pathlib import Path

from perfgate.envprobe.fixed import run_fixed
from perfgate.envprobe.models import RdmaPort, Topology
from perfgate.envprobe.systools import Runner

__all__ = [
    "PEER_MEMORY_MODULES",
    "collect_topology",
    "fingerprint_facts",
    "parse_nvlink_status",
    "parse_topo_matrix",
    "read_peer_memory",
    "read_rdma_ports",
    "topology_notes",
]

PEER_MEMORY_MODULES = ("nvidia_peermem", "nv_peer_mem")
_MAX_DEVICES = 256


def parse_topo_matrix(text: str) -> dict[str, int] | None:
    """GPU pairs per connection type in ``nvidia-smi topo -m`` output; None when no GPU matrix is found.

    The matrix's header row names the columns (``GPU0 GPU1 ... NIC0 ... CPU Affinity ...``), one row per
    GPU follows, and each cell is ``X`` (itself), ``NV#`` or a PCIe path (PIX, PXB, PHB, NODE, SYS). Each
    unordered pair of GPUs is counted once, from the row of the lower-numbered GPU.
    """
    header: list[str] | None = None
    counts: Counter[str] = Counter()
    rows = 0
    for line in text.splitlines():
        cells = [c.strip() for c in (line.split("\t") if "\t" in line else line.split())]
        if header is None:
            if "GPU0" in cells:
                # The header's first cell (above the row names) is empty when tab-separated.
                header = cells if cells[0] == "" else ["", *cells]
            continue
        match = re.fullmatch(r"GPU(\d+)", cells[0]) if cells else None
        if match is None:
            if rows:
                break  # NIC rows or the legend: the GPU block is over
            continue
        rows += 1
        own = int(match.group(1))
        for column, cell in zip(header[1:], cells[1:], strict=False):
            other = re.fullmatch(r"GPU(\d+)", column)
            if other is not None and int(other.group(1)) > own and cell:
                counts[cell] += 1
    return dict(sorted(counts.items())) if header is not None and rows else None


def parse_nvlink_status(text: str) -> tuple[int, int] | None:
    """(links with a speed, links ``<inactive>``) in ``nvidia-smi nvlink --status``; None when it lists none.

    Lines look like ``Link 0: 26.562 GB/s`` or ``Link 3: <inactive>`` under a ``GPU N: <name>`` line.
    """
    active = inactive = 0
    for line in text.splitlines():
        match = re.match(r"\s*Link\s+\d+\s*:\s*(.+?)\s*$", line)
        if match is None:
            continue
        if re.match(r"[\d.]+\s*[GM]B/s", match.group(1)):
            active += 1
        elif "inactive" in match.group(1).lower():
            inactive += 1
    return (active, inactive) if active or inactive else None


def _read(path: Path) -> str | None:
    try:
        with path.open(encoding="utf-8", errors="replace") as handle:
            return handle.read(4096).strip() or None
    except OSError:
        return None


def read_rdma_ports(root: Path) -> tuple[list[RdmaPort] | None, str | None]:
    """(ports, None), or (None, why) when sysfs cannot tell. No /sys/class/infiniband on a host with /sys:
    no RDMA driver is loaded, so no ports ([])."""
    base = root / "sys" / "class" / "infiniband"
    if not base.is_dir():
        if (root / "sys" / "class").is_dir():
            return [], None
        return None, f"{root / 'sys' / 'class'} is not readable here (not Linux, or sysfs not mounted)"
    ports: list[RdmaPort] = []
    try:
        devices = sorted(os.listdir(base))[:_MAX_DEVICES]
    except OSError as exc:
        return None, f"cannot list {base}: {exc.strerror or exc}"
    for device in devices:
        try:
            numbers = sorted((n for n in os.listdir(base / device / "ports") if n.isdigit()), key=int)
        except OSError:
            continue
        for number in numbers[:_MAX_DEVICES]:
            folder = base / device / "ports" / number
            ports.append(
                RdmaPort(
                    device=device,
                    port=int(number),
                    state=_read(folder / "state"),
                    rate=_read(folder / "rate"),
                    link_layer=_read(folder / "link_layer"),
                )
            )
    return ports, None


def read_peer_memory(root: Path) -> tuple[str | None, str | None]:
    """(the loaded GPUDirect RDMA module or None, None), or (None, why) when /sys/module cannot tell."""
    modules = root / "sys" / "module"
    if not modules.is_dir():
        return None, f"{modules} is not readable here (not Linux, or sysfs not mounted)"
    for name in PEER_MEMORY_MODULES:
        if (modules / name).is_dir():
            return name, None
    return None, None


def collect_topology(
    *,
    env: Mapping[str, str],
    nvidia_smi: str | None,
    root: Path = Path("/"),
    timeout_s: float = 15.0,
    run: Runner = run_fixed,
) -> tuple[Topology, str, list[tuple[str, str]]]:
    """Host topology: (facts, raw nvidia-smi transcript, unavailable (item, reason) pairs).

    ``nvidia_smi`` is the path the system-tool search found (None: not found or not queried).
    """
    missing: list[tuple[str, str]] = []
    transcript = ""
    gpu_links: dict[str, int] | None = None
    nvlink: tuple[int, int] | None = None
    if nvidia_smi is None:
        missing.append(("topology.nvlink", "nvidia-smi not found on PATH (or system_tools=false)"))
    else:
        tool_env = {**env, "LC_ALL": "C"}
        matrix = run([nvidia_smi, "topo", "-m"], timeout_s, tool_env)
        status = run([nvidia_smi, "nvlink", "--status"], timeout_s, tool_env)
        transcript = matrix.transcript() + status.transcript()
        if matrix.ok:
            gpu_links = parse_topo_matrix(matrix.stdout)
            if gpu_links is None:
                missing.append(("topology.gpu_links", "nvidia-smi topo -m printed no GPU matrix"))
        else:
            missing.append(("topology.gpu_links", f"nvidia-smi topo -m: {matrix.describe_failure()}"))
        if status.ok:
            nvlink = parse_nvlink_status(status.stdout) or (0, 0)
        else:
            missing.append(("topology.nvlink", f"nvidia-smi nvlink --status: {status.describe_failure()}"))
    ports, why = read_rdma_ports(root)
    if why is not None:
        missing.append(("topology.rdma_ports", why))
    module, why = read_peer_memory(root)
    if why is not None:
        missing.append(("topology.peer_memory_module", why))
    topology = Topology(
        gpu_links=gpu_links,
        nvlink_active_links=nvlink[0] if nvlink else None,
        nvlink_inactive_links=nvlink[1] if nvlink else None,
        rdma_ports=ports,
        peer_memory_module=module,
        hybrid_ep=None,
        notes=[],
    )
    return topology, transcript, missing


def topology_notes(topology: Topology, deep_ep_installed: bool) -> list[str]:
    """One line per fact that limits DeepEP/HybridEP; none when deep_ep is not installed."""
    if not deep_ep_installed:
        return []
    notes: list[str] = []
    links = topology.gpu_links
    if links is not None and not any(kind.startswith("NV") for kind in links):
        notes.append("intranode DeepEP/HybridEP expects NVLink between GPUs: nvidia-smi topo -m shows none")
    if topology.nvlink_active_links == 0 and topology.nvlink_inactive_links:
        notes.append(f"every NVLink is inactive ({topology.nvlink_inactive_links} listed)")
    ports = topology.rdma_ports
    if ports is not None:
        active = [p for p in ports if p.state is not None and "ACTIVE" in p.state.upper()]
        if not ports:
            notes.append("internode DeepEP/HybridEP needs RDMA: none found (/sys/class/infiniband)")
        elif not active:
            notes.append(f"internode DeepEP/HybridEP needs RDMA: {len(ports)} port(s) found, none ACTIVE")
        elif topology.peer_memory_module is None:
            notes.append(
                "RDMA ports are up but no GPUDirect RDMA module (nvidia_peermem, nv_peer_mem) is loaded"
            )
    if topology.hybrid_ep is False:
        notes.append(
            "deep_ep is installed without HybridEP (no hybrid_ep files): the hybridep backend cannot load"
        )
    return notes


def fingerprint_facts(topology: Topology | None) -> tuple[list[str] | None, list[str] | None]:
    """(GPU link kinds, RDMA ports) for the fingerprint: stable facts of the machine only.

    Link state, rate and the loaded modules change without the machine changing, so they are left out.
    """
    if topology is None:
        return None, None
    gpu = topology.gpu_links
    links = None if gpu is None else [f"{n} x {k}" for k, n in sorted(gpu.items())]
    ports = (
        None
        if topology.rdma_ports is None
        else sorted(f"{p.device}/{p.port} {p.link_layer or 'unknown'}" for p in topology.rdma_ports)
    )
    return links, ports
