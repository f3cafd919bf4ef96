"""Fuzz every reader and the tool arguments: malformed input ends in the reader's own error, never a crash.

Inputs are mutations (bit flips, cuts, splices, repeated spans, hostile tokens such as deep nesting and
huge numbers) of seeds: the real traces in ../shared/data/ (when present) and tiny valid files made here.
Each reader must either succeed or raise the error type it documents; any other exception fails the test
and hypothesis shrinks it to a minimal file.

CI runs a few dozen inputs per reader. For a long local run set ``PERFGATE_FUZZ_EXAMPLES`` (e.g. 10000):

    PERFGATE_FUZZ_EXAMPLES=10000 pytest -q tests/test_fuzz.py
"""

from __future__ import annotations

import contextlib
import csv
import gzip
import io
import json
import os
import resource
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mcp import Client

from conftest import shared_dir
from perfgate.audit.errors import AuditInputError
from perfgate.audit.expected import read_expected
from perfgate.audit.ids import StringPool
from perfgate.audit.read import read_observed
from perfgate.benchmarking.errors import BenchmarkError, RecordError
from perfgate.benchmarking.logparse import compile_pattern, parse_step_log
from perfgate.benchmarking.records import read_record
from perfgate.harness.dump import dump_tensors
from perfgate.server import build_server
from perfgate.tensors import TensorInputError
from perfgate.tensors.source import open_tensor_source
from perfgate.tools._runtime import ServerConfig
from perfgate.traces import TraceError, analyze_trace

EXAMPLES = int(os.environ.get("PERFGATE_FUZZ_EXAMPLES", "10"))
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=EXAMPLES <= 50,  # CI: the same inputs every run; long local runs explore
    suppress_health_check=list(HealthCheck),
    database=None,
)
_SEED_PREFIX_BYTES = 48 << 10
"""Real seeds are cut to this much decompressed JSON: mutations near the start matter most, and it is fast."""

HOSTILE = [
    b"[" * 5000,
    b"{" * 3000,
    b'{"a":' * 3000,
    b"1" * 400,
    b"-" + b"9" * 30,
    b"1e999999",
    b"NaN",
    b"Infinity",
    b'"ProfilerStep#' + b"9" * 40 + b'"',
    b"\xff\xfe\x00",
    b'"\\ud800"',
    b"\x00" * 16,
    b"\n" * 10,
    b'"' + b"x" * 5000 + b'"',
    b"null",
    b"-1",
    b"4294967296",
    b"18446744073709551616",
]


@st.composite
def mutated(draw: st.DrawFn, seeds: list[bytes]) -> bytes:
    data = bytearray(draw(st.sampled_from(seeds)))
    for _ in range(draw(st.integers(0, 6))):
        op = draw(st.sampled_from(["flip", "cut", "insert", "hostile", "repeat", "delete"]))
        at = draw(st.integers(0, max(len(data), 1))) if data else 0
        if op == "flip" and data:
            i = min(at, len(data) - 1)
            data[i] ^= 1 << draw(st.integers(0, 7))
        elif op == "cut":
            del data[at:]
        elif op == "insert":
            data[at:at] = draw(st.binary(min_size=1, max_size=16))
        elif op == "hostile":
            data[at:at] = draw(st.sampled_from(HOSTILE))
        elif op == "repeat" and data:
            end = min(len(data), at + draw(st.integers(1, 64)))
            data[at:at] = bytes(data[at:end]) * draw(st.integers(1, 50))
        elif op == "delete":
            del data[at : at + draw(st.integers(1, 64))]
    return bytes(data)


def _check(read: Callable[[], object], allowed: tuple[type[BaseException], ...]) -> None:
    with contextlib.suppress(*allowed):
        read()


def _peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


# ----------------------------------------------------------------------------- seeds


def _tiny_trace() -> bytes:
    events: list[dict[str, Any]] = []
    for step in range(3):
        t = step * 1000
        events.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{step}", "ts": t, "dur": 900, "pid": 1, "tid": 1})  # fmt: skip
        events.append({"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": t + 10, "dur": 100, "pid": 1, "tid": 1, "args": {"External id": step}})  # fmt: skip
        events.append({"ph": "X", "cat": "kernel", "name": "gemm", "ts": t + 50, "dur": 300, "pid": 0, "tid": 7, "args": {"device": 0, "stream": 7, "correlation": step}})  # fmt: skip
    return json.dumps({"traceEvents": events, "distributedInfo": {"rank": 0}}).encode()


