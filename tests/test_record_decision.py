"""record_decision through the protocol: every cheating attempt refused for the right reason, an honest keep accepted."""

from __future__ import annotations

import contextlib
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from mcp import Client

from perfgate.cli import main as cli_main
from perfgate.evidence import EvidenceDraft, EvidenceState, Ledger

pytestmark = pytest.mark.anyio

FP = {"device": "cpu", "torch": "2.13.0", "python": "3.11.7", "hostname_sha": "abc"}
INVARIANTS = {"model": "tiny-mlp", "dataset": "synthetic", "global_batch": 64, "precision": "fp32", "seed": 0}
TOLERANCE = {"atol": 1e-5, "rtol": 1e-5}
"""What these tests' honest experiments declare at open: the tolerance their tensor comparisons use (within
the float32 equivalence ceiling: atol 1e-4, rtol 1.3e-5)."""
QUALITY = {"metric": "loss_last_ratio", "direction": "lower", "threshold": 1.02}
ROLLBACK = "git checkout HEAD -- train.py"
"""A rollback naming a workspace file (Evidence writes train.py, the script its windows ran)."""


class Evidence:
    """Writes records as the real tools would (same tool names, inputs and result fields)."""

    def __init__(self, workspace: Path) -> None:
        self.ledger = Ledger(workspace)
        self.next_launch = 1
        # the script the windows' recorded command runs: what ROLLBACK checks out again
        script = workspace / "train.py"
        if not script.exists():
            script.write_text("# the training script\n")

    def add(
        self,
        tool: str,
        state: str,
        result: dict[str, Any] | None = None,
        inputs: dict[str, Any] | None = None,
        profiled: bool = False,
        artifact: bytes | None = None,
        artifacts: dict[str, bytes] | None = None,
    ) -> str:
        eid = Ledger.new_id()
        files = {**({"series.json": artifact} if artifact is not None else {}), **(artifacts or {})}
        for name, data in files.items():
            (self.ledger.artifact_dir(eid) / name).write_bytes(data)
        names = list(files)
        self.ledger.append(
            EvidenceDraft(
                id=eid,
                tool=tool,
                state=EvidenceState(state),
                inputs=inputs or {},
                result={"evidence_id": eid, "state": state, **(result or {})},
                profiled=profiled,
                artifact_names=names,
            )
        )
        return eid

    def env(self) -> str:
        return self.add("collect_env", "executed", {"fingerprint": FP})

    def window(
        self,
        *,
        profiled: bool = False,
        fp: dict[str, Any] | None = None,
        invariants: dict[str, Any] | None = None,
        peak: int | None = 1000,
        launches: list[int] | None = None,
        tensor_dumps: list[dict[str, Any]] | None = None,
        provenance: dict[str, Any] | None = None,
        timing_checks: list[dict[str, Any]] | None = None,
        peak_kind: str | None = "device_allocated",
        artifacts: dict[str, bytes] | None = None,
        run: dict[str, Any] | None = None,
        **result: Any,
    ) -> str:
        """``run``: inputs that replace the default command (``command``, ``env``)."""
        windows = [{"launch": launch, "index": i} for i, launch in enumerate(launches or [0])]
        # the ids the server gave each launch (what sample records carry as their session)
        launch_ids = list(range(self.next_launch, self.next_launch + len({w["launch"] for w in windows})))
        self.next_launch += len(launch_ids)
        return self.add(
            "run_benchmark_window",
            "executed",
            {
                "median_step_ms": 10.0,
                "peak_memory_bytes": peak,
                "peak_memory_kind": peak_kind if peak is not None else None,
                "launch_ids": launch_ids,
                "environment_fingerprint": fp or FP,
                "windows": windows,
                "windows_measured": len(windows),
                # As a perfgate from before named digests recorded them (a bare sha256): every gate test
                # also covers a ledger of that age. `tensors` below names these bytes.
                "tensor_dumps": [
                    {"path": "ref.safetensors", "sha256": "a" * 64, "size_bytes": 8, "launch": 0},
                    {"path": "cand.safetensors", "sha256": "b" * 64, "size_bytes": 8, "launch": 0},
                ]
                if tensor_dumps is None
                else tensor_dumps,
                **({"provenance": provenance} if provenance is not None else {}),
                **({"timing_checks": timing_checks} if timing_checks is not None else {}),
                **result,
            },
            {
                "command": ["python", "train.py"],
                "contract": {"invariants": invariants or INVARIANTS, "execution": {}},
                **(run or {}),
            },
            profiled=profiled,
            artifact=b"[10.0, 10.1]",
            artifacts=artifacts,
        )

    def audit(self, windows: list[str], state: str = "passed", **inputs: Any) -> str:
        """An audit_samples record of the records the last launch of each of ``windows`` wrote."""
        launches = [ids[-1] for w in windows if (r := self.ledger.get(w)) and (ids := r.result["launch_ids"])]
        return self.add(
            "audit_samples",
            state,
            {"status": state, "coverage": "checked", "launches": launches, "partial_epochs": []},
            {"observed": "samples", "expected_range": [0, 64], **inputs},
        )

    def comparison(
        self,
        baseline: list[str],
        candidate: list[str],
        *,
        verdict: str = "improved",
        state: str = "passed",
        reasons: list[str] | None = None,
        declared: list[str] | None = None,
        differences: list[dict[str, Any]] | None = None,
        actual_changes: list[str] | None = None,
        per_device: bool = False,
    ) -> str:
        return self.add(
            "compare_benchmarks",
            state,
            {
                "status": "incomparable" if state == "failed" else "comparable",
                "verdict": verdict,
                "speedup": 1.4,
                "baseline_windows": len(baseline),
                "candidate_windows": len(candidate),
                "reasons": reasons or [],
                "differences": differences or [],
                "actual_changes": actual_changes or [],
            },
            {
                "baseline": baseline,
                "candidate": candidate,
                "declared_changes": ["num_workers"] if declared is None else declared,
                "per_device": per_device,
            },
        )

    def tensors(
        self,
        passed: bool = True,
        atol: float = 1e-5,
        rtol: float = 1e-5,
        same_file: bool = False,
        base: list[str] | None = None,
        cand: list[str] | None = None,
        dtype: str = "float32",
        **options: Any,
    ) -> str:
        """A compare_tensors record; ``base``/``cand``: the windows whose launches dumped each side's file
        (the producers compare_tensors found in the ledger), else the files are unbound; ``dtype``: what the
        tensors were (the record's tolerance_by_dtype)."""
        files = [
            {"role": "reference", "path": "ref.safetensors", "sha256": "a" * 64},
            {
                "role": "candidate",
                "path": "ref.safetensors" if same_file else "cand.safetensors",
                "sha256": "a" * 64 if same_file else "b" * 64,
            },
        ]
        producers = [
            {**f, "evidence_id": ids[0] if ids else None, "launch": 0 if ids else None}
            for f, ids in zip(files, (base, cand), strict=True)
        ]
        applied = [(atol, rtol)] + [(o["atol"], o["rtol"]) for o in options.get("overrides", [])]
        by_dtype = [
            {
                "dtype": dtype,
                "tensors": 2,
                "atol": max(a for a, _ in applied),
                "rtol": max(r for _, r in applied),
            }
            for dtype in [dtype]
        ]
        return self.add(
            "compare_tensors",
            "passed" if passed else "failed",
            {
                "status": "match" if passed else "mismatch",
                "files": files,
                "producers": producers,
                "tolerance_by_dtype": by_dtype,
            },
            {
                "reference": "ref.safetensors",
                "candidate": "cand.safetensors",
                "atol": atol,
                "rtol": rtol,
                **options,
            },
        )


