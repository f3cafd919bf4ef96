"""Agent-style shortcuts around "equivalent" (issue 34), each refused for its reason, and each honest variant
kept with no extra ceremony: a tolerance the agent picks past the per-dtype ceiling, a failed tensor check
left unattached before a looser pass, and the honest code/argv path that used to loop."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from mcp import Client

from test_gate_predeclared import _health
from test_record_decision import INVARIANTS, Evidence, _drop, _honest, _keep, _open, _text

pytestmark = pytest.mark.anyio


def _gate(answer: Any, name: str) -> dict[str, Any]:
    assert answer.structured_content is not None, _text(answer)
    return next(g for g in answer.structured_content["gates"] if g["name"] == name)


async def _show(client: Client, exp: str, links: list[dict[str, str]] | None = None) -> Any:
    return await client.call_tool(
        "record_decision", {"action": "show", "experiment_id": exp, "evidence": links or []}
    )


# --- item 1: equivalence has a ceiling the agent does not choose ---------------------------------------


@pytest.mark.parametrize(
    ("dtype", "atol", "rtol", "kept"),
    [
        ("float32", 1000.0, 1000.0, False),  # dropping input normalization, "passed" at atol=1000
        ("float32", 1.0, 1.0, False),  # a cheaper, different layer "passed" at atol=1
        ("float32", 1e-5, 2e-5, False),  # just past the float32 rtol ceiling (1.3e-5)
        ("float32", 1e-4, 1.3e-5, True),  # at the float32 ceiling: reordered reductions
        ("bfloat16", 1e-4, 1e-1, True),  # bfloat16's ceiling is wider (rtol 0.16)
        ("float8_e4m3fn", 1e-3, 1e-3, False),  # no shipped tolerance: only bit-exact is equivalent
        ("float8_e4m3fn", 0.0, 0.0, True),
    ],
)
async def test_an_equivalent_keep_is_held_to_the_per_dtype_ceiling_whatever_was_declared(
    server: Any, workspace: Path, dtype: str, atol: float, rtol: float, kept: bool
) -> None:
    ev = Evidence(workspace)
    async with Client(server) as client:
        # the agent opens with the tolerance that makes its check pass
        exp = await _open(client, tolerance={"atol": atol, "rtol": rtol})
        links, ids = _honest(ev)
        check = ev.tensors(atol=atol, rtol=rtol, base=ids["base"], cand=ids["cand"], dtype=dtype)
        result = await _keep(
            client, exp, [*_drop(links, "correctness"), {"id": check, "role": "correctness"}]
        )
    if kept:
        assert not result.is_error, _text(result)
        assert result.structured_content is not None
        assert result.structured_content["label"].startswith("equivalent speedup")
        return
    text = _text(result)
    assert result.is_error and "equivalence" in text
    assert f"{check} compared {dtype} tensors at atol={atol:g}, rtol={rtol:g}" in text
    assert "next: record_decision(action='open', hypothesis=..., classification='training_change'" in text


@pytest.mark.parametrize(
    "differs",
    [
        ["loss: 15 of 15 common steps differ (step 10 2.5 -> 1.25)"],  # the loss halved, tensors at step 0
        ["loss: 3 of 15 common steps differ (step 12 2.41 -> 2.9)"],  # a doubled learning rate, later
        ["model size: 1,000,000 -> 500,000 parameters (0.50x, model.GPT)"],
    ],
)
async def test_an_equivalent_keep_needs_the_same_training_whatever_tensors_passed(
    server: Any, workspace: Path, differs: list[str]
) -> None:
    """A bit-exact tensor check (dumped before the change could act) passes; the losses and the model the
    harness recorded for the compared launches still refuse the keep, and say how to keep it honestly."""
    ev = Evidence(workspace)
    async with Client(server) as client:
        exp = await _open(client)
        links, ids = _honest(ev)
        comp = ev.add(
            "compare_benchmarks",
            "passed",
            {"status": "comparable", "verdict": "improved", "speedup": 1.4, "training_may_differ": differs},
            {"baseline": ids["base"], "candidate": ids["cand"], "declared_changes": ["num_workers"]},
        )
        result = await _keep(client, exp, [*_drop(links, "comparison"), {"id": comp, "role": "comparison"}])
        assert result.is_error, _text(result)
        text = _text(result)
        assert "same_training: the candidate trains differently: " + differs[0] in text
        assert "classification='training_change'" in text
        # the same comparison without the difference is kept, saying what it could not check
        exp2 = await _open(client)
        fresh, fresh_ids = _honest(ev)
        honest = ev.add(
            "compare_benchmarks",
            "passed",
            {
                "status": "comparable",
                "verdict": "improved",
                "speedup": 1.4,
                "training_may_differ": [],
                "training_unchecked": ["loss (candidate: no loss recorded)"],
            },
            {
                "baseline": fresh_ids["base"],
                "candidate": fresh_ids["cand"],
                "declared_changes": ["num_workers"],
            },
        )
        kept = await _keep(client, exp2, [*_drop(fresh, "comparison"), {"id": honest, "role": "comparison"}])
    assert not kept.is_error, _text(kept)
    assert "not checked: loss (candidate: no loss recorded)" in _gate(kept, "same_training")["reason"]


async def test_a_change_past_the_ceiling_is_kept_only_as_a_training_change_with_task_quality(
    server: Any, workspace: Path
) -> None:
    """The refusal's next step, taken: a training change on task quality, labelled as one."""
    ev = Evidence(workspace)
    async with Client(server) as client:
        exp = await _open(client, tolerance={"atol": 1000.0, "rtol": 1000.0})
        links, ids = _honest(ev)
        check = ev.tensors(atol=1000.0, rtol=1000.0, base=ids["base"], cand=ids["cand"])
        refused = await _keep(
            client, exp, [*_drop(links, "correctness"), {"id": check, "role": "correctness"}]
        )
        assert refused.is_error and "beyond the equivalence ceiling for float32" in _text(refused)
        # as the next line says: a training change, whose keep rests on a task-quality result
        training = await _open(client, classification="training_change")
        cand = [ev.window() for _ in range(3)]
        comp = ev.comparison(ids["base"], cand)
        health = _health(ev, cand[0], ids["base"][0], loss_last=2.0, loss_last_ratio=1.0)
        kept = await _keep(
            client,
            training,
            [
                {"id": ev.env(), "role": "environment"},
                {"id": comp, "role": "comparison"},
                {"id": health, "role": "quality"},
            ],
        )
    assert not kept.is_error, _text(kept)
    assert kept.structured_content is not None
    assert kept.structured_content["label"].startswith("training change")
    assert "not an equivalent speedup" in kept.structured_content["label"]


