"""Tensor capture by the harness itself: the model's parameters, gradients and optimizer state at a chosen
step, written as ``dump_tensors`` would, with no line added to the training script.

The harness already sees what it needs: the optimizer step post-hook hands it the optimizer that delimits
steps (the first one to step), and the forward probe finds the top-level training module. Right after the
update that completes step ``capture_step`` (the moment a script would call ``dump_tensors`` after its
``optimizer.step()``), `on_optimizer_step` writes the file through `perfgate.harness.dump.dump_tensors`:
the same file format, the same entry in the record (path, digest, size, step), the same ``{label}``,
``{launch}`` and ``{rank}`` fields, and the same rule that a dump inside a measured window discards it.
A loop that updates by hand (no optimizer) has its step ended by the gradient rule (`perfgate.harness.steps`)
at the next forward or backward, after its gradients were cleared: `on_manual_update` writes the parameters
then and the gradients the rule held after the step's backward (their values after clipping and the update,
as an optimizer's capture sees them); a loop that zeroes its gradients in place leaves none to write, and
the record's notes say so.

Names: a parameter under its ``named_parameters()`` name (the module inside a ``torch.compile``, DDP or
DataParallel wrapper, so a wrapped and an unwrapped run name alike), its gradient as ``grad/<name>``, its
optimizer state as ``optimizer/<name>/<key>`` (``optimizer/group<g>.param<i>/<key>`` for a parameter the
module does not hold). When the module was not found (its forward never ran with gradients enabled at the
top level), parameters and gradients cannot be named and nothing is written; the record's notes say so,
and ``dump_tensors`` in the script is the way.
"""

from __future__ import annotations

import os
import re
import sys
from typing import Any

from perfgate.harness._state import ActiveWindow, current_module, unwrap

__all__ = ["capture_mapping", "gradients_for", "on_manual_update", "on_optimizer_step", "replica_digest"]

_first_optimizer: int | None = None
_done = False


def capture_mapping(
    module: Any, optimizer: Any, what: tuple[str, ...], grads: dict[str, Any] | None = None
) -> tuple[dict[str, Any], list[str]]:
    """The tensors to write, by name, and what could not be captured (empty when everything was).
    ``grads``: the gradients by parameter name where the parameters no longer hold them (a manual update)."""
    torch: Any = sys.modules["torch"]
    out: dict[str, Any] = {}
    missing: list[str] = []
    inner = None if module is None else unwrap(module)
    named: list[tuple[str, Any]] = [] if inner is None else list(inner.named_parameters())
    if inner is None and ("parameters" in what or "gradients" in what):
        missing.append(
            "no top-level training module was seen (no module with trainable parameters ran forward with "
            "gradients enabled outside another module)"
        )
    if "parameters" in what:
        out.update(named)
    if "gradients" in what and inner is not None:
        held = {f"grad/{n}": g for n, g in (grads or {n: p.grad for n, p in named}).items() if g is not None}
        if not held:
            missing.append("no parameter held a gradient after the optimizer step")
        out.update(held)
    if "optimizer_state" in what and optimizer is None:
        missing.append("no optimizer holds state: the loop updates its parameters by hand")
    elif "optimizer_state" in what:
        names = {id(p): n for n, p in named}
        before = len(out)
        for g, group in enumerate(optimizer.param_groups):
            for i, p in enumerate(group["params"]):
                owner = names.get(id(p), f"group{g}.param{i}")
                for key, value in optimizer.state.get(p, {}).items():
                    if isinstance(value, torch.Tensor):
                        out[f"optimizer/{owner}/{key}"] = value
        if len(out) == before:
            missing.append(f"the optimizer ({type(optimizer).__name__}) holds no tensor state")
    return out, missing


_RANKED = re.compile(r"\{rank\}")


def _path(template: str) -> str:
    """The path template; a multi-rank job whose template has no ``{rank}`` gets ``-rank{rank}`` before the
    suffix, so ranks never write one file."""
    world = os.environ.get("WORLD_SIZE", "1")
    if _RANKED.search(template) or not world.isdigit() or int(world) <= 1:
        return template
    root, ext = os.path.splitext(template)
    return f"{root}-rank{{rank}}{ext}"