async def _open(client: Client, **extra: Any) -> str:
    training = extra.get("classification") == "training_change"
    result = await client.call_tool(
        "record_decision",
        {
            "action": "open",
            "hypothesis": "more loader workers hide data waits",
            "classification": "system_optimization",
            "changed_variable": "num_workers",
            **({"quality": QUALITY} if training else {"tolerance": TOLERANCE}),
            **extra,
        },
    )
    assert not result.is_error, result.content
    assert result.structured_content is not None
    return str(result.structured_content["experiment_id"])


async def _keep(client: Client, exp: str, links: list[dict[str, str]], **extra: Any) -> Any:
    return await client.call_tool(
        "record_decision",
        {
            "action": "decide",
            "experiment_id": exp,
            "decision": "keep",
            "rationale": "faster",
            "rollback": ROLLBACK,
            "evidence": links,
            **extra,
        },
    )


async def _shown_gate(client: Client, exp: str, comparison: str, name: str) -> dict[str, Any]:
    """The gate ``name`` as record_decision(action='show') reports it with ``comparison`` attached."""
    shown = await client.call_tool(
        "record_decision",
        {"action": "show", "experiment_id": exp, "evidence": [{"id": comparison, "role": "comparison"}]},
    )
    assert shown.structured_content is not None, _text(shown)
    return next(g for g in shown.structured_content["gates"] if g["name"] == name)


