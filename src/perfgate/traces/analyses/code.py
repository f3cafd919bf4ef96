"""Which code owns a step's time: the nn.Module, the Python source line, the record_function range.

torch.profiler's Python tracer (``with_stack=True``) writes each Python call as a ``python_function``
event named ``file.py(N): func`` (N is the first line of the function's code, or for a frame already
running when tracing starts the line it was at; a comprehension is code of its own, so a list
comprehension is named by its own line), ``<built-in ...>`` for C functions, and
``nn.Module: Class_K`` around each module call (K numbers the instances of a class). The harness adds
``nn.Module: qualified.name (Class)`` ranges (record_function) when it captures with modules, which
also name modules without stacks. ``with_modules`` itself adds nothing to eager-mode traces.

An op's *owner* is its innermost enclosing user frame (a file outside torch, perfgate and the standard
library, not a built-in) and the module whose code that frame is (for a frame outside every module,
the outermost module around the op: the model the line runs); its *call site* is the innermost user
frame outside every module (the training loop's line). A record_function range the user opened
(any ``user_annotation`` but torch's step, optimizer and DataLoader ranges and module ranges) is named
as the *region*.

Every "innermost enclosing X" is found for all rows at once by pointer jumping up the parent rows
(`nearest`: log2 of the nesting depth passes over the rows), so a trace with stacks costs a few passes
over its CPU table, and a trace without them none.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from perfgate.harness.line_ranges import LINE_PREFIX
from perfgate.traces.analyses.intervals import clip, union_length
from perfgate.traces.analyses.ops import cpu_parents, parent_rows
from perfgate.traces.analyses.phases import SHORT_OP_US, analysis_window, phase_of_name
from perfgate.traces.classify import IMPLICIT_SYNC_OPS
from perfgate.traces.models import CodeSite, CodeView, OpLoop
from perfgate.traces.reading._np import int_list
from perfgate.traces.reading.prepare import Prepared
from perfgate.traces.reading.table import Ints

__all__ = ["MISSING_STACKS", "STACK_HINT", "code_view", "find_loops", "module_names", "nearest", "user_frame"]

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]

MISSING_STACKS = (
    "no Python stacks in the trace: profile_segment with_stack=true (torch.profiler with_stack=True) names "
    "the module and source line"
)
STACK_HINT = "capture with with_stack=true to name the module and line"
MODULE_PREFIX = "nn.Module: "
_FRAME = re.compile(r"^(?P<file>[^<][^(]*)\((?P<line>\d+)\): (?P<func>.+)$")
_PACKAGES = frozenset({"torch", "perfgate", "functorch", "triton", "torchgen"})
_LIBRARIES = _PACKAGES | frozenset(sys.stdlib_module_names)
_TORCH_RANGES = (
    "ProfilerStep#",
    "Optimizer.",
    "Optimizer#",
    "enumerate(DataLoader)",
    MODULE_PREFIX,
    LINE_PREFIX,
)
_MIN_ITERATIONS = 4
_MAX_BODY = 256
_MAX_LOOP_OPS = 200_000
_LOOP_STEPS = 2
_TOP = 3


def nearest(parent: Ints, target: npt.NDArray[np.bool_]) -> I64:
    """For each row, its nearest strict ancestor (by ``parent`` rows) where ``target`` holds; -1 if none.

    Pointer jumping: ``hit[i]`` is the nearest target on the path above ``i`` up to and including
    ``up[i]``; each pass lets unresolved rows jump to ``up[up[i]]``, doubling the path they have checked.
    """
    hit = np.full(parent.size, -1, np.int64)
    if not target.any():
        return hit
    up = parent.astype(np.int64)
    has = up >= 0
    hit[has] = np.where(target[up[has]], up[has], -1)
    active = np.flatnonzero((hit < 0) & has)
    while active.size:
        u = up[active]
        h, uu = hit[u], up[u]
        hit[active], up[active] = h, uu
        active = active[(h < 0) & (uu >= 0)]
    return hit


def user_frame(name: str) -> tuple[str, str, str] | None:
    """(file, line, function) of a Python frame event in the user's code, None for library frames."""
    match = _FRAME.match(name)
    if match is None:
        return None
    file = match["file"].replace("\\", "/")
    parts = file.split("/")
    # A library by its top module (relative names), or by a package folder anywhere in an absolute path
    # (a copy of perfgate's harness on PYTHONPATH, a torch outside site-packages).
    if (
        parts[0].removesuffix(".py") in _LIBRARIES
        or not _PACKAGES.isdisjoint(parts[:-1])
        or "/lib/python" in file
    ):
        return None
    return file, match["line"], match["func"]


