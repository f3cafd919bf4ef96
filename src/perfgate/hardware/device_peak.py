"""The peak a utilization is measured against, for a device as a run recorded it or as the caller named it.

Accelerators come from the sourced table (`perfgate.hardware.peaks`); this machine's CPU from the matmul
probe (`perfgate.hardware.cpu_peak`), and only when the run ran on this machine: the probe cannot measure
another host.
"""

from __future__ import annotations

import re
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from perfgate.hardware.cpu_peak import MeasuredPeak, PeakUnavailable, cpu_model, measured_cpu_peak
from perfgate.hardware.peaks import PeakLookupError, Precision, lookup_peak

__all__ = ["Peak", "RunDevice", "is_this_cpu", "peak_for", "precision_of"]

PeakBasis = Literal["datasheet", "measured", "explicit", "unavailable"]

MEASURED_CAVEAT = (
    "the peak is an achievable-GEMM rate measured on this machine, not a datasheet peak: utilization against "
    "it reads higher than against a vendor figure"
)


@dataclass(frozen=True)
class RunDevice:
    """The device a run timed, as its record says: kind (cpu, cuda, ...), name, host, threads."""

    kind: str | None
    name: str | None
    hostname: str | None = None
    threads: int | None = None
    torch_version: str | None = None

    @property
    def label(self) -> str:
        return f"{self.kind or ''} {self.name or ''}".strip() or "unknown"


@dataclass(frozen=True)
class Peak:
    """A peak per device in TFLOP/s, or none (``basis`` 'unavailable', ``reason`` says why)."""

    tflops: float | None
    basis: PeakBasis
    source: str | None
    device: str
    reason: str | None = None
    measured: MeasuredPeak | None = None


_PRECISION_NAMES: dict[str, Precision] = {
    "fp32": "fp32",
    "float32": "fp32",
    "float": "fp32",
    "tf32": "tf32",
    "bf16": "bf16",
    "bfloat16": "bf16",
    "ampbf16": "bf16",
    "bf16mixed": "bf16",
    "fp16": "fp16",
    "float16": "fp16",
    "half": "fp16",
    "ampfp16": "fp16",
    "fp16mixed": "fp16",
    "fp8": "fp8",
    "int8": "int8",
}


def precision_of(declared: object) -> Precision | None:
    """The peak-table precision a contract's ``precision`` invariant names ('bf16', 'amp_bf16', 'float32',
    ...), or None when it names none of them (a dict, a custom policy)."""
    if not isinstance(declared, str):
        return None
    return _PRECISION_NAMES.get(re.sub(r"[^a-z0-9]", "", declared.lower()))


def is_this_cpu(name: str) -> bool:
    """True for 'cpu' or this machine's CPU model name (case and punctuation ignored)."""
    squeeze = re.compile(r"[^a-z0-9]")
    wanted = squeeze.sub("", name.lower())
    model = cpu_model()
    return wanted == "cpu" or (model is not None and wanted == squeeze.sub("", model.lower()))


def peak_for(device: RunDevice, precision: Precision, state_dir: Path) -> Peak:
    """The peak of ``device`` at ``precision``: the table's for an accelerator, the measured one for this
    machine's CPU, else unavailable with the reason.

    Raises:
        PeakLookupError: an accelerator the table has no figure for (the message says what to pass).
    """
    if device.kind == "cpu":
        here = socket.gethostname()
        if device.hostname is not None and device.hostname != here:
            return Peak(
                None,
                "unavailable",
                None,
                device.label,
                f"the run ran on host {device.hostname!r} and perfgate measures CPU peaks only on the server's "
                f"machine ({here!r}): pass peak_tflops with a figure for that host",
            )
        found = measured_cpu_peak(state_dir, precision, device.threads)
        if isinstance(found, PeakUnavailable):
            return Peak(None, "unavailable", None, f"cpu {cpu_model() or ''}".strip(), found.reason)
        return Peak(found.tflops, "measured", found.source, f"cpu {found.key.cpu_model}", measured=found)
    if device.name is None:
        raise PeakLookupError(
            f"the run recorded a {device.kind or 'unknown'} device without a name: pass device (a peak-table "
            "name) or peak_tflops"
        )
    tflops, row = lookup_peak(device.name, precision)
    return Peak(tflops, "datasheet", f"{row.name}, {precision}, {row.basis}: {row.source}", row.name)
