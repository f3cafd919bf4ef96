"""Issue 57 item 2: a candidate is what ran that matters.

Real tiny CPU runs through the MCP tools. Windows of one candidate measured in several calls pool into one
candidate (the launches per call are sample size, not the measurement boundary), and an option whose value
is a path the run itself wrote (a tensor dump, observed written) is no setting. Around it: calls that differ
in a real setting (an environment variable, a config file the run only reads) are still a screen that names
what differs, and a moved boundary is still refused.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from mcp import Client

from _trust import operator_policy
from perfgate.benchmarking.workload.outputs import argv_paths, written_outputs
from perfgate.server import build_server
from perfgate.serving.runtime import ServerConfig
from test_job_phases import PY

pytestmark = pytest.mark.anyio

SCRIPT = """
import argparse, os, time
import torch
import perfgate.harness
p = argparse.ArgumentParser()
p.add_argument("--dump", default=None)
p.add_argument("--config", default=None)
args = p.parse_args()
if args.config:
    open(args.config).read()  # read, never written
torch.manual_seed(0)
step_sleep = float(os.environ.get("STEP_SLEEP", "0.01"))
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x, y = torch.randn(32, 16), torch.randn(32, 1)
for it in range(200):
    loss = torch.nn.functional.mse_loss(model(x), y)
    opt.zero_grad()
    loss.backward()
    time.sleep(step_sleep)
    opt.step()
    if it == 0 and args.dump:
        perfgate.harness.dump_tensors(args.dump, {k: v.detach() for k, v in model.state_dict().items()})
