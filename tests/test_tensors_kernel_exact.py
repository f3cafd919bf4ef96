"""The chunk kernel's shortcuts give exactly what a plain float64 computation gives.

The kernel decides closeness without the per-element test when the largest error is within the smallest
allowance, widens bfloat16 by moving its bits, skips the byte comparison of chunks whose first words
differ, and silences floating-point warnings once per chunk. Each case here is checked field by field,
bit for bit, against a direct float64 evaluation of the documented rules (widen with numpy/ml_dtypes,
``|b - a| <= atol + rtol * |a|``, torch.isclose's non-finite rules): boundaries hit exactly, subnormals,
signed zeros, the largest finite values, NaN and infinities.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import ml_dtypes
import numpy as np
import pytest

from perfgate.tensors._kernel import ChunkStats, KernelParams, Scratch, chunk_stats

BF16 = np.dtype(ml_dtypes.bfloat16)
F32_TINY = float(np.finfo(np.float32).smallest_subnormal)
F32_MAX = float(np.finfo(np.float32).max)
F64_TINY = float(np.finfo(np.float64).smallest_subnormal)
F64_MAX = float(np.finfo(np.float64).max)


def expected(ref: np.ndarray, cand: np.ndarray, offset: int, p: KernelParams) -> ChunkStats:
    """The rules evaluated directly in float64, one array expression each (chunks of at most 8192
    elements, so one dot product per sum as in the kernel)."""
    a, b = ref.astype(np.float64), cand.astype(np.float64)
    n = a.shape[0]
    with np.errstate(all="ignore"):
        d = np.abs(b - a)
        absa = np.abs(a)
        ok = (ref == cand) if p.mode == "exact" else d <= absa * p.rtol + p.atol
        both = np.isfinite(a) & np.isfinite(b)
        if p.mode == "tolerance":
            ok &= np.isfinite(d)
            ok |= a == b
        if p.equal_nan:
            ok |= np.isnan(a) & np.isnan(b)
        if not p.allow_nonfinite:
            ok &= both
        dz = np.where(both, d, 0.0)
        az = np.where(both, absa, 0.0)
        rel = np.where(az == 0, 0.0, dz / np.where(az == 0, 1.0, az))
        pairs = int(np.count_nonzero(both))
        bad = ~ok & both
        x, y = np.where(both, a, 0.0), np.where(both, b, 0.0)
        i = int(np.argmax(dz))
        return ChunkStats(
            elements=n,
            mismatched=n - int(np.count_nonzero(ok)),
            finite_pairs=pairs,
            sum_abs=float(np.sum(dz)),
            max_abs=float(dz[i]) if pairs else -1.0,
            max_abs_at=offset + i,
            max_rel=float(np.max(rel)) if pairs else -1.0,
            max_abs_mismatched=float(np.max(dz[bad])) if bad.any() else -1.0,
            max_rel_mismatched=float(np.max(rel[bad])) if bad.any() else -1.0,
            aa=float(np.dot(x, x)),
            bb=float(np.dot(y, y)),
            ab=float(np.dot(x, y)),
            nonfinite_reference=n - int(np.count_nonzero(np.isfinite(a))),
            nonfinite_candidate=n - int(np.count_nonzero(np.isfinite(b))),
        )


def same(x: float, y: float) -> bool:
    return (math.isnan(x) and math.isnan(y)) or (x == y and math.copysign(1, x) == math.copysign(1, y))


def check(ref: np.ndarray, cand: np.ndarray, p: KernelParams, offset: int = 3) -> ChunkStats:
    """The kernel's figures for one chunk against `expected`: every figure the same, bit for bit, with every
    dot product recomputed; as the kernel runs (`_few_dots` may correct b.b and a.b of a chunk with few
    differences), those two within `_few_dots`'s bound of their exactly rounded values."""
    from perfgate.tensors import _kernel

    want = expected(ref, cand, offset, p)
    original = _kernel._few_dots  # pyright: ignore[reportPrivateUsage]
    _kernel._few_dots = lambda *args: None  # pyright: ignore[reportPrivateUsage]
    try:
        recomputed = chunk_stats(ref, cand, offset, p, Scratch(8192))
    finally:
        _kernel._few_dots = original  # pyright: ignore[reportPrivateUsage]
    assert differing(recomputed, want) == {}
    got = chunk_stats(ref, cand, offset, p, Scratch(8192))
    near = differing(got, want)
    assert set(near) <= {"bb", "ab"}, near
    n = ref.shape[0]
    x, y = ref.astype(np.float64), cand.astype(np.float64)
    factors = {"bb": (y, y), "ab": (x, y)}
    for name, (value, _) in near.items():
        u, v = factors[name]
        exact = math.fsum((u * v).tolist())  # values of at most 24 bits: every product is exact
        assert abs(value - exact) <= 4 * (n + 2) * 2.0**-53 * abs(exact), (name, value, exact)
    return got


