"""The comparison's numerics: agreement with torch.testing.assert_close, statuses, options, streaming."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from perfgate.harness.dump import dump_tensors
from perfgate.tensors import (
    CompareOptions,
    ComparisonCancelled,
    ComparisonReport,
    TensorComparison,
    TensorInputError,
    ToleranceOverride,
    compare_sources,
    open_tensor_source,
)

torch = pytest.importorskip("torch")

SHAPE = (37, 129)  # 4773 elements: several chunks of CHUNK, the last one partial
CHUNK = 1000


def compare(tmp_path: Path, ref: dict[str, Any], cand: dict[str, Any], **options: Any) -> ComparisonReport:
    ref_file = dump_tensors(tmp_path / "ref.safetensors", ref)
    cand_file = dump_tensors(tmp_path / "cand.safetensors", cand)
    options.setdefault("chunk_elements", CHUNK)
    with open_tensor_source(ref_file) as r, open_tensor_source(cand_file) as c:
        return compare_sources(r, c, CompareOptions(**options))


def only(report: ComparisonReport) -> TensorComparison:
    (tensor,) = report.tensors
    return tensor


def torch_verdict(actual: Any, expected: Any, atol: float, rtol: float, equal_nan: bool) -> dict[str, Any]:
    """What torch.testing.assert_close reports: mismatches, greatest abs/rel difference and its index."""
    try:
        torch.testing.assert_close(actual, expected, atol=atol, rtol=rtol, equal_nan=equal_nan)
    except AssertionError as exc:
        text = str(exc)
    else:
        return {"mismatched": 0}
    mismatched = int(re.search(r"Mismatched elements: (\d+) /", text).group(1))  # type: ignore[union-attr]
    absolute = re.search(r"Greatest absolute difference: (\S+) at index \(([^)]*)\)", text)
    relative = re.search(r"Greatest relative difference: (\S+) at index", text)
    assert absolute is not None and relative is not None, text
    index = [int(i) for i in absolute.group(2).split(",") if i.strip()]
    return {
        "mismatched": mismatched,
        "abs": float(absolute.group(1)),
        "abs_index": index,
        "rel": float(relative.group(1)),
    }


def one_ulp_up(t: Any) -> Any:
    """Each element moved one unit in the last place away from zero (same sign, finite inputs)."""
    int_type = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16}[t.dtype]
    return (t.view(int_type) + 1).view(t.dtype)


DTYPES = {
    "float32": ("float32", 4 * 2**-23),
    "bfloat16": ("bfloat16", 4 * 2**-7),
    "float16": ("float16", 4 * 2**-10),
}


def make_case(dtype_name: str, seed: int, nan: bool) -> tuple[Any, Any, float, float]:
    """A reference, and a candidate that is within tolerance by a wide margin except at injected
    errors far outside it: torch (computing in the input dtype) and float64 cannot disagree on them."""
    dtype = getattr(torch, dtype_name)
    rtol = DTYPES[dtype_name][1]
    atol = 1e-5
    g = torch.Generator().manual_seed(seed)
    ref = torch.randn(SHAPE, generator=g).to(dtype)
    cand = ref.clone()
    flat = cand.view(-1)
    ulp = torch.randperm(flat.numel(), generator=g)[:1500]
    flat[ulp] = one_ulp_up(flat[ulp])
    bad = torch.randperm(flat.numel(), generator=g)[:40]
    flat[bad] = flat[bad] + (torch.rand(40, generator=g) * 3 + 0.5).to(dtype)
    if nan:
        ref_flat = ref.view(-1)
        both = torch.randperm(flat.numel(), generator=g)[:7]
        ref_flat[both] = float("nan")
        flat[both] = float("nan")
        only_cand = torch.randperm(flat.numel(), generator=g)[:5]
        flat[only_cand] = float("nan")
        inf_pos = torch.randperm(flat.numel(), generator=g)[:3]
        ref_flat[inf_pos] = float("inf")
        flat[inf_pos] = float("inf")
    return ref, cand, atol, rtol


@pytest.mark.parametrize("dtype_name", list(DTYPES))
@pytest.mark.parametrize("nan", [False, True], ids=["finite", "with_nan_inf"])
@pytest.mark.parametrize("equal_nan", [False, True])
def test_mismatch_counts_and_max_errors_agree_with_torch_assert_close(
    tmp_path: Path, dtype_name: str, nan: bool, equal_nan: bool
) -> None:
    ref, cand, atol, rtol = make_case(dtype_name, seed=len(dtype_name) + nan, nan=nan)
    # torch's semantics for NaN/Inf hold under the explicit opt-in (by default any non-finite value fails)
    t = only(
        compare(
            tmp_path, {"x": ref}, {"x": cand}, atol=atol, rtol=rtol, equal_nan=equal_nan, allow_nonfinite=True
        )
    )

    # Same values widened to float64: torch and perfgate then compute identically, bit for bit.
    wide = torch_verdict(cand.double(), ref.double(), atol, rtol, equal_nan)
    # Same tensors in their own dtype: counts agree (no element is near the boundary); torch's error
    # figures are rounded to the dtype.
    native = torch_verdict(cand, ref, atol, rtol, equal_nan)
    assert t.mismatched == wide["mismatched"] == native["mismatched"] > 0
    assert t.elements == ref.numel()
    assert t.status == "value_mismatch"

    finite = torch.isfinite(ref.double()) & torch.isfinite(cand.double())
    close = torch.isclose(cand.double(), ref.double(), atol=atol, rtol=rtol, equal_nan=equal_nan)
    diff = (cand.double() - ref.double()).abs()
    finite_mismatch = finite & ~close
    expected_mm = float(diff[finite_mismatch].max())
    assert t.max_abs_error_mismatched == expected_mm
    if not nan:  # with NaN mismatches torch's greatest difference is itself NaN
        assert wide["abs"] == expected_mm
        assert t.max_rel_error_mismatched == pytest.approx(wide["rel"], rel=1e-12)
        eps = float(torch.finfo(ref.dtype).eps)
        assert t.max_abs_error_mismatched == pytest.approx(native["abs"], rel=2 * eps)
        assert t.max_rel_error_mismatched == pytest.approx(native["rel"], rel=4 * eps)

    # Over all finite pairs: max abs error, its multi-dimensional index, mean, and NaN/Inf counts.
    masked = torch.where(finite, diff, torch.zeros_like(diff))
    flat_index = int(masked.view(-1).argmax())
    assert t.max_abs_error == float(masked.max())
    assert t.max_abs_error_index == list(np.unravel_index(flat_index, SHAPE))
    assert t.mean_abs_error == pytest.approx(float(diff[finite].mean()), rel=1e-9)
    assert t.nonfinite_reference == int((~torch.isfinite(ref)).sum())
    assert t.nonfinite_candidate == int((~torch.isfinite(cand)).sum())
    cos = torch.nn.functional.cosine_similarity(
        torch.where(finite, ref.double(), 0).view(-1), torch.where(finite, cand.double(), 0).view(-1), dim=0
    )
    assert t.cosine == pytest.approx(float(cos), rel=1e-9)


@pytest.mark.parametrize("dtype_name", list(DTYPES))
def test_within_tolerance_everywhere_is_a_match_as_for_torch(tmp_path: Path, dtype_name: str) -> None:
    ref, cand, atol, rtol = make_case(dtype_name, seed=7, nan=False)
    cand = one_ulp_up(ref)
    torch.testing.assert_close(cand, ref, atol=atol, rtol=rtol)
    report = compare(tmp_path, {"x": ref}, {"x": cand}, atol=atol, rtol=rtol)
    t = only(report)
    assert (report.status, t.status, t.mismatched) == ("match", "match", 0)
    assert t.max_abs_error == float((cand.double() - ref.double()).abs().max())
    assert t.max_abs_error_mismatched is None


def test_the_reference_scales_the_tolerance_not_the_candidate(tmp_path: Path) -> None:
    ref = torch.tensor([1.0, 100.0])
    cand = torch.tensor([100.0, 1.0])
    # |diff| = 99 <= 0 + 0.99 * |ref| only where the reference is 100.
    t = only(compare(tmp_path, {"x": ref}, {"x": cand}, atol=0.0, rtol=0.99))
    assert t.mismatched == torch_verdict(cand, ref, 0.0, 0.99, False)["mismatched"] == 1


def test_opted_in_infinities_match_only_when_equal_and_nan_needs_equal_nan(tmp_path: Path) -> None:
    inf, nan = float("inf"), float("nan")
    ref = torch.tensor([inf, inf, -inf, nan, 1.0, nan])
    cand = torch.tensor([inf, -inf, 1e30, nan, inf, 1.0])
    for equal_nan, expected in [(False, 5), (True, 4)]:
        t = only(
            compare(
                tmp_path,
                {"x": ref},
                {"x": cand},
                atol=1.0,
                rtol=1.0,
                equal_nan=equal_nan,
                allow_nonfinite=True,
            )
        )
        assert t.mismatched == expected == torch_verdict(cand, ref, 1.0, 1.0, equal_nan)["mismatched"]
        assert (t.nonfinite_reference, t.nonfinite_candidate) == (5, 4)


def test_non_finite_values_fail_by_default_counted_per_tensor(tmp_path: Path) -> None:
    inf, nan = float("inf"), float("nan")
    ref = {"a": torch.tensor([1.0, inf]), "b": torch.tensor([nan, 2.0, 3.0]), "c": torch.tensor([1.0, 2.0])}
    report = compare(
        tmp_path, ref, {k: v.clone() for k, v in ref.items()}, atol=0.0, rtol=0.0, equal_nan=True
    )
    by_key = {t.key: t for t in report.tensors}
    assert report.status == "mismatch"
    assert (by_key["a"].status, by_key["a"].mismatched, by_key["a"].nonfinite_reference) == (
        "value_mismatch",
        1,
        1,
    )
    assert (by_key["b"].status, by_key["b"].mismatched, by_key["b"].nonfinite_candidate) == (
        "value_mismatch",
        1,
        1,
    )
    assert by_key["c"].status == "match"


def test_integers_compare_exactly_unless_told_otherwise(tmp_path: Path) -> None:
    big = 2**60
    ref = {"ids": np.array([big, 5, 7], dtype=np.int64), "mask": np.array([True, False])}
    cand = {"ids": np.array([big + 1, 5, 8], dtype=np.int64), "mask": np.array([True, False])}
    report = compare(tmp_path, ref, cand, atol=10.0, rtol=0.0)
    ids = next(t for t in report.tensors if t.key == "ids")
    assert (ids.compared_as, ids.mismatched, ids.status) == ("exact", 2, "value_mismatch")
    loose = compare(tmp_path, ref, cand, atol=10.0, rtol=0.0, integers_exact=False)
    assert loose.status == "match"
    assert next(t for t in loose.tensors if t.key == "ids").compared_as == "tolerance"


def test_overrides_pick_the_first_matching_glob(tmp_path: Path) -> None:
    ref = {"layer.weight": np.zeros(4, np.float32), "layer.bias": np.zeros(4, np.float32)}
    cand = {"layer.weight": np.full(4, 0.01, np.float32), "layer.bias": np.full(4, 0.01, np.float32)}
    overrides = [ToleranceOverride("*.bias", 0.1, 0.0), ToleranceOverride("layer.*", 0.0, 0.0)]
    report = compare(tmp_path, ref, cand, atol=1e-6, rtol=0.0, overrides=overrides)
    by_key = {t.key: t for t in report.tensors}
    assert (by_key["layer.bias"].status, by_key["layer.bias"].atol) == ("match", 0.1)
    assert (by_key["layer.weight"].status, by_key["layer.weight"].atol) == ("value_mismatch", 0.0)
    assert report.status == "mismatch"


def test_keys_filter_restricts_both_sides_and_must_match_something(tmp_path: Path) -> None:
    ref = {"a.x": np.zeros(2), "b.x": np.zeros(2), "c": np.zeros(1)}
    cand = {"a.x": np.zeros(2), "b.x": np.ones(2), "d": np.zeros(1)}
    report = compare(tmp_path, ref, cand, atol=0.0, rtol=0.0, keys=["a.*"])
    assert [t.key for t in report.tensors] == ["a.x"]
    assert (report.status, report.missing_keys, report.extra_keys) == ("match", [], [])
    with pytest.raises(TensorInputError, match="match no tensor"):
        compare(tmp_path, ref, cand, atol=0.0, rtol=0.0, keys=["zzz*"])


def test_differing_key_sets_are_incomparable_and_listed(tmp_path: Path) -> None:
    ref = {"a": np.zeros(2), "b": np.zeros(2), "c": np.zeros(2)}
    cand = {"a": np.zeros(2), "d": np.zeros(2)}
    report = compare(tmp_path, ref, cand, atol=0.0, rtol=0.0)
    assert (report.status, report.missing_keys, report.extra_keys) == ("incomparable", ["b", "c"], ["d"])
    assert "missing" in report.summary and "⟦d⟧" in report.summary


def test_shape_mismatch_is_reported_without_comparing_values(tmp_path: Path) -> None:
    report = compare(tmp_path, {"w": np.zeros((4, 4))}, {"w": np.zeros(16)}, atol=0.0, rtol=0.0)
    t = only(report)
    assert (report.status, t.status, t.elements, t.max_abs_error) == (
        "incomparable",
        "shape_mismatch",
        None,
        None,
    )
    assert (t.shape_reference, t.shape_candidate) == ([4, 4], [16])


def test_a_value_mismatch_outranks_structural_differences(tmp_path: Path) -> None:
    ref = {"a": np.zeros(2), "b": np.zeros(3)}
    cand = {"a": np.ones(2), "b": np.zeros(4)}
    assert compare(tmp_path, ref, cand, atol=0.0, rtol=0.0).status == "mismatch"


def test_dtype_change_is_flagged_unless_allowed_and_values_are_compared_either_way(tmp_path: Path) -> None:
    ref = torch.randn(64, generator=torch.Generator().manual_seed(3))
    cand = ref.bfloat16()
    strict = only(compare(tmp_path, {"x": ref}, {"x": cand}, atol=1e-5, rtol=1e-2))
    assert (strict.status, strict.dtype_reference, strict.dtype_candidate) == (
        "dtype_mismatch",
        "float32",
        "bfloat16",
    )
    assert strict.mismatched == 0 and strict.max_abs_error is not None and strict.max_abs_error > 0
    allowed = compare(tmp_path, {"x": ref}, {"x": cand}, atol=1e-5, rtol=1e-2, allow_dtype_change=True)
    assert (allowed.status, only(allowed).status) == ("match", "match")


def test_float8_and_complex_tensors_are_compared(tmp_path: Path) -> None:
    g = torch.Generator().manual_seed(5)
    f8 = torch.randn(300, generator=g).to(torch.float8_e4m3fn)
    f8_cand = f8.float()
    f8_cand[10] += 4.0
    c = torch.randn(50, dtype=torch.complex64, generator=g)
    c_cand = c.clone()
    c_cand[3] += 1j
    report = compare(
        tmp_path,
        {"f8": f8, "c": c},
        {"f8": f8_cand.to(torch.float8_e4m3fn), "c": c_cand},
        atol=1e-3,
        rtol=0.0,
    )
    by_key = {t.key: t for t in report.tensors}
    assert (
        by_key["f8"].mismatched
        == torch_verdict(f8_cand.to(torch.float8_e4m3fn).float(), f8.float(), 1e-3, 0.0, False)["mismatched"]
        == 1
    )
    assert by_key["f8"].dtype_reference == "float8_e4m3fn"
    assert by_key["c"].mismatched == 1
    assert by_key["c"].max_abs_error == pytest.approx(1.0)
    assert by_key["c"].max_abs_error_index == [3]


def test_relative_error_skips_zero_references(tmp_path: Path) -> None:
    t = only(compare(tmp_path, {"x": np.array([0.0, 2.0])}, {"x": np.array([1.0, 2.5])}, atol=0.0, rtol=0.0))
    assert (t.max_abs_error, t.max_abs_error_index, t.max_rel_error) == (1.0, [0], 0.25)


def test_results_do_not_depend_on_chunk_size_and_threads_change_nothing(tmp_path: Path) -> None:
    ref, cand, atol, rtol = make_case("float32", seed=11, nan=True)
    runs = {
        (n, workers): only(
            compare(
                tmp_path, {"x": ref}, {"x": cand}, atol=atol, rtol=rtol, chunk_elements=n, workers=workers
            )
        )
        for n, workers in [(7, 1), (7, 3), (4096, 1), (1 << 16, 2)]
    }
    assert runs[(7, 1)] == runs[(7, 3)]  # chunks are folded in order, whatever thread computed them
    first = runs[(7, 1)]
    for other in runs.values():
        assert (other.mismatched, other.max_abs_error, other.max_abs_error_index, other.max_rel_error) == (
            first.mismatched,
            first.max_abs_error,
            first.max_abs_error_index,
            first.max_rel_error,
        )
        assert other.mean_abs_error == pytest.approx(first.mean_abs_error, rel=1e-12)
        assert other.cosine == pytest.approx(first.cosine, rel=1e-12)


def test_scalars_and_empty_tensors_compare(tmp_path: Path) -> None:
    ref = {"loss": np.float32(2.5), "empty": np.zeros((0, 3), np.float32)}
    cand = {"loss": np.float32(2.5), "empty": np.zeros((0, 3), np.float32)}
    report = compare(tmp_path, ref, cand, atol=0.0, rtol=0.0)
    by_key = {t.key: t for t in report.tensors}
    assert report.status == "match"
    assert (by_key["loss"].max_abs_error_index, by_key["loss"].elements) == ([], 1)
    assert (by_key["empty"].elements, by_key["empty"].max_abs_error, by_key["empty"].mismatched_fraction) == (
        0,
        None,
        0.0,
    )


def test_tolerances_must_be_finite_and_non_negative() -> None:
    with pytest.raises(TensorInputError, match="atol"):
        CompareOptions(atol=-1.0, rtol=0.0)
    with pytest.raises(TensorInputError, match="rtol"):
        CompareOptions(atol=0.0, rtol=float("nan"))
    with pytest.raises(TensorInputError, match="override"):
        CompareOptions(atol=0.0, rtol=0.0, overrides=[ToleranceOverride("*", float("inf"), 0.0)])


def test_progress_reaches_the_total_and_cancellation_stops_the_comparison(tmp_path: Path) -> None:
    ref_file = dump_tensors(tmp_path / "r.safetensors", {"x": np.zeros(5000, np.float32)})
    seen: list[tuple[int, int]] = []
    with open_tensor_source(ref_file) as r, open_tensor_source(ref_file) as c:
        compare_sources(
            r,
            c,
            CompareOptions(atol=0, rtol=0, chunk_elements=100),
            progress=lambda d, t, _: seen.append((d, t)),
        )
        assert seen[-1] == (40000, 40000)
        calls: list[int] = []

        def cancelled() -> bool:
            calls.append(1)
            return len(calls) > 3

        with pytest.raises(ComparisonCancelled):
            compare_sources(r, c, CompareOptions(atol=0, rtol=0, chunk_elements=100), cancelled=cancelled)
        assert len(calls) == 4


def test_the_public_api_is_declared_and_importable() -> None:
    import perfgate.tensors
    import perfgate.tensors.dtypes

    for module in (perfgate.tensors, perfgate.tensors.dtypes):
        for name in module.__all__:
            assert getattr(module, name) is not None, name
    assert "compare_sources" in perfgate.tensors.__all__ and "open_tensor_source" in perfgate.tensors.__all__


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "int64", "complex64"])
def test_identical_tensors_are_settled_in_their_own_dtype_with_the_general_figures(dtype: str) -> None:
    """Bit-identical chunks skip the widening; the figures are what the general path gives for equal
    values (errors 0, every element close, cosine 1), and a NaN or a changed element still takes the
    general path (NaN fails parity; the changed element is found)."""
    import ml_dtypes

    from perfgate.tensors._kernel import KernelParams, Scratch, chunk_stats

    np_dtype = np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.dtype(dtype)
    rng = np.random.default_rng(3)
    values = (rng.standard_normal(5000) * 100).astype(np_dtype)
    params = KernelParams(
        mode="exact" if dtype == "int64" else "tolerance",
        complex_values=dtype == "complex64",
        atol=1e-5,
        rtol=1e-3,
        equal_nan=False,
    )
    fast = chunk_stats(values, values.copy(), 7, params, Scratch(8192))
    wide = values.astype(np.complex128 if dtype == "complex64" else np.float64)
    assert (fast.mismatched, fast.sum_abs, fast.max_abs, fast.max_abs_at, fast.max_rel) == (
        0,
        0.0,
        0.0,
        7,
        0.0,
    )
    assert fast.finite_pairs == 5000 and fast.aa == fast.bb == fast.ab
    assert fast.aa == pytest.approx(float(np.vdot(wide, wide).real), rel=1e-12)
    if dtype != "int64":
        with_nan = values.copy()
        with_nan[10] = np.nan
        stats = chunk_stats(with_nan, with_nan.copy(), 0, params, Scratch(8192))
        assert stats.mismatched == 1 and stats.nonfinite_reference == 1
    changed = values.copy()
    changed[42] = changed[42] * 2 + 1
    stats = chunk_stats(values, changed, 0, params, Scratch(8192))
    assert stats.mismatched >= 1 and stats.max_abs_at == 42


def test_the_reading_thread_computes_the_chunks_no_pool_thread_has_started(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With ``workers`` threads the engine runs ``workers - 1`` pool threads and the reading thread: when
    the chunks in flight fill up it takes back one no pool thread has started and computes it itself,
    instead of waiting (a slowed pool thread leaves it most of them). The figures are those of one thread."""
    import threading
    import time

    from perfgate.tensors import _engine

    ref, cand, atol, rtol = make_case("float32", seed=12, nan=False)
    alone = only(
        compare(tmp_path, {"x": ref}, {"x": cand}, atol=atol, rtol=rtol, chunk_elements=64, workers=1)
    )
    names: list[str] = []
    compute = _engine.Engine._compute  # pyright: ignore[reportPrivateUsage]

    def watched(self: Any, *args: Any) -> Any:
        name = threading.current_thread().name
        names.append(name)
        if name.startswith("perfgate-compare"):
            time.sleep(0.002)
        return compute(self, *args)

    monkeypatch.setattr(_engine.Engine, "_compute", watched)
    shared = only(
        compare(tmp_path, {"x": ref}, {"x": cand}, atol=atol, rtol=rtol, chunk_elements=64, workers=2)
    )
    assert shared == alone
    here = threading.current_thread().name
    assert set(names) <= {here, "perfgate-compare_0"}  # one pool thread beside the reading one
    assert names.count(here) > len(names) // 2
