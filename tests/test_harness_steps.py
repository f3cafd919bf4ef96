"""Step boundaries as training loops mark them, on real tiny CPU runs under the zero-code-change launcher:
manual updates with no optimizer, a Trainer-style loop with an optimizer of its own class and accumulation,
the one-line marker, and a launch stopped because it finds no step (`perfgate.harness.steps`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from perfgate.benchmarking.windows.collect import no_step_failure

pytestmark = pytest.mark.slow
pytest.importorskip("torch")

REPO = Path(__file__).resolve().parents[1]

# A word-level language model's loop as public examples write it: sequence-first batches cut from one long
# tensor, no optimizer object, the update by hand after clipping, gradients cleared at the top of the loop.
MANUAL_LOOP = """
import sys, torch
torch.manual_seed(0)
class RNNModel(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = torch.nn.Embedding(50, 16)
        self.rnn = torch.nn.LSTM(16, 16)
        self.decoder = torch.nn.Linear(16, 50)
    def forward(self, x):
        out, _ = self.rnn(self.encoder(x))
        return self.decoder(out)
model = RNNModel()
data = torch.randint(0, 50, (400, 4))  # (tokens, batch)
criterion = torch.nn.CrossEntropyLoss()
for i in range(int(sys.argv[1])):
    j = (i * 7) % 390
    x, y = data[j:j + 7], data[j + 1:j + 8]
    model.zero_grad()
    loss = criterion(model(x).view(-1, 50), y.reshape(-1))
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 0.25)
    for p in model.parameters():
        p.data.add_(p.grad, alpha=-0.5)
    print("update", i, flush=True)
"""


def _run(
    tmp: Path, script: str, args: list[str], opts: list[str], env: dict[str, str] | None = None
) -> tuple[subprocess.CompletedProcess[str], Path]:
    path = tmp / "train.py"
    path.write_text(textwrap.dedent(script))
    records = tmp / "records"
    argv = [
        sys.executable,
        "-m",
        "perfgate.harness",
        "--record-dir",
        str(records),
        *opts,
        "--",
        str(path),
        *args,
    ]
    full = {k: v for k, v in os.environ.items() if not k.startswith("PERFGATE_")}
    full.update({"OMP_NUM_THREADS": "1", **(env or {})})
    out = subprocess.run(argv, cwd=tmp, env=full, capture_output=True, text=True, timeout=180)
    return out, records


def _record(records: Path) -> dict[str, Any]:
    return json.loads((records / "rank0.json").read_text())


def test_a_manual_update_loop_without_an_optimizer_is_timed_step_by_step(tmp_path: Path) -> None:
    out, records = _run(tmp_path, MANUAL_LOOP, ["100000"], ["--warmup-steps", "2", "--measure-steps", "5"])
    assert out.returncode == 0, out.stderr
    rec = _record(records)
    # one boundary per update, none per backward or per clip: the script stopped after 7 updates, and the 7th
    # update's own line printed before the 8th forward where it was stopped
    assert rec["complete"] and rec["stop_reason"] == "window_complete"
    assert rec["step_source"] == "gradients"
    assert rec["steps"]["count"] == out.stdout.count("update") == 7
    assert rec["windows"][0]["backward_calls"] == 5


# The same loop writing, right after update 3 (its ``step``), what the capture names: its parameters, and its
# gradients after clipping; ``zero_in_place`` clears them as ``grad.zero_()`` would, not by ``zero_grad()``.
SELF_DUMP = """
    if i + 1 == 3:
        from perfgate.harness import dump_tensors
        named = list(model.named_parameters())
        dump_tensors("self.safetensors", {**dict(named), **{f"grad/{n}": q.grad for n, q in named}})
"""


@pytest.mark.parametrize("zero_in_place", [False, True])
def test_a_capture_at_a_manual_update_is_what_the_script_would_dump(
    tmp_path: Path, zero_in_place: bool
) -> None:
    from safetensors.torch import load_file

    script = MANUAL_LOOP.replace('    print("update", i, flush=True)\n', SELF_DUMP)
    if zero_in_place:
        script = script.replace(
            "    model.zero_grad()\n",
            "    for q in model.parameters():\n        q.grad is None or q.grad.zero_()\n",
        )
    capture = {
        "PERFGATE_CAPTURE_STEP": "3",
        "PERFGATE_CAPTURE_WHAT": "parameters,gradients",
        "PERFGATE_CAPTURE_PATH": "captured.safetensors",
    }
    out, records = _run(tmp_path, script, ["12"], ["--warmup-steps", "5", "--measure-steps", "5"], capture)
    assert out.returncode == 0, out.stderr
    notes = " ".join(_record(records).get("notes", []))
    if zero_in_place:
        # the step's gradients are zeros by the time the step ends: said, not written as the step's
        assert not (tmp_path / "captured.safetensors").exists()
        assert "zeroed its gradients in place" in notes, notes
        return
    own, script_dump = load_file(tmp_path / "captured.safetensors"), load_file(tmp_path / "self.safetensors")
    assert set(own) == set(script_dump) and any(k.startswith("grad/") for k in own), sorted(own)
    assert all(own[k].equal(script_dump[k]) for k in own), notes


TRAINER_LOOP = """
import sys, torch
from torch.utils.data import DataLoader, TensorDataset

