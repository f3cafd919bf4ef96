"""Kernel counters exported by Nsight Compute (``ncu``) or Moore Threads' ``mcu``, read into per-kernel
verdicts: memory-, compute- or latency-bound, and what limits occupancy.

Two CSV layouts are read, told apart by their header (the Nsight Compute CLI guide,
https://docs.nvidia.com/nsight-compute/NsightComputeCli/index.html, options ``--csv``, ``--page``,
``--print-units``):

- *details* (``ncu --import r.ncu-rep --csv --page details``, and ``ncu --csv`` while profiling): one row
  per metric per launch: ``ID``, ``Kernel Name``, ..., ``Section Name``, ``Metric Name``, ``Metric Unit``,
  ``Metric Value`` (rule rows carry ``Rule Name`` / ``Rule Description`` and no metric). Metric names are
  the sections' display names (``Compute (SM) Throughput``, ``Block Limit Registers``) or, for
  ``--metrics``, the raw names. ``--print-summary per-kernel`` writes the same long layout with
  ``Minimum`` / ``Maximum`` / ``Average`` columns instead of ``Metric Value``: the average is read.
- *raw* (``--page raw``): one row per launch, one column per raw metric
  (``sm__throughput.avg.pct_of_peak_sustained_elapsed``, ``launch__registers_per_thread``, ...), the
  units in the row under the header.

Numbers may carry thousands separators (``1,215,000,000.00``). mcu mirrors ncu's command shape; its
CSV is read when it has these columns (the layout is detected, never assumed), and metrics it names
differently are listed as unrecognised rather than guessed.

Verdicts follow the Speed Of Light logic: a kernel whose larger throughput (SM or memory, % of peak) is
at least `SOL_HIGH_PCT` is bound by that unit; below it on both, it is latency-bound (not enough work in
flight to use either). The occupancy limiter is the smallest of the block limits per SM (registers,
shared memory, warps, the SM's block slots), reported when theoretical occupancy is under 100%.
Counter durations come from replayed, serialized kernels: they rank kernels, never measure throughput.
"""

from __future__ import annotations

import csv
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field

from perfgate.helpers.safeopen import open_file
from perfgate.traces.errors import TraceFormatError

__all__ = [
    "MAX_COUNTER_CSV_BYTES",
    "SOL_HIGH_PCT",
    "Bound",
    "KernelCounterTable",
    "KernelCounters",
    "import_counter_csv",
    "is_counter_csv",
    "join_trace_kernels",
    "name_keys",
]

MAX_COUNTER_CSV_BYTES = 64 << 20
"""Largest export read (64 MiB): a full-set details page is ~25 KB per launch, so this holds thousands."""
MAX_KERNELS_SHOWN = 40
"""Kernels listed per file, most counter time (or trace time, when joined) first; the rest are counted."""
SOL_HIGH_PCT = 60.0
"""Throughput (% of peak) from which a unit counts as the bound: the threshold of Nsight Compute's own
Speed Of Light bottleneck rule, below which it reports latency issues."""
ACHIEVED_GAP = 0.8
"""Achieved occupancy under this fraction of the theoretical one is called out (imbalance, tail waves)."""

Bound = Literal["memory", "compute", "latency", "unknown"]
Layout = Literal["details", "summary", "raw"]
Match = Literal["exact", "no_params", "no_templates", "base_name", "prefix", "ambiguous", "none"]

