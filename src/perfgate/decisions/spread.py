"""The baseline's own run-to-run spread: how tight an equivalence claim can be.

An equivalence claim is only as tight as the baseline can reproduce itself. Two launches of the baseline
under the same seeds and precision that dump tensors at the same step either write bit-identical files (a
deterministic baseline) or do not (nondeterministic kernels: atomics, another reduction order per run). The
ledger holds both facts without reading a file: each window record names its launches' dumps (step, rank,
digest), and a ``compare_tensors`` of two baseline launches' dumps records how far they moved apart, per
tensor and dtype.

The ceiling a check of the candidate is held to, per dtype (see :func:`ceiling_for`):

- the per-dtype table (:func:`perfgate.decisions.equivalence.ceiling`) by default, and always for a
  deterministic baseline (never looser than the table: reordering a reduction is what a faster kernel may
  do, whatever the baseline's determinism);
- for a baseline whose launches' dumps at the check's step differ, and whose spread a ``compare_tensors`` of
  two of those dumps measured: ``SPREAD_FACTOR`` times that spread (max abs error -> atol, max rel error ->
  rtol) where it exceeds the table, bounded by the table's per-dtype maximum
  (:func:`perfgate.decisions.equivalence.maximum`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from perfgate.decisions.equivalence import Ceiling, Limit, ceiling, maximum
from perfgate.evidence import EvidenceRecord
from perfgate.evidence.access import as_dict, as_list, str_list
from perfgate.security.digests import entry_digest, format_digest

__all__ = ["SPREAD_FACTOR", "BaselineSpread", "baseline_spread", "ceiling_for", "check_step"]

SPREAD_FACTOR = 2.0
"""The candidate may differ from a baseline launch by this many times what two baseline launches differ by
(the loss trajectory's margin too): each is one draw of the same nondeterministic computation."""

Lookup = Callable[[str], EvidenceRecord | None]


@dataclass(frozen=True)
class _Dump:
    window: str
    launch: int
    rank: int
    step: int
    path: str
    digest: str

    @property
    def run(self) -> str:
        return f"{self.window}/{self.launch}"


@dataclass
class BaselineSpread:
    """What the baseline's launches show at one step.

    ``identical``: launches whose dumps are bit-identical (a deterministic baseline); ``differing``: launches
    whose dumps differ; ``measured``: dtype -> (max abs error, max rel error) a compare_tensors of two
    differing launches' dumps recorded (``check_id``); ``pair``: two differing dumps (paths) to compare when
    none did."""

    step: int
    identical: list[str] = field(default_factory=list[str])
    differing: list[str] = field(default_factory=list[str])
    measured: dict[str, tuple[float, float]] = field(default_factory=dict[str, tuple[float, float]])
    check_id: str | None = None
    pair: tuple[str, str] | None = None


def _dumps(windows: Iterable[str], lookup: Lookup) -> list[_Dump]:
    out: list[_Dump] = []
    for wid in windows:
        record = lookup(wid)
        for d in (as_dict(x) for x in as_list(record.result.get("tensor_dumps") if record else [])):
            named = entry_digest(d)
            launch, rank, step = d.get("launch", 0), d.get("rank", 0), d.get("step")
            if named is None or not isinstance(step, int) or not isinstance(launch, int):
                continue
            out.append(
                _Dump(
                    wid,
                    launch,
                    rank if isinstance(rank, int) else 0,
                    step,
                    str(d.get("path")),
                    format_digest(*named),
                )
            )
    return out


def check_step(check: EvidenceRecord, lookup: Lookup, role: str = "reference") -> int | None:
    """The step at which the ``role`` file of a tensor check was dumped (from its producer's record)."""
    for p in (as_dict(x) for x in as_list(check.result.get("producers"))):
        eid = p.get("evidence_id")
        if p.get("role") != role or not isinstance(eid, str):
            continue
        record = lookup(eid)
        named = entry_digest(p)
        for d in (as_dict(x) for x in as_list(record.result.get("tensor_dumps") if record else [])):
            if d.get("path") == p.get("path") and entry_digest(d) == named and isinstance(d.get("step"), int):
                return int(d["step"])
    return None


def baseline_spread(
    comparison: EvidenceRecord, step: int, lookup: Lookup, checks: Iterable[EvidenceRecord]
) -> BaselineSpread:
    """What the comparison's baseline launches show about their own reproducibility at ``step`` (rank 0's
    dumps; ``checks``: every compare_tensors record in the ledger, searched for one of two of them)."""
    windows = str_list(comparison.inputs.get("baseline"))
    dumps = [d for d in _dumps(windows, lookup) if d.step == step and d.rank == 0]
    by_run: dict[str, list[_Dump]] = {}
    for d in dumps:
        by_run.setdefault(d.run, []).append(d)
    out = BaselineSpread(step=step)
    if len(by_run) < 2:
        return out
    contents = {run: sorted(x.digest for x in ds) for run, ds in by_run.items()}
    first = next(iter(by_run))
    for run, digests in contents.items():
        (out.identical if digests == contents[first] else out.differing).append(run)
    if not out.differing:
        return out
    out.differing.insert(0, first)
    out.identical.remove(first)
    out.pair = (by_run[first][0].path, by_run[out.differing[1]][0].path)
    mine = {(d.window, d.path, d.digest) for d in dumps}
    for check in checks:
        spread = _measured(check, mine)
        if spread is None:
            continue
        out.check_id = check.id
        for dtype, (a, r) in spread.items():
            prev = out.measured.get(dtype, (0.0, 0.0))
            out.measured[dtype] = (max(prev[0], a), max(prev[1], r))
    return out


def _measured(
    check: EvidenceRecord, mine: set[tuple[str, str, str]]
) -> dict[str, tuple[float, float]] | None:
    """dtype -> (max abs, max rel error) of a check of two different baseline launches' dumps at the step,
    listing every tensor it compared; None for any other check."""
    if check.tool != "compare_tensors" or check.result.get("status") not in ("match", "mismatch"):
        return None
    runs: set[tuple[str, object]] = set()
    for p in (as_dict(x) for x in as_list(check.result.get("producers"))):
        named = entry_digest(p)
        eid = p.get("evidence_id")
        if named is None or (eid, p.get("path"), format_digest(*named)) not in mine:
            return None
        runs.add((str(eid), p.get("launch")))
    tensors = [as_dict(t) for t in as_list(check.result.get("tensors"))]
    if len(runs) != 2 or not tensors or check.result.get("tensors_total") != len(tensors):
        return None
    out: dict[str, tuple[float, float]] = {}
    for t in tensors:
        dtype, a, r = t.get("dtype_reference"), t.get("max_abs_error"), t.get("max_rel_error")
        if not isinstance(dtype, str):
            return None
        prev = out.get(dtype, (0.0, 0.0))
        out[dtype] = (
            max(prev[0], float(a) if isinstance(a, (int, float)) else 0.0),
            max(prev[1], float(r) if isinstance(r, (int, float)) else 0.0),
        )
    return out


def ceiling_for(dtype: str, spread: BaselineSpread | None) -> Limit:
    """The ceiling for ``dtype`` under what the baseline showed (None: its reproducibility is not known)."""
    table = ceiling(dtype)
    if table is None:
        return Limit(None, f"no shipped tolerance for {dtype}: only bit-exact")
    shown = f"per-dtype table: {dtype} atol {table.atol:g}, rtol {table.rtol:g}"
    if spread is None or not (spread.identical or spread.differing):
        return Limit(table, shown)
    if not spread.differing:
        runs = ", ".join(spread.identical)
        return Limit(
            table, f"{shown} (the baseline is bit-identical over launches {runs} at step {spread.step})"
        )
    measured = spread.measured.get(dtype)
    if measured is None:
        return Limit(
            table,
            f"{shown} (the baseline's launches {', '.join(spread.differing)} differ at step {spread.step}, but no "
            f"compare_tensors of two of them measured how far for {dtype})",
        )
    top = maximum(dtype)
    assert top is not None  # every dtype with a table ceiling has a maximum
    a, r = measured
    raised = Ceiling(
        atol=min(top.atol, max(table.atol, SPREAD_FACTOR * a)),
        rtol=min(top.rtol, max(table.rtol, SPREAD_FACTOR * r)),
    )
    bounded = (
        " (bounded by the table's maximum)" if raised.atol == top.atol or raised.rtol == top.rtol else ""
    )
    return Limit(
        raised,
        f"from the baseline's spread over launches {', '.join(spread.differing[:2])} at step {spread.step} "
        f"({spread.check_id}: max abs {a:g}, max rel {r:g}): {dtype} atol {raised.atol:g}, rtol {raised.rtol:g}"
        f"{bounded}",
    )
