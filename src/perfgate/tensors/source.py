"""Open what the agent points at: one tensor file, or a folder of them (a sharded checkpoint).

Formats are recognised by their first bytes, not their names: NPY magic, zip (NPZ), else a safetensors
length prefix followed by ``{``. A Python pickle (``torch.save`` output) is recognised and refused with
a hint. A folder is read through its ``*.index.json`` (``weight_map``: tensor name -> shard file) when it
has one, else as the union of its ``.safetensors``, ``.npz`` and ``.npy`` files.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, Literal, Protocol

from perfgate.helpers.safeopen import UnsafeFileError, open_file
from perfgate.security.digests import ALGORITHM, Algorithm, new_hasher
from perfgate.tensors._errors import TensorInputError
from perfgate.tensors._mapped import ChunkStream
from perfgate.tensors._npy import MAGIC as NPY_MAGIC
from perfgate.tensors._npy import NpyFile
from perfgate.tensors._npz import NpzFile, NpzLimits
from perfgate.tensors._safetensors import DEFAULT_MAX_HEADER_BYTES, SafetensorsFile
from perfgate.tensors.entry import TensorEntry

__all__ = ["DigestJob", "ReaderLimits", "SourceKind", "TensorSource", "open_tensor_source"]

SourceKind = Literal["safetensors", "npz", "npy", "folder"]
_SUFFIXES = (".safetensors", ".npz", ".npy")
_INDEX_SUFFIX = ".index.json"
_MAX_INDEX_BYTES = 64 * 2**20


@dataclass(frozen=True)
class ReaderLimits:
    """Caps applied while opening: safetensors header size and the NPZ archive caps."""

    max_safetensors_header_bytes: int = DEFAULT_MAX_HEADER_BYTES
    npz: NpzLimits = field(default_factory=NpzLimits)


@dataclass(frozen=True)
class DigestJob:
    """Digests one file of a source: ``run(on_chunk)`` returns (algorithm -> hex, size in bytes);
    ``on_chunk`` runs before each chunk read (raise from it to stop)."""

    path: Path
    run: Callable[[Callable[[], None] | None], tuple[dict[Algorithm, str], int]]
    after_comparison: bool
    """The comparison's reads feed this digest: run it once they are done."""


class _Reader(Protocol):
    path: Path

    def entries(self) -> list[TensorEntry]: ...
    @property
    def streams_digest(self) -> bool: ...

    def chunks(self, key: str, chunk_elements: int) -> ChunkStream: ...
    def start_digest(self, algorithms: Sequence[Algorithm]) -> None: ...
    def digest(self, on_chunk: Callable[[], None] | None = None) -> tuple[dict[Algorithm, str], int]: ...
    def close(self) -> None: ...


def _sniff(path: Path) -> str:
    with open_file(path) as f:
        head = f.read(9)
    if head.startswith(NPY_MAGIC):
        return "npy"
    if head.startswith((b"PK\x03\x04", b"PK\x05\x06")):
        return "npz"
    if path.suffix == ".safetensors" or (len(head) == 9 and head[8:9] == b"{"):
        return "safetensors"
    if head[:1] == b"\x80":
        raise TensorInputError(
            f"{path.name} is a Python pickle (torch.save output?), which is never loaded: it can run code. "
            "Export the tensors with perfgate.harness.dump_tensors or safetensors.torch.save_file"
        )
    raise TensorInputError(f"{path.name}: not safetensors, NPZ or NPY (unrecognised first bytes)")


def _open_file(path: Path, limits: ReaderLimits) -> _Reader:
    try:
        kind = _sniff(path)
        if kind == "npy":
            return NpyFile(path)
        if kind == "npz":
            return NpzFile(path, limits.npz)
        return SafetensorsFile(path, max_header_bytes=limits.max_safetensors_header_bytes)
    except UnsafeFileError:
        raise
    except OSError as exc:  # e.g. a zip directory whose offsets point past any file
        raise TensorInputError(f"{path.name}: cannot be read ({exc.strerror or exc})") from exc


def _default_confine(root: Path) -> Callable[[Path], Path]:
    base = root.resolve()

    def confine(path: Path) -> Path:
        resolved = path.resolve()
        if resolved != base and base not in resolved.parents:
            raise TensorInputError(f"{path} resolves to {resolved}, outside {base}")
        return resolved

    return confine


