"""safetensors files: a validated header, then tensors read chunk by chunk from one open descriptor.

Layout: an unsigned 64-bit little-endian header length N, N bytes of JSON
``{name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {str: str}}``, then the data
buffer; offsets are relative to the start of the buffer. The header is checked here before any tensor is
read, so a truncated file or a header that lies (offsets past the end, overlapping or leaving gaps,
sizes that disagree with dtype x shape, duplicate names) is refused with a message naming the problem,
instead of reading garbage or crashing deep inside a library.
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from perfgate.security.digests import Algorithm
from perfgate.tensors._errors import TensorInputError
from perfgate.tensors._mapped import ChunkedFile, ChunkStream
from perfgate.tensors.dtypes import UNSUPPORTED_SAFETENSORS_DTYPES, safetensors_dtype
from perfgate.tensors.entry import TensorEntry

__all__ = ["DEFAULT_MAX_HEADER_BYTES", "SafetensorsFile", "parse_header"]

DEFAULT_MAX_HEADER_BYTES = 100_000_000
"""Header size cap in bytes; the reference implementation refuses headers above the same size."""

_METADATA = "__metadata__"


@dataclass(frozen=True)
class _Slot:
    key: str
    dtype: np.dtype[Any]
    shape: tuple[int, ...]
    begin: int
    end: int


def _reject_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise TensorInputError(f"the header names {key!r} twice")
        out[key] = value
    return out


def _int_list(value: Any) -> list[int] | None:
    if not isinstance(value, list):
        return None
    items: list[Any] = value  # pyright: ignore[reportUnknownVariableType]  # JSON list, checked below
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in items):
        return None
    return [int(v) for v in items]


def _slot(key: str, raw: Any) -> _Slot:
    if not isinstance(raw, dict):
        raise TensorInputError(f"tensor {key!r}: header entry is not an object")
    entry: dict[str, Any] = raw  # pyright: ignore[reportUnknownVariableType]  # JSON object, checked below
    unknown = set(entry) - {"dtype", "shape", "data_offsets"}
    if unknown:
        raise TensorInputError(f"tensor {key!r}: unexpected header fields {sorted(unknown)}")
    dtype_name = entry.get("dtype")
    if not isinstance(dtype_name, str):
        raise TensorInputError(f"tensor {key!r}: missing or non-string dtype")
    if dtype_name in UNSUPPORTED_SAFETENSORS_DTYPES:
        raise TensorInputError(
            f"tensor {key!r}: dtype {dtype_name} packs several elements per byte and is not supported; "
            "dump it upcast (e.g. to bfloat16) for the comparison"
        )
    dtype = safetensors_dtype(dtype_name)
    if dtype is None:
        raise TensorInputError(f"tensor {key!r}: unknown dtype {dtype_name!r}")
    shape = _int_list(entry.get("shape"))
    if shape is None:
        raise TensorInputError(f"tensor {key!r}: shape must be a list of non-negative integers")
    offsets = _int_list(entry.get("data_offsets"))
    if offsets is None or len(offsets) != 2 or offsets[0] > offsets[1]:
        raise TensorInputError(f"tensor {key!r}: data_offsets must be [begin, end] with 0 <= begin <= end")
    expected = math.prod(shape) * dtype.itemsize
    if offsets[1] - offsets[0] != expected:
        raise TensorInputError(
            f"tensor {key!r}: data_offsets span {offsets[1] - offsets[0]} bytes but dtype {dtype_name} x shape "
            f"{shape} needs {expected}: the header is inconsistent"
        )
    return _Slot(key, dtype, tuple(shape), offsets[0], offsets[1])


def parse_header(
    head: bytes, file_size_bytes: int, *, max_header_bytes: int = DEFAULT_MAX_HEADER_BYTES
) -> tuple[int, list[_Slot], dict[str, str]]:
    """Validate a header against the file size.

    ``head`` holds at least the first 8 bytes of the file and, when the declared header fits in the file,
    the whole header. Returns (data buffer start, tensors in storage order, metadata).

    Raises:
        TensorInputError: truncated file, header over the cap, malformed JSON, or a header whose offsets
            do not tile the data buffer exactly.
    """
    if file_size_bytes < 8:
        raise TensorInputError(f"{file_size_bytes} bytes is too short for a safetensors file (truncated?)")
    (header_len,) = struct.unpack("<Q", head[:8])
    if header_len > max_header_bytes:
        raise TensorInputError(
            f"the header declares {header_len} bytes, over the {max_header_bytes}-byte cap: the file is "
            "corrupt or not safetensors"
        )
    if 8 + header_len > file_size_bytes:
        raise TensorInputError(
            f"the header declares {header_len} bytes but the file has only {file_size_bytes - 8} after the "
            "length field: the file is truncated"
        )
    data_start = 8 + header_len
    try:
        text = head[8:data_start].decode("utf-8")
        parsed: Any = json.loads(text, object_pairs_hook=_reject_duplicates)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise TensorInputError(
            f"the header is not valid UTF-8 JSON ({exc}): corrupt or not safetensors"
        ) from exc
    if not isinstance(parsed, dict):
        raise TensorInputError("the header is not a JSON object")
    header: dict[str, Any] = parsed  # pyright: ignore[reportUnknownVariableType]  # checked just above
    metadata = _metadata(header.pop(_METADATA, None))
    slots = sorted((_slot(k, v) for k, v in header.items()), key=lambda s: (s.begin, s.end))
    _check_tiling(slots, file_size_bytes - data_start)
    return data_start, slots, metadata


def _metadata(raw: Any) -> dict[str, str]:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise TensorInputError("__metadata__ must be an object of strings")
    meta: dict[str, Any] = raw  # pyright: ignore[reportUnknownVariableType]  # checked below
    if not all(isinstance(v, str) for v in meta.values()):
        raise TensorInputError("__metadata__ values must be strings")
    return {str(k): str(v) for k, v in meta.items()}


def _check_tiling(slots: list[_Slot], buffer_bytes: int) -> None:
    """Tensors must cover the data buffer exactly: no byte outside it, none shared, none unaccounted."""
    for slot in slots:
        if slot.end > buffer_bytes:
            raise TensorInputError(
                f"tensor {slot.key!r} needs data bytes up to {slot.end} but the file holds {buffer_bytes} "
                "after the header: the file is truncated or the header lies about offsets"
            )
    position = 0
    previous: _Slot | None = None
    for slot in slots:
        if slot.begin < position:
            assert previous is not None
            raise TensorInputError(
                f"tensors {previous.key!r} and {slot.key!r} overlap (bytes {slot.begin}..{position}): the header "
                "lies about offsets"
            )
        if slot.begin > position:
            raise TensorInputError(
                f"bytes {position}..{slot.begin} of the data buffer belong to no tensor (before {slot.key!r}): "
                "the header lies about offsets"
            )
        position = slot.end
        if slot.end > slot.begin:
            previous = slot
    if position != buffer_bytes:
        raise TensorInputError(
            f"{buffer_bytes - position} bytes after the last tensor belong to no tensor: the header does not "
            "describe the file"
        )


class SafetensorsFile:
    """One safetensors file, validated on open and mapped read-only."""

    def __init__(self, path: Path, *, max_header_bytes: int = DEFAULT_MAX_HEADER_BYTES) -> None:
        self.path = path
        self._file = ChunkedFile(path)
        try:
            size = self._file.size_bytes
            head = self._file.read_bytes(0, min(8, size))
            if len(head) == 8:
                (declared,) = struct.unpack("<Q", head)
                if declared <= max_header_bytes and 8 + declared <= size:
                    head += self._file.read_bytes(8, declared)
            data_start, slots, self.metadata = parse_header(head, size, max_header_bytes=max_header_bytes)
        except TensorInputError as exc:
            self._file.close()
            raise TensorInputError(f"{path.name}: {exc}") from exc
        except BaseException:
            self._file.close()
            raise
        self._data_start = data_start
        self._slots = {s.key: s for s in slots}

    def entries(self) -> list[TensorEntry]:
        return [TensorEntry(s.key, s.dtype, s.shape, False, self.path) for s in self._slots.values()]

    def chunks(self, key: str, chunk_elements: int) -> ChunkStream:
        slot = self._slots[key]
        count = math.prod(slot.shape)
        return self._file.chunks(self._data_start + slot.begin, slot.dtype, count, chunk_elements)

    streams_digest = True
    """The comparison's reads feed the digest (see `start_digest`)."""

    def start_digest(self, algorithms: Sequence[Algorithm]) -> None:
        """Hash the file's bytes as the comparison reads them (see `ChunkedFile.start_digest`)."""
        self._file.start_digest(algorithms)

    def digest(self, on_chunk: Callable[[], None] | None = None) -> tuple[dict[Algorithm, str], int]:
        """Digests and size of the file as opened (see `ChunkedFile.digest`)."""
        return self._file.digest(on_chunk)

    def close(self) -> None:
        self._file.close()