class SignSGD:  # an optimizer of its own class, as some frameworks ship: not a torch.optim.Optimizer
    def __init__(self, params, lr):
        self.param_groups = [{"params": list(params), "lr": lr}]
    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            torch._foreach_add_(params, [p.grad.sign() for p in params], alpha=-group["lr"])
    def zero_grad(self):
        for group in self.param_groups:
            for p in group["params"]:
                p.grad = None

class Module(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    def forward(self, x):
        return self.net(x)
    def training_step(self, batch):
        x, y = batch
        return torch.nn.functional.mse_loss(self(x), y)

class Trainer:
    def __init__(self, accumulate):
        self.accumulate = accumulate
    def fit(self, module, loader, max_updates):
        opt, updates = SignSGD(module.parameters(), 1e-3), 0
        while True:
            for i, batch in enumerate(loader):
                loss = module.training_step(batch) / self.accumulate
                loss.backward()
                if (i + 1) % self.accumulate == 0:
                    opt.step()
                    opt.zero_grad()
                    updates += 1
                    print("update", updates, flush=True)
                    if updates == max_updates:
                        return

data = TensorDataset(torch.randn(256, 8), torch.randn(256, 1))
Trainer(accumulate=2).fit(Module(), DataLoader(data, batch_size=8), int(sys.argv[1]))
"""


def test_a_trainer_style_loop_with_its_own_optimizer_class_counts_accumulated_updates(tmp_path: Path) -> None:
    out, records = _run(tmp_path, TRAINER_LOOP, ["100000"], ["--warmup-steps", "2", "--measure-steps", "4"])
    assert out.returncode == 0, out.stderr
    rec = _record(records)
    assert rec["step_source"] == "gradients" and rec["complete"]
    assert rec["steps"]["count"] == out.stdout.count("update") == 6
    (window,) = rec["windows"]
    assert window["backward_calls"] == 2 * 4  # two micro-batches per update, one step
    measured = slice(rec["steps"]["warmup"], None)
    assert rec["steps"]["model_samples"][measured] == [16] * 4
    assert rec["steps"]["samples"][measured] == [16] * 4


OPTIMIZER_AND_MARKER = """
import sys, torch
import perfgate.harness
model = torch.nn.Linear(8, 1)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
for i in range(int(sys.argv[1])):
    for micro in range(2):
        model(torch.randn(4, 8)).sum().backward()
    opt.step()
    opt.zero_grad()
    print("update", i, flush=True)
    perfgate.harness.step()
"""


def test_the_one_line_marker_takes_over_from_an_optimizer_without_counting_an_update_twice(
    tmp_path: Path,
) -> None:
    out, records = _run(
        tmp_path, OPTIMIZER_AND_MARKER, ["100000"], ["--warmup-steps", "2", "--measure-steps", "4"]
    )
    assert out.returncode == 0, out.stderr
    rec = _record(records)
    assert rec["step_source"] == "explicit"
    assert rec["steps"]["count"] == out.stdout.count("update") == 6
    assert rec["windows"][0]["backward_calls"] == 8


def test_the_marker_does_nothing_outside_the_harness() -> None:
    import perfgate.harness

    assert perfgate.harness.step() is False


NO_BACKWARD = """
import torch
model = torch.nn.Linear(8, 8)
while True:  # forwards with gradients on, never a backward: nothing marks a step
    model(torch.randn(4, 8))
"""


def test_a_launch_that_finds_no_step_stops_early_and_names_the_line_to_add(tmp_path: Path) -> None:
    out, records = _run(tmp_path, NO_BACKWARD, [], [], env={"PERFGATE_NO_STEP_S": "1"})
    assert out.returncode == 3, out.stderr
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("[perfgate] no training step found in the 1 s after training began")
    assert "perfgate.harness.step()" in last and "torch.optim optimizer steps" in last
    rec = _record(records)
    assert rec["stop_reason"] == "no_step_found" and rec["steps"]["count"] == 0
    assert rec["step_source"] is None
    # what the window run answers for this launch: the record's reason, not the exit status
    why = no_step_failure(records)
    assert why is not None and why.startswith("rank 0: no training step found") and "backward()" in why
