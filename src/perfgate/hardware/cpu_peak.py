"""A CPU's peak matmul throughput, measured once per machine by a short GEMM probe and cached.

CPUs have no datasheet row in ``peaks.json``: their dense peak depends on the SKU's vector units, clock
under load and the BLAS torch uses. perfgate measures instead, in a process of the server's interpreter
(`perfgate.hardware.gemm_probe`): square ``torch.mm`` products large enough to reach steady throughput,
a few repetitions, the fastest kept, with the thread count the run used, in about two seconds. The result
is an *achievable-GEMM* peak, not a vendor peak: it sits below the theoretical figure, so a utilization
against it reads higher than one against a datasheet would.

The result is cached in the trust root (``state/hardware/cpu-peaks.json``, where the agent cannot write),
keyed by CPU model, core count, torch version and threads; a failed probe is not cached. When no peak
can be measured (no torch in the server's interpreter, a failed or timed-out probe) the answer is
`PeakUnavailable` with the reason, never an estimate.
"""

from __future__ import annotations

import functools
import json
import os
import platform
import re
import subprocess
import sys
from dataclasses import dataclass
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any, cast

from perfgate.helpers.cpus import usable_cpus
from perfgate.helpers.filelock import held
from perfgate.helpers.statefs import make_dirs, write_file

__all__ = [
    "CPU_PRECISIONS",
    "MachineKey",
    "MeasuredPeak",
    "PeakUnavailable",
    "ProbeResult",
    "cpu_model",
    "machine_key",
    "measured_cpu_peak",
    "run_probe",
]

CPU_PRECISIONS = ("fp32", "bf16")
"""Precisions the probe measures (float32 and bfloat16 products)."""
PROBE_BUDGET_S = 2.0
PROBE_TIMEOUT_S = 90.0
"""The whole probe process, torch's import included (slow on a loaded machine)."""
_CACHE = ("hardware", "cpu-peaks.json")


@dataclass(frozen=True)
class PeakUnavailable:
    """No peak could be measured; ``reason`` says why and what to pass instead."""

    reason: str


@dataclass(frozen=True)
class MachineKey:
    """What a measured peak holds for: a different value of any field needs a new measurement."""

    cpu_model: str
    cores: int
    torch_version: str
    threads: int

    @property
    def id(self) -> str:
        return f"{self.cpu_model}|cores={self.cores}|torch={self.torch_version}|threads={self.threads}"


@dataclass(frozen=True)
class MeasuredPeak:
    """A measured dense matmul rate of this machine at one precision."""

    tflops: float
    precision: str
    key: MachineKey
    measured_at: str
    method: str
    cached: bool

    @property
    def source(self) -> str:
        return f"measured on this machine by perfgate, {self.measured_at}, {self.method}"


@dataclass(frozen=True)
class ProbeResult:
    """What the probe process answered: its JSON (``output``) or why there is none (``error``)."""

    output: dict[str, Any] | None
    error: str | None


@functools.cache
def cpu_model() -> str | None:
    """The CPU's model name (``/proc/cpuinfo``, else ``platform.processor()``); None when neither names it.
    Read once per process: every MFU call asks, and a many-core machine's cpuinfo is hundreds of KB."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            text = fh.read(1 << 20)
    except OSError:
        text = ""
    for key in ("model name", "Model", "Hardware", "cpu model"):
        match = re.search(r"^" + key + r"\s*:\s*(.+)$", text, re.MULTILINE)
        if match:
            return match.group(1).strip()
    return platform.processor() or None


def machine_key(threads: int | None) -> MachineKey | PeakUnavailable:
    """This machine's key for ``threads`` (default: every CPU this process may run on)."""
    model = cpu_model()
    if model is None:
        return PeakUnavailable("the CPU model is unknown (no /proc/cpuinfo entry names it)")
    try:
        torch_version = metadata.version("torch")
    except metadata.PackageNotFoundError:
        return PeakUnavailable(
            f"the server's interpreter ({sys.executable}) has no torch to run the matmul probe with: install "
            "torch there, or pass peak_tflops"
        )
    return MachineKey(model, os.cpu_count() or 1, torch_version, threads or usable_cpus())