def module_names(name: str) -> tuple[str, str | None] | None:
    """(class, qualified name or None) of a module event (``nn.Module: Class_K`` from the Python tracer,
    ``nn.Module: qual.name (Class)`` from the harness); None for any other name."""
    if not name.startswith(MODULE_PREFIX):
        return None
    rest = name[len(MODULE_PREFIX) :]
    if rest.endswith(")") and " (" in rest:
        qual, cls = rest[:-1].rsplit(" (", 1)
        return cls, qual
    return rest.rsplit("_", 1)[0] if "_" in rest else rest, None


@dataclass
class _Index:
    """Per CPU row: the innermost user frame, module and user range above it (strict ancestors).

    Python frames nest among themselves and ops and ranges among themselves, but not with each other
    (a record_function range opens inside the builtin call that creates it and outlives it), so two
    trees are kept: ``op_parent`` over ops and ranges (python frames excluded), and ``up`` over python
    frames, where an op or range hangs from the innermost frame open when it starts.
    """

    p: Prepared
    op_parent: Ints
    up: I64
    ts: F64
    end: F64
    names: Ints
    frames: dict[int, tuple[str, str, str]]
    modules: dict[int, tuple[str, str | None]]
    qual: dict[int, str]
    """Qualified name of a python module event, from the harness range it holds."""
    is_user: npt.NDArray[np.bool_]
    inner_user: I64
    inner_module: I64
    inner_region: I64
    site: I64
    lines: dict[int, tuple[str, str, str]]
    """(file, line, function) of each ``perfgate.line:`` range name (the loop's line, harness runs)."""
    inner_line: I64
    """Per row: the innermost line range on its thread (-1: none)."""
    line_rows: I64
    """The line ranges, by start time."""

    @classmethod
    def build(cls, p: Prepared) -> _Index:
        cpu, table = p.cpu, p.table
        names = cpu.i("name")
        present = int_list(np.flatnonzero(np.bincount(names, minlength=len(table.names))))
        frames: dict[int, tuple[str, str, str]] = {}
        modules: dict[int, tuple[str, str | None]] = {}
        lines: dict[int, tuple[str, str, str]] = {}
        region_ids: list[int] = []
        cats = cpu.i("cat")
        annotation = table.cats.index("user_annotation") if "user_annotation" in table.cats else -1
        annotated = set(int_list(np.unique(names[cats == annotation]))) if annotation >= 0 else set[int]()
        for i in present:
            name = table.names[i]
            frame = user_frame(name)
            if frame is not None:
                frames[i] = frame
            module = module_names(name)
            if module is not None:
                modules[i] = module
            elif name.startswith(LINE_PREFIX):
                at = _FRAME.match(name[len(LINE_PREFIX) :])
                if at is not None:
                    lines[i] = (at["file"].replace("\\", "/"), at["line"], at["func"])
            elif i in annotated and not name.startswith(_TORCH_RANGES):
                region_ids.append(i)
        ts, dur, tid = cpu.f("ts"), cpu.f("dur"), cpu.i("tid")
        end = ts + dur
        python_cat = table.cats.index("python_function") if "python_function" in table.cats else -1
        is_python = cats == python_cat
        if is_python.any():
            op_parent = _parents_within(ts, dur, tid, ~is_python)
            up = _parents_within(ts, dur, tid, is_python).astype(np.int64)
            others = np.flatnonzero(~is_python)
            up[others] = _open_frame(ts, end, tid, np.flatnonzero(is_python), up, others)
        else:
            op_parent = cpu_parents(p)
            up = op_parent.astype(np.int64)
        is_user = np.isin(names, np.array(list(frames), np.int64))
        is_module = np.isin(names, np.array(list(modules), np.int64))
        py_module = is_module & is_python
        inner_range = nearest(op_parent, is_module & ~is_python)
        inner_module = nearest(up, py_module)
        inner_module = np.where(inner_module >= 0, inner_module, inner_range)
        qual = _qualified(
            ts, end, tid, names, modules, np.flatnonzero(py_module), np.flatnonzero(is_module & ~is_python)
        )
        # The call site: the innermost user frame that no module encloses.
        site = nearest(up, is_user & (inner_module < 0))
        inner_region = nearest(op_parent, np.isin(names, np.array(region_ids, np.int64)))
        is_line = np.isin(names, np.array(list(lines), np.int64))
        line_rows = np.flatnonzero(is_line)
        line_rows = line_rows[np.argsort(ts[line_rows], kind="stable")]
        return cls(p, op_parent, up, ts, end, names, frames, modules, qual, is_user, nearest(up, is_user),
                   inner_module, inner_region, site, lines, nearest(op_parent, is_line), line_rows)  # fmt: skip

    def line_of(self, rows: I64, frames: I64) -> I64:
        """The loop line range each row runs under: its innermost one on its thread, or for a row with
        no user frame of its own (autograd's device threads), the one open on any thread at its start."""
        line = self.inner_line[rows]
        spare = (line < 0) & (frames < 0)
        if self.line_rows.size and spare.any():
            at = rows[spare]
            k = np.searchsorted(self.ts[self.line_rows], self.ts[at], side="right") - 1
            cand = self.line_rows[np.maximum(k, 0)]
            line[spare] = np.where((k >= 0) & (self.end[cand] > self.ts[at]), cand, -1)
        return line

    def _loop_line(self, frame: int, line: int) -> tuple[str, bool] | None:
        """``file:line func`` of the loop line ``line``, and whether ``frame`` is the loop's own frame
        (its name's line is where tracing began, not this op's)."""
        if line < 0:
            return None
        file, number, func = self.lines[int(self.names[line])]
        loop = int(self.inner_user[line])
        if loop < 0:
            return None
        loop_file, _, loop_func = self.frames[int(self.names[loop])]
        if loop_func != func or not (file == loop_file or file.endswith("/" + loop_file)):
            return None
        return f"{loop_file}:{number} {func}", frame == loop

    def own_lines(self, frame: int, rows: I64) -> list[int]:
        """The line numbers of ``frame``'s own loop line ranges that ``rows`` run under, in order."""
        line = self.line_of(rows, self.owner_frame(rows))
        numbers: set[int] = set()
        for row in int_list(np.unique(line[line >= 0])):
            at = self._loop_line(frame, row)
            if at is not None and at[1]:
                numbers.add(int(self.lines[int(self.names[row])][1]))
        return sorted(numbers)

    def owner_frame(self, rows: I64) -> I64:
        """The user frame that owns each row: the row itself when it is one, else its innermost."""
        return np.where(self.is_user[rows], rows, self.inner_user[rows])

    def _frame_text(self, row: int, lines: Sequence[int] = ()) -> str | None:
        """``file:line func`` of a frame row; with ``lines`` (its own loop lines, in order), those lines
        (``file:15-16 func``) in place of the line its name carries."""
        if row < 0:
            return None
        file, line, func = self.frames[int(self.names[row])]
        if lines:
            line = f"{lines[0]}-{lines[-1]}" if len(lines) > 1 else str(lines[0])
        return f"{file}:{line} {func}"

    def module_of(self, frames: I64, rows: I64) -> I64:
        """The module of each owner frame (the one whose code the line is in); for a frame outside every
        module (a training loop calling a model built of library modules), the outermost module around
        the row: the model that line runs."""
        inside = self.inner_module[np.maximum(frames, 0)]
        own = np.where(frames >= 0, inside, -1)
        outer = self.inner_module[rows]
        while True:
            up = np.where(outer >= 0, self.inner_module[np.maximum(outer, 0)], -1)
            more = up >= 0
            if not more.any():
                break
            outer = np.where(more, up, outer)
        return np.where(own >= 0, own, outer)

    def site_of(
        self,
        frame: int,
        row: int,
        module: int | None = None,
        line: int | None = None,
        lines: Sequence[int] = (),
    ) -> CodeSite:
        """The `CodeSite` of an owner frame row (or -1) for a representative attributed ``row``; ``line``:
        the loop line range it runs under (found from ``row`` when not given); ``lines``: the frame's own
        lines that the attributed rows run (`own_lines`), which name its location."""
        if line is None:
            line = int(self.line_of(np.array([row]), np.array([frame]))[0])
        loop_line = self._loop_line(frame, line)
        if frame < 0 and loop_line is not None:
            frame = int(self.inner_user[line])
            loop_line = (loop_line[0], True)
        if module is None:
            module = int(self.module_of(np.array([frame]), np.array([row]))[0])
        in_module = frame >= 0 and self.inner_module[frame] >= 0
        chain: list[str] = []
        m = module
        while m >= 0 and len(chain) < 12:
            qual = self.modules[int(self.names[m])][1] or self.qual.get(m)
            if qual is not None:
                # A harness range names the module's place in the model: the whole path.
                chain.insert(0, qual)
                break
            chain.insert(0, self.p.table.names[int(self.names[m])][len(MODULE_PREFIX) :])
            m = int(self.inner_module[m])
        cls_name = self.modules[int(self.names[module])][0] if module >= 0 else None
        path = ".".join(chain) if chain else None
        location = self._frame_text(frame, lines)
        site = int(self.site[frame]) if frame >= 0 and self.inner_module[frame] >= 0 else -1
        call_site = self._frame_text(site)
        if loop_line is not None:
            # The loop's line at this op: the loop frame's own location, or where the owner was called.
            if loop_line[1]:
                location = loop_line[0]
            else:
                call_site = loop_line[0]
        region = int(self.inner_region[row])
        region_name = self.p.table.names[int(self.names[region])] if region >= 0 else None
        if location is not None:
            file_line, func = location.split(" ", 1)
            label = f"{cls_name}.{func} ({file_line})" if in_module else f"{func} ({file_line})"
        elif cls_name is not None:
            label = f"{cls_name} ({path})"
        else:
            label = region_name or "unattributed"
        return CodeSite(label=label, module=cls_name, module_path=path, location=location,
                        call_site=call_site, region=region_name, us_per_step=0.0, share=0.0)  # fmt: skip

    def attribute(self, rows: I64, weights: F64, per_step: int, k: int = _TOP) -> list[CodeSite]:
        """The ``k`` owners (frame, module, region) with the most weight among ``rows``."""
        if rows.size == 0:
            return []
        frames = self.owner_frame(rows)
        line = self.line_of(rows, frames)
        # A row no user frame holds (autograd's device threads) belongs to the loop line it runs under.
        loop = np.where(line >= 0, self.inner_user[np.maximum(line, 0)], -1)
        frames = np.where((frames < 0) & (loop >= 0), loop, frames)
        modules = self.module_of(frames, rows)
        key_frame = np.where(frames >= 0, self.names[np.maximum(frames, 0)], -1).astype(np.int64)
        key_module = np.where(modules >= 0, self.names[np.maximum(modules, 0)], -1).astype(np.int64)
        key_region = self.inner_region[rows]
        key_region = np.where(key_region >= 0, self.names[np.maximum(key_region, 0)], -1).astype(np.int64)
        key_line = np.where(line >= 0, self.names[np.maximum(line, 0)], -1).astype(np.int64)
        keys = np.stack([key_frame, key_module, key_region, key_line], axis=1)
        uniq, first, inverse = np.unique(keys, axis=0, return_index=True, return_inverse=True)
        sums = np.bincount(inverse.ravel(), weights=weights, minlength=len(uniq))
        total = float(weights.sum())
        out: list[CodeSite] = []
        for u in int_list(np.argsort(-sums, kind="stable")[:k]):
            if sums[u] <= 0 or (uniq[u] < 0).all():
                continue
            at = first[u]
            site = self.site_of(int(frames[at]), int(rows[at]), int(modules[at]), int(line[at]))
            site.us_per_step = float(sums[u]) / per_step
            site.share = float(sums[u]) / total if total > 0 else 0.0
            out.append(site)
        return out


