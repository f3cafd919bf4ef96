"""The peak a utilization is taken against: the caller's, or the one of the device and precision the timed
runs recorded (a named device must be the runs' own), with what limits it said in warnings."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from perfgate.evidence import EvidenceRecord
from perfgate.evidence.access import as_dict
from perfgate.hardware.device_peak import (
    MEASURED_CAVEAT,
    Peak,
    RunDevice,
    is_this_cpu,
    peak_for,
    precision_of,
)
from perfgate.hardware.peaks import PeakLookupError, Precision, find_device, lookup_peak

__all__ = ["PeakChoice", "RunRecord", "choose_device", "choose_precision", "resolve_peak", "run_record"]


@dataclass(frozen=True)
class RunRecord:
    """What a window record says about where it ran: its id, device, and contract precision invariant."""

    evidence_id: str
    device: RunDevice
    precision: object


@dataclass(frozen=True)
class PeakChoice:
    peak: Peak
    precision: Precision | None
    warnings: list[str]


def run_record(record: EvidenceRecord) -> RunRecord:
    """The device a window record's run timed (its environment fingerprint and first rank's host) and
    the precision its contract declares."""
    fingerprint = as_dict(record.result.get("environment_fingerprint"))
    ranks = record.result.get("ranks")
    first = as_dict(ranks[0]) if isinstance(ranks, list) and ranks else {}
    threads = fingerprint.get("num_threads")
    kind, name = fingerprint.get("device_kind"), fingerprint.get("device_name")
    version = fingerprint.get("torch_version")
    device = RunDevice(
        kind=kind if isinstance(kind, str) else None,
        name=name if isinstance(name, str) else None,
        hostname=host if isinstance(host := first.get("hostname"), str) else None,
        threads=int(threads) if isinstance(threads, str) and threads.isdigit() else None,
        torch_version=version if isinstance(version, str) else None,
    )
    invariants = as_dict(as_dict(as_dict(record.inputs).get("contract")).get("invariants"))
    return RunRecord(record.id, device, invariants.get("precision"))


def choose_precision(given: Precision | None, runs: Sequence[RunRecord]) -> Precision:
    """The given precision, else the one every run's contract declares.

    Raises:
        PeakLookupError: none given and the runs declare none the peak table knows, or declare different ones.
    """
    if given is not None:
        return given
    declared: dict[str, Precision | None] = {str(r.precision): precision_of(r.precision) for r in runs}
    known: set[Precision | None] = set(declared.values())
    if len(known) == 1 and None not in known:
        found = known.pop()
        assert found is not None
        return found
    shown = ", ".join(sorted(declared)) or "nothing"
    raise PeakLookupError(
        f"give precision (fp32, tf32, bf16, fp16, fp8, int8): the runs' contracts declare {shown}, which names "
        "no single one of them"
    )


def choose_device(given: str | None, runs: Sequence[RunRecord]) -> RunDevice:
    """The device to take the peak of: the runs' own, or the one given when it is the runs' device.

    Raises:
        PeakLookupError: the runs ran on different devices, record none and none is given, or ran on another
            device than the one given.
    """
    recorded = {
        (r.device.kind, r.device.name, r.device.hostname): r for r in runs if r.device.kind is not None
    }
    if len({(k, n) for k, n, _ in recorded}) > 1:
        seen = "; ".join(f"{r.evidence_id}: {r.device.label}" for r in recorded.values())
        raise PeakLookupError(
            f"the windows ran on different devices ({seen}): compute each device's MFU in its own call"
        )
    first = next(iter(recorded.values()), None)
    run = first.device if first else None
    if given is None:
        if run is None:
            raise PeakLookupError(
                "the windows record no device (imported logs do not): pass device and precision, or peak_tflops"
            )
        return run
    if is_this_cpu(given):
        if first is not None and first.device.kind != "cpu":
            raise PeakLookupError(
                f"device {given!r} is a CPU but window {first.evidence_id} ran on {first.device.label}: leave "
                "device out to use the run's"
            )
        return run or RunDevice(kind="cpu", name=None)
    if first is not None:
        mismatch = first.device.kind == "cpu"
        if not mismatch and first.device.name is not None:
            try:
                mismatch = find_device(given) is not find_device(first.device.name)
            except PeakLookupError:
                mismatch = False  # the table lookup of the given name refuses it later
        if mismatch:
            raise PeakLookupError(
                f"window {first.evidence_id} ran on {first.device.label}, not {given!r}: leave device out to use "
                "the run's (a CPU's peak is measured on this machine)"
            )
    return RunDevice(kind=run.kind if run else None, name=given)


def resolve_peak(
    *,
    peak_tflops: float | None,
    device: str | None,
    precision: Precision | None,
    runs: Sequence[RunRecord],
    state_dir: Path,
) -> PeakChoice:
    """The denominator: the caller's ``peak_tflops`` (warned when the table says otherwise), else the
    table's for the settled device and precision, or this machine's measured CPU peak.

    Raises:
        PeakLookupError: no precision or device can be settled, or the table has no figure for the device.
    """
    warnings: list[str] = []
    if peak_tflops is not None:
        peak = Peak(peak_tflops, "explicit", "explicit peak_tflops supplied by the caller", device or "")
        if device and precision and not is_this_cpu(device):
            try:
                table_peak, row = lookup_peak(device, precision)
            except PeakLookupError:
                pass
            else:
                if not math.isclose(table_peak, peak_tflops, rel_tol=1e-3):
                    warnings.append(
                        f"peak_tflops={peak_tflops:g} differs from the table's {table_peak:g} for {row.name} "
                        f"{precision} ({row.source}); the explicit value was used."
                    )
        return PeakChoice(peak, precision, warnings)
    settled = choose_precision(precision, runs)
    run_device = choose_device(device, runs)
    try:
        peak = peak_for(run_device, settled, state_dir)
    except PeakLookupError as exc:
        if device is not None and "not in the peak table" in str(exc):
            raise PeakLookupError(
                f"{exc} For this machine's CPU pass device='cpu', or give a window_id and leave device out: its "
                "peak is measured."
            ) from exc
        raise
    if peak.measured is not None:
        warnings.append(MEASURED_CAVEAT)
        if (
            run_device.torch_version is not None
            and run_device.torch_version != peak.measured.key.torch_version
        ):
            warnings.append(
                f"the run used torch {run_device.torch_version}; the peak was measured with the server's torch "
                f"{peak.measured.key.torch_version}"
            )
    return PeakChoice(peak, settled, warnings)
