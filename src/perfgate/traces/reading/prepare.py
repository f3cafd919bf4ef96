"""Turn an `EventTable` into the windowed, classified arrays every analysis reads.

Two conventions follow HTA 0.5 so results can be checked against it:

- the analysis window: with two or more ``ProfilerStep#N`` annotations, the last step is left out
  (it is often cut short when the profiler stops); host events must start before the last step
  starts, device events must have been launched by such a host event (by correlation id), or start
  before it when they carry no correlation id. ``include_last_step`` keeps events up to the end of
  the last step instead.
- ``time_basis="hta_rounded"`` rounds every event to whole microseconds the way HTA does for traces
  with fractional timestamps (start up, end down). The default keeps the exact times.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from perfgate.traces.classify import CATEGORIES, Category, category_kind, classify_device
from perfgate.traces.models import AnalysisWindow, TimeBasis
from perfgate.traces.reading._group import TABLE_LIMIT, unique_inverse
from perfgate.traces.reading._memory import release_for
from perfgate.traces.reading.table import DIR_D2D, DIR_D2H, DIR_H2D, DIR_OTHER, Columns, EventTable, Ints

__all__ = ["KIND_CODES", "Prepared", "prepare"]

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]

KIND_CODES: dict[str, int] = {"compute": 0, "communication": 1, "memory": 2, "sync": 3}
_CATEGORY_CODE: dict[Category, int] = {c: i for i, c in enumerate(CATEGORIES)}
_DIR_CATEGORY: dict[int, Category] = {
    DIR_H2D: "memcpy_h2d",
    DIR_D2H: "memcpy_d2h",
    DIR_D2D: "memcpy_d2d",
    DIR_OTHER: "memcpy_other",
}
_STEP = re.compile(r"ProfilerStep\s*#\s*(\d{1,18})(?!\d)")
"""A step number of more digits is not a step (and would not fit an int64 column): such names are ignored."""


@dataclass
class Prepared:
    """Arrays for the analyses. Times are microseconds relative to ``origin``.

    ``device`` columns add ``end`` (derived, see `_with_times`), ``category`` (index into `CATEGORIES`, int8), ``kind``
    (`KIND_CODES`, int8) and ``launch`` (row in ``host`` of the launching call, -1 when unknown). ``host`` and ``cpu``
    add ``end``. ``steps_*`` describe every ProfilerStep of the trace (window or not).
    """

    table: EventTable
    device: Columns
    host: Columns
    cpu: Columns
    origin: float
    window: AnalysisWindow
    time_basis: TimeBasis
    step_numbers: I64
    step_start: F64
    step_dur: F64
    step_in_window: npt.NDArray[np.bool_]
    cache: dict[str, npt.NDArray[np.generic]] = field(default_factory=dict[str, "npt.NDArray[np.generic]"])


def _with_times(cols: Columns, rounded: bool) -> Columns:
    """The columns on the chosen time basis; ``end`` is derived on reading (`Columns.f`): ts + dur,
    which equals the rounded end exactly (whole microseconds far below 2**53)."""
    data = dict(cols.data)
    if rounded:
        ts, dur = cols.f("ts"), cols.f("dur")
        end = np.floor(ts + dur)
        ts = np.ceil(ts)
        data["ts"], data["dur"] = ts, end - ts
    return Columns(data, dict(cols.sparse))


def _take(cols: Columns, keep: npt.NDArray[np.bool_]) -> Columns:
    """The kept rows, column by column, dropping each source column from ``cols`` once copied."""
    data = {name: cols.data.pop(name)[keep] for name in list(cols.data)}
    return Columns(data, {name: cols.sparse.pop(name).take(keep) for name in list(cols.sparse)})


def _steps(table: EventTable, cpu: Columns) -> tuple[I64, F64, F64]:
    """ProfilerStep annotations: numbers, starts, durations, sorted by start, one per number."""
    ids: list[int] = []
    numbers: dict[int, int] = {}
    for i, name in enumerate(table.names):
        if "ProfilerStep" in name:
            match = _STEP.search(name)
            if match:
                ids.append(i)
                numbers[i] = int(match.group(1))
    if not ids or len(cpu) == 0:
        return np.empty(0, np.int64), np.empty(0, np.float64), np.empty(0, np.float64)
    mask = np.isin(cpu.i("name"), np.array(ids, np.int32))
    rows = np.flatnonzero(mask)
    rows = rows[np.argsort(cpu.f("ts")[rows], kind="stable")]
    seen: set[int] = set()
    keep: list[int] = []
    for r in rows.tolist():
        number = numbers[int(cpu.i("name")[r])]
        if number not in seen:
            seen.add(number)
            keep.append(r)
    idx = np.array(keep, np.int64)
    step_numbers = np.array([numbers[int(n)] for n in cpu.i("name")[idx]], np.int64)
    return step_numbers, cpu.f("ts")[idx], cpu.f("dur")[idx]


def _classify(table: EventTable, device: Columns) -> tuple[Ints, Ints]:
    """Per device event: category code and kind code (classified once per distinct name/category)."""
    n = len(device)
    if n == 0:
        return np.empty(0, np.int8), np.empty(0, np.int8)
    key = device.i("name").astype(np.int64) * (len(table.cats) + 1) + device.i("cat")
    unique, inverse = unique_inverse(key)
    del key
    cat_of = np.empty(unique.size, np.int8)
    needs_args = np.zeros(unique.size, bool)
    for u, k in enumerate(unique.tolist()):
        name_id, cat_id = divmod(int(k), len(table.cats) + 1)
        category, from_args = classify_device(table.names[name_id], table.cats[cat_id])
        cat_of[u] = _CATEGORY_CODE[category]
        needs_args[u] = from_args
    category = cat_of[inverse]
    resolve = needs_args[inverse]
    if resolve.any():
        direction = device.i("direction")
        for code, cat_name in _DIR_CATEGORY.items():
            category[resolve & (direction == code)] = _CATEGORY_CODE[cat_name]
    kind_of = np.array([KIND_CODES[category_kind(c)] for c in CATEGORIES], np.int8)
    return category, kind_of[category]


def _launch_rows(device: Columns, host: Columns) -> I64:
    """Row of the earliest host call sharing each device event's correlation id, or -1."""
    n = len(device)
    out = np.full(n, -1, np.int64)
    if n == 0 or len(host) == 0:
        return out
    hcorr = host.i("corr")
    valid = np.flatnonzero(hcorr >= 0)
    if valid.size == 0:
        return out
    dcorr = device.i("corr")
    lo, hi = int(hcorr[valid].min()), int(hcorr[valid].max())
    if hi - lo < TABLE_LIMIT and hi - lo <= 4 * valid.size + 1024:
        # Dense ids: a table indexed by correlation id, filled in one pass (no sort). Ids shared by
        # several calls (rare) are resolved by time among those rows only.
        shifted = hcorr[valid] - lo
        shared = np.bincount(shifted, minlength=hi - lo + 1)[shifted] > 1
        row_of = np.full(hi - lo + 1, -1, np.int64)
        row_of[shifted[~shared]] = valid[~shared]
        if shared.any():
            dup = valid[shared]
            order = dup[np.lexsort((host.f("ts")[dup], hcorr[dup]))]
            keys = hcorr[order]
            first = np.ones(keys.size, bool)
            first[1:] = keys[1:] != keys[:-1]
            row_of[keys[first] - lo] = order[first]
        inside = (dcorr >= lo) & (dcorr <= hi)
        out[inside] = row_of[dcorr[inside] - lo]
        return out
    # Sort by (corr, ts) so the first row of each correlation id is its earliest call.
    order = valid[np.lexsort((host.f("ts")[valid], hcorr[valid]))]
    keys = hcorr[order]
    first = np.ones(keys.size, bool)
    first[1:] = keys[1:] != keys[:-1]
    keys, rows = keys[first], order[first]
    pos = np.searchsorted(keys, dcorr)
    pos_clipped = np.minimum(pos, keys.size - 1)
    hit = (dcorr >= 0) & (pos < keys.size) & (keys[pos_clipped] == dcorr)
    out[hit] = rows[pos_clipped[hit]]
    return out


