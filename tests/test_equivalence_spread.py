"""Issue 48 item 5: the equivalence ceiling comes from the evidence. A deterministic baseline keeps the
per-dtype table; a nondeterministic one (its launches' dumps at the same step differ) raises it to twice its
own measured spread, bounded by the table's maximum; the answer says where the ceiling came from, and an
unmeasured spread is one compare_tensors away (through the protocol, on ledger records as the tools write
them)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from mcp import Client

from perfgate.decisions.equivalence import ceiling, maximum
from test_record_decision import Evidence, _keep, _open, _text

pytestmark = pytest.mark.anyio

STEP = 3


def _dump(path: str, byte: str, launch: int = 0) -> dict[str, Any]:
    return {
        "path": path,
        "digest": "blake3:" + byte * 64,
        "size_bytes": 8,
        "launch": launch,
        "rank": 0,
        "step": STEP,
    }


def _check(
    ev: Evidence,
    ref: tuple[str, str, str],
    cand: tuple[str, str, str],
    *,
    atol: float,
    max_abs: float = 0.0,
    max_rel: float = 0.0,
    state: str = "passed",
) -> str:
    """A compare_tensors record of ``ref`` against ``cand`` ((window, path, digest byte) each), float32."""
    files = [
        {"role": role, "path": path, "digest": "blake3:" + byte * 64}
        for role, (_, path, byte) in (("reference", ref), ("candidate", cand))
    ]
    producers = [
        {**f, "evidence_id": w, "launch": 0} for f, (w, _, _) in zip(files, (ref, cand), strict=True)
    ]
    tensor = {
        "key": "fc.weight",
        "status": "match" if state == "passed" else "value_mismatch",
        "dtype_reference": "float32",
        "compared_as": "tolerance",
        "atol": atol,
        "rtol": 1e-5,
        "max_abs_error": max_abs,
        "max_rel_error": max_rel,
    }
    return ev.add(
        "compare_tensors",
        state,
        {
            "status": "match" if state == "passed" else "mismatch",
            "files": files,
            "producers": producers,
            "tensors": [tensor],
            "tensors_total": 1,
            "tolerance_by_dtype": [{"dtype": "float32", "tensors": 1, "atol": atol, "rtol": 1e-5}],
        },
        {"reference": ref[1], "candidate": cand[1], "atol": atol, "rtol": 1e-5},
    )


def _experiment(ev: Evidence, deterministic: bool) -> tuple[list[dict[str, str]], list[str]]:
    """Two baseline launches dumping at STEP (identical bytes or not), one candidate launch."""
    base = [
        ev.window(tensor_dumps=[_dump("base0.safetensors", "a")]),
        ev.window(tensor_dumps=[_dump("base1.safetensors", "a" if deterministic else "c")]),
        ev.window(tensor_dumps=[]),
    ]
    cand = [ev.window(tensor_dumps=[_dump("cand.safetensors", "b")]), ev.window(), ev.window()]
    links = [
        {"id": ev.env(), "role": "environment"},
        {"id": ev.comparison(base, cand), "role": "comparison"},
    ]
    return links, base + cand


def _equivalence(result: Any) -> dict[str, Any]:
    assert result.structured_content is not None, _text(result)
    return next(g for g in result.structured_content["gates"] if g["name"] == "equivalence")


LOOSE = 5e-4
"""Beyond the float32 table ceiling (atol 1e-4), within its maximum (1e-3)."""


def test_the_maximum_bounds_the_table_ceiling_from_above() -> None:
    for dtype in ("float32", "bfloat16", "float16"):
        table, top = ceiling(dtype), maximum(dtype)
        assert table is not None and top is not None
        assert top.atol > table.atol and top.rtol > table.rtol
    assert ceiling("float8_e4m3fn") is None and maximum("float8_e4m3fn") is None


async def test_a_deterministic_baseline_keeps_the_table_ceiling(server: Any, workspace: Path) -> None:
    ev = Evidence(workspace)
    async with Client(server) as client:
        exp = await _open(client, tolerance={"atol": LOOSE, "rtol": 1e-5})
        links, w = _experiment(ev, deterministic=True)
        check = _check(ev, (w[0], "base0.safetensors", "a"), (w[3], "cand.safetensors", "b"), atol=LOOSE)
        result = await _keep(client, exp, [*links, {"id": check, "role": "correctness"}])
        text = _text(result)
        assert result.is_error and "gate(s) unmet (equivalence)" in text, text
        assert "per-dtype table: float32 atol 0.0001" in text
        assert f"bit-identical over launches {w[0]}/0, {w[1]}/0 at step {STEP}" in text
        assert "classification='training_change'" in text  # the way that can succeed

        # the same experiment at the table's tolerance is kept, and says where its ceiling came from
        exp = await _open(client)
        links, w = _experiment(ev, deterministic=True)
        check = _check(ev, (w[0], "base0.safetensors", "a"), (w[3], "cand.safetensors", "b"), atol=1e-5)
        kept = await _keep(client, exp, [*links, {"id": check, "role": "correctness"}])
        assert not kept.is_error, _text(kept)
        assert "bit-identical over launches" in _equivalence(kept)["reason"]


async def test_a_nondeterministic_baseline_raises_the_ceiling_to_its_measured_spread(
    server: Any, workspace: Path
) -> None:
    ev = Evidence(workspace)
    async with Client(server) as client:
        exp = await _open(client, tolerance={"atol": LOOSE, "rtol": 1e-5})
        links, w = _experiment(ev, deterministic=False)
        check = _check(ev, (w[0], "base0.safetensors", "a"), (w[3], "cand.safetensors", "b"), atol=LOOSE)
        links.append({"id": check, "role": "correctness"})
        refused = await _keep(client, exp, links)
        text = _text(refused)
        assert refused.is_error and "gate(s) unmet (equivalence)" in text, text
        assert "differ at step 3, but no compare_tensors of two of them measured how far" in text
        one_call = (
            "compare_tensors(reference='base0.safetensors', candidate='base1.safetensors', atol=0, rtol=0)"
        )
        assert one_call in text
        # the next step taken: the bit-exact comparison of two baseline launches (it fails: they differ)
        _check(
            ev,
            (w[0], "base0.safetensors", "a"),
            (w[1], "base1.safetensors", "c"),
            atol=0.0,
            max_abs=3e-4,
            max_rel=2e-6,
            state="failed",
        )
        kept = await _keep(client, exp, [])
        assert not kept.is_error, _text(kept)
        reason = _equivalence(kept)["reason"]
        assert f"from the baseline's spread over launches {w[0]}/0, {w[1]}/0 at step {STEP}" in reason
        assert "max abs 0.0003" in reason and "float32 atol 0.0006" in reason


async def test_a_spread_beyond_the_maximum_is_bounded_and_cannot_carry_a_looser_check(
    server: Any, workspace: Path
) -> None:
    ev = Evidence(workspace)
    async with Client(server) as client:
        exp = await _open(client, tolerance={"atol": 5e-3, "rtol": 1e-5})
        links, w = _experiment(ev, deterministic=False)
        _check(
            ev,
            (w[0], "base0.safetensors", "a"),
            (w[1], "base1.safetensors", "c"),
            atol=0.0,
            max_abs=1e-2,
            state="failed",
        )
        check = _check(ev, (w[0], "base0.safetensors", "a"), (w[3], "cand.safetensors", "b"), atol=5e-3)
        result = await _keep(client, exp, [*links, {"id": check, "role": "correctness"}])
        text = _text(result)
        assert result.is_error and "gate(s) unmet (equivalence)" in text, text
        assert "float32 atol 0.001," in text and "bounded by the table's maximum" in text
        assert "classification='training_change'" in text


async def test_a_spread_of_the_candidates_own_launches_does_not_loosen_the_ceiling(
    server: Any, workspace: Path
) -> None:
    """Only the baseline's launches speak for its reproducibility: a noisy candidate cannot widen its own check."""
    ev = Evidence(workspace)
    async with Client(server) as client:
        exp = await _open(client, tolerance={"atol": LOOSE, "rtol": 1e-5})
        base = [ev.window(tensor_dumps=[_dump("base0.safetensors", "a")]), ev.window(), ev.window()]
        cand = [
            ev.window(tensor_dumps=[_dump("cand0.safetensors", "b")]),
            ev.window(tensor_dumps=[_dump("cand1.safetensors", "d")]),
            ev.window(),
        ]
        _check(
            ev,
            (cand[0], "cand0.safetensors", "b"),
            (cand[1], "cand1.safetensors", "d"),
            atol=0.0,
            max_abs=3e-4,
            state="failed",
        )
        check = _check(
            ev, (base[0], "base0.safetensors", "a"), (cand[0], "cand0.safetensors", "b"), atol=LOOSE
        )
        links = [
            {"id": ev.env(), "role": "environment"},
            {"id": ev.comparison(base, cand), "role": "comparison"},
            {"id": check, "role": "correctness"},
        ]
        result = await _keep(client, exp, links)
        text = _text(result)
        assert result.is_error and "gate(s) unmet (equivalence)" in text, text
        assert "ceiling for float32 (per-dtype table: float32 atol 0.0001" in text and "spread" not in text
