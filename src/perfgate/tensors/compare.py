"""Compare two tensor sources key by key, streaming each pair in aligned chunks.

Nothing is loaded whole: for each selected key present on both sides, the two tensors are read
``chunk_elements`` at a time (memory-mapped or inflated on the fly); each chunk pair's statistics are
computed on a small thread pool and folded in chunk order. Peak memory is a few chunk-sized buffers per
thread, independent of tensor and file sizes.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from perfgate.helpers.cpus import usable_cpus
from perfgate.security.quoting import file_text
from perfgate.tensors._engine import Engine
from perfgate.tensors._errors import ComparisonCancelled, TensorInputError
from perfgate.tensors._kernel import KernelParams, TensorStats
from perfgate.tensors.dtypes import category, dtype_name
from perfgate.tensors.entry import TensorEntry
from perfgate.tensors.keymap import KeyMapping
from perfgate.tensors.source import TensorSource

__all__ = [
    "DEFAULT_CHUNK_ELEMENTS",
    "CompareOptions",
    "ComparisonReport",
    "MappedKey",
    "OverallStatus",
    "TensorComparison",
    "TensorStatus",
    "ToleranceOverride",
    "compare_sources",
]

DEFAULT_CHUNK_ELEMENTS = 1 << 17
"""Elements per chunk: small enough that every thread's float64 buffers stay in the shared cache (a few MiB
each), large enough that the per-chunk Python work (which holds the interpreter lock, so the threads take
turns at it) is a small part: 2^17 costs the same CPU per element as 2^16 in the kernel and a quarter less
in the reading thread."""

TensorStatus = Literal["match", "value_mismatch", "shape_mismatch", "dtype_mismatch"]
OverallStatus = Literal["match", "mismatch", "incomparable"]
ProgressCallback = Callable[[int, int, str], None]
_PROGRESS_EVERY_BYTES = 64 * 2**20


@dataclass(frozen=True)
class ToleranceOverride:
    """Tolerances for the keys matching ``pattern`` (fnmatch glob, case-sensitive)."""

    pattern: str
    atol: float
    rtol: float


@dataclass(frozen=True)
class CompareOptions:
    """What counts as agreement. There are no default tolerances: they belong to the task.

    ``overrides`` are tried in order; the first whose pattern matches a key sets its tolerances.
    ``keys`` (globs) restricts the comparison to matching keys on both sides. Integer and bool tensors
    compare exactly unless ``integers_exact`` is false. A NaN or infinity on either side is a mismatch
    unless ``allow_nonfinite`` (then equal infinities match, and NaN matches NaN with ``equal_nan``, as
    torch.isclose). A dtype change (e.g. a bfloat16 candidate against
    a float32 reference) is a ``dtype_mismatch`` unless ``allow_dtype_change``; values are compared
    either way.
    """

    atol: float
    rtol: float
    overrides: Sequence[ToleranceOverride] = ()
    equal_nan: bool = False
    allow_nonfinite: bool = False
    keys: Sequence[str] | None = None
    integers_exact: bool = True
    allow_dtype_change: bool = False
    key_mapping: KeyMapping = field(default_factory=KeyMapping)
    chunk_elements: int = DEFAULT_CHUNK_ELEMENTS
    workers: int | None = None
    """Threads computing chunks (default: the CPUs this process may use, at most 8)."""

    def __post_init__(self) -> None:
        for name, value in [("atol", self.atol), ("rtol", self.rtol)] + [
            (f"override {o.pattern!r} {n}", v)
            for o in self.overrides
            for n, v in (("atol", o.atol), ("rtol", o.rtol))
        ]:
            if not (math.isfinite(value) and value >= 0):
                raise TensorInputError(f"{name} must be a finite number >= 0, got {value}")
        if self.chunk_elements < 1:
            raise ValueError("chunk_elements must be positive")
        if self.workers is not None and self.workers < 1:
            raise ValueError("workers must be positive")

    def tolerance_for(self, key: str) -> tuple[float, float]:
        """(atol, rtol) for ``key``: the first matching override, else the global pair."""
        for override in self.overrides:
            if fnmatch.fnmatchcase(key, override.pattern):
                return override.atol, override.rtol
        return self.atol, self.rtol


@dataclass(frozen=True)
class TensorComparison:
    """One key's outcome. Error figures are null when values were not compared (shape mismatch) or no
    pair of finite values exists. Indices are multi-dimensional, into the tensor's shape."""

    key: str
    status: TensorStatus
    shape_reference: list[int]
    shape_candidate: list[int]
    dtype_reference: str
    dtype_candidate: str
    compared_as: Literal["exact", "tolerance"] | None
    atol: float
    rtol: float
    elements: int | None
    mismatched: int | None
    mismatched_fraction: float | None
    max_abs_error: float | None
    max_abs_error_index: list[int] | None
    max_rel_error: float | None
    max_abs_error_mismatched: float | None
    max_rel_error_mismatched: float | None
    mean_abs_error: float | None
    cosine: float | None
    nonfinite_reference: int | None
    nonfinite_candidate: int | None
    reference_key: str = ""
    """The key as stored in the reference (differs from ``key`` when a key mapping renamed it)."""
    candidate_key: str = ""


