"""Device visibility: what the process sees against the variables meant to control it, and the host.

Which variable restricts which backend:

- CUDA: ``CUDA_VISIBLE_DEVICES``.
- MUSA: ``MUSA_VISIBLE_DEVICES`` (``CUDA_VISIBLE_DEVICES`` has no effect on MUSA devices, a common
  mistake when porting launch scripts); ``MTHREADS_VISIBLE_DEVICES`` is the container runtime's.
- ROCm: ``HIP_VISIBLE_DEVICES``, else ``ROCR_VISIBLE_DEVICES``, else ``CUDA_VISIBLE_DEVICES`` (HIP honours it).
- XPU: ``ZE_AFFINITY_MASK``.

A list is read the way the CUDA runtime reads it: comma-separated entries up to the first invalid one
(``-1`` hides everything after it); an empty value hides all devices.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from perfgate.envprobe.models import Visibility

__all__ = ["GOVERNING_VARIABLES", "count_listed", "visibility"]

GOVERNING_VARIABLES: dict[str, tuple[str, ...]] = {
    "cuda": ("CUDA_VISIBLE_DEVICES",),
    "musa": ("MUSA_VISIBLE_DEVICES",),
    "rocm": ("HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES"),
    "xpu": ("ZE_AFFINITY_MASK",),
    "cpu": (),
}
_ENTRY = re.compile(r"\d+(\.\d+)?|(GPU|MIG)-[\w\-/]+", re.IGNORECASE)


def count_listed(value: str | None) -> int | None:
    """Devices a visibility list names: None when unset or not countable ('all'), 0 when empty."""
    if value is None:
        return None
    value = value.strip()
    if value.lower() in ("all", ""):
        return None if value else 0
    if value.lower() in ("none", "void", "nodevfiles"):
        return 0
    count = 0
    for entry in value.split(","):
        entry = entry.strip()
        if entry == "-1" or not _ENTRY.fullmatch(entry):
            break
        count += 1
    return count


def visibility(
    backend: str,
    process_device_count: int,
    env: Mapping[str, str | None],
    system_device_count: int | None,
    system_source: str | None = None,
) -> Visibility:
    """Compare the process's device count with the governing variable and the host's devices."""
    notes: list[str] = []
    mismatch = False
    governing = next((v for v in GOVERNING_VARIABLES.get(backend, ()) if env.get(v) is not None), None)
    listed = count_listed(env.get(governing)) if governing else None
    if governing is not None and listed is not None and listed != process_device_count:
        mismatch = True
        notes.append(
            f"{governing}={env.get(governing)!r} lists {listed} device(s) but the process sees "
            f"{process_device_count}: an entry names a device that does not exist, or the variable was set "
            "after the runtime initialised."
        )
    if (
        backend == "musa"
        and env.get("CUDA_VISIBLE_DEVICES") is not None
        and env.get("MUSA_VISIBLE_DEVICES") is None
    ):
        notes.append(
            f"CUDA_VISIBLE_DEVICES={env.get('CUDA_VISIBLE_DEVICES')!r} is set but does not restrict MUSA devices; "
            "set MUSA_VISIBLE_DEVICES to choose devices on this backend."
        )
    source = system_source or "the system tools"
    if system_device_count is not None:
        if backend == "cpu" and system_device_count > 0:
            mismatch = True
            notes.append(
                f"{source} list {system_device_count} accelerator(s) on this host but the process runs on CPU "
                "(see backend_reason)."
            )
        elif governing is None and backend != "cpu" and system_device_count != process_device_count:
            mismatch = True
            notes.append(
                f"{source} list {system_device_count} device(s) on this host but the process sees "
                f"{process_device_count} with no visibility variable set (a container or scheduler may be "
                "masking devices)."
            )
        elif governing is not None and listed is not None and listed > system_device_count:
            mismatch = True
            notes.append(
                f"{governing} lists {listed} device(s) but {source} list only {system_device_count} on this host."
            )
    elif backend != "cpu":
        notes.append(
            "no system tool listed the host's devices, so the process's view could not be cross-checked."
        )
    from perfgate.envprobe.models import Visibility  # the models load with their first use

    return Visibility(
        env=dict(env),
        governing_variable=governing,
        listed_count=listed,
        process_device_count=process_device_count,
        system_device_count=system_device_count,
        mismatch=mismatch,
        notes=notes,
    )