async def test_a_correctness_repair_is_held_to_the_same_ceiling(server: Any, workspace: Path) -> None:
    ev = Evidence(workspace)
    async with Client(server) as client:
        for atol, ok in ((1.0, False), (1e-5, True)):
            exp = await _open(
                client, classification="correctness_repair", tolerance={"atol": atol, "rtol": 0.0}
            )
            windows = [ev.window() for _ in range(3)]
            check = ev.tensors(atol=atol, rtol=0.0, base=windows, cand=[ev.window()])
            shown = await _show(
                client,
                exp,
                [
                    {"id": ev.env(), "role": "environment"},
                    {"id": check, "role": "correctness"},
                    {"id": windows[0], "role": "candidate"},
                ],
            )
            assert _gate(shown, "equivalence")["status"] == ("passed" if ok else "failed")


async def test_compare_tensors_reports_the_ceiling_per_dtype(server: Any, workspace: Path) -> None:
    """The check itself says when its tolerance is past the ceiling, per dtype, before any keep is tried."""
    from safetensors.numpy import save_file

    ref = {"w": np.ones(8, np.float32), "b": np.ones(4, np.float16), "steps": np.arange(3)}
    cand = {"w": np.ones(8, np.float32) * 1.5, "b": np.ones(4, np.float16), "steps": np.arange(3)}
    save_file(ref, str(workspace / "ref.safetensors"))
    save_file(cand, str(workspace / "cand.safetensors"))
    async with Client(server) as client:
        result = await client.call_tool(
            "compare_tensors",
            {
                "reference": "ref.safetensors",
                "candidate": "cand.safetensors",
                "atol": 1.0,
                "rtol": 0.0,
                "overrides": [{"pattern": "b", "atol": 1e-5, "rtol": 1e-3}],
            },
        )
    assert not result.is_error, _text(result)
    out = result.structured_content
    assert out is not None and out["status"] == "match"
    rows = {r["dtype"]: r for r in out["tolerance_by_dtype"]}
    assert set(rows) == {"float16", "float32"}  # the integer tensor is compared exactly
    assert rows["float32"]["atol"] == 1.0 and rows["float32"]["within_ceiling"] is False
    assert rows["float32"]["equivalence_atol"] == pytest.approx(1e-4)
    assert rows["float16"]["within_ceiling"] is True
    assert any("float32 compared beyond the equivalence ceiling" in n for n in out["notes"])


# --- item 2: every failed check counts, attached or not ------------------------------------------------


async def test_an_unattached_failed_check_of_the_same_candidate_blocks_a_looser_pass(
    server: Any, workspace: Path
) -> None:
    ev = Evidence(workspace)
    async with Client(server) as client:
        # a fresh experiment, another name for the change, a looser tolerance (still under the ceiling)
        exp = await _open(client, changed_variable="loader workers", tolerance={"atol": 1e-4, "rtol": 1e-5})
        links, ids = _honest(ev)
        # a check at atol=1e-5 failed on the candidate's files and was never attached anywhere
        failed = ev.tensors(passed=False, atol=1e-5, rtol=1e-5, base=ids["base"], cand=ids["cand"])
        loose = ev.tensors(atol=1e-4, rtol=1e-5, base=ids["base"], cand=ids["cand"])
        refused = await _keep(
            client, exp, [*_drop(links, "correctness"), {"id": loose, "role": "correctness"}]
        )
        text = _text(refused)
        assert refused.is_error
        assert f"{loose} passed with atol=0.0001, looser than the failed check {failed}" in text
        assert "the same candidate" in text
        # the next line names the failed check's tolerance (a repaired candidate passes it), not the declared one
        assert "next: compare_tensors(reference=..., candidate=..., atol=1e-05, rtol=1e-05)" in text
        strict = ev.tensors(atol=1e-5, rtol=1e-5, base=ids["base"], cand=ids["cand"])
        kept = await _keep(client, exp, [{"id": strict, "role": "correctness"}])
        assert kept.is_error  # the loose pass is still attached: every attached check counts
        again = await _open(client, changed_variable="loader workers", tolerance={"atol": 1e-5, "rtol": 1e-5})
        links, ids = _honest(ev)
        strict = ev.tensors(atol=1e-5, rtol=1e-5, base=ids["base"], cand=ids["cand"])
        kept = await _keep(
            client, again, [*_drop(links, "correctness"), {"id": strict, "role": "correctness"}]
        )
        assert not kept.is_error, _text(kept)