def _parents_within(ts: F64, dur: F64, tid: Ints, mask: npt.NDArray[np.bool_]) -> Ints:
    """`parent_rows` among the masked rows only (rows of the table; -1 elsewhere)."""
    rows = np.flatnonzero(mask)
    out = np.full(ts.size, -1, np.int64)
    sub = parent_rows(ts[rows], dur[rows], tid[rows])
    has = sub >= 0
    out[rows[has]] = rows[sub[has]]
    return out


def _open_frame(ts: F64, end: F64, tid: Ints, frames: I64, parent: I64, rows: I64) -> I64:
    """For each of ``rows``, the innermost of ``frames`` (which nest, by ``parent``) open at its start on
    its thread: the last frame started at or before it, climbed while it has already ended."""
    out = np.full(rows.size, -1, np.int64)
    for thread in int_list(np.unique(tid[rows])):
        mine = frames[tid[frames] == thread]
        if mine.size == 0:
            continue
        mine = mine[np.argsort(ts[mine], kind="stable")]
        at = np.flatnonzero(tid[rows] == thread)
        t = ts[rows[at]]
        k = np.searchsorted(ts[mine], t, side="right") - 1
        cand = np.where(k >= 0, mine[np.maximum(k, 0)], -1)
        while True:
            closed = (cand >= 0) & (end[np.maximum(cand, 0)] <= t)
            if not closed.any():
                break
            cand[closed] = parent[cand[closed]]
        out[at] = cand
    return out


