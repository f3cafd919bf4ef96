"""How far an "equivalent" change's tensors may drift: a shipped per-dtype ceiling the agent does not choose.

The defaults are ``torch.testing.assert_close``'s per-dtype ``(rtol, atol)`` (torch/testing/_comparison.py,
``_DTYPE_PRECISIONS``; the table in the ``assert_close`` docstring): the rounding PyTorch's own tests accept
between two computations of the same math. A faster kernel, fusion, vectorized loop or another thread count
sums in another order; that rounding grows with the length of the reduction, so the ceiling allows a fixed
factor over the defaults (``REORDER_ALLOWANCE``). A check looser than the ceiling for any compared tensor's
dtype may still pass, but it does not show the same numerics: the change is then a training change (task
quality decides), never an equivalent speedup.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from perfgate.evidence import EvidenceRecord
from perfgate.evidence.access import as_dict, as_list

if TYPE_CHECKING:
    from perfgate.tensors import TensorComparison

__all__ = [
    "DEFAULTS",
    "DEFAULTS_SOURCE",
    "MAXIMUM_ALLOWANCE",
    "REORDER_ALLOWANCE",
    "Ceiling",
    "DtypeTolerance",
    "Limit",
    "applied_tolerances",
    "beyond_ceiling",
    "ceiling",
    "label_note",
    "maximum",
    "stricter_than_defaults",
    "tolerance_by_dtype",
]


@dataclass(frozen=True)
class Ceiling:
    rtol: float
    atol: float


@dataclass(frozen=True)
class Limit:
    """The ceiling for one dtype and where it came from (a sentence): the table's, or one the baseline's own
    spread raised (`perfgate.decisions.spread.ceiling_for`)."""

    ceiling: Ceiling | None
    source: str


DEFAULTS: dict[str, Ceiling] = {
    "float16": Ceiling(rtol=1e-3, atol=1e-5),
    "bfloat16": Ceiling(rtol=1.6e-2, atol=1e-5),
    "float32": Ceiling(rtol=1.3e-6, atol=1e-5),
    "float64": Ceiling(rtol=1e-7, atol=1e-7),
    "complex64": Ceiling(rtol=1.3e-6, atol=1e-5),
    "complex128": Ceiling(rtol=1e-7, atol=1e-7),
}
"""torch.testing.assert_close's default (rtol, atol) per floating dtype (torch 2.x)."""

DEFAULTS_SOURCE = "torch.testing.assert_close defaults per dtype (torch/testing/_comparison.py)"

REORDER_ALLOWANCE = 10.0
"""Factor over the defaults allowed for reordered reductions (both atol and rtol): a sum of n terms in
another order differs by a rounding that grows with n (about sqrt(n) ulps on typical data), and a fused or
vectorized kernel reorders reductions far longer than the defaults were set for."""


MAXIMUM_ALLOWANCE = 100.0
"""Factor over the defaults no equivalence ceiling exceeds, whatever the baseline's own run-to-run spread
(:mod:`perfgate.decisions.spread`): a baseline that moves more than this between its own launches cannot
show that a change computes the same thing (make it deterministic, or keep the change as a training change)."""


def maximum(dtype: str) -> Ceiling | None:
    """The loosest ceiling a nondeterministic baseline's measured spread can raise ``dtype``'s to; None: no
    shipped default."""
    base = DEFAULTS.get(dtype)
    if base is None:
        return None
    return Ceiling(rtol=base.rtol * MAXIMUM_ALLOWANCE, atol=base.atol * MAXIMUM_ALLOWANCE)


def ceiling(dtype: str) -> Ceiling | None:
    """The loosest tolerance that still counts as the same numerics for ``dtype``; None: no shipped
    default (float8 and other dtypes torch gives no tolerance for: only a bit-exact check counts)."""
    base = DEFAULTS.get(dtype)
    if base is None:
        return None
    return Ceiling(rtol=base.rtol * REORDER_ALLOWANCE, atol=base.atol * REORDER_ALLOWANCE)


@dataclass(frozen=True)
class DtypeTolerance:
    """The loosest tolerance a check applied to one reference dtype, against that dtype's ceiling."""

    dtype: str
    tensors: int
    atol: float
    rtol: float
    equivalence_atol: float | None
    equivalence_rtol: float | None
    within_ceiling: bool
    """False: a keep on this check cannot be an equivalent speedup (a training change at most)."""


def tolerance_by_dtype(tensors: Iterable[TensorComparison]) -> list[DtypeTolerance]:
    """Per reference dtype compared with a tolerance (sorted by name): the loosest atol and rtol applied,
    and whether they stay within the ceiling (bit-exact always does)."""
    loosest: dict[str, tuple[int, float, float]] = {}
    for t in tensors:
        if t.compared_as != "tolerance":
            continue
        n, atol, rtol = loosest.get(t.dtype_reference, (0, 0.0, 0.0))
        loosest[t.dtype_reference] = (n + 1, max(atol, t.atol), max(rtol, t.rtol))
    out: list[DtypeTolerance] = []
    for dtype, (n, atol, rtol) in sorted(loosest.items()):
        top = ceiling(dtype)
        within = (atol == 0 and rtol == 0) or (top is not None and atol <= top.atol and rtol <= top.rtol)
        out.append(
            DtypeTolerance(
                dtype=dtype,
                tensors=n,
                atol=atol,
                rtol=rtol,
                equivalence_atol=top.atol if top else None,
                equivalence_rtol=top.rtol if top else None,
                within_ceiling=within,
            )
        )
    return out


