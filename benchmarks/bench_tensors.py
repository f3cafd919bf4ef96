"""compare_tensors vs safetensors+torch.testing.assert_close on two large checkpoints.

Generates two checkpoints of ``--size-gib`` each under a temporary folder, the candidate within tolerance
of the reference everywhere: by default one float32 safetensors file each (8192 x 4096 tensors); with
``--bf16-sharded``, a bfloat16 model sharded into ``--shards`` files with a ``model.safetensors.index.json``
(what ``save_pretrained`` writes). Then times each contender in its own fresh subprocess (so peak RSS is
that contender's alone), interleaved, ``--repeats`` times, with the files in the page cache:

- ``mcp_warm``: the compare_tensors tool call over MCP stdio to a running ``perfgate serve`` (its modules
  imported by a first call on a small pair): from sending ``tools/call`` to the answer. What an agent
  waits for in a session.
- ``mcp_cold``: spawn ``perfgate serve``, ``initialize``, that one call, the answer.
- ``perfgate_tool``: the tool's ``run`` in process (comparison, BLAKE3 of every input in the same pass,
  evidence record).
- ``perfgate``: the library, `perfgate.tensors.compare_sources` (streamed, float64 arithmetic).
- ``perfgate_1thread``: the same on one thread (``workers=1``): the library's gain from its second thread,
  whose chunks share the interpreter lock with the first (a quiet machine tells whether it pays).
- ``numpy_floor``: the least any reader can do: ``np.fromfile`` of each tensor and the closeness test
  ``|c - r| <= atol + rtol * |r|`` in the tensors' own precision (float32; bf16 through ml_dtypes), no
  statistics, no hashing.
- ``torch``: the peer's cold process: ``safetensors.torch.load_file`` on every file, then
  ``torch.testing.assert_close`` per tensor.

Each worker reports wall time, its peak RSS (VmHWM, else ``ru_maxrss``) and its peak after imports; the
figures are medians and ranges of the repeats, and ratios of medians (time vs torch, and vs the floor).

    python benchmarks/bench_tensors.py [--size-gib 1] [--repeats 3] [--bf16-sharded] [--dir /tmp] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ATOL = 1e-5
RTOL = 1.3e-6  # float32 (torch's defaults for the dtype)
RTOL_BF16 = 1.6e-2


def tolerances(ref: Path) -> tuple[float, float]:
    """(atol, rtol) for the pair: a sharded folder is the bf16 model."""
    return (ATOL, RTOL_BF16) if ref.is_dir() else (ATOL, RTOL)


def _files(path: Path) -> list[Path]:
    return sorted(path.glob("*.safetensors")) if path.is_dir() else [path]


ROWS, COLS = 8192, 4096


def _rss_kib() -> int:
    """Peak RSS of this process so far, KiB. Linux keeps ru_maxrss across exec (a child inherits its
    parent's peak), so the per-address-space VmHWM is read where /proc has it."""
    status = Path("/proc/self/status")
    if status.exists():
        for line in status.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def write_pair(folder: Path, size_gib: float, seed: int = 0, *, bf16_shards: int = 0) -> tuple[Path, Path]:
    """Two checkpoints written block by block (never a whole file in memory): one float32 file each, or
    (``bf16_shards``) a bfloat16 model in that many shards with an index, per side."""
    itemsize = 2 if bf16_shards else 4
    tensor_bytes = ROWS * COLS * itemsize
    count = max(1, round(size_gib * 2**30 / tensor_bytes))
    names = [(f"layers.{i}.weight", ROWS) for i in range(count)]

    def pair_blocks(rng: np.random.Generator) -> Any:
        """Yields, alternately, writers of reference and candidate blocks with the same values."""
        state: dict[str, np.ndarray] = {}
        while True:

            def ref_block(rows: int) -> bytes:
                block = rng.standard_normal((rows, COLS), dtype=np.float32)
                # Within tolerance everywhere: |noise| <= 4e-6 < atol (float32); bf16 keeps the rounding.
                noise = np.clip(rng.standard_normal((rows, COLS), dtype=np.float32), -4, 4) * np.float32(1e-6)
                state["cand"] = block + noise
                return _encode(block)

            def cand_block(rows: int) -> bytes:
                return _encode(state.pop("cand"))

            yield ref_block
            yield cand_block

    def _encode(block: np.ndarray) -> bytes:
        if bf16_shards:
            import ml_dtypes

            return block.astype(ml_dtypes.bfloat16).tobytes()
        return block.tobytes()

    dtype = "BF16" if bf16_shards else "F32"
    rng = np.random.default_rng(seed)
    if not bf16_shards:
        ref_path, cand_path = folder / "reference.safetensors", folder / "candidate.safetensors"
        _write_interleaved([(ref_path, names)], [(cand_path, names)], dtype, pair_blocks(rng))
        return ref_path, cand_path
    per_shard = -(-count // bf16_shards)
    shards = [names[i : i + per_shard] for i in range(0, count, per_shard)]
    sides: list[list[tuple[Path, list[tuple[str, int]]]]] = []
    for side in ("reference", "candidate"):
        root = folder / side
        root.mkdir()
        files = [
            (root / f"model-{k + 1:05d}-of-{len(shards):05d}.safetensors", shard)
            for k, shard in enumerate(shards)
        ]
        index = {"metadata": {}, "weight_map": {n: f.name for f, shard in files for n, _ in shard}}
        (root / "model.safetensors.index.json").write_text(json.dumps(index))
        sides.append(files)
    _write_interleaved(sides[0], sides[1], dtype, pair_blocks(rng))
    return folder / "reference", folder / "candidate"


def _write_interleaved(
    ref_files: list[tuple[Path, list[tuple[str, int]]]],
    cand_files: list[tuple[Path, list[tuple[str, int]]]],
    dtype: str,
    blocks: Any,
) -> None:
    """Reference and candidate files written side by side, block for block (``blocks`` yields the writer
    of a reference block, then that of its candidate counterpart)."""
    for (ref_path, tensors), (cand_path, _same) in zip(ref_files, cand_files, strict=True):
        itemsize = 4 if dtype == "F32" else 2
        header: dict[str, Any] = {}
        offset = 0
        for name, rows in tensors:
            nbytes = rows * COLS * itemsize
            header[name] = {"dtype": dtype, "shape": [rows, COLS], "data_offsets": [offset, offset + nbytes]}
            offset += nbytes
        raw = json.dumps(header).encode()
        raw += b" " * (-(8 + len(raw)) % 8)
        with ref_path.open("wb") as ref, cand_path.open("wb") as cand:
            for f in (ref, cand):
                f.write(len(raw).to_bytes(8, "little") + raw)
            for _name, rows in tensors:
                for start in range(0, rows, 1024):
                    n = min(1024, rows - start)
                    ref.write(next(blocks)(n))
                    cand.write(next(blocks)(n))


def _figures(seconds: float, cpu_at_start: float, baseline_kib: int, nbytes: int) -> dict[str, Any]:
    """One worker's measurements: wall and CPU seconds, RSS before and at the end, bytes compared."""
    return {
        "seconds": seconds,
        "cpu_seconds": _cpu_seconds() - cpu_at_start,
        "baseline_kib": baseline_kib,
        "peak_kib": _rss_kib(),
        "bytes": nbytes,
    }


def worker_perfgate(ref: Path, cand: Path, workers: int | None = None) -> dict[str, Any]:
    from perfgate.tensors import CompareOptions, compare_sources, open_tensor_source

    if ref.is_dir():  # bfloat16: imports are outside every contender's time (the peer's torch too)
        import ml_dtypes  # noqa: F401  # pyright: ignore[reportUnusedImport]

    baseline = _rss_kib()
    cpu = _cpu_seconds()
    start = time.perf_counter()
    atol, rtol = tolerances(ref)
    with open_tensor_source(ref) as r, open_tensor_source(cand) as c:
        report = compare_sources(r, c, CompareOptions(atol=atol, rtol=rtol, workers=workers))
    seconds = time.perf_counter() - start
    assert report.status == "match", report.summary
    return _figures(seconds, cpu, baseline, report.bytes_read)


def worker_perfgate_1thread(ref: Path, cand: Path) -> dict[str, Any]:
    return worker_perfgate(ref, cand, workers=1)


def worker_perfgate_tool(ref: Path, cand: Path) -> dict[str, Any]:
    import anyio

    import perfgate.tensors  # noqa: F401  # pyright: ignore[reportUnusedImport]
    from _mcp import trust_env
    from perfgate.evidence import Ledger
    from perfgate.security.trustroot import TrustRoot
    from perfgate.serving.runtime import ServerConfig, ToolRuntime
    from perfgate.tools.compare_tensors import CompareTensorsInput, run

    if ref.is_dir():  # bfloat16: as for the library, imports are outside the time
        import ml_dtypes  # noqa: F401  # pyright: ignore[reportUnusedImport]

    workspace = ref.parent
    trust = TrustRoot.locate(env=trust_env())
    rt = ToolRuntime(
        config=ServerConfig.create(workspace, trust=trust),
        ledger=Ledger(workspace, trust),
        tool="compare_tensors",
    )
    atol, rtol = tolerances(ref)
    inp = CompareTensorsInput(reference=ref.name, candidate=cand.name, atol=atol, rtol=rtol)
    baseline = _rss_kib()
    cpu = _cpu_seconds()
    start = time.perf_counter()
    out = anyio.run(run, inp, rt)
    seconds = time.perf_counter() - start
    assert out.status == "match", out.summary
    return _figures(seconds, cpu, baseline, out.bytes_compared)


def worker_torch(ref: Path, cand: Path) -> dict[str, Any]:
    import torch
    from safetensors.torch import load_file

    atol, rtol = tolerances(ref)
    baseline = _rss_kib()
    cpu = _cpu_seconds()
    start = time.perf_counter()
    reference: dict[str, Any] = {}
    candidate: dict[str, Any] = {}
    for path in _files(ref):
        reference.update(load_file(str(path)))
    for path in _files(cand):
        candidate.update(load_file(str(path)))
    for key, expected in reference.items():
        torch.testing.assert_close(candidate[key], expected, atol=atol, rtol=rtol)
    seconds = time.perf_counter() - start
    nbytes = sum(t.numel() * t.element_size() for t in reference.values()) * 2
    return _figures(seconds, cpu, baseline, nbytes)


def worker_numpy_floor(ref: Path, cand: Path) -> dict[str, Any]:
    """The floor: read each tensor with np.fromfile and test closeness in its own precision."""
    import ml_dtypes

    atol, rtol = tolerances(ref)
    baseline = _rss_kib()
    cpu = _cpu_seconds()
    start = time.perf_counter()
    nbytes = 0
    bad = 0
    for rpath, cpath in zip(_files(ref), _files(cand), strict=True):
        header_len = int.from_bytes(rpath.open("rb").read(8), "little")
        header = json.loads(rpath.open("rb").read(8 + header_len)[8:])
        for name, meta in header.items():
            if name == "__metadata__":
                continue
            dtype = np.float32 if meta["dtype"] == "F32" else ml_dtypes.bfloat16
            begin, end = meta["data_offsets"]
            count = (end - begin) // np.dtype(dtype).itemsize
            a = np.fromfile(rpath, dtype=dtype, count=count, offset=8 + header_len + begin)
            b = np.fromfile(cpath, dtype=dtype, count=count, offset=8 + header_len + begin)
            if dtype is not np.float32:
                a, b = a.astype(np.float32), b.astype(np.float32)
            bad += int(np.count_nonzero(np.abs(b - a) > atol + rtol * np.abs(a)))
            nbytes += 2 * (end - begin)
            del a, b
    seconds = time.perf_counter() - start
    assert bad == 0
    return _figures(seconds, cpu, baseline, nbytes)


def _write_tiny(path: Path, dtype: str) -> None:
    """A safetensors file of one 1000-element tensor of ones."""
    data = (
        (np.ones(1000, dtype=np.float32).view(np.uint32) >> 16).astype(np.uint16).tobytes()
        if dtype == "BF16"
        else np.ones(1000, dtype=np.float32).tobytes()
    )
    header = json.dumps({"w": {"dtype": dtype, "shape": [1000], "data_offsets": [0, len(data)]}}).encode()
    header += b" " * (-(8 + len(header)) % 8)
    path.write_bytes(len(header).to_bytes(8, "little") + header + data)


def _mcp_call(ref: Path, cand: Path, warm: bool) -> dict[str, Any]:
    """The tool call over MCP stdio, from a fresh server (cold) or one that already answered a call."""
    import anyio
    from mcp import Client

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _mcp import perfgate_server

    atol, rtol = tolerances(ref)
    args = {"reference": ref.name, "candidate": cand.name, "atol": atol, "rtol": rtol}
    workspace = ref.parent
    small = workspace / "warmup"

    async def go() -> dict[str, Any]:
        if warm:  # the warm-up pair has the measured files' dtype, as a server that compared such files
            small.mkdir(exist_ok=True)
            dtype = "BF16" if ref.is_dir() else "F32"
            for side in ("a", "b"):
                _write_tiny(small / f"{side}.safetensors", dtype)
        start = time.perf_counter()
        async with Client(perfgate_server(workspace), mode="legacy") as client:
            if warm:
                # A valid call (atol and rtol are required): one the server refuses at validation would
                # leave the comparison's imports to the timed call.
                warmup = await client.call_tool(
                    "compare_tensors",
                    {
                        "reference": "warmup/a.safetensors",
                        "candidate": "warmup/b.safetensors",
                        "atol": 0,
                        "rtol": 0,
                    },
                )
                assert not warmup.is_error, warmup
                start = time.perf_counter()
            result = await client.call_tool("compare_tensors", args)
            seconds = time.perf_counter() - start
        assert not result.is_error, result
        structured = result.structured_content or {}
        assert structured.get("status") == "match", structured.get("summary")
        return {"seconds": seconds, "cpu_seconds": float("nan"), "baseline_kib": 0, "peak_kib": 0,
                "bytes": structured.get("bytes_compared", 0)}  # fmt: skip

    return anyio.run(go)


def worker_mcp_warm(ref: Path, cand: Path) -> dict[str, Any]:
    return _mcp_call(ref, cand, warm=True)


def worker_mcp_cold(ref: Path, cand: Path) -> dict[str, Any]:
    return _mcp_call(ref, cand, warm=False)


WORKERS = {
    "mcp_warm": worker_mcp_warm,
    "mcp_cold": worker_mcp_cold,
    "perfgate_tool": worker_perfgate_tool,
    "perfgate": worker_perfgate,
    "perfgate_1thread": worker_perfgate_1thread,
    "numpy_floor": worker_numpy_floor,
    "torch": worker_torch,
}


def run_worker(name: str, ref: Path, cand: Path) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, __file__, "--worker", name, str(ref), str(cand)],
        capture_output=True,
        text=True,
        check=False,
        timeout=1800,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"{name} worker failed:\n{proc.stderr}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--size-gib", type=float, default=1.0, help="size of each checkpoint (GiB)")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each contender, interleaved")
    parser.add_argument(
        "--bf16-sharded", action="store_true", help="a bf16 model in --shards shards per side"
    )
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--dir", type=Path, default=None, help="where to write the files (default: temp dir)")
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    parser.add_argument("--only", choices=sorted(WORKERS), action="append", help="run only these contenders")
    parser.add_argument("--worker", choices=sorted(WORKERS), help=argparse.SUPPRESS)
    parser.add_argument("paths", nargs="*", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(WORKERS[args.worker](*args.paths)))
        return

    folder = Path(tempfile.mkdtemp(prefix="perfgate-bench-tensors-", dir=args.dir))
    try:
        start = time.perf_counter()
        ref, cand = write_pair(folder, args.size_gib, bf16_shards=args.shards if args.bf16_sharded else 0)
        size = sum(p.stat().st_size for p in _files(ref))
        kind = f"bf16 model in {len(_files(ref))} shards" if args.bf16_sharded else "float32 file"
        print(f"wrote 2 x {size / 2**30:.2f} GiB ({kind}) in {time.perf_counter() - start:.1f} s to {folder}")
        names = args.only or list(WORKERS)
        runs: dict[str, list[dict[str, Any]]] = {n: [] for n in names}
        for _ in range(args.repeats):
            for name in names:
                runs[name].append(run_worker(name, ref, cand))
        results = summarize(runs)
        print_table(results)
        if args.json:
            args.json.write_text(
                json.dumps(
                    {"size_gib": args.size_gib, "kind": kind, "cpus": os.cpu_count(), "results": results},
                    indent=2,
                )
            )
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def summarize(runs: dict[str, list[dict[str, Any]]]) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for name, items in runs.items():
        seconds = [r["seconds"] for r in items]
        out[name] = {
            "seconds_median": statistics.median(seconds),
            "seconds_min": min(seconds),
            "seconds_max": max(seconds),
            "cpu_seconds_median": statistics.median(r["cpu_seconds"] for r in items),
            "throughput_gb_s": items[0]["bytes"] / statistics.median(seconds) / 1e9,
            "peak_rss_bytes": max(r["peak_kib"] for r in items) * 1024,
            "peak_rss_above_baseline_bytes": max((r["peak_kib"] - r["baseline_kib"]) for r in items) * 1024,
        }
    for row in out.values():
        if "torch" in out:
            row["speedup_vs_torch"] = out["torch"]["seconds_median"] / row["seconds_median"]
        if "numpy_floor" in out:
            row["time_vs_floor"] = row["seconds_median"] / out["numpy_floor"]["seconds_median"]
    return out


def print_table(results: dict[str, dict[str, float]]) -> None:
    print(f"{'contender':14s} {'median s':>9s} {'range s':>13s} {'GB/s':>6s} {'above base MiB':>15s} "
          f"{'x torch':>8s} {'/ floor':>8s}")  # fmt: skip
    for name, row in results.items():
        above = row["peak_rss_above_baseline_bytes"] / 2**20
        print(
            f"{name:14s} {row['seconds_median']:9.2f} {row['seconds_min']:6.2f}-{row['seconds_max']:<6.2f} "
            f"{row['throughput_gb_s']:6.2f} {above if above > 0 else float('nan'):15.0f} "
            f"{row.get('speedup_vs_torch', float('nan')):8.2f} {row.get('time_vs_floor', float('nan')):8.2f}"
        )
    print("x torch: the peer's median time / this contender's (higher is faster); / floor: this contender's "
          "median time / the numpy floor's. mcp_* rows: no RSS (measured in the client).")  # fmt: skip


if __name__ == "__main__":
    main()
