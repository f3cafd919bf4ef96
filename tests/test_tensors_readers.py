"""Tensor readers: every safetensors dtype, NPY/NPZ, sharded folders, and the inputs they must refuse."""

from __future__ import annotations

import io
import itertools
import json
import pickle
import struct
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from perfgate.harness.dump import dump_tensors
from perfgate.tensors import (
    CompareOptions,
    NpzLimits,
    ReaderLimits,
    TensorInputError,
    TensorSource,
    compare_sources,
    open_tensor_source,
)


def save_file(tensors: dict[str, Any], path: str) -> None:
    """A safetensors file from numpy arrays, by perfgate's writer (the dtype test reads torch-written files)."""
    dump_tensors(path, tensors)


def read_all(source: TensorSource, key: str) -> np.ndarray:
    entry = source.entries[key]
    flat = np.concatenate([c.copy() for c in source.chunks(key, 5)] or [np.empty(0, entry.dtype)])
    return flat.reshape(entry.shape, order="F" if entry.fortran_order else "C")


def raw_safetensors(
    path: Path, header: dict[str, Any], data: bytes, *, declared_len: int | None = None
) -> Path:
    text = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(text) if declared_len is None else declared_len) + text + data)
    return path


TORCH_DTYPES = [
    "float64", "float32", "float16", "bfloat16", "int64", "int32", "int16", "int8", "uint8", "uint16",
    "uint32", "uint64", "bool", "complex64", "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz",
    "float8_e5m2fnuz", "float8_e8m0fnu",
]  # fmt: skip


@pytest.mark.parametrize("name", TORCH_DTYPES)
def test_every_safetensors_dtype_reads_back_the_values_torch_wrote(tmp_path: Path, name: str) -> None:
    torch = pytest.importorskip("torch")
    torch_save_file = pytest.importorskip("safetensors.torch").save_file
    dtype = getattr(torch, name)
    values = torch.randn(3, 7, generator=torch.Generator().manual_seed(1)).abs() * 4
    tensor = values.to(torch.complex64) * (1 + 1j) if dtype.is_complex else values.to(dtype)
    path = tmp_path / "t.safetensors"
    torch_save_file({"t": tensor, "other": torch.zeros(2)}, str(path))
    with open_tensor_source(path) as source:
        entry = source.entries["t"]
        got = read_all(source, "t")
    assert entry.shape == (3, 7)
    assert entry.dtype.name == name  # numpy/ml_dtypes and torch share the names
    expected = tensor.view(torch.uint8).numpy() if name.startswith("float8") or name == "bfloat16" else None
    if expected is not None:
        assert got.view(np.uint8).tobytes() == expected.tobytes()
    else:
        np.testing.assert_array_equal(got, tensor.numpy())


def test_files_are_recognised_by_content_not_name(tmp_path: Path) -> None:
    st = tmp_path / "weights.bin"
    save_file({"a": np.ones(2, np.float32)}, str(st))
    npz = tmp_path / "arrays.dat"
    with npz.open("wb") as f:
        np.savez(f, a=np.ones(2))
    for path in (st, npz):
        with open_tensor_source(path) as source:
            assert list(source.entries) == ["a"]


# --- safetensors that must be refused ---------------------------------------------------------------


def test_truncated_safetensors_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "t.safetensors"
    save_file({"a": np.ones(1000, np.float32), "b": np.ones(10, np.float32)}, str(path))
    data = path.read_bytes()
    path.write_bytes(data[:-100])
    with pytest.raises(TensorInputError, match="truncated"):
        open_tensor_source(path)
    path.write_bytes(data[:20])  # cut inside the header
    with pytest.raises(TensorInputError, match="truncated"):
        open_tensor_source(path)
    path.write_bytes(data[:5])
    with pytest.raises(TensorInputError, match="too short"):
        open_tensor_source(path)


