"""Name-based classification of device work and host calls, for every vendor's naming.

Device activity gets a category (finer than HTA's three classes) and a temporal kind:

- ``communication``: collectives and point-to-point kernels of NCCL, RCCL, MCCL, HCCL and friends;
- ``memory``: copies (by direction) and memsets, including MTIA DMA requests;
- ``sync``: stream-level waits recorded on the device timeline (``cuda_sync``);
- ``compute``: everything else (GEMM, convolution, attention, elementwise, reduction, other).

The temporal kinds reproduce HTA 0.5's classes on CUDA/ROCm/MTIA names: communication is a name
starting with ``nccl`` and containing ``Kernel``, memory starts with ``Memcpy``, ``Memset`` or ``dma``.
Beyond HTA, the other collective libraries count as communication and copies are recognized by their
event category too (MUSA ``Memcpy1/2/3`` names, AMD copies).
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Literal, get_args

__all__ = [
    "CATEGORIES",
    "IMPLICIT_SYNC_OPS",
    "KINDS",
    "Category",
    "Kind",
    "category_kind",
    "classify_device",
    "host_call_role",
    "is_implicit_sync_op",
    "memcpy_direction_from_name",
]

Category = Literal[
    "gemm",
    "convolution",
    "attention",
    "communication",
    "memcpy_h2d",
    "memcpy_d2h",
    "memcpy_d2d",
    "memcpy_other",
    "memset",
    "elementwise",
    "reduction",
    "sync",
    "other",
]
CATEGORIES: tuple[Category, ...] = get_args(Category)
Kind = Literal["compute", "communication", "memory", "sync"]
KINDS: tuple[Kind, ...] = ("compute", "communication", "memory", "sync")

# Matching runs on the lower-cased name: plain substrings (fast on 300-character template names),
# plus a few token patterns where a bare substring would be ambiguous (``mm``, ``sum``, ``eq``).
_COMM_PREFIX = ("nccl", "rccl", "mccl", "hccl", "oneccl", "xccl")
_COMM_WORDS = ("allreduce", "all_reduce", "allgather", "all_gather", "reducescatter", "reduce_scatter",
               "alltoall", "all_to_all", "sendrecv", "send_recv", "cross_device_reduce")  # fmt: skip
_COMM_KERNEL = re.compile(r"(nccl|rccl|mccl|hccl)\w*kernel")
_ATTENTION_WORDS = ("flash", "fmha", "attention", "attn", "sdpa", "xformers", "cutlassf_", "cutlassb_",
                    "_scaled_dot_product", "mha_fwd", "mha_bwd")  # fmt: skip
_CONV_WORDS = ("conv", "winograd", "dgrad", "wgrad", "fprop", "implicit_gemm", "implicitgemm", "scudnn",
               "cask_cudnn")  # fmt: skip
_GEMM_WORDS = ("gemm", "gemv", "matmul", "cublas", "cutlass", "xmma", "cijk_", "tensile", "rocblas",
               "hipblas", "mublas", "splitkreduce", "triton_tem_")  # fmt: skip
_GEMM_TOKENS = frozenset({"mm", "bmm", "addmm", "baddbmm", "fc", "linear"})
_REDUCTION_WORDS = ("reduce", "reduction", "norm", "softmax", "triton_red_", "triton_per_", "cross_entropy",
                    "nll_loss", "logsumexp", "scan", "topk", "sort", "moments", "gammabeta", "welford")  # fmt: skip
_REDUCTION_TOKENS = frozenset(
    {"bn", "sum", "mean", "max", "min", "prod", "var", "std", "argmax", "argmin", "cumsum"}
)
_ELEMENTWISE_WORDS = (
    "elementwise", "vectorized", "unrolled", "pointwise", "triton_poi_", "fill", "copy", "cat", "index",
    "gather", "scatter", "where", "add", "mul", "div", "sub", "relu", "gelu", "silu", "sigmoid", "tanh", "exp",
    "log", "sqrt", "pow", "clamp", "clip", "dropout", "embedding", "multi_tensor", "foreach", "adam", "sgd",
    "transpose", "permute", "cast", "neg", "reciprocal", "threshold", "bucketize", "abs", "nchwtonhwc",
    "nhwctonchw", "im2col", "col2im", "pad", "upsample", "interpolate", "pool", "scale", "nan_to_num",
)  # fmt: skip
_ELEMENTWISE_TOKENS = frozenset({"eq", "ne", "gt", "ge", "lt", "le"})
_TOKEN_SPLIT = re.compile(r"[^a-z0-9]+")
_NAME_PREFIX = 512
"""Characters of a name that are classified: the kernel and its template arguments, not the long tail
of parameter types that only repeats them."""


def _has(low: str, words: tuple[str, ...]) -> bool:
    return any(map(low.__contains__, words))


_MEMCPY_NAME = re.compile(r"^(hip|musa|cuda)?memcpy|^dma", re.IGNORECASE)
_MEMSET_NAME = re.compile(r"^(hip|musa|cuda)?memset", re.IGNORECASE)
_SYNC_NAME = re.compile(r"^(Stream Sync|Event Sync|Context Sync|Device Sync|Stream Wait Event)")
_DIR_TOKEN = re.compile(r"\b(HtoD|DtoH|DtoD|PtoP|HtoH|H2D|D2H|D2D|P2P|H2H)\b", re.IGNORECASE)
_DIR_ARROW = re.compile(r"\((\w+)\s*->\s*(\w+)\)")
_HOST_SIDE = frozenset({"host", "pinned", "pageable", "managed", "cpu"})

_TOKEN_DIRECTION: dict[str, Category] = {"H2D": "memcpy_h2d", "D2H": "memcpy_d2h", "D2D": "memcpy_d2d"}
_SIDES_DIRECTION: dict[str, Category] = {"hd": "memcpy_h2d", "dh": "memcpy_d2h", "dd": "memcpy_d2d"}
_COPY_CATS = frozenset({"gpu_memcpy", "Memcpy"})
_SET_CATS = frozenset({"gpu_memset", "Memset"})

_KIND: dict[Category, Kind] = {
    "communication": "communication",
    "memcpy_h2d": "memory",
    "memcpy_d2h": "memory",
    "memcpy_d2d": "memory",
    "memcpy_other": "memory",
    "memset": "memory",
    "sync": "sync",
}


def category_kind(category: Category) -> Kind:
    """The temporal-breakdown kind of a category."""
    return _KIND.get(category, "compute")


def memcpy_direction_from_name(name: str) -> Category | None:
    """Copy direction spelled in a copy's name (``Memcpy HtoD (Pinned -> Device)``), if any."""
    token = _DIR_TOKEN.search(name)
    if token:
        t = token.group(1).upper().replace("TO", "2")
        return _TOKEN_DIRECTION.get(t, "memcpy_other")
    arrow = _DIR_ARROW.search(name)
    if arrow:
        src = "h" if arrow.group(1).lower() in _HOST_SIDE else "d"
        dst = "h" if arrow.group(2).lower() in _HOST_SIDE else "d"
        return _SIDES_DIRECTION.get(src + dst, "memcpy_other")
    return None


