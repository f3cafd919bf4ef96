"""What an agent waits for on a trace: perfgate's tool call next to HTA 0.5's cold process, side by side.

Run with perfgate's interpreter; HTA runs in its own virtual environment (it pins pandas and plotly)::

    python3 -m venv ../venv-hta && ../venv-hta/bin/pip install holistictraceanalysis==0.5.0
    python benchmarks/bench_traces.py                      # shared traces, a rank set, a 1 GB trace
    python benchmarks/bench_traces.py --skip-synthetic --rounds 5
    python benchmarks/bench_traces.py --skip-shared --ranks 0 --keep-synthetic   # part 3 only
    python benchmarks/bench_traces.py --skip-shared --ranks 0 --synthetic-file /tmp/perfgate_synthetic_X.json

Part 1, per shared trace (../shared/data/traces/hta or $PERFGATE_SHARED_DIR), in rounds whose order
rotates (interleaved, so machine load falls on every contender alike):

- ``HTA cold``: a fresh HTA interpreter (``--hta-python``, default $PERFGATE_HTA_PYTHON or
  ../venv-hta/bin/python) that imports HTA, parses the trace, and computes the temporal and kernel
  breakdowns: what a ``python -c 'from hta ...'`` costs. The child also times its own parse + breakdowns
  (``HTA lib``).
- ``tool warm``: ``analyze_trace`` through MCP over stdio on a ``perfgate serve`` started once
  (the whole call: request, analysis, findings, plot, ledger record, answer). The server keeps the parse
  of a trace it read (by content digest, `perfgate.traces.reading.parsecache`), as in a session where the agent
  analyses a trace again with other options: after the untimed first call, every timed one reads the
  kept table.
- ``tool first``: the same call on a second running server started with ``PERFGATE_TRACE_CACHE_MB=0``:
  every call reads the file, as an agent's first call on a trace does.
- ``tool cold``: a fresh ``perfgate serve`` process: spawn, initialize, the same call, exit.
- ``lib``: the library's ``analyze_trace`` in this process (a library figure, not what an agent waits for).

Each cell is the median over rounds with the range (min-max); ratios are HTA cold / tool warm, HTA cold /
tool first, HTA cold / tool cold, HTA lib / lib, per trace of medians; the summary gives their geometric
mean and the smallest over the large traces (the goal: 20x geo-mean, no trace under 15x); the first line
names the host's CPU model (the ratios move with the machine), and ``--json`` reports it with the ratios. Agreement of the temporal breakdowns (hta_compatible) is checked too.
Part 2 times a set of ``--ranks`` copies of one rank's trace read one file at a time and in parallel
worker processes. Part 3 builds a ~1 GB trace in /tmp from a real one (events replicated with shifted
timestamps, correlation ids and step numbers), analyzes it in a fresh child process and reports that
process's peak RSS (VmHWM: interpreter, imports, reading and analysis) and the analysis' CPU time.
``--hta-reference FILE`` writes HTA's temporal numbers per trace (the fixture
tests/fixtures/traces/hta_0.5_temporal.json) and exits.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))
if str(REPO / "benchmarks") not in sys.path:  # `_mcp`, when this file is loaded as a module (the tests)
    sys.path.insert(0, str(REPO / "benchmarks"))

from perfgate.hardware.cpu_peak import cpu_model  # noqa: E402
from perfgate.traces import AnalysisOptions, analyze_trace, classify_device, isal_available  # noqa: E402
from perfgate.traces.analyses.phases import phase_of_name  # noqa: E402

HTA_FIELDS = ("idle_time(us)", "compute_time(us)", "non_compute_time(us)", "kernel_time(us)")
LARGE_BYTES = 1_000_000
"""Shared traces at least this large on disk (gzip) count as large; docs/benchmarks.md's targets differ."""