@pytest.mark.parametrize(
    ("header", "data_len", "message"),
    [
        ({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}, 8, "truncated or the header lies"),
        (
            {
                "a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},
                "b": {"dtype": "F32", "shape": [4], "data_offsets": [8, 24]},
            },
            24,
            "overlap",
        ),
        (
            {
                "a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                "b": {"dtype": "F32", "shape": [2], "data_offsets": [16, 24]},
            },
            24,
            "belong to no tensor",
        ),
        ({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 12]}}, 12, "needs 16"),
        ({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}, 12, "after the last tensor"),
        ({"a": {"dtype": "F99", "shape": [2], "data_offsets": [0, 8]}}, 8, "unknown dtype"),
        ({"a": {"dtype": "F4", "shape": [2], "data_offsets": [0, 1]}}, 1, "not supported"),
        ({"a": {"dtype": "F32", "shape": [-2], "data_offsets": [0, 8]}}, 8, "non-negative integers"),
        ({"a": {"dtype": "F32", "shape": [2], "data_offsets": [8, 0]}}, 8, "begin <= end"),
        ({"a": {"dtype": "F32", "shape": [2]}}, 8, "data_offsets"),
        ({"a": [1, 2]}, 8, "not an object"),
        ({"__metadata__": {"x": 1}}, 0, "metadata"),
    ],
)
def test_headers_that_lie_are_refused(
    tmp_path: Path, header: dict[str, Any], data_len: int, message: str
) -> None:
    path = raw_safetensors(tmp_path / "t.safetensors", header, b"\0" * data_len)
    with pytest.raises(TensorInputError, match=message):
        open_tensor_source(path)


def test_duplicate_names_and_non_json_headers_are_refused(tmp_path: Path) -> None:
    entry = '{"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}'
    text = f'{{"a": {entry}, "a": {entry}}}'.encode()
    path = tmp_path / "dup.safetensors"
    path.write_bytes(struct.pack("<Q", len(text)) + text + b"\0" * 4)
    with pytest.raises(TensorInputError, match="twice"):
        open_tensor_source(path)
    path.write_bytes(struct.pack("<Q", 4) + b"{no}")
    with pytest.raises(TensorInputError, match="not valid UTF-8 JSON"):
        open_tensor_source(path)


def test_header_over_the_size_cap_is_refused_before_it_is_read(tmp_path: Path) -> None:
    path = raw_safetensors(tmp_path / "huge.safetensors", {}, b"", declared_len=2**40)
    with pytest.raises(TensorInputError, match="over the 100000000-byte cap"):
        open_tensor_source(path)
    small_cap = ReaderLimits(max_safetensors_header_bytes=64)
    real = tmp_path / "real.safetensors"
    save_file({f"tensor_{i}": np.ones(1, np.float32) for i in range(10)}, str(real))
    with pytest.raises(TensorInputError, match="cap"):
        open_tensor_source(real, limits=small_cap)


def test_a_pickle_is_never_loaded(tmp_path: Path) -> None:
    path = tmp_path / "model.pt"
    torch = pytest.importorskip("torch")
    torch.save({"w": torch.ones(2)}, path)
    with pytest.raises(TensorInputError, match=r"torch\.save checkpoint"):
        open_tensor_source(path)
    raw = tmp_path / "state.npy"
    raw.write_bytes(pickle.dumps({"w": [1.0, 2.0]}))
    with pytest.raises(TensorInputError, match="pickle"):
        open_tensor_source(raw)


# --- NPY / NPZ ---------------------------------------------------------------------------------------


