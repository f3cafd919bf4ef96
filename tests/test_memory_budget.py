"""Bounded memory for every input (issue 58 item 4): a trace of several GB of events is refused within
``PERFGATE_MEMORY_MB``, and the server answers the next call.

The trace is a gzip of ~4 GB of events made in a moment: one compressed member of 100,000 events written
hundreds of times (gzip readers read concatenated members as one stream), ~14 MB on disk. The server runs
in a subprocess with a small budget, so its peak memory (VmHWM, and its worker processes' peak) can be read
around the call.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BUDGET_MB = 256
EVENT = (
    b'{"ph":"X","cat":"kernel","name":"void gemm_kernel<float>(int)","pid":0,"tid":7,'
    b'"ts":1000.5,"dur":2.5,"args":{"stream":7}},'
)
SERVER = """
import asyncio, gzip, json, resource, sys
from pathlib import Path

from mcp import Client

from perfgate.server import build_server
from perfgate.serving.runtime import ServerConfig

workspace = Path(sys.argv[1])


def peak_mb():
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmHWM")


async def main():
    out = {}
    async with Client(build_server(ServerConfig.create(workspace))) as client:
        small = await client.call_tool("analyze_trace", {"trace_paths": ["small.json"]})  # warm: imports, pools
        out["small_before"] = not small.is_error
        before = peak_mb()
        for tool, args in (
            ("analyze_trace", {"trace_paths": ["huge.json.gz"]}),
            ("profile_segment", {"mode": "analyze", "trace_paths": ["huge.json.gz"]}),
        ):
            got = await client.call_tool(tool, args)
            out[tool] = {"error": got.is_error, "text": " ".join(getattr(c, "text", "") for c in got.content)}
        # tensor files whose headers claim 4 TiB: refused before anything is allocated
        for ref, cand in (("a.safetensors", "b.safetensors"), ("a.npy", "b.npy")):
            got = await client.call_tool("compare_tensors", {"reference": ref, "candidate": cand, "atol": 0, "rtol": 0})
            out[ref] = {"error": got.is_error, "text": " ".join(getattr(c, "text", "") for c in got.content)}
        out["growth_mb"] = peak_mb() - before
        out["children_peak_mb"] = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
        small = await client.call_tool("analyze_trace", {"trace_paths": ["small.json"]})
        out["small_after"] = not small.is_error
    print(json.dumps(out))


asyncio.run(main())
"""


def _huge_trace(path: Path, repeats: int) -> int:
    """A gzip whose events expand to ``repeats`` x 12 MB of JSON; returns that size."""
    import gzip

    member = gzip.compress(EVENT * 100_000, 9)
    with path.open("wb") as f:
        f.write(gzip.compress(b'{"schemaVersion":1,"traceEvents":['))
        for _ in range(repeats):
            f.write(member)
        f.write(gzip.compress(EVENT[:-1] + b"]}"))
    return len(EVENT) * 100_000 * repeats


def _lying_tensor_files(workspace: Path) -> None:
    """Safetensors and .npy files whose headers claim a 2^20 x 2^20 float32 tensor (4 TiB) over 64 bytes."""
    import struct

    header = json.dumps({"w": {"dtype": "F32", "shape": [1 << 20, 1 << 20], "data_offsets": [0, 4 << 40]}})
    raw = header.encode() + b" " * (-len(header) % 8)
    for name in ("a", "b"):
        (workspace / f"{name}.safetensors").write_bytes(struct.pack("<Q", len(raw)) + raw + bytes(64))
        npy = "{'descr': '<f4', 'fortran_order': False, 'shape': (1048576, 1048576), }"
        npy += " " * (-(len(npy) + 11) % 64) + "\n"
        (workspace / f"{name}.npy").write_bytes(
            b"\x93NUMPY\x01\x00" + struct.pack("<H", len(npy)) + npy.encode() + bytes(64)
        )


def test_an_expected_ids_file_past_the_budget_is_refused_before_it_is_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from perfgate.audit.errors import AuditInputError
    from perfgate.audit.expected import read_expected
    from perfgate.audit.ids import StringPool

    monkeypatch.setenv("PERFGATE_MEMORY_MB", "64")
    huge = tmp_path / "ids.txt"
    with huge.open("wb") as f:  # sparse: 8 GiB on paper, nothing on disk
        f.truncate(8 << 30)
    with pytest.raises(AuditInputError, match=r"memory budget of 64 MiB \(PERFGATE_MEMORY_MB\)"):
        read_expected(huge, StringPool())
    small = tmp_path / "small.txt"
    small.write_text("1\n2\n3\n")
    assert len(read_expected(small, StringPool())) == 3


@pytest.mark.timeout(600)
def test_a_trace_of_gigabytes_of_events_is_refused_within_the_memory_budget(workspace: Path) -> None:
    expanded = _huge_trace(workspace / "huge.json.gz", 330)
    assert expanded > 4_000_000_000 and (workspace / "huge.json.gz").stat().st_size < 20_000_000
    _lying_tensor_files(workspace)
    (workspace / "small.json").write_text('{"traceEvents":[' + (EVENT * 1000)[:-1].decode() + "]}")
    import os

    env = {**os.environ, "PERFGATE_MEMORY_MB": str(BUDGET_MB)}
    ran = subprocess.run(
        [sys.executable, "-c", SERVER, str(workspace)], capture_output=True, text=True, env=env, timeout=540
    )
    assert ran.returncode == 0, ran.stderr[-3000:]
    out = json.loads(ran.stdout.strip().splitlines()[-1])
    assert out["small_before"] and out["small_after"], out
    for tool in ("analyze_trace", "profile_segment"):
        text = out[tool]["text"]
        assert out[tool]["error"], out
        assert "huge.json.gz: more than" in text and "PERFGATE_MEMORY_MB" in text, text
        assert f"memory budget of {BUDGET_MB} MiB" in text, text
    # Refused while it was read: neither the server nor a worker process it read with grew past the budget.
    assert "needs data bytes up to 4398046511104" in out["a.safetensors"]["text"], out
    assert "describes 4398046511104 data bytes" in out["a.npy"]["text"], out
    assert out["growth_mb"] < BUDGET_MB, out
    assert out["children_peak_mb"] < BUDGET_MB + 200, out  # a worker's own interpreter and modules