# canonical field <- (details-page display names, raw metric names)
_METRICS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "sm_pct": (("Compute (SM) Throughput", "SM Throughput"), ("sm__throughput.avg.pct_of_peak_sustained_elapsed",)),
    "memory_pct": (
        ("Memory Throughput",),
        ("gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed",),
    ),
    "dram_pct": (
        ("DRAM Throughput",),
        (
            "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed",
            "dram__throughput.avg.pct_of_peak_sustained_elapsed",
        ),
    ),
    "duration": (("Duration",), ("gpu__time_duration.sum", "gpu__time_duration")),
    "registers": (("Registers Per Thread",), ("launch__registers_per_thread",)),
    "smem_static": (("Static Shared Memory Per Block",), ("launch__shared_mem_per_block_static",)),
    "smem_dynamic": (("Dynamic Shared Memory Per Block",), ("launch__shared_mem_per_block_dynamic",)),
    "smem": ((), ("launch__shared_mem_per_block",)),
    "achieved_pct": (("Achieved Occupancy",), ("sm__warps_active.avg.pct_of_peak_sustained_active",)),
    "theoretical_pct": (("Theoretical Occupancy",), ("sm__maximum_warps_per_active_cycle_pct",)),
    "limit_registers": (("Block Limit Registers",), ("launch__occupancy_limit_registers",)),
    "limit_shared_mem": (("Block Limit Shared Mem",), ("launch__occupancy_limit_shared_mem",)),
    "limit_warps": (("Block Limit Warps",), ("launch__occupancy_limit_warps",)),
    "limit_blocks": (("Block Limit SM",), ("launch__occupancy_limit_blocks",)),
    "limit_barriers": (("Block Limit Barriers",), ("launch__occupancy_limit_barriers",)),
    "waves": (("Waves Per SM",), ("launch__waves_per_multiprocessor",)),
    "block_size": (("Block Size",), ("launch__block_size",)),
    "grid_size": (("Grid Size",), ("launch__grid_size",)),
}  # fmt: skip
_BY_NAME: dict[str, str] = {
    name.lower(): key for key, (shown, raw) in _METRICS.items() for name in (*shown, *raw)
}
_LIMITS = {
    "limit_registers": "registers",
    "limit_shared_mem": "shared_memory",
    "limit_warps": "warps",
    "limit_blocks": "block_slots",
    "limit_barriers": "barriers",
}
_TIME_UNITS = {
    **{"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0},
    **{"ms": 1e3, "msecond": 1e3, "s": 1e6, "second": 1e6},
}
_BYTE_UNITS = {"byte": 1.0, "kbyte": 1e3, "mbyte": 1e6, "kib": 1024.0, "mib": 1024.0**2}
_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")
"""A kernel name never starts with these; a cell that does was written by a spreadsheet (or to become a
formula in one), not by the profiler."""


class KernelCounters(BaseModel):
    """One kernel name's counters, averaged over its profiled launches (weighted by counter duration)."""

    kernel: str = Field(description="As the export names it.")
    launches: int = Field(description="Profiled launches of this name in the export.")
    bound: Bound = Field(description="memory / compute / latency from the SpeedOfLight throughputs.")
    sm_throughput_pct: float | None = Field(description="Compute (SM) throughput, % of peak.")
    memory_throughput_pct: float | None = Field(
        description="Memory throughput (max of DRAM/L2/L1), % of peak."
    )
    dram_throughput_pct: float | None
    duration_us: float | None = Field(description="Mean counter duration per launch (replayed: ranks only).")
    registers_per_thread: float | None
    shared_memory_per_block_bytes: float | None = Field(description="Static + dynamic shared memory.")
    theoretical_occupancy_pct: float | None
    achieved_occupancy_pct: float | None
    block_limits: dict[str, float] = Field(
        description="Blocks per SM each resource allows: registers, shared_memory, warps, block_slots, barriers."
    )
    occupancy_limiters: list[str] = Field(
        description="The smallest block limits (ties listed), when theoretical occupancy is under 100%."
    )
    waves_per_sm: float | None
    finding: str = Field(description="One line: the verdict with its deciding figures and what to try.")
    trace_match: Match = Field(
        default="none", description="How the name matched a trace kernel (exact ... base_name, prefix)."
    )
    trace_kernels: list[str] = Field(
        default_factory=list[str], description="The trace's kernel names it matched (several: ambiguous)."
    )
    trace_share: float | None = Field(
        default=None, description="Share of the trace's device time in the matched kernels (rank max)."
    )


class KernelCounterTable(BaseModel):
    """An ncu/mcu export, read."""

    path: str
    bytes: int
    tool: Literal["ncu", "mcu", "unknown"] = Field(description="From the Device column and metric names.")
    layout: Layout
    launches: int = Field(description="Profiled launches read.")
    kernels: list[KernelCounters] = Field(description="Most trace time (or counter time) first.")
    kernels_omitted: int = Field(description="Kernels beyond the list's cap.")
    unrecognised_metrics: list[str] = Field(
        description="Metric names read but not used (first 20): a renamed metric shows up here."
    )
    warnings: list[str]


@dataclass
class _Launch:
    kernel: str
    values: dict[str, float] = field(default_factory=dict[str, float])


def is_counter_csv(path: Path) -> bool:
    """Whether ``path`` looks like an ncu/mcu export (its header names a kernel and metrics), from its
    first 64 KiB; nsys/msys summaries are not."""
    try:
        with open_file(path) as fh:
            head = fh.read(1 << 16)
    except OSError:
        return False
    text = _decode(head, path, partial=True)
    return _header_index(text.splitlines()) is not None


def import_counter_csv(path: Path) -> KernelCounterTable:
    """Read one ncu/mcu CSV export into per-kernel counters and verdicts.

    Raises:
        TraceFormatError: too large, binary, not UTF-8/UTF-16, no header naming kernels and metrics, or no
            metric perfgate uses; each message says how to re-export.
        OSError: the file cannot be read.
    """
    # Opened once, following no symbolic link: what is read is what the caller confined.
    with open_file(path) as fh:
        data = fh.read(MAX_COUNTER_CSV_BYTES + 1)
    size = len(data)
    if size > MAX_COUNTER_CSV_BYTES:
        raise TraceFormatError(
            f"{path}: over the {MAX_COUNTER_CSV_BYTES >> 20} MiB a counter export may have; "
            "export fewer launches (ncu --launch-count / --kernel-name) or fewer sections "
            "(--section SpeedOfLight --section Occupancy --section LaunchStats)"
        )
    text = _decode(data, path, partial=False)
    del data
    lines = text.splitlines()
    start = _header_index(lines)
    if start is None:
        raise TraceFormatError(
            f"{path}: no ncu/mcu CSV header (a row with 'Kernel Name' and 'Metric Name'/'Metric Value', or "
            "raw metric columns like 'sm__throughput.avg.pct_of_peak_sustained_elapsed'); export with "
            "`ncu --import REPORT.ncu-rep --csv --page details > FILE.csv` (or --page raw)"
        )
    # Profiler and application lines (==PROF==, prints) may follow the table: keep CSV rows only.
    body = [ln for ln in lines[start:] if ln.strip() and not ln.startswith("==")]
    try:
        rows = list(csv.reader(body))
    except csv.Error as exc:
        raise TraceFormatError(
            f"{path}: the CSV cannot be parsed ({exc}); re-export it with ncu --csv, unedited"
        ) from exc
    header = [h.strip() for h in rows[0]]
    warnings: list[str] = []
    lowered = [h.lower() for h in header]
    if "metric name" in lowered:
        layout: Layout = "summary" if "metric value" not in lowered else "details"
        launches, unknown = _long_rows(header, rows[1:], warnings)
    else:
        layout = "raw"
        launches, unknown = _wide_rows(header, rows[1:], warnings)
    if not launches:
        raise TraceFormatError(
            f"{path}: the export holds no kernel rows perfgate can read"
            + (f" ({'; '.join(warnings)})" if warnings else "")
            + "; profile at least one kernel and export it with ncu --csv --page details"
        )
    kernels = _per_kernel(launches)
    if not any(_has_figures(k) for k in kernels):
        raise TraceFormatError(
            f"{path}: none of the metrics perfgate reads is in this export (read: "
            f"{', '.join(unknown[:8]) or 'none'}); capture with --section SpeedOfLight --section Occupancy "
            "--section LaunchStats (or --set full)"
        )
    kernels.sort(key=lambda k: (k.duration_us or 0.0) * k.launches, reverse=True)
    return KernelCounterTable(
        path=str(path),
        bytes=size,
        tool=_tool(header, rows[1:], unknown),
        layout=layout,
        launches=len(launches),
        kernels=kernels[:MAX_KERNELS_SHOWN],
        kernels_omitted=max(len(kernels) - MAX_KERNELS_SHOWN, 0),
        unrecognised_metrics=unknown[:20],
        warnings=warnings,
    )


# --------------------------------------------------------------------------- reading


def _decode(data: bytes, path: Path, *, partial: bool) -> str:
    """The text of an export: UTF-8 (with or without BOM) or UTF-16 with a BOM (what a PowerShell
    redirect writes)."""
    if b"\x00" in data[:4096] and not data.startswith((b"\xff\xfe", b"\xfe\xff")):
        raise TraceFormatError(
            f"{path}: binary data, not CSV (a .ncu-rep report?); export it with "
            "`ncu --import REPORT.ncu-rep --csv --page details > FILE.csv`"
        )
    encoding = "utf-16" if data.startswith((b"\xff\xfe", b"\xfe\xff")) else "utf-8-sig"
    try:
        return data.decode(encoding, errors="ignore" if partial else "strict")
    except UnicodeDecodeError as exc:
        raise TraceFormatError(
            f"{path}: not UTF-8 text (byte {exc.start}); re-export with ncu --csv, or convert it with "
            "`iconv -t UTF-8`"
        ) from exc


def _header_index(lines: Sequence[str]) -> int | None:
    for i, line in enumerate(lines[:200]):
        if "Kernel Name" not in line:
            continue
        cells = {c.strip().lower() for c in next(csv.reader([line]), list[str]())}
        if "kernel name" in cells and ("metric name" in cells or any("__" in c and "." in c for c in cells)):
            return i
    return None


def _number(text: str, unit: str = "") -> float | None:
    cell = text.strip().replace(",", "")
    if not cell or cell.lower() in ("n/a", "nan", "inf", "-inf"):
        return None
    try:
        value = float(cell)
    except ValueError:
        return None
    u = unit.strip().lower().split("/")[0]
    if u in _TIME_UNITS:
        return value * _TIME_UNITS[u]
    if u in _BYTE_UNITS:
        return value * _BYTE_UNITS[u]
    return value


def _kernel_name(cell: str, skipped: list[int]) -> str | None:
    name = cell.strip()
    if not name:
        return None
    if name.startswith(_FORMULA_START):
        skipped[0] += 1
        return None
    return name


def _formula_warning(skipped: list[int], warnings: list[str]) -> None:
    if skipped[0]:
        warnings.append(
            f"{skipped[0]} row(s) skipped: their kernel name starts with '=', '+', '-' or '@' (a spreadsheet "
            "formula, not a profiler kernel name); re-export from the .ncu-rep instead of an edited copy"
        )


def _long_rows(
    header: list[str], rows: Iterable[list[str]], warnings: list[str]
) -> tuple[list[_Launch], list[str]]:
    col = {h.lower(): i for i, h in enumerate(header)}
    kernel_at, name_at = col["kernel name"], col["metric name"]
    value_at = col.get("metric value", col.get("average"))
    if value_at is None:
        warnings.append("the CSV has 'Metric Name' but neither 'Metric Value' nor 'Average': no value read")
        return [], []
    unit_at, id_at = col.get("metric unit"), col.get("id")
    need = max(kernel_at, name_at, value_at)
    launches: dict[tuple[str, str], _Launch] = {}
    unknown: dict[str, None] = {}
    short, skipped = 0, [0]
    for n, row in enumerate(rows):
        if len(row) <= need:
            short += 1
            continue
        kernel = _kernel_name(row[kernel_at], skipped)
        metric = row[name_at].strip()
        if kernel is None or not metric:
            continue  # a rule row (no metric), or a skipped name
        key = _BY_NAME.get(metric.lower())
        if key is None:
            unknown.setdefault(metric)
            continue
        unit = row[unit_at] if unit_at is not None and unit_at < len(row) else ""
        value = _number(row[value_at], unit)
        if value is None:
            continue
        if key == "duration" and unit_at is not None and not unit.strip():
            value /= 1e3  # a raw duration without a unit is in nanoseconds
        ident = row[id_at].strip() if id_at is not None else str(n)
        launch = launches.setdefault((ident, kernel), _Launch(kernel))
        launch.values[key] = value
    if short:
        warnings.append(f"{short} row(s) with too few columns ignored (a truncated or hand-edited export)")
    _formula_warning(skipped, warnings)
    return list(launches.values()), list(unknown)


def _wide_rows(
    header: list[str], rows: list[list[str]], warnings: list[str]
) -> tuple[list[_Launch], list[str]]:
    kernel_at = [h.lower() for h in header].index("kernel name")
    used = {i: _BY_NAME[h.lower()] for i, h in enumerate(header) if h.lower() in _BY_NAME}
    unknown = [h for h in header if "__" in h and h.lower() not in _BY_NAME]
    units = [""] * len(header)
    if rows and not rows[0][kernel_at if kernel_at < len(rows[0]) else 0].strip():
        units = rows[0] + [""] * (len(header) - len(rows[0]))  # the units row under the header
        rows = rows[1:]
    launches: list[_Launch] = []
    short, skipped = 0, [0]
    for row in rows:
        if len(row) < len(header):
            short += 1
            continue
        kernel = _kernel_name(row[kernel_at], skipped)
        if kernel is None:
            continue
        launch = _Launch(kernel)
        for i, key in used.items():
            value = _number(row[i], units[i])
            if value is not None:
                if key == "duration" and not units[i].strip():
                    value /= 1e3  # nanoseconds when no unit row says otherwise
                launch.values[key] = value
        launches.append(launch)
    if short:
        warnings.append(f"{short} row(s) with too few columns ignored (a truncated or hand-edited export)")
    _formula_warning(skipped, warnings)
    return launches, unknown


def _tool(header: list[str], rows: list[list[str]], unknown: list[str]) -> Literal["ncu", "mcu", "unknown"]:
    lowered = [h.lower() for h in header]
    if "device" in lowered:
        at = lowered.index("device")
        devices = " ".join(r[at] for r in rows[:50] if at < len(r)).lower()
        if "mtt" in devices or "musa" in devices or "moore" in devices:
            return "mcu"
        if "nvidia" in devices or "geforce" in devices or "tesla" in devices:
            return "ncu"
    if "cc" in lowered:
        return "ncu"  # the compute capability column is CUDA's
    return "unknown"


# --------------------------------------------------------------------------- verdicts


def _per_kernel(launches: list[_Launch]) -> list[KernelCounters]:
    groups: dict[str, list[_Launch]] = {}
    for launch in launches:
        groups.setdefault(launch.kernel, []).append(launch)
    return [_verdict(name, group) for name, group in groups.items()]


def _mean(group: list[_Launch], key: str) -> float | None:
    pairs = [(ln.values[key], ln.values.get("duration", 1.0)) for ln in group if key in ln.values]
    if not pairs:
        return None
    weight = sum(w for _, w in pairs)
    if weight <= 0:
        return sum(v for v, _ in pairs) / len(pairs)
    return sum(v * w for v, w in pairs) / weight


def _has_figures(k: KernelCounters) -> bool:
    return any(
        v is not None
        for v in (
            k.sm_throughput_pct,
            k.memory_throughput_pct,
            k.registers_per_thread,
            k.theoretical_occupancy_pct,
        )
    ) or bool(k.block_limits)


def _verdict(name: str, group: list[_Launch]) -> KernelCounters:
    sm, mem = _mean(group, "sm_pct"), _mean(group, "memory_pct")
    dram = _mean(group, "dram_pct")
    if mem is None and dram is not None:
        mem = dram
    bound: Bound = "unknown"
    if sm is not None and mem is not None:
        bound = "latency" if max(sm, mem) < SOL_HIGH_PCT else "compute" if sm >= mem else "memory"
    static, dynamic, whole = _mean(group, "smem_static"), _mean(group, "smem_dynamic"), _mean(group, "smem")
    smem = (
        whole
        if whole is not None
        else (None if static is None and dynamic is None else (static or 0) + (dynamic or 0))
    )
    limits = {label: v for key, label in _LIMITS.items() if (v := _mean(group, key)) is not None}
    theoretical, achieved = _mean(group, "theoretical_pct"), _mean(group, "achieved_pct")
    limiters: list[str] = []
    if limits and (theoretical is None or theoretical < 99.5):
        low = min(limits.values())
        limiters = [k for k, v in limits.items() if v == low]
    k = KernelCounters(
        kernel=name,
        launches=len(group),
        bound=bound,
        sm_throughput_pct=sm,
        memory_throughput_pct=mem,
        dram_throughput_pct=dram,
        duration_us=_mean(group, "duration"),
        registers_per_thread=_mean(group, "registers"),
        shared_memory_per_block_bytes=smem,
        theoretical_occupancy_pct=theoretical,
        achieved_occupancy_pct=achieved,
        block_limits=limits,
        occupancy_limiters=limiters,
        waves_per_sm=_mean(group, "waves"),
        finding="",
    )
    k.finding = _finding(k)
    return k


_TRY: dict[Bound, str] = {
    "memory": "move fewer bytes: fuse it with its neighbours, use a lower-precision or better-coalesced "
    "layout; more SM work will not help",
    "compute": "do less arithmetic or use faster units: tensor-core precisions (bf16/fp8), a better "
    "GEMM/attention kernel; bandwidth is not the limit",
    "latency": "put more work in flight: larger tiles or batch, fewer tiny launches (fusion, CUDA graphs), "
    "higher occupancy",
    "unknown": "export the SpeedOfLight section to get a verdict",
}


def _finding(k: KernelCounters) -> str:
    parts = [f"{k.bound}-bound" if k.bound != "unknown" else "bound unknown (no SpeedOfLight throughputs)"]
    if k.sm_throughput_pct is not None and k.memory_throughput_pct is not None:
        parts.append(f"SM {k.sm_throughput_pct:.0f}% / memory {k.memory_throughput_pct:.0f}% of peak")
    if k.occupancy_limiters:
        why: list[str] = []
        for lim in k.occupancy_limiters:
            if lim == "registers" and k.registers_per_thread is not None:
                why.append(f"registers ({k.registers_per_thread:.0f}/thread)")
            elif lim == "shared_memory" and k.shared_memory_per_block_bytes is not None:
                why.append(f"shared memory ({k.shared_memory_per_block_bytes / 1024:.0f} KiB/block)")
            else:
                why.append(lim.replace("_", " "))
        occ = f"{k.theoretical_occupancy_pct:.0f}% " if k.theoretical_occupancy_pct is not None else ""
        parts.append(f"theoretical occupancy {occ}limited by {' and '.join(why)}")
    if (
        k.achieved_occupancy_pct is not None
        and k.theoretical_occupancy_pct
        and k.achieved_occupancy_pct < ACHIEVED_GAP * k.theoretical_occupancy_pct
    ):
        parts.append(
            f"achieved occupancy {k.achieved_occupancy_pct:.0f}% of {k.theoretical_occupancy_pct:.0f}% "
            "(uneven blocks or a partial last wave)"
        )
    text = "; ".join(parts)
    if k.bound == "latency" and k.occupancy_limiters:
        return f"{text}. Try: raise occupancy past the {k.occupancy_limiters[0].replace('_', ' ')} limit, or {_TRY['latency']}"
    return f"{text}. Try: {_TRY[k.bound]}"


# --------------------------------------------------------------------------- joining to a trace

_SPACES = re.compile(r"\s+")


def _strip_templates(name: str) -> str:
    out: list[str] = []
    depth = 0
    for ch in name:
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth = max(depth - 1, 0)
        elif depth == 0:
            out.append(ch)
    return "".join(out)


def _strip_params(name: str) -> str:
    """The name without its trailing ``(...)`` parameter list and leading return type (``void``)."""
    depth = 0
    for i in range(len(name) - 1, -1, -1):
        ch = name[i]
        if ch == ")":
            depth += 1
        elif ch == "(":
            depth -= 1
            if depth == 0:
                name = name[:i]
                break
    name = name.strip()
    return name[5:] if name.startswith("void ") else name


def name_keys(name: str) -> dict[Match, str]:
    """The forms a kernel name is compared by, most specific first: the whole name, without parameters
    (and ``void``), without template arguments, and the base name (after the last ``::``)."""
    whole = _SPACES.sub(" ", name.strip()).replace(" >", ">").replace("< ", "<").replace(", ", ",")
    no_params = _strip_params(whole)
    no_templates = _SPACES.sub(" ", _strip_templates(no_params)).strip()
    base = no_templates.rsplit("::", 1)[-1].split(" ")[-1]
    return {"exact": whole, "no_params": no_params, "no_templates": no_templates, "base_name": base}


def join_trace_kernels(table: KernelCounterTable, trace_kernels: dict[str, float]) -> None:
    """Match each counter kernel to the trace's kernel names (``{name: share of device time}``), the most
    specific form first; a name matching several trace kernels at its best level is ``ambiguous`` (their
    shares are summed). Kernels are then ordered by trace share."""
    keyed = {name: name_keys(name) for name in trace_kernels}
    levels: tuple[Match, ...] = ("exact", "no_params", "no_templates", "base_name")
    for k in table.kernels:
        mine = name_keys(k.kernel)
        for level in levels:
            hits = [t for t, keys in keyed.items() if keys[level] == mine[level] and mine[level]]
            if hits:
                break
        else:
            level = "prefix"
            # A name cut short (ending in '...', or just shorter) matches the names it begins.
            stem = mine["exact"].removesuffix("...").removesuffix("…")
            hits = [
                t
                for t, keys in keyed.items()
                if len(stem) >= 16
                and (keys["exact"].startswith(stem) or stem.startswith(keys["exact"].removesuffix("...")))
            ]
        if not hits:
            continue
        k.trace_match = level if len(hits) == 1 else "ambiguous"
        k.trace_kernels = sorted(hits)[:10]
        k.trace_share = sum(trace_kernels[t] for t in hits)
    table.kernels.sort(
        key=lambda k: (k.trace_share or 0.0, (k.duration_us or 0.0) * k.launches), reverse=True
    )