def test_npy_and_npz_read_back_exactly(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    arrays = {"w": rng.standard_normal((5, 3)).astype(np.float32), "i": np.arange(7, dtype=np.int16)}
    np.save(tmp_path / "w.npy", arrays["w"])
    np.savez(tmp_path / "stored.npz", **arrays)
    np.savez_compressed(tmp_path / "deflated.npz", **arrays)
    with open_tensor_source(tmp_path / "w.npy") as npy:
        assert list(npy.entries) == ["w"]
        np.testing.assert_array_equal(read_all(npy, "w"), arrays["w"])
    for name in ("stored.npz", "deflated.npz"):
        with open_tensor_source(tmp_path / name) as npz:
            assert list(npz.entries) == ["w", "i"]
            for key, value in arrays.items():
                np.testing.assert_array_equal(read_all(npz, key), value)


def test_two_npy_files_are_compared_whatever_their_names(tmp_path: Path) -> None:
    np.save(tmp_path / "baseline.npy", np.ones(4))
    np.save(tmp_path / "after.npy", np.ones(4) * 2)
    with open_tensor_source(tmp_path / "baseline.npy") as r, open_tensor_source(tmp_path / "after.npy") as c:
        report = compare_sources(r, c, CompareOptions(atol=0.0, rtol=0.0))
    assert report.status == "mismatch"
    assert report.tensors[0].mismatched == 4
    assert "paired" in report.notes[0]


def test_fortran_ordered_arrays_report_indices_in_their_own_shape(tmp_path: Path) -> None:
    ref = np.asfortranarray(np.zeros((3, 4)))
    cand = ref.copy(order="F")
    cand[2, 1] = 5.0
    np.save(tmp_path / "r.npy", ref)
    np.save(tmp_path / "c.npy", cand)
    with open_tensor_source(tmp_path / "r.npy") as r, open_tensor_source(tmp_path / "c.npy") as c:
        assert r.entries["r"].fortran_order
        report = compare_sources(r, c, CompareOptions(atol=0.0, rtol=0.0, chunk_elements=5))
    assert report.tensors[0].max_abs_error_index == [2, 1]
    np.save(tmp_path / "c_rowmajor.npy", np.ascontiguousarray(cand))
    with (
        open_tensor_source(tmp_path / "r.npy") as r,
        open_tensor_source(tmp_path / "c_rowmajor.npy") as c,
        pytest.raises(TensorInputError, match="column-major"),
    ):
        compare_sources(r, c, CompareOptions(atol=0.0, rtol=0.0))


def test_object_arrays_in_npy_and_npz_are_refused_without_unpickling(tmp_path: Path) -> None:
    objects = np.array([{"a": 1}, None], dtype=object)
    np.save(tmp_path / "obj.npy", objects, allow_pickle=True)
    np.savez(tmp_path / "pickled.npz", good=np.ones(2), bad=objects)
    with pytest.raises(TensorInputError, match="object array"):
        open_tensor_source(tmp_path / "obj.npy")
    with pytest.raises(TensorInputError, match="pickle"):
        open_tensor_source(tmp_path / "pickled.npz")


def test_non_numeric_npy_is_refused(tmp_path: Path) -> None:
    np.save(tmp_path / "s.npy", np.array(["a", "b"]))
    with pytest.raises(TensorInputError, match="no comparable numbers"):
        open_tensor_source(tmp_path / "s.npy")


def test_truncated_npy_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "a.npy"
    np.save(path, np.ones(100))
    path.write_bytes(path.read_bytes()[:-8])
    with pytest.raises(TensorInputError, match="truncated"):
        open_tensor_source(path)


def test_zip_bomb_shaped_npz_is_refused_from_its_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "bomb.npz"
    with (
        zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf,
        zf.open("zeros.npy", "w", force_zip64=True) as f,
    ):
        header = io.BytesIO()
        np.lib.format.write_array_header_1_0(
            header, {"descr": "<f8", "fortran_order": False, "shape": (2**21,)}
        )
        f.write(header.getvalue())
        for _ in range(16):
            f.write(bytes(2**20))
    assert path.stat().st_size < 100_000  # 16 MiB of zeros in a few kilobytes

    def never(*args: object, **kwargs: object) -> None:
        raise AssertionError("a member was opened before the caps were checked")

    monkeypatch.setattr(zipfile.ZipFile, "open", never)
    with pytest.raises(TensorInputError, match="zip bomb"):
        open_tensor_source(path)
    with pytest.raises(TensorInputError, match="in total"):
        open_tensor_source(
            path, limits=ReaderLimits(npz=NpzLimits(max_compression_ratio=1e6, max_expanded_bytes=2**20))
        )


def test_npz_members_sharing_bytes_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "overlap.npz"
    np.savez(path, a=np.ones(4), b=np.ones(4))
    data = bytearray(path.read_bytes())
    # Point the second central-directory entry at the first member's local header.
    first = data.find(b"PK\x01\x02")
    second = data.find(b"PK\x01\x02", first + 4)
    struct.pack_into("<I", data, second + 42, 0)
    path.write_bytes(bytes(data))
    with pytest.raises(TensorInputError, match="overlap"):
        open_tensor_source(path)


def test_npz_with_a_corrupt_deflated_member_fails_while_streaming(tmp_path: Path) -> None:
    path = tmp_path / "crc.npz"
    np.savez_compressed(path, a=np.arange(10_000, dtype=np.float64))
    data = bytearray(path.read_bytes())
    central = data.find(b"PK\x01\x02")
    struct.pack_into("<I", data, central + 16, 0xDEADBEEF)  # wrong CRC-32 in the directory
    path.write_bytes(bytes(data))
    with open_tensor_source(path) as source, pytest.raises(TensorInputError, match="corrupt"):
        read_all(source, "a")


def test_zip_that_is_not_an_npz_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "x.npz"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("readme.txt", "hello")
    with pytest.raises(TensorInputError, match=r"not an \.npy array"):
        open_tensor_source(path)


# --- folders and sharded checkpoints -----------------------------------------------------------------


def sharded(
    folder: Path, shards: dict[str, dict[str, Any]], weight_map: dict[str, str] | None = None
) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name, tensors in shards.items():
        save_file(tensors, str(folder / name))
    if weight_map is None:
        weight_map = {k: name for name, tensors in shards.items() for k in tensors}
    (folder / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {}, "weight_map": weight_map})
    )
    return folder