def _qualified(
    ts: F64, end: F64, tid: Ints, names: Ints, modules: dict[int, tuple[str, str | None]],
    python_modules: I64, ranges: I64,
) -> dict[int, str]:  # fmt: skip
    """The qualified name of each python-tracer module event: the first harness range of the same class
    that starts inside it (the range opens in the module's forward pre-hook)."""
    out: dict[int, str] = {}
    if python_modules.size == 0 or ranges.size == 0:
        return out
    for thread in int_list(np.unique(tid[python_modules])):
        mine = ranges[tid[ranges] == thread]
        if mine.size == 0:
            continue
        mine = mine[np.argsort(ts[mine], kind="stable")]
        events = python_modules[tid[python_modules] == thread]
        k = np.searchsorted(ts[mine], ts[events], side="left")
        for event, j in zip(int_list(events), int_list(k), strict=True):
            if j >= mine.size:
                continue
            r = int(mine[j])
            cls_name, qual = modules[int(names[r])]
            if qual is not None and end[r] <= end[event] and cls_name == modules[int(names[event])][0]:
                out[event] = qual
    return out


def _top_level_ops(p: Prepared, parent: Ints) -> npt.NDArray[np.bool_]:
    cpu = p.cpu
    op_cats = np.array([i for i, c in enumerate(p.table.cats) if c in ("cpu_op", "Operator")], np.int64)
    is_op = np.isin(cpu.i("cat"), op_cats)
    return is_op & ((parent < 0) | ~is_op[np.maximum(parent, 0)])


