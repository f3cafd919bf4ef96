"""audit_samples at scale, side by side with a plain Python set/dict audit of the same data.

Two data sets are generated under --workdir at run time, shaped like DistributedSampler output
(uneven N, padding, shuffled epochs, per-rank files concatenated) with two planted bugs (a rank
that loses its last 1000 samples in epoch 1, a rank that re-reads 500 samples in epoch 2):

1. JSONL, --jsonl-records records (default 10M): both audits read the whole file.
2. Parquet (NPZ without pyarrow), --columnar-records records (default 100M): perfgate audits the
   whole file; the plain audit, which needs a Python object per record, runs on the file's first
   --plain-records rows (default 10M), and so does perfgate once more, for a like-for-like ratio.

Each audit runs in its own child process so its peak RSS is its own, --repeats times (default 3),
interleaved with the others, and medians (with ranges) are compared: on a shared machine all see the
same load. On the JSONL data set the audit_samples tool call over MCP stdio is timed too, as an agent
waits for it: ``mcp_warm`` (a running server, the call alone) and ``mcp_cold`` (spawn, initialize, call). Both audits must report the same counts, or the benchmark fails. Times include
reading the file. Run: python benchmarks/bench_audit.py [--quick]
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from perfgate.audit import AuditPolicy, audit_path, parquet_available

WORLD = 8
EPOCHS = 4
WORKERS = 2
BATCH = 32
LOST, REREAD = 1000, 500


def shards(n_ids: int, seed: int) -> Iterator[tuple[int, int, np.ndarray, np.ndarray]]:
    """(epoch, rank, ids, worker) per rank and epoch, ranks outermost (per-rank files concatenated)."""
    pad = -n_ids % WORLD
    orders = []
    for epoch in range(EPOCHS):
        perm = np.random.default_rng(seed + epoch).permutation(n_ids)
        orders.append(np.concatenate([perm, perm[:pad]]))
    for rank in range(WORLD):
        for epoch in range(EPOCHS):
            ids = orders[epoch][rank::WORLD]
            if epoch == 1 and rank == 2:
                ids = ids[:-LOST]
            if epoch == 2 and rank == 3:
                ids = np.concatenate([ids, ids[:REREAD]])
            worker = (np.arange(ids.shape[0]) // BATCH) % WORKERS
            yield epoch, rank, ids, worker


def ids_for(records: int) -> int:
    """Distinct ids so that the epochs hold about `records` records."""
    return max(WORLD, records // EPOCHS - 7)


def write_jsonl(path: Path, n_ids: int) -> int:
    total = 0
    with path.open("w") as f:
        for epoch, rank, ids, worker in shards(n_ids, seed=1):
            for lo in range(0, ids.shape[0], 1 << 20):
                f.write(
                    "".join(
                        f'{{"sample_id":{i},"epoch":{epoch},"rank":{rank},"worker":{w}}}\n'
                        for i, w in zip(
                            ids[lo : lo + (1 << 20)].tolist(),
                            worker[lo : lo + (1 << 20)].tolist(),
                            strict=True,
                        )
                    )
                )
            total += ids.shape[0]
    return total


def write_columnar(path: Path, n_ids: int) -> int:
    total = 0
    if path.suffix == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        schema = pa.schema(
            [("sample_id", pa.int64()), ("epoch", pa.int16()), ("rank", pa.int16()), ("worker", pa.int16())]
        )
        with pq.ParquetWriter(path, schema) as writer:
            for epoch, rank, ids, worker in shards(n_ids, seed=2):
                n = ids.shape[0]
                writer.write_table(
                    pa.table(
                        {
                            "sample_id": ids.astype(np.int64),
                            "epoch": np.full(n, epoch, np.int16),
                            "rank": np.full(n, rank, np.int16),
                            "worker": worker.astype(np.int16),
                        },
                        schema=schema,
                    ),
                    row_group_size=1 << 22,
                )
                total += n
        return total
    parts = list(shards(n_ids, seed=2))
    total = sum(p[2].shape[0] for p in parts)
    np.savez(
        path,
        sample_id=np.concatenate([p[2] for p in parts]).astype(np.int64),
        epoch=np.concatenate([np.full(p[2].shape[0], p[0], np.int16) for p in parts]),
        rank=np.concatenate([np.full(p[2].shape[0], p[1], np.int16) for p in parts]),
        worker=np.concatenate([p[3].astype(np.int16) for p in parts]),
    )
    return total


# ---- the plain audit: one Python object per record, sets and dicts --------------------------------


def plain_rows_jsonl(path: Path, limit: int | None) -> Iterator[tuple[Any, int, int, int]]:
    with path.open() as f:
        for n, line in enumerate(f):
            if limit is not None and n >= limit:
                return
            r = json.loads(line)
            yield r["sample_id"], r["epoch"], r["rank"], r["worker"]


def plain_rows_columnar(path: Path, limit: int | None) -> Iterator[tuple[Any, int, int, int]]:
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        seen = 0
        for batch in pq.ParquetFile(path).iter_batches(batch_size=1 << 20):
            cols = [batch.column(c).to_pylist() for c in ("sample_id", "epoch", "rank", "worker")]
            for row in zip(*cols, strict=True):
                if limit is not None and seen >= limit:
                    return
                seen += 1
                yield row
        return
    with np.load(path) as z:
        n = z["sample_id"].shape[0] if limit is None else limit
        yield from zip(*(z[c][:n].tolist() for c in ("sample_id", "epoch", "rank", "worker")), strict=True)


def plain_audit(rows: Iterator[tuple[Any, int, int, int]], n_expected: int) -> dict[str, Any]:
    counts: dict[int, Counter[Any]] = defaultdict(Counter)
    owners: dict[int, dict[Any, set[tuple[int, int]]]] = defaultdict(lambda: defaultdict(set))
    orders: dict[tuple[int, int], list[Any]] = defaultdict(list)
    per_rank: dict[int, Counter[int]] = defaultdict(Counter)
    for sample_id, epoch, rank, worker in rows:
        counts[epoch][sample_id] += 1
        owners[epoch][sample_id].add((rank, worker))
        orders[(epoch, rank)].append(sample_id)
        per_rank[epoch][rank] += 1
    expected = range(n_expected)
    epochs = []
    for epoch in sorted(counts):
        c = counts[epoch]
        records = sum(c.values())
        repeated_orders = sum(
            1
            for (e, r), seq in orders.items()
            if e == epoch and len(seq) > 1 and orders.get((e - 1, r)) == seq
        )
        epochs.append(
            {
                "epoch": epoch,
                "records": records,
                "unique": len(c),
                "missing": sum(1 for i in expected if i not in c),
                "extra": sum(1 for k in c if not (type(k) is int and 0 <= k < n_expected)),
                "duplicates": records - len(c),
                "cross_owner_duplicates": sum(1 for o in owners[epoch].values() if len(o) > 1),
                "repeated_orders": repeated_orders,
            }
        )
    return {"epochs": epochs}


def perfgate_audit(path: Path, n_expected: int, limit: int | None) -> dict[str, Any]:
    if limit is not None:
        path = _head(path, limit)
    report = audit_path(
        path, AuditPolicy(world_size=WORLD, allow_padding_repeats=True), expected_range=(0, n_expected)
    )
    keys = ("epoch", "records", "unique", "missing", "extra", "duplicates", "cross_owner_duplicates")
    return {
        "epochs": [{k: getattr(e, k) for k in keys} for e in report.epochs],
        "status": report.status,
        "findings": {f.kind: f.count for f in report.findings},
    }


def _head(path: Path, limit: int) -> Path:
    """The first `limit` rows of a columnar file, written next to it (not timed: see main)."""
    out = path.with_name(f"head{limit}{path.suffix}")
    assert out.exists(), f"{out} is written before the timed run"
    return out


def write_head(path: Path, limit: int) -> Path:
    out = path.with_name(f"head{limit}{path.suffix}")
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        pq.write_table(pq.ParquetFile(path).read().slice(0, limit), out)
    else:
        with np.load(path) as z:
            np.savez(out, **{k: z[k][:limit] for k in z.files})
    return out


def mcp_audit(path: Path, n_expected: int, warm: bool) -> tuple[float, dict[str, Any]]:
    """The audit_samples tool call over MCP stdio: from a fresh server (cold: spawn, initialize, the
    call) or one that already answered a call on a small file (warm: the call alone)."""
    import anyio
    from mcp import Client

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _mcp import perfgate_server

    args = {
        "observed": path.name,
        "expected_range": [0, n_expected],
        "world_size": WORLD,
        "allow_padding_repeats": True,
    }

    async def go() -> tuple[float, dict[str, Any]]:
        start = time.perf_counter()
        async with Client(perfgate_server(path.parent), mode="legacy") as client:
            if warm:
                small = path.with_name("warmup.jsonl")
                small.write_text('{"sample_id":0,"epoch":0,"rank":0,"worker":0}\n')
                await client.call_tool(
                    "audit_samples", {**args, "observed": small.name, "expected_range": [0, 1]}
                )
                start = time.perf_counter()
            result = await client.call_tool("audit_samples", args)
            seconds = time.perf_counter() - start
        assert not result.is_error, result
        return seconds, result.structured_content or {}

    return anyio.run(go)


def measure(kind: str, path: Path, n_expected: int, limit: int | None) -> dict[str, Any]:
    if kind in ("mcp_warm", "mcp_cold"):
        seconds, out = mcp_audit(path, n_expected, warm=kind == "mcp_warm")
        return {"seconds": seconds, "peak_rss_bytes": 0, "status": out.get("status")}
    start = time.perf_counter()
    if kind == "plain":
        rows = plain_rows_jsonl(path, limit) if path.suffix == ".jsonl" else plain_rows_columnar(path, limit)
        result = plain_audit(rows, n_expected)
    else:
        result = perfgate_audit(path, n_expected, limit)
    seconds = time.perf_counter() - start
    return {"seconds": seconds, "peak_rss_bytes": peak_rss_bytes(), **result}


def peak_rss_bytes() -> int:
    """This process's peak RSS. VmHWM, not ru_maxrss: after fork and exec, ru_maxrss starts at the
    parent's peak (here the generator of 100M records), which is not this audit's memory."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def child(kind: str, path: Path, n_expected: int, limit: int | None) -> dict[str, Any]:
    argv = [sys.executable, __file__, "--child", kind, str(path), str(n_expected), str(limit or 0)]
    done = subprocess.run(argv, check=True, capture_output=True, text=True)
    return json.loads(done.stdout)


