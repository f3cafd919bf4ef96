"""Bounded by construction: files that lie about their sizes or change under the reader get a sentence."""

from __future__ import annotations

import gzip
import io
import json
import os
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from mcp import Client

from perfgate.audit import read_npz as read_npz_module
from perfgate.audit.errors import AuditInputError
from perfgate.audit.ids import MAX_ID_CHARS
from perfgate.audit.read import read_observed
from perfgate.audit.read_jsonl import MAX_LINE_BYTES
from perfgate.benchmarking.errors import RecordError
from perfgate.benchmarking.reading.records import load_records, read_record
from perfgate.evidence import Ledger
from perfgate.harness.dump import dump_tensors
from perfgate.tensors import TensorInputError
from perfgate.tensors import session as tensor_session
from perfgate.tensors.source import open_tensor_source

pytestmark = pytest.mark.anyio


def _text(result: Any) -> str:
    return "\n".join(getattr(c, "text", "") for c in result.content)


# ----------------------------------------------------------------------------- tensors: shrinking files


@pytest.mark.parametrize("suffix", [".safetensors", ".npy", ".npz"])
def test_a_tensor_file_truncated_while_it_is_read_is_an_error_not_a_crash(
    tmp_path: Path, suffix: str
) -> None:
    # Reading through a memory map died with SIGBUS here, taking the whole server (and pytest) down.
    path = tmp_path / f"x{suffix}"
    data = np.arange(1 << 18, dtype=np.float32)
    if suffix == ".safetensors":
        dump_tensors(path, {"x": data})
    elif suffix == ".npy":
        np.save(path, data)
    else:
        np.savez(path, x=data)
    with open_tensor_source(path) as source:
        key = next(iter(source.entries))
        os.truncate(path, path.stat().st_size // 3)
        with pytest.raises(TensorInputError) as info:
            for _ in source.chunks(key, 1 << 14):
                pass
    assert path.name in str(info.value)
    assert "truncated" in str(info.value) or "ends early" in str(info.value)


def test_a_tensor_file_replaced_by_a_rename_is_read_as_it_was_opened(tmp_path: Path) -> None:
    path = tmp_path / "x.npy"
    np.save(path, np.ones(1000, dtype=np.float32))
    with open_tensor_source(path) as source:
        np.save(tmp_path / "new.npy", np.zeros(10, dtype=np.float32))
        (tmp_path / "new.npy").replace(path)
        got = np.concatenate(list(source.chunks("x", 256)))
    assert got.shape == (1000,) and bool((got == 1).all())


async def test_compare_tensors_reports_a_file_truncated_mid_call(
    server: Any, workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dump_tensors(workspace / "ref.safetensors", {"w": np.zeros(1 << 16, np.float32)})
    dump_tensors(workspace / "cand.safetensors", {"w": np.ones(1 << 16, np.float32)})
    real_open = tensor_session.open_side

    def open_then_truncate(role: Any, path: Path, confine: Any) -> Any:
        source = real_open(role, path, confine)
        if role == "candidate":  # the training job re-saves its dump while the agent compares it
            os.truncate(path, 100)
        return source

    monkeypatch.setattr(tensor_session, "open_side", open_then_truncate)
    async with Client(server) as client:
        result = await client.call_tool(
            "compare_tensors",
            {"reference": "ref.safetensors", "candidate": "cand.safetensors", "atol": 0.0, "rtol": 0.0},
        )
    assert result.is_error
    assert "cand.safetensors: the file ends at byte" in _text(result)
    assert Ledger(workspace).records() == []


def test_an_npy_header_claiming_a_huge_shape_is_refused_before_allocating(tmp_path: Path) -> None:
    path = tmp_path / "ids.npy"
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": "<i8", "fortran_order": False, "shape": (10**12,)})
    path.write_bytes(buf.getvalue() + b"\0" * 64)
    with (
        path.open("rb") as f,
        pytest.raises(AuditInputError, match=r"declares 8000000000\d+ bytes but the file"),
    ):
        read_npz_module.check_array_file(path, f)


# ----------------------------------------------------------------------------- audit records


def test_a_gzip_line_longer_than_the_limit_stops_with_its_line_number(tmp_path: Path) -> None:
    # Before: one 1 GiB line in a 1 MB .jsonl.gz peaked at 10 GiB.
    path = tmp_path / "records.jsonl.gz"
    good = b'{"sample_id": 1, "epoch": 0, "rank": 0, "worker": -1}\n'
    with gzip.open(path, "wb") as f:
        f.write(good * 3 + b'{"sample_id": "' + b"a" * (9 << 20) + b'"}\n')
    with pytest.raises(AuditInputError) as info:
        read_observed(path)
    assert f"line 4 is longer than {MAX_LINE_BYTES} bytes" in str(info.value)
    assert "MAX_LINE_BYTES" in str(info.value)


def test_a_truncated_gzip_file_is_named_with_how_far_it_got(tmp_path: Path) -> None:
    path = tmp_path / "records.jsonl.gz"
    line = b'{"sample_id": 1, "epoch": 0, "rank": 0, "worker": -1}\n'
    data = gzip.compress(line * 20000)
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(AuditInputError, match="corrupt or truncated after"):
        read_observed(path)


def test_an_overlong_string_id_is_refused_with_the_limit(tmp_path: Path) -> None:
    path = tmp_path / "records.jsonl"
    long_id = "x" * (MAX_ID_CHARS + 1)
    path.write_text(json.dumps({"sample_id": long_id, "epoch": 0, "rank": 0, "worker": -1}) + "\n")
    with pytest.raises(AuditInputError) as info:
        read_observed(path)
    assert "MAX_ID_CHARS" in str(info.value) and str(path) in str(info.value)
    assert len(str(info.value)) < 600  # the id itself is not echoed


def test_an_npz_of_zeros_that_inflates_past_the_ratio_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Before: a 4 MiB .npz of zeros inflated to 4 GiB inside audit_samples (compare_tensors had a cap).
    monkeypatch.setattr(read_npz_module, "RATIO_EXEMPT_BYTES", 1 << 16)
    path = tmp_path / "expected.npz"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf, zf.open("sample_id.npy", "w") as member:
        np.lib.format.write_array(member, np.zeros(1 << 20, dtype=np.int64))
    with (
        path.open("rb") as f,
        pytest.raises(AuditInputError, match=r"over 200x \(limit audit._files.MAX_GZIP_RATIO"),
    ):
        read_npz_module.check_array_file(path, f)


# ----------------------------------------------------------------------------- harness records


def _record(**over: Any) -> dict[str, Any]:
    steps = {
        "count": 2,
        "warmup": 0,
        "start_ns": [0, 10],
        "end_ns": [10, 20],
        "step_time_ns": [10, 10],
        "data_wait_ns": [0, 0],
        "backward_ns": [0, 0],
        "samples": [None, None],
        "tokens": [None, None],
    }
    window = {
        "index": 0,
        "first_step": 0,
        "last_step": 1,
        "steps": 2,
        "start_ns": 0,
        "end_ns": 20,
        "elapsed_ns": 20,
        "start_unix_ns": 0,
        "end_unix_ns": 20,
    }
    from perfgate.harness.record import RECORD_SCHEMA, RECORD_VERSION

    base: dict[str, Any] = {
        "schema": RECORD_SCHEMA,
        "version": RECORD_VERSION,
        "rank": 0,
        "world_size": 1,
        "timing": "optimizer",
        "warmup_steps": 0,
        "measure_steps": 2,
        "windows_requested": 1,
        "complete": True,
        "profiled": False,
        "steps": steps,
        "windows": [window],
        "origin_unix_ns": 0,
    }
    for key, value in over.items():
        if key.startswith("window_"):
            window[key.removeprefix("window_")] = value
        else:
            base[key] = value
    return base


def test_a_record_claiming_a_billion_ranks_is_refused_without_building_them(tmp_path: Path) -> None:
    (tmp_path / "rank0.json").write_text(json.dumps(_record(world_size=1_000_000_000)))
    with pytest.raises(RecordError, match="world_size"):
        load_records(tmp_path)


def test_many_missing_ranks_are_counted_not_listed(tmp_path: Path) -> None:
    (tmp_path / "rank0.json").write_text(json.dumps(_record(world_size=1 << 20)))
    problems = load_records(tmp_path).problems
    assert any("and 1048555 more of world size 1048576" in p for p in problems), problems


@pytest.mark.parametrize(
    ("over", "expected"),
    [
        ({"window_elapsed_ns": 0}, "elapsed_ns"),  # was a ZeroDivisionError in the throughput
        ({"window_steps": 0}, "steps"),
        ({"window_device_elapsed_ms": float("nan")}, "device_elapsed_ms"),
        ({"window_last_step": 7}, "window 0 spans steps 0..7 of 2"),
        ({"rank": 3}, "rank 3 is outside world size 1"),
        ({"warmup_steps": 10**30}, "warmup_steps"),
    ],
)
def test_impossible_record_values_are_refused_with_the_field(
    tmp_path: Path, over: dict[str, Any], expected: str
) -> None:
    path = tmp_path / "rank0.json"
    text = json.dumps(_record(**over)).replace("NaN", "1e999")  # JSON has no NaN; 1e999 decodes to inf
    path.write_text(text)
    with pytest.raises(RecordError, match=expected.replace("(", r"\(").replace(".", r"\.")):
        read_record(path)


def test_deeply_nested_record_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "rank0.json"
    path.write_text(json.dumps(_record())[:-1] + ', "profile": ' + "[" * 100_000 + "]" * 100_000 + "}")
    with pytest.raises(RecordError, match="not a valid harness record"):
        read_record(path)


# ----------------------------------------------------------------------------- the planner

MIXTRAL: dict[str, Any] = {
    "layers": 32,
    "hidden_size": 4096,
    "ffn_hidden_size": 14336,
    "num_attention_heads": 32,
    "num_kv_heads": 8,
    "vocab_size": 32000,
    "swiglu": True,
    "moe": {"num_experts": 8, "top_k": 2},
}
PLAN: dict[str, Any] = {
    "model": MIXTRAL,
    "world_size": 16,
    "device": "H100",
    "seq_len": 4096,
    "micro_batch_size": 1,
    "global_batch_size": 256,
    "recompute": "full",
    "mode": "search",
}


async def test_a_search_space_over_the_limit_is_refused_before_searching(
    server: Any, workspace: Path
) -> None:
    # Before: large choice lists searched on the event loop for over 120 s, freezing every other call.
    args = {
        **PLAN,
        "world_size": 720720,  # 240 divisors
        "gpus_per_node": 1024,
        "search": {"cp_choices": list(range(1, 65)), "etp_choices": list(range(1, 65))},
    }
    async with Client(server) as client:
        result = await client.call_tool("plan_parallel_layout", args)
    text = _text(result)
    assert result.is_error
    assert "over the limit of 200000 (planning.search.MAX_LAYOUTS)" in text and "narrow search." in text
    assert Ledger(workspace).records() == []


async def test_a_search_runs_off_the_event_loop_and_checks_for_cancellation(
    server: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    import threading

    from perfgate.tools import plan_parallel_layout

    seen: dict[str, Any] = {}
    real = plan_parallel_layout.search_layouts

    def watched(*args: Any, **kwargs: Any) -> Any:
        seen["thread"] = threading.current_thread() is not threading.main_thread()
        seen["check"] = kwargs.get("check")
        kwargs["check"]()  # callable from the worker thread without error while the call is live
        return real(*args, **kwargs)

    monkeypatch.setattr(plan_parallel_layout, "search_layouts", watched)
    async with Client(server) as client:
        result = await client.call_tool("plan_parallel_layout", PLAN)
    assert not result.is_error, _text(result)
    assert seen["thread"] is True and callable(seen["check"])


async def test_a_world_size_beyond_any_cluster_is_an_argument_error(server: Any) -> None:
    async with Client(server) as client:
        result = await client.call_tool("plan_parallel_layout", {**PLAN, "world_size": 10**12})
    assert result.is_error
    assert "- world_size: must be less than or equal to 1048576 (got 1000000000000)" in _text(result)
