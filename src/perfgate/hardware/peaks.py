"""The peak throughput table (``peaks.json``): dense peaks per device and precision, each with a source.

Lookups never fall back to another device or precision: an unknown device, an unknown cell or an
unsupported cell is an error that asks for an explicit ``peak_tflops``.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any, Literal

__all__ = [
    "PRECISIONS",
    "DeviceRow",
    "PeakLookupError",
    "Precision",
    "device_names",
    "find_device",
    "lookup_peak",
]

Precision = Literal["fp32", "tf32", "bf16", "fp16", "fp8", "int8"]
PRECISIONS: tuple[Precision, ...] = ("fp32", "tf32", "bf16", "fp16", "fp8", "int8")


class PeakLookupError(LookupError):
    """No trustworthy peak for this device/precision; the message says what to pass instead."""


@dataclass(frozen=True)
class DeviceRow:
    """One device of the table. ``peaks`` maps precision to TFLOP/s, None (unknown) or a reason string."""

    name: str
    aliases: tuple[str, ...]
    vendor: str
    memory_bytes: int | None
    memory_source: str
    source: str
    basis: str
    peaks: dict[str, float | str | None]


def _normalize(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower().replace("nvidia", "").replace("moore threads", ""))


@cache
def _table() -> tuple[DeviceRow, ...]:
    raw: dict[str, Any] = json.loads(resources.files("perfgate.hardware").joinpath("peaks.json").read_text())
    return tuple(
        DeviceRow(
            name=row["name"],
            aliases=tuple(row["aliases"]),
            vendor=row["vendor"],
            memory_bytes=row["memory_bytes"],
            memory_source=row["memory_source"],
            source=row["source"],
            basis=row["basis"],
            peaks=dict(row["peaks"]),
        )
        for row in raw["devices"]
    )


@cache
def _by_normalized_name() -> dict[str, DeviceRow]:
    """Every row under its normalized name and aliases (the first row wins a name two rows share)."""
    out: dict[str, DeviceRow] = {}
    for row in _table():
        for n in (row.name, *row.aliases):
            out.setdefault(_normalize(n), row)
    return out


def device_names() -> list[str]:
    """Canonical names of every device in the table."""
    return [row.name for row in _table()]


def find_device(name: str) -> DeviceRow:
    """The table row whose name or an alias matches ``name`` (case, spaces and punctuation ignored).

    Raises:
        PeakLookupError: no row matches; never a nearest-name guess.
    """
    row = _by_normalized_name().get(_normalize(name))
    if row is not None:
        return row
    raise PeakLookupError(
        f"device {name!r} is not in the peak table (known: {', '.join(device_names())}). "
        "Pass peak_tflops with the vendor's dense figure for your precision instead; "
        "perfgate never borrows another device's peak."
    )


def lookup_peak(device: str, precision: Precision) -> tuple[float, DeviceRow]:
    """Dense peak TFLOP/s of ``device`` at ``precision`` and the row it came from.

    Raises:
        PeakLookupError: unknown device, unknown cell, or a precision the device does not support.
    """
    row = find_device(device)
    cell = row.peaks.get(precision)
    if isinstance(cell, str):
        raise PeakLookupError(
            f"{row.name} at {precision}: {cell}. Choose the precision the run actually used."
        )
    if cell is None:
        raise PeakLookupError(
            f"the peak of {row.name} at {precision} is unknown to the table (source: {row.source}). "
            "Pass peak_tflops explicitly, with its source in your notes."
        )
    return float(cell), row