def _text(result: Any) -> str:
    return " ".join(getattr(c, "text", "") for c in result.content)


def _honest(ev: Evidence) -> tuple[list[dict[str, str]], dict[str, Any]]:
    base = [ev.window() for _ in range(3)]
    cand = [ev.window() for _ in range(3)]
    comp = ev.comparison(base, cand)
    links = [
        {"id": ev.env(), "role": "environment"},
        {"id": comp, "role": "comparison"},
        {"id": ev.tensors(base=base, cand=cand), "role": "correctness"},
    ]
    return links, {"base": base, "cand": cand, "comp": comp}


async def test_an_honest_experiment_is_kept_and_logged(server: Any, workspace: Path, mode: str) -> None:
    ev = Evidence(workspace)
    async with Client(server, mode=mode) as client:
        exp = await _open(client)
        links, _ = _honest(ev)
        result = await _keep(client, exp, links)
    assert not result.is_error, _text(result)
    out = result.structured_content
    assert out is not None
    assert out["accepted"] is True
    assert out["state"] == "passed"
    assert "equivalent speedup" in out["label"]
    assert {g["status"] for g in out["gates"]} <= {"passed", "not_applicable"}
    log = (workspace / ".perfgate" / "decisions.md").read_text()
    assert exp in log
    assert "KEEP" in log
    assert f"- **Rollback:** `{ROLLBACK}`" in log


async def test_a_keep_without_a_rollback_is_refused_and_the_rollback_reaches_the_report(
    server: Any, workspace: Path
) -> None:
    from perfgate.report.html import write_report

    ev = Evidence(workspace)
    async with Client(server, mode="auto") as client:
        exp = await _open(client)
        links, _ = _honest(ev)
        for missing in ({"rollback": None}, {"rollback": "   "}):
            refused = await _keep(client, exp, links, **missing)
            assert refused.is_error
            assert "a keep needs rollback" in _text(refused)
        kept = await _keep(client, exp, links, rollback="git revert --no-edit train.py")
    assert not kept.is_error, _text(kept)
    (page, _) = write_report(Ledger(workspace), exp, workspace / "report")
    assert "<tr><th>rollback</th><td><code>git revert --no-edit train.py</code></td></tr>" in page.read_text()


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
async def test_a_rollback_must_name_a_commit_a_file_or_a_baseline_setting_that_exists(
    server: Any, workspace: Path
) -> None:
    ev = Evidence(workspace)
    git = [
        "git",
        "-C",
        str(workspace),
        "-c",
        "user.name=t",
        "-c",
        "user.email=t@t",
        "-c",
        "commit.gpgsign=false",
    ]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "train.py"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "baseline"], check=True)
    head = subprocess.run(
        [*git, "rev-parse", "HEAD"], check=True, capture_output=True, text=True
    ).stdout.strip()
    async with Client(server) as client:
        exp = await _open(client)
        links, _ = _honest(ev)
        for vague, why in (
            ("revert it", "names no commit, workspace file or baseline setting"),
            ("git revert 1a2b3c4", "1a2b3c4 is no commit of the workspace's repository"),
            ("git checkout -- missing.py", "names no commit"),
            ("--num-workers 0", "not in the baseline windows' recorded command"),
        ):
            refused = await _keep(client, exp, links, rollback=vague)
            text = _text(refused)
            assert refused.is_error and "gate(s) unmet (rollback)" in text, text
            assert why in text and "next: decide keep again with a rollback" in text
        kept = await _keep(client, exp, links, rollback=f"git revert {head[:10]}")
        assert not kept.is_error, _text(kept)
        gate = next(g for g in kept.structured_content["gates"] if g["name"] == "rollback")
        assert gate["status"] == "passed" and f"commit {head[:10]}" in gate["reason"]


