"""perfgate environment probe: what the training interpreter sees, from inside its own process.

This file runs as a plain script under the *training* interpreter, which may lack perfgate, pydantic or
torch, and may be as old as Python 3.7: it uses the standard library only, imports torch and vendor
extensions inside guarded sections, and its annotations are never evaluated.

Output: JSON Lines on the original stdout, one object per section as soon as it is known::

    {"section": "python", "data": {...}, "unavailable": [{"item": "...", "reason": "..."}]}

A ``{"section": "_stage", "data": "import torch"}`` line precedes each step that can hang (driver or
import problems), so a reader of a probe killed at its timeout knows where it stopped; the last line
is ``{"section": "_end", ...}``. Anything the imported libraries print (also from C code) is diverted
to stderr so it cannot corrupt the JSON stream.

Nothing here reports the value of an environment variable outside the performance-switch prefixes;
the server redacts secrets again before anything is stored.
"""

from __future__ import annotations

import json
import os
import platform
import re
import sys
import time
import warnings
from collections.abc import Callable
from typing import Any, cast

SCHEMA = 1

# Distribution names whose versions matter for training performance (read from metadata, never imported).
PACKAGES = (
    "torch",
    "torch_musa",
    "torchvision",
    "torchaudio",
    "numpy",
    "triton",
    "pytorch-triton-rocm",
    "flash-attn",
    "flash_attn_3",
    "xformers",
    "transformer-engine",
    "transformer-engine-torch",
    "megatron-core",
    "deepspeed",
    "apex",
    "accelerate",
    "transformers",
    "datasets",
    "peft",
    "torchao",
    "torchtitan",
    "liger-kernel",
    "bitsandbytes",
    "safetensors",
    "nvidia-cudnn-cu12",
    "nvidia-nccl-cu12",
    "nvidia-cublas-cu12",
    "nvidia-cuda-runtime-cu12",
    "nvidia-cudnn-cu13",
    "nvidia-nccl-cu13",
    "mpi4py",
    # MoE token exchange: DeepEP (whose hybrid-ep build also holds HybridEP) and the NVSHMEM it runs on
    "deep_ep",
    "nvidia-nvshmem-cu12",
    "nvidia-nvshmem-cu13",
)

# Variables that change performance or device visibility; their values are reported (then redacted
# server-side where they look secret). Every other variable is never read.
SWITCH_PREFIXES = (
    "NCCL_",
    "MCCL_",
    "RCCL_",
    "TORCH_",
    "PYTORCH_",
    "TORCHINDUCTOR_",
    "TORCHDYNAMO_",
    "TORCHELASTIC_",
    "CUDA_",
    "CUBLAS_",
    "CUBLASLT_",
    "CUDNN_",
    "NVTE_",
    "NVSHMEM_",
    "NVIDIA_",
    "MUSA_",
    "MUDNN_",
    "MTHREADS_",
    "HIP_",
    "HSA_",
    "ROCR_",
    "MIOPEN_",
    "OMP_",
    "KMP_",
    "GOMP_",
    "MKL_",
    "OPENBLAS_",
    "ONEDNN_",
    "DNNL_",
    "TRITON_",
    "XLA_",
    "UCX_",
    "FI_",
)
SWITCH_NAMES = (
    "LD_PRELOAD",
    "MALLOC_CONF",
    "TOKENIZERS_PARALLELISM",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "NPROC_PER_NODE",
)
VISIBILITY_VARS = (
    "CUDA_VISIBLE_DEVICES",
    "MUSA_VISIBLE_DEVICES",
    "HIP_VISIBLE_DEVICES",
    "ROCR_VISIBLE_DEVICES",
    "MTHREADS_VISIBLE_DEVICES",
    "NVIDIA_VISIBLE_DEVICES",
    "ZE_AFFINITY_MASK",
)
CONTAINER_IMAGE_VARS = (
    "CONTAINER_IMAGE",
    "CONTAINER_IMAGE_DIGEST",
    "IMAGE_DIGEST",
    "DOCKER_IMAGE",
    "IMAGE_NAME",
    "IMAGE_TAG",
    "SINGULARITY_NAME",
    "APPTAINER_NAME",
    "ENROOT_IMAGE",
    "NVIDIA_PYTORCH_VERSION",
    "PYTORCH_BUILD_VERSION",
)