@dataclass(frozen=True)
class MappedKey:
    """A name the key mapping produced, with the stored key on each side that has it."""

    key: str
    reference_key: str | None
    candidate_key: str | None


@dataclass(frozen=True)
class ComparisonReport:
    """All keys' outcomes, the keys only one side has, and the overall verdict.

    ``status`` is ``mismatch`` when any compared tensor has values outside tolerance; otherwise
    ``incomparable`` when keys, shapes or dtypes differ; otherwise ``match``. ``mapped_keys`` lists every
    name the key mapping changed on either side (missing and extra keys are mapped names too).
    """

    status: OverallStatus
    tensors: list[TensorComparison]
    missing_keys: list[str]
    extra_keys: list[str]
    summary: str
    elements_compared: int
    bytes_read: int
    notes: list[str] = field(default_factory=list[str])
    mapped_keys: list[MappedKey] = field(default_factory=list[MappedKey])


def _unravel(flat: int, entry: TensorEntry) -> list[int]:
    if not entry.shape:
        return []
    order: Literal["C", "F"] = "F" if entry.fortran_order else "C"
    return [int(i) for i in np.unravel_index(flat, entry.shape, order=order)]


def _effective_ndim(shape: tuple[int, ...]) -> int:
    return sum(1 for d in shape if d > 1)


class _Progress:
    def __init__(
        self, total_bytes: int, report: ProgressCallback | None, cancelled: Callable[[], bool] | None
    ):
        self.total = total_bytes
        self.done = 0
        self._last = 0
        self._report = report
        self._cancelled = cancelled

    def advance(self, nbytes: int, key: str) -> None:
        self.done += nbytes
        if self._cancelled is not None and self._cancelled():
            raise ComparisonCancelled
        if self._report is not None and self.done - self._last >= _PROGRESS_EVERY_BYTES:
            self._last = self.done
            self._report(self.done, self.total, f"comparing {key}")


def _comparison(
    key: str,
    r: TensorEntry,
    c: TensorEntry,
    tolerance: tuple[float, float],
    status: TensorStatus,
    compared_as: Literal["exact", "tolerance"] | None,
    s: TensorStats | None,
) -> TensorComparison:
    index = (
        None if s is None or s.max_abs_error_flat_index is None else _unravel(s.max_abs_error_flat_index, r)
    )
    return TensorComparison(
        key=key,
        status=status,
        shape_reference=list(r.shape),
        shape_candidate=list(c.shape),
        dtype_reference=dtype_name(r.dtype),
        dtype_candidate=dtype_name(c.dtype),
        compared_as=compared_as,
        atol=tolerance[0],
        rtol=tolerance[1],
        elements=None if s is None else s.elements,
        mismatched=None if s is None else s.mismatched,
        mismatched_fraction=None if s is None else (s.mismatched / s.elements if s.elements else 0.0),
        max_abs_error=None if s is None else s.max_abs_error,
        max_abs_error_index=index,
        max_rel_error=None if s is None else s.max_rel_error,
        max_abs_error_mismatched=None if s is None else s.max_abs_error_mismatched,
        max_rel_error_mismatched=None if s is None else s.max_rel_error_mismatched,
        mean_abs_error=None if s is None else s.mean_abs_error,
        cosine=None if s is None else s.cosine,
        nonfinite_reference=None if s is None else s.nonfinite_reference,
        nonfinite_candidate=None if s is None else s.nonfinite_candidate,
        reference_key=r.key,
        candidate_key=c.key,
    )