_REPEAT_ROWS = 8192
"""Positions compared at once by `_repeat_counts` (times the bodies: its working memory, in bytes)."""


def _repeat_counts(names: Ints, max_body: int) -> npt.NDArray[np.int64]:
    """``counts[b]`` = how many ``j`` have ``names[j] == names[j + b]``, for each body ``b`` from 1 to
    ``max_body`` (index 0 unused): every body in a few array operations, in blocks of `_REPEAT_ROWS`
    positions, instead of one pass over the sequence per body."""
    n = names.size
    counts = np.zeros(max_body + 1, np.int64)
    # Past the end come values no name has (names are ids >= 0): a position there never matches.
    padded = np.concatenate([names.astype(np.int64, copy=False), np.full(max_body, -1, np.int64)])
    ahead = np.lib.stride_tricks.sliding_window_view(padded, max_body + 1)
    for lo in range(0, n, _REPEAT_ROWS):
        block = ahead[lo : min(lo + _REPEAT_ROWS, n)]
        counts[1:] += np.count_nonzero(block[:, 1:] == block[:, :1], axis=0)
    return counts


def find_loops(
    names: Ints, min_iterations: int = _MIN_ITERATIONS, max_body: int = _MAX_BODY
) -> list[tuple[int, int, int]]:
    """Runs of one op sequence repeated back to back: (first index, body length, iterations).

    A body of length b repeats from i while ``names[j] == names[j + b]``; the shortest body is found
    first (bodies from 1 to ``max_body``) and a longer one is kept only where most of its span is not
    already a loop. A body whose positions repeat fewer than ``b * (min_iterations - 1)`` times in all
    holds no run (counted for every body at once, `_repeat_counts`).
    """
    n = names.size
    covered = np.zeros(n, bool)
    out: list[tuple[int, int, int]] = []
    longest = min(max_body, n // min_iterations)
    if longest < 1:
        return out
    counts = _repeat_counts(names, longest)
    for body in range(1, longest + 1):
        if counts[body] < body * (min_iterations - 1):
            continue
        same = names[body:] == names[:-body]
        edges = np.diff(np.concatenate([[0], same.astype(np.int8), [0]]))
        starts, stops = np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)
        long = (stops - starts) >= body * (min_iterations - 1)
        for s, e in zip(int_list(starts[long]), int_list(stops[long]), strict=True):
            iterations = (e - s + body) // body
            span = covered[s : s + iterations * body]  # a view: marking it marks `covered`
            if np.count_nonzero(span) * 2 > span.size:  # mostly a loop already
                continue
            span[:] = True
            out.append((s, body, iterations))
    return out


