"""A stopping harness ends the script where its next step's work starts, not at the last boundary: the last
measured step's own output (its log line) runs, and nothing after the record lands in a window (issue 47)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from perfgate.harness import HarnessConfig, Window, WindowComplete, hooks
from perfgate.harness import window as window_mod
from perfgate.harness.record import record_path

torch = pytest.importorskip("torch")


class _Clock:
    def __init__(self) -> None:
        self.ns = 1_000_000_000

    def __call__(self) -> int:
        return self.ns


@pytest.mark.parametrize("next_work", ["evaluation_forward", "batch_fetch", "checkpoint", "step_scope"])
def test_the_script_ends_where_its_next_step_starts(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, next_work: str
) -> None:
    clock = _Clock()
    monkeypatch.setattr(window_mod, "_now", clock)
    # the forward probe is installed once per process: an earlier test's model must not be the one it knows
    monkeypatch.setattr(hooks, "_forward_probed", False)
    monkeypatch.setattr(hooks, "_forward_probe", [])
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.ones(64, 4)), batch_size=4)
    cfg = HarnessConfig(warmup_steps=1, measure_steps=2, record_dir=str(tmp_path / "rec"))
    w = Window(config=cfg, stop=True)
    printed: list[int] = []
    reached: list[str] = []

    def begin_next_step() -> None:
        if next_work == "evaluation_forward":
            with torch.no_grad():
                model(torch.ones(2, 4))
        elif next_work == "batch_fetch":
            next(iter(data))
        elif next_work == "checkpoint":
            torch.save(model.state_dict(), tmp_path / f"ckpt-{len(printed)}.pt")
        if w.done:
            reached.append(next_work)

    def train_step() -> None:
        model(torch.ones(4, 4)).sum().backward()
        opt.step()
        clock.ns += 10_000_000

    def run_loop() -> None:
        for step in range(100):
            if next_work == "step_scope":
                with w.step():
                    train_step()
            else:
                begin_next_step()
                train_step()
                w.mark_step()
            printed.append(step)  # the job's own log line of this step
            clock.ns += 5_000_000_000  # work after it (an evaluation, say): in no measured step

    try:
        with pytest.raises(WindowComplete):
            run_loop()
    finally:
        w.close()
    record: dict[str, Any] = json.loads(record_path(tmp_path / "rec", 0).read_text())
    steps = record["steps"]["count"]
    assert w.done and reached == [] and printed == list(range(steps))  # the last step's line printed
    if next_work == "checkpoint":  # the checkpoint before the last measured step was written, the next not
        assert (tmp_path / f"ckpt-{steps - 1}.pt").exists() and not (tmp_path / f"ckpt-{steps}.pt").exists()
    (win, *_) = record["windows"]
    # each measured step is its own 10 ms plus the 5 s after the previous line: the post-window 5 s is in none
    assert record["steps"]["step_time_ns"][-1] == 5_010_000_000
    assert sum(w_["elapsed_ns"] for w_ in record["windows"]) == 5_010_000_000 * sum(
        w_["steps"] for w_ in record["windows"]
    )
    assert win["first_step"] == 1


def test_a_window_that_does_not_stop_lets_the_script_run_on(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(window_mod, "_now", _Clock())
    model = torch.nn.Linear(4, 2)
    w = Window(config=HarnessConfig(warmup_steps=0, measure_steps=1), stop=False)
    try:
        for _ in range(10):
            model(torch.ones(2, 4))
            w.mark_step()
    finally:
        w.close()
    assert w.done