SHARDS = {
    "model-00001-of-00002.safetensors": {
        "embed": np.ones((4, 2), np.float32),
        "layer.0": np.zeros(3, np.float32),
    },
    "model-00002-of-00002.safetensors": {
        "layer.1": np.ones(3, np.float32),
        "head": np.full((2,), 2.0, np.float32),
    },
}


def test_sharded_checkpoint_with_index_reads_as_one_source(tmp_path: Path) -> None:
    folder = sharded(tmp_path / "ckpt", SHARDS)
    for path in (folder, folder / "model.safetensors.index.json"):
        with open_tensor_source(path) as source:
            assert sorted(source.entries) == ["embed", "head", "layer.0", "layer.1"]
            assert source.files[0].name == "model.safetensors.index.json" and len(source.files) == 3
            np.testing.assert_array_equal(read_all(source, "head"), [2.0, 2.0])


def test_folder_without_index_is_the_union_of_its_tensor_files(tmp_path: Path) -> None:
    folder = tmp_path / "dump"
    folder.mkdir()
    save_file({"a": np.ones(2, np.float32)}, str(folder / "part1.safetensors"))
    np.savez(folder / "part2.npz", b=np.ones(3))
    np.save(folder / "c.npy", np.ones(1))
    (folder / "notes.txt").write_text("ignored")
    with open_tensor_source(folder) as source:
        assert sorted(source.entries) == ["a", "b", "c"]
    np.save(folder / "a.npy", np.ones(1))
    with pytest.raises(TensorInputError, match="in both"):
        open_tensor_source(folder)


@pytest.mark.parametrize(
    ("weight_map", "message"),
    [
        ({"embed": "model-00001-of-00002.safetensors", "gone": "missing.safetensors"}, "does not exist"),
        (
            {"embed": "model-00001-of-00002.safetensors", "head": "model-00001-of-00002.safetensors"},
            "does not hold",
        ),
        ({"embed": "model-00001-of-00002.safetensors"}, "does not list"),
        ({"embed": "../outside.safetensors"}, "relative to the index"),
        ({"embed": "/etc/passwd"}, "relative to the index"),
    ],
)
def test_an_index_that_disagrees_with_its_shards_is_refused(
    tmp_path: Path, weight_map: dict[str, str], message: str
) -> None:
    folder = sharded(tmp_path / "ckpt", SHARDS, weight_map)
    with pytest.raises(TensorInputError, match=message):
        open_tensor_source(folder)