def on_optimizer_step(window: ActiveWindow, optimizer: Any) -> None:
    """After the step boundary: write the capture once the first optimizer completes the chosen step."""
    global _first_optimizer, _done
    cfg = window.config
    step = cfg.capture_step
    if step is None or _done:
        return
    if _first_optimizer is None:
        _first_optimizer = id(optimizer)
    if id(optimizer) != _first_optimizer or window.steps_completed != step:
        return
    _done = True
    from perfgate.harness.dump import dump_tensors

    module = current_module()
    try:
        mapping, missing = capture_mapping(module, optimizer, cfg.capture_what)
        if missing:
            raise LookupError("; ".join(missing))
        dump_tensors(_path(cfg.capture_path), mapping)
    except Exception as exc:  # noqa: BLE001 -- a capture that cannot be made is noted, never fatal to training
        window.note(
            f"tensor capture at step {step} wrote nothing: {exc}. Call perfgate.harness.dump_tensors in the "
            "training script for what the harness cannot find"
        )


def gradients_for(window: ActiveWindow) -> dict[str, Any]:
    """The module's gradients by name when the step in progress is the one to capture and gradients are
    wanted; else empty (nothing is held)."""
    module = current_module()
    if _done or module is None or window.config.capture_step != window.steps_completed + 1:
        return {}
    if "gradients" not in window.config.capture_what:
        return {}
    return {n: p.grad for n, p in unwrap(module).named_parameters() if p.grad is not None}


def on_manual_update(window: ActiveWindow, grads: dict[str, Any]) -> None:
    """After a step the gradient rule ended (no optimizer): write the capture if it is the chosen step, with
    ``grads`` (held after its backward) as the gradients. Gradients still attached to the parameters were
    zeroed in place by the loop: not the step's, so they are not written."""
    global _done
    cfg = window.config
    step = cfg.capture_step
    if step is None or _done or _first_optimizer is not None or window.steps_completed != step:
        return
    _done = True
    from perfgate.harness.dump import dump_tensors

    module = current_module()
    attached = {id(p.grad) for p in unwrap(module).parameters()} if module is not None else set[int]()
    fresh = {n: g for n, g in grads.items() if id(g) not in attached}
    try:
        if "gradients" in cfg.capture_what and not fresh:
            raise LookupError(
                "the loop zeroed its gradients in place after its manual update, so the step's gradients "
                "are gone by the time the harness sees the step end (zero_grad() with set_to_none keeps them)"
            )
        mapping, missing = capture_mapping(module, None, cfg.capture_what, fresh)
        if missing:
            raise LookupError("; ".join(missing))
        dump_tensors(_path(cfg.capture_path), mapping)
    except Exception as exc:  # noqa: BLE001 -- a capture that cannot be made is noted, never fatal to training
        window.note(
            f"tensor capture at step {step} wrote nothing: {exc}. Call perfgate.harness.dump_tensors in the "
            "training script for what the harness cannot find"
        )


def replica_digest() -> str | None:
    """A cheap digest of the training module's parameters as they are now, for comparing data-parallel
    replicas across ranks (every rank applies the same update, so their copies must be bit-identical after
    it): per parameter, in name order, the float64 sum and sum of squares, computed where the parameter lives
    and read back in one transfer. Sharded parameters (DTensor) are left out; None when no module was found,
    it holds no plain parameter, or torch cannot compute it."""
    module = current_module()
    torch: Any = sys.modules.get("torch")
    if module is None or torch is None:
        return None
    import hashlib

    try:
        with torch.no_grad():
            parts = [
                torch.stack([t.sum(), t.square().sum()])
                for _, p in sorted(unwrap(module).named_parameters(), key=lambda kv: kv[0])
                if type(p.data).__name__ != "DTensor"
                for t in (p.detach().to(torch.float64),)
            ]
            if not parts:
                return None
            data = torch.cat(parts).cpu().numpy().tobytes()
    except (RuntimeError, TypeError, ValueError, AttributeError):
        return None
    return hashlib.blake2b(data, digest_size=16).hexdigest()
