"""perfgate.harness.dump_tensors: safetensors that other readers load exactly, written atomically."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from safetensors import safe_open
from safetensors.numpy import load_file as load_numpy

from perfgate.harness.dump import dump_tensors
from perfgate.tensors import CompareOptions, compare_sources, open_tensor_source


def test_torch_tensors_round_trip_through_the_reference_safetensors_reader(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    load_file = pytest.importorskip("safetensors.torch").load_file
    g = torch.Generator().manual_seed(0)
    tensors = {
        "activations.bf16": torch.randn(4, 5, generator=g).bfloat16(),
        "grad.f16": torch.randn(3, generator=g).half(),
        "w.f32": torch.randn(2, 3, generator=g).t(),  # non-contiguous
        "fp8": torch.randn(6, generator=g).to(torch.float8_e5m2),
        "ids": torch.arange(9, dtype=torch.int64).reshape(3, 3)[:, 1],  # non-contiguous view
        "mask": torch.tensor([True, False]),
        "loss": torch.tensor(2.25),
        "empty": torch.zeros(0, 4),
    }
    path = dump_tensors(tmp_path / "sub" / "acts.safetensors", tensors, metadata={"step": "10"})
    loaded = load_file(path)
    assert loaded.keys() == tensors.keys()
    for key, value in tensors.items():
        assert loaded[key].dtype == value.dtype, key
        assert torch.equal(
            loaded[key].reshape(-1).view(torch.uint8), value.contiguous().reshape(-1).view(torch.uint8)
        ), key
    with safe_open(path, "pt") as f:
        assert f.metadata() == {"step": "10"}


def test_numpy_arrays_keep_their_dtype_including_ml_dtypes_and_big_endian(tmp_path: Path) -> None:
    arrays = {
        "be": np.arange(6, dtype=">f4").reshape(2, 3),
        "bf16": np.linspace(0, 1, 5).astype(ml_dtypes.bfloat16),
        "f8": np.array([0.5, -2.0], dtype=ml_dtypes.float8_e4m3fn),
        "u16": np.array([1, 65535], dtype=np.uint16),
        "scalar": np.float64(3.5),
    }
    path = dump_tensors(tmp_path / "a.safetensors", arrays)
    with open_tensor_source(path) as source:
        for key, value in arrays.items():
            entry = source.entries[key]
            data = np.concatenate(list(source.chunks(key, 4)) or [np.empty(0, entry.dtype)]).reshape(
                entry.shape
            )
            assert entry.dtype == np.dtype(value.dtype).newbyteorder("<") or entry.dtype == value.dtype
            np.testing.assert_array_equal(data.astype(np.float64), np.asarray(value).astype(np.float64))
    big_endian = dump_tensors(tmp_path / "be.safetensors", {"be": arrays["be"]})
    assert load_numpy(big_endian)["be"].tolist() == [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]


def test_a_dump_compares_equal_to_itself_and_unequal_after_a_change(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    model = torch.nn.Linear(8, 4)
    x = torch.randn(3, 8, generator=torch.Generator().manual_seed(2))
    out = model(x)
    out.sum().backward()
    grads = {name: p.grad for name, p in model.named_parameters() if p.grad is not None}
    first = dump_tensors(tmp_path / "a.safetensors", {"out": out, **grads})
    grads["weight"] = grads["weight"] * 1.01
    second = dump_tensors(tmp_path / "b.safetensors", {"out": out, **grads})
    with open_tensor_source(first) as a, open_tensor_source(first) as a2, open_tensor_source(second) as b:
        assert compare_sources(a, a2, CompareOptions(atol=0.0, rtol=0.0)).status == "match"
        report = compare_sources(a, b, CompareOptions(atol=1e-6, rtol=1e-4))
    assert report.status == "mismatch"
    assert [t.key for t in report.tensors if t.status == "value_mismatch"] == ["weight"]


def test_unsupported_values_raise_and_leave_no_file_behind(tmp_path: Path) -> None:
    target = tmp_path / "bad.safetensors"
    with pytest.raises(TypeError, match="cannot be stored"):
        dump_tensors(target, {"s": np.array(["a"])})
    with pytest.raises(ValueError, match="reserved"):
        dump_tensors(target, {"__metadata__": np.ones(1)})
    with pytest.raises(TypeError, match="non-empty strings"):
        dump_tensors(target, {"": np.ones(1)})
    assert list(tmp_path.iterdir()) == []


def test_sparse_torch_tensors_are_refused(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    with pytest.raises(TypeError, match="layout"):
        dump_tensors(tmp_path / "s.safetensors", {"sparse": torch.eye(3).to_sparse()})


def test_a_write_that_fails_midway_keeps_the_previous_dump_intact(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    target = dump_tensors(tmp_path / "d.safetensors", {"a": np.ones(3)})
    before = target.read_bytes()
    unreadable = torch.empty(4, device="meta")  # its header entry is fine; copying its data fails
    with pytest.raises(NotImplementedError):
        dump_tensors(target, {"a": np.zeros(3), "b": unreadable})
    assert target.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d.safetensors"]


def test_importing_the_dump_helper_imports_neither_torch_nor_mcp() -> None:
    code = (
        "import sys, perfgate.harness; perfgate.harness.dump_tensors; "
        "print('torch' in sys.modules, any(m == 'mcp' or m.startswith('mcp.') for m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.split() == ["False", "False"]


def test_a_dump_in_a_windowed_process_is_named_in_its_record_with_the_bytes_digest(tmp_path: Path) -> None:
    import json

    import blake3

    from perfgate.harness import Window, hooks, report_metric

    window = Window(warmup_steps=1, measure_steps=2, record_dir=tmp_path / "records", stop=False)
    try:
        early = dump_tensors(tmp_path / "early.safetensors", {"w": np.arange(4, dtype=np.float32)})
        for _ in range(4):
            with window.step(samples=1):
                pass
        # after the last window the record is already written: a later dump rewrites it
        late = dump_tensors(tmp_path / "late.safetensors", {"w": np.ones(3, dtype=np.float32)})
        # an evaluation metric reported by the run is named in the same record (the last value wins)
        assert report_metric("eval_accuracy", 0.5) and report_metric("eval_accuracy", 0.75)
        with pytest.raises(ValueError, match="finite"):
            report_metric("eval_loss", float("nan"))
        record = json.loads((tmp_path / "records" / "rank0.json").read_text())
    finally:
        window.close()
        hooks.deactivate(window)
    assert record["metrics"] == {"eval_accuracy": 0.75}
    assert report_metric("eval_accuracy", 1.0) is False  # no window in this process any more: not recorded
    dumps = {Path(d["path"]).name: d for d in record["tensor_dumps"]}
    assert set(dumps) == {"early.safetensors", "late.safetensors"}
    for path in (early, late):
        # BLAKE3, named, hashed as written (what compare_tensors matches; no bare sha256 any more)
        assert dumps[path.name]["digest"] == "blake3:" + blake3.blake3(path.read_bytes()).hexdigest()
        assert "sha256" not in dumps[path.name]
        assert dumps[path.name]["size_bytes"] == path.stat().st_size
    assert dumps["early.safetensors"]["step"] == 0 < dumps["late.safetensors"]["step"]


def test_threads_dumping_to_one_path_at_once_each_write_a_whole_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each call writes its own temporary file: before, threads of one process shared one name, wrote
    into the same file and the second rename failed (or a mix of both dumps was renamed into place)."""
    import os
    import threading

    target = tmp_path / "t.safetensors"
    both_writing = threading.Barrier(2, timeout=10)
    real_fsync = os.fsync

    def fsync(fd: int) -> None:  # both dumps are written, neither renamed yet
        both_writing.wait()
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    arrays = [np.full(1000, i, dtype=np.float32) for i in range(2)]
    failures: list[BaseException] = []

    def dump(i: int) -> None:
        try:
            dump_tensors(target, {"x": arrays[i]})
        except Exception as exc:  # noqa: BLE001 - reported below
            failures.append(exc)

    threads = [threading.Thread(target=dump, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert failures == []
    got = load_numpy(str(target))["x"]
    assert any(np.array_equal(got, a) for a in arrays)
    assert [p.name for p in tmp_path.iterdir()] == [target.name]