def test_a_shard_linked_from_outside_the_allowed_root_is_refused(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    save_file({"secret": np.ones(1, np.float32)}, str(outside / "s.safetensors"))
    folder = tmp_path / "ckpt"
    folder.mkdir()
    (folder / "s.safetensors").symlink_to(outside / "s.safetensors")
    with pytest.raises(TensorInputError, match="outside"):
        open_tensor_source(folder)


def test_several_index_files_must_be_disambiguated(tmp_path: Path) -> None:
    folder = sharded(tmp_path / "ckpt", SHARDS)
    (folder / "other.index.json").write_text((folder / "model.safetensors.index.json").read_text())
    with pytest.raises(TensorInputError, match="several index files"):
        open_tensor_source(folder)
    with open_tensor_source(folder / "other.index.json") as source:
        assert len(source.entries) == 4


def rss_file_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("RssFile:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no RssFile line")


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs Linux /proc")
def test_streaming_a_mapped_tensor_does_not_keep_its_pages_resident(tmp_path: Path) -> None:
    path = tmp_path / "big.safetensors"
    save_file({"x": np.ones(16 * 2**20, np.float32)}, str(path))  # 64 MiB
    with open_tensor_source(path) as source, open_tensor_source(path) as again:
        before = rss_file_bytes()
        stream = source.chunks("x", 2**16)
        total, done = 0.0, 0
        for chunk in stream:
            total += float(chunk.sum())
            done += chunk.shape[0]
            del chunk
            stream.release(done)
        grown_reading = rss_file_bytes() - before
        report = compare_sources(source, again, CompareOptions(atol=0.0, rtol=0.0, workers=2))
        grown_comparing = rss_file_bytes() - before
    assert (total, report.status) == (16 * 2**20, "match")
    assert grown_reading < 8 * 2**20, f"file-backed RSS grew by {grown_reading} bytes while streaming 64 MiB"
    assert grown_comparing < 8 * 2**20, (
        f"file-backed RSS grew by {grown_comparing} bytes comparing 2 x 64 MiB"
    )


def test_the_same_tensors_in_every_format_compare_equal(tmp_path: Path) -> None:
    rng = np.random.default_rng(4)
    arrays = {"w": rng.standard_normal((300, 7)).astype(np.float32), "n": np.arange(1000, dtype=np.int32)}
    np.savez(tmp_path / "stored.npz", **arrays)
    np.savez_compressed(tmp_path / "deflated.npz", **arrays)
    save_file({k: v for k, v in arrays.items()}, str(tmp_path / "st.safetensors"))
    folder = tmp_path / "npys"
    folder.mkdir()
    for key, value in arrays.items():
        np.save(folder / f"{key}.npy", value)
    names = ["stored.npz", "deflated.npz", "st.safetensors", "npys"]
    for first, second in itertools.pairwise(names):
        with open_tensor_source(tmp_path / first) as r, open_tensor_source(tmp_path / second) as c:
            report = compare_sources(r, c, CompareOptions(atol=0.0, rtol=0.0, chunk_elements=128, workers=2))
        assert (report.status, report.elements_compared) == ("match", 3100), (first, second, report.summary)


def test_digests_are_of_the_bytes_opened_not_of_what_the_path_names_later(tmp_path: Path) -> None:
    """The recorded digest is taken through the comparison's own descriptors: a file renamed over the
    path after opening does not change it, and a file that shrinks while hashed is an error, not a
    digest of fewer bytes."""
    import blake3

    path = tmp_path / "a.safetensors"
    save_file({"w": np.arange(300_000, dtype=np.float32)}, str(path))
    original = path.read_bytes()
    with open_tensor_source(path) as source:
        other = tmp_path / "b.safetensors"
        save_file({"w": np.zeros(300_000, dtype=np.float32)}, str(other))
        other.replace(path)  # the path now names other bytes
        [job] = source.digest_jobs()
        assert job.path == path
        assert job.run(None) == ({"blake3": blake3.blake3(original).hexdigest()}, len(original))
    save_file({"w": np.arange(300_000, dtype=np.float32)}, str(path))
    with open_tensor_source(path) as source:
        [job] = source.digest_jobs()
        with path.open("r+b") as f:
            f.truncate(1000)
        with pytest.raises(TensorInputError, match="truncated or rewritten"):
            job.run(None)


@pytest.mark.parametrize("keys", [None, ("b",), ("c", "a")])
def test_digests_taken_in_the_comparisons_pass_are_of_the_whole_file(
    tmp_path: Path, keys: tuple[str, ...] | None
) -> None:
    """Digests fed by the comparison's reads (in file order, out of it, or with keys left out) and finished
    afterwards equal those of the whole file, under every algorithm asked for."""
    import hashlib

    import blake3

    from perfgate.harness.dump import dump_tensors

    rng = np.random.default_rng(3)
    # The candidate stores a (1.6 MB) first, the reference last: the comparison, in the reference's order,
    # reads the candidate's b and c first, past a gap too large to fill; the finishing pass hashes it.
    values = {
        k: rng.standard_normal(n).astype(np.float32) for k, n in (("b", 5000), ("c", 70), ("a", 400_000))
    }
    dump_tensors(tmp_path / "ref.safetensors", values)
    dump_tensors(tmp_path / "cand.safetensors", {k: values[k] for k in ("a", "b", "c")})
    with (
        open_tensor_source(tmp_path / "ref.safetensors") as r,
        open_tensor_source(tmp_path / "cand.safetensors") as c,
    ):
        for source in (r, c):
            source.start_digests(["blake3", "sha256"])
        report = compare_sources(
            r, c, CompareOptions(atol=0.0, rtol=0.0, keys=keys, chunk_elements=1000, workers=2)
        )
        assert report.status == "match"
        for source in (r, c):
            [job] = source.digest_jobs()
            assert job.after_comparison
            data = job.path.read_bytes()
            expected = {"blake3": blake3.blake3(data).hexdigest(), "sha256": hashlib.sha256(data).hexdigest()}
            assert job.run(None) == (expected, len(data))


def test_float32_files_compare_without_importing_ml_dtypes_and_bf16_files_import_it(tmp_path: Path) -> None:
    # ml_dtypes costs a second or more of CPU on its first import: only files naming a type numpy lacks
    # (bfloat16, float8) may pull it in.
    import ml_dtypes

    save_file({"w": np.arange(6, dtype=np.float32)}, str(tmp_path / "a.safetensors"))
    save_file(
        {"w": np.arange(6, dtype=np.float32).astype(ml_dtypes.bfloat16)}, str(tmp_path / "b.safetensors")
    )
    code = (
        "import sys; from pathlib import Path; from perfgate.tensors import CompareOptions, compare_sources, "
        "open_tensor_source as o; a = o(Path(sys.argv[1])); "
        "print(compare_sources(a, o(Path(sys.argv[1])), CompareOptions(atol=0, rtol=0)).status, 'ml_dtypes' in sys.modules); "
        "b = o(Path(sys.argv[2])); print(b.entries['w'].dtype, 'ml_dtypes' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "a.safetensors"), str(tmp_path / "b.safetensors")],
        check=True,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.stdout.split() == ["match", "False", "bfloat16", "True"]


def test_a_hash_slower_than_the_comparison_still_digests_the_bytes_compared(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Chunks are hashed on a pool thread while the reader goes on: a chunk's array must not be refilled
    before its hash is done, and a full queue holds the reader back. A hasher that sleeps on every update
    (so the comparison runs far ahead of it) must still give the digest of the whole file, for every
    number of comparing threads, and hold no more than the queue's worth of chunks."""
    import time

    import blake3

    from perfgate.security import digests
    from perfgate.tensors import _mapped

    sizes: list[int] = []

    class Slow:
        def __init__(self, inner: Any) -> None:
            self._inner = inner

        def update(self, data: Any, /) -> object:
            time.sleep(0.0005)
            sizes.append(len(memoryview(data).cast("B")))
            return self._inner.update(data)

        def hexdigest(self) -> str:
            return self._inner.hexdigest()

    real = digests.new_hasher
    monkeypatch.setattr(_mapped, "new_hasher", lambda a, threads=False: Slow(real(a, threads=threads)))
    monkeypatch.setattr(_mapped, "_INLINE_CPUS", 0)  # the pool hashes, whatever this machine's CPUs
    monkeypatch.setattr(_mapped, "_MAX_QUEUED", 2)
    monkeypatch.setattr(_mapped, "_PUMP_TURN", 3)  # pumps hand the pool's threads over every 3 chunks
    monkeypatch.setattr(_mapped, "_READ_CHUNKS", 1)  # one chunk per read (and per hash update)
    rng = np.random.default_rng(5)
    values = {k: rng.standard_normal(6000).astype(np.float32) for k in ("a", "b")}
    dump_tensors(tmp_path / "ref.safetensors", values)
    dump_tensors(tmp_path / "cand.safetensors", {k: v.copy() for k, v in values.items()})
    for workers in (1, 3):
        sizes.clear()
        with (
            open_tensor_source(tmp_path / "ref.safetensors") as r,
            open_tensor_source(tmp_path / "cand.safetensors") as c,
        ):
            for source in (r, c):
                source.start_digests(["blake3"])
            options = CompareOptions(atol=0.0, rtol=0.0, chunk_elements=100, workers=workers)
            assert compare_sources(r, c, options).status == "match"
            assert sizes.count(400) > 200  # the digests were fed by the comparison's reads, chunk by chunk
            for source in (r, c):
                [job] = source.digest_jobs()
                data = job.path.read_bytes()
                assert job.run(None) == ({"blake3": blake3.blake3(data).hexdigest()}, len(data))


def test_concurrent_comparisons_share_one_hashing_thread_without_stalling(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two comparisons at once (two calls to the server) feed four running digests; with a single hashing
    thread and room for one queued chunk per file, every digest still completes and is of the whole file
    (a file's hashing gives the thread up every few chunks, and never waits on a reader)."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    import blake3

    from perfgate.tensors import _mapped

    monkeypatch.setattr(_mapped, "_INLINE_CPUS", 0)  # the pool hashes, whatever this machine's CPUs
    monkeypatch.setattr(_mapped, "_MAX_QUEUED", 1)
    monkeypatch.setattr(_mapped, "_PUMP_TURN", 2)
    one = ThreadPoolExecutor(1, thread_name_prefix="perfgate-hash-test")
    monkeypatch.setattr(_mapped, "_hash_pool", one)
    rng = np.random.default_rng(6)
    for pair in ("p", "q"):
        values = {"w": rng.standard_normal(20_000).astype(np.float32)}
        dump_tensors(tmp_path / f"{pair}-ref.safetensors", values)
        dump_tensors(tmp_path / f"{pair}-cand.safetensors", values)
    results: dict[str, list[bool]] = {}

    def run(pair: str) -> None:
        paths = [tmp_path / f"{pair}-ref.safetensors", tmp_path / f"{pair}-cand.safetensors"]
        with open_tensor_source(paths[0]) as r, open_tensor_source(paths[1]) as c:
            for source in (r, c):
                source.start_digests(["blake3"])
            options = CompareOptions(atol=0.0, rtol=0.0, chunk_elements=300, workers=2)
            ok = [compare_sources(r, c, options).status == "match"]
            for source in (r, c):
                [job] = source.digest_jobs()
                data = job.path.read_bytes()
                ok.append(job.run(None) == ({"blake3": blake3.blake3(data).hexdigest()}, len(data)))
        results[pair] = ok

    threads = [threading.Thread(target=run, args=(pair,), daemon=True) for pair in ("p", "q")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    one.shutdown(wait=False)
    assert results == {"p": [True, True, True], "q": [True, True, True]}


def test_on_two_cpus_the_reading_thread_hashes_each_chunk_it_reads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With at most `_INLINE_CPUS` CPUs the thread that reads a chunk hashes it at once (no pool thread per
    file on top of the comparison's threads): the first chunks of a tensor the calling thread, the rest the
    read-ahead thread, while the calling thread computes them. The digests are of the whole files, as with
    the pool."""
    import threading

    import blake3

    from perfgate.security import digests
    from perfgate.tensors import _mapped

    hashing_threads: set[str] = set()
    reading_threads: set[str] = set()

    class Watched:
        def __init__(self, inner: Any) -> None:
            self._inner = inner

        def update(self, data: Any, /) -> object:
            hashing_threads.add(threading.current_thread().name)
            return self._inner.update(data)

        def hexdigest(self) -> str:
            return self._inner.hexdigest()

    def no_pool() -> None:
        raise AssertionError("a pool thread was asked to hash")

    read_into = _mapped.ChunkedFile.read_into

    def watched_read(self: _mapped.ChunkedFile, out: Any, offset: int) -> None:
        reading_threads.add(threading.current_thread().name)
        read_into(self, out, offset)

    real = digests.new_hasher
    monkeypatch.setattr(_mapped, "new_hasher", lambda a, threads=False: Watched(real(a, threads=threads)))
    monkeypatch.setattr(_mapped, "_pool", no_pool)
    monkeypatch.setattr(_mapped.ChunkedFile, "read_into", watched_read)
    monkeypatch.setattr(_mapped, "usable_cpus", lambda: 2)
    rng = np.random.default_rng(8)
    values = {k: rng.standard_normal(5000).astype(np.float32) for k in ("a", "b")}
    dump_tensors(tmp_path / "ref.safetensors", values)
    dump_tensors(tmp_path / "cand.safetensors", {k: v + 1 for k, v in values.items()})
    with (
        open_tensor_source(tmp_path / "ref.safetensors") as r,
        open_tensor_source(tmp_path / "cand.safetensors") as c,
    ):
        for source in (r, c):
            source.start_digests(["blake3"])
        options = CompareOptions(atol=0.0, rtol=0.0, chunk_elements=256, workers=2)
        assert compare_sources(r, c, options).status == "mismatch"
        assert hashing_threads == reading_threads == {threading.current_thread().name, "perfgate-read"}
        for source in (r, c):
            [job] = source.digest_jobs()
            data = job.path.read_bytes()
            assert job.run(None) == ({"blake3": blake3.blake3(data).hexdigest()}, len(data))


def test_chunks_are_read_into_arrays_placed_just_before_their_bytes_page_offset(tmp_path: Path) -> None:
    """Each chunk array (and the digest's buffer) is 64-byte aligned and lies 0-63 bytes before its file
    bytes' place in a page, whatever that place (data at a page start, 8 or 16 bytes in, at a page end):
    the kernel copies into such arrays at full speed, where numpy's own large arrays (16 bytes into a fresh
    mapping) are copied into several times slower. The values read are the file's."""
    from perfgate.tensors._mapped import (  # pyright: ignore[reportPrivateUsage]
        ChunkedFile,
        _empty_for,  # pyright: ignore[reportPrivateUsage]
    )

    for offset in [0, 8, 16, 24, 808, 4032, 4088, 4095, 8192 + 40]:
        for dtype in (np.dtype(np.uint8), np.dtype(np.float32), np.dtype(np.float64)):
            out = _empty_for(1000, dtype, offset)
            address = out.ctypes.data
            assert out.shape == (1000,) and out.dtype == dtype and out.flags.aligned and out.flags.writeable
            assert address % 64 == 0 and (offset - address) % 4096 < 64, (offset, dtype)
    values = np.arange(3 * 65536 + 100, dtype=np.float32)  # chunks of 64 pages, reused; a shorter last one
    for start in (4096, 4096 + 8, 4096 + 16, 8192 - 8):
        path = tmp_path / f"data{start}.bin"
        path.write_bytes(b"\0" * start + values.tobytes())
        file = ChunkedFile(path)
        try:
            chunks = file.chunks(start, values.dtype, values.shape[0], 65536)
            got: list[np.ndarray] = []
            for i, chunk in enumerate(chunks):
                address = chunk.ctypes.data
                assert address % 64 == 0 and (start + i * 262_144 - address) % 4096 < 64
                got.append(chunk.copy())
                chunks.release(i * 65536 + chunk.shape[0])
            assert np.array_equal(np.concatenate(got), values)
        finally:
            file.close()


def test_chunks_read_several_at_a_time_are_never_refilled_while_the_consumer_holds_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file region is read (and hashed) up to `_READ_CHUNKS` chunks at a time and handed out chunk by chunk:
    a read's array is refilled only once every chunk of it is released. A consumer that releases five
    chunks late, or never, still reads every chunk's own values when it looks at them last; the reads are
    whole groups of chunks (a shorter last one)."""
    from perfgate.tensors import _mapped

    reads: list[int] = []
    read_into = _mapped.ChunkedFile.read_into

    def counted(self: _mapped.ChunkedFile, out: Any, offset: int) -> None:
        reads.append(out.shape[0])
        read_into(self, out, offset)

    monkeypatch.setattr(_mapped.ChunkedFile, "read_into", counted)
    chunk = 1024
    values = np.arange(14 * chunk + 7, dtype=np.float32)
    path = tmp_path / "data.bin"
    path.write_bytes(values.tobytes())
    file = _mapped.ChunkedFile(path)
    try:
        for lag in (5, None):
            reads.clear()
            stream = file.chunks(0, values.dtype, values.shape[0], chunk)
            held: list[tuple[int, np.ndarray]] = []
            for i, piece in enumerate(stream):
                held.append((i, piece))
                if lag is not None and len(held) > lag:
                    j, oldest = held.pop(0)
                    assert np.array_equal(oldest, values[j * chunk : (j + 1) * chunk]), (lag, j)
                    stream.release((j + 1) * chunk)
            for j, piece in held:
                assert np.array_equal(piece, values[j * chunk : (j + 1) * chunk]), (lag, j)
            assert reads == [4 * chunk, 4 * chunk, 4 * chunk, 2 * chunk + 7]
    finally:
        file.close()
