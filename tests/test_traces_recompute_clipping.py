"""Activation-checkpoint recompute and gradient clipping get phases of their own, on CPU traces recorded
here from a tiny model that uses torch.utils.checkpoint and clip_grad_norm_ (and on the shared real
traces, where the phases must still partition the step)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from perfgate.traces import AnalysisOptions, analyze_trace, discover_trace_files
from perfgate.traces.analyses.phases import phase_of_name

pytest.importorskip("torch")

# Each session runs in its own process (a second profiler session in one process can crash on CPU);
# one session records one trace per variant, a cycle each.
_RECORD = r"""
import sys, warnings, torch
from torch.profiler import ProfilerActivity, profile, schedule
from torch.utils.checkpoint import checkpoint

out, with_stack = sys.argv[1], sys.argv[2] == "stack"
variants = ["non_reentrant", "reentrant", "plain"]
torch.manual_seed(0)


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.pre, self.a = torch.nn.Linear(64, 64), torch.nn.Linear(64, 256)
        self.b, self.head = torch.nn.Linear(256, 64), torch.nn.Linear(64, 1)
        self.mode = "plain"

    def block(self, x):
        return self.b(torch.relu(self.a(x)))

    def forward(self, x):
        h = self.pre(x)
        if self.mode == "plain":
            return self.head(self.block(h))
        return self.head(checkpoint(self.block, h, use_reentrant=self.mode == "reentrant"))


model = Net()
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x, y = torch.randn(32, 64), torch.randn(32, 1)
done = []


def save(prof):
    prof.export_chrome_trace(f"{out}/{variants[len(done)]}.json")
    done.append(1)


with warnings.catch_warnings():
    warnings.simplefilter("ignore", UserWarning)
    with profile(
        activities=[ProfilerActivity.CPU],
        schedule=schedule(wait=0, warmup=1, active=2, repeat=len(variants)),
        on_trace_ready=save,
        with_stack=with_stack,
    ) as prof:
        for i in range(3 * len(variants)):
            model.mode = variants[min(i // 3, len(variants) - 1)]
            loss = torch.nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            if model.mode != "plain":
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            prof.step()
assert len(done) == len(variants), done
"""


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out: dict[str, Path] = {}
    for stack in ("nostack", "stack"):
        folder = tmp_path_factory.mktemp(stack)
        subprocess.run([sys.executable, "-c", _RECORD, str(folder), stack], check=True, timeout=240)
        for path in folder.glob("*.json"):
            out[f"{path.stem}_{stack}"] = path
    return out


def _phases(path: Path) -> dict[str, float]:
    host = analyze_trace(path, AnalysisOptions()).host
    assert host is not None
    assert sum(ph.per_step_us for ph in host.phases) == pytest.approx(host.step_us, rel=1e-6)
    return {ph.phase: ph.per_step_us for ph in host.phases}


@pytest.mark.parametrize("stack", ["nostack", "stack"])
@pytest.mark.parametrize("variant", ["non_reentrant", "reentrant"])
def test_the_forward_a_checkpoint_runs_again_in_backward_is_recompute(
    recorded: dict[str, Path], variant: str, stack: str
) -> None:
    host = analyze_trace(recorded[f"{variant}_{stack}"], AnalysisOptions()).host
    assert host is not None
    phase = {ph.phase: ph for ph in host.phases}
    assert phase["recompute"].per_step_us > 0
    # The checkpointed block is Linear -> ReLU -> Linear: its ops run again, and are named (the top three
    # by self time; which three depends on the machine's timing, the matmul is always among them).
    top = phase["recompute"].top_events
    assert "aten::addmm" in top and set(top) <= {"aten::addmm", "aten::relu", "aten::linear", "aten::t"}
    assert phase["backward"].per_step_us > 0 and phase["forward"].per_step_us > 0


@pytest.mark.parametrize("stack", ["nostack", "stack"])
def test_clip_grad_norm_is_its_own_phase(recorded: dict[str, Path], stack: str) -> None:
    phases = _phases(recorded[f"non_reentrant_{stack}"])
    assert phases["grad_clipping"] > 0
    host = analyze_trace(recorded[f"non_reentrant_{stack}"], AnalysisOptions()).host
    assert host is not None
    top = next(ph.top_events for ph in host.phases if ph.phase == "grad_clipping")
    if stack == "stack":
        # With Python frames the whole clip counts (the norm and the scaling), named by its frames.
        assert any("torch/nn/utils/clip_grad.py(" in name for name in top), top
    else:
        assert top == ["aten::_foreach_norm"]


@pytest.mark.parametrize("stack", ["nostack", "stack"])
def test_a_step_without_checkpointing_or_clipping_has_neither_phase(
    recorded: dict[str, Path], stack: str
) -> None:
    phases = _phases(recorded[f"plain_{stack}"])
    assert phases["recompute"] == 0.0
    assert phases["grad_clipping"] == 0.0
    assert phases["backward"] > 0 and phases["forward"] > 0


def test_clipping_frames_and_ops_are_recognised_by_name() -> None:
    assert phase_of_name("torch/nn/utils/clip_grad.py(184): clip_grad_norm_") == "grad_clipping"
    assert phase_of_name("torch/nn/utils/clip_grad.py(250): clip_grad_value_") == "grad_clipping"
    assert (
        phase_of_name("torch/distributed/fsdp/fully_sharded_data_parallel.py(1100): clip_grad_norm_")
        == "grad_clipping"
    )
    assert phase_of_name("aten::_foreach_norm") == "grad_clipping"
    # A user's function of a similar name, or a norm that is not the clip's, is not clipping.
    assert phase_of_name("train.py(10): my_clip_grad_norm_helper") is None
    assert phase_of_name("aten::linalg_vector_norm") is None


def test_the_shared_real_traces_still_partition_their_steps_with_the_new_phases(hta_traces: Path) -> None:
    for path in discover_trace_files([hta_traces]):
        host = analyze_trace(path, AnalysisOptions()).host
        if host is None:
            continue
        phases = {ph.phase: ph.per_step_us for ph in host.phases}
        assert {"recompute", "grad_clipping"} <= set(phases), path.name
        assert sum(phases.values()) == pytest.approx(host.step_us, rel=1e-6), path.name
        # None of these jobs checkpoints activations: no grad-mode op runs inside their backward (their
        # C++ autograd nodes, torch::autograd::CppNode<...>, are backward, not recompute).
        assert phases["recompute"] == 0.0, path.name
