"""Dump tensors from a trusted training process to a safetensors file, for compare_tensors.

Runs inside the user's process: no mcp import, and torch is only touched when a value is a torch
tensor (torch is then already imported by the caller). Tensors are written one at a time, so the host
memory needed is the largest single tensor, not the whole mapping; device tensors are copied to the
host (which synchronizes their stream). The file appears atomically: it is written under a temporary
name of its own in the same folder and renamed, so a crash never leaves a truncated dump behind, and
calls racing on one path (threads too) each put a whole file there.

A dump is perfgate's own work: when one lands inside an open measurement window, that window is
discarded and restarts after a fresh warm-up (see :meth:`Window.own_work_ran`).

Inside a run perfgate launched (a harness window exists in this process), each dump is named in the
window's record (path, digest, size, step; the digest is BLAKE3, taken as the bytes are written): that binds the file to the launch, and so to its evidence
record and code state, and compare_tensors finds its producer from those bytes.
"""

from __future__ import annotations

import json
import math
import os
import re
import secrets
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import numpy as np
from numpy.typing import NDArray

from perfgate.harness._state import ActiveWindow, active_window
from perfgate.security.digests import ALGORITHM, format_digest, new_hasher

__all__ = ["dump_tensors"]

_TORCH_DTYPES = {
    "torch.float64": "F64",
    "torch.float32": "F32",
    "torch.float16": "F16",
    "torch.bfloat16": "BF16",
    "torch.int64": "I64",
    "torch.int32": "I32",
    "torch.int16": "I16",
    "torch.int8": "I8",
    "torch.uint8": "U8",
    "torch.uint16": "U16",
    "torch.uint32": "U32",
    "torch.uint64": "U64",
    "torch.bool": "BOOL",
    "torch.complex64": "C64",
    "torch.float8_e4m3fn": "F8_E4M3",
    "torch.float8_e5m2": "F8_E5M2",
    "torch.float8_e4m3fnuz": "F8_E4M3FNUZ",
    "torch.float8_e5m2fnuz": "F8_E5M2FNUZ",
    "torch.float8_e8m0fnu": "F8_E8M0",
}


@dataclass(frozen=True)
class _Pending:
    key: str
    dtype: str
    shape: list[int]
    size_bytes: int
    data: Callable[[], NDArray[np.uint8]]
    """Produces the little-endian row-major bytes when the tensor's turn to be written comes."""


def _torch_tensor_type() -> type | None:
    torch = sys.modules.get("torch")  # a torch tensor can only exist if the caller imported torch
    return None if torch is None else torch.Tensor


def _from_torch(key: str, tensor: Any) -> _Pending:
    if sys.byteorder != "little":
        raise ValueError("dump_tensors writes torch tensors on little-endian hosts only")
    dtype = _TORCH_DTYPES.get(str(tensor.dtype))
    if dtype is None:
        raise TypeError(f"tensor {key!r}: dtype {tensor.dtype} cannot be stored in safetensors")
    if str(tensor.layout) != "torch.strided":
        raise TypeError(f"tensor {key!r}: layout {tensor.layout} is not supported; densify it first")
    shape = [int(d) for d in tensor.shape]
    size = math.prod(shape) * int(tensor.element_size())

    def data() -> NDArray[np.uint8]:
        torch = sys.modules["torch"]
        host = tensor.detach().to("cpu").contiguous().reshape(-1)
        raw: NDArray[np.uint8] = host.view(torch.uint8).numpy()
        return raw

    return _Pending(key, dtype, shape, size, data)


