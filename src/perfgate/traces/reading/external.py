"""System- and kernel-layer profilers (Nsight Systems/Compute, Moore Threads msys/mcu).

perfgate does not run them itself: it detects which are installed and prepares the exact capture and
export commands for the human or the agent to run (evidence ``scaffolded``), then imports the CSV
summaries they export (``nsys stats --format csv``, ``msys stats``).
"""

from __future__ import annotations

import csv
import re
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field

from perfgate.helpers.cappedlines import capped_lines
from perfgate.traces.classify import Category, classify_device
from perfgate.traces.errors import TraceFormatError

__all__ = [
    "PROFILERS",
    "ExternalCapture",
    "SummaryRow",
    "SummaryTable",
    "capture_plan",
    "capture_plans",
    "import_summary_csv",
]

Layer = Literal["system", "kernel"]
ProfilerName = Literal["nsys", "ncu", "msys", "mcu"]
Vendor = Literal["auto", "nvidia", "mthreads"]

PROFILERS: dict[ProfilerName, tuple[Layer, str]] = {
    "nsys": ("system", "NVIDIA Nsight Systems"),
    "ncu": ("kernel", "NVIDIA Nsight Compute"),
    "msys": ("system", "Moore Threads Moore Perf System (MSight System)"),
    "mcu": ("kernel", "Moore Threads Moore Perf Compute"),
}

_BY_VENDOR: dict[str, dict[Layer, ProfilerName]] = {
    "nvidia": {"system": "nsys", "kernel": "ncu"},
    "mthreads": {"system": "msys", "kernel": "mcu"},
}


class ExternalCapture(BaseModel):
    """A capture prepared for one external profiler; nothing has been run."""

    tool: ProfilerName
    layer: Layer
    description: str
    available: bool = Field(description="Whether the executable is on the server's PATH.")
    executable: str | None
    capture_argv: list[str] = Field(description="Run this (from the training cwd) to capture.")
    export_argv: list[str] = Field(description="Then this, to export CSV summaries perfgate can import.")
    report_path: str
    notes: list[str]


def _stem(output_dir: Path, tool: str) -> Path:
    return output_dir / f"perfgate_{tool}"


def capture_plan(
    tool: ProfilerName,
    command: Sequence[str],
    output_dir: Path,
    *,
    kernel_skip: int = 50,
    kernel_count: int = 20,
) -> ExternalCapture:
    """The capture and export commands for ``tool`` around the training ``command``.

    ``kernel_skip``/``kernel_count`` bound a kernel-layer capture (it replays every kernel it
    profiles, so it must stay short and skip start-up).
    """
    layer, description = PROFILERS[tool]
    executable = shutil.which(tool)
    stem = _stem(output_dir, tool)
    argv = list(command)
    notes: list[str] = []
    if tool == "nsys":
        report = f"{stem}.nsys-rep"
        capture = [
            "nsys", "profile", "--output", str(stem), "--force-overwrite", "true",
            "--trace", "cuda,nvtx,osrt,cudnn,cublas", "--sample", "none", "--cpuctxsw", "none", *argv,
        ]  # fmt: skip
        export = [
            "nsys", "stats", "--report", "cuda_gpu_kern_sum,cuda_api_sum,cuda_gpu_mem_time_sum",
            "--format", "csv", "--output", str(stem), report,
        ]  # fmt: skip
        notes.append("the capture covers the whole run: keep it short (few steps) to bound the report size")
    elif tool == "msys":
        report = f"{stem}.msys-rep"
        capture = ["msys", "profile", "--output", str(stem), "--trace", "musa,osrt", *argv]
        export = ["msys", "stats", "--format", "csv", "--output", str(stem), report]
        notes.append(
            "msys follows the nsys command shape (profile/stats subcommands, --output, --trace); option "
            "spellings can differ between MSight releases: check `msys profile --help` before running"
        )
    elif tool == "ncu":
        report = f"{stem}.ncu-rep"
        capture = [
            "ncu", "--set", "full", "--target-processes", "all", "--launch-skip", str(kernel_skip),
            "--launch-count", str(kernel_count), "--export", str(stem), "--force-overwrite", *argv,
        ]  # fmt: skip
        export = ["ncu", "--import", report, "--csv", "--page", "details"]
        notes.append("ncu replays and serializes each profiled kernel: its durations are not throughput")
    else:
        report = f"{stem}.mcu-rep"
        capture = [
            "mcu", "--set", "full", "--launch-skip", str(kernel_skip), "--launch-count", str(kernel_count),
            "--export", str(stem), *argv,
        ]  # fmt: skip
        export = ["mcu", "--import", report, "--csv"]
        notes.append("mcu replays and serializes kernels: its durations are not throughput")
        notes.append(
            "mcu mirrors the ncu command shape; option spellings can differ between releases: check "
            "`mcu --help` before running"
        )
    if executable is None:
        notes.append(f"{tool} is not on this machine's PATH; run the command where it is installed")
    return ExternalCapture(
        tool=tool,
        layer=layer,
        description=description,
        available=executable is not None,
        executable=executable,
        capture_argv=capture,
        export_argv=export,
        report_path=report,
        notes=notes,
    )