_HTA_CHILD = r"""
import json, logging, sys, time, warnings
t0 = time.perf_counter()
logging.disable(logging.WARNING)
warnings.filterwarnings("ignore")
from hta.trace_analysis import TraceAnalysis
t1 = time.perf_counter()
fields = FIELDS
try:
    analysis = TraceAnalysis(trace_files={0: sys.argv[1]}, trace_dir="/")
    temporal = analysis.get_temporal_breakdown(visualize=False)
    analysis.get_gpu_kernel_breakdown(visualize=False)
    row = temporal.iloc[0]
    out = {k: float(row[k]) for k in fields}
except Exception as exc:
    out = {"error": f"{type(exc).__name__}: {str(exc)[:160]}"}
out["import_s"] = t1 - t0
out["analysis_s"] = time.perf_counter() - t1
print("HTA-RESULT " + json.dumps(out))
""".replace("FIELDS", repr(HTA_FIELDS))


def shared_traces() -> list[Path]:
    base = Path(os.environ.get("PERFGATE_SHARED_DIR", REPO.parent / "shared")) / "data" / "traces" / "hta"
    return sorted(base.glob("*.json.gz")) + sorted(base.glob("*.json")) if base.is_dir() else []


# --------------------------------------------------------------------------- HTA side (its own venv)


def find_hta_python(given: str | None) -> str | None:
    """An interpreter that imports HTA: ``given``, $PERFGATE_HTA_PYTHON, ../venv-hta, or this one."""
    candidates = [
        given,
        os.environ.get("PERFGATE_HTA_PYTHON"),
        str(REPO.parent / "venv-hta" / "bin" / "python"),
    ]
    candidates.append(sys.executable)
    for candidate in candidates:
        if not candidate or not Path(candidate).exists():
            continue
        ok = subprocess.run([candidate, "-c", "import hta"], capture_output=True, check=False)
        if ok.returncode == 0:
            return candidate
    return None


def run_hta_cold(python: str, path: Path) -> tuple[float, float, dict[str, Any]]:
    """(wall s of the whole process, its CPU s, what the child reported)."""
    before = os.times()
    start = time.perf_counter()
    proc = subprocess.run([python, "-c", _HTA_CHILD, str(path)], capture_output=True, text=True, check=False)
    wall = time.perf_counter() - start
    after = os.times()
    cpu = (after.children_user - before.children_user) + (after.children_system - before.children_system)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("HTA-RESULT ")]
    if not lines:
        return wall, cpu, {"error": f"exit {proc.returncode}: {proc.stderr.strip()[-160:]}"}
    return wall, cpu, json.loads(lines[-1][len("HTA-RESULT ") :])


def write_hta_reference(python: str, out: Path) -> None:
    """Record HTA's temporal breakdown for every shared trace (numbers or the error it raised)."""
    version = subprocess.run(
        [python, "-c", "import importlib.metadata as m; print(m.version('holistictraceanalysis'))"],
        capture_output=True, text=True, check=False,
    ).stdout.strip() or "0.5.0"  # fmt: skip
    doc: dict[str, Any] = {
        "source": f"holistictraceanalysis {version}: "
        "TraceAnalysis(trace_files={0: path}).get_temporal_breakdown(visualize=False), default settings",
        "units": "microseconds",
        "traces": {},
    }
    for path in shared_traces():
        _, _, got = run_hta_cold(python, path)
        got.pop("import_s", None)
        got.pop("analysis_s", None)
        doc["traces"][path.name] = got
        print(path.name, got, flush=True)
    out.write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")


# --------------------------------------------------------------------------- perfgate side, over MCP


def _server_params(read_root: Path, workspace: Path, **extra_env: str) -> Any:
    from mcp import StdioServerParameters

    from _mcp import trust_env

    env = {k: v for k, v in os.environ.items() if k.startswith("PERFGATE_")} | trust_env() | extra_env
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "src"), *filter(None, [os.environ.get("PYTHONPATH")])])
    return StdioServerParameters(
        command=sys.executable,
        args=["-m", "perfgate", "serve", "--workspace", str(workspace), "--read-root", str(read_root)],
        env=env,
    )


def _check(result: Any) -> None:
    if result.is_error:
        raise RuntimeError(f"analyze_trace failed: {result.content}")


def _children_cpu() -> float:
    t = os.times()
    return t.children_user + t.children_system


