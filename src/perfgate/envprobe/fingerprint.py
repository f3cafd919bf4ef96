"""The comparability fingerprint: hardware and software facts that must match between A/B windows.

Included: backend, device names and count, compute capability, host CPU model and usable CPU count,
Python, torch and accelerator runtime/driver versions, cuDNN/muDNN and NCCL/MCCL, the versions of
the packages that change kernels (triton, flash-attn, transformer-engine, ...), and the interconnect's
fixed shape (the GPU pairs per connection type of ``nvidia-smi topo -m``, the RDMA ports and their link
layer; version 2). Excluded on purpose: the source commit and the performance switches (a candidate is
expected to change those: the experiment declares them), host names and paths (two identical nodes are
the same environment), and anything time-varying (free memory; a link's state or rate, which kernel
modules are loaded).

``sha256`` is over the canonical JSON of ``fields`` together with `FINGERPRINT_VERSION`, so a change of
what is fingerprinted never makes two old fingerprints look equal or different by accident.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from perfgate.envprobe.models import Device, Fingerprint, FingerprintDifference

__all__ = ["FINGERPRINT_PACKAGES", "FINGERPRINT_VERSION", "compare_fingerprints", "make_fingerprint"]

FINGERPRINT_VERSION = 2
FINGERPRINT_PACKAGES = (
    "torch",
    "torch_musa",
    "triton",
    "pytorch-triton-rocm",
    "flash-attn",
    "flash_attn_3",
    "xformers",
    "transformer-engine",
    "megatron-core",
    "deepspeed",
    "apex",
    "torchao",
    "liger-kernel",
    "nvidia-cudnn-cu12",
    "nvidia-nccl-cu12",
    "nvidia-cudnn-cu13",
    "nvidia-nccl-cu13",
)

FieldValue = str | int | list[str] | None


def make_fingerprint(
    *,
    backend: str | None,
    devices: Sequence[Device],
    python_version: str | None,
    torch_version: str | None,
    runtime_version: str | None,
    driver_version: str | None,
    libraries: Mapping[str, str | None],
    packages: Mapping[str, str | None],
    cpu_model: str | None,
    cpu_count: int | None,
    machine: str | None,
    interconnect: tuple[list[str] | None, list[str] | None] = (None, None),
) -> Fingerprint:
    """Build the fingerprint; absent facts are recorded as None (and still compared)."""
    names = Counter(d.name or "unknown" for d in devices)
    fields: dict[str, FieldValue] = {
        "backend": backend,
        "device_count": len(devices),
        "devices": [f"{count} x {name}" for name, count in sorted(names.items())],
        "capabilities": sorted({d.capability for d in devices if d.capability}),
        "machine": machine,
        "cpu_model": cpu_model,
        "cpu_count": cpu_count,
        "python": python_version,
        "torch": torch_version,
        "runtime": runtime_version,
        "driver": driver_version,
        "gpu_links": interconnect[0],
        "rdma_ports": interconnect[1],
    }
    for name in ("cudnn", "mudnn", "nccl", "mccl"):
        fields[name] = libraries.get(name)
    for name in FINGERPRINT_PACKAGES:
        if name != "torch":
            fields[f"pkg:{name}"] = packages.get(name)
    return Fingerprint(version=FINGERPRINT_VERSION, sha256=_digest(fields), fields=fields)


def _digest(fields: Mapping[str, Any]) -> str:
    text = json.dumps(
        {"v": FINGERPRINT_VERSION, "fields": fields},
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
    )
    return hashlib.sha256(text.encode()).hexdigest()


def compare_fingerprints(
    baseline: Fingerprint | Mapping[str, Any], candidate: Fingerprint | Mapping[str, Any]
) -> list[FingerprintDifference]:
    """Fields whose values differ (empty: comparable). Accepts models or their JSON dumps.

    Fingerprints of different versions are reported as one difference on ``version``; their fields are
    not compared because they do not mean the same thing.
    """
    a = baseline if isinstance(baseline, Fingerprint) else Fingerprint.model_validate(baseline)
    b = candidate if isinstance(candidate, Fingerprint) else Fingerprint.model_validate(candidate)
    if a.version != b.version:
        return [FingerprintDifference(field="version", baseline=a.version, candidate=b.version)]
    differences = [
        FingerprintDifference(field=key, baseline=a.fields.get(key), candidate=b.fields.get(key))
        for key in sorted(set(a.fields) | set(b.fields))
        if a.fields.get(key) != b.fields.get(key)
    ]
    if not differences and a.sha256 != b.sha256:
        # Equal fields under different digests: one record was edited after it was made.
        differences.append(FingerprintDifference(field="sha256", baseline=a.sha256, candidate=b.sha256))
    return differences