def _from_numpy(key: str, value: Any) -> _Pending:
    # Only numpy input needs the dtype table (and ml_dtypes, a slow first import): torch tensors do not.
    from perfgate.tensors.dtypes import safetensors_name

    array = np.asarray(value)
    dtype = safetensors_name(array.dtype)
    if dtype is None:
        raise TypeError(
            f"tensor {key!r}: numpy dtype {array.dtype} cannot be stored in safetensors (numeric, bool, "
            "bfloat16 and float8 types can)"
        )
    shape = [int(d) for d in array.shape]
    size = math.prod(shape) * array.dtype.itemsize

    def data() -> NDArray[np.uint8]:
        contiguous: NDArray[Any] = np.ascontiguousarray(array)
        order = contiguous.dtype.byteorder
        if contiguous.dtype.itemsize > 1 and (order == ">" or (order == "=" and sys.byteorder == "big")):
            # Swap to little-endian bytes, as safetensors stores them. numpy's stubs leave the results of
            # byteswap and view partly unknown for a dtype[Any] array, hence the casts.
            contiguous = cast("NDArray[Any]", contiguous.byteswap())  # pyright: ignore[reportUnknownMemberType]
        return cast("NDArray[np.uint8]", contiguous.reshape(-1).view(np.uint8))  # pyright: ignore[reportUnknownMemberType]

    return _Pending(key, dtype, shape, size, data)


def _pending(mapping: Mapping[str, Any]) -> list[_Pending]:
    tensor_type = _torch_tensor_type()
    items: list[_Pending] = []
    for key, value in mapping.items():
        if not isinstance(key, str) or not key:  # pyright: ignore[reportUnnecessaryIsInstance]  # callers may pass anything
            raise TypeError(f"tensor names must be non-empty strings, got {key!r}")
        if key == "__metadata__":
            raise ValueError("'__metadata__' is reserved by the safetensors format; rename that tensor")
        if tensor_type is not None and isinstance(value, tensor_type):
            items.append(_from_torch(key, value))
        else:
            items.append(_from_numpy(key, value))
    return items


def _header(items: list[_Pending], metadata: Mapping[str, str] | None) -> bytes:
    header: dict[str, Any] = {}
    if metadata:
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):  # pyright: ignore[reportUnnecessaryIsInstance]  # runtime check of caller input
            raise TypeError("metadata must map strings to strings")
        header["__metadata__"] = dict(metadata)
    offset = 0
    for item in items:
        header[item.key] = {
            "dtype": item.dtype,
            "shape": item.shape,
            "data_offsets": [offset, offset + item.size_bytes],
        }
        offset += item.size_bytes
    raw = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    # Pad with spaces so tensor data starts 8-byte aligned, as other safetensors writers do.
    raw += b" " * (-(8 + len(raw)) % 8)
    return len(raw).to_bytes(8, "little") + raw


def dump_tensors(
    path: str | os.PathLike[str], mapping: Mapping[str, Any], *, metadata: Mapping[str, str] | None = None
) -> Path:
    """Write ``mapping`` (name -> torch tensor or numpy array) to the safetensors file ``path``.

    Shapes and dtypes are kept exactly (bfloat16 and float8 included); torch tensors may live on any
    device and are copied to the host one at a time. Parent folders are created. Returns the path.

    ``{label}``, ``{launch}`` and ``{rank}`` in ``path`` become the run's label (run_benchmark_window's
    ``label``, in file-name characters; ``unlabelled`` outside a labelled run), the launch id (the
    workspace's launch number, as run_benchmark_window's ``launch_ids`` and each ``tensor_dumps`` entry's
    ``launch_id`` show it) and the rank, so one line of code gives every launch of the baseline and of the
    candidate a file of its own: ``dump_tensors("captures/{label}-{launch}.safetensors", ...)``.

    In a measured run a dump never overwrites a file an earlier launch wrote (a re-run of the baseline would
    otherwise replace the file an earlier check compared): such a path gets ``-launch<launch id>`` before
    its extension, the run's answer lists the file as written, and a note says so.

    In a profiled run (profile_segment) nothing is written: its tensors are evidence of nothing (a profiled
    run never is), and its files would be strays in the workspace. The path it would have had is returned.

    Raises:
        TypeError: a name is not a string, or a value's dtype or layout has no safetensors encoding.
        ValueError: a name is reserved.
    """
    window = active_window()
    started = time.perf_counter_ns()
    target = _expand(os.fspath(path), window.config.label if window is not None else None)
    if window is not None and window.config.profile is not None:
        _skipped_in_profile(target)
        return target
    if window is not None:
        target = _own_file(target, window)
    try:
        computed = None if window is None else _computed(mapping, window.steps_completed)
        digest, size = _dump(target, mapping, metadata)
    finally:
        if window is not None and window.measuring:
            window.own_work_ran("dump_tensors", time.perf_counter_ns() - started)
    if window is not None:
        window.tensors_dumped(os.path.realpath(target), digest, size, computed)
    return target


