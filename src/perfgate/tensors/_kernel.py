"""The per-tensor numerics: closeness and error statistics of one chunk, folded over a tensor.

Closeness is torch.testing.assert_close's rule, ``|candidate - reference| <= atol + rtol * |reference|``
(the reference scales the tolerance), with torch.isclose's treatment of non-finite values: equal
infinities match, any other infinity or NaN mismatches, and NaN matches NaN only with ``equal_nan``.
Values are widened to float64 (complex128 for complex data) before anything is computed, so 16- and
8-bit inputs are judged exactly rather than in their own rounding (torch computes in the input dtype, so
it can disagree on elements within an ulp of the boundary). A chunk whose two sides hold the same bytes
(a bit-exact change) is settled in its own dtype: a byte comparison and one dot product. A float chunk of
at most 4-byte values in which few elements differ in their bits (a bfloat16 model whose change moved a few
roundings) gets the per-element work on those elements alone (`_few_differences`). A chunk whose
extremes prove every element close (`_all_close`) skips the per-element test, and one where only a few
elements are not proved close by their own ratio tests just those (`_suspects_decide`); either way every figure is
exactly what the per-element float64 evaluation gives (tests/test_tensors_kernel_exact.py), except the dot
products of a chunk with few differences, which `_few_dots` corrects rather than recomputes (as accurate, not
the same bits).

Error statistics (max/mean absolute error, max relative error, cosine similarity) cover the elements
where both values are finite; non-finite elements are counted separately. Relative errors skip elements
whose reference is exactly 0 (their error is in the absolute figures).

`chunk_stats` is a pure function of one chunk pair (so chunks can be computed on several threads);
`Totals.fold` must see the chunks in order, which makes every total independent of the threading.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any, Literal, cast

import numpy as np

from perfgate.tensors.dtypes import category

__all__ = ["ChunkStats", "KernelParams", "Scratch", "TensorStats", "Totals", "chunk_stats"]

Mode = Literal["exact", "tolerance"]


@dataclass(frozen=True)
class KernelParams:
    mode: Mode
    complex_values: bool
    atol: float
    rtol: float
    equal_nan: bool
    allow_nonfinite: bool = False
    """Opt-in: equal infinities (and NaN with ``equal_nan``) match; by default any NaN/Inf mismatches."""


class Scratch:
    """Chunk-sized work arrays, reused from chunk to chunk by one thread."""

    def __init__(self, chunk_elements: int) -> None:
        self.size = chunk_elements
        self.a = np.empty(chunk_elements, dtype=np.float64)
        self.b = np.empty(chunk_elements, dtype=np.float64)
        self.ca = np.empty(0, dtype=np.complex128)
        self.cb = np.empty(0, dtype=np.complex128)
        self.d = np.empty(chunk_elements, dtype=np.float64)
        self.absa = np.empty(chunk_elements, dtype=np.float64)
        self.t = np.empty(chunk_elements, dtype=np.float64)
        self.ok = np.empty(chunk_elements, dtype=np.bool_)
        self.allowance = np.empty(chunk_elements, dtype=np.float64)
        self.bits = np.empty(chunk_elements, dtype=np.uint32)
        self.zeros = np.zeros(chunk_elements, dtype=np.float64)
        """All zeros between calls: `_few_differences` scatters a chunk's few errors into it for the sum."""

    def wide(self, complex_values: bool) -> tuple[np.ndarray, np.ndarray]:
        if not complex_values:
            return self.a, self.b
        if self.ca.shape[0] != self.size:
            self.ca = np.empty(self.size, dtype=np.complex128)
            self.cb = np.empty(self.size, dtype=np.complex128)
        return self.ca, self.cb


@dataclass(frozen=True)
class ChunkStats:
    """One chunk's contribution. Maxima are -1.0 when the chunk has no qualifying element."""

    elements: int
    mismatched: int
    finite_pairs: int
    sum_abs: float
    max_abs: float
    max_abs_at: int
    max_rel: float
    max_abs_mismatched: float
    max_rel_mismatched: float
    aa: float
    bb: float
    ab: float
    nonfinite_reference: int
    nonfinite_candidate: int