class TensorSource:
    """A set of named tensors from one or more files, read chunk by chunk.

    ``files`` lists every file the source reads (index first), for hashing into the evidence.
    """

    def __init__(self, path: Path, kind: SourceKind, readers: list[_Reader], index: Path | None) -> None:
        self.path = path
        self.kind: SourceKind = kind
        self._readers = readers
        self._index = index
        self._algorithms: tuple[Algorithm, ...] = (ALGORITHM,)
        self.digesting = False
        """Whether `start_digests` was called: the comparison's reads also hash."""
        self.files: tuple[Path, ...] = ((index,) if index else ()) + tuple(r.path for r in readers)
        self.entries: dict[str, TensorEntry] = {}
        self._owner: dict[str, _Reader] = {}
        for reader in readers:
            for entry in reader.entries():
                if entry.key in self.entries:
                    other = self.entries[entry.key].file.name
                    raise TensorInputError(
                        f"tensor {entry.key!r} is in both {other} and {reader.path.name}; a folder must hold "
                        "each tensor once"
                    )
                self.entries[entry.key] = entry
                self._owner[entry.key] = reader

    @property
    def single_array(self) -> bool:
        """True for a lone NPY file, whose only key is its file name."""
        return self.kind == "npy"

    def chunks(self, key: str, chunk_elements: int) -> ChunkStream:
        """Tensor ``key`` as consecutive 1-D pieces in storage order, ``chunk_elements`` each (the last may
        be shorter); see `ChunkStream` for releasing what was consumed."""
        return self._owner[key].chunks(key, chunk_elements)

    def start_digests(self, algorithms: Sequence[Algorithm]) -> None:
        """Digest every tensor file with ``algorithms`` in the same pass as the comparison reads it (call
        before comparing); `digest_jobs` then finishes each digest from where the reads stopped."""
        self._algorithms = tuple(algorithms)
        self.digesting = True
        for reader in self._readers:
            reader.start_digest(self._algorithms)

    def digest_jobs(self) -> list[DigestJob]:
        """One job per file in ``files`` (same order). Tensor files are hashed through the descriptors the
        comparison reads (in the same pass, after `start_digests`), so a path replaced meanwhile cannot make
        the recorded digest differ from the bytes compared; the jobs are independent (run them on several
        threads). A job whose ``after_comparison`` is true finishes what the comparison's reads began: run
        it once the comparison is done (before, it would read every byte itself)."""
        algorithms = self._algorithms
        jobs: list[DigestJob] = []
        if self._index is not None:
            index = self._index
            jobs.append(DigestJob(index, lambda on_chunk: _file_digest(index, algorithms, on_chunk), False))
        jobs.extend(DigestJob(r.path, r.digest, r.streams_digest) for r in self._readers)
        return jobs

    def close(self) -> None:
        for reader in self._readers:
            reader.close()

    def __enter__(self) -> TensorSource:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _file_digest(
    path: Path, algorithms: Sequence[Algorithm], on_chunk: Callable[[], None] | None
) -> tuple[dict[Algorithm, str], int]:
    """Digests and size of a small file (a shard index), opened without following links."""
    hashers = [new_hasher(a) for a in algorithms]
    size = 0
    with open_file(path) as f:
        while block := f.read(1 << 20):
            if on_chunk is not None:
                on_chunk()
            for h in hashers:
                h.update(block)
            size += len(block)
    return {a: h.hexdigest() for a, h in zip(algorithms, hashers, strict=True)}, size


def _open_all(paths: list[Path], limits: ReaderLimits) -> list[_Reader]:
    readers: list[_Reader] = []
    try:
        for path in paths:
            readers.append(_open_file(path, limits))
    except BaseException:
        for reader in readers:
            reader.close()
        raise
    return readers


def _read_index(index: Path) -> dict[str, str]:
    with open_file(index) as f:
        data = f.read(_MAX_INDEX_BYTES + 1)
    if len(data) > _MAX_INDEX_BYTES:
        raise TensorInputError(f"{index.name} is over {_MAX_INDEX_BYTES} bytes; not a checkpoint index")
    try:
        parsed: Any = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        reason = "nested too deeply" if isinstance(exc, RecursionError) else str(exc)
        raise TensorInputError(f"{index.name}: not valid JSON ({reason})") from exc
    document: dict[str, Any] = parsed if isinstance(parsed, dict) else {}  # pyright: ignore[reportUnknownVariableType]  # JSON
    weight_map: Any = document.get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        raise TensorInputError(f"{index.name}: no 'weight_map' object mapping tensor names to shard files")
    mapping: dict[Any, Any] = weight_map  # pyright: ignore[reportUnknownVariableType]  # checked below
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in mapping.items()):
        raise TensorInputError(f"{index.name}: weight_map must map tensor names to shard file names")
    return {str(k): str(v) for k, v in mapping.items()}