"""
CONTRACT = {"invariants": {"model": "mlp", "dataset": "random", "precision": "fp32", "global_batch": 32}}


@pytest.fixture
def ws(workspace: Path) -> Path:
    rules = "".join(
        f'\n[[execution.allow]]\nargv = {json.dumps(p)}\ncode = "any"\nenv = ["STEP_SLEEP", "EXTRA"]\n'
        for p in ([PY, "-m", "perfgate.harness"], [PY, "train.py"])
    )
    operator_policy("[execution]\n" + rules)
    (workspace / "train.py").write_text(SCRIPT)
    (workspace / "cfg_a.txt").write_text("a\n")
    (workspace / "cfg_b.txt").write_text("b\n")
    return workspace


async def _window(
    client: Client, args: list[str], sleep: str, repeats: int, extra: dict[str, str] | None = None
) -> dict[str, Any]:
    result = await client.call_tool(
        "run_benchmark_window",
        {
            "command": [PY, "train.py", *args],
            "env": {"STEP_SLEEP": sleep, **(extra or {})},
            "warmup_steps": 3,
            "measure_steps": 6,
            "repeats": repeats,
            "timeout_s": 180,
            "contract": CONTRACT,
        },
    )
    out = result.structured_content
    assert out is not None and out["state"] == "executed", result.content
    return out


async def _compare(client: Client, base: list[str], cand: list[str], declared: list[str]) -> dict[str, Any]:
    result = await client.call_tool(
        "compare_benchmarks", {"baseline": base, "candidate": cand, "declared_changes": declared}
    )
    assert result.structured_content is not None, result.content
    return result.structured_content


@pytest.mark.timeout(900)
async def test_windows_of_one_candidate_over_calls_pool_whatever_dump_path_each_call_wrote(ws: Path) -> None:
    async with Client(build_server(ServerConfig.create(ws))) as client:
        base = await _window(client, ["--dump", "captures/base.safetensors"], "0.03", 3)
        first = await _window(client, ["--dump", "captures/a.safetensors"], "0.01", 2)
        again = await _window(client, ["--dump", "captures/a.safetensors"], "0.01", 2)
        moved = await _window(client, ["--dump", "captures/b.safetensors"], "0.01", 2)
        # each run wrote its dump, observed: the output is named, and how it was written
        for out, path in ((base, "captures/base.safetensors"), (first, "captures/a.safetensors")):
            assert out["outputs"] == [
                {"option": "--dump", "value": path, "path": path, "seen": "tensor dump"}
            ], out["outputs"]
        # the second call found the first call's dump at its path: what split them as two candidates before
        assert "captures/a.safetensors" in again["provenance"]["files"]
        assert "captures/a.safetensors" not in first["provenance"]["files"]

        cands = [first["evidence_id"], again["evidence_id"], moved["evidence_id"]]
        out = await _compare(client, [base["evidence_id"]], cands, ["env:STEP_SLEEP"])
        assert out["status"] == "comparable" and out.get("screen") is None, out["reasons"] or out["caution"]
        assert (out["baseline_launches"], out["candidate_launches"]) == (3, 6)
        kinds = {d["kind"] for d in out["differences"]}
        assert "protocol" not in kinds and "argv" not in kinds and "file" not in kinds, out["differences"]
        # (the verdict is the host's to decide: a busy 2-core machine may call 3x within noise)

        opened = await client.call_tool(
            "record_decision",
            {
                "action": "open",
                "hypothesis": "less work per step",
                "classification": "system_optimization",
                "changed_variable": "env:STEP_SLEEP",
            },
        )
        assert opened.structured_content is not None, opened.content
        shown = await client.call_tool(
            "record_decision",
            {
                "action": "show",
                "experiment_id": opened.structured_content["experiment_id"],
                "evidence": [{"id": out["evidence_id"], "role": "comparison"}],
            },
        )
        assert shown.structured_content is not None, shown.content
        gates = {g["name"]: g for g in shown.structured_content["gates"]}
        assert "screened" not in gates["comparison"]["reason"], gates["comparison"]
        assert gates["validation_run"]["status"] != "failed", gates["validation_run"]


@pytest.mark.timeout(900)
async def test_calls_that_differ_in_a_real_setting_are_still_a_screen_that_says_what_differs(
    ws: Path,
) -> None:
    async with Client(build_server(ServerConfig.create(ws))) as client:
        base = (await _window(client, ["--config", "cfg_a.txt"], "0.03", 2))["evidence_id"]
        plain = await _window(client, ["--config", "cfg_a.txt"], "0.01", 2)
        other = await _window(client, ["--config", "cfg_b.txt"], "0.01", 2)
        extra = await _window(client, ["--config", "cfg_a.txt"], "0.01", 2, {"EXTRA": "1"})
        # a file the run only read is no output, whatever else it is
        assert plain["outputs"] == [] and other["outputs"] == []

        out = await _compare(client, [base], [plain["evidence_id"], other["evidence_id"]], ["env:STEP_SLEEP"])
        assert len(out["screen"]["entries"]) == 2, out["screen"]
        assert "argv --config" in out["screen"]["differs"], out["screen"]
        assert "they differ in argv --config" in out["caution"]

        out = await _compare(client, [base], [plain["evidence_id"], extra["evidence_id"]], ["env:STEP_SLEEP"])
        assert out["screen"]["differs"] == ["env.EXTRA"], out["screen"]

        # against the baseline, a config the run did not write is an undeclared setting
        out = await _compare(client, [base], [other["evidence_id"]], ["env:STEP_SLEEP"])
        assert out["status"] == "incomparable"
        assert any(r.startswith("argv differs") and "--config changed" in r for r in out["reasons"]), out[
            "reasons"
        ]


def test_an_option_counts_as_an_output_only_where_the_run_wrote_it(tmp_path: Path) -> None:
    """The server's stamps decide, not the option's name: a log the run appended to and an output folder it
    filled are outputs; a config it only read, a folder of code it wrote beside, and a harness report of a
    dump at a path that did not change are not."""
    (tmp_path / "run.log").write_text("")
    (tmp_path / "cfg.yaml").write_text("lr: 1\n")
    (tmp_path / "impl").mkdir()
    (tmp_path / "impl" / "fast.py").write_text("x = 1\n")
    argv = ["train.py", "--log", "run.log", "--out_dir", "out", "--config", "cfg.yaml", "--impl", "impl"]
    argv += ["--init", "init.pt"]
    (tmp_path / "init.pt").write_bytes(b"0")
    stamped = argv_paths(argv, tmp_path, tmp_path)
    with (tmp_path / "run.log").open("a") as f:
        f.write("step 1\n")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "ckpt.pt").write_bytes(b"1")
    (tmp_path / "impl" / "notes.txt").write_text("written beside code\n")
    found = written_outputs(
        stamped, [str(tmp_path / "init.pt")], [str(tmp_path / "out" / "ckpt.pt")], tmp_path
    )
    assert [(o.option, o.path, o.seen) for o in found] == [
        ("--log", "run.log", "changed on disk"),
        ("--out_dir", "out", "checkpoint save"),
    ]
