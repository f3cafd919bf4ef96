"""Device memory for planning: an explicit size or the peak table's entry for a device name."""

from __future__ import annotations

from perfgate.hardware.peaks import PeakLookupError, find_device

__all__ = ["GIB", "DeviceMemoryError", "device_memory"]

GIB = 1 << 30


class DeviceMemoryError(LookupError):
    """No usable device memory size; the message says what to pass."""


def device_memory(device: str | None, device_memory_gib: float | None) -> tuple[int, str, list[str]]:
    """(bytes, source, warnings) for the memory of one GPU.

    An explicit ``device_memory_gib`` wins over the table; a named device must be in the table with
    a known memory size.

    Raises:
        DeviceMemoryError: neither is given, the device is unknown, or its memory is not in the table.
    """
    warnings: list[str] = []
    row = None
    if device is not None:
        try:
            row = find_device(device)
        except PeakLookupError as exc:
            if device_memory_gib is None:
                raise DeviceMemoryError(
                    f"{exc} For planning, pass device_memory_gib (memory per GPU in GiB) instead."
                ) from exc
            warnings.append(f"device {device!r} is not in the peak table; using device_memory_gib")
    if device_memory_gib is not None:
        explicit = round(device_memory_gib * GIB)
        if row is not None and row.memory_bytes is not None and row.memory_bytes != explicit:
            warnings.append(
                f"device_memory_gib={device_memory_gib:g} differs from the table's "
                f"{row.memory_bytes / GIB:g} GiB for {row.name}; the explicit value was used"
            )
        return explicit, "device_memory_gib supplied by the caller", warnings
    if row is None:
        raise DeviceMemoryError("give a device name from the peak table or device_memory_gib (GiB per GPU)")
    if row.memory_bytes is None:
        raise DeviceMemoryError(
            f"the peak table has no memory size for {row.name}; pass device_memory_gib (GiB per GPU)"
        )
    return row.memory_bytes, f"{row.name}: {row.memory_source}", warnings