def applied_tolerances(check: EvidenceRecord) -> dict[str, tuple[float, float]] | None:
    """dtype -> the loosest (atol, rtol) a compare_tensors record applied to tensors of that reference dtype
    compared with a tolerance; None when the record does not say (it lists only some of its tensors)."""
    rows = [as_dict(r) for r in as_list(check.result.get("tolerance_by_dtype"))]
    if not rows:
        tensors = [as_dict(t) for t in as_list(check.result.get("tensors"))]
        total = check.result.get("tensors_total")
        if not tensors or total != len(tensors):
            return None
        rows = [
            {"dtype": t.get("dtype_reference"), "atol": t.get("atol"), "rtol": t.get("rtol")}
            for t in tensors
            if t.get("compared_as") == "tolerance"
        ]
    out: dict[str, tuple[float, float]] = {}
    for row in rows:
        dtype, atol, rtol = row.get("dtype"), row.get("atol"), row.get("rtol")
        if (
            not isinstance(dtype, str)
            or not isinstance(atol, (int, float))
            or not isinstance(rtol, (int, float))
        ):
            return None
        prev = out.get(dtype, (0.0, 0.0))
        out[dtype] = (max(prev[0], float(atol)), max(prev[1], float(rtol)))
    return out


def beyond_ceiling(check: EvidenceRecord, limit: Callable[[str], Limit] | None = None) -> list[str]:
    """How a tensor check's applied tolerances exceed the equivalence ceiling of its dtypes (empty: within,
    or not recorded: see :func:`applied_tolerances`). ``limit``: the ceiling per dtype and its source (the
    baseline's spread, :func:`perfgate.decisions.spread.ceiling_for`); the table's when not given."""
    applied = applied_tolerances(check) or {}
    problems: list[str] = []
    for dtype, (atol, rtol) in sorted(applied.items()):
        if atol == 0 and rtol == 0:
            continue
        top = ceiling(dtype) if limit is None else limit(dtype).ceiling
        source = (
            f"atol={top.atol:g}, rtol={top.rtol:g}: {REORDER_ALLOWANCE:g}x the torch.testing.assert_close defaults"
            if limit is None and top is not None
            else limit(dtype).source
            if limit is not None
            else ""
        )
        if top is None:
            problems.append(
                f"{check.id} compared {dtype} tensors at atol={atol:g}, rtol={rtol:g}: no shipped tolerance "
                f"for {dtype}, so only a bit-exact check (atol=0, rtol=0) shows the same numerics"
            )
        elif atol > top.atol or rtol > top.rtol:
            problems.append(
                f"{check.id} compared {dtype} tensors at atol={atol:g}, rtol={rtol:g}, beyond the equivalence "
                f"ceiling for {dtype} ({source})"
            )
    return problems


def stricter_than_defaults(check: EvidenceRecord) -> bool:
    """A check tighter than the defaults on both atol and rtol for every dtype it compared (e.g. bit-exact):
    an equivalent change may fail it, so its failure alone says nothing about equivalence."""
    applied = applied_tolerances(check)
    if not applied:
        atol, rtol = check.inputs.get("atol"), check.inputs.get("rtol")
        return atol == 0 and rtol == 0
    return all(_tighter(dtype, tol) for dtype, tol in applied.items())


def _tighter(dtype: str, tol: tuple[float, float]) -> bool:
    base = DEFAULTS.get(dtype)
    if base is None:
        return tol == (0.0, 0.0)
    return tol[0] < base.atol and tol[1] < base.rtol


def label_note(atol: float, rtol: float, groups: Iterable[tuple[str, float, float]] = ()) -> str | None:
    """What label a tolerance declared at open can lead to, said at once: the common floating dtypes whose
    equivalence ceiling it exceeds (its loosest atol and rtol, groups included); None when within every one."""
    loosest_a = max([atol, *(a for _, a, _ in groups)])
    loosest_r = max([rtol, *(r for _, _, r in groups)])
    beyond = [
        f"{dtype} (atol {c.atol:g}, rtol {c.rtol:g})"
        for dtype in ("float32", "bfloat16", "float16")
        if (c := ceiling(dtype)) is not None and (loosest_a > c.atol or loosest_r > c.rtol)
    ]
    if not beyond:
        return None
    return (
        f"beyond the equivalence ceiling of {', '.join(beyond)}: a check that uses it on such tensors can keep only "
        "a training_change (open one with classification='training_change' and quality=...), never an "
        "equivalent speedup"
    )