def _loops(ix: _Index, rows: I64, steps: list[tuple[float, float]]) -> list[OpLoop]:
    """Loops of the top-level ops (all threads, in time order) of the window's first `_LOOP_STEPS` steps,
    per step, by body and owner."""
    p = ix.p
    ts, end, dur = ix.ts, ix.end, p.cpu.f("dur")
    order = rows[np.argsort(ts[rows], kind="stable")]
    found: dict[tuple[tuple[int, ...], str | None], OpLoop] = {}
    # Loops repeat step after step: the first steps of the window tell (the search is O(ops x bodies)).
    steps = steps[:_LOOP_STEPS]
    per_step = len(steps)
    for lo, hi in steps:
        step_rows = order[(ts[order] >= lo) & (ts[order] < hi)][:_MAX_LOOP_OPS]
        seq = ix.names[step_rows]
        for s, body, iterations in find_loops(seq):
            members = step_rows[s : s + body * iterations]
            body_ids = tuple(int_list(seq[s : s + body]))
            span = float(end[members].max() - ts[members[0]])
            owner = _loop_owner(ix, members) if ix.frames or ix.modules else None
            key = (body_ids, owner.label if owner is not None else None)
            if key in found:
                loop = found[key]
                loop.iterations += iterations / per_step
                loop.us_per_step += span / per_step
                continue
            distinct = list(dict.fromkeys(p.table.names[i] for i in body_ids))
            found[key] = OpLoop(
                ops=distinct[:4],
                ops_per_iteration=body,
                iterations=iterations / per_step,
                us_per_step=span / per_step,
                op_p50_us=float(np.median(dur[members])),
                backward=all(phase_of_name(p.table.names[i]) == "backward" for i in body_ids),
                owner=owner,
            )
    return sorted(found.values(), key=lambda loop: -loop.us_per_step)


