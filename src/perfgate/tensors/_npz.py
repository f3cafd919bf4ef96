"""NPZ archives: every member checked from the zip directory before any data is decompressed.

An archive can claim anything: members overlapping the same compressed bytes, sizes of terabytes from a
few kilobytes of deflate. So the declared sizes are checked against caps first (a zip-bomb-shaped
member is refused without inflating it), members must occupy disjoint byte ranges of the file, stored
members must fit in the file and are read in chunks, and deflated members are inflated chunk by chunk,
never past their declared size. Each member's NPY header goes through the same refusal of pickles and
non-numeric dtypes as a standalone NPY file.
"""

from __future__ import annotations

import itertools
import math
import struct
import zipfile
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np

from perfgate.security.digests import Algorithm
from perfgate.tensors._errors import TensorInputError
from perfgate.tensors._mapped import ChunkedFile, ChunkStream, OwnedChunks
from perfgate.tensors._npy import NpyHeader, read_npy_header
from perfgate.tensors.entry import TensorEntry

__all__ = ["NpzFile", "NpzLimits"]

_LOCAL_HEADER = struct.Struct("<4s2B4HL2L2H")
_LOCAL_SIGNATURE = b"PK\x03\x04"
_ENCRYPTED = 0x1


@dataclass(frozen=True)
class NpzLimits:
    """Caps on what an archive may declare, checked before anything is decompressed.

    A deflated member may expand to at most ``max_compression_ratio`` times its compressed size (members
    under ``ratio_exempt_bytes`` are exempt: tiny arrays of zeros compress very well), and all deflated
    members together to ``max_expanded_bytes``. Stored (uncompressed) members are bounded by the file
    itself and need no cap.
    """

    max_members: int = 100_000
    max_expanded_bytes: int = 16 * 2**30
    max_compression_ratio: float = 100.0
    ratio_exempt_bytes: int = 2**20


@dataclass(frozen=True)
class _Member:
    key: str
    info: zipfile.ZipInfo
    data_start: int
    header: NpyHeader


