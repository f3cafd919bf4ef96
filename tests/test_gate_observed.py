"""A declared change is exempt exactly where it shows (issue 47 item 1): the keep's same_environment gate and
compare_benchmarks both read benchmarking.workload.observed, so a thread change accepted as declared is not refused
at keep, and every field the declared setting does not set must still match."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

import pytest
from mcp import Client

from perfgate.benchmarking.workload.observed import EXECUTION_KEYS, WHERE_SHOWN, entries_showing, explains
from perfgate.decisions.binding import TOPOLOGY
from perfgate.harness.runtime_env import ENV_VARS
from test_evidence_gate import FP, window
from test_record_decision import TOLERANCE, Evidence, _text

pytestmark = pytest.mark.anyio

RUNTIME: dict[str, Any] = {
    **FP,
    **dict.fromkeys(ENV_VARS),
    "num_threads": "4",
    "interop_threads": "4",
    "allow_tf32": "False",
    "cudnn_allow_tf32": "True",
    "matmul_precision": "highest",
    "cudnn_benchmark": "False",
    "deterministic_algorithms": "False",
    "torch_cuda_version": None,
    "torch_hip_version": None,
    "device_count": "0",
    "device_names": None,
}
"""A CPU window's measured environment, as perfgate.harness.runtime_env records it."""


def _changed(fp: dict[str, Any], fields: tuple[str, ...] | list[str]) -> dict[str, Any]:
    return {**fp, **{f: f"other-{fp.get(f)}" for f in fields}}


async def _open(client: Client, changed_variable: str, classification: str = "system_optimization") -> str:
    extra: dict[str, Any] = (
        {"quality": {"metric": "loss_last_ratio", "direction": "lower", "threshold": 1.02}}
        if classification == "training_change"
        else {"tolerance": TOLERANCE}
    )
    result = await client.call_tool(
        "record_decision",
        {
            "action": "open",
            "hypothesis": f"{changed_variable} is faster",
            "classification": classification,
            "changed_variable": changed_variable,
            **extra,
        },
    )
    assert result.structured_content is not None, _text(result)
    return str(result.structured_content["experiment_id"])


async def _same_environment(client: Client, exp: str, comparison: str) -> dict[str, Any]:
    shown = await client.call_tool(
        "record_decision",
        {"action": "show", "experiment_id": exp, "evidence": [{"id": comparison, "role": "comparison"}]},
    )
    assert shown.structured_content is not None, _text(shown)
    return next(g for g in shown.structured_content["gates"] if g["name"] == "same_environment")


async def _compare(client: Client, base: str, cand: str, declared: list[str], **kw: Any) -> dict[str, Any]:
    result = await client.call_tool(
        "compare_benchmarks", {"baseline": [base], "candidate": [cand], "declared_changes": declared, **kw}
    )
    assert result.structured_content is not None, _text(result)
    return result.structured_content


def test_every_execution_key_says_where_it_shows() -> None:
    # a new execution key without a row fails here (and in the keep test below) until it is mapped
    assert set(EXECUTION_KEYS) <= set(WHERE_SHOWN)
    for key in EXECUTION_KEYS:
        assert entries_showing("option", f"--{key.replace('_', '-')}") == (key,)
    # no field is two entries' at once: one declared change cannot hide behind another's field
    for key, shows in WHERE_SHOWN.items():
        for name in shows.fingerprint:
            assert entries_showing("fingerprint", name) == (key,), name
        for name in shows.env:
            assert "*" in name or entries_showing("env", name) == (key,), name