def prepare(
    table: EventTable,
    *,
    time_basis: TimeBasis = "exact",
    include_last_step: bool = False,
    release: bool = False,
) -> Prepared:
    """Window, classify and link the events of one trace (see the module docstring).

    ``release`` empties ``table``'s device/host/cpu columns once the windowed copies exist, so the
    raw and the windowed columns of a huge trace are not held together for the whole analysis.
    """
    rounded = time_basis == "hta_rounded" and table.float_timestamps
    device = _with_times(table.device, rounded)
    host = _with_times(table.host, rounded)
    cpu = _with_times(table.cpu, rounded)

    starts = [c.f("ts") for c in (device, host, cpu) if len(c)]
    origin = float(min(float(s.min()) for s in starts)) if starts else 0.0

    step_numbers, step_start, step_dur = _steps(table, cpu)
    if step_numbers.size >= 2:
        if include_last_step:
            end = float(np.max(step_start + step_dur))
            host_keep = host.f("ts") <= end
            cpu_keep = cpu.f("ts") <= end
            basis = "events up to the end of the last ProfilerStep"
        else:
            end = float(step_start.max())
            host_keep = host.f("ts") < end
            cpu_keep = cpu.f("ts") < end
            basis = (
                "events before the last ProfilerStep starts (the last step is often incomplete; HTA's "
                "default); device work belongs to the step whose host call launched it"
            )
        # np.isin takes duplicates; on dense correlation ids it looks them up in a table (linear).
        kept_corr = host.i("corr")[host_keep & (host.i("corr") >= 0)]
        dcorr = device.i("corr")
        has_corr = dcorr >= 0
        device_keep = np.where(has_corr, np.isin(dcorr, kept_corr), device.f("ts") < end)
        if include_last_step:
            device_keep = np.where(has_corr, device_keep, device.f("ts") <= end)
        window = AnalysisWindow(basis=basis, end_us=end - origin, excluded_last_step=not include_last_step)
        if release:
            # The table lets go of its columns first, so each raw column is freed as soon as its
            # windowed copy exists: the peak is the raw table plus one column, not two tables.
            table.release()
        device, host, cpu = _take(device, device_keep), _take(host, host_keep), _take(cpu, cpu_keep)
        del device_keep, host_keep, cpu_keep
        step_in_window = step_start < end if not include_last_step else np.ones(step_start.size, bool)
    else:
        reason = "no ProfilerStep annotation" if step_numbers.size == 0 else "a single ProfilerStep"
        window = AnalysisWindow(basis=f"the whole trace ({reason})", end_us=None, excluded_last_step=False)
        step_in_window = np.ones(step_start.size, bool)

    if release:
        table.release()
    category, kind = _classify(table, device)
    device.data["category"] = category
    device.data["kind"] = kind
    if release:
        release_for(len(host) + len(cpu))  # the raw columns, freed while the windowed ones were copied
    launch = _launch_rows(device, host)
    device.data["launch"] = launch
    # ROCm records copy sizes on the host call (``size``), not on the device copy.
    nbytes = device.f("nbytes")
    missing = np.isnan(nbytes) & (launch >= 0)
    if missing.any():
        filled = np.where(missing, host.f("nbytes")[np.maximum(launch, 0)], nbytes)
        device.data["nbytes"] = filled
    return Prepared(
        table=table,
        device=device,
        host=host,
        cpu=cpu,
        origin=origin,
        window=window,
        time_basis="hta_rounded" if time_basis == "hta_rounded" else "exact",
        step_numbers=step_numbers,
        step_start=step_start,
        step_dur=step_dur,
        step_in_window=step_in_window,
    )