def _shard_path(folder: Path, name: str, index: Path) -> Path:
    pure = PurePosixPath(name)
    if pure.is_absolute() or ".." in pure.parts or not name:
        raise TensorInputError(f"{index.name}: shard {name!r} must be a path relative to the index's folder")
    return folder.joinpath(*pure.parts)


def _open_indexed(index: Path, confine: Callable[[Path], Path], limits: ReaderLimits) -> TensorSource:
    weight_map = _read_index(index)
    shard_names = list(dict.fromkeys(weight_map.values()))
    paths: list[Path] = []
    for name in shard_names:
        try:
            path = confine(_shard_path(index.parent, name, index))
            exists = path.is_file()
        except OSError as exc:  # a name the file system cannot hold (too long, NUL)
            raise TensorInputError(f"{index.name} lists shard {name[:80]!r}: {exc.strerror or exc}") from exc
        if not exists:
            raise TensorInputError(f"{index.name} lists shard {name[:80]!r}, which does not exist")
        paths.append(path)
    readers = _open_all(paths, limits)
    try:
        for name, reader in zip(shard_names, readers, strict=True):
            held = {e.key for e in reader.entries()}
            listed = {k for k, v in weight_map.items() if v == name}
            if listed - held:
                missing = sorted(listed - held)
                raise TensorInputError(
                    f"{index.name} places {len(missing)} tensors in {name} that it does not hold, e.g. {missing[:3]}"
                )
            if held - listed:
                unlisted = sorted(held - listed)
                raise TensorInputError(
                    f"{name} holds {len(unlisted)} tensors that {index.name} does not list for it, e.g. "
                    f"{unlisted[:3]}"
                )
        return TensorSource(index.parent, "folder", readers, index)
    except BaseException:
        for reader in readers:
            reader.close()
        raise


def _open_folder(folder: Path, confine: Callable[[Path], Path], limits: ReaderLimits) -> TensorSource:
    children = sorted(folder.iterdir())
    indexes = [p for p in children if p.name.endswith(_INDEX_SUFFIX) and p.is_file()]
    if len(indexes) > 1:
        names = ", ".join(p.name for p in indexes)
        raise TensorInputError(f"{folder.name} holds several index files ({names}); pass the one to use")
    if indexes:
        return _open_indexed(confine(indexes[0]), confine, limits)
    paths = [confine(p) for p in children if p.suffix in _SUFFIXES and p.is_file()]
    if not paths:
        raise TensorInputError(f"{folder.name} holds no .safetensors, .npz or .npy file and no *.index.json")
    readers = _open_all(paths, limits)
    try:
        return TensorSource(folder, "folder", readers, None)
    except BaseException:
        for reader in readers:
            reader.close()
        raise


def open_tensor_source(
    path: Path,
    *,
    confine: Callable[[Path], Path] | None = None,
    limits: ReaderLimits | None = None,
) -> TensorSource:
    """Open a safetensors/NPZ/NPY file, a checkpoint index (``*.index.json``) or a folder of shards.

    ``path`` must already be resolved and allowed by the caller. ``confine`` resolves each further file a
    folder or index names and raises when it is not allowed (default: it must resolve inside the folder).
    Headers are validated here; no tensor data is read.

    Raises:
        TensorInputError: unreadable, unsafe or inconsistent input; the message says which and why.
    """
    limits = limits or ReaderLimits()
    if path.is_dir():
        return _open_folder(path, confine or _default_confine(path), limits)
    if not path.is_file():
        raise TensorInputError(f"{path} is not a file or folder")
    if path.name.endswith(_INDEX_SUFFIX):
        return _open_indexed(path, confine or _default_confine(path.parent), limits)
    reader = _open_file(path, limits)
    kind: SourceKind = (
        "npy" if isinstance(reader, NpyFile) else "npz" if isinstance(reader, NpzFile) else "safetensors"
    )
    return TensorSource(path, kind, [reader], None)