def _loop_owner(ix: _Index, members: I64) -> CodeSite | None:
    """The innermost user frame (or module, without stacks) whose span holds the whole loop; for the
    training loop's own frame (module-level code, a ``main()``), the lines of it that run the loop's ops
    (``file:15-16 <module>``), not the line its frame is named by (where tracing began)."""
    first, last_end = int(members[0]), float(ix.end[members].max())
    for ancestors in (ix.inner_user, ix.inner_module):
        row = int(ancestors[first])
        while row >= 0 and ix.end[row] < last_end:
            row = int(ancestors[row])
        if row >= 0:
            frame = row if ix.is_user[row] else -1
            if frame < 0:
                return ix.site_of(frame, first)
            return ix.site_of(frame, row, lines=ix.own_lines(frame, members))
    return None


def _backward_passes(
    ix: _Index, top: npt.NDArray[np.bool_], lo: float, hi: float, per_step: int
) -> float | None:
    """backward() calls per step: runs of top-level autograd nodes separated by grad-mode forward ops."""
    p = ix.p
    names = p.table.names
    # Autograd nodes: their evaluate_function ranges and the node ops themselves (which some traces
    # write beside the range rather than inside it).
    backward_ids = np.array([i for i, n in enumerate(names) if phase_of_name(n) == "backward"], np.int64)
    ts = ix.ts
    rows = np.flatnonzero(top & (ts >= lo) & (ts < hi))
    if backward_ids.size == 0 or rows.size == 0:
        return None
    rows = rows[np.argsort(ts[rows], kind="stable")]
    is_backward = np.isin(ix.names[rows], backward_ids)
    forward = (p.cpu.i("grad")[rows] == 1) & ~is_backward
    # Keep only the labelled rows (backward node or grad-mode forward op): a pass starts at a backward
    # node whose previous labelled row is a forward op (or that opens the step's sequence).
    keep = is_backward | forward
    labels = is_backward[keep]
    if not labels.any():
        return None
    starts = labels & np.concatenate([[True], ~labels[:-1]])
    return float(starts.sum()) / per_step


def code_view(p: Prepared) -> CodeView | None:
    """Owning code per phase, of the tiny ops, of backward(); loops and backward passes per step."""
    cpu = p.cpu
    if len(cpu) == 0:
        return None
    lo, hi, steps = analysis_window(p)
    if hi <= lo:
        return None
    per_step = max(steps, 1)
    table = p.table
    python = "python_function" in table.category_counts
    ix = _Index.build(p)
    stacks = bool(ix.frames) and python
    has_modules = bool(ix.modules)
    top = _top_level_ops(p, ix.op_parent)
    ts, dur = ix.ts, cpu.f("dur")
    window = (ts >= lo) & (ts < hi)
    top_rows = np.flatnonzero(top & window)
    name_ids = ix.names
    phase_ids: dict[str, list[int]] = {}
    for i in int_list(np.unique(name_ids)):
        ph = phase_of_name(table.names[i])
        if ph is not None:
            phase_ids.setdefault(ph, []).append(i)
    sites: dict[str, list[CodeSite]] = {}
    no_grad_us: float | None = None
    if stacks or has_modules:
        named = {ph: np.isin(name_ids, np.array(ids, np.int64)) for ph, ids in phase_ids.items()}
        any_named = np.isin(name_ids, np.array([i for ids in phase_ids.values() for i in ids], np.int64))
        # Ops inside a named range (a DataLoader fetch, the optimizer) belong to that phase, as in
        # `host_breakdown`: not to the forward or no-grad pass.
        unnamed = ~any_named[top_rows] & (nearest(ix.op_parent, any_named)[top_rows] < 0)
        grad = cpu.i("grad")[top_rows] == 1
        no_grad_rows = top_rows[unnamed & ~grad]
        no_grad_us = _pure_frames_us(ix, no_grad_rows, top_rows[grad], lo, hi) / per_step if stacks else None
        for ph, rows in (
            ("forward", top_rows[unnamed & grad]),
            ("no_grad", no_grad_rows),
            ("backward", top_rows[named["backward"][top_rows]] if "backward" in named else top_rows[:0]),
        ):
            found = ix.attribute(rows, dur[rows], per_step)
            if found:
                sites[ph] = found
        sync_ids = np.array(table.name_ids(IMPLICIT_SYNC_OPS), np.int64)
        sync_rows = np.flatnonzero(np.isin(name_ids, sync_ids) & window)
        found = ix.attribute(sync_rows, dur[sync_rows], per_step)
        if found:
            sites["sync"] = found
        if "optimizer" in named:
            # The optimizer's own ranges (step, zero_grad): the line that calls them owns their time.
            opt_rows = np.flatnonzero(named["optimizer"] & window)
            found = ix.attribute(opt_rows, dur[opt_rows], per_step)
            if found:
                sites["optimizer"] = found
        if "data_loading" in named:
            found = _data_sites(ix, named["data_loading"] & window, per_step)
            if found:
                sites["data_loading"] = found
    short = top_rows[dur[top_rows] < SHORT_OP_US]
    short_sites = ix.attribute(short, dur[short], per_step) if stacks or has_modules else []
    bounds = _step_bounds(p, lo, hi)
    loops = _loops(ix, np.flatnonzero(top & window), bounds)
    passes = _backward_passes(ix, top, lo, hi, per_step)
    # Autograd nodes run inside backward(): their innermost user frame is the line that called it.
    backward_site = sites["backward"][0] if "backward" in sites else None
    return CodeView(
        stacks=stacks,
        modules=has_modules,
        missing=None if stacks else MISSING_STACKS,
        phases=sites,
        short_ops=short_sites,
        loops=loops[:5],
        backward_passes_per_step=passes,
        backward_site=backward_site,
        no_grad_call_us_per_step=no_grad_us or None,
    )