def best(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The median run (its figures), with every run's time, the median and range, and the largest peak
    RSS. ``seconds`` is the median."""
    ordered = sorted(runs, key=lambda r: r["seconds"])
    middle = ordered[(len(ordered) - 1) // 2]
    times = [r["seconds"] for r in runs]
    return {
        **middle,
        "seconds": statistics.median(times),
        "seconds_min": min(times),
        "seconds_max": max(times),
        "seconds_all": times,
        "peak_rss_bytes": max(r["peak_rss_bytes"] for r in runs),
    }


def compare(
    label: str, path: Path, n_expected: int, limit: int | None, repeats: int, mcp: bool = False
) -> dict[str, Any]:
    """Both audits (and with ``mcp`` the tool call over MCP, warm and cold) `repeats` times, interleaved,
    so a busy machine slows all alike; medians and ranges."""
    kinds = ["perfgate", "plain", *(["mcp_warm", "mcp_cold"] if mcp else [])]
    runs: dict[str, list[dict[str, Any]]] = {k: [] for k in kinds}
    for _ in range(repeats):
        for kind, kind_runs in runs.items():
            kind_runs.append(child(kind, path, n_expected, limit))
    return {"label": label, **{k: best(v) for k, v in runs.items()}}


def agree(fast: dict[str, Any], plain: dict[str, Any]) -> None:
    for a, b in zip(fast["epochs"], plain["epochs"], strict=True):
        for key, value in a.items():
            assert b[key] == value, f"epoch {a['epoch']} {key}: perfgate {value}, plain {b[key]}"


def harness_overhead(workdir: Path, n: int = 2_000_000) -> dict[str, float]:
    """Nanoseconds each recorded sample adds, recorder versus the same loop without it."""
    from perfgate.harness.samples import RecordingDataset, RecordingSampler

    out = workdir / "harness"
    indices = list(range(n))
    data = list(range(n))

    def timed(fn: Any) -> float:
        start = time.perf_counter()
        fn()
        return time.perf_counter() - start

    def drain(iterable: Any) -> None:
        for _ in iterable:
            pass

    def fetch(dataset: Any) -> None:
        getitems = getattr(dataset, "__getitems__", None)
        for lo in range(0, n, BATCH):
            batch = indices[lo : lo + BATCH]
            if getitems is not None:
                getitems(batch)
            else:
                [dataset[i] for i in batch]

    plain_iter = min(timed(lambda: drain(iter(indices))) for _ in range(3))
    sampler_iter = min(timed(lambda: drain(RecordingSampler(indices, out, rank=0))) for _ in range(3))
    plain_fetch = min(timed(lambda: fetch(data)) for _ in range(3))
    dataset_fetch = min(timed(lambda: fetch(RecordingDataset(data, out, rank=0))) for _ in range(3))
    return {
        "sampler_ns_per_sample": (sampler_iter - plain_iter) / n * 1e9,
        "dataset_ns_per_sample": (dataset_fetch - plain_fetch) / n * 1e9,
    }


def gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--jsonl-records", type=int, default=10_000_000)
    parser.add_argument("--columnar-records", type=int, default=100_000_000)
    parser.add_argument("--plain-records", type=int, default=10_000_000)
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/perfgate-bench-audit"))
    parser.add_argument("--repeats", type=int, default=3, help="runs of each audit, interleaved; medians")
    parser.add_argument("--quick", action="store_true", help="1M JSONL, 4M columnar, 1M plain subset")
    parser.add_argument("--jsonl-only", action="store_true", help="skip the columnar data set")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    if args.quick:
        args.jsonl_records, args.columnar_records, args.plain_records = 1_000_000, 4_000_000, 1_000_000
    args.workdir.mkdir(parents=True, exist_ok=True)
    results: list[dict[str, Any]] = []

    n_jsonl = ids_for(args.jsonl_records)
    jsonl = args.workdir / f"records{args.jsonl_records}.jsonl"
    t = time.perf_counter()
    total = write_jsonl(jsonl, n_jsonl)
    print(
        f"wrote {total:,} JSONL records ({jsonl.stat().st_size / 2**20:.0f} MiB) in {time.perf_counter() - t:.1f} s"
    )
    run = compare("JSONL, every record, both audits", jsonl, n_jsonl, None, args.repeats, mcp=True)
    agree(run["perfgate"], run["plain"])
    results.append({**run, "records": total})

    if args.jsonl_only:
        for kind in ("perfgate", "plain", "mcp_warm", "mcp_cold"):
            row = run[kind]
            print(
                f"JSONL {total:,} records: {kind:9s} median {row['seconds']:.2f} s (range {row['seconds_min']:.2f}-"
                f"{row['seconds_max']:.2f}); plain / this: {run['plain']['seconds'] / row['seconds']:.1f}x"
            )
        if args.json:
            args.json.write_text(json.dumps({"audits": results}, indent=2))
        return
    n_col = ids_for(args.columnar_records)
    suffix = ".parquet" if parquet_available() else ".npz"
    columnar = args.workdir / f"records{args.columnar_records}{suffix}"
    t = time.perf_counter()
    total = write_columnar(columnar, n_col)
    print(
        f"wrote {total:,} {suffix} records ({columnar.stat().st_size / 2**20:.0f} MiB) in {time.perf_counter() - t:.1f} s"
    )
    write_head(columnar, args.plain_records)
    subset = compare(
        f"{suffix} first {args.plain_records:,} rows, both audits",
        columnar,
        n_col,
        args.plain_records,
        args.repeats,
    )
    agree(subset["perfgate"], subset["plain"])
    results.append({**subset, "records": args.plain_records})
    full = best([child("perfgate", columnar, n_col, None) for _ in range(args.repeats)])
    results.append(
        {"label": f"{suffix} every record, perfgate only", "perfgate": full, "plain": None, "records": total}
    )

    print()
    print(
        f"{'data':58} {'records':>12} {'perfgate s':>11} {'plain s':>9} {'ratio':>7} {'perfgate RSS':>13} {'plain RSS':>11}"
    )
    for r in results:
        fast, plain = r["perfgate"], r["plain"]
        ratio = f"{plain['seconds'] / fast['seconds']:.1f}x" if plain else "-"
        print(
            f"{r['label']:58} {r['records']:>12,} {fast['seconds']:>11.2f} "
            f"{plain['seconds'] if plain else float('nan'):>9.2f} {ratio:>7} {gib(fast['peak_rss_bytes']):>13} "
            f"{gib(plain['peak_rss_bytes']) if plain else '-':>11}"
        )
    for r in results:
        for kind in ("perfgate", "plain", "mcp_warm", "mcp_cold"):
            if r.get(kind):
                times = ", ".join(f"{s:.2f}" for s in r[kind]["seconds_all"])
                ratio = (
                    f"; {r['plain']['seconds'] / r[kind]['seconds']:.1f}x the plain audit (medians)"
                    if r.get("plain") and kind != "plain"
                    else ""
                )
                print(f"  {r['label']}: {kind} median {r[kind]['seconds']:.2f} s, runs {times} s{ratio}")
    rate = results[1]["plain"]["seconds"] / args.plain_records
    print(
        f"\nplain audit extrapolated to all {results[2]['records']:,} columnar records: "
        f"{rate * results[2]['records']:.0f} s vs perfgate {results[2]['perfgate']['seconds']:.1f} s "
        f"({rate * results[2]['records'] / results[2]['perfgate']['seconds']:.0f}x); findings: "
        f"{results[2]['perfgate']['findings']}"
    )
    overhead = harness_overhead(args.workdir)
    print(
        f"harness recording cost per sample: RecordingSampler {overhead['sampler_ns_per_sample']:.0f} ns, "
        f"RecordingDataset (batches of {BATCH}) {overhead['dataset_ns_per_sample']:.0f} ns"
    )
    if args.json:
        args.json.write_text(json.dumps({"audits": results, "harness": overhead}, indent=2))


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        kind, path, n_expected, limit = sys.argv[2], Path(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
        print(json.dumps(measure(kind, path, n_expected, limit or None)))
    else:
        main()