def _proc_cpu(pid: int) -> float:
    """CPU seconds (user + system) a live process and its descendants have used, from /proc: its own,
    its reaped children's, and the same for each live child (a worker server's exited workers are in its
    reaped children), so a call's work in worker processes counts too."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:  # exited meanwhile
        return 0.0
    total = sum(int(fields[i]) for i in (11, 12, 13, 14)) / os.sysconf("SC_CLK_TCK")
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            children = (task / "children").read_text().split()
        except OSError:
            continue
        total += sum(_proc_cpu(int(c)) for c in children)
    return total


def _child_pids() -> set[int]:
    pids: set[int] = set()
    for task in Path("/proc/self/task").iterdir():
        try:
            pids.update(int(p) for p in (task / "children").read_text().split())
        except OSError:
            continue
    return pids


async def tool_cold(params: Any, paths: Sequence[Path]) -> tuple[float, float]:
    """Spawn a server, initialize, one analyze_trace call, exit: (wall s, CPU s of the server)."""
    from mcp import Client

    cpu0 = _children_cpu()
    start = time.perf_counter()
    async with Client(params, mode="legacy") as client:
        _check(await client.call_tool("analyze_trace", {"trace_paths": [str(p) for p in paths]}))
    return time.perf_counter() - start, _children_cpu() - cpu0


async def tool_warm(client: Any, server_pid: int | None, paths: Sequence[Path]) -> tuple[float, float]:
    """One analyze_trace call on a running server: (wall s, CPU s the server and its worker processes spent; NaN if unknown)."""
    cpu0 = _proc_cpu(server_pid) if server_pid else float("nan")
    start = time.perf_counter()
    _check(await client.call_tool("analyze_trace", {"trace_paths": [str(p) for p in paths]}))
    wall = time.perf_counter() - start
    return wall, (_proc_cpu(server_pid) - cpu0) if server_pid else float("nan")


def library(path: Path) -> tuple[float, float]:
    # Kernel and op name classifications are cached across calls; start cold each run for fairness.
    classify_device.cache_clear()
    phase_of_name.cache_clear()
    cpu0 = time.process_time()
    start = time.perf_counter()
    analyze_trace(path)
    return time.perf_counter() - start, time.process_time() - cpu0


# --------------------------------------------------------------------------- statistics and tables


@dataclass
class Series:
    values: list[float] = field(default_factory=list[float])

    @property
    def median(self) -> float:
        return statistics.median(self.values) if self.values else float("nan")

    def cell(self, scale: float = 1.0, fmt: str = "{:.3f}") -> str:
        if not self.values:
            return "-"
        lo, hi = min(self.values) * scale, max(self.values) * scale
        return f"{fmt.format(self.median * scale)} ({fmt.format(lo)}-{fmt.format(hi)})"


def ratio(a: Series, b: Series) -> float | None:
    if not a.values or not b.values or not b.median > 0:
        return None
    return a.median / b.median


def _x(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}x"


def agreement(ours: Any, hta: dict[str, float]) -> float:
    """Largest difference of idle/compute/non-compute/span, as a fraction of HTA's span."""
    mine = (ours.idle_us, ours.compute_us, ours.non_compute_us, ours.span_us)
    span = max(hta["kernel_time(us)"], 1e-9)
    return max(abs(a - hta[k]) for a, k in zip(mine, HTA_FIELDS, strict=True)) / span


def rotate(items: list[str], k: int) -> list[str]:
    k %= len(items)
    return items[k:] + items[:k]


# --------------------------------------------------------------------------- part 1: shared traces


CONTENDERS = ("hta", "warm", "first", "cold", "lib")


@dataclass
class TraceRow:
    path: Path
    wall: dict[str, Series] = field(default_factory=lambda: {k: Series() for k in CONTENDERS})
    cpu: dict[str, Series] = field(default_factory=lambda: {k: Series() for k in CONTENDERS})
    hta_lib: Series = field(default_factory=Series)
    hta_error: str | None = None
    agree: float | None = None

    @property
    def large(self) -> bool:
        return self.path.stat().st_size >= LARGE_BYTES

    @property
    def hta_read(self) -> bool:
        return bool(self.wall["hta"].values)