def _computed(mapping: Mapping[str, Any], steps: int) -> dict[str, int] | None:
    """What of ``mapping`` the training computes (`perfgate.harness.computed`); None when it cannot be told."""
    from perfgate.harness import computed
    from perfgate.harness._state import current_module

    try:
        return computed.classify(mapping, current_module(), steps)
    except Exception:  # noqa: BLE001 -- an unclassified dump is still written (the gates then cannot judge it)
        return None


_told_skipped = False


def _skipped_in_profile(target: Path) -> None:
    global _told_skipped
    if not _told_skipped:
        _told_skipped = True
        print(
            f"[perfgate] dump_tensors: {target} not written: this run is profiled (dumps are written in "
            "run_benchmark_window runs)",
            file=sys.stderr,
            flush=True,
        )


_FIELDS = re.compile(r"\{(label|launch|rank)\}")
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def _expand(path: str, label: str | None) -> Path:
    """``path`` with its ``{label}``, ``{launch}`` and ``{rank}`` filled in (see `dump_tensors`)."""
    values = {
        "label": (label, "unlabelled"),
        "launch": (os.environ.get("PERFGATE_LAUNCH_ID"), "0"),
        "rank": (os.environ.get("RANK"), "0"),
    }

    def fill(match: re.Match[str]) -> str:
        value, otherwise = values[match.group(1)]
        return _UNSAFE.sub("_", value or "").strip("._")[:64] or otherwise

    return Path(_FIELDS.sub(fill, path))


def _own_file(target: Path, window: ActiveWindow) -> Path:
    """``target``, or where it holds a file from before this launch (modified before its window was
    created: an earlier launch's, or one copied in), the same name with this launch's id before the
    extension. A file this launch wrote (an earlier dump, another rank) is the launch's own to replace."""
    try:
        written = target.stat().st_mtime_ns
    except OSError:
        return target
    if written >= window.origin_unix_ns:
        return target
    own = target.with_name(f"{target.stem}-launch{_expand('{launch}', None)}{target.suffix}")
    if own not in _kept_apart:
        _kept_apart.add(own)
        window.note(
            f"dump_tensors: {target} holds an earlier launch's file, so this launch wrote {own} (put {{launch}} "
            "in the path to give every launch a file of its own)"
        )
    return own


_kept_apart: set[Path] = set()
"""Files `_own_file` moved a dump to, noted once each."""


def _dump(target: Path, mapping: Mapping[str, Any], metadata: Mapping[str, str] | None) -> tuple[str, int]:
    """Write the file atomically; returns its digest (``"blake3:<hex>"``, hashed as written) and size in bytes."""
    items = _pending(mapping)
    header = _header(items, metadata)
    target.parent.mkdir(parents=True, exist_ok=True)
    # A name of this call's own (threads of one process dump too), created exclusively.
    temporary = target.with_name(f".{target.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    digest = new_hasher(ALGORITHM)
    digest.update(header)
    size = len(header)
    try:
        with temporary.open("xb") as f:
            f.write(header)
            for item in items:
                data = item.data()
                assert data.nbytes == item.size_bytes, (
                    f"{item.key}: wrote {data.nbytes} bytes, expected {item.size_bytes}"
                )
                digest.update(data.data)
                f.write(data.data)
                size += data.nbytes
                del data
            f.flush()
            os.fsync(f.fileno())
        os.replace(temporary, target)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    return format_digest(ALGORITHM, digest.hexdigest()), size
