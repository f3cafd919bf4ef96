"""The difference engine on hand-built window records (no MCP): what is declared, undeclared or semantic,
and when the sides are comparable."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from perfgate.benchmarking.comparing.ab import compare_evidence
from perfgate.benchmarking.comparing.comparability import busy_neighbours, comparability, side_reasons
from perfgate.benchmarking.comparing.differences import Difference, find_differences
from perfgate.benchmarking.comparing.drift import launch_infos
from perfgate.benchmarking.comparing.sides import per_device, record_contract
from perfgate.benchmarking.runs.training import caution
from perfgate.benchmarking.workload.contract import diff_contracts
from perfgate.evidence import EvidenceDraft, EvidenceRecord, EvidenceState, Ledger

CONTRACT: dict[str, Any] = {
    "invariants": {"model": "m", "dataset": "d", "precision": "fp32", "global_batch": 32},
    "execution": {"compile": False},
}
FP = {
    "device_kind": "cpu",
    "device_name": "x86",
    "torch_version": "2.13.0",
    "num_threads": 4,
    "cudnn_benchmark": False,
}
CODE: dict[str, Any] = {"commit": "a" * 40, "diff_files": {}}


def record(
    eid: str,
    *,
    command: list[str] | None = None,
    env: dict[str, str] | None = None,
    contract: dict[str, Any] | None = None,
    fingerprint: dict[str, Any] | None = None,
    code: dict[str, Any] | None = None,
    state: EvidenceState = EvidenceState.EXECUTED,
    profiled: bool = False,
    **result: Any,
) -> EvidenceRecord:
    """A run_benchmark_window record as the comparison reads it."""
    inputs = {
        "command": command or ["python", "train.py"],
        "env": env or {},
        "contract": contract or CONTRACT,
        "warmup_steps": 5,
    }
    return EvidenceRecord(
        seq=1,
        id=eid,
        tool="run_benchmark_window",
        state=state,
        created_at="2025-01-01T00:00:00Z",
        started_at=None,
        input_digest="0" * 64,
        inputs=inputs,
        result={
            "world_size": 1,
            "measured_batch": 32,
            "environment_fingerprint": fingerprint or FP,
            "provenance": {"code": code or CODE, "files": {}},
            **result,
        },
        profiled=profiled,
        command=None,
        exit_code=0,
        environment_id=None,
        artifacts=[],
        prev_hash="0" * 64,
    )


def differences(base: EvidenceRecord, cand: EvidenceRecord, declared: list[str]) -> dict[str, Difference]:
    diff = diff_contracts(record_contract(base), record_contract(cand), declared)
    return {d.field: d for d in find_differences(base, cand, declared, diff).items}


def judge(
    base: EvidenceRecord, cand: EvidenceRecord, declared: list[str], *, per_device: bool = False
) -> list[str]:
    return comparability([base], [cand], declared, per_device=per_device, busy_share=0.25).reasons


def test_identical_sides_have_no_differences_and_are_comparable() -> None:
    assert differences(record("a"), record("b"), []) == {}
    assert judge(record("a"), record("b"), []) == []


def test_a_declared_thread_change_is_exempt_where_it_shows() -> None:
    base = record("a", env={"OMP_NUM_THREADS": "4"})
    cand = record("b", env={"OMP_NUM_THREADS": "1"}, fingerprint={**FP, "num_threads": 1})
    found = differences(base, cand, ["threads"])
    assert found["env.OMP_NUM_THREADS"].classification == "declared_execution"
    assert found["measured.num_threads"].classification == "declared_execution"
    assert judge(base, cand, ["threads"]) == []
    undeclared = judge(base, cand, [])
    assert any(
        r.startswith("env.OMP_NUM_THREADS differs ('4' vs '1') but was not declared") for r in undeclared
    )
    assert any(r.startswith("measured.num_threads differs (4 vs 1)") for r in undeclared)


def test_a_declared_thread_change_does_not_exempt_another_fingerprint_field() -> None:
    base = record("a", env={"OMP_NUM_THREADS": "4"})
    cand = record("b", env={"OMP_NUM_THREADS": "1"}, fingerprint={**FP, "cudnn_benchmark": True})
    found = differences(base, cand, ["threads"])
    assert found["env.OMP_NUM_THREADS"].classification == "declared_execution"
    assert found["measured.cudnn_benchmark"].classification == "undeclared"
    assert any(r.startswith("measured.cudnn_benchmark differs") for r in judge(base, cand, ["threads"]))


def test_an_undeclared_argv_change_is_incomparable_until_argv_is_declared() -> None:
    base = record("a", command=["python", "train.py", "--eval_iters", "200"])
    cand = record("b", command=["python", "train.py", "--eval_iters", "1"])
    argv = differences(base, cand, [])["argv"]
    assert argv.classification == "undeclared"
    assert argv.baseline == ["200"] and argv.candidate == ["1"]
    assert "--eval_iters changed and no declared change sets it" in argv.note
    assert any(r.startswith("argv differs") for r in judge(base, cand, []))
    assert differences(base, cand, ["argv"])["argv"].classification == "declared_execution"
    assert judge(base, cand, ["argv"]) == []


def test_a_changed_semantic_flag_is_flagged_whatever_else_was_declared() -> None:
    base = record("a", command=["python", "train.py", "--lr", "0.1"])
    cand = record("b", command=["python", "train.py", "--lr", "0.2"])
    found = differences(base, cand, ["argv"])
    assert found["argv.lr"].classification == "semantic"
    assert found["argv.lr"].kind == "argv"
    reasons = judge(base, cand, ["argv"])
    assert any(r.startswith("argv.lr changed ('0.1' -> '0.2')") and "training_change" in r for r in reasons)


def test_a_declared_semantic_flag_is_a_training_change_not_a_refusal() -> None:
    base = record("a", command=["python", "train.py", "--lr", "0.1"])
    cand = record("b", command=["python", "train.py", "--lr", "0.2"])
    declared = ["learning_rate"]
    assert differences(base, cand, declared)["argv.lr"].classification == "declared_semantic"
    assert not any(r.startswith("argv.lr") for r in judge(base, cand, declared))


def test_a_parallel_degree_changed_on_the_command_line_is_a_topology_change() -> None:
    tp1 = {**CONTRACT, "execution": {"compile": False, "tensor_parallel": 1}}
    tp2 = {**CONTRACT, "execution": {"compile": False, "tensor_parallel": 2}}
    base = record("a", command=["python", "train.py", "--tp", "1"], contract=tp1)
    cand = record("b", command=["python", "train.py", "--tp", "2"], contract=tp2)
    judged = comparability([base], [cand], ["tensor_parallel"], per_device=False, busy_share=0.25)
    assert "tensor_parallel" in judged.actual_changes
    assert any(r.startswith("the topology changed (tensor_parallel;") for r in judged.reasons)
    assert judge(base, cand, ["tensor_parallel"], per_device=True) == []
    undeclared = judge(base, cand, [], per_device=True)
    assert any("changes tensor_parallel (1 -> 2) but it was not declared" in r for r in undeclared)


def test_a_declared_change_that_did_not_happen_is_named() -> None:
    assert judge(record("a"), record("b"), ["workers"]) == [
        "declared change 'workers' did not happen (same value on both sides)"
    ]


def test_a_changed_measured_batch_is_semantic_whatever_the_contracts_say() -> None:
    found = differences(record("a"), record("b", measured_batch=64), [])
    assert found["measured.global_batch"].classification == "semantic"
    same = diff_contracts(record_contract(record("a")), record_contract(record("b")), [])
    missing = find_differences(record("a", measured_batch=None), record("b"), [], same)
    assert any(u.startswith("measured global batch (baseline:") for u in missing.unverified)


def _split(micro: int, source: str = "model_inputs", measured: int | None = 32) -> EvidenceRecord:
    """nanoGPT's shape: ``--batch_size`` is the micro-batch, ``--gradient_accumulation_steps`` the rest."""
    execution = {"compile": False, "microbatch": micro, "accumulation": 32 // micro}
    return record(
        f"m{micro}",
        command=[
            "python",
            "train.py",
            f"--batch_size={micro}",
            f"--gradient_accumulation_steps={32 // micro}",
        ],
        contract={**CONTRACT, "execution": execution},
        measured_batch=measured,
        batch_source=source,
    )


def test_a_batch_named_option_is_judged_by_the_measured_global_batch() -> None:
    declared = ["microbatch", "accumulation"]
    found = differences(_split(1), _split(32), declared)
    assert "argv.batch_size" in found and found["argv.batch_size"].classification == "declared_execution"
    assert "same global batch (32)" in found["argv.batch_size"].note
    assert found["argv"].classification == "declared_execution"
    assert judge(_split(1), _split(32), declared) == []


def test_a_batch_named_option_stays_semantic_unless_the_measurement_corroborates() -> None:
    declared = ["microbatch", "accumulation"]
    # the global batch changed, was not counted, or was read from an unverified source: the name decides
    changed = differences(_split(1), _split(32, measured=64), declared)
    assert changed["argv.batch_size"].classification == "semantic"
    assert changed["measured.global_batch"].classification == "semantic"
    uncounted = differences(_split(1, measured=None), _split(32, measured=None), declared)
    assert uncounted["argv.batch_size"].classification == "semantic"
    unverified = differences(_split(1, "unverified"), _split(32, "unverified"), declared)
    assert unverified["argv.batch_size"].classification == "semantic"
    # an option that names the global batch outright is what it says, whatever was measured
    explicit = [
        record(
            f"g{gb}",
            command=["python", "train.py", f"--global-batch-size={gb}"],
            contract={**CONTRACT, "execution": {"compile": False, "accumulation": gb // 8}},
            batch_source="model_inputs",
        )
        for gb in (32, 16)
    ]
    assert differences(*explicit, declared)["argv.global_batch_size"].classification == "semantic"
    # measured equal, but no declared change splits the batch (a bare 'argv' does not): the name decides
    for other in (["threads"], ["argv"]):
        assert differences(_split(1), _split(32), other)["argv.batch_size"].classification == "semantic"


def test_a_code_change_needs_code_declared() -> None:
    cand = record("b", code={"commit": "b" * 40, "diff_files": {}})
    assert differences(record("a"), cand, [])["code"].classification == "undeclared"
    assert differences(record("a"), cand, ["code"])["code"].classification == "declared_execution"
    unknown = record("b", code={"commit": None, "unknown_reason": "not a repository"})
    diff = diff_contracts(record_contract(record("a")), record_contract(unknown), [])
    assert find_differences(record("a"), unknown, [], diff).unverified == [
        "git code state (not a repository)"
    ]


def test_a_side_with_a_profiled_window_or_no_invariants_is_named() -> None:
    reasons = side_reasons("baseline", [record("a", profiled=True), record("c")])
    assert reasons == ["baseline evidence a is profiled: profiler overhead makes it useless for throughput"]
    bare = record("a", contract={"invariants": {}, "execution": {}})
    assert any(
        r.startswith("candidate declares no contract invariants") for r in side_reasons("candidate", [bare])
    )
    two_batches = side_reasons("baseline", [record("a"), record("c", measured_batch=64)])
    assert two_batches == [
        "baseline windows measured different global batches (32, 64 samples per optimizer step): they are not one "
        "workload"
    ]


def test_busy_neighbours_warn_from_the_given_share() -> None:
    loaded = record(
        "a", host_load=[{"measured": True, "other_share": 0.3}, {"measured": False, "other_share": 0.9}]
    )
    assert busy_neighbours([loaded], "baseline", 0.5) == []
    (warning,) = busy_neighbours([loaded], "baseline", 0.25)
    assert warning.startswith(
        "baseline evidence a ran beside a busy neighbour (other processes took up to 30%"
    )


def test_launch_infos_carry_each_launch_start_speed_and_exposure() -> None:
    result = {
        "launch_started_unix_s": [100.0, 200],
        "launch_host_speed": [1e8, True],
        "host_load": [
            {"measured": True, "other_share": 0.5, "job_cpus": 2.0, "other_cpus": 4.0, "cpus": 8},
            {},
        ],
    }
    infos = launch_infos("ev1", result)
    assert list(infos) == ["ev1:0", "ev1:1"]
    assert infos["ev1:0"].started_s == 100.0 and infos["ev1:0"].host_speed == 1e8
    assert infos["ev1:0"].exposure == pytest.approx(0.5) and infos["ev1:0"].other_share == 0.5
    assert infos["ev1:1"].host_speed is None and infos["ev1:1"].exposure is None
    assert list(launch_infos("ev2", {})) == ["ev2:0"]


def test_caution_leads_only_when_training_may_differ() -> None:
    assert caution([], "improved") is None
    text = caution(["model: size differs"], "improved")
    assert text is not None and text.startswith(
        "training may differ: model: size differs. The 'improved' verdict"
    )


def _ledger_window(ledger: Ledger, step_ms: float, seed: int, world_size: int = 1) -> EvidenceRecord:
    """A committed window record with a step series of 3 launches."""
    import json

    eid = Ledger.new_id()
    rng = np.random.default_rng(seed)
    windows = [
        {
            "launch": k,
            "index": 0,
            "host_step_s": list(step_ms / 1e3 * (1 + 0.01 * rng.standard_normal(20))),
            "samples_per_step": [32.0] * 20,
            "tokens_per_step": None,
        }
        for k in range(3)
    ]
    doc = {"schema": "perfgate.benchmark.series", "version": 1, "windows": windows}
    (ledger.artifact_dir(eid) / "step_series.json").write_text(json.dumps(doc))
    shape = record("x", world_size=world_size)
    ledger.append(
        EvidenceDraft(
            id=eid,
            tool="run_benchmark_window",
            state=EvidenceState.EXECUTED,
            inputs=shape.inputs,
            result=shape.result,
            artifact_names=["step_series.json"],
        )
    )
    committed = ledger.get(eid)
    assert committed is not None
    return committed


def test_compare_evidence_reads_the_series_and_gives_a_verdict(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path)
    base, cand = _ledger_window(ledger, 10.0, 0), _ledger_window(ledger, 5.0, 1)
    ab = compare_evidence(tmp_path, [base], [cand], [], per_device=False, min_effect=0.02, busy_share=0.25)
    assert ab.comparability.reasons == []
    assert ab.comparison is not None and ab.comparison.verdict == "improved"
    assert ab.comparison.speedup == pytest.approx(2.0, rel=0.05)
    assert len(ab.baseline_step_ms) == 60 and np.median(ab.baseline_step_ms) == pytest.approx(10.0, rel=0.05)
    refused = compare_evidence(
        tmp_path, [base], [cand], ["workers"], per_device=False, min_effect=0.02, busy_share=0.25
    )
    assert refused.comparison is None and refused.comparability.reasons


def test_per_device_samples_scale_step_times_by_the_measured_world_size() -> None:
    from perfgate.benchmarking.comparing.compare import WindowSample

    windows = [WindowSample([0.1, 0.2], launch="a:0")]
    assert per_device(windows, record("a", world_size=4))[0].step_s == pytest.approx([0.4, 0.8])
    assert per_device(windows, record("a", world_size=None))[0].step_s == pytest.approx([0.1, 0.2])
