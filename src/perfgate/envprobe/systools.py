"""System tools (nvidia-smi, NVML, mthreads-gmi, rocm-smi, nsys, ncu, msys, mcu): found, versioned, parsed.

Each tool runs with a fixed, read-only argv chosen here (never from tool input), without a shell, in its
own process group, under a short timeout, with ``LC_ALL=C``. Tools are looked up on PATH, skipping
relative entries and anything inside the workspace, so a file an agent wrote cannot stand in for
``nvidia-smi``. Vendor output formats change between releases, so parsing is best effort: the raw text
is always kept, and a field that cannot be parsed stays ``None``.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import re
import shutil
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, cast

from perfgate.envprobe.fixed import RawRun, run_fixed
from perfgate.envprobe.models import SystemDevice, SystemTool

__all__ = [
    "DEVICE_TOOLS",
    "PROFILER_TOOLS",
    "RawRun",
    "collect_system_tools",
    "nvml_tool",
    "parse_gmi_list",
    "parse_gmi_query",
    "parse_key_values",
    "parse_nvidia_smi_csv",
    "parse_rocm_smi_json",
    "parse_version",
    "run_fixed",
    "safe_which",
]

DEVICE_TOOLS = ("nvidia-smi", "mthreads-gmi", "rocm-smi")
PROFILER_TOOLS = ("nsys", "ncu", "msys", "mcu")
_MIB = 1024 * 1024

NVIDIA_SMI_FIELDS = ("index", "name", "uuid", "driver_version", "memory.total", "compute_cap", "pci.bus_id")
# Drivers older than R510 do not know compute_cap; the query is retried without it.
NVIDIA_SMI_FIELDS_OLD = ("index", "name", "uuid", "driver_version", "memory.total", "pci.bus_id")


Runner = Callable[[Sequence[str], float, Mapping[str, str]], RawRun]


def safe_which(name: str, path_env: str | None, workspace: Path | None) -> str | None:
    """``shutil.which`` over absolute PATH entries outside ``workspace`` only."""
    entries: list[str] = []
    for entry in (path_env or os.defpath).split(os.pathsep):
        if not entry or not os.path.isabs(entry):
            continue
        if workspace is not None:
            try:
                resolved = Path(entry).resolve()
            except (OSError, RuntimeError):  # symlink loops: skip the entry
                continue
            if resolved == workspace or workspace in resolved.parents:
                continue
        entries.append(entry)
    return shutil.which(name, path=os.pathsep.join(entries)) if entries else None


# ---------------------------------------------------------------- parsers


def _clean(value: str | None) -> str | None:
    if value is None:
        return None
    value = value.strip()
    if not value or value.upper() in {"N/A", "[N/A]", "[NOT SUPPORTED]", "NOT SUPPORTED", "UNKNOWN", "-"}:
        return None
    return value


def _memory_bytes(text: str | None, default_unit: str = "MiB") -> int | None:
    """'81559 MiB', '80 GiB', '49152' (default unit), '85899345920 B' -> bytes; None if unparsable."""
    text = _clean(text)
    if text is None:
        return None
    match = re.fullmatch(r"([\d.]+)\s*([KMGT]i?B|B|bytes)?", text, re.IGNORECASE)
    if not match:
        return None
    number = float(match.group(1))
    unit = (match.group(2) or default_unit).lower()
    scale = {
        "b": 1,
        "bytes": 1,
        "kib": 1024,
        "kb": 1000,
        "mib": _MIB,
        "mb": 1000**2,
        "gib": 1024**3,
        "gb": 1000**3,
        "tib": 1024**4,
        "tb": 1000**4,
    }
    return int(number * scale[unit])


def parse_version(text: str) -> str | None:
    """The first version number a ``--version`` output states, preferring one after the word 'version'."""
    match = re.search(r"[Vv]ersion[:\s]+v?(\d+(?:\.\d+)+[\w.\-+]*)", text)
    if match is None:
        match = re.search(r"(?<![\w.])v?(\d+\.\d+(?:\.\d+)*[\w.\-+]*)", text)
    return match.group(1) if match else None


def parse_key_values(text: str) -> dict[str, str]:
    """``key : value`` lines (first occurrence of each key wins), stripped."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() and key.strip() not in out:
            out[key.strip()] = value.strip()
    return out