def capture_plans(
    layers: Sequence[Layer], vendor: Vendor, command: Sequence[str], output_dir: Path
) -> list[ExternalCapture]:
    """The captures to prepare per layer: ``vendor``'s profiler, or with 'auto' those installed here (both
    vendors' when neither is)."""
    plans: list[ExternalCapture] = []
    for layer in layers:
        candidates: list[ProfilerName] = [_BY_VENDOR["nvidia"][layer], _BY_VENDOR["mthreads"][layer]]
        if vendor != "auto":
            candidates = [_BY_VENDOR[vendor][layer]]
        layer_plans = [capture_plan(tool, command, output_dir) for tool in candidates]
        installed = [p for p in layer_plans if p.available]
        plans.extend(installed or layer_plans)
    return plans


class SummaryRow(BaseModel):
    """One row of an exported summary, times in microseconds."""

    name: str
    count: int | None
    total_us: float
    mean_us: float | None
    p50_us: float | None
    max_us: float | None
    share: float | None = Field(description="Time (%) column / 100, when exported.")
    category: Category | None = Field(description="Kernel category, for kernel summaries.")


class SummaryTable(BaseModel):
    path: str
    report: str = Field(description="Which summary: cuda_gpu_kern_sum, cuda_api_sum, ... or 'unknown'.")
    rows: list[SummaryRow]


_REPORT_NAME = re.compile(r"(cuda_gpu_kern_sum|cuda_api_sum|cuda_gpu_mem_time_sum|cuda_gpu_mem_size_sum"
                          r"|gpukernsum|cudaapisum|gpumemtimesum|musa_gpu_kern_sum|musa_api_sum"
                          r"|musa_gpu_mem_time_sum|osrt_sum|nvtx_sum)")  # fmt: skip
_UNIT_SCALE = {"ns": 1e-3, "us": 1.0, "ms": 1e3, "s": 1e6}


def _column(header: list[str], *candidates: str) -> tuple[int, float] | None:
    """Index of the first header matching a candidate (case-insensitive prefix), and its unit scale."""
    lowered = [h.strip().lower() for h in header]
    for cand in candidates:
        for i, h in enumerate(lowered):
            if h == cand or h.startswith(cand + " ("):
                unit = re.search(r"\((ns|us|ms|s)\)", h)
                return i, _UNIT_SCALE[unit.group(1)] if unit else 1e-3
    return None


def _number(text: str) -> float | None:
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return None


def import_summary_csv(path: Path) -> SummaryTable:
    """Read one CSV summary exported by ``nsys stats`` (or ``msys stats``).

    Raises:
        TraceFormatError: no header with a name and a total-time column.
        OSError: the file cannot be read.
    """
    with path.open(encoding="utf-8", errors="replace", newline="") as fh:
        lines = [line for line in capped_lines(fh) if line.strip() and not line.startswith("#")]
    # Exports may start with a banner line before the CSV header.
    start = next((i for i, line in enumerate(lines) if "Total Time" in line or "Time (%)" in line), None)
    if start is None:
        raise TraceFormatError(
            f"{path}: no CSV header with a 'Total Time' column; export with `nsys stats --format csv`"
        )
    rows = list(csv.reader(lines[start:]))
    header = rows[0]
    name = _column(header, "name", "operation", "kernel name", "api name")
    total = _column(header, "total time")
    if name is None or total is None:
        raise TraceFormatError(f"{path}: the CSV header lacks a name or a 'Total Time' column: {header}")
    count = _column(header, "instances", "num calls", "count", "calls")
    mean = _column(header, "avg", "average")
    med = _column(header, "med", "median")
    mx = _column(header, "max", "maximum")
    pct = _column(header, "time (%)", "time(%)")
    match = _REPORT_NAME.search(path.name)
    report = match.group(1) if match else "unknown"
    is_kernels = "kern" in report

    def scaled(row: list[str], col: tuple[int, float] | None) -> float | None:
        if col is None or col[0] >= len(row):
            return None
        value = _number(row[col[0]])
        return None if value is None else value * col[1]

    out: list[SummaryRow] = []
    for row in rows[1:]:
        if len(row) <= max(name[0], total[0]):
            continue
        total_us = scaled(row, total)
        if total_us is None:
            continue
        count_value = _number(row[count[0]]) if count is not None and count[0] < len(row) else None
        share = _number(row[pct[0]]) if pct is not None and pct[0] < len(row) else None
        kernel_name = row[name[0]]
        out.append(
            SummaryRow(
                name=kernel_name,
                count=int(count_value) if count_value is not None else None,
                total_us=total_us,
                mean_us=scaled(row, mean),
                p50_us=scaled(row, med),
                max_us=scaled(row, mx),
                share=share / 100 if share is not None else None,
                category=classify_device(kernel_name, "kernel")[0] if is_kernels else None,
            )
        )
    out.sort(key=lambda r: r.total_us, reverse=True)
    return SummaryTable(path=str(path), report=report, rows=out)
