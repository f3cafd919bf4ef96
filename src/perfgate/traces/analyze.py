"""Facade: read one trace file (one rank) and produce its profile; `perfgate.traces.traceset` compares ranks."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from perfgate.helpers.deadline import DEFAULT_MAX_TRACE_EVENTS, EVENTS_HOW, checkpoint
from perfgate.traces.analyses.backends import backends_seen
from perfgate.traces.analyses.code import code_view
from perfgate.traces.analyses.host import launch_stats, sync_stats
from perfgate.traces.analyses.idle import idle_breakdown
from perfgate.traces.analyses.kernels import category_stats, top_kernels
from perfgate.traces.analyses.ops import flops_summary, top_ops
from perfgate.traces.analyses.phases import host_breakdown
from perfgate.traces.analyses.sequences import frequent_sequences
from perfgate.traces.analyses.steps import step_summary
from perfgate.traces.analyses.temporal import temporal_breakdown
from perfgate.traces.errors import TraceError, TraceTooLargeError
from perfgate.traces.models import (
    Backend,
    OpEfficiencySummary,
    RankProfile,
    RankSource,
    TimeBasis,
)
from perfgate.traces.reading._events import Header
from perfgate.traces.reading._group import I64, unique_counts
from perfgate.traces.reading._memory import TRIM_EVERY_BYTES, TRIM_ROWS, release_free_memory
from perfgate.traces.reading._np import int_list
from perfgate.traces.reading.prepare import Prepared, prepare
from perfgate.traces.reading.reader import (
    DEFAULT_CHUNK_BYTES,
    DEFAULT_MAX_VALUE_BYTES,
    DEFAULT_READ_BLOCK,
    NEW_PART,
    Decompressor,
    TraceStream,
)
from perfgate.traces.reading.table import (
    CPU_OP_CATEGORIES,
    DEVICE_CATEGORIES,
    HOST_CALL_CATEGORIES,
    IGNORED_CATEGORIES,
    EventTable,
    TableBuilder,
)

__all__ = [
    "TRACE_SUFFIXES",
    "UNHELD",
    "AnalysisOptions",
    "analyze_trace",
    "discover_trace_files",
    "load_table",
]

TRACE_SUFFIXES = (".json", ".json.gz")
_RANK_IN_NAME = re.compile(r"rank[-_]?(\d+)", re.IGNORECASE)


@dataclass(frozen=True)
class AnalysisOptions:
    """Knobs of the analyses.

    ``time_basis``: ``exact`` keeps the trace's timestamps; ``hta_rounded`` rounds each event to
    whole microseconds like HTA 0.5 (for cross-checking). ``include_last_step`` keeps the last
    ProfilerStep in the window. ``short_kernel_us``: kernels shorter than this are "short".
    ``max_event_bytes`` caps the size of one JSON event (larger ones are reported as errors);
    ``max_events`` the number of events read from one file (checked batch by batch while reading).
    ``chunk_bytes`` and ``read_block_bytes`` size the batches (see `TraceStream`).
    """

    top_k: int = 10
    time_basis: TimeBasis = "exact"
    include_last_step: bool = False
    short_kernel_us: float = 10.0
    chunk_bytes: int = DEFAULT_CHUNK_BYTES
    max_event_bytes: int = DEFAULT_MAX_VALUE_BYTES
    max_events: int = DEFAULT_MAX_TRACE_EVENTS
    events_how: str = EVENTS_HOW
    """What the refusal of more than ``max_events`` events says to do (the limit it comes from)."""
    decompressor: Decompressor = "auto"
    read_block_bytes: int = DEFAULT_READ_BLOCK


def discover_trace_files(paths: Iterable[Path]) -> list[Path]:
    """Expand folders into the trace files directly inside them; keep files as given, in order.

    Raises:
        TraceError: a folder holds no ``.json``/``.json.gz`` file, or a path does not exist.
    """
    out: list[Path] = []
    for path in paths:
        if path.is_dir():
            found = sorted(
                p for p in path.iterdir() if p.is_file() and p.name.lower().endswith(TRACE_SUFFIXES)
            )
            if not found:
                raise TraceError(f"{path}: no .json or .json.gz trace files in this folder")
            out.extend(found)
        elif path.is_file():
            out.append(path)
        else:
            raise TraceError(f"{path}: no such file or folder")
    seen: set[Path] = set()
    return [p for p in out if not (p in seen or seen.add(p))]


def load_table(
    path: Path, options: AnalysisOptions = AnalysisOptions()
) -> tuple[EventTable, Header, TraceStream]:
    """Stream one trace file into an `EventTable`.

    Raises:
        TraceFormatError, TraceTooLargeError: see `TraceStream`; TraceTooLargeError also for more than
            ``options.max_events`` events, raised at the batch that passes the limit.
        OSError: the file cannot be read.
        DeadlineExceeded: the parsing deadline passed (see `perfgate.helpers.deadline`).
    """
    stream = part_stream(path, options)
    builder = load_part(stream, options)
    table = builder.build()
    if stream.decoded_bytes >= TRIM_EVERY_BYTES:
        release_free_memory()
    return table, stream.header, stream


def part_stream(
    path: Path, options: AnalysisOptions, skip_before: int = 0, stop_at: int | None = None
) -> TraceStream:
    """A `TraceStream` of ``path`` with the options' sizes, reading the part between ``skip_before`` and
    ``stop_at`` (see `TraceStream`; the whole file by default)."""
    return TraceStream(
        path,
        chunk_bytes=options.chunk_bytes,
        max_value_bytes=options.max_event_bytes,
        decompressor=options.decompressor,
        read_block=options.read_block_bytes,
        skip_before=skip_before,
        stop_at=stop_at,
    )


def load_part(stream: TraceStream, options: AnalysisOptions) -> TableBuilder:
    """The events ``stream`` reads, in a `TableBuilder` not yet built; raises as `load_table`."""
    (builder,) = load_parts(stream, options)
    return builder


def load_parts(
    stream: TraceStream, options: AnalysisOptions, builders: list[TableBuilder] | None = None
) -> list[TableBuilder]:
    """The events ``stream`` reads, a `TableBuilder` per part (a new one after each `NEW_PART`, see
    `TraceStream`), appended to ``builders`` (which holds the parts read so far when this raises);
    raises as `load_table` (the events are counted over all the parts)."""
    path = stream.path
    builder = TableBuilder()
    builders = [] if builders is None else builders
    builders.append(builder)
    events = 0
    trimmed_at = 0
    for seen, batch in stream.complete_batches():
        if batch is NEW_PART:
            builder = TableBuilder()
            builders.append(builder)
            continue
        events += seen
        if events > options.max_events:
            raise TraceTooLargeError(
                f"{path}: more than {options.max_events} events (read {events} by byte "
                f"{stream.decoded_bytes} of the decompressed JSON): {options.events_how}; or capture a "
                "shorter window (fewer profiler steps)"
            )
        builder.add(batch, seen)
        checkpoint()
        if stream.decoded_bytes - trimmed_at >= TRIM_EVERY_BYTES:
            release_free_memory()
            trimmed_at = stream.decoded_bytes
    return builders


def _rank(header: Header, path: Path) -> tuple[int, RankSource, int | None]:
    info: Any = header.distributed_info
    world: int | None = None
    if isinstance(info, dict):
        raw_world = info.get("world_size")  # pyright: ignore[reportUnknownMemberType, reportUnknownVariableType]
        world = raw_world if isinstance(raw_world, int) else None
        raw_rank = info.get("rank")  # pyright: ignore[reportUnknownMemberType, reportUnknownVariableType]
        if isinstance(raw_rank, int):
            return raw_rank, "distributedInfo", world
    match = _RANK_IN_NAME.search(path.name)
    if match:
        return int(match.group(1)), "file_name", world
    return 0, "default", world


def _backend(table: EventTable, host_ids: I64) -> Backend:
    cats = table.category_counts
    host_names = {table.names[i] for i in int_list(host_ids)}
    if any(c.startswith("mtia") for c in cats):
        return "mtia"
    if any(n.startswith("hip") for n in host_names):
        return "rocm"
    if any(n.startswith("musa") for n in host_names):
        return "musa"
    if cats.get("privateuse1_runtime") or cats.get("privateuse1_driver"):
        return "privateuse1"
    if cats.get("xpu_runtime") or cats.get("xpu_driver"):
        return "xpu"
    if any(c in cats for c in ("cuda_runtime", "cuda_driver", "Runtime")):
        return "cuda"
    if len(table.device) == 0:
        return "cpu"
    return "unknown"


def _device_name(header: Header, table: EventTable, backend: Backend) -> str:
    props: Any = header.device_properties
    names: dict[int, str] = {}
    if isinstance(props, list):
        for entry in props:  # pyright: ignore[reportUnknownVariableType]
            if isinstance(entry, dict):
                ident, name = entry.get("id"), entry.get("name")  # pyright: ignore[reportUnknownMemberType, reportUnknownVariableType]
                if isinstance(ident, int) and isinstance(name, str):
                    names[ident] = name
    devices = table.device.i("device") if len(table.device) else np.empty(0, np.int64)
    devices = devices[devices >= 0]
    if devices.size:
        values, counts = unique_counts(devices)
        used = int(values[np.argmax(counts)])
        if used in names:
            return names[used]
    if names:
        return names[min(names)]
    return {"cpu": "CPU", "unknown": "unknown device"}.get(backend, backend.upper())


UNHELD = "beyond the 64-bit integer range"
"""How a warning says an id argument could not be held exactly (`perfgate.traces.traceset` lists those first)."""
_UNHELD_MEANS = {
    "correlation": "their kernels and runtime calls are not paired with each other (launch statistics omit them)",
    "stream": "their stream is unknown (a cuda_sync among them counts as a host wait)",
    "device": "their device is unknown",
}


class ReadFacts(Protocol):
    """What the analysis reads of how a trace was read: a `TraceStream`, or a parsed trace kept for later
    calls (`perfgate.traces.reading.parsecache.Parsed`)."""

    @property
    def decoded_bytes(self) -> int: ...
    @property
    def lenient_skipped(self) -> int: ...


def _warnings(table: EventTable, device_events: int, prepared: Prepared, stream: ReadFacts) -> list[str]:
    out: list[str] = []
    # First: a wrong id would pair kernels with the wrong launch; these events are unpaired instead.
    for arg, (count, first) in table.unheld_ints.items():
        out.append(
            f"args.{arg} of {count} event{'s' if count != 1 else ''} is {UNHELD} (e.g. {first}): it cannot "
            f"be held exactly and is read as absent, so {_UNHELD_MEANS.get(arg, 'those events lack it')}"
        )
    if device_events == 0:
        out.append(
            "no device activity in this trace (a CPU-only capture, or device activities were not enabled): "
            "the temporal breakdown is empty; only host-side results apply"
        )
    elif len(prepared.device) == 0:
        out.append("no device activity inside the analysis window; try include_last_step=true")
    if prepared.step_numbers.size == 1:
        out.append(
            "a single ProfilerStep: the whole trace was analyzed, per-step statistics rest on one step"
        )
    elif prepared.step_numbers.size == 0:
        out.append(
            "no ProfilerStep annotations: the whole trace was analyzed and there are no per-step times"
        )
    if table.dropped_without_time:
        out.append(f"{table.dropped_without_time} complete events lacked ts or dur and were ignored")
    if stream.lenient_skipped:
        out.append(f"{stream.lenient_skipped} events had fields of unusable types and were skipped")
    replay = table.category_counts.get("cuda_profiler_range", 0)
    if replay:
        out.append(
            f"{replay} cuda_profiler_range events (CUPTI kernel replay) were not counted as timeline activity: "
            "replayed kernel durations are not throughput"
        )
    known = DEVICE_CATEGORIES | HOST_CALL_CATEGORIES | CPU_OP_CATEGORIES | IGNORED_CATEGORIES
    unknown = sorted(c for c in table.category_counts if c not in known)
    if unknown:
        out.append("categories classified by their args (stream/correlation): " + ", ".join(unknown[:8]))
    return out


_FLOP_OPS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::matmul", "aten::conv2d",
             "aten::convolution", "aten::_convolution", "aten::linear")  # fmt: skip


def _flops_unavailable(table: EventTable) -> str:
    """Why a trace has no profiler FLOPs, from what it does hold."""
    if len(table.names) and table.name_ids(_FLOP_OPS):
        return (
            "torch exported no FLOPs although the trace has matmul/conv ops: it was recorded without "
            "with_flops=True (profile_segment: with_flops=true). Model FLOPs: estimate_flops"
        )
    return (
        "torch exported no FLOPs and the trace has no matmul/conv op (with_flops estimates only those); "
        "for model FLOPs use estimate_flops"
    )


def analyze_table(
    table: EventTable,
    header: Header,
    stream: ReadFacts,
    path: Path,
    options: AnalysisOptions,
    *,
    release: bool = True,
) -> RankProfile:
    """Analyze an already loaded table (see `analyze_trace`).

    With ``release`` the table's raw columns are released once the analysis window is cut
    (``prepare(release=True)``), so a huge trace holds only its windowed copy while the analyses run; a
    table kept for later calls is read with ``release=False`` and left as it was.
    """
    rank, source, world = _rank(header, path)
    host_ids, host_counts = unique_counts(table.host.i("name"))
    backend = _backend(table, host_ids)
    backends = backends_seen(table, host_ids, host_counts)
    device = _device_name(header, table, backend)
    counts = {
        "events": table.event_count,
        "complete": table.complete_count,
        "device": len(table.device),
        "host_calls": len(table.host),
        "cpu_ops": len(table.cpu),
        "decompressed_bytes": stream.decoded_bytes,
    }
    # A trace whose tables hold a million rows hands freed memory back to the system once its raw columns
    # are cut to the window, and between the analyses, so their arrays do not land beside the freed
    # ones. Below that the trims (~3 ms each, and the pages the next analysis faults in again) cost more
    # than they return.
    large = counts["device"] + counts["host_calls"] + counts["cpu_ops"] >= TRIM_ROWS
    prepared = prepare(
        table, time_basis=options.time_basis, include_last_step=options.include_last_step, release=release
    )
    if large:
        release_free_memory()  # the raw columns just freed
    checkpoint()
    counts["device_in_window"] = len(prepared.device)

    def between() -> None:
        checkpoint()
        if large:
            release_free_memory()

    t = temporal_breakdown(prepared)
    between()
    flops = flops_summary(prepared)
    categories = category_stats(prepared)
    kernels = top_kernels(prepared, options.top_k)
    between()
    ops = top_ops(prepared, options.top_k)
    between()
    launch = launch_stats(prepared, options.short_kernel_us)
    between()
    sync = sync_stats(prepared)
    steps = step_summary(prepared)
    between()
    self_ops = top_ops(prepared, options.top_k, by="self")
    between()
    host = host_breakdown(prepared)
    between()
    idle = idle_breakdown(prepared)
    sequences = frequent_sequences(prepared, min(options.top_k, 5))
    between()
    efficiency = _op_efficiency(prepared, device, t.span_us > 0, options.top_k)
    between()
    code = code_view(prepared)
    return RankProfile(
        rank=rank,
        rank_source=source,
        path=str(path),
        world_size=world,
        backend=backend,
        device=device,
        time_basis=prepared.time_basis,
        window=prepared.window,
        span_us=t.span_us,
        busy_us=t.busy_us,
        idle_us=t.idle_us,
        compute_us=t.compute_us,
        non_compute_us=t.non_compute_us,
        communication_us=t.communication_us,
        memory_us=t.memory_us,
        memory_like_us=t.memory_like_us,
        sync_us=t.sync_us,
        idle_fraction=t.fraction(t.idle_us),
        compute_fraction=t.fraction(t.compute_us),
        non_compute_fraction=t.fraction(t.non_compute_us),
        comm_compute_overlap_us=t.comm_compute_overlap_us,
        comm_compute_overlap_fraction=t.comm_compute_overlap_fraction,
        streams=t.streams,
        categories=categories,
        top_kernels=kernels,
        top_ops=ops,
        launch=launch,
        sync=sync,
        steps=steps,
        flops=flops,
        flops_unavailable=None if flops is not None else _flops_unavailable(table),
        top_self_ops=self_ops,
        host=host,
        idle=idle,
        kernel_sequences=sequences,
        op_efficiency=efficiency,
        code=code,
        backends=backends,
        event_counts=counts,
        warnings=_warnings(table, counts["device"], prepared, stream),
    )


def _op_efficiency(prepared: Prepared, device: str, on_device: bool, k: int) -> OpEfficiencySummary | None:
    from perfgate.traces.analyses.efficiency import op_efficiency

    out = op_efficiency(prepared, device, on_device)
    if out is not None:
        out.ops = out.ops[:k]
    return out


def analyze_trace(path: Path, options: AnalysisOptions = AnalysisOptions()) -> RankProfile:
    """Read and analyze one trace file (one rank).

    Raises:
        TraceFormatError: bad gzip, invalid or truncated JSON, no ``traceEvents``.
        TraceTooLargeError: an event larger than ``options.max_event_bytes``.
        OSError: the file cannot be read.
    """
    table, header, stream = load_table(path, options)
    return analyze_table(table, header, stream, path, options)
