"""Issue 45 item 3: checkpoint compatibility as evidence.

A layout or checkpointing change must show that its checkpoints still resume: the candidate runs once as a
whole job (its torch.save calls observed, with the step each ran at), then once more with its resume option
and ``resume_of``. The server finds in the resumed launch's record which file it loaded, aligns its steps on
the step that file was saved at, and compares the loss there with the uninterrupted run's; the keep's
``checkpoint_resume`` gate reads that. Real tiny CPU training (tests/fixtures/ckpt_train.py): an honest resume
passes; one that ignores its checkpoint, one that restores the weights but not Adam's state, and one of the
baseline's windows instead of the candidate's are refused. Where both runs captured tensors at the same
training step, the resume check pairs the two files and the gate reads a tensor check of exactly those:
a match strengthens it, a mismatch (Adam's state not restored, the loss still equal) refuses the keep.
A code change falls under the gate when its own changed lines call a checkpoint saver or loader (issue 57:
an unchanged saving line of a changed file no longer counts; tests/test_checkpoint_state.py has the saved
state's side).
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from mcp import Client

from _trust import any_code_rules, operator_policy
from perfgate.benchmarking.reading.records import read_record
from perfgate.benchmarking.runs.checkpoint_resume import check_resume
from perfgate.decisions.checkpoint_code import checkpoint_calls
from perfgate.server import build_server
from perfgate.serving.runtime import ServerConfig
from test_record_decision import Evidence, _shown_gate, _text

pytestmark = pytest.mark.anyio

PY = sys.executable
SCRIPT = (Path(__file__).parent / "fixtures" / "ckpt_train.py").read_text()
CONTRACT = {"invariants": {"model": "mlp", "dataset": "synthetic", "precision": "fp32", "global_batch": 32}}


def _harness(cwd: Path, rec: str, *args: str) -> Any:
    """train.py under the harness as a whole job; rank 0's record."""
    done = subprocess.run(
        [
            *(PY, "-m", "perfgate.harness", "--warmup-steps", "2", "--measure-steps", "4"),
            *("--record-dir", rec, "--", "train.py", *args),
        ],
        cwd=cwd,
        env={**os.environ, "PERFGATE_JOB": "1"},
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr
    return read_record(cwd / rec / "rank0.json")


def test_the_harness_lists_the_files_a_job_saves_and_loads(tmp_path: Path) -> None:
    """Each torch.save names its file and the step in progress; torch.load before the first step is step 0.
    The check over those records alone: the honest resume matches, the faulty ones are named."""
    (tmp_path / "train.py").write_text(SCRIPT)
    whole = _harness(tmp_path, "whole")
    assert whole.job is not None
    saves = [(f.op, f.step, f.path) for f in whole.job.checkpoint_files]
    assert saves == [("save", s, str(tmp_path / "ckpt" / f"step{s}.pt")) for s in (8, 16, 24)]
    resumed = _harness(tmp_path, "resumed", "--resume", "ckpt/step8.pt")
    assert resumed.job is not None and resumed.steps.count == 16
    assert next((f.op, f.step) for f in resumed.job.checkpoint_files) == ("load", 0)

    def judged(record: Any) -> Any:
        return check_resume([whole], [record], resume_of="w", workspace=tmp_path)

    honest = judged(resumed)
    assert honest.status == "passed" and honest.resumed_from_step == 8, honest
    assert honest.loaded == ["ckpt/step8.pt"] and honest.steps_compared == 16 and honest.steps_apart == 0
    scratch = judged(_harness(tmp_path, "scratch", "--resume", "ckpt/step8.pt", "--ignore-resume"))
    assert scratch.status == "failed" and "loaded no checkpoint" in scratch.reason, scratch
    fresh = judged(_harness(tmp_path, "fresh", "--resume", "ckpt/step8.pt", "--fresh-optimizer"))
    assert fresh.status == "failed" and fresh.reason.startswith("the loss diverges"), fresh
    assert fresh.steps_apart > 0 and "first: step 9" in fresh.reason  # step 8 itself still matches
    # a file the uninterrupted run never wrote: no alignment is guessed
    (tmp_path / "other.pt").write_bytes((tmp_path / "ckpt" / "step8.pt").read_bytes())
    foreign = judged(_harness(tmp_path, "foreign", "--resume", "other.pt"))
    assert foreign.status == "failed" and "never saved" in foreign.reason, foreign


@pytest.fixture
def ws(workspace: Path) -> Path:
    operator_policy("[execution]\n" + any_code_rules([PY, "train.py"]))
    (workspace / "train.py").write_text(SCRIPT)
    return workspace


async def _window(client: Client, args: list[str], resume_of: str | None = None) -> dict[str, Any]:
    """A job=true launch of train.py whose windows hold a few steps (see `_run`)."""
    extra = {} if resume_of is None else {"resume_of": resume_of}
    return await _run(client, args, warmup_steps=2, measure_steps=4, **extra)


async def _gate(client: Client, exp: str, comparison: str) -> dict[str, Any]:
    return await _shown_gate(client, exp, comparison, "checkpoint_resume")


async def _open(client: Client, changed: str, **extra: Any) -> str:
    opened = await client.call_tool(
        "record_decision",
        {
            "action": "open",
            "hypothesis": "h",
            "classification": "system_optimization",
            "changed_variable": changed,
            **extra,
        },
    )
    assert opened.structured_content is not None, _text(opened)
    return opened.structured_content["experiment_id"]


@pytest.mark.timeout(900)
async def test_a_layout_change_keeps_only_with_a_resume_of_its_own_checkpoint(ws: Path) -> None:
    ev = Evidence(ws)
    resume = ["--resume", "ckpt/step8.pt"]
    async with Client(build_server(ServerConfig.create(ws))) as client:
        base = await _window(client, ["--shards", "1"])
        exp = await _open(client, "tensor_parallel")
        other = await _open(client, "workers")
        cand = await _window(client, ["--shards", "2"])
        comp = ev.comparison([base["evidence_id"]], [cand["evidence_id"]], declared=["tensor_parallel"])

        missing = await _gate(client, exp, comp)
        assert missing["status"] == "failed" and "no resume launch" in missing["reason"], missing
        assert f"resume_of={cand['evidence_id']!r}" in missing["satisfy_with"]
        assert "'--shards', '2', '<resume option>'" in missing["satisfy_with"]
        assert (await _gate(client, other, comp))["status"] == "not_applicable"

        # refused before anything runs: no job, another command, a resume of a resume
        for call, said in (
            ({"resume_of": cand["evidence_id"]}, "resume_of needs job=true"),
            (
                {"resume_of": cand["evidence_id"], "job": True, "command": [PY, "train.py", "--shards", "1"]},
                "with its resume option added at the end",
            ),
        ):
            refused = await client.call_tool(
                "run_benchmark_window", {"command": [PY, "train.py", "--shards", "2", *resume], **call}
            )
            assert refused.is_error and said in _text(refused), _text(refused)

        # the baseline's checkpoint resumes, which says nothing of the candidate's layout
        of_base = await _window(client, ["--shards", "1", *resume], resume_of=base["evidence_id"])
        assert of_base["checkpoint_resume"]["status"] == "passed", of_base["checkpoint_resume"]
        gate = await _gate(client, exp, comp)
        assert gate["status"] == "failed" and "resumed the baseline's windows" in gate["reason"], gate

        # a resume that takes the option and starts from scratch
        scratch = await _window(client, ["--shards", "2", *resume, "--ignore-resume"], cand["evidence_id"])
        assert scratch["summary"].startswith(
            "checkpoint resume failed: the resumed launch loaded no checkpoint"
        )
        gate = await _gate(client, exp, comp)
        assert gate["status"] == "failed" and "loaded no checkpoint" in gate["reason"], gate

        # the weights restored, Adam's moments not: the loss drifts from the first update on
        fresh = await _window(client, ["--shards", "2", *resume, "--fresh-optimizer"], cand["evidence_id"])
        assert fresh["checkpoint_resume"]["resumed_from_step"] == 8
        gate = await _gate(client, exp, comp)
        assert gate["status"] == "failed" and "the loss diverges" in gate["reason"], gate

        honest = await _window(client, ["--shards", "2", *resume], cand["evidence_id"])
        check = honest["checkpoint_resume"]
        assert check["status"] == "passed" and check["loaded"] == ["ckpt/step8.pt"], check
        gate = await _gate(client, exp, comp)
        assert gate["status"] == "passed" and honest["evidence_id"] in gate["evidence_ids"], gate


async def _run(client: Client, args: list[str], **extra: Any) -> dict[str, Any]:
    """One job=true launch of train.py with the given inputs (a label, a capture, resume_of)."""
    call: dict[str, Any] = {
        "command": [PY, "train.py", *args],
        "warmup_steps": 0,
        "measure_steps": 1,
        "repeats": 1,
        "job": True,
        "timeout_s": 180,
        "contract": CONTRACT,
        **extra,
    }
    result = await client.call_tool("run_benchmark_window", call)
    out = result.structured_content
    assert out is not None and out["state"] == "executed", _text(result)
    return out


async def _compare(client: Client, pair: dict[str, Any], exp: str) -> dict[str, Any]:
    result = await client.call_tool(
        "compare_tensors",
        {
            "reference": pair["reference"],
            "candidate": pair["candidate"],
            "atol": 1e-5,
            "rtol": 1.3e-6,
            "experiment_id": exp,
        },
    )
    assert result.structured_content is not None, _text(result)
    return result.structured_content


@pytest.mark.timeout(900)
async def test_the_tensors_at_a_resumed_step_are_compared_and_gate_the_keep(ws: Path) -> None:
    """The uninterrupted candidate captures at step 9; a resume from the step-8 checkpoint captures at its
    own step 1, the same training step. The resume check names that pair; compare_tensors of it passes for
    the honest resume and the gate says so; the resume that drops Adam's state trains one step, whose
    loss (computed before the update) still matches, while the parameters after it differ: refused."""
    ev = Evidence(ws)
    what = ["parameters", "optimizer_state"]
    async with Client(build_server(ServerConfig.create(ws))) as client:
        base = await _run(client, ["--shards", "1"], label="base")
        exp = await _open(client, "tensor_parallel", tolerance={"atol": 1e-5, "rtol": 1.3e-6})
        cand = await _run(client, ["--shards", "2"], label="cand", capture={"step": 9, "what": what})
        comp = ev.comparison([base["evidence_id"]], [cand["evidence_id"]], declared=["tensor_parallel"])
        resume = ["--shards", "2", "--resume", "ckpt/step8.pt"]

        # no capture on the resume launch: the gate passes on the loss and says how to compare tensors
        bare = await _run(client, resume, label="bare", resume_of=cand["evidence_id"])
        check = bare["checkpoint_resume"]
        assert check["status"] == "passed" and check["tensors"] is None, check
        assert "capture={'step': 1}" in check["reason"], check["reason"]
        gate = await _gate(client, exp, comp)
        assert gate["status"] == "passed" and "the tensors were not compared" in gate["reason"], gate

        honest = await _run(
            client, resume, label="resumed", capture={"step": 1, "what": what}, resume_of=cand["evidence_id"]
        )
        pair = honest["checkpoint_resume"]["tensors"]
        assert pair is not None, honest["checkpoint_resume"]
        # each launch's capture is its own file, named by its label and launch (captures/{label}-{launch})
        assert pair["step"] == 9, pair
        assert re.fullmatch(r"captures/cand-\d+\.safetensors", pair["reference"]), pair
        assert re.fullmatch(r"captures/resumed-\d+\.safetensors", pair["candidate"]), pair
        gate = await _gate(client, exp, comp)
        assert gate["status"] == "passed", gate
        assert (
            "were not compared" in gate["reason"]
            and "compare_tensors(reference='captures/cand" in gate["reason"]
        )
        checked = await _compare(client, pair, exp)
        assert checked["state"] == "passed", checked["summary"]
        gate = await _gate(client, exp, comp)
        assert gate["status"] == "passed" and "match too" in gate["reason"], gate
        assert checked["evidence_id"] in gate["evidence_ids"]

        # Adam's moments not restored, one step trained: the loss agrees, the tensors after it do not
        fresh = await _run(
            client,
            [*resume, "--fresh-optimizer", "--iters", "9"],
            label="fresh",
            capture={"step": 1, "what": what},
            resume_of=cand["evidence_id"],
        )
        check = fresh["checkpoint_resume"]
        assert check["status"] == "passed" and check["steps_compared"] == 1, check
        gate = await _gate(client, exp, comp)
        assert gate["status"] == "passed" and "were not compared" in gate["reason"], gate
        differ = await _compare(client, check["tensors"], exp)
        assert differ["state"] == "failed" and differ["status"] == "mismatch", differ["summary"]
        gate = await _gate(client, exp, comp)
        assert gate["status"] == "failed", gate
        assert "the tensors at step 9 differ after the resume" in gate["reason"], gate
        assert differ["evidence_id"] in gate["evidence_ids"] and "elements beyond atol" in gate["reason"]
        assert "restore everything the checkpoint should carry" in gate["satisfy_with"]

        # the same faulty resume launched again, its capture left uncompared: the failure still binds
        await _run(
            client,
            [*resume, "--fresh-optimizer", "--iters", "9"],
            label="fresh",
            capture={"step": 1, "what": what},
            resume_of=cand["evidence_id"],
        )
        gate = await _gate(client, exp, comp)
        assert gate["status"] == "failed", gate
        assert "an earlier launch of this same resume (same command and code) failed" in gate["reason"], gate
        assert differ["evidence_id"] in gate["evidence_ids"]


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


async def test_a_code_change_falls_under_the_gate_when_a_file_it_touched_saves_or_loads(ws: Path) -> None:
    """Read from the files, not from what the experiment is called: a change of train.py (which calls
    torch.save and torch.load) needs a resume; one of model.py's forward alone does not, a checkpoint call
    in a comment included; a file edited after the candidate ran cannot be read as it ran, so it counts."""
    model = (
        "import torch\n\n\ndef forward(x):\n    return torch.tanh(x)  # torch.save(x, 'no.pt') is a comment\n"
    )
    (ws / "model.py").write_text(model)
    ev = Evidence(ws)

    def window(**files: str) -> str:
        return ev.window(provenance={"argv": ["python", "train.py"], "cwd": ".", "code": {}, "files": files})

    async with Client(build_server(ServerConfig.create(ws))) as client:
        exp = await _open(client, "fused forward")
        old = "import torch\n# the old script\n"
        base = window(**{"train.py": _sha(old), "model.py": _sha(model)})
        cand = window(**{"train.py": _sha(SCRIPT), "model.py": _sha(model)})
        gate = await _gate(client, exp, ev.comparison([base], [cand], declared=["code"]))
        assert gate["status"] == "failed", gate
        assert (
            "the code change may touch checkpointing: train.py (calls torch.load, torch.save; which of its lines "
            "changed cannot be read" in gate["reason"]
        ), gate
        assert "no resume launch" in gate["reason"] and "resume_of" in gate["satisfy_with"]
        assert "measure each side once with job=true" in gate["satisfy_with"], gate

        base = window(**{"train.py": _sha(SCRIPT), "model.py": _sha("def forward(x):\n    return x\n")})
        cand = window(**{"train.py": _sha(SCRIPT), "model.py": _sha(model)})
        gate = await _gate(client, exp, ev.comparison([base], [cand], declared=["code"]))
        assert gate["status"] == "not_applicable", gate
        assert "its changed lines save or load no checkpoint" in gate["reason"]

        # the candidate ran a model.py that saved; the file was rewritten since: what ran cannot be read
        cand = window(**{"train.py": _sha(SCRIPT), "model.py": _sha(model + "torch.save(1, 'x.pt')\n")})
        gate = await _gate(client, exp, ev.comparison([base], [cand], declared=["code"]))
        assert gate["status"] == "failed" and "model.py (changed since the candidate ran" in gate["reason"], (
            gate
        )


def _commit(ws: Path, files: dict[str, str], message: str) -> str:
    """Write ``files`` into the workspace's git repository and commit them; the new commit's id."""
    for name, text in files.items():
        (ws / name).write_text(text)
    git = ["git", "-C", str(ws), "-c", "user.name=t", "-c", "user.email=t@example.com"]
    if not (ws / ".git").exists():
        subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", *files], check=True)
    subprocess.run([*git, "commit", "-q", "-m", message], check=True)
    return subprocess.run(
        [*git, "rev-parse", "HEAD"], check=True, capture_output=True, text=True
    ).stdout.strip()


async def test_a_change_committed_between_the_runs_is_read_at_both_commits(ws: Path) -> None:
    """The agent commits its change, so no diff records it: the files changed between the two sides' commits
    are read at each commit. A committed edit of a helper the command never names (it now saves the
    optimizer state) needs a resume; a committed change of the forward alone does not; a commit the
    repository no longer holds cannot be read, so it counts."""
    first = _commit(
        ws,
        {"ckpt_utils.py": "def save(state, path):\n    pass\n", "model.py": "def f(x):\n    return x\n"},
        "a",
    )
    forward = _commit(ws, {"model.py": "def f(x):\n    return 2 * x\n"}, "forward")
    saving = _commit(
        ws, {"ckpt_utils.py": "import torch\n\n\ndef save(state, path):\n    torch.save(state, path)\n"}, "b"
    )
    ev = Evidence(ws)

    def window(commit: str) -> str:
        files = {"train.py": _sha("x")}
        return ev.window(
            provenance={
                "argv": ["python", "train.py"],
                "cwd": ".",
                "code": {"commit": commit},
                "files": files,
            }
        )

    async with Client(build_server(ServerConfig.create(ws))) as client:
        exp = await _open(client, "helper refactor")
        gate = await _gate(client, exp, ev.comparison([window(forward)], [window(saving)], declared=["code"]))
        assert gate["status"] == "failed", gate
        assert (
            f"ckpt_utils.py (changed between commits {forward[:12]} and {saving[:12]}; its changed lines call "
            "torch.save)" in (gate["reason"])
        ), gate
        gate = await _gate(client, exp, ev.comparison([window(first)], [window(forward)], declared=["code"]))
        assert gate["status"] == "not_applicable", gate
        gone = "0123456789abcdef" * 2 + "01234567"
        gate = await _gate(client, exp, ev.comparison([window(first)], [window(gone)], declared=["code"]))
        assert gate["status"] == "failed", gate
        assert (
            f"commit '{gone[:12]}' is not in the workspace's git repository: it cannot be read"
            in gate["reason"]
        )
        # one side recorded no commit (run outside git): what changed cannot be listed, so it counts
        gate = await _gate(client, exp, ev.comparison([window(first)], [window("")], declared=["code"]))
        assert gate["status"] == "failed", gate
        assert "one side ran outside git: it cannot be read" in gate["reason"], gate


async def test_a_file_the_diff_touched_is_read_by_its_changed_lines(ws: Path) -> None:
    """A helper the command never names, changed by the candidate's uncommitted diff in a line that saves
    nothing, while another of its lines (unchanged) saves the optimizer: the unchanged saving line is not
    enough to ask for a resume (issue 57; before, it was). A diff whose changed line saves still is."""
    helper = "import torch\n\n\ndef lr(step):\n    return 0.1\n\n\ndef save(state, path):\n    torch.save(state, path)\n"
    commit = _commit(ws, {"helper.py": helper}, "helper")
    section = (
        b"diff --git a/helper.py b/helper.py\n--- a/helper.py\n+++ b/helper.py\n@@ -4,2 +4,2 @@\n"
        b" def lr(step):\n-    return 0.1\n+    return 0.2\n"
    )
    (ws / "helper.py").write_text(
        helper.replace("0.1", "0.2").replace("    torch.save(state, path)\n", "    pass\n")
    )
    ev = Evidence(ws)
    files = {"train.py": _sha("x")}

    def window(diff: bytes | None) -> str:
        code: dict[str, Any] = {"commit": commit}
        if diff is not None:
            code |= {"diff_files": {"helper.py": _sha(diff.decode())}, "diff_artifact": "code.diff"}
        provenance = {"argv": ["python", "train.py"], "cwd": ".", "code": code, "files": files}
        return ev.window(provenance=provenance, artifacts={"code.diff": diff} if diff is not None else None)

    saving = (
        b"diff --git a/helper.py b/helper.py\n--- a/helper.py\n+++ b/helper.py\n@@ -9,1 +9,1 @@\n"
        b"-    torch.save(state, path)\n+    torch.save(state, path + '.tmp')\n"
    )
    async with Client(build_server(ServerConfig.create(ws))) as client:
        exp = await _open(client, "learning rate helper")
        gate = await _gate(client, exp, ev.comparison([window(None)], [window(section)], declared=["code"]))
        assert gate["status"] == "not_applicable", gate
        # both sides' diffs change the lr line alike; only the candidate's also changes the save
        both = ev.comparison(
            [window(section)],
            [
                window(
                    section
                    + saving[len(b"diff --git a/helper.py b/helper.py\n--- a/helper.py\n+++ b/helper.py\n") :]
                )
            ],
            declared=["code"],
        )
        gate = await _gate(client, exp, both)
    assert gate["status"] == "failed", gate
    assert "own lines touch checkpointing: helper.py (its changed lines call torch.save)" in gate["reason"], (
        gate
    )


async def test_a_change_of_the_number_of_ranks_needs_a_resume(ws: Path) -> None:
    ev = Evidence(ws)
    async with Client(build_server(ServerConfig.create(ws))) as client:
        exp = await _open(client, "world_size 2 -> 4")
        gate = await _gate(client, exp, ev.comparison([ev.window()], [ev.window()], declared=["world_size"]))
    assert gate["status"] == "failed" and "parallel layout (world_size)" in gate["reason"], gate


def test_checkpoint_calls_are_read_from_code_not_from_comments_or_imports() -> None:
    text = (
        "from safetensors.torch import save_file\n"
        "import torch.distributed.checkpoint as dcp\n"
        "# torch.save(model, 'old.pt') was here\n"
        "save_file(state, 'model.safetensors')\n"
        "dcp.load(state, checkpoint_id='ckpt')\n"
        "step = load_checkpoint (path)\n"
    )
    assert checkpoint_calls(text) == [
        "torch.distributed.checkpoint",
        "save_file",
        "dcp.load",
        "load_checkpoint",
    ]
    section = "diff --git a/t.py b/t.py\n@@ -1,2 +1,2 @@\n-    y = torch.zeros(1)\n+    torch.save(m, p)\n"
    assert checkpoint_calls(section, diff=True) == ["torch.save"]
    assert checkpoint_calls("def forward(x):\n    return x.load_state_dict  # torch.load(\n") == []


async def test_a_resume_of_other_code_is_no_resume(ws: Path) -> None:
    """The script is edited between the uninterrupted run and the resume (a way around the loss check the
    issue did not name: make the resumed launch reproduce the losses whatever the checkpoint holds): the
    resume check fails on the code it ran, before it looks at a loss."""
    async with Client(build_server(ServerConfig.create(ws))) as client:
        cand = await _run(client, ["--shards", "2"])
        with (ws / "train.py").open("a") as fh:
            fh.write("\n# edited after the uninterrupted run\n")
        resumed = await _run(
            client, ["--shards", "2", "--resume", "ckpt/step8.pt"], resume_of=cand["evidence_id"]
        )
    check = resumed["checkpoint_resume"]
    assert check["status"] == "failed", check
    assert check["reason"].startswith(f"the resumed launch ran other code than {cand['evidence_id']}"), check
    assert "train.py" in check["reason"] or "diff" in check["reason"], check["reason"]