@pytest.mark.parametrize("through", ["run", "code"])
async def test_a_failed_check_binds_through_the_candidate_run_and_its_code_state(
    server: Any, workspace: Path, through: str
) -> None:
    """The failed check saw the candidate's run (another file name and bytes), or another run of the same code."""
    ev = Evidence(workspace)
    code = {"code": {"commit": "c0ffee", "diff_sha256": "d" * 64}}
    other = ev.window(provenance=code)  # an earlier run of the candidate's code
    async with Client(server) as client:
        exp = await _open(client, tolerance={"atol": 1e-5, "rtol": 1e-5})
        base = [ev.window(provenance={"code": {"commit": "beef", "diff_sha256": None}}) for _ in range(3)]
        cand = [ev.window(provenance=code) for _ in range(3)]
        comp = ev.comparison(base, cand)
        failed = ev.add(
            "compare_tensors",
            "failed",
            {
                "status": "mismatch",
                "files": [{"role": "candidate", "path": "elsewhere.npz", "digest": "blake3:" + "e" * 64}],
                "producers": [{"role": "candidate", "evidence_id": cand[0] if through == "run" else other}],
                "tolerance_by_dtype": [{"dtype": "float32", "tensors": 1, "atol": 1e-5, "rtol": 1e-6}],
            },
            {"atol": 1e-5, "rtol": 1e-6},
        )
        loose = ev.tensors(atol=1e-5, rtol=1e-5, base=base, cand=cand)
        links = [
            {"id": ev.env(), "role": "environment"},
            {"id": comp, "role": "comparison"},
            {"id": loose, "role": "correctness"},
        ]
        gate = _gate(await _show(client, exp, links), "correctness")
    assert gate["status"] == "failed"
    assert gate["reason"].startswith(f"{loose} passed with rtol=1e-05, looser than the failed check {failed}")
    assert ("the same candidate run" if through == "run" else "the same candidate code state") in gate[
        "reason"
    ]
    assert failed in gate["evidence_ids"]


async def test_honest_exploration_still_keeps(server: Any, workspace: Path) -> None:
    """A bit-exact attempt that failed (reordered sums) does not block a pass at the torch defaults, and a
    failed check of another candidate does not bind this one."""
    ev = Evidence(workspace)
    async with Client(server) as client:
        exp = await _open(client)
        links, ids = _honest(ev)
        ev.tensors(passed=False, atol=0.0, rtol=0.0, base=ids["base"], cand=ids["cand"])
        other = [ev.window(tensor_dumps=[{"path": "x.safetensors", "sha256": "c" * 64, "launch": 0}])]
        failed = ev.add(
            "compare_tensors",
            "failed",
            {
                "status": "mismatch",
                "files": [{"role": "candidate", "path": "x.safetensors", "sha256": "c" * 64}],
                "producers": [{"role": "candidate", "evidence_id": other[0]}],
            },
            {"atol": 1e-5, "rtol": 1e-6},
        )
        kept = await _keep(client, exp, links)
    assert not kept.is_error, _text(kept)
    assert failed not in _text(kept)


# --- item 5: no loops on the honest path -----------------------------------------------------------------


@pytest.mark.parametrize("kind", ["code", "argv"])
async def test_a_code_or_argv_change_declared_by_its_kind_is_kept(
    server: Any, workspace: Path, kind: str
) -> None:
    ev = Evidence(workspace)
    async with Client(server) as client:
        exp = await _open(client, changed_variable=kind)
        links, ids = _honest(ev)
        difference = [{"field": kind, "kind": kind, "classification": "declared_execution"}]
        comp = ev.comparison(ids["base"], ids["cand"], declared=[kind], differences=difference)
        kept = await _keep(client, exp, [*_drop(links, "comparison"), {"id": comp, "role": "comparison"}])
        assert not kept.is_error, _text(kept)
        # declaring nothing is refused with the declaration that clears it, and that call clears it
        exp = await _open(client, changed_variable=kind)
        links, ids = _honest(ev)
        bare = ev.comparison(ids["base"], ids["cand"], declared=[])
        shown = await _show(client, exp, [*_drop(links, "comparison"), {"id": bare, "role": "comparison"}])
        gate = _gate(shown, "declared_change")
        assert gate["status"] == "failed"
        assert f"declared_changes=[{kind!r}]" in gate["satisfy_with"]
        comp = ev.comparison(ids["base"], ids["cand"], declared=[kind], differences=difference)
        shown = await _show(client, exp, [{"id": comp, "role": "comparison"}])
        assert _gate(shown, "declared_change")["status"] == "passed"