CHEATS = {
    "no comparison": (
        "no compare_benchmarks evidence",
        lambda ev, links, ids: [link for link in links if link["role"] != "comparison"],
    ),
    "profiled window as throughput": (
        "profiled runs are never throughput evidence",
        lambda ev, links, ids: _swap_comparison(
            ev, links, ids["base"], [ev.window(profiled=True), *ids["cand"][1:]]
        ),
    ),
    "invariants differ": (
        "windows declare different invariants",
        lambda ev, links, ids: _swap_comparison(
            ev,
            links,
            ids["base"],
            [ev.window(invariants={**INVARIANTS, "global_batch": 32}) for _ in range(3)],
        ),
    ),
    "within noise": (
        "not beyond noise",
        lambda ev, links, ids: [
            *_drop(links, "comparison"),
            {"id": ev.comparison(ids["base"], ids["cand"], verdict="within_noise"), "role": "comparison"},
        ],
    ),
    "incomparable comparison": (
        "invariant model differs",
        lambda ev, links, ids: [
            *_drop(links, "comparison"),
            {
                "id": ev.comparison(
                    ids["base"],
                    ids["cand"],
                    state="failed",
                    verdict="incomparable",
                    reasons=["invariant model differs"],
                ),
                "role": "comparison",
            },
        ],
    ),
    "failed tensor comparison": (
        "failed (no summary recorded)",
        lambda ev, links, ids: [*links, {"id": ev.tensors(passed=False), "role": "correctness"}],
    ),
    "different environments": (
        "different environments (differs in torch)",
        lambda ev, links, ids: _swap_comparison(
            ev, links, ids["base"], [ev.window(fp={**FP, "torch": "2.14.1"}) for _ in range(3)]
        ),
    ),
    "a single window": (
        "fewer than 3 separate launches",
        lambda ev, links, ids: _swap_comparison(ev, links, ids["base"][:1], ids["cand"][:1]),
    ),
    "windows without the required invariants": (
        "does not declare dataset",
        lambda ev, links, ids: _swap_comparison(
            ev,
            links,
            [ev.window(invariants={"model": "m", "precision": "fp32", "global_batch": 64}) for _ in range(3)],
            [ev.window(invariants={"model": "m", "precision": "fp32", "global_batch": 64}) for _ in range(3)],
        ),
    ),
    "log-timed windows with an all-null fingerprint": (
        "windows without an environment fingerprint",
        lambda ev, links, ids: _swap_comparison(
            ev,
            links,
            [ev.window(fp={"device_kind": None, "torch_version": None}) for _ in range(3)],
            [ev.window(fp={"device_kind": None, "torch_version": None}) for _ in range(3)],
        ),
    ),
    "a comparison declaring another change": (
        "declared ['compile'], but the experiment's one changed variable is 'num_workers'",
        lambda ev, links, ids: [
            *_drop(links, "comparison"),
            {"id": ev.comparison(ids["base"], ids["cand"], declared=["compile"]), "role": "comparison"},
        ],
    ),
    "a file compared with itself": (
        "compares a file with itself",
        lambda ev, links, ids: [
            *_drop(links, "correctness"),
            {"id": ev.tensors(same_file=True), "role": "correctness"},
        ],
    ),
    "a strict failure superseded by a looser pass": (
        "looser than the failed check",
        lambda ev, links, ids: [
            *_drop(links, "correctness"),
            {"id": ev.tensors(passed=False, atol=1e-5), "role": "note"},
            {"id": ev.tensors(atol=1e-1), "role": "correctness"},
        ],
    ),
    "three windows of one launch": (
        "fewer than 3 separate launches on candidate (1)",
        lambda ev, links, ids: _swap_comparison(ev, links, ids["base"], [ev.window(launches=[0, 0, 0])]),
    ),
}


def _drop(links: list[dict[str, str]], *roles: str) -> list[dict[str, str]]:
    return [link for link in links if link["role"] not in roles]


def _swap_comparison(
    ev: Evidence, links: list[dict[str, str]], base: list[str], cand: list[str]
) -> list[dict[str, str]]:
    return [*_drop(links, "comparison"), {"id": ev.comparison(base, cand), "role": "comparison"}]


