"""Keep gates v4 (issue 48, items 4 and 6): audits are bound to the candidate's launches, repeats are the
contract's to allow, a failed check blocks in any role, peak memory growth needs an acceptance, a figure
that cannot be observed is `unavailable`, and a winner's validation run is part of the keep when asked.
Each hole is tried through the protocol and refused by its named gate with a next step that works."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from mcp import Client

from _trust import any_code_rules, operator_policy
from perfgate.server import build_server
from perfgate.serving.runtime import ServerConfig
from test_record_decision import INVARIANTS, Evidence, _drop, _honest, _keep, _open, _text

pytestmark = pytest.mark.anyio


def _gate(result: Any, name: str) -> dict[str, Any]:
    if result.structured_content is not None:
        gates = result.structured_content["gates"]
        return next(g for g in gates if g["name"] == name)
    raise AssertionError(_text(result))


def _refused_by(result: Any, gate: str) -> str:
    text = _text(result)
    assert result.is_error, text
    assert f"gate(s) unmet ({gate})" in text, text
    return text


# --- item 4: audits bound like dumps -------------------------------------------------------------------


async def test_an_audit_of_another_run_is_refused_and_the_candidates_own_audit_is_kept(
    server: Any, workspace: Path
) -> None:
    ev = Evidence(workspace)
    async with Client(server) as client:
        other_exp = [ev.window() for _ in range(3)]  # another experiment's candidate runs
        exp = await _open(client, touches_data=True)
        links, ids = _honest(ev)
        for audit, whose in (
            (ev.audit(ids["base"]), "the baseline's runs"),
            (ev.audit(other_exp), "another run or experiment"),
            (ev.add("audit_samples", "passed", {"status": "passed", "launches": []}), "names no launch"),
        ):
            text = _refused_by(
                await _keep(client, exp, [*links, {"id": audit, "role": "audit"}]), "sample_audit"
            )
            assert whose in text
            assert "next: audit_samples(observed=<the folder the candidate's own run_benchmark_window" in text
        # the next step taken: the candidate's own audit, attached with the keep
        kept = await _keep(client, exp, [{"id": ev.audit(ids["cand"]), "role": "audit"}])
        assert not kept.is_error, _text(kept)
        assert "a passed audit of the candidate's own launches" in _gate(kept, "sample_audit")["reason"]


async def test_repeats_are_allowed_only_where_the_contract_declares_replacement(
    server: Any, workspace: Path
) -> None:
    ev = Evidence(workspace)
    async with Client(server) as client:
        exp = await _open(client, touches_data=True)
        links, ids = _honest(ev)
        lenient = ev.audit(ids["cand"], allow_repeats=True)
        text = _refused_by(
            await _keep(client, exp, [*links, {"id": lenient, "role": "audit"}]), "sample_audit"
        )
        assert "allow_repeats=true" in text and "replacement=true" in text
        assert (
            "next: audit_samples(observed=..., expected_range=[...]) on the same folder without allow_repeats"
            in text
        )
        kept = await _keep(client, exp, [{"id": ev.audit(ids["cand"]), "role": "audit"}])
        assert not kept.is_error, _text(kept)

        # a sampler that draws with replacement declares it in the contract: then the lenient audit counts
        exp = await _open(client, touches_data=True)
        declared = {**INVARIANTS, "replacement": True}
        base = [ev.window(invariants=declared) for _ in range(3)]
        cand = [ev.window(invariants=declared) for _ in range(3)]
        links = [
            {"id": ev.env(), "role": "environment"},
            {"id": ev.comparison(base, cand), "role": "comparison"},
            {"id": ev.tensors(base=base, cand=cand), "role": "correctness"},
            {"id": ev.audit(cand, allow_repeats=True), "role": "audit"},
        ]
        kept = await _keep(client, exp, links)
        assert not kept.is_error, _text(kept)


# --- item 6: failed checks in any role, peak memory, unavailable, validation --------------------------


@pytest.mark.parametrize(
    ("tool", "role"),
    [
        ("audit_samples", "note"),
        ("check_training_health", "note"),
        ("audit_samples", "profile"),
        ("compare_tensors", "note"),
    ],
)
async def test_a_failed_check_attached_in_any_role_blocks_the_keep(
    server: Any, workspace: Path, tool: str, role: str
) -> None:
    ev = Evidence(workspace)
    async with Client(server) as client:
        exp = await _open(client)
        links, _ = _honest(ev)
        failed = ev.add(tool, "failed", {"status": "failed"})
        text = _refused_by(await _keep(client, exp, [*links, {"id": failed, "role": role}]), "failed_checks")
        assert f"{failed} ({tool}, failed) attached as {role!r}" in text
        assert "next: a failed check stays with the experiment" in text and "action='open'" in text
        # the next step taken: a new experiment with its own evidence is kept
        again = await _open(client)
        fresh, _ = _honest(ev)
        kept = await _keep(client, again, fresh)
        assert not kept.is_error, _text(kept)


async def test_doubled_peak_memory_is_refused_unless_the_keep_accepts_it(
    server: Any, workspace: Path
) -> None:
    ev = Evidence(workspace)
    async with Client(server) as client:
        exp = await _open(client)
        links, ids = _honest(ev)
        fat = [ev.window(peak=2000) for _ in range(3)]
        comp = ev.comparison(ids["base"], fat)
        links = [*_drop(links, "comparison", "correctness"), {"id": comp, "role": "comparison"}]
        links.append({"id": ev.tensors(base=ids["base"], cand=fat), "role": "correctness"})
        text = _refused_by(await _keep(client, exp, links), "peak_memory")
        assert "growth 1000 B" in text and "not accepted" in text
        assert "next: if the growth is acceptable, decide keep again with memory_growth_reason=" in text
        kept = await _keep(client, exp, links, memory_growth_reason="activations kept for the fused kernel")
        assert not kept.is_error, _text(kept)
        gate = _gate(kept, "peak_memory")
        assert gate["status"] == "passed" and "accepted with the keep: activations kept" in gate["reason"]

        # within noise (a few per cent) needs nothing
        exp = await _open(client)
        links, ids = _honest(ev)
        near = [ev.window(peak=1030) for _ in range(3)]
        links = [
            *_drop(links, "comparison", "correctness"),
            {"id": ev.comparison(ids["base"], near), "role": "comparison"},
            {"id": ev.tensors(base=ids["base"], cand=near), "role": "correctness"},
        ]
        kept = await _keep(client, exp, links)
        assert not kept.is_error, _text(kept)
        assert "within noise" in _gate(kept, "peak_memory")["reason"]


async def test_a_peak_that_cannot_be_observed_is_unavailable_not_passed(server: Any, workspace: Path) -> None:
    ev = Evidence(workspace)
    async with Client(server) as client:
        exp = await _open(client)
        links, ids = _honest(ev)
        blind = [ev.window(peak=None, peak_memory_unavailable="no counter on this device") for _ in range(3)]
        links = [
            *_drop(links, "comparison", "correctness"),
            {"id": ev.comparison(ids["base"], blind), "role": "comparison"},
            {"id": ev.tensors(base=ids["base"], cand=blind), "role": "correctness"},
        ]
        kept = await _keep(client, exp, links)
    assert not kept.is_error, _text(kept)
    gate = _gate(kept, "peak_memory")
    assert gate["status"] == "unavailable" and "no counter on this device" in gate["reason"]
    log = (workspace / ".perfgate" / "decisions.md").read_text()
    assert "unmeasured" in log


def _job(span: int, verdict: str = "healthy") -> dict[str, Any]:
    return {
        "job_health": {
            "verdict": verdict,
            "first_step": 0,
            "last_step": span - 1,
            "losses_seen": span,
            "findings": [] if verdict == "healthy" else ["non-finite loss at step 7"],
        }
    }


async def test_a_winners_validation_run_is_part_of_the_keep_when_asked(server: Any, workspace: Path) -> None:
    ev = Evidence(workspace)
    async with Client(server) as client:
        exp = await _open(client, validation_steps=50)
        base = [ev.window(**_job(20)) for _ in range(3)]
        cand = [ev.window(**_job(20)) for _ in range(3)]
        links = [
            {"id": ev.env(), "role": "environment"},
            {"id": ev.comparison(base, cand), "role": "comparison"},
            {"id": ev.tensors(base=base, cand=cand), "role": "correctness"},
        ]
        text = _refused_by(await _keep(client, exp, links), "validation_run")
        assert "no candidate run trained 50 healthy steps" in text
        assert "next: run_benchmark_window(command=<the candidate's command>" in text
        assert "measure_steps=50, repeats=1), then decide keep again with evidence=" in text
        # the one call, then the keep with it attached as a candidate run
        long_run = ev.window(**_job(60))
        kept = await _keep(client, exp, [{"id": long_run, "role": "candidate"}])
        assert not kept.is_error, _text(kept)
        assert f"{long_run} trained 60 healthy steps" in _gate(kept, "validation_run")["reason"]

        # an unhealthy candidate is not validated by length
        exp = await _open(client, validation_steps=50)
        sick = [ev.window(**_job(80, "unhealthy")) for _ in range(3)]
        links = [
            {"id": ev.env(), "role": "environment"},
            {"id": ev.comparison(base, sick), "role": "comparison"},
            {"id": ev.tensors(base=base, cand=sick), "role": "correctness"},
        ]
        text = _refused_by(await _keep(client, exp, links), "validation_run")
        assert "unhealthy: non-finite loss at step 7" in text

        # not asked: not applicable, the honest keep needs no more calls than before
        exp = await _open(client)
        links, _ = _honest(ev)
        kept = await _keep(client, exp, links)
        assert not kept.is_error, _text(kept)
        assert _gate(kept, "validation_run")["status"] == "not_applicable"


# --- a real launch: the audit's launches are the window's launch ids ------------------------------------

PY = sys.executable
SCRIPT = """
import argparse, time
from perfgate.harness import Window
from perfgate.harness.samples import SampleLog