def _pure_frames_us(ix: _Index, rows: I64, grad_rows: I64, lo: float, hi: float) -> float:
    """Time inside the call sites (user frames outside modules) that run the no-grad ``rows`` and no
    grad-mode op: a whole evaluation call, its Python between ops included (which stack tracing
    inflates, and the op-based no-grad phase leaves out)."""
    frames = np.unique(ix.site[rows])
    frames = frames[frames >= 0]
    mixed = np.unique(ix.site[grad_rows])
    frames = np.setdiff1d(frames, mixed)
    if frames.size == 0:
        return 0.0
    # Only the outermost of them (a pure call inside another counts once), clipped to the window.
    outer = frames[~np.isin(nearest(ix.up, np.isin(np.arange(ix.ts.size), frames))[frames], frames)]
    # The union of the calls' intervals: calls on two threads at once count their time once.
    return union_length(*clip(ix.ts[outer], ix.end[outer], lo, hi))


def _step_bounds(p: Prepared, lo: float, hi: float) -> list[tuple[float, float]]:
    inside = p.step_in_window
    if p.step_numbers.size and inside.any():
        starts = p.step_start[inside]
        return list(zip(starts.tolist(), (starts + p.step_dur[inside]).tolist(), strict=True))
    return [(lo, hi)]


def _data_sites(ix: _Index, loading: npt.NDArray[np.bool_], per_step: int) -> list[CodeSite]:
    """The user code that a DataLoader wait runs: the first user frames inside its ``__next__`` ranges
    (the Dataset's ``__getitem__``, a collate function), by their time."""
    user = np.flatnonzero(ix.is_user)
    ranges = np.flatnonzero(loading)
    if user.size == 0 or ranges.size == 0:
        return []
    # The DataLoader range open when each user frame starts (ranges of one thread do not overlap).
    tid = ix.p.cpu.i("tid")
    inside = _open_frame(ix.ts, ix.end, tid, ranges, np.full(ix.ts.size, -1, np.int64), user)
    frames, holder = user[inside >= 0], inside[inside >= 0]
    outer = ix.inner_user[frames]
    # First below the range: the frame's own innermost user frame starts before the range (or is none).
    first = (outer < 0) | (ix.ts[np.maximum(outer, 0)] <= ix.ts[holder])
    frames = frames[first]
    return ix.attribute(frames, ix.end[frames] - ix.ts[frames], per_step)
