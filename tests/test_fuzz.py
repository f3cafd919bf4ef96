"""Fuzz every reader and the tool arguments: malformed input ends in the reader's own error, never a crash.

Inputs are mutations (bit flips, cuts, splices, repeated spans, hostile tokens such as deep nesting and
huge numbers) of seeds: the real traces in ../shared/data/ (when present) and tiny valid files made here.
Each reader must either succeed or raise the error type it documents; any other exception fails the test
and hypothesis shrinks it to a minimal file.

Every call's peak resident memory is measured (Linux: the peak is reset through /proc/self/clear_refs
before the call and read from VmHWM after it; elsewhere the process peak so far) and must stay under
``max(2 GiB, 4 x the input's size)``.

CI runs a few dozen inputs per reader. For a long local run set ``PERFGATE_FUZZ_EXAMPLES`` (e.g. 10000);
``PERFGATE_FUZZ_COLLECT=1`` keeps going past a crash (the inputs are saved) instead of shrinking the
first one, and ``PERFGATE_FUZZ_REPORT=DIR`` writes per-reader counts, crashes and peak memory as JSON:

    PERFGATE_FUZZ_EXAMPLES=10000 PERFGATE_FUZZ_COLLECT=1 PERFGATE_FUZZ_REPORT=/tmp/fuzz pytest -q tests/test_fuzz.py
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import os
import resource
import time
import traceback
import zipfile
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
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
from perfgate.benchmarking.reading.logparse import compile_pattern, parse_step_log
from perfgate.benchmarking.reading.records import read_record
from perfgate.harness.dump import dump_tensors
from perfgate.server import build_server
from perfgate.serving.runtime import ServerConfig
from perfgate.tensors import TensorInputError
from perfgate.tensors.source import open_tensor_source
from perfgate.traces import TraceError, analyze_trace

EXAMPLES = int(os.environ.get("PERFGATE_FUZZ_EXAMPLES", "10"))
COLLECT = os.environ.get("PERFGATE_FUZZ_COLLECT") == "1"
REPORT_DIR = os.environ.get("PERFGATE_FUZZ_REPORT")
RSS_FLOOR_BYTES = 2 << 30
"""A call may peak at max(RSS_FLOOR_BYTES, RSS_INPUT_FACTOR x input bytes) of resident memory."""
RSS_INPUT_FACTOR = 4
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


@dataclass
class ReaderStats:
    calls: int = 0
    refused: int = 0  # ended in the reader's documented error
    crashes: list[str] = field(default_factory=list[str])
    max_rss_bytes: int = 0
    max_input_bytes: int = 0
    started: float = field(default_factory=time.monotonic)
    wall_s: float = 0.0


STATS: dict[str, ReaderStats] = {}
_CLEAR_REFS = Path("/proc/self/clear_refs")
_STATUS = Path("/proc/self/status")


def _reset_peak_rss() -> bool:
    """Reset the kernel's per-process peak RSS (VmHWM); False where that is not possible."""
    try:
        _CLEAR_REFS.write_text("5")
    except OSError:
        return False
    return True


def _peak_rss_bytes(per_call: bool) -> int:
    if per_call:
        for line in _STATUS.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # the process's peak so far


def _check(
    reader: str, read: Callable[[], object], allowed: tuple[type[BaseException], ...], size: int
) -> None:
    """Run one reader call: it succeeds or raises an `allowed` error, within the memory bound."""
    stats = STATS.setdefault(reader, ReaderStats())
    stats.calls += 1
    if stats.calls % 500 == 0:
        _write_report()  # a long run stopped early still leaves its counts
    stats.max_input_bytes = max(stats.max_input_bytes, size)
    per_call = _reset_peak_rss()
    try:
        read()
    except allowed:
        stats.refused += 1
    except Exception as exc:
        if not COLLECT:
            raise
        stats.crashes.append(f"{type(exc).__name__}: {str(exc)[:300]}")
        _save_crash(reader, len(stats.crashes), exc)
    finally:
        peak = _peak_rss_bytes(per_call)
        stats.max_rss_bytes = max(stats.max_rss_bytes, peak)
        stats.wall_s = time.monotonic() - stats.started
    bound = max(RSS_FLOOR_BYTES, RSS_INPUT_FACTOR * size)
    assert peak <= bound, f"{reader}: peak RSS {peak} bytes over the bound {bound} for a {size}-byte input"


_LAST_INPUT: dict[str, tuple[str, bytes]] = {}