async def test_a_prose_changed_variable_is_told_its_vocabulary_name(server: Any, workspace: Path) -> None:
    ev = Evidence(workspace)
    async with Client(server) as client:
        exp = await _open(client, changed_variable="DataLoader num_workers 0 -> 2")
        links, ids = _honest(ev)
        bare = ev.comparison(ids["base"], ids["cand"], declared=[])
        shown = await _show(client, exp, [*_drop(links, "comparison"), {"id": bare, "role": "comparison"}])
        fix = _gate(shown, "declared_change")["satisfy_with"]
        assert "declared_changes=['workers']" in fix
        comp = ev.comparison(ids["base"], ids["cand"], declared=["workers"])
        shown = await _show(client, exp, [{"id": comp, "role": "comparison"}])
        assert _gate(shown, "declared_change")["status"] == "passed"


async def test_a_code_change_is_compared_and_kept_through_the_real_comparison(
    server: Any, workspace: Path
) -> None:
    """compare_benchmarks itself, on windows whose command's file changed: declared ['code'], comparable, and
    the experiment that changed 'code' accepts that comparison."""
    import json

    from perfgate.benchmarking.comparing.series import SERIES_NAME, SERIES_SCHEMA
    from perfgate.evidence import EvidenceDraft, EvidenceState, Ledger

    ledger = Ledger(workspace)

    def window(digest: str, launch: int, step_s: float) -> str:
        eid = Ledger.new_id()
        series = {
            "schema": SERIES_SCHEMA,
            "version": 1,
            "windows": [
                {"launch": 0, "index": 0, "host_step_s": [step_s * (1 + 0.01 * i) for i in range(6)]}
            ],
        }
        (ledger.artifact_dir(eid) / SERIES_NAME).write_text(json.dumps(series))
        ledger.append(
            EvidenceDraft(
                id=eid,
                tool="run_benchmark_window",
                state=EvidenceState.EXECUTED,
                inputs={
                    "command": ["python", "train.py"],
                    "contract": {"invariants": INVARIANTS, "execution": {}},
                },
                result={
                    "evidence_id": eid,
                    "peak_memory_bytes": 1000,
                    "environment_fingerprint": {"device": "cpu", "torch": "2.13.0"},
                    "windows": [{"launch": launch, "index": 0}],
                    "provenance": {
                        "code": {"commit": None, "unknown_reason": "not a git work tree"},
                        "files": {"train.py": digest},
                    },
                },
                artifact_names=[SERIES_NAME],
            )
        )
        return eid

    async with Client(server) as client:
        exp = await _open(client, changed_variable="code")
        base = [window("a" * 64, i, 0.010 + 0.0002 * i) for i in range(3)]
        cand = [window("b" * 64, i, 0.005 + 0.0001 * i) for i in range(3)]
        compared = await client.call_tool(
            "compare_benchmarks", {"baseline": base, "candidate": cand, "declared_changes": ["code"]}
        )
        out = compared.structured_content
        assert out is not None, _text(compared)
        assert out["status"] == "comparable", out["reasons"]
        assert [d["classification"] for d in out["differences"] if d["kind"] == "file"] == [
            "declared_execution"
        ]
        shown = await _show(client, exp, [{"id": out["evidence_id"], "role": "comparison"}])
        assert _gate(shown, "declared_change")["status"] == "passed"
        assert _gate(shown, "comparison")["status"] == "passed"


# --- item 3: the batch is measured even without a DataLoader ---------------------------------------------

TRAIN = """
import argparse
import torch
p = argparse.ArgumentParser()
p.add_argument("--batch", type=int, default=32)
p.add_argument("--accumulation", type=int, default=2)
p.add_argument("--use", type=int, default=0)
args = p.parse_args()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
loss_fn = torch.nn.CrossEntropyLoss()  # a module without parameters: not the model
opt = torch.optim.SGD(model.parameters(), lr=0.1)
micro = args.batch // args.accumulation
data, labels = torch.randn(4096, 8), torch.randint(0, 4, (4096,))
i = 0
for step in range(100000):
    for _ in range(args.accumulation):
        at = i % 4000
        x, y = data[at : at + micro], labels[at : at + micro]
        i += micro
        xb, yb = (x[: args.use], y[: args.use]) if args.use else (x, y)  # train on part of the batch
        loss_fn(model(xb), yb).backward()
    opt.step()
    opt.zero_grad()
    with torch.no_grad():
        model(torch.randn(100, 8))  # evaluation: not training samples
"""