class NpzFile:
    """One ``.npz`` archive (``numpy.savez`` or ``numpy.savez_compressed``)."""

    def __init__(self, path: Path, limits: NpzLimits | None = None) -> None:
        self.path = path
        self._limits = limits or NpzLimits()
        self._file = ChunkedFile(path)
        try:
            # zipfile reads through its own stream over the same descriptor: one file, opened once.
            self._stream = self._file.stream()
            self._zip = zipfile.ZipFile(self._stream)
        except (zipfile.BadZipFile, OSError, ValueError, EOFError, NotImplementedError) as exc:
            # NotImplementedError: a directory entry needs a zip version zipfile cannot extract.
            self._stream.close()
            self._file.close()
            raise TensorInputError(f"{path.name}: not a readable zip archive ({exc})") from exc
        try:
            self._members = self._check_members()
        except BaseException:
            self.close()
            raise

    def _fail(self, message: str) -> TensorInputError:
        return TensorInputError(f"{self.path.name}: {message}")

    def _check_members(self) -> dict[str, _Member]:
        infos = self._zip.infolist()
        limits = self._limits
        if len(infos) > limits.max_members:
            raise self._fail(f"{len(infos)} members, over the cap of {limits.max_members}")
        if any(info.filename.endswith(".pkl") for info in infos):
            raise self._fail(
                "a torch.save checkpoint (a zip of pickles), which is never loaded: it can run code. Export "
                "the tensors with perfgate.harness.dump_tensors or safetensors.torch.save_file"
            )
        size = self._file.size_bytes
        spans: list[tuple[int, int, str]] = []
        expanded = 0
        keys: dict[str, zipfile.ZipInfo] = {}
        starts: dict[str, int] = {}
        with self._file.stream() as raw:
            for info in infos:
                name = info.filename
                if info.is_dir() or not name.endswith(".npy"):
                    raise self._fail(f"member {name!r} is not an .npy array; this is not an NPZ archive")
                if info.flag_bits & _ENCRYPTED:
                    raise self._fail(f"member {name!r} is encrypted")
                if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
                    raise self._fail(
                        f"member {name!r} uses compression method {info.compress_type}; numpy writes only "
                        "stored or deflated members"
                    )
                key = name[: -len(".npy")]
                if key in keys:
                    raise self._fail(f"member {name!r} appears twice")
                keys[key] = info
                data_start = self._local_data_start(raw, info, size)
                spans.append((info.header_offset, data_start + info.compress_size, name))
                starts[key] = data_start
                if info.compress_type == zipfile.ZIP_STORED:
                    if info.compress_size != info.file_size:
                        raise self._fail(
                            f"stored member {name!r} declares {info.file_size} bytes but occupies "
                            f"{info.compress_size}: the archive directory lies"
                        )
                else:
                    self._check_ratio(info)
                    expanded += info.file_size
        if expanded > limits.max_expanded_bytes:
            raise self._fail(
                f"deflated members declare {expanded} bytes in total, over the cap of "
                f"{limits.max_expanded_bytes}: refusing a possible zip bomb. If the archive is trusted, save "
                "it uncompressed (numpy.savez) or as safetensors, which are read without inflating"
            )
        spans.sort()
        for (_, end, name), (begin, _, next_name) in itertools.pairwise(spans):
            if begin < end:
                raise self._fail(
                    f"members {name!r} and {next_name!r} overlap in the file: refusing a possible zip bomb"
                )
        return {key: self._member(key, info, starts[key]) for key, info in keys.items()}

    def _check_ratio(self, info: zipfile.ZipInfo) -> None:
        limits = self._limits
        if info.file_size <= limits.ratio_exempt_bytes:
            return
        if info.file_size > limits.max_compression_ratio * max(info.compress_size, 1):
            raise self._fail(
                f"member {info.filename!r} declares {info.file_size} bytes from {info.compress_size} compressed "
                f"bytes (ratio over {limits.max_compression_ratio:g}): refusing a possible zip bomb. If the "
                "archive is trusted, save it uncompressed (numpy.savez) or as safetensors"
            )

    def _local_data_start(self, raw: BinaryIO, info: zipfile.ZipInfo, size: int) -> int:
        raw.seek(info.header_offset)
        local = raw.read(_LOCAL_HEADER.size)
        if len(local) != _LOCAL_HEADER.size or local[:4] != _LOCAL_SIGNATURE:
            raise self._fail(f"member {info.filename!r}: no local file header where the directory points")
        fields = _LOCAL_HEADER.unpack(local)
        name_len, extra_len = fields[10], fields[11]
        data_start = info.header_offset + _LOCAL_HEADER.size + name_len + extra_len
        if data_start + info.compress_size > size:
            raise self._fail(
                f"member {info.filename!r} runs past the end of the file ({data_start + info.compress_size} > "
                f"{size} bytes): the archive is truncated"
            )
        return data_start

    def _member(self, key: str, info: zipfile.ZipInfo, data_start: int) -> _Member:
        where = f"{self.path.name}:{info.filename}"
        try:
            with self._zip.open(info) as stream:
                header = read_npy_header(stream, where)  # pyright: ignore[reportArgumentType]  # ZipExtFile is a binary stream
        except (zipfile.BadZipFile, EOFError, zlib.error, NotImplementedError) as exc:
            raise TensorInputError(f"{where}: corrupt member ({exc})") from exc
        if header.header_bytes + header.data_bytes != info.file_size:
            raise TensorInputError(
                f"{where}: the NPY header describes {header.header_bytes + header.data_bytes} bytes but the "
                f"archive declares {info.file_size}: truncated or lying member"
            )
        return _Member(key, info, data_start, header)

    def entries(self) -> list[TensorEntry]:
        return [
            TensorEntry(m.key, m.header.dtype, m.header.shape, m.header.fortran_order, self.path)
            for m in self._members.values()
        ]

    def chunks(self, key: str, chunk_elements: int) -> ChunkStream:
        member = self._members[key]
        h = member.header
        count = math.prod(h.shape)
        if member.info.compress_type == zipfile.ZIP_STORED:
            return self._file.chunks(member.data_start + h.header_bytes, h.dtype, count, chunk_elements)
        return OwnedChunks(self._inflate(member, count, chunk_elements))

    def _inflate(self, member: _Member, count: int, chunk_elements: int) -> Iterator[np.ndarray]:
        h = member.header
        where = f"{self.path.name}:{member.info.filename}"
        try:
            with self._zip.open(member.info) as stream:
                stream.read(h.header_bytes)
                for start in range(0, count, chunk_elements):
                    n = min(chunk_elements, count - start)
                    data = stream.read(n * h.dtype.itemsize)
                    if len(data) != n * h.dtype.itemsize:
                        raise TensorInputError(f"{where}: member data ends early: the archive is truncated")
                    yield np.frombuffer(data, dtype=h.dtype)
                # Reading at the end makes zipfile compare the CRC of everything inflated.
                tail = stream.read(1)
                assert not tail, "zipfile never reads past a member's declared size"
        except (zipfile.BadZipFile, EOFError, zlib.error, NotImplementedError, OSError) as exc:
            raise TensorInputError(f"{where}: corrupt member ({exc})") from exc

    @property
    def streams_digest(self) -> bool:
        """Whether the comparison's reads feed the digest (stored members; inflating reads other bytes)."""
        return all(m.info.compress_type == zipfile.ZIP_STORED for m in self._members.values())

    def start_digest(self, algorithms: Sequence[Algorithm]) -> None:
        """Hash the file's bytes as the comparison reads them (see `ChunkedFile.start_digest`)."""
        self._file.start_digest(algorithms)

    def digest(self, on_chunk: Callable[[], None] | None = None) -> tuple[dict[Algorithm, str], int]:
        """Digests and size of the file as opened (see `ChunkedFile.digest`)."""
        return self._file.digest(on_chunk)

    def close(self) -> None:
        self._zip.close()
        self._stream.close()  # zipfile does not close a stream it was given
        self._file.close()