async def measure_traces(
    traces: Sequence[Path], rounds: int, hta_python: str | None, log: Callable[[str], None] = print
) -> list[TraceRow]:
    """Interleaved rounds over every trace and contender (see the module docstring)."""
    from mcp import Client

    rows = [TraceRow(p) for p in traces]
    if not rows:
        return rows
    with tempfile.TemporaryDirectory(prefix="perfgate-bench-ws-") as ws:
        params = _server_params(traces[0].parent, Path(ws))
        uncached = _server_params(traces[0].parent, Path(ws), PERFGATE_TRACE_CACHE_MB="0")
        async with AsyncExitStack() as stack:
            servers: dict[str, tuple[Any, int | None]] = {}
            for who, server in (("warm", params), ("first", uncached)):
                before = _child_pids()
                client = await stack.enter_async_context(Client(server, mode="legacy"))
                started = _child_pids() - before
                servers[who] = client, next(iter(started)) if len(started) == 1 else None
            for row in rows:  # warm the OS page cache and the servers' imports before timing
                for client, pid in servers.values():
                    await tool_warm(client, pid, [row.path])
            contenders = ["warm", "first", "cold", "lib"] + (["hta"] if hta_python else [])
            for r in range(rounds):
                for i, row in enumerate(rows):
                    for who in rotate(contenders, r + i):
                        if who in servers:
                            got = await tool_warm(*servers[who], [row.path])
                        elif who == "cold":
                            got = await tool_cold(params, [row.path])
                        elif who == "lib":
                            got = library(row.path)
                        else:
                            if hta_python is None or row.hta_error is not None:
                                continue
                            wall, cpu, out = run_hta_cold(hta_python, row.path)
                            if "error" in out:
                                row.hta_error = str(out["error"])
                                continue
                            got = (wall, cpu)
                            row.hta_lib.values.append(float(out["analysis_s"]))
                            if row.agree is None:
                                rounded = analyze_trace(row.path, AnalysisOptions(time_basis="hta_rounded"))
                                row.agree = agreement(rounded, out)
                        row.wall[who].values.append(got[0])
                        row.cpu[who].values.append(got[1])
                log(f"round {r + 1}/{rounds} done")
    return rows


def geomean(values: Sequence[float]) -> float:
    return math.exp(statistics.fmean(math.log(v) for v in values)) if values else float("nan")


def ratios(rows: Sequence[TraceRow], a: str, b: str, kind: str = "wall") -> dict[str, float]:
    """Per trace HTA reads: the ratio of the medians of contenders ``a`` and ``b``."""
    table = "wall" if kind == "wall" else "cpu"
    out: dict[str, float] = {}
    for r in rows:
        got = ratio(getattr(r, table)[a], getattr(r, table)[b]) if r.hta_read else None
        if got is not None:
            out[r.path.name] = got
    return out


def goals(rows: Sequence[TraceRow]) -> dict[str, Any]:
    """The large traces' ratios to HTA's cold process, warm (parse kept) and first read: geometric mean,
    smallest, per trace; and whether the goal (20x geo-mean, none under 15x) is met."""
    large = [r for r in rows if r.large]
    out: dict[str, Any] = {"traces": len([r for r in large if r.hta_read]), "cpu_model": cpu_model()}
    for who in ("warm", "first", "cold"):
        per = ratios(large, "hta", who)
        values = list(per.values())
        out[who] = {
            "geomean": geomean(values),
            "min": min(values, default=float("nan")),
            "per_trace": per,
            "met": bool(values) and geomean(values) >= 20 and min(values) >= 15,
        }
    return out


