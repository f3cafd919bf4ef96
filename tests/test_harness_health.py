"""Training health recorded by the harness: per-step loss read at window edges, NaN losses, AMP skips."""

from __future__ import annotations

from typing import Any

import pytest

from perfgate.harness import HarnessConfig, Window, hooks

torch = pytest.importorskip("torch")


def _train(
    w: Window, steps: int, *, nan_at: int | None = None, inf_grad_at: int | None = None, scaler: Any = None
) -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(16, 4), torch.randn(16, 1)
    for step in range(steps):
        loss = torch.nn.functional.mse_loss(model(x), y)
        if step == nan_at:
            loss = loss * float("nan")
        if scaler is None:
            loss.backward()
            opt.step()
        else:
            scaled = scaler.scale(loss)
            if step == inf_grad_at:
                (scaled * float("inf")).backward()  # an overflow in the gradients: the update is skipped
            else:
                scaled.backward()
            scaler.step(opt)
            scaler.update()
        opt.zero_grad(set_to_none=True)


def _window(**kw: Any) -> Window:
    hooks.install_optimizer_hook()
    return Window(config=HarnessConfig(**{"warmup_steps": 2, "measure_steps": 6, **kw}), _optimizer_mode=True)


def test_losses_are_recorded_per_step_and_a_nan_is_found() -> None:
    with _window() as w:
        _train(w, 9, nan_at=5)
    (win,) = w.to_record()["windows"]
    assert (win["first_step"], win["last_step"]) == (2, 7)
    assert len(win["loss"]) == 6
    assert win["nonfinite_loss_steps"] == [5, 6, 7]  # the NaN update poisoned the weights
    assert win["loss"][5 - 2] is None
    finite = [v for v in win["loss"] if v is not None]
    assert finite == sorted(finite, reverse=True)  # plain SGD on a fixed batch: the loss falls


def test_the_loss_is_not_read_before_the_window_edge(monkeypatch: pytest.MonkeyPatch) -> None:
    reads: list[int] = []
    original = torch.Tensor.item

    def counting_item(self: Any) -> Any:
        reads.append(1)
        return original(self)

    monkeypatch.setattr(torch.Tensor, "item", counting_item)
    with _window(measure_steps=4) as w:
        _train(w, 6)
    assert reads == []  # the values come back in one transfer (.cpu()) at the edge, never per step
    assert len(w.to_record()["windows"][0]["loss"]) == 4


def test_an_amp_overflow_is_a_skipped_step_with_a_scale_drop() -> None:
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    with _window() as w:
        _train(w, 10, scaler=scaler, inf_grad_at=4)
    (win,) = w.to_record()["windows"]
    assert win["skipped_steps"] == [[4, 1]]  # the overflow merged into the step that ended next
    assert win["loss_scale_start"] == 1024.0
    assert win["loss_scale_end"] == 512.0
    assert win["nonfinite_loss_steps"] == []
    assert all(v is not None and v < 10 for v in win["loss"])  # unscaled losses, not loss x 1024