def _compare_one(
    key: str,
    ref_key: str,
    cand_key: str,
    reference: TensorSource,
    candidate: TensorSource,
    options: CompareOptions,
    engine: Engine,
    progress: _Progress,
) -> TensorComparison:
    r, c = reference.entries[ref_key], candidate.entries[cand_key]
    tolerance = options.tolerance_for(key)
    if r.shape != c.shape:
        return _comparison(key, r, c, tolerance, "shape_mismatch", None, None)
    if r.fortran_order != c.fortran_order and _effective_ndim(r.shape) > 1:
        raise TensorInputError(
            f"tensor {file_text(key)} is stored column-major on one side and row-major on the other; re-save both "
            "with numpy.ascontiguousarray so elements stream in the same order"
        )
    cat_r, cat_c = category(r.dtype), category(c.dtype)
    assert cat_r is not None and cat_c is not None, "readers refuse non-numeric dtypes"
    exact = options.integers_exact and cat_r in ("bool", "int") and cat_c in ("bool", "int")
    params = KernelParams(
        mode="exact" if exact else "tolerance",
        complex_values="complex" in (cat_r, cat_c),
        atol=tolerance[0],
        rtol=tolerance[1],
        equal_nan=options.equal_nan,
        allow_nonfinite=options.allow_nonfinite,
    )
    stats = engine.run(
        reference.chunks(ref_key, options.chunk_elements),
        candidate.chunks(cand_key, options.chunk_elements),
        params,
        lambda n: progress.advance(n * (r.dtype.itemsize + c.dtype.itemsize), key),
    )
    assert stats.elements == r.elements, "both readers stream every element"
    if stats.mismatched:
        status: TensorStatus = "value_mismatch"
    elif r.dtype != c.dtype and not options.allow_dtype_change:
        status = "dtype_mismatch"
    else:
        status = "match"
    return _comparison(key, r, c, tolerance, status, "exact" if exact else "tolerance", stats)


def _pairs(
    reference: TensorSource, candidate: TensorSource, keys: Sequence[str] | None, mapping: KeyMapping
) -> tuple[list[tuple[str, str, str]], list[str], list[str], list[str], list[MappedKey]]:
    """(key shown, reference key, candidate key) for each pair, then missing keys, extra keys, notes and
    the names the mapping changed."""
    if reference.single_array and candidate.single_array:
        (ref_key,), (cand_key,) = reference.entries, candidate.entries
        notes: list[str] = []
        if ref_key != cand_key:
            notes.append(
                f"two NPY files paired as one tensor: {file_text(ref_key)} (reference) and {file_text(cand_key)} (candidate)"
            )
        return [(ref_key, ref_key, cand_key)], [], [], notes, []
    mapping.check_renames_used(reference.entries, candidate.entries)
    ref_names = mapping.apply(reference.entries, "reference")
    cand_names = mapping.apply(candidate.entries, "candidate")
    ref_selected = _select_names(ref_names, keys)
    cand_selected = _select_names(cand_names, keys)
    if keys is not None and not ref_selected and not cand_selected:
        sample = ", ".join(file_text(k) for k in list(ref_names)[:5])
        raise TensorInputError(
            f"the keys patterns {list(keys)} match no tensor; reference keys include {sample}"
        )
    pairs = [(k, ref_selected[k], cand_selected[k]) for k in ref_selected if k in cand_selected]
    missing = sorted(k for k in ref_selected if k not in cand_selected)
    extra = sorted(k for k in cand_selected if k not in ref_selected)
    changed = sorted(
        {k for k, orig in ref_selected.items() if k != orig}
        | {k for k, orig in cand_selected.items() if k != orig}
    )
    mapped = [MappedKey(k, ref_selected.get(k), cand_selected.get(k)) for k in changed]
    return pairs, missing, extra, [], mapped


def _select_names(names: dict[str, str], patterns: Sequence[str] | None) -> dict[str, str]:
    if patterns is None:
        return names
    return {k: v for k, v in names.items() if any(fnmatch.fnmatchcase(k, p) for p in patterns)}


def compare_sources(
    reference: TensorSource,
    candidate: TensorSource,
    options: CompareOptions,
    *,
    progress: ProgressCallback | None = None,
    cancelled: Callable[[], bool] | None = None,
) -> ComparisonReport:
    """Compare every selected key of ``candidate`` against ``reference``.

    ``progress(done_bytes, total_bytes, message)`` is called every 64 MiB read; ``cancelled()`` is polled
    after every chunk. Two lone NPY files are paired whatever their file names.

    Raises:
        TensorInputError: the ``keys`` patterns select nothing, or a tensor cannot be streamed in step.
        ComparisonCancelled: ``cancelled()`` returned true.
    """
    pairs, missing, extra, notes, mapped = _pairs(reference, candidate, options.keys, options.key_mapping)
    total = sum(
        reference.entries[r].size_bytes + candidate.entries[c].size_bytes
        for _, r, c in pairs
        if reference.entries[r].shape == candidate.entries[c].shape
    )
    tracker = _Progress(total, progress, cancelled)
    workers = options.workers or min(8, usable_cpus())
    # Reads that also hash keep a thread of their own busy (see `Engine`); bare reads do not.
    read_ahead = reference.digesting or candidate.digesting
    with Engine(workers, options.chunk_elements, read_ahead=read_ahead) as engine:
        tensors = [_compare_one(k, r, c, reference, candidate, options, engine, tracker) for k, r, c in pairs]
    if progress is not None:
        progress(total, total, "done")
    report = _report(tensors, missing, extra, notes + _mapping_hint(missing, extra), total)
    return dataclasses.replace(report, mapped_keys=mapped)