def print_traces(rows: Sequence[TraceRow]) -> None:
    print(
        "\nwall seconds, median (min-max) over rounds; CPU seconds (user + system of the processes doing the work)"
    )
    head = (f"{'trace':30} {'MB':>5} | {'HTA cold':>20} {'tool warm':>20} {'tool first':>20} {'tool cold':>20} | "
            f"{'HTA/warm':>8} {'HTA/1st':>8} {'HTA/cold':>8} | {'CPU HTA':>7} {'warm':>6} {'first':>6} {'HTA/1st':>8} | "
            f"{'HTA lib':>7} {'lib':>6} {'lib x':>6} | agree")  # fmt: skip
    print(head)
    print("-" * len(head))
    for row in rows:
        w, c = row.wall, row.cpu
        hta = w["hta"].cell() if row.hta_read else (f"fails: {row.hta_error}"[:20] if row.hta_error else "-")
        print(
            f"{row.path.name[:30]:30} {row.path.stat().st_size / 1e6:5.2f} | {hta:>20} {w['warm'].cell():>20} "
            f"{w['first'].cell():>20} {w['cold'].cell():>20} | {_x(ratio(w['hta'], w['warm'])):>8} "
            f"{_x(ratio(w['hta'], w['first'])):>8} {_x(ratio(w['hta'], w['cold'])):>8} | "
            f"{c['hta'].median:7.2f} {c['warm'].median:6.2f} {c['first'].median:6.2f} {_x(ratio(c['hta'], c['first'])):>8} | "
            f"{row.hta_lib.median:7.3f} {w['lib'].median:6.3f} {_x(ratio(row.hta_lib, w['lib'])):>6} | "
            f"{'-' if row.agree is None else f'{row.agree:.2%}'}"
        )  # fmt: skip
    for label, group in (
        ("large (>= 1 MB gz)", [r for r in rows if r.large]),
        ("small", [r for r in rows if not r.large]),
    ):
        if not any(r.hta_read for r in group):
            continue

        def summary(b: str, kind: str = "wall", group: list[TraceRow] = group) -> str:
            values = list(ratios(group, "hta", b, kind).values())
            return f"geo-mean {geomean(values):.1f}x (range {min(values):.1f}-{max(values):.1f}x)"

        lib = [r.hta_lib.median / r.wall["lib"].median for r in group if r.hta_read]
        print(
            f"{label}, {len(lib)} traces HTA reads: HTA cold / tool warm {summary('warm')}; HTA cold / tool first "
            f"{summary('first')}; HTA cold / tool cold {summary('cold')}; CPU: HTA cold / tool warm "
            f"{summary('warm', 'cpu')}, HTA cold / tool first {summary('first', 'cpu')}; library figure "
            f"(in-process analysis, HTA lib / lib): geo-mean {geomean(lib):.1f}x (range {min(lib):.1f}-{max(lib):.1f}x)"
        )  # fmt: skip


# --------------------------------------------------------------------------- part 2: a rank set


def _forkserver_children_cpu() -> float:
    """CPU seconds of the exited worker processes of this process's forkserver (it reaps them)."""
    total = 0.0
    for pid in _child_pids():
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if b"forkserver" in cmdline:
            total += (int(fields[13]) + int(fields[14])) / os.sysconf("SC_CLK_TCK")
    return total


def bench_ranks(source: Path, ranks: int, rounds: int) -> None:
    """A set of ``ranks`` copies of ``source``: one file at a time vs the worker pool (library figures)."""
    from perfgate.traces.pool import analyze_many, worker_count

    folder = Path(tempfile.mkdtemp(prefix="perfgate-bench-ranks-"))
    try:
        paths = []
        for r in range(ranks):
            paths.append(folder / f"rank{r}{''.join(source.suffixes)}")
            shutil.copy(source, paths[-1])
        serial, parallel, busy = Series(), Series(), Series()
        for k in range(rounds):
            for who in rotate(["serial", "parallel"], k):
                cpu0, workers0 = time.process_time(), _forkserver_children_cpu()
                start = time.perf_counter()
                analyze_many(paths, workers=1 if who == "serial" else None)
                wall = time.perf_counter() - start
                (serial if who == "serial" else parallel).values.append(wall)
                if who == "parallel":
                    cpu = time.process_time() - cpu0 + _forkserver_children_cpu() - workers0
                    busy.values.append(cpu / wall)
        workers = worker_count(paths)
        print(
            f"\n{ranks} ranks of {source.name} ({source.stat().st_size / 1e6:.1f} MB gz each), library: one file at a "
            f"time {serial.cell()} s; {workers} worker processes {parallel.cell()} s ({_x(ratio(serial, parallel))}), "
            f"CPU-busy cores while parallel {busy.cell(fmt='{:.2f}')} of {len(os.sched_getaffinity(0))} usable "
            f"(load average {os.getloadavg()[0]:.1f})"
        )  # fmt: skip
    finally:
        shutil.rmtree(folder, ignore_errors=True)


# --------------------------------------------------------------------------- synthetic 1 GB


_STEP = re.compile(r"ProfilerStep#(\d+)")