def run_probe(
    threads: int, budget_s: float = PROBE_BUDGET_S, timeout_s: float = PROBE_TIMEOUT_S
) -> ProbeResult:
    """Run the GEMM probe in a fresh process of the server's interpreter (the boundary tests replace).

    ``-I`` keeps the workspace and ``PYTHON*`` variables off its import path; it starts in the root
    folder, so no file of the agent's is next to it.
    """
    argv = [sys.executable, "-I", "-m", "perfgate.hardware.gemm_probe", "--threads", str(threads)]
    argv += ["--budget-s", str(budget_s)]
    try:
        done = subprocess.run(argv, cwd="/", capture_output=True, text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        return ProbeResult(None, f"the matmul probe did not finish within {timeout_s:g} s")
    except OSError as exc:
        return ProbeResult(None, f"the matmul probe could not start: {exc}")
    if done.returncode != 0:
        lines = done.stderr.strip().splitlines()
        return ProbeResult(
            None,
            f"the matmul probe exited with status {done.returncode}" + (f": {lines[-1]}" if lines else ""),
        )
    try:
        parsed: Any = json.loads(done.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return ProbeResult(None, "the matmul probe printed no result")
    if not isinstance(parsed, dict):
        return ProbeResult(None, "the matmul probe printed no result")
    return ProbeResult(cast("dict[str, Any]", parsed), None)


def _read_cache(path: Path) -> dict[str, Any]:
    try:
        raw: Any = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return cast("dict[str, Any]", raw) if isinstance(raw, dict) else {}


def _entry_peak(
    entry: dict[str, Any], precision: str, key: MachineKey, cached: bool
) -> MeasuredPeak | PeakUnavailable:
    """The peak of ``precision`` in one cache entry (a probe's result, with when it ran)."""
    results: Any = entry.get("results")
    cell: Any = cast("dict[str, Any]", results).get(precision) if isinstance(results, dict) else None
    if not isinstance(cell, dict):
        return PeakUnavailable(f"the matmul probe measured no {precision} rate")
    found = cast("dict[str, Any]", cell)
    if "error" in found:
        return PeakUnavailable(f"the {precision} matmul probe failed on this machine: {found['error']}")
    tflops = found.get("tflops")
    if not isinstance(tflops, int | float) or isinstance(tflops, bool) or not tflops > 0:
        return PeakUnavailable(f"the matmul probe measured no {precision} rate")
    dtype = "float32" if precision == "fp32" else "bfloat16"
    method = (
        f"torch {key.torch_version} torch.mm of {found.get('n')}x{found.get('n')} {dtype} matrices, best of "
        f"{found.get('reps')} repetitions, {key.threads} threads"
    )
    return MeasuredPeak(float(tflops), precision, key, str(entry["measured_at"]), method, cached)


def measured_cpu_peak(state_dir: Path, precision: str, threads: int | None) -> MeasuredPeak | PeakUnavailable:
    """This machine's measured ``precision`` peak (fp32 or bf16) at ``threads``, from the cache or a new probe.

    Concurrent callers wait for one probe (a lock in ``state_dir``); a failed probe is not cached, so the
    next call tries again.
    """
    if precision not in CPU_PRECISIONS:
        return PeakUnavailable(
            f"perfgate measures CPU peaks at {' and '.join(CPU_PRECISIONS)} only, not {precision}: pass "
            "peak_tflops with a figure for it"
        )
    key = machine_key(threads)
    if isinstance(key, PeakUnavailable):
        return key
    folder = state_dir.joinpath(*_CACHE[:-1])
    make_dirs(folder)
    path = folder / _CACHE[-1]
    with held(folder / "cpu-peaks.lock"):
        cache = _read_cache(path)
        known: Any = cache.get(key.id)
        if isinstance(known, dict):
            return _entry_peak(cast("dict[str, Any]", known), precision, key, cached=True)
        probe = run_probe(key.threads)
        if probe.output is None:
            return PeakUnavailable(f"{probe.error}; pass peak_tflops instead")
        if probe.output.get("torch") != key.torch_version or probe.output.get("threads") != key.threads:
            return PeakUnavailable(
                f"the matmul probe ran torch {probe.output.get('torch')} with {probe.output.get('threads')} "
                f"threads, not torch {key.torch_version} with {key.threads}: pass peak_tflops instead"
            )
        entry: dict[str, Any] = {
            "results": probe.output.get("results"),
            "measured_at": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "cpu_model": key.cpu_model,
            "cores": key.cores,
            "torch_version": key.torch_version,
            "threads": key.threads,
        }
        cache[key.id] = entry
        write_file(path, json.dumps(cache, indent=1, sort_keys=True).encode("utf-8"), mode=0o600)
        return _entry_peak(entry, precision, key, cached=False)