def _contract(accumulation: int, global_batch: int | None = 32) -> dict[str, Any]:
    invariants: dict[str, Any] = {"model": "mlp", "dataset": "synthetic", "precision": "fp32"}
    if global_batch is None:  # a contract silent about the batch
        return {"invariants": invariants, "execution": {"world_size": 1}}
    return {
        "invariants": {**invariants, "global_batch": global_batch},
        "execution": {"microbatch": 32 // accumulation, "accumulation": accumulation, "world_size": 1},
    }


async def _launch(client: Client, args: list[str], contract: dict[str, Any]) -> dict[str, Any]:
    import sys

    result = await client.call_tool(
        "run_benchmark_window",
        {
            "command": [sys.executable, "train.py", *args],
            "warmup_steps": 2,
            "measure_steps": 4,
            "repeats": 1,
            "timeout_s": 120,
            "contract": contract,
        },
    )
    assert result.structured_content is not None, _text(result)
    return result.structured_content


@pytest.mark.slow
async def test_the_batch_reaching_the_model_is_measured_and_compared(server: Any, workspace: Path) -> None:
    import sys

    from _trust import any_code_rules, operator_policy

    (workspace / "train.py").write_text(TRAIN)
    operator_policy(
        "[execution]\n"
        + any_code_rules([sys.executable, "-m", "perfgate.harness"], [sys.executable, "train.py"])
    )
    async with Client(server) as client:
        base = await _launch(client, [], _contract(2))
        # measured without a DataLoader: two micro-batches of 16 reach the model per optimizer step
        assert (base["measured_batch"], base["batch_source"]) == (32, "model_inputs"), base["warnings"]
        # the honest change: one micro-batch of 32, the same global batch, declared as execution settings
        honest = await _launch(client, ["--accumulation", "1"], _contract(1))
        assert honest["measured_batch"] == 32
        # the same samples reach the model in the same order, however they are split into micro-batches
        assert honest["sample_streams"] == base["sample_streams"] != [None]
        compared = await client.call_tool(
            "compare_benchmarks",
            {
                "baseline": [base["evidence_id"]],
                "candidate": [honest["evidence_id"]],
                "declared_changes": ["microbatch", "accumulation"],
            },
        )
        assert compared.structured_content is not None
        assert compared.structured_content["status"] == "comparable", compared.structured_content["reasons"]
        # training on half of each batch, under the same declared contract: the window contradicts it
        lying = await _launch(client, ["--use", "8"], _contract(2))
        assert lying["state"] == "failed" and lying["measured_batch"] == 16
        assert "contradicts its contract" in lying["failure_reason"]
        # the same, with a contract that no longer states the batch: the comparison refuses the sides
        quiet = [await _launch(client, args, _contract(2, None)) for args in ([], ["--use", "8"])]
        compared = await client.call_tool(
            "compare_benchmarks",
            {
                "baseline": [quiet[0]["evidence_id"]],
                "candidate": [quiet[1]["evidence_id"]],
                "declared_changes": ["argv"],
            },
        )
        out = compared.structured_content
        assert out is not None and out["status"] == "incomparable"
        assert any(r.startswith("measured.global_batch changed (32 -> 16)") for r in out["reasons"]), out[
            "reasons"
        ]
        assert (
            quiet[0]["sample_streams"] != quiet[1]["sample_streams"]
        )  # another data path, seen by the harness


async def test_a_semantic_option_on_the_command_line_is_a_semantic_change_whatever_was_declared(
    server: Any, workspace: Path
) -> None:
    from perfgate.evidence import Ledger

    ledger = Ledger(workspace)
    async with Client(server) as client:
        for option, declared, classification in (
            (["--batch", "16"], ["argv"], "semantic"),
            (["--global-batch=16"], ["accumulation"], "semantic"),
            (["--lr", "0.2"], ["code", "argv"], "semantic"),
            (["--seq-len", "256"], [], "semantic"),
            (["--epochs", "3"], ["argv"], "semantic"),
            (["--batch", "16"], ["global_batch"], "declared_semantic"),
        ):
            base = [
                _series_window(ledger, ["python", "train.py", "--batch", "32", "--lr", "0.1"], i)
                for i in range(3)
            ]
            cand = [
                _series_window(ledger, ["python", "train.py", "--batch", "32", "--lr", "0.1", *option], i)
                for i in range(3)
            ]
            result = await client.call_tool(
                "compare_benchmarks", {"baseline": base, "candidate": cand, "declared_changes": declared}
            )
            out = result.structured_content
            assert out is not None, _text(result)
            flags = [d for d in out["differences"] if d["field"].startswith("argv.")]
            assert [d["classification"] for d in flags] == [classification], (option, out["differences"])
            if classification == "semantic":
                assert out["status"] == "incomparable"
                assert any(
                    "that is a training_change, never an equivalent speedup" in r for r in out["reasons"]
                )
            else:
                assert out["status"] == "comparable", out["reasons"]


async def test_a_routing_change_on_the_command_line_is_a_training_change_not_an_execution_setting(
    server: Any, workspace: Path
) -> None:
    """Top-k, capacity and the balancing loss decide which experts see each token: a candidate that changes
    one is never an equivalent speedup, whatever execution change it declares beside it."""
    from perfgate.evidence import Ledger

    ledger = Ledger(workspace)
    moe = ["python", "pretrain_gpt.py", "--num-experts", "8", "--moe-router-topk", "2"]
    async with Client(server) as client:
        for option, declared, field, classification in (
            (["--moe-router-topk", "1"], ["expert_parallel", "argv"], "argv.moe_router_topk", "semantic"),
            (["--moe-expert-capacity-factor=1.0"], ["argv"], "argv.moe_expert_capacity_factor", "semantic"),
            (["--moe-aux-loss-coeff", "0"], ["code"], "argv.moe_aux_loss_coeff", "semantic"),
            (["--moe-router-topk", "1"], ["router_topk"], "argv.moe_router_topk", "declared_semantic"),
            (["--moe-router-topk", "1"], ["moe_routing"], "argv.moe_router_topk", "declared_semantic"),
        ):
            base = [_series_window(ledger, moe, i) for i in range(3)]
            # an option given twice: the parser keeps the last value, as argparse does
            cand = [_series_window(ledger, [*moe, *option], i) for i in range(3)]
            result = await client.call_tool(
                "compare_benchmarks", {"baseline": base, "candidate": cand, "declared_changes": declared}
            )
            out = result.structured_content
            assert out is not None, _text(result)
            flags = {
                d["field"]: d["classification"] for d in out["differences"] if d["field"].startswith("argv.")
            }
            assert flags == {field: classification}, (option, out["differences"])
            if classification == "semantic":
                assert out["status"] == "incomparable"
                assert any(
                    r.startswith(field) and "that is a training_change, never an equivalent speedup" in r
                    for r in out["reasons"]
                ), out["reasons"]
            else:
                assert out["status"] == "comparable", out["reasons"]


def _series_window(ledger: Any, command: list[str], launch: int) -> str:
    """A launched window as run_benchmark_window records it (its step series artifact included)."""
    import json

    from perfgate.benchmarking.comparing.series import SERIES_NAME, SERIES_SCHEMA
    from perfgate.evidence import EvidenceDraft, EvidenceState, Ledger

    eid = Ledger.new_id()
    series = {
        "schema": SERIES_SCHEMA,
        "version": 1,
        "windows": [
            {
                "launch": 0,
                "index": 0,
                "host_step_s": [0.01 * (1 + 0.01 * i + 0.002 * launch) for i in range(6)],
            }
        ],
    }
    (ledger.artifact_dir(eid) / SERIES_NAME).write_text(json.dumps(series))
    ledger.append(
        EvidenceDraft(
            id=eid,
            tool="run_benchmark_window",
            state=EvidenceState.EXECUTED,
            inputs={"command": command, "contract": {"invariants": INVARIANTS, "execution": {}}},
            result={
                "evidence_id": eid,
                "peak_memory_bytes": 1000,
                "environment_fingerprint": {"device": "cpu", "torch": "2.13.0"},
                "windows": [{"launch": launch, "index": 0}],
                "measured_batch": 64,
                "batch_source": "model_inputs",
            },
            artifact_names=[SERIES_NAME],
        )
    )
    return eid


# --- item 4: the data path is measured --------------------------------------------------------------------


def _streams_window(ev: Evidence, streams: list[str | None]) -> str:
    """A window as a harness that read each launch's sample stream records it."""
    from perfgate.evidence import EvidenceDraft, EvidenceState, Ledger

    base = ev.ledger.get(ev.window(launches=list(range(len(streams)))))
    assert base is not None
    eid = Ledger.new_id()
    (ev.ledger.artifact_dir(eid) / "series.json").write_bytes(b"[10.0, 10.1]")
    ev.ledger.append(
        EvidenceDraft(
            id=eid,
            tool=base.tool,
            state=EvidenceState.EXECUTED,
            inputs=dict(base.inputs),
            result={**base.result, "evidence_id": eid, "sample_streams": streams},
            artifact_names=["series.json"],
        )
    )
    return eid


@pytest.mark.parametrize(
    ("base_streams", "cand_streams", "file_change", "audit_needed"),
    [
        (["s1", "s1", "s1"], ["s2", "s2", "s2"], None, True),  # other inputs reached the model
        (["s1", "s1", "s1"], ["s1", "s1", "s1"], "data/loader.py", True),  # the data-loading code changed
        (["s1", "s1", "s1"], ["s1", "s1", "s1"], "model.py", False),  # same inputs, model code changed
        (["s1", "s2", "s3"], ["s4", "s4", "s4"], None, False),  # the baseline's stream is not reproducible
        ([None, None, None], [None, None, None], None, False),  # not read (no warm-up): nothing to say
    ],
)
async def test_touches_data_is_implied_by_what_the_sides_ran(
    server: Any,
    workspace: Path,
    base_streams: list[str | None],
    cand_streams: list[str | None],
    file_change: str | None,
    audit_needed: bool,
) -> None:
    ev = Evidence(workspace)
    async with Client(server) as client:
        exp = await _open(client)  # touches_data left false
        base = [_streams_window(ev, [s]) for s in base_streams]
        cand = [_streams_window(ev, [s]) for s in cand_streams]
        differences = (
            [{"field": f"file:{file_change}", "kind": "file", "classification": "declared_execution"}]
            if file_change
            else []
        )
        links = [
            {"id": ev.env(), "role": "environment"},
            {"id": ev.comparison(base, cand, differences=differences), "role": "comparison"},
            {"id": ev.tensors(base=base, cand=cand), "role": "correctness"},
        ]
        result = await _keep(client, exp, links)
        if not audit_needed:
            assert not result.is_error, _text(result)
            assert _gate(result, "sample_audit")["status"] == "not_applicable"
            return
        text = _text(result)
        assert result.is_error and "sample_audit" in text and "touches_data was not declared" in text
        assert "next: audit_samples(" in text
        # the refusal's next step, taken, clears the gate
        audit = ev.audit(cand)
        kept = await _keep(client, exp, [{"id": audit, "role": "audit"}])
        assert not kept.is_error, _text(kept)


# --- item 5: every refusal's next step clears its gate ------------------------------------------------------


async def _follow_gate(
    client: Client, ev: Evidence, gate: str, broken: dict[str, Any], call: str, fixed: dict[str, Any]
) -> None:
    """``broken`` fails ``gate`` with a next step naming ``call``; attaching ``fixed`` (what that call
    returns) to the same experiment makes the gate pass or name another reason."""
    before = _gate(await _show(client, broken["exp"], broken["links"]), gate)
    assert before["status"] == "failed", before
    assert before["satisfy_with"] and call in before["satisfy_with"], before["satisfy_with"]
    exp = fixed.get("exp", broken["exp"])
    shown = await _show(client, exp, fixed["links"])
    assert shown.structured_content is not None, _text(shown)
    gates = {g["name"]: g for g in shown.structured_content["gates"]}
    after = gates.get(gate, {"status": "not_applicable"})  # e.g. no classification gate for a training change
    assert after["status"] in ("passed", "not_applicable") or after["reason"] != before["reason"], after


async def test_each_refusal_names_a_call_that_clears_its_gate(server: Any, workspace: Path) -> None:
    ev = Evidence(workspace)
    async with Client(server) as client:
        # environment: collect_env(), then attach it
        exp = await _open(client)
        links, _ = _honest(ev)
        await _follow_gate(
            client,
            ev,
            "environment",
            {"exp": exp, "links": _drop(links, "environment")},
            "collect_env()",
            {"links": [{"id": ev.env(), "role": "environment"}]},
        )
        # comparison: compare_benchmarks(...), then attach it
        exp = await _open(client)
        links, ids = _honest(ev)
        await _follow_gate(
            client,
            ev,
            "comparison",
            {"exp": exp, "links": _drop(links, "comparison")},
            "compare_benchmarks(",
            {"links": [{"id": ev.comparison(ids["base"], ids["cand"]), "role": "comparison"}]},
        )
        # candidate_after_open: measure the candidate now, then compare
        early = [ev.window() for _ in range(3)]
        exp = await _open(client)
        links, ids = _honest(ev)
        stale = ev.comparison(ids["base"], early)
        await _follow_gate(
            client,
            ev,
            "candidate_after_open",
            {"exp": exp, "links": [*_drop(links, "comparison"), {"id": stale, "role": "comparison"}]},
            "run_benchmark_window(...) for the candidate now",
            {
                "links": [
                    {"id": ev.comparison(ids["base"], [ev.window() for _ in range(3)]), "role": "comparison"}
                ]
            },
        )
        # correctness looser than declared: compare_tensors at the declared tolerance
        exp = await _open(client)
        links, ids = _honest(ev)
        loose = ev.tensors(atol=1e-4, base=ids["base"], cand=ids["cand"])
        exp_loose = await _open(client)
        await _follow_gate(
            client,
            ev,
            "correctness",
            {"exp": exp_loose, "links": [*_drop(links, "correctness"), {"id": loose, "role": "correctness"}]},
            "compare_tensors(reference=..., candidate=..., experiment_id=...)",
            {"exp": exp, "links": links},
        )
        # classification: a declared semantic change in a system_optimization -> open a training_change
        exp = await _open(client, changed_variable="precision")
        links, ids = _honest(ev)
        semantic = [{"field": "contract.invariants.precision", "classification": "declared_semantic"}]
        comp = ev.comparison(ids["base"], ids["cand"], declared=["precision"], differences=semantic)
        training = await _open(client, classification="training_change", changed_variable="precision")
        cand = [ev.window() for _ in range(3)]
        comp_after = ev.comparison(ids["base"], cand, declared=["precision"], differences=semantic)
        await _follow_gate(
            client,
            ev,
            "classification",
            {"exp": exp, "links": [*_drop(links, "comparison"), {"id": comp, "role": "comparison"}]},
            "classification='training_change'",
            {"exp": training, "links": [{"id": comp_after, "role": "comparison"}]},
        )
        # task_quality: check_training_health(...), then attach it
        health = _health(ev, cand[0], ids["base"][0], loss_last=2.0, loss_last_ratio=1.0)
        await _follow_gate(
            client,
            ev,
            "task_quality",
            {"exp": training, "links": []},
            "check_training_health(evidence_id=<candidate window>",
            {"links": [{"id": health, "role": "quality"}]},
        )
        # topology: compare per device
        exp = await _open(client, changed_variable="world_size")
        links, ids = _honest(ev)
        total = ev.comparison(
            ids["base"], ids["cand"], declared=["world_size"], actual_changes=["world_size"]
        )
        per_device = ev.comparison(
            ids["base"], ids["cand"], declared=["world_size"], actual_changes=["world_size"], per_device=True
        )
        await _follow_gate(
            client,
            ev,
            "topology",
            {"exp": exp, "links": [*_drop(links, "comparison"), {"id": total, "role": "comparison"}]},
            "per_device=true",
            {"links": [{"id": per_device, "role": "comparison"}]},
        )


@pytest.mark.slow
def test_an_inference_loop_leaves_the_batch_unverified_and_stops_looking(tmp_path: Path) -> None:
    """No training forward in a whole window: no batch from the model, and the global discovery hooks are
    removed so that later windows do not pay for them."""
    import json
    import os
    import subprocess
    import sys

    script = tmp_path / "infer.py"
    script.write_text(
        "import torch\n"
        "import perfgate.harness.hooks as hooks\n"
        "from perfgate.harness import Window\n"
        "model = torch.nn.Sequential(*[torch.nn.Linear(8, 8) for _ in range(3)])\n"
        "window = Window()\n"
        "for _ in range(12):\n"
        "    with window.step(samples=4), torch.no_grad():\n"
        "        model(torch.randn(4, 8))\n"
        "print('discovery hooks left:', len(hooks._forward_probe))\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("PERFGATE_")}
    argv = [
        sys.executable,
        "-m",
        "perfgate.harness",
        "--record-dir",
        str(tmp_path / "rec"),
        "--timing",
        "explicit",
    ]
    argv += ["--warmup-steps", "2", "--measure-steps", "3", "--windows", "2", "--finish", "--", str(script)]
    out = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "discovery hooks left: 0" in out.stdout
    record = json.loads((tmp_path / "rec" / "rank0.json").read_text())
    assert set(record["steps"]["model_samples"]) == {None} and record["sample_stream"] is None


@pytest.mark.parametrize(("override_atol", "blocked"), [(1e-3, True), (0.0, False)])
async def test_a_looser_per_key_override_is_looser_than_a_failed_check(
    server: Any, workspace: Path, override_atol: float, blocked: bool
) -> None:
    ev = Evidence(workspace)
    async with Client(server) as client:
        exp = await _open(client, tolerance={"atol": 1e-5, "rtol": 1e-5})
        links, ids = _honest(ev)
        failed = ev.tensors(passed=False, atol=1e-5, rtol=1e-5, base=ids["base"], cand=ids["cand"])
        override = [{"pattern": "*.bias", "atol": override_atol, "rtol": 0.0}]
        check = ev.tensors(atol=1e-5, rtol=1e-5, base=ids["base"], cand=ids["cand"], overrides=override)
        gate = _gate(
            await _show(client, exp, [*_drop(links, "correctness"), {"id": check, "role": "correctness"}]),
            "correctness",
        )
    if blocked:  # (also looser than the declared tolerance: both named)
        assert gate["status"] == "failed" and f"looser than the failed check {failed}" in gate["reason"]
        assert "override '*.bias' atol=0.001" in gate["reason"]
    else:
        assert gate["status"] == "passed", gate["reason"]


@pytest.mark.parametrize(
    ("edit", "audit_needed"),
    [
        # input normalization dropped, in train.py itself
        (
            "-tf = transforms.Compose([transforms.ToTensor(), transforms.Normalize(m, s)])\n+tf = transforms.ToTensor()\n",
            True,
        ),
        (
            "-loader = DataLoader(ds, batch_size=32, shuffle=True)\n+loader = DataLoader(ds, batch_size=32)\n",
            True,
        ),
        ("-        return self.fc(x)\n+        return self.fc(x).relu()\n", False),  # model code only
    ],
)
async def test_a_data_loading_edit_in_the_recorded_diff_implies_touches_data(
    server: Any, workspace: Path, edit: str, audit_needed: bool
) -> None:
    from perfgate.evidence import EvidenceDraft, EvidenceState, Ledger

    ev = Evidence(workspace)
    diff = f"diff --git a/train.py b/train.py\n--- a/train.py\n+++ b/train.py\n@@ -10,1 +10,1 @@\n{edit}"

    def window(with_diff: bool) -> str:
        base = ev.ledger.get(ev.window())
        assert base is not None
        eid = Ledger.new_id()
        (ev.ledger.artifact_dir(eid) / "series.json").write_bytes(b"[10.0, 10.1]")
        names = ["series.json"]
        if with_diff:
            (ev.ledger.artifact_dir(eid) / "code.diff").write_text(diff)
            names.append("code.diff")
        ev.ledger.append(
            EvidenceDraft(
                id=eid,
                tool=base.tool,
                state=EvidenceState.EXECUTED,
                inputs=dict(base.inputs),
                result={**base.result, "evidence_id": eid},
                artifact_names=names,
            )
        )
        return eid

    async with Client(server) as client:
        exp = await _open(client, changed_variable="code")
        base = [window(False) for _ in range(3)]
        cand = [window(True) for _ in range(3)]
        code = [{"field": "code", "kind": "code", "classification": "declared_execution"}]
        links = [
            {"id": ev.env(), "role": "environment"},
            {"id": ev.comparison(base, cand, declared=["code"], differences=code), "role": "comparison"},
            {"id": ev.tensors(base=base, cand=cand), "role": "correctness"},
        ]
        gate = _gate(await _show(client, exp, links), "sample_audit")
    if audit_needed:
        assert gate["status"] == "failed"
        assert "the code diff edits data loading or preprocessing in train.py" in gate["reason"]
    else:
        assert gate["status"] == "not_applicable", gate["reason"]