def make_synthetic(source: Path, target: Path, target_bytes: int) -> tuple[int, int]:
    """Replicate ``source``'s events (shifted in time, ids and step numbers) until ``target_bytes``.

    Returns (events written, bytes written). Written in a streaming way, one replica at a time.
    """
    import gzip

    import msgspec

    with gzip.open(source, "rb") if source.name.endswith(".gz") else source.open("rb") as fh:
        doc = msgspec.json.decode(fh.read())
    events: list[dict[str, Any]] = doc["traceEvents"]
    header = {k: v for k, v in doc.items() if k != "traceEvents"}
    del doc
    timed = [e for e in events if isinstance(e.get("ts"), int | float)]
    t0 = min(e["ts"] for e in timed)
    span = max(e["ts"] + (e.get("dur") or 0) for e in timed) - t0 + 1000.0
    steps = [int(m.group(1)) for e in events if (m := _STEP.search(str(e.get("name", ""))))]
    step_stride = (max(steps) + 1) if steps else 0
    ids = [
        e["args"]["correlation"]
        for e in events
        if isinstance(e.get("args"), dict) and "correlation" in e["args"]
    ]
    id_stride = (max(ids) + 1) if ids else 0
    encode = msgspec.json.Encoder().encode
    written = count = 0
    with target.open("wb") as out:
        head = encode(header)[:-1] + b', "traceEvents": [\n'
        out.write(head)
        written += len(head)
        k = 0
        while written < target_bytes:
            shift = k * span
            chunk: list[bytes] = []
            for e in events:
                e2 = dict(e)
                if isinstance(e2.get("ts"), int | float):
                    e2["ts"] = e2["ts"] + shift
                if e2.get("ph") in ("s", "f") and isinstance(e2.get("id"), int):
                    e2["id"] = e2["id"] + k * id_stride
                args = e2.get("args")
                if isinstance(args, dict) and "correlation" in args:
                    e2["args"] = {**args, "correlation": args["correlation"] + k * id_stride}
                name = e2.get("name")
                if step_stride and isinstance(name, str) and name.startswith("ProfilerStep#"):
                    e2["name"] = f"ProfilerStep#{int(name[13:]) + k * step_stride}"
                chunk.append(encode(e2))
            blob = (b",\n" if k else b"") + b",\n".join(chunk)
            out.write(blob)
            written += len(blob)
            count += len(chunk)
            k += 1
        tail = b'\n], "traceName": "synthetic"}\n'
        out.write(tail)
        written += len(tail)
    return count, written


_CHILD = """
import re, resource, sys, time
from pathlib import Path
sys.path.insert(0, {src!r})
from perfgate.traces import analyze_trace
t0, c0 = time.perf_counter(), time.process_time()
p = analyze_trace(Path({path!r}))
dt, cpu = time.perf_counter() - t0, time.process_time() - c0
# VmHWM is this process's own peak (ru_maxrss can carry the parent's RSS over fork + exec).
try:
    status = Path("/proc/self/status").read_text()
    rss = int(re.search(r"VmHWM:\\s*(\\d+) kB", status).group(1)) * 1024
except (OSError, AttributeError):
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print(dt, rss, p.event_counts["events"], p.span_us, p.compute_us, len(p.steps.steps) if p.steps else 0, cpu)
"""


