"""Columnar tables of the events the analyses use, built batch by batch from a `TraceStream`.

Events are routed by category into three tables (device activity, host runtime calls, CPU ops);
everything else (flows, metadata, instants, profiler bookkeeping) is only counted. Columns are numpy
arrays, names are interned to integer ids, so a trace of millions of events costs a few dozen bytes
per kept event. All times are microseconds as written in the trace.

Columns are as narrow as their values allow: times, durations and byte counts stay float64 (they are
written with nanosecond fractions and results must not depend on the storage), interned ids are
int32, flags and small codes int8. Raw ids (correlation, stream, device) are int64, read exactly
(`_ints`: never through a float, which merges ids above 2**53); one that no int64 holds reads as
absent and is counted in `EventTable.unheld_ints`, for the analysis to say so. Columns that are empty
for almost every event (profiler FLOPs, the work of shape ops, byte counts of host calls) are stored
sparsely: the rows that hold a value and the values (`SparseColumn`), expanded only while an analysis
reads them.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Hashable, Iterable
from dataclasses import dataclass, field
from operator import attrgetter, itemgetter
from typing import TYPE_CHECKING, Any, TypeVar, cast

import msgspec
import numpy as np
import numpy.typing as npt

from perfgate.traces.reading._events import Complete, EventArgs, Scalar, decode_args
from perfgate.traces.reading._memory import release_free_memory
from perfgate.traces.reading._np import int_list

if TYPE_CHECKING:
    from perfgate.traces.reading.shapes import ShapeMemo

__all__ = [
    "CPU_OP_CATEGORIES",
    "DEVICE_CATEGORIES",
    "HOST_CALL_CATEGORIES",
    "IGNORED_CATEGORIES",
    "Columns",
    "EventTable",
    "Ints",
    "SparseColumn",
    "TableBuilder",
    "beyond_int64",
]

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]
Ints = npt.NDArray[np.signedinteger[Any]]
"""An integer column: int64 for raw ids read from the trace, int32 for interned ids, int8 for codes."""
_T = TypeVar("_T")
_K = TypeVar("_K", bound=Hashable)

DEVICE_CATEGORIES = frozenset(
    {"kernel", "Kernel", "gpu_memcpy", "Memcpy", "gpu_memset", "Memset", "cuda_sync", "mtia_ccp_events"}
)
"""Categories of work that runs on an accelerator (a ``cuda_sync`` counts only on a real stream)."""
HOST_CALL_CATEGORIES = frozenset(
    {
        "cuda_runtime",
        "cuda_driver",
        "Runtime",
        "Driver",
        "privateuse1_runtime",
        "privateuse1_driver",
        "xpu_runtime",
        "xpu_driver",
        "mtia_runtime",
        "hip_runtime",
    }
)
"""Host-side runtime/driver API calls (launches, copies, synchronizations)."""
CPU_OP_CATEGORIES = frozenset({"cpu_op", "user_annotation", "Operator", "python_function"})
"""Host operators and annotations (ProfilerStep#N lives here)."""
IGNORED_CATEGORIES = frozenset(
    {"Trace", "gpu_user_annotation", "overhead", "cuda_profiler_range", "cpu_instant_event"}
)
"""Complete events that describe no work: spans of the profiler itself, GPU-side annotations,
CUPTI replay ranges (their durations come from kernel replays, not from the timeline)."""

_DEVICE, _HOST, _CPU, _SKIP, _UNKNOWN = 0, 1, 2, 3, 4

DIR_UNKNOWN, DIR_H2D, DIR_D2H, DIR_D2D, DIR_OTHER = 0, 1, 2, 3, 4
_DIRECTIONS: dict[str, int] = {
    "htod": DIR_H2D,
    "h2d": DIR_H2D,
    "host_to_device": DIR_H2D,
    "1": DIR_H2D,
    "dtoh": DIR_D2H,
    "d2h": DIR_D2H,
    "device_to_host": DIR_D2H,
    "2": DIR_D2H,
    "dtod": DIR_D2D,
    "d2d": DIR_D2D,
    "device_to_device": DIR_D2D,
    "3": DIR_D2D,
    "ptop": DIR_OTHER,
    "p2p": DIR_OTHER,
    "htoh": DIR_OTHER,
    "h2h": DIR_OTHER,
}


_INT64_LO, _INT64_END = -(2**63), 2**63
_EXACT = 2.0**53
"""Integers of smaller magnitude are exact as float64: a column of mixed ints and floats is converted
through float64 and only its values at or beyond this magnitude are read again, exactly, from the args."""
_DECIMAL = re.compile(r"\s*([+-]?)0*(\d+)\s*", re.ASCII)


def _to_int(value: Scalar, default: int = -1) -> int:
    """An integer arg as HTA reads it: ints and integral strings; anything else is ``default``.

    Integers are exact at any magnitude; one outside int64 is ``default`` (`beyond_int64` tells it from
    a value that is no integer at all).
    """
    if isinstance(value, int):
        return value if _INT64_LO <= value < _INT64_END else default
    if isinstance(value, float):
        return int(value) if -(2.0**63) <= value < 2.0**63 else default  # also NaN (comparisons are False)
    if isinstance(value, str):
        if len(value) > 20:  # longer than any int64; int() of a huge digit string is also slow
            return default
        try:
            parsed = int(value)
        except ValueError:
            return default
        return parsed if _INT64_LO <= parsed < _INT64_END else default
    return default


def beyond_int64(value: Scalar) -> bool:
    """Whether an arg is a number no int64 holds: an integer or decimal string outside int64's range, or
    a float beyond it (or infinite). `_to_int` reads it as absent; the analysis must say so."""
    if isinstance(value, int):
        return not _INT64_LO <= value < _INT64_END
    if isinstance(value, float):
        return not -(2.0**63) <= value < 2.0**63 and value == value  # NaN (not equal to itself): False
    if isinstance(value, str):
        match = _DECIMAL.fullmatch(value)
        # 20 significant digits are beyond int64 already: a longer string is never converted whole.
        return match is not None and not _INT64_LO <= int(match[1] + match[2][:20]) < _INT64_END
    return False


def _to_float(value: Scalar) -> float:
    """A numeric arg as float, NaN when absent or not numeric."""
    if isinstance(value, int | float):
        try:
            return float(value)
        except OverflowError:  # an int beyond any float: a corrupt file
            return math.nan
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return float("nan")
    return float("nan")


def _floats(values: list[Scalar]) -> F64:
    """Column of numeric args (NaN when absent); numpy converts numbers and None in one C loop."""
    n = len(values)
    if n and values[0] is None and values.count(None) == n:  # an arg no event of the batch has
        return np.full(n, np.nan)
    if str not in set(map(type, values)):
        try:
            return np.array(values, np.float64)
        except OverflowError:
            pass  # an int beyond any float: convert one by one
    return np.array([_to_float(v) for v in values], np.float64)


def _ints(values: list[Scalar], unheld: list[Scalar] | None = None) -> I64:
    """Column of integer args, exact: -1 when absent or not an integer (``"0x0"`` streams, as HTA does).

    A number no int64 holds (`beyond_int64`) is -1 too, and appended to ``unheld`` for the analysis to
    report: never a wrapped or rounded id.
    """
    n = len(values)
    if not n:
        return np.empty(0, np.int64)
    first = values[0]
    # One value for the whole batch (an absent arg, stream 7, device 0): small ints are shared objects,
    # so the count is mostly identity tests.
    if first is values[-1] and (first is None or type(first) is int) and values.count(first) == n:
        if first is None:
            return np.full(n, -1, np.int64)
        if _INT64_LO <= first < _INT64_END:  # pyright: ignore[reportOperatorIssue]
            return np.full(n, first, np.int64)
    if type(first) is str:  # a producer that writes ids as strings ("0x0" streams) writes them all so
        return _ints_one_by_one(values, unheld)
    # One C pass finds the values' common type and converts them: int64 when every value is an int
    # that int64 holds (the usual column), exact.
    found = np.array(values)
    if found.dtype == np.int64:
        return found  # pyright: ignore[reportReturnType]
    kind = found.dtype.kind
    if kind == "f" or (kind == "O" and str not in set(map(type, values))):
        # Floats among the ints, or absent values: through float64, exact below 2**53 (and NaN for
        # absent); only the rows beyond are read again from the values.
        try:
            as_float = found if kind == "f" else np.array(values, np.float64)
        except OverflowError:  # an int beyond any float
            return _ints_one_by_one(values, unheld)
        magnitude = np.abs(as_float)
        exact = magnitude < _EXACT  # NaN: False
        if exact.all():
            return as_float.astype(np.int64)
        out = np.where(exact, as_float, -1).astype(np.int64)
        for i in int_list(np.flatnonzero(magnitude >= _EXACT)):
            value = values[i]
            out[i] = _to_int(value)
            if unheld is not None and out[i] == -1 and beyond_int64(value):
                unheld.append(value)
        return out
    # Strings, or ints beyond int64 (numpy found uint64 or Python objects).
    return _ints_one_by_one(values, unheld)


def _ints_one_by_one(values: list[Scalar], unheld: list[Scalar] | None) -> I64:
    out = np.array([_to_int(v) for v in values], np.int64)
    if unheld is not None:
        read_as_absent = _gather(values, int_list(np.flatnonzero(out == -1)))
        # Each distinct value checked once (a column of "0x0" streams holds one).
        beyond = {v for v in set(read_as_absent) if beyond_int64(v)}
        if beyond:
            unheld.extend(v for v in read_as_absent if v in beyond)
    return out


def _directions(args: list[EventArgs]) -> Ints:
    raw = [a.kind if a.kind is not None else a.direction for a in args]
    values = set(raw)
    if values == {None}:
        return np.zeros(len(args), np.int8)
    codes = {
        v: DIR_UNKNOWN if v is None else _DIRECTIONS.get(str(v).strip().lower(), DIR_UNKNOWN) for v in values
    }
    return np.fromiter(map(codes.__getitem__, raw), np.int8, len(raw))


def _gather(items: list[_T], rows: list[int]) -> list[_T]:
    if not rows:
        return []
    if len(rows) == 1:
        return [items[rows[0]]]
    return list(itemgetter(*rows)(items))


_GET_PH = attrgetter("ph")
_GET_CAT = attrgetter("cat")
_GET_NAME = attrgetter("name")
_GET_TS = attrgetter("ts")
_GET_DUR = attrgetter("dur")
_GET_TID = attrgetter("tid")
_GET_ARGS = attrgetter("args")
_GET_STREAM = attrgetter("stream")
_GET_CORR = attrgetter("correlation")
_GET_DEVICE = attrgetter("device")
_GET_BYTES = attrgetter("nbytes")
_GET_SIZE = attrgetter("size")
_GET_FLOPS = attrgetter("flops")
_SEQ = b'"Sequence number"'


def _has_key(raws: list[msgspec.Raw], key: bytes, joined: bytes) -> Ints:
    """1 for each raw args object that contains ``key``, else 0: ``joined`` (the raws joined), searched in C.

    The matches are where ``joined.split(key)`` cuts it (each piece's end, plus the keys before it): one C
    pass and no Python object per match, where most CPU ops of a training step hold the key.
    """
    n = len(raws)
    pieces = joined.split(key)
    if len(pieces) == 1:
        return np.zeros(n, np.int8)
    ends = np.cumsum(np.fromiter(map(len, raws), np.int64, n))
    lengths = np.fromiter(map(len, pieces), np.int64, len(pieces) - 1)
    hits = np.cumsum(lengths) + np.arange(lengths.size, dtype=np.int64) * len(key)
    out = np.zeros(n, np.int8)
    out[np.searchsorted(ends, hits, side="right")] = 1
    return out


class _Interner(dict[_K, int]):
    """Maps keys (names, categories, thread ids) to dense ids in first-seen order."""

    def __missing__(self, key: _K) -> int:
        value = len(self)
        self[key] = value
        return value


def _local_ids(values: Iterable[_K], n: int) -> tuple[list[_K], Ints]:
    """(the distinct values in first-seen order, each value's index into them): one pass, in C."""
    local = _Interner[_K]()
    ids = np.fromiter(map(local.__getitem__, values), np.int32, n)
    return list(local), ids


def _intern_in_order(found: tuple[list[_K], Ints], parts: list[I64], interner: _Interner[_K]) -> Ints:
    """Global ids of a batch's rows, interning new keys in the order the tables store the rows.

    ``found`` is (distinct keys, each row's index into them) (`_local_ids`); ``parts`` are the row
    numbers of each table, in table order. Keys are interned as if the rows of ``parts`` were read one
    after another, so ids do not depend on how the rows were gathered. Rows outside ``parts`` get -1.
    """
    keys, local = found
    seq = local[np.concatenate(parts)]
    first = np.full(len(keys), seq.size, np.int64)
    np.minimum.at(first, seq, np.arange(seq.size))
    present = np.flatnonzero(first < seq.size)
    table = np.full(len(keys), -1, np.int32)
    for key in int_list(present[np.argsort(first[present])]):
        table[key] = interner[keys[key]]
    return table[local]


def _renumber(later: _Interner[_K], into: _Interner[_K]) -> Ints:
    """Ids in ``into`` of the keys of ``later`` (indexed by ``later``'s ids), interning new ones in order."""
    return np.fromiter(map(into.__getitem__, later), np.int32, len(later))


@dataclass
class _Batch:
    """The complete, timed events of one batch, read field by field (see `TableBuilder.add`)."""

    events: list[Complete]
    ts: npt.NDArray[np.generic]
    """As read: int64 when every ts is an integer, float64 or object otherwise."""
    dur: npt.NDArray[np.generic]
    cat_keys: list[str] = field(init=False)
    cat_local: Ints = field(init=False)
    name_ids: Ints = field(init=False)
    cat_ids: Ints = field(init=False)
    tid_ids: Ints = field(init=False)
    _args: list[msgspec.Raw] | None = None

    def __post_init__(self) -> None:
        self.cat_keys, self.cat_local = _local_ids(map(_GET_CAT, self.events), len(self.events))

    def names(self) -> tuple[list[str], Ints]:
        return _local_ids(map(_GET_NAME, self.events), len(self.events))

    def tids(self) -> tuple[list[int | str | None], Ints]:
        return _local_ids(map(_GET_TID, self.events), len(self.events))

    def args(self, rows: I64) -> list[msgspec.Raw]:
        """The raw args of the given rows."""
        if self._args is None:
            self._args = list(map(_GET_ARGS, self.events))
        return _gather(self._args, int_list(rows))


@dataclass
class SparseColumn:
    """A column that holds a value in few rows: ``rows`` (ascending), their ``values``, ``fill`` elsewhere.

    `dense` expands it to exactly the array a dense column would hold (NaN or -1 in the other rows).
    """

    rows: I64
    values: npt.NDArray[np.generic]
    fill: float | int

    def dense(self, n: int) -> npt.NDArray[np.generic]:
        """The full column of ``n`` rows."""
        out = np.full(n, self.fill, self.values.dtype)
        out[self.rows] = self.values
        return out

    @staticmethod
    def of(column: npt.NDArray[np.generic], fill: float | int) -> SparseColumn:
        """The rows of ``column`` that differ from ``fill`` (for a NaN fill: that are not NaN)."""
        held = ~np.isnan(column) if isinstance(fill, float) and math.isnan(fill) else column != fill
        rows = np.flatnonzero(held)
        return SparseColumn(rows, column[rows], fill)

    def take(self, keep: npt.NDArray[np.bool_]) -> SparseColumn:
        """The column of the rows a mask keeps, renumbered."""
        kept = keep[self.rows]
        before = np.cumsum(keep, dtype=np.int32 if keep.size < 2**31 else np.int64) - 1  # new row numbers
        return SparseColumn(before[self.rows[kept]].astype(np.int64), self.values[kept], self.fill)


@dataclass
class Columns:
    """A table as named numpy columns of equal length; ``sparse`` columns are stored as `SparseColumn`."""

    data: dict[str, npt.NDArray[np.generic]]
    sparse: dict[str, SparseColumn] = field(default_factory=dict[str, SparseColumn])

    def __len__(self) -> int:
        return len(next(iter(self.data.values()))) if self.data else 0

    def _column(self, name: str) -> npt.NDArray[np.generic]:
        column = self.data.get(name)
        if column is None and name == "end" and "ts" in self.data:
            # Derived, not stored: ts + dur is exact where it matters (see `prepare`) and costs a
            # column's memory only while an analysis reads it.
            end: F64 = np.add(self.data["ts"], self.data["dur"], dtype=np.float64)
            return end
        if column is None:
            # Expanded for the caller only: the table keeps the sparse form.
            return self.sparse[name].dense(len(self))
        return column

    def f(self, name: str) -> F64:
        """A float64 column (a sparse one is expanded into a new array)."""
        column = self._column(name)
        assert column.dtype == np.float64
        return column  # pyright: ignore[reportReturnType]

    def i(self, name: str) -> Ints:
        """An integer column (see `Ints` for the widths; a sparse one is expanded into a new array)."""
        column = self._column(name)
        assert np.issubdtype(column.dtype, np.signedinteger)
        return column  # pyright: ignore[reportReturnType]

    def empty(self) -> Columns:
        """No rows, the same columns and types."""
        return Columns(
            {k: np.empty(0, v.dtype) for k, v in self.data.items()},
            {
                k: SparseColumn(np.empty(0, np.int64), np.empty(0, v.values.dtype), v.fill)
                for k, v in self.sparse.items()
            },
        )


# numpy type codes: f8 float64, i8 int64, i4 int32, i1 int8.
_DEVICE_COLUMNS = {"ts": "f8", "dur": "f8", "nbytes": "f8", "name": "i4", "cat": "i4", "stream": "i8",
                   "corr": "i8", "device": "i8", "direction": "i1"}  # fmt: skip
_HOST_COLUMNS = {"ts": "f8", "dur": "f8", "name": "i4", "cat": "i4", "corr": "i8", "tid": "i4"}
_HOST_SPARSE: dict[str, tuple[str, float | int]] = {"nbytes": ("f8", math.nan)}
_CPU_COLUMNS = {"ts": "f8", "dur": "f8", "name": "i4", "cat": "i4", "tid": "i4", "grad": "i1"}
_CPU_SPARSE: dict[str, tuple[str, float | int]] = {"flops": ("f8", math.nan), "shape_flops": ("f8", math.nan),
               "shape_bytes": ("f8", math.nan), "shape_prec": ("i1", -1)}  # fmt: skip


_TRIM_COLUMN_BYTES = 4 << 20


def _empty(columns: dict[str, str], sparse: dict[str, tuple[str, float | int]]) -> Columns:
    return Columns(
        {k: np.empty(0, t) for k, t in columns.items()},
        {k: SparseColumn(np.empty(0, np.int64), np.empty(0, t), fill) for k, (t, fill) in sparse.items()},
    )


@dataclass
class EventTable:
    """The kept events of one trace, as columns, plus counts of everything seen.

    ``device``: ts, dur, nbytes, name, cat, stream (-1 unknown), corr (-1 none), device (-1 unknown),
    direction (a ``DIR_*`` code). ``host``: runtime/driver calls with ts, dur, nbytes, name, cat,
    corr, tid. ``cpu``: operators and annotations with ts, dur, flops, name, cat, tid, and ``grad``
    (1 when the op carries an autograd ``Sequence number``: it ran with grad mode on).
    ``float_timestamps``: some kept event's ``ts`` is written as a float; HTA then rounds every event
    of the trace to whole microseconds. ``unheld_ints``: for each integer arg (``correlation``,
    ``stream``, ``device``) that some events hold beyond int64 (`beyond_int64`): how many, and one such
    value as written (the first noted); those events read as absent (-1), and the analysis says so.
    """

    device: Columns
    host: Columns
    cpu: Columns
    names: list[str]
    cats: list[str]
    name_index: dict[str, int]
    category_counts: Counter[str]
    event_count: int
    complete_count: int
    float_timestamps: bool
    dropped_without_time: int
    unheld_ints: dict[str, tuple[int, str]] = field(default_factory=dict[str, tuple[int, str]])

    def release(self) -> None:
        """Drop the event columns (names, categories and counts stay)."""
        self.device = self.device.empty()
        self.host = self.host.empty()
        self.cpu = self.cpu.empty()

    def name_ids(self, names: Iterable[str]) -> list[int]:
        """Ids of the given names that occur in this trace."""
        return [self.name_index[n] for n in names if n in self.name_index]


@dataclass
class TableBuilder:
    """Accumulates batches of events into an `EventTable`."""

    _names: _Interner[str] = field(default_factory=_Interner[str])
    _shape_ids: npt.NDArray[np.bool_] = field(default_factory=lambda: np.zeros(0, bool))
    _shape_memo: ShapeMemo = field(default_factory=dict[tuple[str, bytes, bytes], tuple[float, float, int]])
    """FLOPs/bytes of each shape op and shapes seen so far: a training step repeats them, batch after batch."""
    _cats: _Interner[str] = field(default_factory=_Interner[str])
    _tids: _Interner[int | str | None] = field(default_factory=_Interner[int | str | None])
    _route: dict[str, int] = field(default_factory=dict[str, int])
    _parts: dict[str, list[Columns]] = field(default_factory=lambda: {"device": [], "host": [], "cpu": []})
    _skipped_counts: Counter[str] = field(default_factory=Counter[str])
    _events: int = 0
    _complete: int = 0
    _float_ts: bool = False
    _dropped: int = 0
    _unheld: dict[str, tuple[int, str]] = field(default_factory=dict[str, tuple[int, str]])

    def _note_unheld(self, arg: str, values: list[Scalar]) -> None:
        """Count the values of ``arg`` that no int64 holds (read as absent); keep the first noted, as written."""
        if values:
            count, first = self._unheld.get(arg, (0, str(values[0])[:40]))
            self._unheld[arg] = (count + len(values), first)

    def _int_column(self, args: list[EventArgs], arg: str, get: attrgetter[Scalar]) -> I64:
        unheld: list[Scalar] = []
        column = _ints(list(map(get, args)), unheld)
        self._note_unheld(arg, unheld)
        return column

    def _route_of(self, cat: str) -> int:
        route = self._route.get(cat)
        if route is None:
            if cat in DEVICE_CATEGORIES:
                route = _DEVICE
            elif cat in HOST_CALL_CATEGORIES:
                route = _HOST
            elif cat in CPU_OP_CATEGORIES:
                route = _CPU
            elif cat in IGNORED_CATEGORIES:
                route = _SKIP
            else:
                # Unknown categories are decided per event, by their args.
                route = _UNKNOWN
            self._route[cat] = route
        return route

    def add(self, timed: list[Complete], seen: int) -> None:
        """Route the complete events of one batch (of ``seen`` events in all) into the tables.

        Each field of an event is read once, into a list or array over the batch's complete events;
        the tables take their rows from those by index. Reading the event objects, scattered in memory,
        is what costs: the columns of a group are gathered in numpy, not by walking its events again.
        """
        self._events += seen
        self._complete += len(timed)
        if not timed:
            return
        ts_values = list(map(_GET_TS, timed))
        ts = np.array(ts_values)
        dur = np.array(list(map(_GET_DUR, timed)))
        if ts.dtype == object or dur.dtype == object:
            # Some event lacks ts or dur (or holds an integer beyond int64): drop the untimed ones.
            complete = len(timed)
            timed = [e for e in timed if e.ts is not None and e.dur is not None]
            self._dropped += complete - len(timed)
            if not timed:
                return
            ts_values = list(map(_GET_TS, timed))
            ts = np.array(ts_values)
            dur = np.array(list(map(_GET_DUR, timed)), np.float64)
        batch = _Batch(timed, ts, dur)
        rows = self._route_rows(batch)
        if rows[_SKIP].size:
            skipped = np.bincount(batch.cat_local[rows[_SKIP]], minlength=len(batch.cat_keys))
            self._skipped_counts.update({batch.cat_keys[c]: int(skipped[c]) for c in np.flatnonzero(skipped)})
        kept = [rows[_DEVICE], rows[_HOST], rows[_CPU]]
        if not self._float_ts and ts.dtype != np.int64:
            # HTA rounds a trace whose kept events write some ts as a float (or beyond int64).
            self._float_ts = any(
                type(ts_values[i]) is not int or not -(2**63) <= ts_values[i] < 2**63
                for part in kept
                for i in int_list(part)
            )
        batch.name_ids = _intern_in_order(batch.names(), kept, self._names)
        batch.cat_ids = _intern_in_order((batch.cat_keys, batch.cat_local), kept, self._cats)
        batch.tid_ids = _intern_in_order(batch.tids(), kept[1:], self._tids)
        if rows[_DEVICE].size:
            self._parts["device"].append(self._device_columns(batch, rows[_DEVICE]))
        if rows[_HOST].size:
            self._parts["host"].append(self._host_columns(batch, rows[_HOST]))
        if rows[_CPU].size:
            self._parts["cpu"].append(self._cpu_columns(batch, rows[_CPU]))

    def _route_rows(self, batch: _Batch) -> dict[int, I64]:
        """The batch's rows of each table (and of the skipped events), in the order they are stored.

        Rows of known categories come first in each table, in file order; device syncs without a stream
        are host waits and follow the host calls; events of unknown categories, routed by their args
        (stream and correlation), follow last.
        """
        keys = batch.cat_keys
        routes = np.array([self._route_of(c) for c in keys], np.int8)
        codes = routes[batch.cat_local]
        rows = {code: np.flatnonzero(codes == code) for code in (_DEVICE, _HOST, _CPU, _SKIP)}
        extra: dict[int, list[I64]] = {_DEVICE: [], _HOST: [], _CPU: []}
        if "cuda_sync" in keys:
            # Event/context syncs have no stream: they are host waits, not stream activity.
            device = rows[_DEVICE]
            syncs = device[batch.cat_local[device] == keys.index("cuda_sync")]
            sync_args = decode_args(batch.args(syncs))
            stray = np.array([_to_int(a.stream) < 0 for a in sync_args], bool)
            if stray.any():
                # Host waits keep no stream column: a stream no int64 holds is reported here.
                self._note_unheld("stream", [a.stream for a in sync_args if beyond_int64(a.stream)])
                rows[_DEVICE] = np.setdiff1d(device, syncs[stray], assume_unique=True)
                extra[_HOST].append(syncs[stray])
        unknown = np.flatnonzero(codes == _UNKNOWN)
        if unknown.size:
            routed: list[int] = []
            for a in decode_args(batch.args(unknown)):
                corr = _to_int(a.correlation)
                stream = _to_int(a.stream)
                routed.append(_DEVICE if corr >= 0 and stream >= 0 else _HOST if corr >= 0 else _CPU)
                # Routed as absent, into a table without that column (the device table reports its own).
                if corr < 0 and beyond_int64(a.correlation):
                    self._note_unheld("correlation", [a.correlation])
                if stream < 0 and beyond_int64(a.stream):
                    self._note_unheld("stream", [a.stream])
            to = np.array(routed, np.int8)
            for code in extra:
                extra[code].append(unknown[to == code])
        for code, more in extra.items():
            if more:
                rows[code] = np.concatenate([rows[code], *more])
        return rows

    def _common(self, batch: _Batch, rows: I64) -> dict[str, npt.NDArray[np.generic]]:
        return {
            "ts": batch.ts[rows].astype(np.float64),
            "dur": batch.dur[rows].astype(np.float64),
            "name": batch.name_ids[rows],
            "cat": batch.cat_ids[rows],
        }

    def _device_columns(self, batch: _Batch, rows: I64) -> Columns:
        data = self._common(batch, rows)
        args = decode_args(batch.args(rows))
        data["stream"] = self._int_column(args, "stream", _GET_STREAM)
        data["corr"] = self._int_column(args, "correlation", _GET_CORR)
        data["device"] = self._int_column(args, "device", _GET_DEVICE)
        data["nbytes"] = _floats(list(map(_GET_BYTES, args)))
        data["direction"] = _directions(args)
        return Columns(data)

    def _host_columns(self, batch: _Batch, rows: I64) -> Columns:
        data = self._common(batch, rows)
        args = decode_args(batch.args(rows))
        data["corr"] = self._int_column(args, "correlation", _GET_CORR)
        nbytes = _floats(list(map(_GET_BYTES, args)))
        size = _floats(list(map(_GET_SIZE, args)))
        data["tid"] = batch.tid_ids[rows]
        return Columns(data, {"nbytes": SparseColumn.of(np.where(np.isnan(nbytes), size, nbytes), math.nan)})

    def _cpu_columns(self, batch: _Batch, rows: I64) -> Columns:
        data = self._common(batch, rows)
        data["tid"] = batch.tid_ids[rows]
        raws = batch.args(rows)
        joined = b"".join(raws)
        # torch numbers the ops it records while grad mode is on; a substring test per raw args object
        # (in C) tells grad-mode ops from no-grad ones without decoding every CPU op's args.
        data["grad"] = _has_key(raws, _SEQ, joined)
        # Profiler-attributed FLOPs are rare: decode CPU-op args only when some carry them.
        sparse: dict[str, SparseColumn] = {}
        if b'"flops"' in joined:
            sparse["flops"] = SparseColumn.of(_floats(list(map(_GET_FLOPS, decode_args(raws)))), math.nan)
        else:
            sparse["flops"] = SparseColumn(np.empty(0, np.int64), np.empty(0, np.float64), math.nan)
        self._shape_columns(raws, cast("Ints", data["name"]), sparse)
        return Columns(data, sparse)

    def _shape_columns(self, raws: list[msgspec.Raw], ids: Ints, sparse: dict[str, SparseColumn]) -> None:
        """FLOPs/bytes of the GEMM, attention and copy ops with recorded shapes (see `shapes`)."""
        from perfgate.traces.reading.shapes import SHAPE_OPS, shapes_work

        n = len(raws)
        flops, nbytes = np.full(n, np.nan), np.full(n, np.nan)
        prec = np.full(n, -1, np.int8)
        names = self._names
        if len(self._shape_ids) < len(names):
            # Which interned names are shape ops: checked once per new name, not per event.
            new = list(names)[len(self._shape_ids) :]
            self._shape_ids = np.concatenate([self._shape_ids, np.array([x in SHAPE_OPS for x in new], bool)])
        rows = np.flatnonzero(self._shape_ids[ids])
        if rows.size:
            picked = rows.tolist()
            lookup = list(names)
            work = shapes_work(
                [lookup[int(ids[i])] for i in picked], [raws[i] for i in picked], self._shape_memo
            )
            for i, (f, b, c) in zip(picked, work, strict=True):
                flops[i], nbytes[i], prec[i] = f, b, c
        sparse["shape_flops"] = SparseColumn.of(flops, math.nan)
        sparse["shape_bytes"] = SparseColumn.of(nbytes, math.nan)
        sparse["shape_prec"] = SparseColumn.of(prec, -1)

    @property
    def event_count(self) -> int:
        """Events added so far (of every kind)."""
        return self._events

    def extend(self, later: TableBuilder) -> None:
        """Append the events of ``later``, a builder that read the batches after this one's (another
        process's part of the same file): the result is what one builder reading every batch holds.

        Ids are first-seen, so ``later``'s names, categories and threads that this builder has not seen
        are interned after its own, in ``later``'s order, and its id columns are renumbered.
        """
        remap = {
            "name": _renumber(later._names, self._names),
            "cat": _renumber(later._cats, self._cats),
            "tid": _renumber(later._tids, self._tids),
        }
        for key, parts in later._parts.items():
            for part in parts:
                for col, table in remap.items():
                    if col in part.data:
                        part.data[col] = table[cast("Ints", part.data[col])]
            self._parts[key].extend(parts)
        self._skipped_counts.update(later._skipped_counts)
        self._events += later._events
        self._complete += later._complete
        self._float_ts = self._float_ts or later._float_ts
        self._dropped += later._dropped
        for arg, (count, first) in later._unheld.items():
            before, earlier = self._unheld.get(arg, (0, first))
            self._unheld[arg] = (before + count, earlier)

    def _category_counts(self, tables: dict[str, Columns]) -> Counter[str]:
        counts = Counter[str](self._skipped_counts)
        cats = list(self._cats)
        for cols in tables.values():
            if len(cols):
                for cat_id, n in enumerate(np.bincount(cols.i("cat")).tolist()):
                    if n:
                        counts[cats[cat_id]] += n
        return counts

    def build(self) -> EventTable:
        """The finished table (the builder should not be used afterwards)."""
        tables: dict[str, Columns] = {}
        no_sparse: dict[str, tuple[str, float | int]] = {}
        for key, columns, sparse_columns in (
            ("device", _DEVICE_COLUMNS, no_sparse),
            ("host", _HOST_COLUMNS, _HOST_SPARSE),
            ("cpu", _CPU_COLUMNS, _CPU_SPARSE),
        ):
            parts = self._parts[key]
            if not parts:
                tables[key] = _empty(columns, sparse_columns)
            elif len(parts) == 1:
                tables[key] = parts[0]
            else:
                tables[key] = _concatenate(parts)
            parts.clear()
        return EventTable(
            device=tables["device"],
            host=tables["host"],
            cpu=tables["cpu"],
            names=list(self._names),
            name_index=dict(self._names),
            cats=list(self._cats),
            category_counts=self._category_counts(tables),
            event_count=self._events,
            complete_count=self._complete,
            float_timestamps=self._float_ts,
            dropped_without_time=self._dropped,
            unheld_ints=dict(self._unheld),
        )


def _concatenate(parts: list[Columns]) -> Columns:
    """One table from consecutive parts, column by column, freeing each part's copy as it goes (the
    table is never held twice).

    The parts lie in the heap between the reader's freed buffers; a large column's pieces are handed
    back to the system as soon as they are copied (`release_free_memory`), else the heap would keep
    them resident beside the new columns: the whole table twice.
    """
    starts = np.cumsum([0, *(len(p) for p in parts)])[:-1].tolist()
    data: dict[str, npt.NDArray[np.generic]] = {}
    for col in list(parts[0].data):
        data[col] = np.concatenate([p.data.pop(col) for p in parts])
        if data[col].nbytes >= _TRIM_COLUMN_BYTES:
            release_free_memory()
    sparse: dict[str, SparseColumn] = {}
    for col in list(parts[0].sparse):
        pieces = [p.sparse.pop(col) for p in parts]
        rows = np.concatenate([c.rows + start for c, start in zip(pieces, starts, strict=True)])
        values = np.concatenate([c.values for c in pieces])
        sparse[col] = SparseColumn(rows.astype(np.int64), values, pieces[0].fill)
    return Columns(data, sparse)