def _trace_seeds() -> list[bytes]:
    seeds = [_tiny_trace(), json.dumps([{"ph": "X", "name": "a", "ts": 1, "dur": 2}]).encode()]
    base = shared_dir()
    folder = base / "data" / "traces" / "hta" if base else None
    if folder is not None and folder.is_dir():
        for path in sorted(folder.glob("*.json.gz"))[:8]:
            with gzip.open(path, "rb") as f:
                seeds.append(f.read(_SEED_PREFIX_BYTES))
    return seeds


TRACE_SEEDS = _trace_seeds()


def _tensor_seeds(tmp: Path) -> list[bytes]:
    dump_tensors(tmp / "s.safetensors", {"a": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.ones(3)})
    np.save(tmp / "s.npy", np.arange(5, dtype=np.int16))
    np.savez(tmp / "s.npz", x=np.zeros(4, np.float32), y=np.arange(3))
    np.savez_compressed(tmp / "c.npz", x=np.zeros(64, np.float32))
    return [(tmp / n).read_bytes() for n in ("s.safetensors", "s.npy", "s.npz", "c.npz")]


RECORD_LINES = [{"sample_id": i, "epoch": 0, "rank": i % 2, "worker": -1, "step": i // 2} for i in range(8)]


def _jsonl() -> bytes:
    return "".join(json.dumps(r) + "\n" for r in RECORD_LINES).encode()


def _csv() -> bytes:
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=list(RECORD_LINES[0]))
    writer.writeheader()
    writer.writerows(RECORD_LINES)
    return out.getvalue().encode()


def _npz_records() -> bytes:
    buf = io.BytesIO()
    np.savez(buf, **{k: np.array([r[k] for r in RECORD_LINES]) for k in RECORD_LINES[0]})
    return buf.getvalue()


def _parquet_records() -> bytes | None:
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        return None
    buf = io.BytesIO()
    pq.write_table(pa.table({k: [r[k] for r in RECORD_LINES] for k in RECORD_LINES[0]}), buf)
    return buf.getvalue()


def _harness_record() -> bytes:
    from test_hostile_limits import _record

    return json.dumps(_record()).encode()


# ----------------------------------------------------------------------------- readers


@FUZZ
@given(data=mutated(TRACE_SEEDS), compress=st.booleans())
def test_fuzz_trace_reader(tmp_path_factory: pytest.TempPathFactory, data: bytes, compress: bool) -> None:
    path = tmp_path_factory.mktemp("t") / ("t.json.gz" if compress else "t.json")
    path.write_bytes(gzip.compress(data, compresslevel=1) if compress else data)
    _check(lambda: analyze_trace(path), (TraceError,))


@FUZZ
@given(data=st.data())
def test_fuzz_tensor_readers(tmp_path_factory: pytest.TempPathFactory, data: st.DataObject) -> None:
    tmp = tmp_path_factory.mktemp("x")
    seeds = _tensor_seeds(tmp)
    blob = data.draw(mutated(seeds))
    suffix = data.draw(st.sampled_from([".safetensors", ".npy", ".npz"]))
    path = tmp / f"f{suffix}"
    path.write_bytes(blob)

    def read() -> None:
        with open_tensor_source(path) as source:
            for key in source.entries:
                for _ in source.chunks(key, 1 << 12):
                    pass

    _check(read, (TensorInputError,))


@FUZZ
@given(data=st.data())
def test_fuzz_sharded_index(tmp_path_factory: pytest.TempPathFactory, data: st.DataObject) -> None:
    tmp = tmp_path_factory.mktemp("i")
    dump_tensors(tmp / "a.safetensors", {"w": np.zeros(3, np.float32)})
    index = json.dumps({"metadata": {}, "weight_map": {"w": "a.safetensors"}}).encode()
    (tmp / "m.index.json").write_bytes(data.draw(mutated([index])))
    _check(lambda: open_tensor_source(tmp / "m.index.json").close(), (TensorInputError,))


OBSERVED = {".jsonl": _jsonl(), ".csv": _csv(), ".npz": _npz_records()}
_PARQUET = _parquet_records()
if _PARQUET is not None:
    OBSERVED[".parquet"] = _PARQUET


@FUZZ
@given(data=st.data())
def test_fuzz_sample_record_readers(tmp_path_factory: pytest.TempPathFactory, data: st.DataObject) -> None:
    suffix = data.draw(st.sampled_from([*OBSERVED, ".jsonl.gz", ".csv.gz"]))
    seed = OBSERVED[suffix.removesuffix(".gz")]
    blob = data.draw(mutated([seed]))
    if suffix.endswith(".gz"):
        blob = gzip.compress(blob, compresslevel=1)
        if data.draw(st.booleans()):
            blob = data.draw(mutated([blob]))  # a corrupt gzip stream as well
    path = tmp_path_factory.mktemp("r") / f"records{suffix}"
    path.write_bytes(blob)
    _check(lambda: read_observed(path), (AuditInputError,))


EXPECTED = {
    ".json": json.dumps(list(range(8))).encode(),
    ".jsonl": b"".join(f'{{"sample_id": {i}}}\n'.encode() for i in range(8)),
    ".txt": b"\n".join(str(i).encode() for i in range(8)),
    ".csv": b"sample_id\n" + b"\n".join(str(i).encode() for i in range(8)),
    ".npy": (lambda: (lambda b: (np.save(b, np.arange(8)), b.getvalue())[1])(io.BytesIO()))(),
    ".npz": _npz_records(),
}


@FUZZ
@given(data=st.data())
def test_fuzz_expected_id_readers(tmp_path_factory: pytest.TempPathFactory, data: st.DataObject) -> None:
    suffix = data.draw(st.sampled_from(sorted(EXPECTED)))
    path = tmp_path_factory.mktemp("e") / f"expected{suffix}"
    path.write_bytes(data.draw(mutated([EXPECTED[suffix]])))
    _check(lambda: read_expected(path, StringPool()), (AuditInputError,))


@FUZZ
@given(blob=mutated([_harness_record()]))
def test_fuzz_harness_records(tmp_path_factory: pytest.TempPathFactory, blob: bytes) -> None:
    path = tmp_path_factory.mktemp("h") / "rank0.json"
    path.write_bytes(blob)
    _check(lambda: read_record(path), (RecordError,))


LOG_PATTERN = r"step (?P<step>\d+) .*step_time_ms (?P<step_time_ms>[0-9.]+)"


@FUZZ
@given(
    pattern=st.one_of(
        st.just(LOG_PATTERN),
        st.text(max_size=60),
        mutated([LOG_PATTERN.encode()]).map(lambda b: b.decode("utf-8", "replace")),
    ),
    log=mutated([b"step 1 loss 2 step_time_ms 10.5\nstep 2 loss 1 step_time_ms 11\n"]),
)
def test_fuzz_log_patterns_and_logs(pattern: str, log: bytes) -> None:
    def read() -> None:
        parse_step_log(log.decode("utf-8", "replace").splitlines(), compile_pattern(pattern))

    _check(read, (BenchmarkError,))


# ----------------------------------------------------------------------------- tool arguments

JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8,
)
# Tools that would start processes are left out: their arguments stop at the approval gate anyway.
ARGUMENT_TOOLS = [
    "compute_mfu",
    "estimate_flops",
    "compare_tensors",
    "audit_samples",
    "plan_parallel_layout",
    "record_decision",
    "compare_benchmarks",
]