def _remember(reader: str, suffix: str, blob: bytes) -> int:
    """Keep the input of the current call (saved if it crashes); returns its size."""
    _LAST_INPUT[reader] = (suffix, blob)
    return len(blob)


def _save_crash(reader: str, n: int, exc: BaseException) -> None:
    if REPORT_DIR is None or reader not in _LAST_INPUT:
        return
    suffix, blob = _LAST_INPUT[reader]
    out = Path(REPORT_DIR) / "crashes"
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{reader}-{n}{suffix}").write_bytes(blob)
    (out / f"{reader}-{n}.txt").write_text("".join(traceback.format_exception(exc)))


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
    blob = gzip.compress(data, compresslevel=1) if compress else data
    path.write_bytes(blob)
    size = _remember("traces", "".join(path.suffixes), blob)
    _check("traces", lambda: analyze_trace(path), (TraceError,), size)


_TENSOR_SEEDS: list[bytes] = []


@pytest.mark.parametrize("suffix", [".safetensors", ".npy", ".npz"])
@FUZZ
@given(data=st.data())
def test_fuzz_tensor_readers(
    tmp_path_factory: pytest.TempPathFactory, suffix: str, data: st.DataObject
) -> None:
    """Every seed (of any format) mutated and read as this suffix: cross-format confusion included."""
    tmp = tmp_path_factory.mktemp("x")
    if not _TENSOR_SEEDS:
        _TENSOR_SEEDS.extend(_tensor_seeds(tmp_path_factory.mktemp("seeds")))
    blob = data.draw(mutated(_TENSOR_SEEDS))
    path = tmp / f"f{suffix}"
    path.write_bytes(blob)

    def read() -> None:
        with open_tensor_source(path) as source:
            for key in source.entries:
                for _ in source.chunks(key, 1 << 12):
                    pass

    reader = f"tensors{suffix.replace('.', '_')}"
    _check(reader, read, (TensorInputError,), _remember(reader, suffix, blob))


@FUZZ
@given(data=st.data())
def test_fuzz_sharded_index(tmp_path_factory: pytest.TempPathFactory, data: st.DataObject) -> None:
    tmp = tmp_path_factory.mktemp("i")
    dump_tensors(tmp / "a.safetensors", {"w": np.zeros(3, np.float32)})
    index = json.dumps({"metadata": {}, "weight_map": {"w": "a.safetensors"}}).encode()
    blob = data.draw(mutated([index]))
    (tmp / "m.index.json").write_bytes(blob)
    size = _remember("sharded_index", ".index.json", blob)
    _check(
        "sharded_index", lambda: open_tensor_source(tmp / "m.index.json").close(), (TensorInputError,), size
    )


OBSERVED = {".jsonl": _jsonl(), ".csv": _csv(), ".npz": _npz_records()}
_PARQUET = _parquet_records()
if _PARQUET is not None:
    OBSERVED[".parquet"] = _PARQUET


@pytest.mark.parametrize("base", [".jsonl", ".csv", ".npz", ".parquet"])
@FUZZ
@given(data=st.data())
def test_fuzz_sample_record_readers(
    tmp_path_factory: pytest.TempPathFactory, base: str, data: st.DataObject
) -> None:
    if base not in OBSERVED:
        pytest.skip("pyarrow is not installed")
    gz = base in (".jsonl", ".csv") and data.draw(st.booleans())
    suffix = base + ".gz" if gz else base
    seed = OBSERVED[base]
    blob = data.draw(mutated([seed]))
    if suffix.endswith(".gz"):
        blob = gzip.compress(blob, compresslevel=1)
        if data.draw(st.booleans()):
            blob = data.draw(mutated([blob]))  # a corrupt gzip stream as well
    path = tmp_path_factory.mktemp("r") / f"records{suffix}"
    path.write_bytes(blob)
    reader = f"sample_records{base.replace('.', '_')}"
    _check(reader, lambda: read_observed(path), (AuditInputError,), _remember(reader, suffix, blob))


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
    blob = data.draw(mutated([EXPECTED[suffix]]))
    path.write_bytes(blob)
    size = _remember("expected_ids", suffix, blob)
    _check("expected_ids", lambda: read_expected(path, StringPool()), (AuditInputError,), size)


@FUZZ
@given(blob=mutated([_harness_record()]))
def test_fuzz_harness_records(tmp_path_factory: pytest.TempPathFactory, blob: bytes) -> None:
    path = tmp_path_factory.mktemp("h") / "rank0.json"
    path.write_bytes(blob)
    _check(
        "harness_records",
        lambda: read_record(path),
        (RecordError,),
        _remember("harness_records", ".json", blob),
    )


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

    size = _remember("harness_logs", ".log", pattern.encode("utf-8", "replace") + b"\n" + log)
    _check("harness_logs", read, (BenchmarkError,), size)