def differing(got: ChunkStats, want: ChunkStats) -> dict[str, tuple[float, float]]:
    return {
        f.name: (getattr(got, f.name), getattr(want, f.name))
        for f in dataclasses.fields(ChunkStats)
        if not same(float(getattr(got, f.name)), float(getattr(want, f.name)))
    }


def params(
    atol: float, rtol: float, *, allow_nonfinite: bool = False, equal_nan: bool = False
) -> KernelParams:
    return KernelParams("tolerance", False, atol, rtol, equal_nan, allow_nonfinite)


def close_pair(dtype: Any, n: int = 4096, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    a = rng.standard_normal(n).astype(np.float32)
    b = a + rng.standard_normal(n).astype(np.float32) * np.float32(1e-3)
    return a.astype(dtype), b.astype(dtype)


@pytest.mark.parametrize("dtype", [np.float32, BF16, np.float16, np.float64])
def test_the_tolerance_boundary_is_exact_on_both_sides_of_the_shortcut(dtype: Any) -> None:
    a, b = close_pair(dtype)
    d = np.abs(b.astype(np.float64) - a.astype(np.float64))
    worst = float(d.max())
    below = float(np.nextafter(worst, 0.0))
    # atol exactly at the largest error: every element close (the shortcut decides it).
    assert check(a, b, params(worst, 0.0)).mismatched == 0
    # One step below: the worst element (and any tied with it) fails, found by the per-element test.
    assert check(a, b, params(below, 0.0)).mismatched == int(np.count_nonzero(d == worst))
    # Relative tolerances at an element's own boundary: fl(|a| * rtol) == |b - a| for that element.
    nz = np.flatnonzero((a.astype(np.float64) != 0) & (d > 0))
    for k in nz[:: max(1, nz.size // 8)]:
        ak = abs(float(a[k].astype(np.float64)))
        rtol = float(d[k]) / ak
        for r in (rtol, float(np.nextafter(rtol, 0.0)), float(np.nextafter(rtol, 1.0))):
            check(a, b, params(0.0, r))
            check(a, b, params(F64_TINY, r))
    # The largest relative error at and around rtol, and around the margin the ratio shortcut keeps.
    nonzero = a.astype(np.float64) != 0
    q = float(np.max(d[nonzero] / np.abs(a.astype(np.float64))[nonzero]))
    for r in (q, q / (1 - 2.0**-49), q / (1 - 2.0**-50), q * (1 + 2.0**-52)):
        for step in (0.0, 1.0, np.inf):
            rr = float(np.nextafter(r, step)) if step != 1.0 else r
            check(a, b, params(0.0, rr))
            check(a[nonzero], b[nonzero], params(0.0, rr))
    # The smallest |a| sets the shortcut's allowance: put the worst error on the element with the largest
    # |a| so that only the per-element test can pass it.
    j, big = int(np.argmin(np.abs(a.astype(np.float64)))), int(np.argmax(np.abs(a.astype(np.float64))))
    a2, b2 = a.copy(), b.copy()
    a2[j] = 0.0
    b2[j] = 0.0
    check(a2, b2, params(0.0, float(d.max()) / abs(float(a2[big].astype(np.float64)))))


@pytest.mark.parametrize("dtype", [np.float32, BF16, np.float64])
def test_subnormals_signed_zeros_and_the_largest_finite_values(dtype: Any) -> None:
    info_tiny = F64_TINY if dtype is np.float64 else F32_TINY
    info_max = F64_MAX if dtype is np.float64 else F32_MAX
    if dtype is BF16:
        info_tiny = float(np.finfo(BF16).smallest_subnormal)
        info_max = float(np.finfo(BF16).max)
    special = [0.0, -0.0, info_tiny, -info_tiny, 2 * info_tiny, info_max, -info_max, 1.0, -1.0]
    rng = np.random.default_rng(1)
    for trial in range(40):
        ref = rng.choice(special, 256).astype(dtype)
        cand = rng.choice(special, 256).astype(dtype)
        if trial % 2:
            cand[::2] = ref[::2]  # many equal pairs, including -0.0 against 0.0
        for atol, rtol in [
            (0.0, 0.0),
            (info_tiny, 0.0),
            (0.0, 1e-300),
            (F64_TINY, F64_TINY),
            (1.0, 0.5),
            (0.0, 2.0),
        ]:
            check(ref, cand, params(atol, rtol))
    # No zero reference, errors within rtol, but |a| * rtol underflows: the ratio shortcut must not decide.
    ref = np.array([info_tiny, 2 * info_tiny, 1.0, -info_tiny], dtype=dtype)
    cand = np.array([2 * info_tiny, 3 * info_tiny, 1.0, -2 * info_tiny], dtype=dtype)
    for rtol in (1.0, 2.0, 1e-300, 0.5):
        check(ref, cand, params(0.0, rtol))
    # A zero reference allows atol alone, however small every ratio is elsewhere.
    check(np.array([0.0, 1.0], dtype=dtype), np.array([info_tiny, 1.0], dtype=dtype), params(0.0, 0.5))
    zeros = np.array([0.0, -0.0, 0.0], dtype=dtype)
    assert check(zeros, -zeros, params(0.0, 0.0)).mismatched == 0
    # Differences past the type's range: float32's overflow to infinity in float32 but not in float64.
    big = np.array([info_max, -info_max, info_max], dtype=dtype)
    check(big, -big, params(0.0, 0.0))
    check(big, -big, params(F64_MAX, 0.0))


@pytest.mark.parametrize("allow_nonfinite", [False, True])
@pytest.mark.parametrize("equal_nan", [False, True])
@pytest.mark.parametrize("dtype", [np.float32, BF16, np.float64])
def test_nan_and_infinities_follow_the_rules(dtype: Any, allow_nonfinite: bool, equal_nan: bool) -> None:
    a, b = close_pair(dtype, 512, seed=2)
    rng = np.random.default_rng(3)
    for value in (np.nan, np.inf, -np.inf):
        for side in (a, b):
            side[rng.integers(0, 512, 8)] = value
    a[:4] = b[:4] = np.inf
    a[4:8] = b[4:8] = np.nan
    p = params(1e-2, 1e-2, allow_nonfinite=allow_nonfinite, equal_nan=equal_nan)
    check(a, b, p)
    check(a, a.copy(), p)  # same bytes, with NaN: never the identical-chunk shortcut


@pytest.mark.parametrize(
    ("ref_dtype", "cand_dtype"),
    [(np.float32, BF16), (BF16, np.float32), (np.float16, np.float32), (BF16, np.float64)],
)
def test_mixed_dtypes(ref_dtype: Any, cand_dtype: Any) -> None:
    a, b = close_pair(np.float32, 2048, seed=4)
    ref, cand = a.astype(ref_dtype), b.astype(cand_dtype)
    for atol, rtol in [(0.0, 0.0), (1e-3, 1e-2), (1e-2, 1.6e-2), (0.0, 1e-1)]:
        check(ref, cand, params(atol, rtol))


def test_identical_chunks_and_chunks_whose_first_words_agree() -> None:
    a, _ = close_pair(np.float32, 4096, seed=5)
    check(a, a.copy(), params(0.0, 0.0))
    b = a.copy()
    b[-1] = np.nextafter(b[-1], np.float32(np.inf))  # differs only past the words compared first
    assert check(a, b, params(0.0, 0.0)).mismatched == 1
    bf = a.astype(BF16)
    check(bf, bf.copy(), params(0.0, 0.0))


def test_integers_compare_exactly() -> None:
    a = np.arange(-300, 300, dtype=np.int64) * 7_000_000_000_000
    b = a.copy()
    b[5] += 1  # differs by one where float64 cannot tell the two apart
    got = check(a, b, KernelParams("exact", False, 0.0, 0.0, False))
    assert got.mismatched == 1


def test_every_bfloat16_bit_pattern_widens_to_the_value_ml_dtypes_gives() -> None:
    bits = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    values = bits.view(BF16)
    with np.errstate(invalid="ignore"):
        want = values.astype(np.float64)
    scratch = Scratch(1 << 16)
    from perfgate.tensors._kernel import _widen  # pyright: ignore[reportPrivateUsage]

    out = np.empty(1 << 16)
    with np.errstate(invalid="ignore"):  # signalling NaNs; chunk_stats silences this for every chunk
        _widen(values, out, scratch)
    assert np.array_equal(np.isnan(out), np.isnan(want))
    finite = ~np.isnan(want)
    assert np.array_equal(out[finite].view(np.uint64), want[finite].view(np.uint64))  # signed zeros too


@pytest.mark.parametrize("dtype", [BF16, np.float16, np.float32])
def test_a_chunk_whose_few_failing_ratios_are_tested_alone_is_exact(
    dtype: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rounded data whose near-zero (and subnormal) references have large relative errors: the extremes
    cannot settle the chunk, so only the elements whose own ratio exceeds rtol are tested, never the whole
    chunk (the full per-element test is made to fail here). Every figure stays exact, with atol at, just
    below and just above the errors of those elements, and with true mismatches among them."""
    from perfgate.tensors import _kernel

    def no_full_test(*args: object) -> None:
        raise AssertionError("the whole chunk was given the per-element test")

    rng = np.random.default_rng(7)
    n = 4096
    a = rng.standard_normal(n).astype(np.float32)
    b = a + np.clip(rng.standard_normal(n), -4, 4).astype(np.float32) * np.float32(1e-3)
    tiny = float(np.finfo(dtype).smallest_subnormal)
    near = rng.choice(n, 40, replace=False)
    a[near[:20]] = rng.uniform(1e-4, 1e-3, 20).astype(np.float32) * rng.choice([-1, 1], 20)
    a[near[20:30]] = np.float32(tiny) * rng.integers(1, 4, 10)
    a[near[30:]] = -np.float32(tiny)
    b[near] = a[near] + rng.uniform(-2e-3, 2e-3, 40).astype(np.float32)
    ref, cand = a.astype(dtype), b.astype(dtype)
    wa, wb = ref.astype(np.float64), cand.astype(np.float64)
    assert np.all(wa != 0)
    d = np.abs(wb - wa)
    rtol = 1.6e-2 if dtype is not np.float32 else 5e-2
    ratio_fails = np.abs(d / np.abs(wa)) > rtol
    assert 10 <= np.count_nonzero(ratio_fails) <= n // 16
    worst_near = float(d[ratio_fails].max())
    monkeypatch.setattr(_kernel, "_closeness", no_full_test)
    for atol in (
        worst_near,
        float(np.nextafter(worst_near, 0.0)),
        float(np.nextafter(worst_near, 1.0)),
        1e-3,
        0.0,
    ):
        got = check(ref, cand, params(atol, rtol))
        assert got.elements == n
    # The boundary is exact: at atol == the largest such error nothing fails, one step below something does.
    assert (
        check(ref, cand, params(worst_near + float(np.abs(wa[ratio_fails]).max()) * rtol, rtol)).mismatched
        == 0
    )
    assert (
        check(ref, cand, params(float(np.nextafter(float(d[ratio_fails].min()), 0.0)), rtol)).mismatched > 0
    )


@pytest.mark.parametrize("dtype", [np.float32, BF16, np.float64])
def test_dot_products_of_a_long_chunk_are_the_in_order_sum_of_its_slices_dot_products(dtype: Any) -> None:
    """Past 8192 elements the kernel sums, in order, the BLAS dot products of consecutive 8192-element
    slices (computed as rows in one call): bit for bit the sum of ``np.dot`` of each slice, with the tail."""
    rng = np.random.default_rng(9)
    n = 3 * 8192 + 123
    a = (rng.standard_normal(n) * 10.0 ** rng.integers(-20, 20, n)).astype(np.float32)
    b = a + rng.standard_normal(n).astype(np.float32)
    ref, cand = a.astype(dtype), b.astype(dtype)
    x, y = ref.astype(np.float64), cand.astype(np.float64)
    want = [0.0, 0.0, 0.0]
    for start in range(0, n, 8192):
        sx, sy = x[start : start + 8192], y[start : start + 8192]
        for i, (u, v) in enumerate(((sx, sx), (sy, sy), (sx, sy))):
            want[i] += float(np.dot(u, v))
    for c in (cand, ref.copy()):  # the general path, and the identical-bytes one
        got = chunk_stats(ref, c, 0, params(1.0, 0.0), Scratch(n))
        expected_dots = want if c is cand else [want[0], want[0], want[0]]
        assert [got.aa, got.bb, got.ab] == expected_dots


def _few_changed(dtype: Any, n: int, changed: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A chunk of ``dtype`` and a copy with ``changed`` elements moved (indices returned, ascending)."""
    rng = np.random.default_rng(seed)
    ref = rng.standard_normal(n).astype(np.float32).astype(dtype)
    cand = ref.copy()
    where = np.sort(rng.choice(n, changed, replace=False))
    cand[where] = (ref[where].astype(np.float32) * np.float32(1.02) + np.float32(1e-3)).astype(dtype)
    return ref, cand, where


@pytest.mark.parametrize("dtype", [BF16, np.float16, np.float32, np.dtype(ml_dtypes.float8_e4m3fn)])
def test_a_chunk_with_few_changed_elements_is_settled_on_those_alone(
    dtype: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Few elements differ in their bits (a bfloat16 model whose change moved a few roundings): the kernel
    works on those elements alone (the general path is made to fail here) and every figure is exactly the
    direct float64 evaluation's: zero and signed-zero references among the changed ones, the largest error
    tied between two elements (the first one wins), errors at the allowance's boundary, and a chunk with
    nothing changed."""
    from perfgate.tensors import _kernel

    def no_general(*args: object) -> None:
        raise AssertionError("the chunk took the general path")

    n = 8192 - 77
    ref, cand, where = _few_changed(dtype, n, 300, seed=11)
    ref[where[:3]] = 0.0
    ref[where[3]] = -0.0
    cand[where[4]] = -cand[where[4]]  # a sign flip: a large relative error
    cand[where[9]] = ref[where[9]]  # listed but unchanged
    with np.errstate(all="ignore"):
        wide = np.abs(cand.astype(np.float64) - ref.astype(np.float64))
    top = int(np.argmax(wide))
    ref[where[-1]], cand[where[-1]] = ref[top], cand[top]  # a tie for the largest error, after the first
    monkeypatch.setattr(_kernel, "_general", no_general)
    worst = float(wide.max())
    for atol, rtol in [
        (0.0, 0.0),
        (1e-3, 1.6e-2),
        (worst, 0.0),
        (float(np.nextafter(worst, 0.0)), 0.0),
        (0.0, 1.0),
    ]:
        got = check(ref, cand, params(atol, rtol), offset=5)
        assert got.elements == n
    assert check(ref, cand, params(0.0, 0.0), offset=5).max_abs_at == 5 + top
    check(ref, ref.copy(), params(0.0, 0.0))
    signed = ref.copy()
    signed[ref.astype(np.float64) == 0] = -signed[ref.astype(np.float64) == 0]  # only -0.0 against 0.0
    assert check(ref, signed, params(0.0, 0.0), offset=5).max_abs_at == 5


@pytest.mark.parametrize("dtype", [BF16, np.float32])
def test_few_changed_elements_with_nan_or_infinity_or_too_many_changes_take_the_general_path(
    dtype: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A NaN or infinity (even with the same bits on both sides) or more than one changed element in 16
    leaves the chunk to the general path, and the figures stay exact."""
    from perfgate.tensors import _kernel

    taken: list[int] = []
    general = _kernel._general  # pyright: ignore[reportPrivateUsage]

    def counted(*args: Any) -> ChunkStats:
        taken.append(1)
        return general(*args)

    monkeypatch.setattr(_kernel, "_general", counted)
    for value in (np.nan, np.inf):
        ref, cand, _ = _few_changed(dtype, 4096, 20, seed=12)
        ref[100] = cand[100] = value
        for p in (params(1e-3, 1e-2), params(1e-3, 1e-2, allow_nonfinite=True, equal_nan=True)):
            check(ref, cand, p)
    assert len(taken) == 8  # `check` runs the kernel twice
    ref, _, _ = _few_changed(dtype, 4096, 0, seed=13)
    cand = ref.copy()
    cand[::16] = (ref[::16].astype(np.float32) + np.float32(0.5)).astype(dtype)  # one element in 16
    check(ref, cand, params(1e-3, 1e-2))
    assert len(taken) == 8
    cand[1] = (ref[1].astype(np.float32) + np.float32(0.5)).astype(dtype)  # one more
    check(ref, cand, params(1e-3, 1e-2))
    assert len(taken) == 10


@pytest.mark.parametrize("dtype", [BF16, np.float32])
def test_few_differences_correct_the_dot_products_unless_the_changes_hold_the_norm(
    dtype: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """b.b and a.b of a chunk with few differences are a.a corrected by the changed elements (within the
    bound of the exact sums, `check`), except when the changes hold much of the chunk's squared norm: a
    few huge values zeroed or grown must not cancel a.a into noise, so those dot products are recomputed
    (bit for bit); the chunk stays on the few-differences path either way."""
    from perfgate.tensors import _kernel

    def no_general(*args: object) -> None:
        raise AssertionError("the chunk took the general path")

    corrected: list[bool] = []
    few_dots = _kernel._few_dots  # pyright: ignore[reportPrivateUsage]

    def spy(*args: Any) -> Any:
        dots = few_dots(*args)
        corrected.append(dots is not None)
        return dots

    monkeypatch.setattr(_kernel, "_general", no_general)
    monkeypatch.setattr(_kernel, "_few_dots", spy)
    n = 8192 - 5
    ref, cand, where = _few_changed(dtype, n, 12, seed=21)  # a rounding moved here and there
    check(ref, cand, params(1e-3, 1e-2))
    assert corrected == [True]
    for huge_side in ("reference", "candidate", "both"):
        big, small = ref.copy(), cand.copy()
        if huge_side in ("reference", "both"):
            big[where[:3]] = 1e30  # the change zeroes or shrinks them: b.b is a.a minus nearly all of it
        if huge_side in ("candidate", "both"):
            small[where[3:6]] = -1e30
        corrected.clear()
        check(big, small, params(1e-3, 1e-2))
        assert corrected == [False]


def test_a_sum_of_few_errors_is_taken_alone_only_when_every_partial_sum_is_exact() -> None:
    """`_short_sum` answers only when every partial sum of the errors is a float64 (then numpy's pairwise
    sum of the whole error array, zeros included, has the same bits, and so has the exact sum); it declines
    errors whose partial sums could round: magnitudes far apart, or too many values for their significands.
    Values of each float type of at most 4 bytes, zeros, signed zeros and subnormals of the type among them."""
    from perfgate.tensors._kernel import _digits, _short_sum  # pyright: ignore[reportPrivateUsage]

    rng = np.random.default_rng(21)
    dtypes = [BF16, np.dtype(np.float16), np.dtype(np.float32), np.dtype(ml_dtypes.float8_e4m3fn)]
    answered = declined = 0
    for trial in range(400):
        dtype = dtypes[trial % len(dtypes)]
        count = int(rng.integers(1, 400))
        spread = 10.0 ** rng.integers(-1, 6) if trial % 3 else 1.0  # far-apart magnitudes, or not
        before = rng.standard_normal(count) * spread ** rng.standard_normal(count)
        after = before * (1 + rng.standard_normal(count) * 0.05)
        if trial % 5 == 0:  # zeros, signed zeros and the type's subnormals among them
            tiny = float(ml_dtypes.finfo(dtype).smallest_subnormal)
            before[:3], after[:3] = [0.0, -0.0, tiny], [tiny * 3, 0.0, -tiny]
        with np.errstate(all="ignore"):
            before = before.astype(dtype).astype(np.float64)
            after = after.astype(dtype).astype(np.float64)
        finite = np.isfinite(before) & np.isfinite(after)
        before, after = before[finite], after[finite]
        d = np.abs(after - before)
        worst = float(d.max()) if d.shape[0] else 0.0
        got = _short_sum(d, before, after, _digits(dtype), worst)
        padded = np.zeros(8192)
        padded[np.sort(rng.choice(8192, d.shape[0], replace=False))] = d
        if got is None:
            declined += 1
        else:
            answered += 1
            assert got == float(np.sum(padded)) == math.fsum(d.tolist()), (trial, dtype)
    assert answered > 100 and declined > 20, (answered, declined)
    assert [_digits(t) for t in dtypes] == [8, 11, 24, 4]
    one = np.array([1.0])
    # 1 + 2^-23 and 2^-23 * 3: multiples of 2^-23 below 2^30, exact
    assert _short_sum(np.array([2.0**-23, 3 * 2.0**-23]), one, one, 24, 3 * 2.0**-23) == 4 * 2.0**-23
    # errors of 2^30 with values of exponent -22 and 24 significant bits: 2^-46 steps, 2^(31 + 1) > 2^(-46 + 53)
    big = np.array([2.0**30, 2.0**30])
    assert _short_sum(big, np.array([2.0**-23, 1.0]), big, 24, 2.0**30) is None
    assert _short_sum(np.zeros(3), np.zeros(3), np.zeros(3), 8, 0.0) == 0.0
    # The rule at its boundary: values of exponent 0 and 24 bits are multiples of 2^-24; two errors below
    # 2^27 sum below 2^28 < 2^(-24 + 53): answered; an error of 2^27 could make a partial sum of 2^29: declined
    halves = np.array([0.5, 0.5])
    below = 2.0**27 - 1
    assert _short_sum(np.array([below, 1.0]), halves, halves, 24, below) == below + 1.0
    assert _short_sum(np.array([2.0**27, 1.0]), halves, halves, 24, 2.0**27) is None
