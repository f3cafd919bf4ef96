"""Which dumped tensors the training computes, found by value, whatever their names.

A tensor check proves only what its tensors were captured from. The input batch, the labels, a frozen
embedding table, or a copy of the weights taken before training acted match bit for bit whatever the
candidate computes; a check of those alone proves nothing about the change. Names cannot tell (a script
may call anything ``fc.weight``), but the harness shares the process with the training and can look at the
tensors themselves as ``dump_tensors`` writes them:

- ``parameter``: equal to a trainable parameter of the top-level training module, after at least one
  optimizer update of this process;
- ``gradient``: equal to a trainable parameter's ``.grad``;
- ``optimizer_state``: equal to a tensor of the first optimizer's state (more than one element: a step
  counter equals any other run's);
- ``loss``: a one-element tensor equal to one of the last losses backward ran from;
- ``autograd``: a tensor with autograd history (``grad_fn``): a loss or an activation not yet detached.

Equality is exact, on the dumped value converted to the reference's device and dtype (a float32 copy of a
bfloat16 parameter counts); a reference that holds one repeated number (an all-zero state) matches
nothing, since any run reproduces it. What matches none of these (inputs, labels, buffers, frozen weights,
stale copies, a detached activation) is counted as ``none``. The counts land in the dump's entry of the
run record (``computed``); the keep gates refuse a tensor check whose file holds nothing computed.
"""

from __future__ import annotations

import sys
import weakref
from collections import deque
from collections.abc import Mapping
from typing import Any

__all__ = ["KINDS", "classify", "saw_loss", "saw_optimizer"]

KINDS = ("parameter", "gradient", "optimizer_state", "loss", "autograd")
_PROBE = 8
"""Leading elements compared before a whole tensor (a cheap way past same-shaped layers)."""

_optimizer: weakref.ReferenceType[Any] | None = None
_losses: deque[Any] = deque(maxlen=4)


def saw_optimizer(optimizer: Any) -> None:
    """The optimizer post-hook's optimizer: the first one that steps is the training's (kept weakly)."""
    global _optimizer
    if _optimizer is None or _optimizer() is None:
        _optimizer = weakref.ref(optimizer)


def saw_loss(loss: Any) -> None:
    """A (detached) scalar backward ran from."""
    _losses.append(loss)


def _references(module: Any, updated: bool) -> list[tuple[str, Any]]:
    from perfgate.harness._state import unwrap

    named = [p for _, p in unwrap(module).named_parameters() if p.requires_grad]
    refs: list[tuple[str, Any]] = [("parameter", p.detach()) for p in named] if updated else []
    refs += [("gradient", p.grad.detach()) for p in named if p.grad is not None]
    optimizer = None if _optimizer is None else _optimizer()
    torch: Any = sys.modules["torch"]
    for state in getattr(optimizer, "state", {}).values():
        refs += [
            ("optimizer_state", v.detach())
            for v in state.values()
            if isinstance(v, torch.Tensor) and v.numel() > 1
        ]
    return refs


def _as_tensor(value: Any, torch: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value
    import warnings

    import numpy as np

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # a read-only array: nothing here writes to it
            return torch.from_numpy(np.ascontiguousarray(value))
    except (TypeError, ValueError):  # a numpy dtype torch does not take (bfloat16 from ml_dtypes)
        return None


def _equal(t: Any, ref: Any, torch: Any, *, constant: bool = False) -> bool:
    if t.data_ptr() == ref.data_ptr() and t.device == ref.device and t.dtype == ref.dtype:
        return True  # the tensor itself (or a detached view of it)
    flat, rflat = t.reshape(-1), ref.reshape(-1)
    head = rflat[:_PROBE].to(device=t.device, dtype=t.dtype)
    if not torch.equal(flat[:_PROBE], head):
        return False
    whole = ref.to(device=t.device, dtype=t.dtype)
    repeated = rflat.numel() > 1 and bool((rflat == rflat[0]).all())
    return bool(torch.equal(t, whole)) and (constant or not repeated)


def classify(mapping: Mapping[str, Any], module: Any, steps_completed: int) -> dict[str, int] | None:
    """How many of ``mapping``'s tensors are each kind the training computes (``none``: not one of them);
    None when it cannot be told (torch not loaded, or no top-level training module was seen)."""
    torch: Any = sys.modules.get("torch")
    if torch is None or module is None:
        return None
    by_shape: dict[tuple[int, ...], list[tuple[str, Any]]] = {}
    for kind, ref in _references(module, steps_completed >= 1):
        by_shape.setdefault(tuple(ref.shape), []).append((kind, ref))
    counts: dict[str, int] = {k: 0 for k in (*KINDS, "none")}
    with torch.no_grad():
        for value in mapping.values():
            t = _as_tensor(value, torch)
            kind = "none"
            if t is None:
                pass
            elif t.grad_fn is not None:
                kind = "autograd"
            elif t.numel() > 0:
                kind = next(
                    (k for k, ref in by_shape.get(tuple(t.shape), []) if _equal(t.detach(), ref, torch)),
                    "none",
                )
                if (
                    kind == "none"
                    and t.numel() == 1
                    and any(_equal(t.reshape(()), loss.reshape(()), torch, constant=True) for loss in _losses)
                ):
                    kind = "loss"
            counts[kind] += 1
    return {k: n for k, n in counts.items() if n}
