"""FAKE torch_musa for perfgate's tests: not Moore Threads' package, and no MUSA device behind it.

It exposes the documented surface of the real extension (see FACTS "MUSA stack") on top of the real
CPU torch, the way torch_musa does: renames the PrivateUse1 backend to ``musa``, registers a
``torch.musa`` device module, sets ``torch.version.musa``, and adds ``torch.backends.mudnn``. The host
it pretends to be has ``PERFGATE_FAKE_MUSA_PHYSICAL`` (default 8) MTT S4000 cards, and it honours
``MUSA_VISIBLE_DEVICES`` the way the runtime does (entries up to the first invalid one, indices that
do not exist are dropped). Values are recorded-looking, not real measurements.
"""

from __future__ import annotations

import os
import types

import torch

__version__ = "2.0.0+fake"

_NAME = "MTT S4000"
_TOTAL_MEMORY_BYTES = 48 * 1024**3


class _FakeMusaDeviceProperties:
    """The fields torch_musa's device properties expose (name, memory, capability, SM count)."""

    def __init__(self, index: int) -> None:
        self.name = _NAME
        self.total_memory = _TOTAL_MEMORY_BYTES
        self.major = 2
        self.minor = 2
        self.multi_processor_count = 128
        self.index = index


def _physical() -> int:
    return int(os.environ.get("PERFGATE_FAKE_MUSA_PHYSICAL", "8"))


def _visible() -> list[int]:
    raw = os.environ.get("MUSA_VISIBLE_DEVICES")
    physical = list(range(_physical()))
    if raw is None:
        return physical
    picked: list[int] = []
    for entry in raw.split(","):
        entry = entry.strip()
        if not entry.isdigit():
            break
        if int(entry) in physical and int(entry) not in picked:
            picked.append(int(entry))
    return picked


def _check(index: int) -> None:
    if not 0 <= index < len(_visible()):
        raise RuntimeError(f"FAKE musa: invalid device ordinal {index}")


def _properties(index: int = 0) -> _FakeMusaDeviceProperties:
    _check(index)
    return _FakeMusaDeviceProperties(index)


def _name(index: int = 0) -> str:
    _check(index)
    return _NAME


class _FakeEvent:
    def __init__(self, enable_timing: bool = False) -> None:
        self.enable_timing = enable_timing

    def record(self, stream: object = None) -> None:
        return None

    def elapsed_time(self, other: _FakeEvent) -> float:
        return 0.0


mccl = types.ModuleType("torch.musa.mccl")
vars(mccl).update(version=lambda: (2, 11, 4))

musa = types.ModuleType(
    "torch.musa", "FAKE torch.musa registered by tests/fakes/fake_torch_musa_site/torch_musa"
)
vars(musa).update(
    is_available=lambda: len(_visible()) > 0,
    device_count=lambda: len(_visible()),
    current_device=lambda: 0,
    get_device_properties=_properties,
    get_device_name=_name,
    get_device_capability=lambda index=0: (2, 2),
    is_bf16_supported=lambda: True,
    synchronize=lambda device=None: None,
    max_memory_allocated=lambda device=None: 0,
    max_memory_reserved=lambda device=None: 0,
    reset_peak_memory_stats=lambda device=None: None,
    mem_get_info=lambda device=None: (_TOTAL_MEMORY_BYTES, _TOTAL_MEMORY_BYTES),
    Event=_FakeEvent,
    mccl=mccl,
)

mudnn = types.ModuleType("torch.backends.mudnn")
vars(mudnn).update(allow_tf32=False, version=lambda: 2900)

# What the real extension does on import: rename PrivateUse1, register the device module, add versions.
torch.utils.rename_privateuse1_backend("musa")
torch._register_device_module("musa", musa)
vars(torch.version).update(musa="4.0.0")
vars(torch.backends).update(mudnn=mudnn)