@pytest.mark.parametrize("cheat", sorted(CHEATS))
async def test_cheating_attempts_are_refused_with_the_reason(
    server: Any, workspace: Path, mode: str, cheat: str
) -> None:
    ev = Evidence(workspace)
    expected, tamper = CHEATS[cheat]
    async with Client(server, mode=mode) as client:
        exp = await _open(client)
        links, ids = _honest(ev)
        result = await _keep(client, exp, tamper(ev, links, ids))
        assert result.is_error
        assert expected in _text(result)
        assert (
            "record_decision" in _text(result)
            or "compare_benchmarks" in _text(result)
            or "run_benchmark_window" in _text(result)
        )
        revert = await client.call_tool(
            "record_decision",
            {"action": "decide", "experiment_id": exp, "decision": "revert", "rationale": "not proven"},
        )
    assert not revert.is_error
    assert revert.structured_content is not None
    assert revert.structured_content["accepted"] is True
    assert any(g["status"] == "failed" for g in revert.structured_content["gates"])
    log = (workspace / ".perfgate" / "decisions.md").read_text()
    assert "REVERT" in log
    assert "Refused attempts:** 1" in log


async def test_a_within_noise_refusal_says_so_and_asks_for_more_launches(
    server: Any, workspace: Path
) -> None:
    ev = Evidence(workspace)
    async with Client(server) as client:
        exp = await _open(client)
        links, ids = _honest(ev)
        noise = ev.comparison(ids["base"], ids["cand"], verdict="within_noise", state="executed")
        few = ev.comparison(ids["base"], ids["cand"], verdict="insufficient_launches", state="executed")
        for comp, expected in ((noise, "verdict is within_noise"), (few, "verdict is insufficient_launches")):
            result = await _keep(
                client, exp, [*_drop(links, "comparison"), {"id": comp, "role": "comparison"}]
            )
            shown = await client.call_tool("record_decision", {"action": "show", "experiment_id": exp})
            assert shown.structured_content is not None
            gate = next(g for g in shown.structured_content["gates"] if g["name"] == "comparison")
            assert result.is_error and expected in _text(result)
            assert gate["reason"].startswith(expected)
            assert "more separate launches" in gate["satisfy_with"]


async def test_evidence_from_before_open_or_another_kept_experiment_is_refused(
    server: Any, workspace: Path
) -> None:
    ev = Evidence(workspace)
    early = [ev.window() for _ in range(3)]
    async with Client(server) as client:
        exp = await _open(client)
        links, ids = _honest(ev)
        stale = ev.comparison(ids["base"], early)
        result = await _keep(client, exp, [*_drop(links, "comparison"), {"id": stale, "role": "comparison"}])
        assert result.is_error and "before the experiment was opened" in _text(result)
        kept = await _keep(client, exp, links, rollback=ROLLBACK)
        assert not kept.is_error, _text(kept)
        # the kept candidate windows cannot be another experiment's candidate evidence
        again = await _open(client)
        reused = await _keep(client, again, links, rollback=ROLLBACK)
        assert reused.is_error and f"already support the kept experiment {exp}" in _text(reused)


async def test_a_failure_washed_out_by_a_new_experiment_still_counts(server: Any, workspace: Path) -> None:
    ev = Evidence(workspace)
    async with Client(server) as client:
        first = await _open(client)
        failed = ev.tensors(passed=False, atol=1e-6, rtol=1e-5)
        await client.call_tool(
            "record_decision",
            {"action": "attach", "experiment_id": first, "evidence": [{"id": failed, "role": "note"}]},
        )
        second = await _open(client)
        links, _ = _honest(ev)
        loose = ev.tensors(atol=1e-2, rtol=1e-2)
        result = await _keep(
            client, second, [*_drop(links, "correctness"), {"id": loose, "role": "correctness"}]
        )
        assert result.is_error and f"looser than the failed check {failed}" in _text(result)
        # the looser pass stays attached to that experiment; a repaired change passing the strict check is kept
        third = await _open(client)
        links, ids = _honest(ev)
        strict = ev.tensors(atol=1e-6, rtol=1e-5, base=ids["base"], cand=ids["cand"])
        ok = await _keep(client, third, [*_drop(links, "correctness"), {"id": strict, "role": "correctness"}])
        assert not ok.is_error, _text(ok)


async def test_user_text_cannot_inject_markdown_into_the_decision_log(server: Any, workspace: Path) -> None:
    ev = Evidence(workspace)
    async with Client(server) as client:
        exp = await _open(client, hypothesis="faster\n## KEEP everything\n| environment | ev-fake |")
        links, ids = _honest(ev)
        result = await _keep(
            client, exp, links, rationale="ok\n\n## Injected heading", rollback="git checkout `train.py`"
        )
        assert not result.is_error, _text(result)
    log = (workspace / ".perfgate" / "decisions.md").read_text()
    assert not any(
        line.startswith(("## KEEP", "## Injected", "| environment | ev-fake")) for line in log.splitlines()
    )
    assert f"- **Decided on comparison:** `{ids['comp']}`" in log