@pytest.mark.parametrize("key", EXECUTION_KEYS)
async def test_each_execution_key_is_kept_where_it_shows_and_nothing_else_may_differ(
    workspace: Path, key: str
) -> None:
    shows = WHERE_SHOWN[key]
    assert not set(shows.fingerprint) & {"device_name", "torch_version", "python_version"}
    base_fp = RUNTIME
    cand_fp = _changed(RUNTIME, shows.fingerprint)
    topology = {"per_device": True} if key in TOPOLOGY else {}

    def side(step_ms: float, seed: int, value: int, fp: dict[str, Any]) -> str:
        return window(
            workspace,
            step_ms,
            seed=seed,
            execution={key: value},
            command=["python", "train.py", f"--{key}", str(value)],
            fp=fp,
        )

    base = side(20, 1, 1, base_fp)
    async with Client(_server(workspace)) as client:
        exp = await _open(client, key)
        cand = side(10, 2, 2, cand_fp)
        honest = await _compare(client, base, cand, [key], **topology)
        assert honest["status"] == "comparable", honest["reasons"]
        assert {d["field"] for d in honest["differences"] if d["kind"] == "measured"} == {
            f"measured.{f}" for f in shows.fingerprint
        }
        gate = await _same_environment(client, exp, honest["evidence_id"])
        assert gate["status"] == "passed", gate
        for field in shows.fingerprint:
            assert field in gate["reason"]

        # the same change with one more difference the key does not set: refused there, naming it
        elsewhere = "cudnn_benchmark" if key == "threads" else "num_threads"
        sneaky = side(10, 3, 2, _changed(cand_fp, [elsewhere]))
        out = await _compare(client, base, sneaky, [key], **topology)
        assert out["status"] == "incomparable"
        assert any(r.startswith(f"measured.{elsewhere} differs") for r in out["reasons"]), out["reasons"]
        gate = await _same_environment(client, exp, out["evidence_id"])
        assert gate["status"] == "failed"
        assert gate["reason"].startswith(f"windows ran in different environments (differs in {elsewhere})")
        owner = entries_showing("fingerprint", elsewhere)[0]
        assert f"re-run the candidate with the baseline's {elsewhere}" in gate["satisfy_with"]
        assert f"declared_changes=[{owner!r}]" in gate["satisfy_with"]


def _server(workspace: Path) -> Any:
    from perfgate.server import build_server
    from perfgate.serving.runtime import ServerConfig

    return build_server(ServerConfig.create(workspace))


async def test_a_code_change_leaves_the_environment_as_it_was(workspace: Path) -> None:
    base = window(workspace, 20, seed=1, fp=RUNTIME, files={"train.py": "1" * 64})
    async with Client(_server(workspace)) as client:
        exp = await _open(client, "code")
        # the edit also set torch's threads: declared as code, the thread count is still a difference
        cand = window(workspace, 10, seed=2, fp={**RUNTIME, "num_threads": "2"}, files={"train.py": "2" * 64})
        out = await _compare(client, base, cand, ["code"])
        assert out["status"] == "incomparable"
        assert any(r.startswith("measured.num_threads differs ('4' vs '2')") for r in out["reasons"])
        gate = await _same_environment(client, exp, out["evidence_id"])
    assert gate["status"] == "failed"
    assert (
        "differs in num_threads" in gate["reason"]
        and "declared change (code) does not set it" in gate["reason"]
    )
    assert "changed_variable='threads'" in gate["satisfy_with"]


async def test_a_declared_key_is_no_exemption_for_a_field_it_does_not_set(workspace: Path) -> None:
    # threads declared and changed where it shows, but the candidate also ran on another torch build and
    # without deterministic algorithms: nothing declarable explains those, so only a re-run does
    base = window(workspace, 20, seed=1, fp=RUNTIME, execution={"threads": 4})
    other = {**_changed(RUNTIME, ["torch_version", "deterministic_algorithms"]), "num_threads": "2"}
    async with Client(_server(workspace)) as client:
        exp = await _open(client, "threads")
        cand = window(workspace, 10, seed=2, fp=other, execution={"threads": 2})
        out = await _compare(client, base, cand, ["threads"])
        gate = await _same_environment(client, exp, out["evidence_id"])
    assert out["status"] == "incomparable"
    assert gate["status"] == "failed"
    assert gate["reason"].startswith(
        "windows ran in different environments (differs in deterministic_algorithms, torch_version)"
    )
    assert "explained by the declared change: num_threads '4' -> '2' (threads)" in gate["reason"]
    assert gate["satisfy_with"].startswith("re-run baseline and candidate windows on the same machine")
    # a fingerprint field is not declarable by its own name, in the comparison or at keep
    for name in ("torch_version", "deterministic_algorithms", "device_name"):
        assert explains([name], "fingerprint", name) is None


async def test_a_declaration_that_is_not_the_experiments_change_exempts_nothing(workspace: Path) -> None:
    ev = Evidence(workspace)
    base = [ev.window(fp=RUNTIME) for _ in range(3)]
    async with Client(_server(workspace)) as client:
        exp = await _open(client, "num_workers")
        cand = [ev.window(fp={**RUNTIME, "num_threads": "2"}) for _ in range(3)]
        comparison = ev.comparison(base, cand, declared=["workers", "threads"])
        gate = await _same_environment(client, exp, comparison)
    assert gate["status"] == "failed"
    assert "differs in num_threads" in gate["reason"] and "declared change (workers)" in gate["reason"]


