"""Secrets a run reports through the harness are stored and shown nowhere raw (issue 58 item 3).

A real tiny CPU job plants tokens where the training script, not the command line, puts them: a metric
name (``report_metric``), a checkpoint path (``torch.save``, read by the harness under ``job=true``), the
saved state's keys (a module named after a token) and tensor keys (``dump_tensors``, two keys holding two
different tokens). The ledger's bytes, every artifact, every tool answer, the report and the export are
searched for the raw tokens; the scrubbed keys stay usable: the two tensor keys stay two keys, and
compare_tensors pairs the baseline's and the candidate's by them.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

import pytest
from mcp import Client

from _trust import any_code_rules, operator_policy
from perfgate.benchmarking.reading.records import decode_record
from perfgate.security.scrubber import Scrubber
from perfgate.server import build_server
from perfgate.serving.runtime import ServerConfig

pytestmark = pytest.mark.anyio

PY = sys.executable
GITHUB = "ghp_aB3dE5fG7hJ9kL1mN3pQ5rS7tU9vW1xY3zA5"  # a known credential format
RANDOM = "Xq7vR2mK9pLw4NzT8bYc3HdF"  # found by entropy
OTHER = "Tn5kW8qZr2Lm7XpB4vCy9JdG"
SECRETS = {"github": GITHUB, "random": RANDOM, "other": OTHER}
SCRIPT = f"""\
import os

import torch

import perfgate.harness as h

torch.manual_seed(0)
torch.set_num_threads(1)
model = torch.nn.Sequential()
model.add_module("{RANDOM}", torch.nn.Linear(8, 16))
model.add_module("head", torch.nn.Linear(16, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for it in range(12):
    x = torch.randn(16, 8, generator=torch.Generator().manual_seed(it))
    loss = model(x).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
h.report_metric("eval/{GITHUB}", 0.5)
os.makedirs("ckpt/{GITHUB}", exist_ok=True)
torch.save(model.state_dict(), "ckpt/{GITHUB}/final.pt")
x = torch.ones(4, 8)
h.dump_tensors(
    "captures/{{label}}.safetensors",
    {{"act.{RANDOM}.out": model(x).detach(), "act.{OTHER}.out": model[0](x).detach()}},
)
"""


def _leaks(text: str) -> list[str]:
    return [name for name, value in SECRETS.items() if value in text]


def _files_leaking(root: Path) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for path in root.rglob("*"):
        if path.is_file() and (leaks := _leaks(path.read_bytes().decode("utf-8", errors="replace"))):
            found[str(path.relative_to(root))] = leaks
    return found


def _text(result: Any) -> str:
    return " ".join(getattr(c, "text", "") for c in result.content) + json.dumps(result.structured_content)


@pytest.mark.timeout(600)
async def test_tokens_in_a_metric_name_a_checkpoint_path_and_tensor_keys_are_kept_nowhere(
    workspace: Path, tmp_path: Path
) -> None:
    operator_policy("[execution]\n" + any_code_rules([PY, "train.py"]))
    (workspace / "train.py").write_text(SCRIPT)
    answers: list[str] = []
    async with Client(build_server(ServerConfig.create(workspace))) as client:
        windows: dict[str, dict[str, Any]] = {}
        for label in ("base", "cand"):
            result = await client.call_tool(
                "run_benchmark_window",
                {
                    "command": [PY, "train.py"],
                    "warmup_steps": 2,
                    "measure_steps": 4,
                    "repeats": 1,
                    "job": True,
                    "label": label,
                    "timeout_s": 180,
                    "contract": {"invariants": {"model": "mlp"}},
                },
            )
            out: dict[str, Any] = result.structured_content or {}
            assert out.get("state") == "executed", _text(result)
            answers.append(_text(result))
            windows[label] = out
        # The saved state was read (its keys scrubbed, the save still seen), the two runs' states agree.
        (state,) = windows["base"]["saved_states"]
        assert state["saves"] == 1
        assert any(e[0].startswith("<redacted:high-entropy:") for e in state["entries"]), state
        assert [s["digest"] for s in windows["cand"]["saved_states"]] == [state["digest"]]
        compared = await client.call_tool(
            "compare_tensors",
            {
                "reference": "captures/base.safetensors",
                "candidate": "captures/cand.safetensors",
                "atol": 0.0,
                "rtol": 0.0,
            },
        )
        answers.append(_text(compared))
        got: dict[str, Any] = compared.structured_content or {}
        assert got.get("status") == "match" and got.get("tensors_total") == 2, _text(compared)
        opened = await client.call_tool(
            "record_decision",
            {
                "action": "open",
                "hypothesis": "h",
                "classification": "system_optimization",
                "changed_variable": "x",
            },
        )
        opened_out: dict[str, Any] = opened.structured_content or {}
        exp_id = str(opened_out["experiment_id"])
    # Both secret-bearing tensor keys are compared, as two keys, each named by its own placeholder.
    (comparison,) = (workspace / ".perfgate").rglob(f"*{got['evidence_id']}*/comparison.json")
    shown = comparison.read_text()
    keys = set(re.findall(r"act\.<redacted:high-entropy:[0-9a-f]{8}>\.out", shown))
    assert len(keys) == 2, shown[:2000]
    # The launch records kept as artifacts decode, with the metric and the checkpoint path scrubbed.
    (record_path,) = (workspace / a for a in windows["base"]["artifacts"] if a.endswith("launch0_rank0.json"))
    record = decode_record(record_path.read_bytes(), record_path)
    assert list(record.metrics) == [Scrubber().text(f"eval/{GITHUB}")]
    assert next(iter(record.metrics)).startswith("eval/<redacted:github-token:")
    assert record.job is not None
    (saved,) = record.job.checkpoint_files
    assert saved.path.endswith(Scrubber().text(f"/ckpt/{GITHUB}/final.pt")), saved
    from perfgate.cli import main as cli_main

    assert cli_main(["report", "all", "--workspace", str(workspace)]) == 0
    assert cli_main(["export", exp_id, str(tmp_path / "export"), "--workspace", str(workspace)]) == 0
    assert [a for a in answers if _leaks(a)] == []
    assert _files_leaking(workspace / ".perfgate") == {}
    assert _files_leaking(tmp_path / "export") == {}
