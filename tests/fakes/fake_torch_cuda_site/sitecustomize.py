"""FAKE CUDA for perfgate's tests: makes the real CPU-only torch answer like a CUDA build on 8 GPUs.

Loaded through PYTHONPATH (Python imports ``sitecustomize`` at start-up), it replaces the entry points
perfgate's probe calls — ``torch.cuda.is_available/device_count/get_device_properties/...``,
``torch.version.cuda``, ``torch.backends.cudnn.version``, ``torch.cuda.nccl.version`` — with answers for
a host of ``PERFGATE_FAKE_CUDA_PHYSICAL`` (default 8) "NVIDIA H100 80GB HBM3" devices that honours
``CUDA_VISIBLE_DEVICES``. No CUDA code runs; nothing here is a measurement.
"""

from __future__ import annotations

import os

import torch

_NAME = "NVIDIA H100 80GB HBM3"
_TOTAL_MEMORY_BYTES = 85_045_870_592


class _FakeCudaDeviceProperties:
    def __init__(self, index: int) -> None:
        self.name = _NAME
        self.total_memory = _TOTAL_MEMORY_BYTES
        self.major = 9
        self.minor = 0
        self.multi_processor_count = 132
        self.uuid = f"GPU-fake0000-0000-0000-0000-00000000000{index}"


def _visible() -> list[int]:
    physical = list(range(int(os.environ.get("PERFGATE_FAKE_CUDA_PHYSICAL", "8"))))
    raw = os.environ.get("CUDA_VISIBLE_DEVICES")
    if raw is None:
        return physical
    picked: list[int] = []
    for entry in raw.split(","):
        entry = entry.strip()
        if not entry.isdigit() or int(entry) not in physical:
            break
        picked.append(int(entry))
    return picked


def _properties(index: int = 0) -> _FakeCudaDeviceProperties:
    if not 0 <= index < len(_visible()):
        raise RuntimeError(f"FAKE cuda: invalid device ordinal {index}")
    return _FakeCudaDeviceProperties(index)


vars(torch.version).update(cuda="12.4")
vars(torch.cuda).update(
    is_available=lambda: len(_visible()) > 0,
    device_count=lambda: len(_visible()),
    current_device=lambda: 0,
    get_device_properties=_properties,
    get_device_name=lambda index=0: _properties(index).name,
    is_bf16_supported=lambda including_emulation=True: True,
)
vars(torch.cuda.nccl).update(version=lambda: (2, 21, 5))
vars(torch.backends.cudnn).update(is_available=lambda: True, version=lambda: 90100)
vars(torch.backends.cuda).update(is_flash_attention_available=lambda: True)
vars(torch._C).update(_cuda_getDriverVersion=lambda: 12040)