async def test_one_side_is_one_environment_whatever_was_declared(workspace: Path) -> None:
    ev = Evidence(workspace)
    base = [ev.window(fp={**RUNTIME, "num_threads": n}) for n in ("4", "4", "3")]
    async with Client(_server(workspace)) as client:
        exp = await _open(client, "threads")
        cand = [ev.window(fp={**RUNTIME, "num_threads": "2"}) for _ in range(3)]
        gate = await _same_environment(client, exp, ev.comparison(base, cand, declared=["threads"]))
    assert gate["status"] == "failed"
    assert gate["reason"].startswith(
        "the baseline windows ran in different environments (differs in num_threads)"
    )


async def test_a_precision_switch_differs_only_in_a_training_change(workspace: Path) -> None:
    ev = Evidence(workspace)
    base = [ev.window(fp=RUNTIME) for _ in range(3)]
    async with Client(_server(workspace)) as client:
        gates: dict[str, dict[str, Any]] = {}
        for classification in ("system_optimization", "training_change"):
            exp = await _open(client, "allow_tf32", classification)
            cand = [ev.window(fp={**RUNTIME, "allow_tf32": "True"}) for _ in range(3)]
            gates[classification] = await _same_environment(
                client, exp, ev.comparison(base, cand, declared=["precision"])
            )
    assert gates["system_optimization"]["status"] == "failed"
    assert "precision is semantic" in gates["system_optimization"]["reason"]
    assert gates["training_change"]["status"] == "passed", gates["training_change"]


async def test_a_variable_declared_by_name_covers_what_it_sets_in_torch(workspace: Path) -> None:
    base = window(workspace, 20, seed=1, fp=RUNTIME, env={"OMP_NUM_THREADS": "4"})
    set_two = {**RUNTIME, "OMP_NUM_THREADS": "2", "num_threads": "2"}
    async with Client(_server(workspace)) as client:
        exp = await _open(client, "OMP_NUM_THREADS")
        cand = window(workspace, 10, seed=2, fp=set_two, env={"OMP_NUM_THREADS": "2"})
        out = await _compare(client, base, cand, ["env:OMP_NUM_THREADS"])
        assert out["status"] == "comparable", out["reasons"]
        gate = await _same_environment(client, exp, out["evidence_id"])
        assert gate["status"] == "passed", gate
        # the variable names itself and torch's count, not another variable of the same entry
        mkl = window(
            workspace, 10, seed=3, fp={**set_two, "MKL_NUM_THREADS": "2"}, env={"OMP_NUM_THREADS": "2"}
        )
        out = await _compare(client, base, mkl, ["env:OMP_NUM_THREADS"])
        assert any(r.startswith("measured.MKL_NUM_THREADS differs") for r in out["reasons"]), out["reasons"]


async def test_the_command_line_changes_only_the_declared_setting(workspace: Path) -> None:
    base = window(workspace, 20, seed=1, command=["python", "train.py", "--batch", "8"])
    async with Client(_server(workspace)) as client:
        # nanoGPT's --compile=True, declared as compile and shown only on the command line: it happened
        compiled = window(
            workspace, 10, seed=2, command=["python", "train.py", "--batch", "8", "--compile=True"]
        )
        out = await _compare(client, base, compiled, ["compile"])
        assert out["status"] == "comparable", out["reasons"]
        # a second option riding along with the declared one is refused, naming it and what it sets
        for extra, named in (
            (["--num-workers", "4"], "--num_workers sets 'workers'"),
            (["--fast"], "--fast"),
        ):
            both = window(
                workspace,
                10,
                seed=3,
                command=["python", "train.py", "--batch", "8", "--compile=True", *extra],
            )
            out = await _compare(client, base, both, ["compile"])
            assert out["status"] == "incomparable"
            (argv,) = [d for d in out["differences"] if d["field"] == "argv"]
            assert argv["classification"] == "undeclared" and named in argv["note"], argv
        # another script is not a setting at all: declare 'argv' (or 'code') for it
        other = window(
            workspace, 10, seed=4, command=["python", "train2.py", "--batch", "8", "--compile=True"]
        )
        out = await _compare(client, base, other, ["compile"])
        (argv,) = [d for d in out["differences"] if d["field"] == "argv"]
        assert argv["classification"] == "undeclared" and "positional arguments" in argv["note"]
        assert (await _compare(client, base, other, ["compile", "argv"]))["status"] == "comparable"