def parse_nvidia_smi_csv(text: str, fields: Sequence[str]) -> list[SystemDevice]:
    """Rows of ``--query-gpu=... --format=csv,noheader,nounits`` (memory in MiB)."""
    devices: list[SystemDevice] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        cells = [c.strip() for c in line.split(",")]
        if len(cells) != len(fields):
            continue
        row = dict(zip(fields, cells, strict=True))
        index = _clean(row.get("index"))
        devices.append(
            SystemDevice(
                index=int(index) if index and index.isdigit() else None,
                name=_clean(row.get("name")),
                uuid=_clean(row.get("uuid")),
                total_memory_bytes=_memory_bytes(row.get("memory.total")),
                capability=_clean(row.get("compute_cap")),
                pci_bus_id=_clean(row.get("pci.bus_id")),
            )
        )
    return devices


def parse_gmi_list(text: str) -> list[SystemDevice]:
    """``mthreads-gmi -L`` lines such as ``GPU 0: MTT S4000 (UUID: GPU-...)``."""
    devices: list[SystemDevice] = []
    for line in text.splitlines():
        match = re.match(r"\s*GPU\s+(\d+)\s*:\s*(.+?)\s*(?:\((?:UUID|uuid)\s*:\s*([^)]+)\))?\s*$", line)
        if match:
            devices.append(
                SystemDevice(
                    index=int(match.group(1)), name=match.group(2).strip(), uuid=_clean(match.group(3))
                )
            )
    return devices


def parse_gmi_query(text: str) -> tuple[dict[str, str], list[SystemDevice]]:
    """``mthreads-gmi -q``: (host-wide key/values, one device per 'Product Name' block).

    Indentation marks nesting: a memory 'Total' counts only under a header that mentions memory.
    """
    host: dict[str, str] = {}
    devices: list[dict[str, str]] = []
    header = ""
    for line in text.splitlines():
        if not line.strip():
            continue
        # "Key   : value" needs blank space before the colon, so "GPU 00000000:3B:00.0" is a header.
        match = re.match(r"\s*(?P<key>[^:]*?\S)\s+:\s*(?P<value>.*?)\s*$", line)
        if match is None or not match.group("value"):
            header = line.strip().rstrip(":").strip()
            if re.match(r"GPU\b", header):
                devices.append({})
            continue
        key, value = match.group("key"), match.group("value")
        if key == "Product Name" and (not devices or "Product Name" in devices[-1]):
            devices.append({})
        target = devices[-1] if devices else host
        if key == "Total" and "memory" in header.lower():
            target.setdefault("memory_total", value)
        else:
            target.setdefault(key, value)
    parsed: list[SystemDevice] = []
    for position, fields in enumerate(devices):
        if not fields:
            continue
        index = _clean(fields.get("Index") or fields.get("Minor Number"))
        parsed.append(
            SystemDevice(
                index=int(index) if index and index.isdigit() else position,
                name=_clean(fields.get("Product Name")),
                uuid=_clean(fields.get("GPU UUID") or fields.get("UUID")),
                total_memory_bytes=_memory_bytes(fields.get("memory_total")),
                pci_bus_id=_clean(fields.get("Bus Id") or fields.get("Bus ID")),
            )
        )
    for fields in devices:
        for key, value in fields.items():
            if "version" in key.lower():
                host.setdefault(key, value)
    return host, parsed


def parse_rocm_smi_json(text: str) -> tuple[str | None, list[SystemDevice]]:
    """``rocm-smi ... --json``: (driver version, cards). Keys differ between releases; unknown ones are ignored."""
    import json

    try:
        data: Any = json.loads(text)
    except ValueError:
        return None, []
    if not isinstance(data, dict):
        return None, []
    entries = cast("dict[str, Any]", data)
    driver: str | None = None
    devices: list[SystemDevice] = []
    for key, value in sorted(entries.items()):
        if not isinstance(value, dict):
            continue
        # Key case differs between releases ('Card series' in ROCm 5, 'Card Series' in ROCm 6).
        card = {str(k).lower(): v for k, v in cast("dict[Any, Any]", value).items()}
        for field, field_value in card.items():
            if "driver version" in field:
                driver = driver or str(field_value)
        match = re.fullmatch(r"card(\d+)", key)
        if match:
            name = card.get("card series") or card.get("card sku") or card.get("card model")
            memory = card.get("vram total memory (b)")
            devices.append(
                SystemDevice(
                    index=int(match.group(1)),
                    name=_clean(str(name)) if name is not None else None,
                    uuid=_clean(str(card["unique id"])) if "unique id" in card else None,
                    total_memory_bytes=_memory_bytes(str(memory), "B") if memory is not None else None,
                    capability=_clean(str(card["gfx version"])) if "gfx version" in card else None,
                )
            )
    return driver, devices


