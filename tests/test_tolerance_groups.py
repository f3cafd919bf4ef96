"""Issue 48 item 5: tolerances per group of tensors, fixed at open and reused by compare_tensors.

Gradients may be held looser than weights (a reordered reduction moves them first); the groups are declared
at open, compare_tensors given the experiment applies them with no tolerance typed again, and a check looser
than a group, or with the groups reordered (first match wins), is refused by the correctness gate. open says
at once when a tolerance can only lead to a training change.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from mcp import Client

from perfgate.decisions.experiments import load_experiment
from perfgate.decisions.tensor_binding import looser_than_declared
from perfgate.evidence import Ledger
from perfgate.harness.dump import dump_tensors
from test_record_decision import _text

pytestmark = pytest.mark.anyio

GROUPS = [{"pattern": "grad/*", "atol": 1e-4, "rtol": 1e-5}]


def _files(workspace: Path) -> tuple[str, str]:
    rng = np.random.default_rng(0)
    ref = {
        "w": rng.standard_normal(64).astype(np.float32),
        "grad/w": rng.standard_normal(64).astype(np.float32),
    }
    cand = {"w": ref["w"].copy(), "grad/w": ref["grad/w"] + np.float32(5e-5)}
    dump_tensors(workspace / "ref.safetensors", ref)
    dump_tensors(workspace / "cand.safetensors", cand)
    return "ref.safetensors", "cand.safetensors"


async def _call(client: Client, tool: str, args: dict[str, Any], error: bool = False) -> Any:
    result = await client.call_tool(tool, args)
    assert result.is_error is error, _text(result)
    return _text(result) if error else result.structured_content


async def _open(client: Client, **tolerance: Any) -> dict[str, Any]:
    return await _call(
        client,
        "record_decision",
        {
            "action": "open",
            "hypothesis": "fused optimizer step",
            "classification": "system_optimization",
            "changed_variable": "fused_kernels",
            "tolerance": tolerance,
        },
    )


async def test_group_tolerances_fixed_at_open_are_what_compare_tensors_applies(
    server: Any, workspace: Path
) -> None:
    ref, cand = _files(workspace)
    async with Client(server) as client:
        opened = await _open(client, atol=1e-6, rtol=1e-6, groups=GROUPS)
        exp = opened["experiment_id"]
        assert "grad/*: atol=0.0001, rtol=1e-05" in opened["declared_criteria"]
        assert "beyond the equivalence ceiling" not in opened["declared_criteria"]

        # no tolerance typed again: the experiment's, gradients by their group
        check = await _call(
            client, "compare_tensors", {"reference": ref, "candidate": cand, "experiment_id": exp}
        )
        assert check["status"] == "match", check
        strict = await _call(
            client, "compare_tensors", {"reference": ref, "candidate": cand, "atol": 1e-6, "rtol": 1e-6}
        )
        assert strict["status"] != "match"  # the same files under the weights' tolerance alone

        loose = await _call(
            client,
            "compare_tensors",
            {
                "reference": ref,
                "candidate": cand,
                "experiment_id": exp,
                "overrides": [{"pattern": "grad/*", "atol": 1e-3, "rtol": 1e-3}],
            },
        )
        message = await _call(client, "compare_tensors", {"reference": ref, "candidate": cand}, error=True)
    assert "give atol and rtol" in message and "experiment_id" in message

    ledger = Ledger(workspace)
    experiment = load_experiment(ledger, exp)
    assert experiment is not None
    record = ledger.get(check["evidence_id"])
    assert record.inputs["atol"] == 1e-6 and record.inputs["overrides"] == GROUPS
    assert looser_than_declared(experiment, record) == []
    assert looser_than_declared(experiment, ledger.get(loose["evidence_id"])) == [
        "override 'grad/*' atol=0.001, rtol=0.001"
    ]


async def test_groups_applied_in_another_order_are_looser(server: Any, workspace: Path) -> None:
    ref, cand = _files(workspace)
    groups = [{"pattern": "grad/layer1.*", "atol": 1e-7, "rtol": 1e-7}, *GROUPS]
    async with Client(server) as client:
        exp = (await _open(client, atol=1e-6, rtol=1e-6, groups=groups))["experiment_id"]
        swapped = await _call(
            client,
            "compare_tensors",
            {"reference": ref, "candidate": cand, "experiment_id": exp, "overrides": groups[::-1]},
        )
    ledger = Ledger(workspace)
    experiment = load_experiment(ledger, exp)
    assert experiment is not None
    assert looser_than_declared(experiment, ledger.get(swapped["evidence_id"])) == [
        "overrides in another order than the groups declared at open"
    ]


async def test_open_says_at_once_when_a_tolerance_can_only_keep_a_training_change(server: Any) -> None:
    async with Client(server) as client:
        wide = await _open(client, atol=1000.0, rtol=0.0)
        grads = await _open(
            client, atol=0.0, rtol=0.0, groups=[{"pattern": "grad/*", "atol": 0.0, "rtol": 0.5}]
        )
    assert (
        "beyond the equivalence ceiling of float32 (atol 0.0001, rtol 1.3e-05), bfloat16"
        in wide["declared_criteria"]
    )
    assert "training_change" in wide["declared_criteria"]
    assert "beyond the equivalence ceiling" in grads["declared_criteria"]