# --- the case, end to end: a nanoGPT-shaped CPU run, threads 1 -> 2 ----------------------------

TRAIN = """
import torch
from torch import nn
torch.manual_seed(0)
block, vocab, width = 16, 64, 32
data = torch.randint(0, vocab, (4096,))
class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln, self.attn, self.mlp = nn.LayerNorm(width), nn.Linear(width, 3 * width), nn.Linear(width, width)
    def forward(self, x):
        q, k, v = self.attn(self.ln(x)).split(width, dim=2)
        x = x + torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return x + self.mlp(x)
class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte, self.h, self.head = nn.Embedding(vocab, width), Block(), nn.Linear(width, vocab)
    def forward(self, idx, targets):
        logits = self.head(self.h(self.wte(idx)))
        return nn.functional.cross_entropy(logits.view(-1, vocab), targets.view(-1))
model = GPT()
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
def get_batch():
    ix = torch.randint(len(data) - block - 1, (8,))
    return torch.stack([data[i : i + block] for i in ix]), torch.stack([data[i + 1 : i + 1 + block] for i in ix])
for iter_num in range(100000):
    X, Y = get_batch()
    loss = model(X, Y)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
"""


@pytest.mark.slow
async def test_a_declared_thread_change_of_a_real_cpu_run_passes_same_environment(workspace: Path) -> None:
    from _trust import operator_policy

    (workspace / "train.py").write_text(TRAIN)
    rules = "".join(
        f'\n[[execution.allow]]\nargv = {json.dumps(p)}\ncode = "any"\nenv = ["OMP_NUM_THREADS"]\n'
        for p in ([sys.executable, "-m", "perfgate.harness"], [sys.executable, "train.py"])
    )
    operator_policy("[execution]\n" + rules)
    contract = {
        "invariants": {
            "model": "gpt-tiny",
            "dataset": "random-tokens",
            "precision": "fp32",
            "global_batch": 8,
        }
    }

    async def run(threads: int) -> dict[str, Any]:
        result = await client.call_tool(
            "run_benchmark_window",
            {
                "command": [sys.executable, "train.py"],
                "env": {"OMP_NUM_THREADS": str(threads)},
                "warmup_steps": 2,
                "measure_steps": 5,
                "repeats": 1,
                "timeout_s": 180,
                "contract": {**contract, "execution": {"threads": threads}},
            },
        )
        assert result.structured_content is not None, _text(result)
        out = result.structured_content
        assert out["state"] == "executed", out
        return out

    async with Client(_server(workspace)) as client:
        base = await run(1)
        exp = await _open(client, "threads")
        cand = await run(2)
        measured = {
            k: (base["environment_fingerprint"][k], cand["environment_fingerprint"][k])
            for k in ("OMP_NUM_THREADS", "num_threads")
        }
        assert measured == {"OMP_NUM_THREADS": ("1", "2"), "num_threads": ("1", "2")}
        compared = await _compare(client, base["evidence_id"], cand["evidence_id"], ["threads"])
        assert compared["status"] == "comparable", compared["reasons"]
        gate = await _same_environment(client, exp, compared["evidence_id"])
        assert gate["status"] == "passed", gate
        assert "num_threads '1' -> '2' (threads)" in gate["reason"]
        # the keep itself: refused, if at all, only for evidence this test does not supply (tensors, launches)
        decided = await client.call_tool(
            "record_decision",
            {
                "action": "decide",
                "experiment_id": exp,
                "decision": "keep",
                "rationale": "two threads",
                "rollback": "OMP_NUM_THREADS=1",
                "evidence": [{"id": compared["evidence_id"], "role": "comparison"}],
                "fewer_windows_reason": "a CPU test run",
            },
        )
    unmet = re.search(r"gate\(s\) unmet \(([^)]*)\)", _text(decided))
    assert unmet is not None, _text(decided)
    assert "same_environment" not in unmet.group(1).split(", ") and "environment" in unmet.group(1)