# ----------------------------------------------------------------------------- tool arguments

JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8,
)
_ARGUMENT_ROUND = 250
# Tools that would start processes are left out: their arguments stop at the approval gate anyway.
ARGUMENT_TOOLS = [
    "compute_mfu",
    "estimate_flops",
    "compare_tensors",
    "audit_samples",
    "plan_parallel_layout",
    "record_decision",
    "compare_benchmarks",
    "analyze_trace",
    "import_benchmark",
    "check_training_health",
]


@pytest.mark.anyio
async def test_fuzz_tool_arguments_through_the_protocol(tmp_path: Path) -> None:
    server = build_server(ServerConfig.create(tmp_path))
    async with Client(server) as client:
        tools = {t.name: t for t in (await client.list_tools()).tools}
        names = [n for n in ARGUMENT_TOOLS if n in tools]

        # Cases are drawn in rounds of at most _ARGUMENT_ROUND (the calls are async, hypothesis is not), so a
        # long run makes calls from the start and its report grows as it goes.
        @settings(FUZZ, max_examples=min(EXAMPLES, _ARGUMENT_ROUND))
        @given(data=st.data())
        def cases(data: st.DataObject) -> None:
            name = data.draw(st.sampled_from(names))
            props = sorted(tools[name].input_schema.get("properties", {}))
            keys = data.draw(st.lists(st.sampled_from([*props, "bogus_field"]), max_size=6, unique=True))
            collected.append((name, {k: data.draw(JSON_VALUES) for k in keys}))

        collected: list[tuple[str, dict[str, Any]]] = []
        stats = STATS.setdefault("tool_arguments", ReaderStats())
        for _ in range(-(-EXAMPLES // _ARGUMENT_ROUND)):
            collected.clear()
            cases()
            await _call_each(client, collected, stats)


async def _call_each(client: Client, collected: list[tuple[str, dict[str, Any]]], stats: ReaderStats) -> None:
    for name, args in collected:
        stats.calls += 1
        if stats.calls % 500 == 0:
            _write_report()
        size = len(json.dumps(args, default=str))
        stats.max_input_bytes = max(stats.max_input_bytes, size)
        per_call = _reset_peak_rss()
        result = await client.call_tool(name, args)  # the server dying would raise here
        peak = _peak_rss_bytes(per_call)
        stats.max_rss_bytes = max(stats.max_rss_bytes, peak)
        stats.wall_s = time.monotonic() - stats.started
        text = "\n".join(getattr(c, "text", "") for c in result.content)
        stats.refused += bool(result.is_error)
        crashed = "perfgate bug" in text or text.strip() == f"Error executing tool {name}"
        crashed |= "errors.pydantic.dev" in text
        if crashed and COLLECT:
            stats.crashes.append(f"{name}({json.dumps(args, default=str)[:300]}): {text[:300]}")
        else:
            assert not crashed, (name, args, text)
        assert peak <= RSS_FLOOR_BYTES, f"{name}: peak RSS {peak} bytes for {args}"


def _write_report() -> None:
    if REPORT_DIR is None:
        return
    out = Path(REPORT_DIR)
    out.mkdir(parents=True, exist_ok=True)
    report = {
        "examples_per_test": EXAMPLES,
        "rss_bound": f"max({RSS_FLOOR_BYTES}, {RSS_INPUT_FACTOR} x input bytes) per call",
        "per_call_rss": _CLEAR_REFS.exists(),
        "readers": {k: asdict(v) for k, v in STATS.items()},
    }
    (out / f"report-{os.getpid()}.json").write_text(json.dumps(report, indent=2))


def test_fuzz_summary_no_crash_collected() -> None:
    """Runs last: in collect mode the crashes were gathered, not raised; writes the report when asked."""
    _write_report()
    crashes = {k: v.crashes for k, v in STATS.items() if v.crashes}
    assert not crashes, crashes


def test_fuzz_zip_seeds_are_valid(tmp_path: Path) -> None:
    """The seeds themselves read cleanly, so mutations start from real, accepted files."""
    for blob in _tensor_seeds(tmp_path):
        assert blob
    assert zipfile.is_zipfile(io.BytesIO(OBSERVED[".npz"]))
    path = tmp_path / "t.json"
    path.write_bytes(TRACE_SEEDS[0])
    analyze_trace(path)