# The descriptor of the real stdout once `divert_stdout` has run (a dict: module state without `global`).
_out: dict[str, int] = {"fd": 1}


def emit(section: str, data: Any, unavailable: list[dict[str, str]] | None = None) -> None:
    """Write one JSON line to the saved stdout descriptor (see `divert_stdout`)."""
    record: dict[str, Any] = {"section": section, "data": data}
    if unavailable:
        record["unavailable"] = unavailable
    line = json.dumps(record, sort_keys=True, default=str) + "\n"
    payload = line.encode("utf-8", errors="replace")
    while payload:
        written = os.write(_out["fd"], payload)
        payload = payload[written:]


def divert_stdout() -> None:
    """Keep the real stdout for JSON only; send everything else written to fd 1 to stderr."""
    sys.stdout.flush()
    _out["fd"] = os.dup(1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr


def describe_error(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    first = text[0] if text else ""
    return (type(exc).__name__ + (": " + first[:300] if first else "")).strip()


def guarded(
    section: str, fn: Callable[[list[dict[str, str]]], Any], unavailable: list[dict[str, str]] | None = None
) -> Any:
    """Run one section; a failure becomes an ``unavailable`` entry, never a crash of the probe."""
    missing: list[dict[str, str]] = [] if unavailable is None else unavailable
    try:
        data = fn(missing)
    # Third-party imports and driver calls can raise anything (RuntimeError from a driver, SystemExit
    # from a badly behaved package); the probe's contract is to report, not to die.
    except BaseException as exc:
        if isinstance(exc, KeyboardInterrupt):
            raise
        missing.append({"item": section, "reason": describe_error(exc)})
        data = None
    emit(section, data, missing)
    return data


def read_text(path: str, limit: int = 65536) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return handle.read(limit)
    except OSError:
        return None


# ---------------------------------------------------------------- stdlib sections


def python_info(missing: list[dict[str, str]]) -> dict[str, Any]:
    prefix = sys.prefix
    base = getattr(sys, "base_prefix", prefix)
    gil = getattr(sys, "_is_gil_enabled", None)
    return {
        "version": platform.python_version(),
        "version_full": sys.version,
        "implementation": platform.python_implementation(),
        "executable": sys.executable,
        "prefix": prefix,
        "base_prefix": base,
        "in_virtualenv": prefix != base,
        "conda": os.path.isdir(os.path.join(prefix, "conda-meta")),
        "gil_enabled": gil() if callable(gil) else True,
        "pointer_bits": 64 if sys.maxsize > 2**32 else 32,
    }


def os_info(missing: list[dict[str, str]]) -> dict[str, Any]:
    release = read_text("/etc/os-release") or ""
    pretty = None
    for line in release.splitlines():
        if line.startswith("PRETTY_NAME="):
            pretty = line.split("=", 1)[1].strip().strip('"')
    if pretty is None:
        missing.append({"item": "os.distribution", "reason": "/etc/os-release has no PRETTY_NAME"})
    libc = platform.libc_ver()
    return {
        "system": platform.system(),
        "release": platform.release(),
        "machine": platform.machine(),
        "distribution": pretty,
        "libc": (libc[0] + " " + libc[1]).strip() or None,
    }


def cpu_info(missing: list[dict[str, str]]) -> dict[str, Any]:
    model = None
    text = read_text("/proc/cpuinfo", 1 << 20)
    if text:
        for key in ("model name", "Model", "Hardware", "cpu model"):
            match = re.search(r"^" + key + r"\s*:\s*(.+)$", text, re.MULTILINE)
            if match:
                model = match.group(1).strip()
                break
    if model is None:
        model = platform.processor() or None
    if model is None:
        missing.append(
            {"item": "cpu.model", "reason": "neither /proc/cpuinfo nor platform.processor() names it"}
        )
    affinity = None
    if hasattr(os, "sched_getaffinity"):
        affinity = len(os.sched_getaffinity(0))
    else:
        missing.append({"item": "cpu.affinity_count", "reason": "os.sched_getaffinity is not available here"})
    quota = None
    cpu_max = read_text("/sys/fs/cgroup/cpu.max")
    if cpu_max:
        parts = cpu_max.split()
        if len(parts) == 2 and parts[0] != "max":
            quota = round(int(parts[0]) / int(parts[1]), 3)
    return {
        "model": model,
        "logical_count": os.cpu_count(),
        "affinity_count": affinity,
        "cgroup_cpu_limit": quota,
    }


def memory_info(missing: list[dict[str, str]]) -> dict[str, Any]:
    total = available = None
    text = read_text("/proc/meminfo")
    if text:
        for line in text.splitlines():
            name, _, rest = line.partition(":")
            fields = rest.split()
            if not fields:
                continue
            if name == "MemTotal":
                total = int(fields[0]) * 1024
            elif name == "MemAvailable":
                available = int(fields[0]) * 1024
    elif hasattr(os, "sysconf"):
        try:
            total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        except (ValueError, OSError):
            total = None
    if total is None:
        missing.append({"item": "memory.total_bytes", "reason": "no /proc/meminfo and no sysconf page count"})
    limit = None
    mem_max = read_text("/sys/fs/cgroup/memory.max")
    if mem_max and mem_max.strip().isdigit():
        limit = int(mem_max.strip())
    return {"total_bytes": total, "available_bytes": available, "cgroup_limit_bytes": limit}


def host_info(missing: list[dict[str, str]]) -> dict[str, Any]:
    import socket

    user = None
    try:
        import getpass

        user = getpass.getuser()
    except (KeyError, OSError, ImportError):
        missing.append({"item": "host.user", "reason": "no user name for this uid"})
    return {
        "hostname": socket.gethostname(),
        "home": os.path.expanduser("~"),
        "user": user,
        "cwd": os.getcwd(),
    }


def container_info(missing: list[dict[str, str]]) -> dict[str, Any]:
    mount_ids: list[str] = []
    mountinfo = read_text("/proc/self/mountinfo", 1 << 20) or ""
    for match in re.finditer(r"/(?:docker/)?containers/([0-9a-f]{64})/", mountinfo):
        if match.group(1) not in mount_ids:
            mount_ids.append(match.group(1))
    return {
        "dockerenv": os.path.exists("/.dockerenv"),
        "containerenv": read_text("/run/.containerenv", 8192),
        "cgroup": read_text("/proc/self/cgroup", 8192),
        "mountinfo_container_ids": mount_ids[:4],
        "image_env": {k: os.environ[k] for k in CONTAINER_IMAGE_VARS if k in os.environ},
        "singularity": "SINGULARITY_CONTAINER" in os.environ or "APPTAINER_CONTAINER" in os.environ,
    }


def switches(missing: list[dict[str, str]]) -> dict[str, str]:
    found: dict[str, str] = {}
    for name, value in os.environ.items():
        if (
            name in SWITCH_NAMES
            or name.startswith(SWITCH_PREFIXES)
            or re.match(r"PYTORCH_\w*ALLOC_CONF$", name)
        ):
            found[name] = value
    return dict(sorted(found.items()))


def visibility_env(missing: list[dict[str, str]]) -> dict[str, str | None]:
    return {name: os.environ.get(name) for name in VISIBILITY_VARS}


def packages(missing: list[dict[str, str]]) -> dict[str, str | None]:
    try:
        from importlib import metadata
    except ImportError:
        missing.append({"item": "packages", "reason": "importlib.metadata needs Python 3.8 or newer"})
        return {}
    found: dict[str, str | None] = {}
    for name in PACKAGES:
        version = None
        for candidate in (name, name.replace("-", "_"), name.replace("_", "-")):
            try:
                version = metadata.version(candidate)
                break
            except metadata.PackageNotFoundError:
                continue
        found[name] = version
    return found


_HYBRID_EP_FILE = re.compile(r"(?:^|/)(?:hybrid_ep_buffer\.py|hybrid_ep_cpp[^/]*\.(?:so|pyd))$")


def deep_ep_build(missing: list[dict[str, str]]) -> dict[str, Any]:
    """Whether the installed deep_ep ships HybridEP (its hybrid-ep build adds ``deep_ep/hybrid_ep_buffer.py``
    and the ``hybrid_ep_cpp`` extension), read from the distribution's file list: nothing is imported."""
    try:
        from importlib import metadata
    except ImportError:
        missing.append({"item": "deep_ep", "reason": "importlib.metadata needs Python 3.8 or newer"})
        return {"installed": None, "hybrid_ep": None}
    dist = None
    for name in ("deep_ep", "deep-ep"):
        try:
            dist = metadata.distribution(name)
            break
        except metadata.PackageNotFoundError:
            continue
    if dist is None:
        return {"installed": False, "hybrid_ep": None, "hybrid_ep_files": []}
    files = dist.files
    if files is None:
        missing.append(
            {"item": "deep_ep.hybrid_ep", "reason": "the deep_ep distribution lists no files (RECORD)"}
        )
        return {"installed": True, "hybrid_ep": None, "hybrid_ep_files": []}
    found = [str(f) for f in list(files)[:100000] if _HYBRID_EP_FILE.search(str(f).replace("\\", "/"))]
    return {"installed": True, "hybrid_ep": bool(found), "hybrid_ep_files": sorted(found)[:8]}


# ---------------------------------------------------------------- torch and accelerators


def version_tuple(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, (tuple, list)):
        return ".".join(str(v) for v in cast("list[Any]", value))
    return str(value)


def call(missing: list[dict[str, str]], item: str, fn: Callable[[], Any], absent: str | None = None) -> Any:
    """One API call: None plus an ``unavailable`` entry when it is absent or raises."""
    try:
        return fn()
    except AttributeError as exc:
        missing.append({"item": item, "reason": absent or "API not present: " + describe_error(exc)})
    # Driver and vendor calls raise RuntimeError, AssertionError, OSError and worse: recorded, not fatal.
    except Exception as exc:  # noqa: BLE001 - one probe call is the boundary
        missing.append({"item": item, "reason": describe_error(exc)})
    return None


def import_torch(missing: list[dict[str, str]]) -> dict[str, Any] | None:
    import importlib

    torch: Any = importlib.import_module("torch")
    version = getattr(torch, "version", None)
    return {
        "version": getattr(torch, "__version__", None),
        "file": getattr(torch, "__file__", None),
        "git_version": getattr(version, "git_version", None),
        "debug": getattr(version, "debug", None),
        "cuda": getattr(version, "cuda", None),
        "hip": getattr(version, "hip", None),
        "musa": getattr(version, "musa", None),
        "xpu": getattr(version, "xpu", None),
        "privateuse1_backend": call(
            missing, "torch.privateuse1_backend", lambda: torch._C._get_privateuse1_backend_name()
        ),
        "cxx11_abi": getattr(torch._C, "_GLIBCXX_USE_CXX11_ABI", None),
    }


def import_torch_musa(missing: list[dict[str, str]]) -> dict[str, Any]:
    import importlib

    module: Any = importlib.import_module("torch_musa")
    torch: Any = sys.modules.get("torch")
    return {
        "version": getattr(module, "__version__", None),
        "file": getattr(module, "__file__", None),
        "torch_musa_registered": torch is not None and hasattr(torch, "musa"),
    }


def device_list(module: Any, count: int, missing: list[dict[str, str]], kind: str) -> list[dict[str, Any]]:
    devices: list[dict[str, Any]] = []
    for index in range(count):
        props = call(
            missing,
            kind + ".device[" + str(index) + "].properties",
            lambda i=index: module.get_device_properties(i),
        )
        name = getattr(props, "name", None) or call(
            missing, kind + ".device[" + str(index) + "].name", lambda i=index: module.get_device_name(i)
        )
        major = getattr(props, "major", None)
        minor = getattr(props, "minor", None)
        uuid = getattr(props, "uuid", None)
        devices.append(
            {
                "index": index,
                "name": name,
                "total_memory_bytes": getattr(props, "total_memory", None),
                "capability": None if major is None else str(major) + "." + str(minor),
                "multi_processor_count": getattr(props, "multi_processor_count", None),
                "gcn_arch_name": getattr(props, "gcnArchName", None),
                "uuid": None if uuid is None else str(uuid),
            }
        )
    return devices


def available(module: Any) -> bool:
    if module is None:
        return False
    try:
        return bool(module.is_available())
    except Exception:  # noqa: BLE001 - a broken driver means "not available", which is what we report
        return False


def accelerator(missing: list[dict[str, str]]) -> dict[str, Any]:
    torch: Any = sys.modules.get("torch")
    if torch is None:
        missing.append({"item": "accelerator", "reason": "torch is not importable in this interpreter"})
        return {"backend": "cpu", "backend_reason": "torch not importable", "device_count": 0, "devices": []}
    version = torch.version
    cuda_mod = getattr(torch, "cuda", None)
    musa_mod = getattr(torch, "musa", None)
    xpu_mod = getattr(torch, "xpu", None)
    hip = getattr(version, "hip", None)
    flags = {
        "cuda_available": available(cuda_mod),
        "musa_available": available(musa_mod),
        "xpu_available": available(xpu_mod),
        "musa_module_present": musa_mod is not None,
    }
    module: Any
    if flags["musa_available"]:
        backend, module, reason = "musa", musa_mod, "torch.musa.is_available()"
    elif flags["cuda_available"] and hip:
        backend, module, reason = (
            "rocm",
            cuda_mod,
            "torch.cuda.is_available() with torch.version.hip=" + str(hip),
        )
    elif flags["cuda_available"]:
        backend, module, reason = "cuda", cuda_mod, "torch.cuda.is_available()"
    elif flags["xpu_available"]:
        backend, module, reason = "xpu", xpu_mod, "torch.xpu.is_available()"
    else:
        backend, module, reason = "cpu", None, cpu_reason(torch, musa_mod)
    out: dict[str, Any] = {"backend": backend, "backend_reason": reason}
    out.update(flags)
    count = 0
    out["devices"] = []
    out["current_device"] = None
    if module is not None:
        count = call(missing, backend + ".device_count", lambda: module.device_count()) or 0
        out["devices"] = device_list(module, count, missing, backend)
        if count:
            out["current_device"] = call(
                missing, backend + ".current_device", lambda: module.current_device()
            )
    out["device_count"] = count
    out["runtime_version"] = {
        "cuda": getattr(version, "cuda", None),
        "rocm": hip,
        "musa": getattr(version, "musa", None),
        "xpu": getattr(version, "xpu", None),
        "cpu": None,
    }[backend]
    out["driver_api_version"] = None
    if backend in ("cuda", "rocm"):
        private = getattr(torch._C, "_cuda_getDriverVersion", None)
        if private is not None:
            out["driver_api_version"] = call(missing, "cuda.driver_api_version", private)
        elif backend == "cuda":
            # Recent torch builds dropped the private wrapper: ask the driver library itself.
            out["driver_api_version"] = call(missing, "cuda.driver_api_version", cuda_driver_api_version)
        else:
            missing.append(
                {"item": "cuda.driver_api_version", "reason": "torch._C has no _cuda_getDriverVersion"}
            )
    out["libraries"] = libraries(torch, backend, missing)
    out["precision"] = precision(torch, backend, module, out["devices"], missing)
    out["attention"] = attention(torch, backend, missing)
    out["distributed"] = distributed(torch, missing)
    return out


def cuda_driver_api_version() -> int:
    """cuDriverGetVersion from libcuda: the CUDA version the installed driver supports (what nvidia-smi
    prints as 'CUDA Version'), as 1000 * major + 10 * minor."""
    import ctypes
    import ctypes.util

    name = "nvcuda.dll" if sys.platform == "win32" else "libcuda.so.1"
    try:
        lib = ctypes.CDLL(name)
    except OSError:
        found = ctypes.util.find_library("cuda")
        if found is None:
            raise RuntimeError("the CUDA driver library (libcuda) is not loadable here") from None
        lib = ctypes.CDLL(found)
    value = ctypes.c_int(0)
    status = lib.cuDriverGetVersion(ctypes.byref(value))
    if status != 0 or value.value <= 0:
        raise RuntimeError(f"cuDriverGetVersion returned status {status}, version {value.value}")
    return value.value


def cpu_reason(torch: Any, musa_mod: Any) -> str:
    if musa_mod is not None:
        return "torch.musa is present but reports no available device"
    if getattr(torch.version, "cuda", None) is None and getattr(torch.version, "hip", None) is None:
        return "torch is a CPU build (torch.version.cuda and torch.version.hip are None)"
    return "torch has GPU support but torch.cuda.is_available() is False (no driver or no visible device)"


def libraries(torch: Any, backend: str, missing: list[dict[str, str]]) -> dict[str, Any]:
    libs: dict[str, Any] = {}
    if backend in ("cuda", "rocm"):
        cudnn = torch.backends.cudnn
        libs["cudnn_available"] = call(missing, "cudnn.available", cudnn.is_available)
        libs["cudnn_version"] = (
            call(missing, "cudnn.version", cudnn.version) if libs["cudnn_available"] else None
        )
        if libs["cudnn_available"] is False:
            missing.append(
                {"item": "cudnn.version", "reason": "torch.backends.cudnn.is_available() is False"}
            )
        libs["nccl_version"] = version_tuple(call(missing, "nccl.version", lambda: torch.cuda.nccl.version()))
    elif backend == "musa":
        mudnn: Any = getattr(torch.backends, "mudnn", None)
        libs["mudnn_version"] = version_tuple(
            call(
                missing, "mudnn.version", lambda: mudnn.version(), "torch.backends.mudnn exposes no version()"
            )
        )
        libs["mccl_version"] = version_tuple(call(missing, "mccl.version", lambda: torch.musa.mccl.version()))
    else:
        missing.append(
            {"item": "libraries", "reason": "no accelerator backend: cuDNN/muDNN and NCCL/MCCL do not apply"}
        )
    return libs


def precision(
    torch: Any, backend: str, module: Any, devices: list[dict[str, Any]], missing: list[dict[str, str]]
) -> dict[str, Any]:
    out: dict[str, Any] = {
        "float32_matmul_precision": call(
            missing, "float32_matmul_precision", torch.get_float32_matmul_precision
        )
    }
    if module is not None:
        out["bf16_supported"] = call(missing, backend + ".bf16_supported", lambda: module.is_bf16_supported())
    else:
        missing.append(
            {"item": "precision.bf16_supported", "reason": "no accelerator: the check is per device"}
        )
    if backend in ("cuda", "rocm"):
        out["tf32_matmul_allowed"] = call(
            missing, "tf32.matmul", lambda: torch.backends.cuda.matmul.allow_tf32
        )
        out["tf32_cudnn_allowed"] = call(missing, "tf32.cudnn", lambda: torch.backends.cudnn.allow_tf32)
        caps = [d["capability"] for d in devices if d.get("capability")]
        out["tf32_hardware"] = all(float(c) >= 8.0 for c in caps) if caps and backend == "cuda" else None
    elif backend == "musa":
        out["tf32_mudnn_allowed"] = call(missing, "tf32.mudnn", lambda: torch.backends.mudnn.allow_tf32)
    return out


def attention(torch: Any, backend: str, missing: list[dict[str, str]]) -> dict[str, Any] | None:
    if backend not in ("cuda", "rocm"):
        missing.append(
            {"item": "attention", "reason": "no documented SDPA backend query for backend " + backend}
        )
        return None
    cuda = torch.backends.cuda
    return {
        "flash_sdp_enabled": call(missing, "attention.flash_sdp_enabled", cuda.flash_sdp_enabled),
        "mem_efficient_sdp_enabled": call(
            missing, "attention.mem_efficient_sdp_enabled", cuda.mem_efficient_sdp_enabled
        ),
        "cudnn_sdp_enabled": call(missing, "attention.cudnn_sdp_enabled", cuda.cudnn_sdp_enabled),
        "math_sdp_enabled": call(missing, "attention.math_sdp_enabled", cuda.math_sdp_enabled),
        "flash_attention_available": call(
            missing, "attention.flash_attention_available", cuda.is_flash_attention_available
        ),
    }


def distributed(torch: Any, missing: list[dict[str, str]]) -> dict[str, Any]:
    import importlib

    dist: Any = importlib.import_module("torch.distributed")
    if not dist.is_available():
        missing.append({"item": "distributed", "reason": "torch.distributed.is_available() is False"})
        return {"available": False}
    out: dict[str, Any] = {"available": True}
    for name in ("nccl", "gloo", "mpi", "ucc", "xccl", "mccl"):
        check: Any = getattr(dist, "is_backend_available", None)
        if check is not None:
            out[name] = call(missing, "distributed." + name, lambda n=name, c=check: c(n))
        else:
            legacy = getattr(dist, "is_" + name + "_available", None)
            out[name] = bool(legacy()) if legacy is not None else None
    return out


MUSA_DEFAULT_HOME = "/usr/local/musa"
_MUSA_LIB = re.compile(r"^lib(musart|mublas|mudnn|mccl)\.so\.(\d+(?:\.\d+){0,3})$")


def musa_sdk(missing: list[dict[str, str]]) -> dict[str, Any]:
    """The installed MUSA SDK: component versions from ``$MUSA_HOME/version.json`` (``musa_toolkits`` is
    the toolkit's own) and library versions from the ``lib*.so.X.Y.Z`` names in its lib folder. The root's
    path is not reported (an environment variable's value), only where it came from."""
    home = os.environ.get("MUSA_HOME")
    root = home or MUSA_DEFAULT_HOME
    out: dict[str, Any] = {"root_source": "MUSA_HOME" if home else "default", "found": os.path.isdir(root)}
    if not out["found"]:
        reason = (
            "MUSA_HOME is not a directory"
            if home
            else f"MUSA_HOME is unset and {MUSA_DEFAULT_HOME} is absent"
        )
        missing.append({"item": "musa_sdk", "reason": reason})
        return out
    components: dict[str, str] = {}
    text = read_text(os.path.join(root, "version.json"))
    if text is None:
        missing.append({"item": "musa_sdk.version", "reason": "the SDK root has no readable version.json"})
    else:
        try:
            data = json.loads(text)
        except ValueError:
            data = None
            missing.append(
                {"item": "musa_sdk.version", "reason": "version.json is not valid JSON (or over 64 KiB)"}
            )
        if isinstance(data, dict):
            for key, value in list(cast(dict[str, Any], data).items())[:64]:
                version: Any = cast(dict[str, Any], value).get("version") if isinstance(value, dict) else None
                if isinstance(version, str):
                    components[str(key)[:64]] = version[:64]
    out["components"] = components
    out["toolkit_version"] = components.get("musa_toolkits")
    if components and out["toolkit_version"] is None:
        missing.append({"item": "musa_sdk.version", "reason": "version.json has no musa_toolkits version"})
    libs: dict[str, str] = {}
    for sub in ("lib", "lib64"):
        try:
            names = os.listdir(os.path.join(root, sub))
        except OSError:
            continue
        for name in names[:10000]:
            m = _MUSA_LIB.match(name)
            # The most specific name wins: libmublas.so.1.6.0 over the libmublas.so.1 link to it.
            if m and len(m.group(2)) > len(libs.get(m.group(1), "")):
                libs[m.group(1)] = m.group(2)
    out["libraries"] = libs
    if "mublas" not in libs:
        missing.append(
            {"item": "mublas.version", "reason": "no libmublas.so.<version> in the SDK's lib folder"}
        )
    return out


def main() -> int:
    started = time.time()
    # Our own folder is sys.path[0] when run as a script; the training process would not have it, and
    # nothing in it should shadow a module torch imports.
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    divert_stdout()
    warnings.simplefilter("ignore")
    emit("_begin", {"schema": SCHEMA, "pid": os.getpid()})
    guarded("python", python_info)
    guarded("os", os_info)
    guarded("cpu", cpu_info)
    guarded("memory", memory_info)
    guarded("host", host_info)
    guarded("container", container_info)
    guarded("switches", switches)
    guarded("visibility_env", visibility_env)
    pkgs: dict[str, Any] = guarded("packages", packages) or {}
    guarded("deep_ep", deep_ep_build)
    emit("_stage", "import torch")
    guarded("torch", import_torch)
    import importlib.util

    musa_found = pkgs.get("torch_musa") is not None
    if not musa_found and "torch" in sys.modules:
        try:
            musa_found = importlib.util.find_spec("torch_musa") is not None
        except (ImportError, ValueError):
            musa_found = False
    if musa_found and "torch" in sys.modules:
        emit("_stage", "import torch_musa")
        guarded("torch_musa", import_torch_musa)
    emit("_stage", "query accelerator")
    guarded("accelerator", accelerator)
    if musa_found or os.environ.get("MUSA_HOME") or os.path.isdir(MUSA_DEFAULT_HOME):
        guarded("musa_sdk", musa_sdk)
    emit("_end", {"elapsed_s": round(time.time() - started, 3)})
    return 0


if __name__ == "__main__":
    sys.exit(main())