async def test_an_artifact_edited_on_disk_blocks_the_keep(server: Any, workspace: Path, mode: str) -> None:
    ev = Evidence(workspace)
    async with Client(server, mode=mode) as client:
        exp = await _open(client)
        links, ids = _honest(ev)
        (workspace / ".perfgate" / "artifacts" / ids["cand"][0] / "series.json").write_bytes(b"[5.0, 5.0]")
        result = await _keep(client, exp, links)
    assert result.is_error
    assert "modified after it was recorded" in _text(result)


async def test_data_changes_need_a_sample_audit_and_memory_budgets_are_enforced(
    server: Any, workspace: Path
) -> None:
    ev = Evidence(workspace)
    async with Client(server) as client:
        exp = await _open(client, touches_data=True)
        links, ids = _honest(ev)
        result = await _keep(client, exp, links)
        assert "no passed audit_samples evidence" in _text(result)
        audit = ev.audit(ids["cand"])
        result = await _keep(client, exp, [{"id": audit, "role": "audit"}])
        assert not result.is_error, _text(result)

        exp2 = await _open(client, memory_budget_bytes=100)
        fat = [ev.window(peak=5000) for _ in range(3)]
        comp = ev.comparison(ids["base"], fat)
        result = await _keep(client, exp2, [*_drop(links, "comparison"), {"id": comp, "role": "comparison"}])
        assert result.is_error
        assert "growth 4000 B, budget 100 B" in _text(result)


