"""Feature-detected access to the accelerator the training process uses.

Only a device that the process has already initialised counts: synchronising CUDA in a CPU-only run
on a GPU host would create a context (hundreds of MB, seconds) that the training never asked for.
torch is looked up in ``sys.modules`` and never imported here.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["DeviceBackend", "DeviceInfo", "detect_backend"]

# Order matters only when a process initialised several kinds; the first one found is timed.
_ACCELERATORS = ("cuda", "musa", "xpu", "mtia")


@dataclass(frozen=True)
class DeviceInfo:
    """What was timed: ``kind`` is cpu, cuda (also ROCm builds), musa, xpu, mtia or custom."""

    kind: str
    index: int | None
    name: str | None
    runtime_version: str | None
    synchronized: bool
    events: bool


class DeviceBackend:
    """Synchronisation, timing events and peak memory for one device kind.

    ``module`` is the torch device module (``torch.cuda``, ``torch.musa``, ...) or ``None`` for the host.
    All methods are no-ops (or return ``None``) where the module lacks the feature.
    """

    def __init__(
        self,
        kind: str,
        module: Any = None,
        synchronize: Callable[[], object] | None = None,
        want_events: bool | None = None,
    ) -> None:
        self.kind = kind
        self._module = module
        self._custom_sync = synchronize
        self.index: int | None = None
        self.name: str | None = None
        self.runtime_version: str | None = None
        if module is not None:
            self.index = _call_int(module, "current_device")
            if self.index is not None:
                self.name = _call_str(module, "get_device_name", self.index)
            self.runtime_version = _runtime_version(kind)
        has_events = module is not None and hasattr(module, "Event")
        self.events = has_events if want_events is None else (want_events and has_events)

    @property
    def info(self) -> DeviceInfo:
        return DeviceInfo(
            kind=self.kind,
            index=self.index,
            name=self.name,
            runtime_version=self.runtime_version,
            synchronized=self._module is not None or self._custom_sync is not None,
            events=self.events,
        )

    def synchronize(self) -> None:
        """Wait until queued device work is done (window edges only)."""
        if self._custom_sync is not None:
            self._custom_sync()
        if self._module is not None:
            self._module.synchronize()

    def new_event(self) -> Any:
        """A timing event, or ``None`` when the device has none (the host clock then suffices)."""
        if not self.events:
            return None
        return self._module.Event(enable_timing=True)

    def reset_peak_memory(self) -> None:
        fn = getattr(self._module, "reset_peak_memory_stats", None)
        if fn is not None:
            fn()

    def peak_memory_bytes(self) -> tuple[int | None, int | None]:
        """(peak allocated, peak reserved) since the last reset, or ``None`` where not tracked."""
        return _call_int(self._module, "max_memory_allocated"), _call_int(self._module, "max_memory_reserved")


def detect_backend(
    synchronize: Callable[[], object] | None = None, want_events: bool | None = None
) -> DeviceBackend:
    """The backend for the first initialised torch accelerator, else the host.

    ``synchronize`` is an extra callable run at window edges, for work torch cannot see
    (another framework's queue).
    """
    torch = sys.modules.get("torch")
    if torch is not None:
        for kind in _ACCELERATORS:
            module = getattr(torch, kind, None)
            if module is not None and _in_use(module):
                return DeviceBackend(kind, module, synchronize, want_events)
    kind = "cpu" if synchronize is None else "custom"
    return DeviceBackend(kind, None, synchronize, want_events)


def _in_use(module: Any) -> bool:
    is_initialized = getattr(module, "is_initialized", None)
    if is_initialized is not None:
        return bool(is_initialized())
    is_available = getattr(module, "is_available", None)
    return bool(is_available()) if is_available is not None else False


def _call_int(module: Any, name: str) -> int | None:
    fn = getattr(module, name, None)
    if fn is None:
        return None
    value = fn()
    return int(value) if value is not None else None


def _call_str(module: Any, name: str, *args: object) -> str | None:
    fn = getattr(module, name, None)
    return None if fn is None else str(fn(*args))


def _runtime_version(kind: str) -> str | None:
    torch = sys.modules.get("torch")
    version = getattr(torch, "version", None)
    if kind == "cuda":
        hip = getattr(version, "hip", None)
        return f"hip {hip}" if hip else getattr(version, "cuda", None)
    value = getattr(version, kind, None)
    return None if value is None else str(value)