@pytest.mark.anyio
async def test_fuzz_tool_arguments_through_the_protocol(tmp_path: Path) -> None:
    server = build_server(ServerConfig.create(tmp_path))
    async with Client(server) as client:
        tools = {t.name: t for t in (await client.list_tools()).tools}
        names = [n for n in ARGUMENT_TOOLS if n in tools]

        @FUZZ
        @given(data=st.data())
        def cases(data: st.DataObject) -> None:
            name = data.draw(st.sampled_from(names))
            props = sorted(tools[name].input_schema.get("properties", {}))
            keys = data.draw(st.lists(st.sampled_from([*props, "bogus_field"]), max_size=6, unique=True))
            collected.append((name, {k: data.draw(JSON_VALUES) for k in keys}))

        collected: list[tuple[str, dict[str, Any]]] = []
        cases()
        for name, args in collected:
            result = await client.call_tool(name, args)
            text = "\n".join(getattr(c, "text", "") for c in result.content)
            assert "perfgate bug" not in text and text.strip() != f"Error executing tool {name}", (
                name,
                args,
                text,
            )
            assert "errors.pydantic.dev" not in text, text
    assert _peak_rss_bytes() < 2 << 30


def test_fuzz_zip_seeds_are_valid(tmp_path: Path) -> None:
    """The seeds themselves read cleanly, so mutations start from real, accepted files."""
    for blob in _tensor_seeds(tmp_path):
        assert blob
    assert zipfile.is_zipfile(io.BytesIO(OBSERVED[".npz"]))
    path = tmp_path / "t.json"
    path.write_bytes(TRACE_SEEDS[0])
    analyze_trace(path)