_WRAPPER_PREFIXES = ("_orig_mod.", "module.")
_WRAPPER_SEGMENTS = ("_orig_mod", "_fsdp_wrapped_module", "_checkpoint_wrapped_module")


def _mapping_hint(missing: list[str], extra: list[str]) -> list[str]:
    """A note proposing the key mapping when missing and extra keys differ only by wrapper names."""
    if not missing or not extra:
        return []
    prefixes = [p for p in _WRAPPER_PREFIXES if any(k.startswith(p) for k in missing + extra)]
    segments = [s for s in _WRAPPER_SEGMENTS if any(s in k.split(".")[1:] for k in missing + extra)]
    if not prefixes and not segments:
        return []
    unwrap = KeyMapping(tuple(prefixes), tuple(segments))
    paired = {unwrap.name(k) for k in missing} & {unwrap.name(k) for k in extra}
    if not paired:
        return []
    suggestion = {"strip_prefixes": prefixes} if prefixes else {"drop_segments": segments}
    if prefixes and segments:
        suggestion["drop_segments"] = segments
    return [
        f"{len(paired)} missing keys pair with extra keys once wrapper names are removed (a compiled, DDP or "
        f"FSDP-wrapped module's state dict): compare again with key_map={suggestion}"
    ]


def _report(
    tensors: list[TensorComparison], missing: list[str], extra: list[str], notes: list[str], total_bytes: int
) -> ComparisonReport:
    by_status: dict[str, list[TensorComparison]] = {}
    for t in tensors:
        by_status.setdefault(t.status, []).append(t)
    if "value_mismatch" in by_status:
        status: OverallStatus = "mismatch"
    elif missing or extra or "shape_mismatch" in by_status or "dtype_mismatch" in by_status or not tensors:
        status = "incomparable"
    else:
        status = "match"
    elements = sum(t.elements or 0 for t in tensors)
    return ComparisonReport(
        status=status,
        tensors=tensors,
        missing_keys=missing,
        extra_keys=extra,
        summary=_summary(status, tensors, by_status, missing, extra),
        elements_compared=elements,
        bytes_read=total_bytes,
        notes=notes,
    )


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3g}"


def _summary(
    status: OverallStatus,
    tensors: list[TensorComparison],
    by_status: dict[str, list[TensorComparison]],
    missing: list[str],
    extra: list[str],
) -> str:
    parts: list[str] = []
    compared = [t for t in tensors if t.elements is not None]
    n_matched = len(by_status.get("match", []))
    parts.append(f"{status}: {n_matched} of {len(tensors)} common tensors match")
    bad = by_status.get("value_mismatch", [])
    if bad:
        worst = max(bad, key=lambda t: t.mismatched_fraction or 0.0)
        if worst.max_abs_error_mismatched is None:
            detail = "all of them NaN/Inf disagreements"
        else:
            detail = f"largest error among them {_fmt(worst.max_abs_error_mismatched)}"
        parts.append(
            f"over tolerance: {len(bad)} (worst {file_text(worst.key)}: {worst.mismatched} of {worst.elements} "
            f"elements outside atol={worst.atol:g} rtol={worst.rtol:g}, {detail})"
        )
    elif compared:
        worst = max(compared, key=lambda t: t.max_abs_error or 0.0)
        parts.append(f"largest max_abs_error {_fmt(worst.max_abs_error)} in {file_text(worst.key)}")
    for label, status_name in (("shapes differ", "shape_mismatch"), ("dtypes differ", "dtype_mismatch")):
        items = by_status.get(status_name, [])
        if items:
            parts.append(f"{label}: {len(items)} ({', '.join(file_text(t.key) for t in items[:3])})")
    nonfinite = [t for t in compared if (t.nonfinite_reference or 0) + (t.nonfinite_candidate or 0)]
    if nonfinite:
        parts.append(f"NaN/Inf present in {len(nonfinite)} tensor(s)")
    if missing:
        parts.append(
            f"{len(missing)} reference keys missing from the candidate ({', '.join(map(file_text, missing[:3]))})"
        )
    if extra:
        parts.append(
            f"{len(extra)} candidate keys not in the reference ({', '.join(map(file_text, extra[:3]))})"
        )
    if not tensors:
        parts.append("no key is present on both sides")
    return "; ".join(parts)