@dataclass(frozen=True)
class TensorStats:
    """Totals for one tensor pair. Flat indices are in storage order."""

    elements: int
    mismatched: int
    max_abs_error: float | None
    max_abs_error_flat_index: int | None
    max_rel_error: float | None
    max_abs_error_mismatched: float | None
    max_rel_error_mismatched: float | None
    mean_abs_error: float | None
    cosine: float | None
    nonfinite_reference: int
    nonfinite_candidate: int


# OpenBLAS computes a dot product of more than 10,000 elements on its own threads, whose busy-waiting
# starves the comparison's worker threads (measured: several times the CPU time on 2 cores). Slices at
# most this long stay on the calling thread.
_SERIAL_DOT_ELEMENTS = 8192


def _dot_sum(x: np.ndarray, y: np.ndarray, complex_values: bool) -> float:
    """Re(x^H y) as the sum, in order, of the dot products of consecutive `_SERIAL_DOT_ELEMENTS` slices.

    Real data: one ``np.vecdot`` over the whole slices viewed as rows (numpy computes each row with the BLAS
    dot product, the very call ``np.dot`` makes for that slice: the same bits, in one call instead of one
    per slice; tests/test_tensors_kernel_exact.py checks this), then the tail with ``np.dot``."""
    n = x.shape[0]
    total = 0.0
    if complex_values:
        for start in range(0, n, _SERIAL_DOT_ELEMENTS):
            sx, sy = x[start : start + _SERIAL_DOT_ELEMENTS], y[start : start + _SERIAL_DOT_ELEMENTS]
            total += complex(np.vdot(sx, sy)).real
        return total
    whole = n - n % _SERIAL_DOT_ELEMENTS
    if whole:
        shape = (whole // _SERIAL_DOT_ELEMENTS, _SERIAL_DOT_ELEMENTS)
        xs: np.ndarray = cast("Any", x)[:whole].reshape(shape)
        ys: np.ndarray = cast("Any", y)[:whole].reshape(shape)
        for value in cast("list[float]", np.vecdot(xs, ys).tolist()):
            total += value
    if whole < n:
        total += float(np.dot(x[whole:], y[whole:]))
    return total


def _dots(a: np.ndarray, b: np.ndarray, complex_values: bool) -> tuple[float, float, float]:
    """(a.a, b.b, Re a.b) with the first operand conjugated; non-finite when the chunk holds NaN/Inf.
    Callers hold an errstate that silences overflow and invalid operations."""
    return (
        _dot_sum(a, a, complex_values),
        _dot_sum(b, b, complex_values),
        _dot_sum(a, b, complex_values),
    )


@functools.cache
def _is_bfloat16(dtype: np.dtype[Any]) -> bool:
    """Whether ``dtype`` is ml_dtypes' bfloat16 (by name: ml_dtypes need not be imported); remembered per
    dtype, as ``str(dtype)`` runs Python code in numpy on every call."""
    return str(dtype) == "bfloat16"


def _widen(values: np.ndarray, out: np.ndarray, scratch: Scratch) -> None:
    """``out[:] = values`` as float64 (complex128): exact for every input type. bfloat16 is the top half of
    a float32 with the same bits: shifting its bits into place (widened to 32 bits inside the shift's own
    loop) is exact and four times faster than the element-wise conversion loop of ml_dtypes."""
    if values.dtype.itemsize == 2 and out.dtype.kind != "c" and _is_bfloat16(values.dtype):
        bits: Any = scratch.bits[: values.shape[0]]
        np.left_shift(cast("Any", values).view(np.uint16), 16, out=bits, dtype=np.uint32)
        np.copyto(out, bits.view(np.float32))
    else:
        np.copyto(out, values, casting="unsafe")


def chunk_stats(
    reference: np.ndarray, candidate: np.ndarray, offset: int, params: KernelParams, scratch: Scratch
) -> ChunkStats:
    """Statistics of one pair of aligned 1-D chunks (same length, any numeric dtypes); ``offset`` is the
    flat index of the chunk's first element in its tensor."""
    n = reference.shape[0]
    assert candidate.shape[0] == n and n <= scratch.size
    # NaN/Inf are handled explicitly below; a warning per chunk would only cost time.
    with np.errstate(all="ignore"):
        if reference.dtype == candidate.dtype and n:
            if _few_differences_apply(reference, params):
                few = _few_differences(reference, candidate, offset, params, scratch)
                if few is not None:
                    return few
            else:
                same = _identical(reference, candidate, offset, params, scratch)
                if same is not None:
                    return same
        return _general(reference, candidate, offset, params, scratch)


def _general(
    reference: np.ndarray, candidate: np.ndarray, offset: int, params: KernelParams, scratch: Scratch
) -> ChunkStats:
    n = reference.shape[0]
    wa, wb = scratch.wide(params.complex_values)
    a, b, d, absa, t, ok = wa[:n], wb[:n], scratch.d[:n], scratch.absa[:n], scratch.t[:n], scratch.ok[:n]
    _widen(reference, a, scratch)
    _widen(candidate, b, scratch)
    if params.complex_values:
        np.abs(b - a, out=d)
    else:
        np.subtract(b, a, out=d)
        np.abs(d, out=d)
    np.abs(a, out=absa)
    sum_abs = float(np.sum(d))
    # |b - a| is finite everywhere exactly when both chunks are (a NaN or infinity anywhere makes it
    # NaN or infinite), so the sum that the mean needs anyway also picks the path.
    if not math.isfinite(sum_abs):
        _closeness(reference, candidate, d, absa, t, ok, params)
        return _nonfinite(n, offset, a, b, d, absa, t, ok, params)
    worst = int(np.argmax(d))
    dots = _dots(a, b, params.complex_values)
    max_rel = _relative(d, absa, t)
    if params.mode == "tolerance" and _all_close(float(d[worst]), absa, max_rel, params):
        close = None
    elif params.mode == "tolerance" and _suspects_decide(d, absa, t, ok, params):
        close = ok
    else:
        _closeness(reference, candidate, d, absa, scratch.allowance[:n], ok, params)
        close = ok
    return _finish(n, offset, d, absa, t, close, None, sum_abs, n, dots, (0, 0), worst, max_rel)


_RATIO_MARGIN = 1 - 2.0**-49
"""Largest relative error, as a fraction of rtol, that `_all_close` accepts without the per-element test."""


def _all_close(worst: float, absa: np.ndarray, max_rel: float, params: KernelParams) -> bool:
    """Whether every element of a finite chunk is close, decided exactly from the chunk's extremes; False
    when they cannot tell (the per-element test then decides). ``worst`` is the largest |b - a|,
    ``max_rel`` the largest fl(|b - a| / |a|).

    1. The allowance fl(fl(|a| * rtol) + atol) never decreases as |a| grows (rounding is monotone), so the
       smallest |a| has the smallest allowance: the largest error within it means every error is.
    2. With no zero reference, fl(|b - a| / |a|) <= rtol * (1 - 2^-50) means the exact ratio is at most rtol
       (the quotient errs by at most 2^-53 relative, or 2^-1075 when subnormal, which rtol >= 2^-900
       absorbs): |b - a| <= |a| * rtol exactly, so fl(|a| * rtol) >= |b - a| (rounding is monotone and
       |b - a| is a float64), and adding atol >= 0 cannot lower it.

    Python floats are IEEE float64 and round as numpy does."""
    if worst <= params.atol:
        return True  # every allowance is at least atol (fl(|a| * rtol) >= 0): the smallest |a| is not needed
    smallest = float(np.min(absa))
    if worst <= smallest * params.rtol + params.atol:
        return True
    return smallest > 0 and params.rtol >= 2.0**-900 and max_rel <= params.rtol * _RATIO_MARGIN


_SUSPECTS_SHARE = 16
"""`_suspects_decide` gives up when more than one element in this many is a suspect (the full test is then
cheaper than gathering them)."""


def _suspects_decide(
    d: np.ndarray, absa: np.ndarray, t: np.ndarray, ok: np.ndarray, params: KernelParams
) -> bool:
    """``ok`` for a finite chunk whose extremes could not settle it (`_all_close`), testing only the
    elements whose own ratio does not prove them close; False (``ok`` clobbered) when that cannot be used:
    a zero reference in the chunk, rtol below 2^-900, or too many suspects. ``t`` holds fl(|b - a| / |a|).

    An element with |a| > 0 and fl(|b - a| / |a|) <= rtol * (1 - 2^-49) is close: `_all_close`'s second
    argument, applied to that one element. The others (near-zero references in bfloat16 data, whose
    rounding step is a large share of them, and true mismatches) are gathered and given the per-element
    test itself, with the same float64 operations in the same order as `_closeness`: ``ok`` is exactly
    what it gives."""
    if not (params.rtol >= 2.0**-900 and float(np.min(absa)) > 0):
        return False
    np.greater(t, params.rtol * _RATIO_MARGIN, out=ok)
    suspects = np.flatnonzero(ok)
    if suspects.shape[0] * _SUSPECTS_SHARE > ok.shape[0]:
        return False
    allowance = absa[suspects] * params.rtol
    allowance += params.atol
    ok.fill(True)
    ok[suspects] = d[suspects] <= allowance
    return True


def _relative(d: np.ndarray, absa: np.ndarray, t: np.ndarray) -> float:
    """``t``: |b - a| / |a|, 0 where the reference is 0 (those errors are in the absolute figures); returns
    the largest."""
    np.divide(d, absa, out=t)
    max_rel = float(np.max(t))
    if not math.isfinite(max_rel):  # a zero reference (x/0 or 0/0): leave those elements out
        t[absa == 0] = 0.0
        max_rel = float(np.max(t))
    return max_rel


def _closeness(
    reference: np.ndarray,
    candidate: np.ndarray,
    d: np.ndarray,
    absa: np.ndarray,
    t: np.ndarray,
    ok: np.ndarray,
    params: KernelParams,
) -> None:
    """``ok``: which elements agree (``t`` is clobbered)."""
    if params.mode == "exact":
        np.equal(reference, candidate, out=ok)
    else:  # inf x rtol 0 is NaN: such an element is never close
        np.multiply(absa, params.rtol, out=t)
        t += params.atol
        np.less_equal(d, t, out=ok)


def _same_bytes(reference: np.ndarray, candidate: np.ndarray) -> bool:
    """Whether two 1-D chunks of one dtype hold the same bytes, compared as the widest unsigned words
    that divide them (8-byte words: an eighth of the element comparisons of a byte-wise test). The first
    words are compared first: chunks that differ almost always differ there, and then cost nothing."""
    nbytes = reference.nbytes
    word = next(w for w in (np.uint64, np.uint32, np.uint16, np.uint8) if nbytes % np.dtype(w).itemsize == 0)
    ref_words: np.ndarray = cast("Any", reference).view(np.uint8).view(word)
    cand_words: np.ndarray = cast("Any", candidate).view(np.uint8).view(word)
    if not np.array_equal(ref_words[:16], cand_words[:16]):
        return False
    return bool(np.array_equal(ref_words, cand_words))


_FEW_SHARE = 16
"""`_few_differences` takes a chunk in which at most one element in this many differs in its bits."""
_PROBE = 1024
"""Leading elements `_few_differences` compares first: more than a `_FEW_SHARE` of them differing (data
changed everywhere, as most float32 candidates) sends the chunk to the general path at once."""
_WORDS = {1: np.uint8, 2: np.uint16, 4: np.uint32}


def _few_differences_apply(values: np.ndarray, params: KernelParams) -> bool:
    """Whether `_few_differences` may take chunks of this dtype: real floats of at most 4 bytes (float32,
    float16, bfloat16, float8), whose squares and differences are finite in float64, in tolerance mode."""
    if params.mode != "tolerance" or params.complex_values or values.dtype.itemsize not in _WORDS:
        return False
    return category(values.dtype) == "float"


def _few_differences(
    reference: np.ndarray, candidate: np.ndarray, offset: int, params: KernelParams, scratch: Scratch
) -> ChunkStats | None:
    """The statistics of a finite chunk in which few elements differ in their bits (a bfloat16 model after a
    change that moves a few roundings; identical chunks too), exactly as the general path gives them, with
    the per-element work on the differing elements alone; None when more than one element in `_FEW_SHARE`
    differs or a value is not finite (the general path then decides).

    An element whose two sides hold the same bits has |b - a| = 0 (a finite value minus itself is +0), a
    relative error of 0 (0 / |a|, or 0 for a zero reference, as `_relative` sets it), and is close (its
    allowance fl(fl(|a| * rtol) + atol) is >= 0). So the chunk's maxima are those of the differing elements,
    or 0 at the chunk's first element (``argmax`` of all-zero errors) when no error is positive; its closeness
    and mismatch figures are those of the differing elements, given the same float64 operations as
    `_closeness`; its error sum is numpy's sum of the whole error array: the differing elements' errors
    summed alone when every partial sum of them is exact (`_short_sum`: then every order gives those bits),
    else numpy's sum over an array of zeros holding them at their places (the same array, so the same bits).
    The dot products are the one exception to exactness (`_few_dots`): b.b and a.b are the reference's a.a
    corrected by the differing elements' own products, as accurate as the general path's but not its bits.
    The squares of these dtypes (at most 3.4e38 squared) and their sums over a chunk are finite, so a finite
    a.a and b.b prove every value finite."""
    n = reference.shape[0]
    word = _WORDS[reference.dtype.itemsize]
    ref_bits: np.ndarray = cast("Any", reference).view(word)
    cand_bits: np.ndarray = cast("Any", candidate).view(word)
    probe = min(n, _PROBE)
    differ = scratch.ok[:n]
    np.not_equal(ref_bits[:probe], cand_bits[:probe], out=differ[:probe])
    if int(np.count_nonzero(differ[:probe])) * _FEW_SHARE > probe:
        return None
    np.not_equal(ref_bits, cand_bits, out=differ)
    where = np.flatnonzero(differ)
    count = where.shape[0]
    if count * _FEW_SHARE > n:
        return None
    a = scratch.a[:n]
    _widen(reference, a, scratch)
    if count == 0:
        aa = _dot_sum(a, a, False)
        if not math.isfinite(aa):
            return None
        return _settled(n, offset, aa)
    changed = np.empty(count, dtype=np.float64)
    # Gathered as bits (fancy indexing of an ml_dtypes array is many times slower), then widened.
    _widen(cast("Any", cand_bits[where]).view(candidate.dtype), changed, scratch)
    before = a[where]
    dots = _few_dots(a, before, changed)
    if dots is None:
        b = scratch.b[:n]
        np.copyto(b, a)
        b[where] = changed
        dots = _dots(a, b, False)
    aa, bb, ab = dots
    if not (math.isfinite(aa) and math.isfinite(bb)):
        return None
    d = changed - before
    np.abs(d, out=d)
    absa = np.abs(before)
    allowance = absa * params.rtol
    allowance += params.atol
    close = d <= allowance
    with_ref = absa != 0
    rel = np.zeros(count, dtype=np.float64)
    np.divide(d, absa, out=rel, where=with_ref)
    j = int(np.argmax(d))
    worst = float(d[j])
    sum_abs = _short_sum(d, before, changed, _digits(reference.dtype), worst)
    if sum_abs is None:
        zeros = scratch.zeros[:n]
        try:
            zeros[where] = d
            sum_abs = float(np.sum(zeros))
        finally:
            zeros[where] = 0.0
    bad = ~close
    mismatched = int(np.count_nonzero(bad))
    return ChunkStats(
        elements=n,
        mismatched=mismatched,
        finite_pairs=n,
        sum_abs=sum_abs,
        max_abs=worst,
        max_abs_at=offset + (int(where[j]) if worst > 0 else 0),
        max_rel=max(0.0, float(np.max(rel))),
        max_abs_mismatched=float(np.max(d[bad])) if mismatched else -1.0,
        max_rel_mismatched=float(np.max(rel[bad])) if mismatched else -1.0,
        aa=aa,
        bb=bb,
        ab=ab,
        nonfinite_reference=0,
        nonfinite_candidate=0,
    )


_FEW_NORM_SHARE = 0.25
"""`_few_dots` corrects a.a only when the differing elements hold at most this share of its squared norm."""


def _few_dots(a: np.ndarray, before: np.ndarray, changed: np.ndarray) -> tuple[float, float, float] | None:
    """(a.a, b.b, a.b) of a widened chunk ``a`` and of ``b``, which is ``a`` with the values ``before`` moved
    to ``changed`` at a few places, without building ``b``: a.a as everywhere (`_dot_sum`), then
    b.b = a.a + (sum of changed^2 - sum of before^2) and a.b = a.a + (sum of before * changed - sum of
    before^2). None (the caller builds ``b`` and takes `_dots`) when the differing elements hold more than
    `_FEW_NORM_SHARE` of a.a, or a sum is not finite.

    Accuracy: the values have at most 24 significant bits, so every product is exact in float64 and the
    only errors are the sums' roundings: a.a's (the general path's own, over the same n values: at most
    about n units of 2^-53 of it) and the corrections' (about count units of the differing elements' squared
    norm, at most a quarter of a.a). With that share b.b is at least 3/4 of a.a and a.b at least 5/8 of it,
    so no correction cancels them: each is within about 2 * (n + count + 2) units of 2^-53 of its exact
    value, the order of the general path's own error over the whole chunk (tests/test_tensors_kernel_exact.py
    holds the kernel to that bound against the exactly rounded sums). Saved: a copy of the chunk and two
    passes over it, a quarter of the per-chunk CPU of a bfloat16 model whose change moved a few roundings."""
    aa = _dot_sum(a, a, False)
    moved_a = _dot_sum(before, before, False)
    moved_b = _dot_sum(changed, changed, False)
    if not moved_a + moved_b <= aa * _FEW_NORM_SHARE:
        return None
    return aa, aa + (moved_b - moved_a), aa + (_dot_sum(before, changed, False) - moved_a)


@functools.cache
def _digits(dtype: np.dtype[Any]) -> int:
    """Significant bits of a real float dtype's values (the implicit leading bit included)."""
    info: Any
    try:
        info = np.finfo(dtype)
    except ValueError:  # bfloat16, float8: numpy's finfo does not know them
        import ml_dtypes

        info = cast("Any", ml_dtypes.finfo(dtype))
    return int(info.nmant) + 1


def _short_sum(
    d: np.ndarray, before: np.ndarray, after: np.ndarray, digits: int, worst: float
) -> float | None:
    """The sum of ``d`` = |after - before| (float64), where ``before`` and ``after`` are values of a float
    type of ``digits`` significant bits widened exactly and ``worst`` is the largest of ``d``, when every
    partial sum of ``d`` is exact (then any order of addition, numpy's pairwise one over the whole chunk's
    errors included, gives these very bits); None when that is not proved.

    A nonzero value x with frexp exponent e (|x| = f * 2^e, 1/2 <= f < 1) and at most ``digits`` significant
    bits is a multiple of 2^(e - digits); a subnormal of its type too (e is then at most the exponent of
    the type's least normal value, a multiple of whose step x is); zero is a multiple of anything. So every
    |after - before| is a multiple of 2^k, k = (the least frexp exponent on either side) - ``digits``: zeros
    count with exponent 0, which can only lower k, and a lower k still divides. Every partial sum is then a
    multiple of 2^k and at most count * worst < 2^(frexp exponent of worst + bit length of count); when that
    is at most 2^(k + 53), every partial sum is a float64 (k is far above -1074: the exponents of these
    types' values are above -160), so every addition is exact. Five array operations, where proving it from
    each value's own trailing zero bits took fourteen."""
    if worst == 0.0:
        return 0.0
    least = min(int(np.min(np.frexp(before)[1])), int(np.min(np.frexp(after)[1])))
    if math.frexp(worst)[1] + d.shape[0].bit_length() > least - digits + 53:
        return None
    return float(np.sum(d))


def _settled(n: int, offset: int, aa: float) -> ChunkStats:
    """A finite chunk whose two sides hold the same values: every error 0, every element close."""
    return ChunkStats(
        elements=n,
        mismatched=0,
        finite_pairs=n,
        sum_abs=0.0,
        max_abs=0.0,
        max_abs_at=offset,
        max_rel=0.0,
        max_abs_mismatched=-1.0,
        max_rel_mismatched=-1.0,
        aa=aa,
        bb=aa,
        ab=aa,
        nonfinite_reference=0,
        nonfinite_candidate=0,
    )


def _identical(
    reference: np.ndarray, candidate: np.ndarray, offset: int, params: KernelParams, scratch: Scratch
) -> ChunkStats | None:
    """The statistics of a chunk whose two sides hold the same bytes (what a bit-exact change dumps),
    compared in the tensors' own dtype: one byte comparison and one dot product instead of widening both
    sides. Exactly what the general path computes for such a chunk (every error 0, every element close,
    cosine from the same sums); None when the bytes differ or a value is not finite (the general path
    then decides, with its rules for NaN and infinities)."""
    if not _same_bytes(reference, candidate):
        return None
    n = reference.shape[0]
    a = scratch.wide(params.complex_values)[0][:n]
    _widen(reference, a, scratch)
    aa = _dot_sum(a, a, params.complex_values)  # as `_dots`, one product instead of three
    if not math.isfinite(aa):  # a NaN or infinity (or a square past float64): the general path
        return None
    return _settled(n, offset, aa)


def _nonfinite(
    n: int,
    offset: int,
    a: np.ndarray,
    b: np.ndarray,
    d: np.ndarray,
    absa: np.ndarray,
    t: np.ndarray,
    ok: np.ndarray,
    params: KernelParams,
) -> ChunkStats:
    finite_a = np.isfinite(a)
    finite_b = np.isfinite(b)
    both = finite_a & finite_b
    if params.mode == "tolerance":
        # Equal infinities match; an infinite error never does, even against an infinite allowance.
        ok &= np.isfinite(d)
        ok |= a == b
    if params.equal_nan:
        ok |= np.isnan(a) & np.isnan(b)
    if not params.allow_nonfinite:
        ok &= both
    # Statistics over finite pairs only: zero the rest so they never win a maximum or add to a sum.
    outside = ~both
    d[outside] = 0.0
    absa[outside] = 0.0
    dots = _dots(np.where(both, a, 0), np.where(both, b, 0), params.complex_values)
    nonfinite = (n - int(np.count_nonzero(finite_a)), n - int(np.count_nonzero(finite_b)))
    return _finish(
        n,
        offset,
        d,
        absa,
        t,
        ok,
        both,
        float(np.sum(d)),
        int(np.count_nonzero(both)),
        dots,
        nonfinite,
        None,
        None,
    )


def _finish(
    n: int,
    offset: int,
    d: np.ndarray,
    absa: np.ndarray,
    t: np.ndarray,
    ok: np.ndarray | None,
    both: np.ndarray | None,
    sum_abs: float,
    finite_pairs: int,
    dots: tuple[float, float, float],
    nonfinite: tuple[int, int],
    worst: int | None,
    max_rel: float | None,
) -> ChunkStats:
    """Maxima and mismatch figures of a chunk whose non-finite pairs (marked by ``both``) are zeroed in ``d``;
    ``ok`` None: every element agrees; ``worst``: ``argmax(d)`` when already known; ``max_rel``: when
    known, with the relative errors in ``t`` (see `_relative`)."""
    matched = n if ok is None else int(np.count_nonzero(ok))
    i = int(np.argmax(d)) if worst is None else worst
    if max_rel is None:
        max_rel = _relative(d, absa, t)
    max_abs_mm = max_rel_mm = -1.0
    if ok is not None and matched < n:
        bad = ~ok
        if both is not None:
            bad &= both
        if bad.any():
            max_abs_mm = float(np.max(d[bad]))
            max_rel_mm = float(np.max(t[bad]))
    return ChunkStats(
        elements=n,
        mismatched=n - matched,
        finite_pairs=finite_pairs,
        sum_abs=sum_abs,
        max_abs=float(d[i]) if finite_pairs else -1.0,
        max_abs_at=offset + i,
        max_rel=max_rel if finite_pairs else -1.0,
        max_abs_mismatched=max_abs_mm,
        max_rel_mismatched=max_rel_mm,
        aa=dots[0],
        bb=dots[1],
        ab=dots[2],
        nonfinite_reference=nonfinite[0],
        nonfinite_candidate=nonfinite[1],
    )


class Totals:
    """A tensor's running totals; fold its chunks in order (first occurrence wins ties)."""

    def __init__(self) -> None:
        self.elements = 0
        self._mismatched = 0
        self._finite_pairs = 0
        self._sum_abs = 0.0
        self._max_abs = -1.0
        self._max_abs_at = -1
        self._max_rel = -1.0
        self._max_abs_mm = -1.0
        self._max_rel_mm = -1.0
        self._aa = 0.0
        self._bb = 0.0
        self._ab = 0.0
        self._nonfinite_a = 0
        self._nonfinite_b = 0

    def fold(self, c: ChunkStats) -> None:
        self.elements += c.elements
        self._mismatched += c.mismatched
        self._finite_pairs += c.finite_pairs
        self._sum_abs += c.sum_abs
        if c.max_abs > self._max_abs:
            self._max_abs, self._max_abs_at = c.max_abs, c.max_abs_at
        self._max_rel = max(self._max_rel, c.max_rel)
        self._max_abs_mm = max(self._max_abs_mm, c.max_abs_mismatched)
        self._max_rel_mm = max(self._max_rel_mm, c.max_rel_mismatched)
        self._aa += c.aa
        self._bb += c.bb
        self._ab += c.ab
        self._nonfinite_a += c.nonfinite_reference
        self._nonfinite_b += c.nonfinite_candidate

    def result(self) -> TensorStats:
        finite = self._finite_pairs > 0
        cosine: float | None = None
        if self._aa > 0 and self._bb > 0 and math.isfinite(self._aa * self._bb):
            cosine = max(-1.0, min(1.0, self._ab / math.sqrt(self._aa * self._bb)))
        mismatched_finite = self._max_abs_mm >= 0
        return TensorStats(
            elements=self.elements,
            mismatched=self._mismatched,
            max_abs_error=self._max_abs if finite else None,
            max_abs_error_flat_index=self._max_abs_at if finite else None,
            max_rel_error=self._max_rel if finite else None,
            max_abs_error_mismatched=self._max_abs_mm if mismatched_finite else None,
            max_rel_error_mismatched=self._max_rel_mm if mismatched_finite else None,
            mean_abs_error=self._sum_abs / self._finite_pairs if finite else None,
            cosine=cosine,
            nonfinite_reference=self._nonfinite_a,
            nonfinite_candidate=self._nonfinite_b,
        )