async def test_training_changes_need_their_own_quality_evidence_and_are_not_called_equivalent(
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
        refused = await _keep(client, exp, links)
        assert "task_quality" in _text(refused) and "no task-quality result" in _text(refused)
        # any passed record is not task quality: a tensor match, a sample audit
        for tool in ("compare_tensors", "audit_samples"):
            other = ev.add(tool, "passed", {"status": "match"})
            refused = await _keep(client, exp, [{"id": other, "role": "quality"}])
            assert refused.is_error and "is not task-quality evidence" in _text(refused)
        stale = ev.add(
            "check_training_health", "passed", {"quality_kind": "training_health"}, {"evidence_id": base[0]}
        )
        refused = await _keep(client, exp, [{"id": stale, "role": "quality"}])
        assert refused.is_error and "not a candidate window of the comparison" in _text(refused)

    async with Client(server) as client:
        exp = await _open(client, classification="training_change", changed_variable="precision")
        cand = [ev.window(invariants={**INVARIANTS, "precision": "bf16"}) for _ in range(3)]
        comp = ev.comparison(base, cand, declared=["precision"], differences=precision)
        health = ev.add(
            "check_training_health",
            "passed",
            {"quality_kind": "training_health", "metrics": {"loss_last": 2.1, "loss_last_ratio": 1.01}},
            {"evidence_id": cand[0], "baseline_id": base[0], "loss_tolerance": 0.02},
        )
        kept = await _keep(
            client,
            exp,
            [
                {"id": ev.env(), "role": "environment"},
                {"id": comp, "role": "comparison"},
                {"id": health, "role": "quality"},
            ],
        )
        assert not kept.is_error, _text(kept)
        assert kept.structured_content is not None
        assert "not an equivalent speedup" in kept.structured_content["label"]

        # the same declared precision change can never be kept as a system optimization
        exp = await _open(client, changed_variable="precision")
        cand = [ev.window(invariants={**INVARIANTS, "precision": "bf16"}) for _ in range(3)]
        comp = ev.comparison(base, cand, declared=["precision"], differences=precision)
        refused = await _keep(
            client,
            exp,
            [
                {"id": ev.env(), "role": "environment"},
                {"id": comp, "role": "comparison"},
                {"id": ev.tensors(), "role": "correctness"},
            ],
        )
        assert refused.is_error and "declares semantic changes" in _text(refused)


async def test_unknown_ids_and_missing_fields_are_clear_errors(server: Any, workspace: Path) -> None:
    async with Client(server) as client:
        r1 = await client.call_tool("record_decision", {"action": "open", "hypothesis": "x"})
        assert "needs classification, changed_variable" in _text(r1)
        r2 = await client.call_tool("record_decision", {"action": "show", "experiment_id": "exp-nope"})
        assert "no experiment 'exp-nope'" in _text(r2)
        exp = await _open(client)
        r3 = await client.call_tool(
            "record_decision",
            {
                "action": "attach",
                "experiment_id": exp,
                "evidence": [{"id": "ev-missing", "role": "baseline"}],
            },
        )
        assert "not in the ledger" in _text(r3)
        shown = await client.call_tool("record_decision", {"action": "show", "experiment_id": exp})
        assert shown.structured_content is not None
        failing = [g["name"] for g in shown.structured_content["gates"] if g["status"] == "failed"]
        assert "environment" in failing
        assert "comparison" in failing


async def test_export_writes_the_run_directory(server: Any, workspace: Path, tmp_path: Path) -> None:
    ev = Evidence(workspace)
    async with Client(server) as client:
        exp = await _open(client)
        links, _ = _honest(ev)
        await _keep(client, exp, links)
    out = tmp_path / "run"
    assert cli_main(["export", exp, str(out), "--workspace", str(workspace)]) == 0
    for name in (
        "environment.json",
        "command.txt",
        "source.txt",
        "baseline.json",
        "candidate.json",
        "comparison.json",
        "correctness.json",
        "decisions.md",
    ):
        assert (out / name).is_file(), name
    assert (out / "profiles" / "framework").is_dir()
    assert "python train.py" in (out / "command.txt").read_text()


async def test_export_stops_at_an_artifact_changed_after_it_was_recorded(
    server: Any, workspace: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An exported profile artifact must be the bytes its record hashed: one rewritten in the workspace
    afterwards stops the export (exit 1, naming it), and no copy of it is left."""
    ev = Evidence(workspace)
    profile = ev.add("profile_segment", "executed", artifact=b'{"steps": [1.0, 1.1]}')
    async with Client(server) as client:
        exp = await _open(client)
        links, _ = _honest(ev)
        await _keep(client, exp, [*links, {"id": profile, "role": "profile"}])
    record = Ledger(workspace).get(profile)
    assert record is not None
    [artifact] = record.artifacts
    out = tmp_path / "run"
    assert cli_main(["export", exp, str(out), "--workspace", str(workspace)]) == 0
    copied = out / "profiles" / "framework" / profile / artifact.name
    assert copied.read_bytes() == b'{"steps": [1.0, 1.1]}'
    (workspace / artifact.path).write_bytes(b'{"steps": [0.5, 0.5]}')
    capsys.readouterr()
    again = tmp_path / "again"
    assert cli_main(["export", exp, str(again), "--workspace", str(workspace)]) == 1
    err = capsys.readouterr().err
    assert artifact.path in err and "modified after it was recorded" in err
    assert not (again / "profiles" / "framework" / profile / artifact.name).exists()


async def test_a_refusal_leads_with_what_is_wrong_and_the_next_call(server: Any, workspace: Path) -> None:
    ev = Evidence(workspace)
    links, _ = _honest(ev)
    without_comparison = [link for link in links if link["role"] != "comparison"]
    async with Client(server, mode="auto") as client:
        exp = await _open(client)
        refused = await _keep(client, exp, without_comparison)
    assert refused.is_error
    lines = _text(refused).split("keep refused", 1)[1].splitlines()  # after the SDK's own prefix
    assert re.fullmatch(
        rf" for {exp}: \d+ gate\(s\) unmet \([a-z_, ]*comparison[a-z_, ]*\); refusal recorded as ev-\S+",
        lines[0],
    ), lines[0]
    assert lines[1].startswith("next: compare_benchmarks(") or lines[1].startswith(
        "next: record_decision("
    ), lines
    assert lines[1].endswith("or decide 'revert', 'inconclusive' or 'blocked'")


async def test_a_kept_change_can_be_reverted_later_and_the_history_stays(
    server: Any, workspace: Path
) -> None:
    ev = Evidence(workspace)
    async with Client(server) as client:
        exp = await _open(client)
        links, _ = _honest(ev)
        kept = await _keep(client, exp, links)
        assert not kept.is_error, _text(kept)
        # A kept experiment takes no second keep and no other decision but a revert.
        again = await _keep(client, exp, [])
        assert again.is_error and f"{exp} is kept; the only decision left is 'revert'" in _text(again)
        other = await client.call_tool(
            "record_decision",
            {"action": "decide", "experiment_id": exp, "decision": "inconclusive", "rationale": "hmm"},
        )
        assert other.is_error
        revert = await client.call_tool(
            "record_decision",
            {
                "action": "decide",
                "experiment_id": exp,
                "decision": "revert",
                "rationale": "loss diverged later",
            },
        )
        assert not revert.is_error, _text(revert)
        # Reverted, it cannot be kept again on the same experiment ...
        rekeep = await _keep(client, exp, [])
        assert rekeep.is_error and "kept and then reverted" in _text(rekeep)
        # ... and its candidate windows cannot carry another experiment's keep.
        second = await _open(client)
        reuse = await _keep(client, second, links)
        assert reuse.is_error and "evidence_not_reused" in _text(reuse)
        shown = await client.call_tool("record_decision", {"action": "show", "experiment_id": exp})
    assert shown.structured_content is not None
    log = (workspace / ".perfgate" / "decisions.md").read_text()
    section = log[log.index(f"## {exp}") :]
    assert section.startswith(f"## {exp}: REVERT")
    assert "- **History:** keep at" in section and "-> revert at" in section


@pytest.mark.parametrize("two_experiments", [False, True], ids=["one experiment", "two experiments"])
async def test_keeps_racing_on_one_evidence_are_decided_one_after_the_other(
    server: Any, workspace: Path, monkeypatch: pytest.MonkeyPatch, two_experiments: bool
) -> None:
    """Two keeps sent at once, of one experiment or of two with the same candidate windows: the second is
    weighed against the first one's keep and refused. Before, both were weighed before either was
    recorded, so one experiment was kept twice, or one measurement carried two keeps."""
    import threading

    import anyio

    from perfgate.tools import record_decision

    ev = Evidence(workspace)
    both_weighed = threading.Barrier(2, timeout=2)
    real = record_decision.evaluate_keep

    def evaluate_keep(*args: Any, **kwargs: Any) -> Any:
        gates = real(*args, **kwargs)
        with contextlib.suppress(threading.BrokenBarrierError):  # decided in turn: the first goes on alone
            both_weighed.wait()
        return gates

    monkeypatch.setattr(record_decision, "evaluate_keep", evaluate_keep)
    results: list[Any] = []
    async with Client(server) as client:
        first = await _open(client)
        second = await _open(client) if two_experiments else first
        links, _ = _honest(ev)

        async def keep(exp: str) -> None:
            results.append(await _keep(client, exp, links))

        async with anyio.create_task_group() as tg:
            tg.start_soon(keep, first)
            tg.start_soon(keep, second)
    assert sorted(r.is_error for r in results) == [False, True], [_text(r) for r in results]
    refused = _text(next(r for r in results if r.is_error))
    assert ("evidence_not_reused" if two_experiments else "the only decision left is 'revert'") in refused


async def test_a_keep_rests_on_the_latest_comparison_that_covers_its_windows(
    server: Any, workspace: Path
) -> None:
    """An earlier 'improved' comparison that a later one over the same windows plus more overrules does not
    count, attached or not, in whatever order the comparisons were attached."""
    ev = Evidence(workspace)
    async with Client(server) as client:
        exp = await _open(client)
        links, sides = _honest(ev)
        early = sides["comp"]
        more = ev.window()
        later = ev.comparison([*sides["base"], more], sides["cand"], verdict="within_noise")
        refused = await _keep(client, exp, links)
        text = _text(refused)
        assert refused.is_error and "gate(s) unmet (comparison)" in text, text
        assert f"comparison {early} (improved at 1.400x) is overruled by {later}" in text
        assert "plus 1 more that says within_noise" in text and repr(later) in text
        # attached after the later one, the earlier comparison is still the older evidence
        swapped = [{"id": later, "role": "comparison"}, *links]
        refused = await _keep(client, exp, swapped)
        text = _text(refused)
        assert refused.is_error and f"{early} (improved at 1.400x) is overruled" in text, text
        # a newer comparison over the same windows that also says improved overrules nothing
        newest = ev.comparison([*sides["base"], more], sides["cand"])
        kept = await _keep(client, exp, [*links, {"id": newest, "role": "comparison"}])
        assert not kept.is_error, _text(kept)