@lru_cache(maxsize=1 << 15)
def classify_device(name: str, cat: str) -> tuple[Category, bool]:
    """Category of a device event, and whether it is a copy whose direction its name does not give.

    The caller resolves such copies from the event's args (``kind``/``direction``).
    """
    if cat in _COPY_CATS or _MEMCPY_NAME.search(name):
        direction = memcpy_direction_from_name(name)
        return (direction, False) if direction else ("memcpy_other", True)
    if cat in _SET_CATS or _MEMSET_NAME.search(name):
        return "memset", False
    if cat == "cuda_sync" or _SYNC_NAME.search(name):
        return "sync", False
    # The kernel's own name (before template arguments and parameters) decides first; the
    # arguments are looked at only when it says nothing (``cutlass::Kernel<...s1688gemm...>``).
    low = name[:_NAME_PREFIX].lower().replace("(anonymous namespace)", "")
    cut = min((i for i in (low.find("<"), low.find("(")) if i > 0), default=len(low))
    return _by_words(low[:cut]) or _by_words(low) or "other", False


def _by_words(low: str) -> Category | None:
    """Compute-side category from words in a lower-cased name, by priority; None when none match."""
    if low.startswith(_COMM_PREFIX) or _has(low, _COMM_WORDS) or ("ccl" in low and _COMM_KERNEL.search(low)):
        return "communication"
    if _has(low, _ATTENTION_WORDS):
        return "attention"
    if _has(low, _CONV_WORDS) or ("miopen" in low and ("fwd" in low or "bwd" in low)):
        return "convolution"
    tokens = frozenset(_TOKEN_SPLIT.split(low))
    if _has(low, _GEMM_WORDS) or tokens & _GEMM_TOKENS or (low.startswith("triton_") and "_mm" in low):
        return "gemm"
    if _has(low, _REDUCTION_WORDS) or tokens & _REDUCTION_TOKENS:
        return "reduction"
    if _has(low, _ELEMENTWISE_WORDS) or tokens & _ELEMENTWISE_TOKENS:
        return "elementwise"
    return None


HostRole = Literal["sync", "blocking_copy", "other"]

_HOST_SYNC = re.compile(
    r"(Stream|Device|Event|Ctx|Context|Queue)Synchroni[sz]e|StreamWaitEvent|EventQuery|StreamQuery"
    r"|^(cu|cuda|hip|musa|mu|ze|xpu)?(Ctx)?Synchronize$",
    re.IGNORECASE,
)
_HOST_BLOCKING_COPY = re.compile(
    r"^(cuda|hip|musa|cu|mu)Memcpy(2D|3D|Peer|ToSymbol|FromSymbol|DtoH|HtoD|DtoD)?(WithStream)?$",
    re.IGNORECASE,
)
_POLLING = re.compile(r"Query", re.IGNORECASE)


def host_call_role(name: str) -> HostRole:
    """What a host runtime call means for the host: a synchronization, a blocking copy, or other.

    Polling calls (``cudaEventQuery``) count as ``sync`` only when they block, which a trace cannot
    tell: they are reported with the syncs by name but do not wait by themselves.
    """
    if _HOST_SYNC.search(name):
        return "sync"
    if _HOST_BLOCKING_COPY.search(name):
        return "blocking_copy"
    return "other"


def is_polling_call(name: str) -> bool:
    """Whether a sync-like call only polls (never blocks)."""
    return bool(_POLLING.search(name))


# ``.item()``, ``bool(t)`` and friends all end in ``_local_scalar_dense`` (counted once, not per
# wrapper); ``nonzero`` must learn its output size from the device.
IMPLICIT_SYNC_OPS = frozenset({"aten::_local_scalar_dense", "aten::nonzero"})


def is_implicit_sync_op(name: str) -> bool:
    """CPU ops that wait for the device to return a value (``.item()``, ``nonzero``, ...)."""
    return name in IMPLICIT_SYNC_OPS
