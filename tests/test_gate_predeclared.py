"""Criteria fixed at open: correctness tolerances and task-quality acceptance, enforced at keep (protocol)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from mcp import Client

from test_record_decision import FP, INVARIANTS, QUALITY, Evidence, _drop, _honest, _keep, _open, _text

pytestmark = pytest.mark.anyio


async def test_a_compare_looser_than_the_declared_tolerance_is_refused_naming_both(
    server: Any, workspace: Path
) -> None:
    ev = Evidence(workspace)
    async with Client(server) as client:
        exp = await _open(client, tolerance={"atol": 1e-6, "rtol": 1e-5})
        links, ids = _honest(ev)
        loose = ev.tensors(atol=1e-5, rtol=1e-3, base=ids["base"], cand=ids["cand"])
        refused = await _keep(
            client, exp, [*_drop(links, "correctness"), {"id": loose, "role": "correctness"}]
        )
        assert refused.is_error
        text = _text(refused)
        assert f"{loose} compared with atol=1e-05, rtol=0.001" in text
        assert "declared tolerance (atol=1e-06, rtol=1e-05, fixed at open)" in text
        # the next call takes the tolerance open fixed: nothing to type again
        assert "next: compare_tensors(reference=..., candidate=..., experiment_id=...)" in text
        # a looser check attached beside a strict one still fails: every attached comparison counts
        strict = ev.tensors(atol=1e-6, rtol=0.0, base=ids["base"], cand=ids["cand"])
        both = await _keep(client, exp, [{"id": strict, "role": "correctness"}])
        assert both.is_error and f"{loose} compared with" in _text(both)
        # the tolerance cannot be relaxed after open, not on attach nor on decide
        relax = await _keep(client, exp, [], tolerance={"atol": 1e-3, "rtol": 1e-3})
        assert relax.is_error and "tolerance is fixed when the experiment is opened" in _text(relax)

    async with Client(server) as client:
        exp = await _open(client, tolerance={"atol": 1e-6, "rtol": 1e-5})
        links, ids = _honest(ev)
        strict = ev.tensors(atol=1e-6, rtol=0.0, base=ids["base"], cand=ids["cand"])
        kept = await _keep(client, exp, [*_drop(links, "correctness"), {"id": strict, "role": "correctness"}])
    assert not kept.is_error, _text(kept)


@pytest.mark.parametrize(
    ("loosening", "named"),
    [
        ({"atol": 1e-5}, "atol=1e-05"),
        ({"overrides": [{"pattern": "*.bias", "atol": 0.1, "rtol": 0.0}]}, "override '*.bias' atol=0.1"),
        ({"allow_nonfinite": True, "equal_nan": True}, "allow_nonfinite=true"),
        # coverage is part of strictness: a subset of the tensors, or integers and dtypes judged loosely
        ({"keys": ["encoder.*"]}, "keys=encoder.* (a subset of the tensors)"),
        ({"integers_exact": False}, "integers_exact=false"),
        ({"allow_dtype_change": True}, "allow_dtype_change=true"),
    ],
)
async def test_without_a_declared_tolerance_only_a_bit_exact_compare_counts(
    server: Any, workspace: Path, loosening: dict[str, Any], named: str
) -> None:
    ev = Evidence(workspace)
    async with Client(server) as client:
        exp = await _open(client, tolerance=None)  # nothing declared: bit-exact, non-finite values fail
        links, ids = _honest(ev)
        loose = ev.tensors(base=ids["base"], cand=ids["cand"], **{"atol": 0.0, "rtol": 0.0, **loosening})
        refused = await _keep(
            client, exp, [*_drop(links, "correctness"), {"id": loose, "role": "correctness"}]
        )
        assert refused.is_error
        assert named in _text(refused) and "bit-exact (atol=0, rtol=0), fixed at open" in _text(refused)
        second = await _open(client, tolerance=None)
        links, ids = _honest(ev)
        exact = ev.tensors(atol=0.0, rtol=0.0, base=ids["base"], cand=ids["cand"])
        kept = await _keep(
            client, second, [*_drop(links, "correctness"), {"id": exact, "role": "correctness"}]
        )
    assert not kept.is_error, _text(kept)


async def test_a_training_change_declares_its_quality_criterion_at_open(server: Any, workspace: Path) -> None:
    async with Client(server) as client:
        missing = await client.call_tool(
            "record_decision",
            {
                "action": "open",
                "hypothesis": "bf16",
                "classification": "training_change",
                "changed_variable": "precision",
            },
        )
        assert (
            missing.is_error
            and "a training_change needs its task-quality acceptance declared at open" in _text(missing)
        )
        unknown = await _open_error(
            client, quality={"metric": "vibes", "direction": "higher", "threshold": 1}
        )
        assert "quality.metric 'vibes' is not reported by any task-quality tool" in unknown


async def _open_error(client: Client, **extra: Any) -> str:
    result = await client.call_tool(
        "record_decision",
        {
            "action": "open",
            "hypothesis": "h",
            "classification": "training_change",
            "changed_variable": "precision",
            **extra,
        },
    )
    assert result.is_error
    return _text(result)


def _health(ev: Evidence, cand: str, base: str, state: str = "passed", **metrics: float) -> str:
    return ev.add(
        "check_training_health",
        state,
        {"quality_kind": "training_health", "metrics": metrics},
        {"evidence_id": cand, "baseline_id": base, "loss_tolerance": 0.5},
    )


async def test_quality_evidence_must_meet_the_predeclared_metric_direction_and_threshold(
    server: Any, workspace: Path
) -> None:
    ev = Evidence(workspace)
    precision = [{"field": "contract.invariants.precision", "classification": "declared_semantic"}]
    async with Client(server) as client:
        exp = await _open(client, classification="training_change", changed_variable="precision")
        base = [ev.window() for _ in range(3)]
        cand = [ev.window(invariants={**INVARIANTS, "precision": "bf16"}) for _ in range(3)]
        comp = ev.comparison(base, cand, declared=["precision"], differences=precision)
        links = [{"id": ev.env(), "role": "environment"}, {"id": comp, "role": "comparison"}]
        # a passed health check whose loss ratio misses the declared threshold (checked with a looser
        # loss_tolerance of its own) does not carry the keep
        worse = _health(ev, cand[0], base[0], loss_last=2.5, loss_last_ratio=1.25)
        refused = await _keep(client, exp, [*links, {"id": worse, "role": "quality"}])
        assert refused.is_error
        assert (
            "loss_last_ratio = 1.25 misses the criterion declared at open (loss_last_ratio <= 1.02"
            in _text(refused)
        )
    async with Client(server) as client:
        exp = await _open(client, classification="training_change", changed_variable="precision")
        cand = [ev.window(invariants={**INVARIANTS, "precision": "bf16"}) for _ in range(3)]
        comp = ev.comparison(base, cand, declared=["precision"], differences=precision)
        links = [{"id": ev.env(), "role": "environment"}, {"id": comp, "role": "comparison"}]
        # a health check without a baseline reports no ratio: the declared metric is missing
        alone = _health(ev, cand[0], base[0], loss_last=2.0)
        refused = await _keep(client, exp, [*links, {"id": alone, "role": "quality"}])
        assert refused.is_error and "does not report 'loss_last_ratio'" in _text(refused)
        good = _health(ev, cand[0], base[0], loss_last=2.0, loss_last_ratio=1.0)
        kept = await _keep(client, exp, [{"id": good, "role": "quality"}])
        assert not kept.is_error, _text(kept)
        assert kept.structured_content is not None
        gate = next(g for g in kept.structured_content["gates"] if g["name"] == "task_quality")
        assert QUALITY["metric"] in gate["reason"]


async def test_what_open_fixed_is_shown_in_every_answer_and_the_decision_log(
    server: Any, workspace: Path
) -> None:
    async with Client(server) as client:
        opened = await client.call_tool(
            "record_decision",
            {
                "action": "open",
                "hypothesis": "fused adamw",
                "classification": "system_optimization",
                "changed_variable": "fused_adamw",
                "tolerance": {"atol": 1e-6, "rtol": 1e-5},
            },
        )
        assert opened.structured_content is not None, _text(opened)
        assert (
            opened.structured_content["declared_criteria"] == "correctness tolerance: atol=1e-06, rtol=1e-05"
        )
        exp = opened.structured_content["experiment_id"]
        shown = await client.call_tool("record_decision", {"action": "show", "experiment_id": exp})
        assert shown.structured_content is not None
        assert shown.structured_content["declared_criteria"] == opened.structured_content["declared_criteria"]
        training = await _open(client, classification="training_change", changed_variable="precision")
    log = (workspace / ".perfgate" / "decisions.md").read_text()
    assert "- **Declared at open:** correctness tolerance: atol=1e-06, rtol=1e-05" in log
    section = log[log.index(f"## {training}") :]
    assert "- **Declared at open:** task quality: loss\\_last\\_ratio \\<= 1.02 (lower is better)" in section


def _reporting_window(ev: Evidence, accuracy: float, invariants: dict[str, Any]) -> str:
    """A launched window whose run reported eval_accuracy with perfgate.harness.report_metric."""
    health = {
        "verdict": "healthy", "finite": True, "lines": 20, "losses_seen": 20, "nonfinite_loss_steps": [],
        "nonfinite_grad_norm_steps": [], "nan_iterations": 0, "skipped_iterations": 0, "explained_skips": 0,
        "unexplained_skips": 0, "loss_first": 2.0, "loss_last": 1.5, "loss_trend": -0.25, "min_loss_scale": None,
        "max_grad_norm": None, "findings": [], "whole_log_nan_iterations": None,
        "whole_log_skipped_iterations": None, "first_step": 5, "last_step": 24,
    }  # fmt: skip
    return ev.add(
        "run_benchmark_window",
        "executed",
        {
            "median_step_ms": 10.0,
            "peak_memory_bytes": 1000,
            "environment_fingerprint": FP,
            "windows": [{"launch": k, "index": 0} for k in range(3)],
            "steps_measured": 20,
            "health": health,
            "reported_metrics": {"eval_accuracy": accuracy},
        },
        {"command": ["python", "train.py"], "contract": {"invariants": invariants, "execution": {}}},
    )


async def test_an_evaluation_metric_the_run_reported_is_a_quality_criterion(
    server: Any, workspace: Path
) -> None:
    ev = Evidence(workspace)
    precision = [{"field": "contract.invariants.precision", "classification": "declared_semantic"}]
    criterion = {"metric": "eval:eval_accuracy", "direction": "higher", "threshold": 0.9}
    bf16 = {**INVARIANTS, "precision": "bf16"}
    async with Client(server) as client:
        base = [ev.window() for _ in range(3)]
        for accuracy, keeps in ((0.85, False), (0.93, True)):
            exp = await _open(
                client, classification="training_change", changed_variable="precision", quality=criterion
            )
            cand = [_reporting_window(ev, accuracy, bf16) for _ in range(3)]
            comp = ev.comparison(base, cand, declared=["precision"], differences=precision)
            check = await client.call_tool("check_training_health", {"evidence_id": cand[0]})
            assert check.structured_content is not None, _text(check)
            assert check.structured_content["state"] == "passed"
            assert check.structured_content["metrics"]["eval:eval_accuracy"] == accuracy
            links = [
                {"id": ev.env(), "role": "environment"},
                {"id": comp, "role": "comparison"},
                {"id": check.structured_content["evidence_id"], "role": "quality"},
            ]
            result = await _keep(client, exp, links)
            if keeps:
                assert not result.is_error, _text(result)
            else:
                assert result.is_error
                assert "eval:eval_accuracy = 0.85 misses the criterion declared at open" in _text(result)
