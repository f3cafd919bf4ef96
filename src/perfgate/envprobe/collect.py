"""Assemble one environment record from the probe, the system tools and provenance, then sanitise it.

`assemble` is pure: it takes what was observed and returns the summary, the cross-checks, the
fingerprint and the full ``environment.json`` document, every string already passed through the
`Redactor`. Nothing missing is filled in: a fact that was not observed is ``None`` and has an
``unavailable`` entry saying why.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

from perfgate.envprobe.fingerprint import make_fingerprint
from perfgate.envprobe.models import (
    ContainerProvenance,
    Device,
    EnvironmentSummary,
    Fingerprint,
    GitProvenance,
    Provenance,
    SystemTool,
    Topology,
    Unavailable,
    Visibility,
)
from perfgate.envprobe.probe import ProbeOutput
from perfgate.envprobe.provenance import GitSnapshot
from perfgate.envprobe.topology import fingerprint_facts, topology_notes
from perfgate.envprobe.visibility import visibility
from perfgate.security.envredactor import HOSTNAME, Redactor

__all__ = [
    "SCHEMA_VERSION",
    "Assembled",
    "assemble",
    "format_cudnn_version",
    "learn_host",
    "sanitize_probe_log",
]

SCHEMA_VERSION = 1
_BACKEND_TOOLS = {"cuda": ("nvidia-smi", "nvml"), "musa": ("mthreads-gmi",), "rocm": ("rocm-smi",)}
_BACKENDS = ("cuda", "musa", "rocm", "xpu", "cpu")


@dataclass(frozen=True)
class Assembled:
    """A sanitised environment record."""

    summary: EnvironmentSummary
    visibility: Visibility
    switches: dict[str, str]
    system_tools: list[SystemTool]
    provenance: Provenance
    topology: Topology
    fingerprint: Fingerprint
    unavailable: list[Unavailable]
    warnings: list[str]
    document: dict[str, Any]


def format_cudnn_version(value: Any) -> str | None:
    """torch.backends.cudnn.version() as text: 90100 -> '9.1.0' (cuDNN 9+), 8902 -> '8.9.2' (cuDNN 8)."""
    if value is None:
        return None
    if not isinstance(value, int):
        return str(value)
    if value >= 10000:
        return f"{value // 10000}.{value % 10000 // 100}.{value % 100}"
    return f"{value // 1000}.{value % 1000 // 100}.{value % 100}"


def _dict(value: Any) -> dict[str, Any]:
    return cast("dict[str, Any]", value) if isinstance(value, dict) else {}


def _version_tuple(text: str | None) -> tuple[int, ...] | None:
    if not text:
        return None
    match = re.match(r"(\d+)\.(\d+)", text)
    return (int(match.group(1)), int(match.group(2))) if match else None


def _devices(accel: Mapping[str, Any]) -> list[Device]:
    out: list[Device] = []
    raw_devices: Any = accel.get("devices")
    for raw in cast("list[Any]", raw_devices) if isinstance(raw_devices, list) else []:
        item = _dict(raw)
        if "index" not in item:
            continue
        out.append(
            Device(
                index=int(item["index"]),
                name=item.get("name"),
                total_memory_bytes=item.get("total_memory_bytes"),
                capability=item.get("capability"),
                multi_processor_count=item.get("multi_processor_count"),
            )
        )
    return out


def _libraries(backend: str | None, libs: Mapping[str, Any]) -> dict[str, str | None]:
    if backend == "cuda":
        return {"cudnn": format_cudnn_version(libs.get("cudnn_version")), "nccl": libs.get("nccl_version")}
    if backend == "rocm":
        version = libs.get("cudnn_version")
        return {"miopen": None if version is None else str(version), "rccl": libs.get("nccl_version")}
    if backend == "musa":
        return {"mudnn": libs.get("mudnn_version"), "mccl": libs.get("mccl_version")}
    return {}


def _sdk_mismatch(runtime: object, sdk: str | None) -> str | None:
    """A warning when the MUSA runtime torch_musa was built with and the installed SDK differ in major or
    minor version (compared on their leading numbers: ``rc3.1.0`` reads as 3.1)."""
    if not isinstance(runtime, str) or sdk is None:
        return None
    built, installed = re.search(r"\d+(?:\.\d+)?", runtime), re.search(r"\d+(?:\.\d+)?", sdk)
    if built is None or installed is None or built.group(0) == installed.group(0):
        return None
    return (
        f"torch_musa was built against MUSA {runtime} but the installed MUSA SDK (version.json) is {sdk}: "
        "kernels or libraries may fail to load; install the torch_musa build for this SDK or point MUSA_HOME "
        "at the matching SDK"
    )


def _driver(
    backend: str | None, tools: Sequence[SystemTool]
) -> tuple[str | None, str | None, int | None, str | None]:
    """(driver version, its source, host device count, the tool counted) for the process's backend.

    For a CPU process, the host's accelerators (any device tool) are counted so a GPU host running a
    CPU-only torch is flagged; its driver is not attributed to the process.
    """
    by_name = {t.name: t for t in tools if t.found}
    names = _BACKEND_TOOLS.get(backend or "", ())
    if backend == "cpu":
        names = ("nvidia-smi", "nvml", "mthreads-gmi", "rocm-smi")
    for name in names:
        tool = by_name.get(name)
        if tool is None or tool.devices is None:
            continue
        driver = tool.driver_version if backend != "cpu" else None
        return driver, (name if driver else None), len(tool.devices), name
    return None, None, None, None


def _topology(host: Topology | None, deep_ep: Mapping[str, Any], unavailable: list[Unavailable]) -> Topology:
    """The host's interconnect facts with the probe's HybridEP finding and the notes they imply."""
    if host is None:
        host = Topology(
            gpu_links=None,
            nvlink_active_links=None,
            nvlink_inactive_links=None,
            rdma_ports=None,
            peer_memory_module=None,
            hybrid_ep=None,
            notes=[],
        )
        unavailable.append(Unavailable(item="topology", reason="the host queries did not run"))
    hybrid = deep_ep.get("hybrid_ep")
    topo = host.model_copy(update={"hybrid_ep": hybrid if isinstance(hybrid, bool) else None})
    return topo.model_copy(update={"notes": topology_notes(topo, deep_ep.get("installed") is True)})


def _os_text(os_info: Mapping[str, Any]) -> str | None:
    if not os_info:
        return None
    parts = [os_info.get("system"), os_info.get("release"), os_info.get("machine")]
    text = " ".join(str(p) for p in parts if p)
    distribution = os_info.get("distribution")
    return f"{text} ({distribution})" if distribution else text or None


def _git_provenance(
    git: GitSnapshot | None, diff_artifact: str | None, diff_redacted: bool
) -> GitProvenance | None:
    if git is None:
        return None
    return GitProvenance(
        commit=git.commit,
        branch=git.branch,
        dirty=git.dirty,
        changed_files=git.changed_files,
        untracked_files=git.untracked_files,
        diff_sha256=git.diff_sha256 if git.commit else None,
        diff_bytes=len(git.diff),
        diff_artifact=diff_artifact,
        diff_artifact_redacted=diff_redacted,
    )


def learn_host(redactor: Redactor, probe: ProbeOutput) -> None:
    """Teach ``redactor`` the host name and home directory the probe saw (they may differ from the server's)."""
    host = _dict(probe.sections.get("host"))
    name = host.get("hostname")
    if isinstance(name, str):
        redactor.add_hostname(name)
        redactor.add_hostname(name.split(".")[0])
    home = host.get("home")
    if isinstance(home, str):
        redactor.add_home(home)


def sanitize_probe_log(text: str, redactor: Redactor) -> str:
    """The probe's stdout with every record redacted and its host section replaced by placeholders."""
    lines: list[str] = []
    for line in text.splitlines():
        try:
            record: Any = json.loads(line)
        except ValueError:
            lines.append(redactor.text(line))
            continue
        fields = _dict(record)
        if fields.get("section") == "host":
            record = {**fields, "data": _safe_host(_dict(fields.get("data")), redactor)}
        lines.append(json.dumps(redactor.tree(record), sort_keys=True))
    return "\n".join(lines) + ("\n" if lines else "")


def _safe_host(host: Mapping[str, Any], redactor: Redactor) -> dict[str, Any]:
    hostname = host.get("hostname")
    return {
        "hostname": HOSTNAME if hostname else None,
        "hostname_sha256_12": hashlib.sha256(str(hostname).encode()).hexdigest()[:12] if hostname else None,
        "user": "<user>" if host.get("user") else None,
        "home": "~" if host.get("home") else None,
        "cwd": redactor.text(str(host["cwd"])) if host.get("cwd") else None,
    }


def assemble(
    probe: ProbeOutput,
    *,
    redactor: Redactor,
    system_tools: Sequence[SystemTool],
    tool_missing: Sequence[tuple[str, str]],
    git: GitSnapshot | None,
    git_reason: str | None,
    diff_artifact: str | None,
    diff_redacted: bool,
    container: ContainerProvenance,
    container_missing: Sequence[str],
    launch_command: Sequence[str] | None,
    run_info: Mapping[str, Any],
    extra_warnings: Sequence[str] = (),
    topology: Topology | None = None,
) -> Assembled:
    """Merge, cross-check, fingerprint and sanitise. ``run_info`` describes the probe run (argv, exit, ...)."""
    s = probe.sections
    python = _dict(s.get("python"))
    os_info = _dict(s.get("os"))
    cpu = _dict(s.get("cpu"))
    memory = _dict(s.get("memory"))
    host = _dict(s.get("host"))
    torch = _dict(s.get("torch"))
    accel = _dict(s.get("accelerator"))
    packages: dict[str, Any] = _dict(s.get("packages"))
    env_vis: dict[str, str | None] = {str(k): v for k, v in _dict(s.get("visibility_env")).items()}
    switches = {str(k): str(v) for k, v in _dict(s.get("switches")).items()}

    learn_host(redactor, probe)

    unavailable = list(probe.unavailable)
    unavailable += [Unavailable(item=i, reason=r) for i, r in tool_missing]
    warnings: list[str] = list(extra_warnings)

    raw_backend = accel.get("backend")
    backend = raw_backend if raw_backend in _BACKENDS else None
    devices = _devices(accel)
    process_count = int(accel.get("device_count") or 0)
    driver, driver_source, system_count, counted_tool = _driver(backend, system_tools)
    if backend not in (None, "cpu", "xpu") and driver is None:
        wanted = " or ".join(_BACKEND_TOOLS.get(backend, ()))
        unavailable.append(
            Unavailable(
                item="driver_version", reason=f"no working {wanted} reported a driver for backend {backend}"
            )
        )
    vis = visibility(backend or "cpu", process_count, env_vis, system_count, counted_tool)
    warnings += vis.notes
    libraries = _libraries(backend, _dict(accel.get("libraries")))
    sdk = _dict(s.get("musa_sdk"))
    sdk_version = sdk.get("toolkit_version") if isinstance(sdk.get("toolkit_version"), str) else None
    if backend == "musa":
        for name, version in sorted(_dict(sdk.get("libraries")).items()):
            if name in ("mublas", "musart") and isinstance(version, str):
                libraries[name] = version
    mismatch = _sdk_mismatch(accel.get("runtime_version"), sdk_version)
    if mismatch is not None:
        warnings.append(mismatch)
    precision = _dict(accel.get("precision"))
    tf32: dict[str, bool | str | None] = {
        k: precision[k] for k in sorted(precision) if k.startswith("tf32") or k == "float32_matmul_precision"
    }
    attention_raw = accel.get("attention")
    attention = (
        {str(k): v for k, v in _dict(attention_raw).items()} if isinstance(attention_raw, dict) else None
    )
    installed = {k: str(v) for k, v in sorted(packages.items()) if v is not None}

    torch_version = torch.get("version")
    if torch_version and packages.get("torch") and packages["torch"] != torch_version:
        warnings.append(
            f"the imported torch is {torch_version} but the installed distribution is {packages['torch']}: "
            "another torch shadows it on sys.path (PYTHONPATH?)"
        )
    if backend == "cuda":
        built, supported = _version_tuple(accel.get("runtime_version")), None
        nvidia = next(
            (t for t in system_tools if t.name in ("nvidia-smi", "nvml") and t.runtime_version), None
        )
        if nvidia is not None:
            supported = _version_tuple(nvidia.runtime_version)
        if built and supported and built > supported:
            warnings.append(
                f"torch was built for CUDA {accel.get('runtime_version')} but the driver supports CUDA up to "
                f"{nvidia.runtime_version if nvidia else '?'}: kernels may fail to load or fall back"
            )
    topo = _topology(topology, _dict(s.get("deep_ep")), unavailable)

    if not probe.complete:
        where = probe.last_stage or "start-up"
        warnings.append(f"the probe did not finish (last stage: {where}); facts after that stage are missing")
        unavailable.append(Unavailable(item="probe", reason=f"the probe stopped during: {where}"))

    if git is None:
        unavailable.append(Unavailable(item="git", reason=git_reason or "unknown"))
    else:
        unavailable += [Unavailable(item="git", reason=n) for n in git.notes]
    unavailable += [Unavailable(item="container", reason=r) for r in container_missing]
    if launch_command is None:
        unavailable.append(
            Unavailable(
                item="launch_command",
                reason="not given: pass launch_command (the training command as an argv list) to record it",
            )
        )

    summary = EnvironmentSummary(
        python_version=python.get("version"),
        python_executable=python.get("executable"),
        in_virtualenv=python.get("in_virtualenv"),
        os=_os_text(os_info),
        cpu_model=cpu.get("model"),
        cpu_count=cpu.get("affinity_count") or cpu.get("logical_count"),
        memory_total_bytes=memory.get("total_bytes"),
        backend=backend,
        backend_reason=accel.get("backend_reason"),
        devices=devices,
        torch_version=torch_version,
        runtime_version=accel.get("runtime_version"),
        sdk_version=sdk_version,
        driver_version=driver,
        driver_source=driver_source,
        libraries=libraries,
        bf16_supported=precision.get("bf16_supported"),
        tf32=tf32,
        attention=attention,
        packages=installed,
    )
    provenance = Provenance(
        git=_git_provenance(git, diff_artifact, diff_redacted),
        container=container,
        launch_command=redactor.argv(launch_command) if launch_command is not None else None,
    )

    # Sanitise: every string below passes through the redactor exactly once.
    summary = EnvironmentSummary.model_validate(redactor.tree(summary.model_dump(mode="json")))
    vis = Visibility.model_validate(redactor.tree(vis.model_dump(mode="json")))
    safe_switches = redactor.env(switches)
    safe_tools = [SystemTool.model_validate(redactor.tree(t.model_dump(mode="json"))) for t in system_tools]
    provenance = Provenance.model_validate(redactor.tree(provenance.model_dump(mode="json")))
    topo = Topology.model_validate(redactor.tree(topo.model_dump(mode="json")))
    unavailable = [Unavailable.model_validate(redactor.tree(u.model_dump())) for u in unavailable]
    warnings = [redactor.text(w) for w in warnings]

    fingerprint = make_fingerprint(
        backend=summary.backend,
        devices=summary.devices,
        python_version=summary.python_version,
        torch_version=summary.torch_version,
        runtime_version=summary.runtime_version,
        driver_version=summary.driver_version,
        libraries=summary.libraries,
        packages=packages,
        cpu_model=summary.cpu_model,
        cpu_count=summary.cpu_count,
        machine=os_info.get("machine"),
        interconnect=fingerprint_facts(topo),
    )

    safe_host = _safe_host(host, redactor)
    document: dict[str, Any] = {
        "schema": SCHEMA_VERSION,
        "summary": summary.model_dump(mode="json"),
        "fingerprint": fingerprint.model_dump(mode="json"),
        "visibility": vis.model_dump(mode="json"),
        "switches": safe_switches,
        "system_tools": [t.model_dump(mode="json") for t in safe_tools],
        "provenance": provenance.model_dump(mode="json"),
        "topology": topo.model_dump(mode="json"),
        "unavailable": [u.model_dump() for u in unavailable],
        "warnings": warnings,
        "probe": redactor.tree(dict(run_info)),
        "observed": redactor.tree(
            {
                "python": python,
                "os": os_info,
                "cpu": cpu,
                "memory": memory,
                "host": safe_host,
                "packages": packages,
                "torch": torch,
                "torch_musa": s.get("torch_musa"),
                "accelerator": accel,
                "deep_ep": s.get("deep_ep"),
                "visibility_env": env_vis,
            }
        ),
    }
    return Assembled(
        summary=summary,
        visibility=vis,
        switches=safe_switches,
        system_tools=safe_tools,
        provenance=provenance,
        topology=topo,
        fingerprint=fingerprint,
        unavailable=unavailable,
        warnings=warnings,
        document=document,
    )