p = argparse.ArgumentParser()
p.add_argument("--out", required=True)
p.add_argument("--shards", type=int, default=1)
args = p.parse_args()
window = Window()
logs = [SampleLog(args.out, rank=r) for r in range(2)]
for step in range(6):
    with window.step(samples=4):
        for r, log in enumerate(logs):
            # each rank its own shard (--shards 2), or both the same one (--shards 1: the duplicated shard)
            shard = r if args.shards == 2 else 0
            log.record([8 * step + 2 * i + shard for i in range(2)], epoch=0, step=step)
        time.sleep(0.002)
window.close()
"""


async def _run(client: Client, out: str, shards: int) -> dict[str, Any]:
    result = await client.call_tool(
        "run_benchmark_window",
        {
            "command": [PY, "train.py", "--out", out, "--shards", str(shards)],
            "timing": "explicit",
            "warmup_steps": 1,
            "measure_steps": 3,
            "repeats": 2,
            "timeout_s": 120,
            "contract": {
                "invariants": {"model": "m", "dataset": "d", "precision": "fp32", "global_batch": 4},
                "execution": {"workers": 0, "microbatch": 4, "accumulation": 1, "world_size": 1},
            },
        },
    )
    assert not result.is_error, _text(result)
    assert result.structured_content is not None
    return result.structured_content


async def _audit(client: Client, folder: str, **extra: Any) -> dict[str, Any]:
    result = await client.call_tool(
        "audit_samples",
        {"observed": folder, "expected_range": [0, 96], "world_size": 2, **extra},
    )
    assert not result.is_error, _text(result)
    assert result.structured_content is not None
    return result.structured_content


@pytest.mark.slow
async def test_a_launched_runs_audit_names_its_launches_and_a_duplicated_shard_fails_whatever_is_allowed(
    workspace: Path,
) -> None:
    (workspace / "train.py").write_text(SCRIPT)
    operator_policy("[execution]\n" + any_code_rules([PY, "-m", "perfgate.harness"], [PY, "train.py"]))
    async with Client(build_server(ServerConfig.create(workspace))) as client:
        run = await _run(client, "samples", 2)
        ids = run["launch_ids"]
        assert len(ids) == 2 and all(isinstance(i, int) and i > 0 for i in ids), ids
        audit = await _audit(client, "samples")
        # two launches appended to one folder: the audit counts the latest, and names it
        assert audit["launches"] == [ids[-1]], audit
        # the run stopped part-way through epoch 0: accepted for what it read, and said
        assert audit["state"] == "passed" and audit["partial_epochs"] == [0], audit["summary"]
        assert "partial" in audit["summary"]

        dup = await _run(client, "dup", 1)
        for lenient in (False, True):
            audit = await _audit(client, "dup", allow_repeats=lenient)
            assert audit["state"] == "failed", audit["summary"]
            kinds = {f["kind"]: f["severity"] for f in audit["findings"]}
            assert kinds["duplicated_shard"] == "error", kinds
            assert audit["launches"] == [dup["launch_ids"][-1]]
    lines = (workspace / "dup" / "samples-r00001-wmain.jsonl").read_text().splitlines()
    assert json.loads(lines[0])["session"] in dup["launch_ids"]