def bench_synthetic(target_gb: float, keep: bool, existing: Path | None = None) -> None:
    """Part 3 on a trace built here, or on ``existing`` (a file an earlier ``--keep-synthetic`` left)."""
    if existing is not None:
        path, keep = existing, True
        size = path.stat().st_size
        print(f"\nsynthetic trace: {size / 1e9:.2f} GB at {path} (given)")
    else:
        traces = {p.name: p for p in shared_traces()}
        source = traces.get("df_index_resolver_df_index_resolver.json.gz") or next(
            iter(traces.values()), None
        )
        if source is None:
            print("no shared trace to replicate: part 3 skipped")
            return
        fd, name = tempfile.mkstemp(prefix="perfgate_synthetic_", suffix=".json", dir="/tmp")
        os.close(fd)
        path = Path(name)
        size = 0
    try:
        if existing is None:
            t0 = time.perf_counter()
            # Built in a child process, so this process stays small while the analysis child runs.
            made = subprocess.run(
                [
                    sys.executable,
                    __file__,
                    "--make-synthetic",
                    str(source),
                    str(path),
                    str(int(target_gb * 1e9)),
                ],
                capture_output=True,
                text=True,
                check=True,
            ).stdout.split()
            events, size = int(made[0]), int(made[1])
            print(f"\nsynthetic trace: {size / 1e9:.2f} GB, {events:,} events from {source.name} "
                  f"(built in {time.perf_counter() - t0:.0f} s) at {path}")  # fmt: skip
        out = subprocess.run(
            [sys.executable, "-c", _CHILD.format(src=str(REPO / "src"), path=str(path))],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()
        seconds, rss, cpu = float(out[0]), int(out[1]), float(out[6])
        print(f"{'analysis wall time':24} {seconds:8.1f} s  ({size / 1e6 / seconds:.0f} MB/s of JSON; "
              f"CPU {cpu:.1f} s, load average {os.getloadavg()[0]:.1f})")  # fmt: skip
        print(
            f"{'peak RSS (child)':24} {rss / 2**20:8.0f} MiB  ({rss / size:.3f} x the file size; goal <= 0.30 x)"
        )
        print(f"{'events / steps':24} {int(out[2]):,} / {out[5]}")
    finally:
        if not keep:
            path.unlink(missing_ok=True)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--rounds", type=int, default=3, help="interleaved rounds per trace (median and range)"
    )
    parser.add_argument("--hta-python", help="interpreter with HTA installed (default: see the docstring)")
    parser.add_argument(
        "--only", nargs="*", default=[], help="shared traces whose name contains one of these"
    )
    parser.add_argument("--skip-shared", action="store_true")
    parser.add_argument("--ranks", type=int, default=8, help="rank files in part 2 (0 skips it)")
    parser.add_argument(
        "--ranks-source", default="df_index_resolver", help="shared trace copied per rank in part 2"
    )
    parser.add_argument("--skip-synthetic", action="store_true")
    parser.add_argument("--synthetic-gb", type=float, default=1.0)
    parser.add_argument("--keep-synthetic", action="store_true", help="leave the synthetic file in /tmp")
    parser.add_argument(
        "--synthetic-file", type=Path, help="part 3 on this file (kept) instead of building one"
    )
    parser.add_argument("--hta-reference", type=Path, help="write HTA's temporal numbers per trace and exit")
    parser.add_argument("--json", type=Path, help="write the large traces' ratios to HTA (`goals`) here")
    parser.add_argument(
        "--make-synthetic", nargs=3, metavar=("SOURCE", "TARGET", "BYTES"), help=argparse.SUPPRESS
    )
    args = parser.parse_args()
    if args.make_synthetic is not None:
        source, target, size = args.make_synthetic
        print(*make_synthetic(Path(source), Path(target), int(size)))
        return
    hta_python = find_hta_python(args.hta_python)
    if args.hta_reference is not None:
        if hta_python is None:
            sys.exit("HTA is not importable: pass --hta-python (an interpreter with holistictraceanalysis)")
        write_hta_reference(hta_python, args.hta_reference)
        return
    traces = [p for p in shared_traces() if not args.only or any(o in p.name for o in args.only)]
    print(
        f"machine: {cpu_model() or 'unknown CPU model'}, {os.cpu_count()} CPUs "
        f"({len(os.sched_getaffinity(0))} usable), load average "
        f"{os.getloadavg()[0]:.1f} at start; HTA: {hta_python or 'not found (perfgate figures only)'}; "
        f"gunzip: {'python-isal' if isal_available() else 'zlib (python-isal not importable)'}"
    )
    if not args.skip_shared:
        if not traces:
            print("shared traces not found (set PERFGATE_SHARED_DIR): parts 1 and 2 skipped")
        else:
            import anyio

            rows = anyio.run(measure_traces, traces, args.rounds, hta_python)
            print_traces(rows)
            if args.json is not None:
                args.json.write_text(json.dumps(goals(rows), indent=2) + "\n")
    if args.ranks and traces:
        source = next((p for p in traces if args.ranks_source in p.name), traces[0])
        bench_ranks(source, args.ranks, args.rounds)
    if not args.skip_synthetic:
        bench_synthetic(args.synthetic_gb, args.keep_synthetic, args.synthetic_file)


if __name__ == "__main__":
    main()
