"""The training process's own environment, measured inside it at the first step boundary (after the
script's own set-up, for profiled and timed runs alike) and checked again at window edges.

Thread settings, precision switches, accelerator versions and visible devices change throughput without
touching the code: two windows compare only when these match (or the change is declared). Values are
strings (``None`` when not known). torch is read only when the job already imported it; nothing here
initialises an accelerator (device names only once the job initialised CUDA itself).
"""

from __future__ import annotations

import os
import sys
from typing import Any

__all__ = ["ENV_VARS", "measure_runtime_env"]

ENV_VARS = (
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "CUDA_VISIBLE_DEVICES",
    "HIP_VISIBLE_DEVICES",
    "ROCR_VISIBLE_DEVICES",
    "MUSA_VISIBLE_DEVICES",
)


def _s(value: object) -> str | None:
    return None if value is None else str(value)


def _get(fn: Any) -> str | None:
    try:
        return _s(fn())
    except Exception:  # noqa: BLE001 -- an unusual build answers nothing rather than failing the job
        return None


def measure_runtime_env() -> dict[str, str | None]:
    """Process environment variables and torch's switches as this process sees them now."""
    out: dict[str, str | None] = {name: os.environ.get(name) for name in ENV_VARS}
    torch: Any = sys.modules.get("torch")
    if torch is None:
        return out
    backends = torch.backends
    out.update(
        {
            "num_threads": _get(torch.get_num_threads),
            "interop_threads": _get(torch.get_num_interop_threads),
            "allow_tf32": _get(lambda: backends.cuda.matmul.allow_tf32),
            "cudnn_allow_tf32": _get(lambda: backends.cudnn.allow_tf32),
            "matmul_precision": _get(torch.get_float32_matmul_precision),
            "cudnn_benchmark": _get(lambda: backends.cudnn.benchmark),
            "deterministic_algorithms": _get(torch.are_deterministic_algorithms_enabled),
            "torch_cuda_version": _get(lambda: torch.version.cuda),
            "torch_hip_version": _get(lambda: getattr(torch.version, "hip", None)),
            "device_count": _get(torch.cuda.device_count),
            "device_names": _get(
                lambda: (
                    ",".join(torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count()))
                    if torch.cuda.is_initialized()
                    else None
                )
            ),
        }
    )
    return out