# ---------------------------------------------------------------- per-tool collection


def _nvidia_smi(
    path: str, run: Runner, timeout_s: float, env: Mapping[str, str]
) -> tuple[SystemTool, list[RawRun]]:
    tool = SystemTool(name="nvidia-smi", found=True, path=path)
    runs: list[RawRun] = []
    version = run([path, "--version"], timeout_s, env)
    runs.append(version)
    if version.ok:
        values = {k.lower(): v for k, v in parse_key_values(version.stdout).items()}
        tool.version = _clean(values.get("nvidia-smi version"))
        tool.driver_version = _clean(values.get("driver version"))
        tool.runtime_version = _clean(values.get("cuda version"))
    else:
        # Older drivers have no --version; the banner of a plain run states driver and CUDA versions.
        banner = run([path], timeout_s, env)
        runs.append(banner)
        driver = re.search(r"Driver Version:\s*([\w.\-]+)", banner.stdout)
        cuda = re.search(r"CUDA Version:\s*([\w.\-]+)", banner.stdout)
        smi = re.search(r"NVIDIA-SMI\s+([\w.\-]+)", banner.stdout)
        tool.driver_version = driver.group(1) if driver else None
        tool.runtime_version = cuda.group(1) if cuda else None
        tool.version = smi.group(1) if smi else None
        if not banner.ok:
            tool.errors.append(f"nvidia-smi: {banner.describe_failure()}")
    fields = NVIDIA_SMI_FIELDS
    query = run([path, f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits"], timeout_s, env)
    runs.append(query)
    if not query.ok and "compute_cap" in (query.stdout + query.stderr):
        fields = NVIDIA_SMI_FIELDS_OLD
        query = run(
            [path, f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits"], timeout_s, env
        )
        runs.append(query)
    if query.ok:
        tool.devices = parse_nvidia_smi_csv(query.stdout, fields)
        drivers = {d for d in _column(query.stdout, fields, "driver_version") if d}
        if tool.driver_version is None and len(drivers) == 1:
            tool.driver_version = drivers.pop()
    else:
        tool.errors.append(f"nvidia-smi --query-gpu: {query.describe_failure()}")
    return tool, runs


def _column(text: str, fields: Sequence[str], name: str) -> list[str | None]:
    position = list(fields).index(name)
    cells = [line.split(",") for line in text.splitlines() if line.strip()]
    return [_clean(row[position]) for row in cells if len(row) == len(fields)]


def _mthreads_gmi(
    path: str, run: Runner, timeout_s: float, env: Mapping[str, str]
) -> tuple[SystemTool, list[RawRun]]:
    tool = SystemTool(name="mthreads-gmi", found=True, path=path)
    query = run([path, "-q"], timeout_s, env)
    listing = run([path, "-L"], timeout_s, env)
    devices: list[SystemDevice] = []
    if query.ok:
        host, devices = parse_gmi_query(query.stdout)
        lowered = {k.lower(): v for k, v in host.items()}
        tool.driver_version = _clean(lowered.get("driver version"))
        tool.runtime_version = _clean(lowered.get("musa version") or lowered.get("musa driver version"))
        tool.version = _clean(
            lowered.get("mthreads-gmi version") or lowered.get("gmi version") or lowered.get("smi version")
        )
    else:
        tool.errors.append(f"mthreads-gmi -q: {query.describe_failure()}")
    if listing.ok:
        listed = parse_gmi_list(listing.stdout)
        if not devices:
            devices = listed
        else:
            # -q gives memory, -L the canonical index and name: merge by position when both agree in count.
            if len(listed) == len(devices):
                devices = [
                    d.model_copy(
                        update={"index": ld.index, "uuid": d.uuid or ld.uuid, "name": d.name or ld.name}
                    )
                    for d, ld in zip(devices, listed, strict=True)
                ]
    else:
        tool.errors.append(f"mthreads-gmi -L: {listing.describe_failure()}")
    tool.devices = devices if (query.ok or listing.ok) else None
    return tool, [query, listing]


def _rocm_smi(
    path: str, run: Runner, timeout_s: float, env: Mapping[str, str]
) -> tuple[SystemTool, list[RawRun]]:
    tool = SystemTool(name="rocm-smi", found=True, path=path)
    query = run(
        [path, "--showproductname", "--showdriverversion", "--showmeminfo", "vram", "--json"], timeout_s, env
    )
    if query.ok:
        tool.driver_version, tool.devices = parse_rocm_smi_json(query.stdout)
        if not tool.devices:
            tool.errors.append("rocm-smi: no card entries could be parsed from its JSON output")
    else:
        tool.errors.append(f"rocm-smi: {query.describe_failure()}")
    return tool, [query]


def _profiler(
    name: str, path: str, run: Runner, timeout_s: float, env: Mapping[str, str]
) -> tuple[SystemTool, list[RawRun]]:
    tool = SystemTool(name=name, found=True, path=path)
    result = run([path, "--version"], timeout_s, env)
    if result.ok or result.stdout.strip():
        tool.version = parse_version(result.stdout + "\n" + result.stderr)
    if tool.version is None:
        tool.errors.append(
            f"{name} --version: {result.describe_failure() if not result.ok else 'no version found'}"
        )
    return tool, [result]


def nvml_tool() -> tuple[SystemTool | None, str | None]:
    """NVML through nvidia-ml-py (module ``pynvml``) when it is importable in the server.

    Returns (tool, None), or (None, reason) when NVML cannot be used.
    """
    try:
        nvml: Any = importlib.import_module("pynvml")
    except ImportError:
        return None, "nvidia-ml-py (pynvml) is not installed in the server's environment"
    error_type = cast("type[Exception]", getattr(nvml, "NVMLError", OSError))

    def text(value: Any) -> str:
        return value.decode() if isinstance(value, bytes) else str(value)

    tool = SystemTool(name="nvml", found=True, path=getattr(nvml, "__file__", None))
    try:
        nvml.nvmlInit()
    except (error_type, OSError) as exc:
        return None, f"NVML could not initialise: {exc}"
    try:
        tool.driver_version = text(nvml.nvmlSystemGetDriverVersion())
        cuda = int(nvml.nvmlSystemGetCudaDriverVersion())
        tool.runtime_version = f"{cuda // 1000}.{cuda % 1000 // 10}"
        devices: list[SystemDevice] = []
        for index in range(int(nvml.nvmlDeviceGetCount())):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            major, minor = nvml.nvmlDeviceGetCudaComputeCapability(handle)
            devices.append(
                SystemDevice(
                    index=index,
                    name=text(nvml.nvmlDeviceGetName(handle)),
                    uuid=text(nvml.nvmlDeviceGetUUID(handle)),
                    total_memory_bytes=int(nvml.nvmlDeviceGetMemoryInfo(handle).total),
                    capability=f"{major}.{minor}",
                )
            )
        tool.devices = devices
    except (error_type, OSError, AttributeError) as exc:
        tool.errors.append(f"NVML query failed: {exc}")
    finally:
        with contextlib.suppress(error_type, OSError):
            nvml.nvmlShutdown()
    return tool, None


def collect_system_tools(
    *,
    env: Mapping[str, str],
    workspace: Path | None,
    timeout_s: float = 15.0,
    run: Runner = run_fixed,
    use_nvml: bool = True,
) -> tuple[list[SystemTool], dict[str, str], list[tuple[str, str]]]:
    """Find and query every known tool.

    Returns (tools, raw transcripts by tool name, unavailable (item, reason) pairs). Tools that are not
    found are listed with ``found=False``; they are not errors.
    """
    tool_env = {**env, "LC_ALL": "C"}
    tools: list[SystemTool] = []
    transcripts: dict[str, str] = {}
    missing: list[tuple[str, str]] = []
    for name in (*DEVICE_TOOLS, *PROFILER_TOOLS):
        path = safe_which(name, env.get("PATH"), workspace)
        if path is None:
            tools.append(SystemTool(name=name, found=False))
            missing.append((f"system_tools.{name}", "not found on PATH"))
            continue
        if name == "nvidia-smi":
            tool, runs = _nvidia_smi(path, run, timeout_s, tool_env)
        elif name == "mthreads-gmi":
            tool, runs = _mthreads_gmi(path, run, timeout_s, tool_env)
        elif name == "rocm-smi":
            tool, runs = _rocm_smi(path, run, timeout_s, tool_env)
        else:
            tool, runs = _profiler(name, path, run, timeout_s, tool_env)
        tools.append(tool)
        transcripts[name] = "".join(r.transcript() for r in runs)
    if use_nvml:
        nvml, reason = nvml_tool()
        if nvml is not None:
            tools.append(nvml)
        else:
            assert reason is not None
            missing.append(("system_tools.nvml", reason))
    return tools, transcripts, missing
