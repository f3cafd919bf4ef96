"""Step boundaries where no ``torch.optim.Optimizer`` marks them: the gradient rule, and the one-line marker.

A training step consumes the gradients ``backward()`` produced: a torch optimizer does (its global step hook
marks the boundary, `perfgate.harness.hooks`), or the script's own update does (``p.data.add_(p.grad,
alpha=-lr)`` under ``no_grad``, an optimizer of another class, a framework's wrapper), after which the
gradients are cleared before the next step's ``backward()`` writes new ones.

**The gradient rule** watches one leaf tensor the first ``backward()`` reaches (found in its autograd graph,
so it works with or without modules): after each ``backward()`` its gradient is noted (the object and its
version counter). At the next forward of the top-level module, or the next ``backward()``, a gradient that
was set to None (``zero_grad()``), replaced, or changed in place (``grad.zero_()``) means the step ended
there. Gradient accumulation (N backward passes into the same gradients, cleared once) is one step. Any
torch optimizer step or GradScaler step in between owns that update, so the rule marks nothing for it; once
a torch optimizer has stepped the rule stands down for the rest of the process, and once the script calls
`step` that marker alone delimits steps (`perfgate.harness.window.Window.boundary`).

Not covered: gradients cleared through ``.data`` (``p.grad.data.zero_()`` has its own version counter; a
later ``zero_grad()`` or ``set_to_none`` is seen), gradients taken with ``torch.autograd.grad`` (no
``.grad`` is written), and in-place changes of the gradients between micro-batches of one accumulated step
(each reads as a step). Those loops add ``perfgate.harness.step()`` at the end of each iteration.

A tensor capture at a step the rule ends (`perfgate.harness.capture.on_manual_update`) needs that step's
gradients after the update, when the loop has already cleared them: after each ``backward()`` of the step
to capture, the rule holds the module's gradient tensors, which ``zero_grad()`` detaches intact.
"""

from __future__ import annotations

import weakref
from collections import deque
from typing import Any, cast

from perfgate.harness import capture
from perfgate.harness._state import ActiveWindow

__all__ = [
    "LOOKED_FOR",
    "after_backward",
    "before_backward",
    "before_forward",
    "stand_down",
    "update_ran",
    "watch",
    "watching",
]

LOOKED_FOR = (
    "torch.optim optimizer steps, gradients that backward() wrote and the script then cleared or replaced "
    "(a manual update), and perfgate.harness.step() calls"
)
"""What the harness counts as a step boundary, in the words its answers use."""
_GRAPH_NODES = 10_000
"""Autograd nodes searched for a leaf at the first backward(): a bound on the one-time search."""

_leaf: weakref.ref[Any] | None = None
_grad: weakref.ref[Any] | None = None
_grad_version = 0
_pending = False
"""A backward() wrote gradients that no step has consumed yet."""
_held: dict[str, Any] = {}
"""The module's gradients after the last backward() of the step a capture wants, by parameter name."""
_stood_down = False
"""A torch optimizer delimits the active window's steps: the rule watches nothing more (`stand_down`)."""


def before_backward(window: ActiveWindow, tensors: Any) -> None:
    """A ``backward()`` starts: a step ends here if the previous one's gradients were consumed; the watched
    leaf is found in ``tensors``' graph when none is watched."""
    global _leaf
    _check(window)
    if _leaf is None or _leaf() is None:
        leaf = _find_leaf(tensors)
        _leaf = None if leaf is None else weakref.ref(leaf)


def after_backward(window: ActiveWindow) -> None:
    """A ``backward()`` returned: note the watched leaf's gradient (and hold the module's, for a capture of
    the step in progress)."""
    global _grad, _grad_version, _pending, _leaf, _held
    _held = capture.gradients_for(window)
    leaf = _leaf() if _leaf is not None else None
    grad = getattr(leaf, "grad", None)
    if grad is None:
        _leaf, _pending = None, False  # not reached this time: find another at the next backward()
        return
    _grad = weakref.ref(grad)
    _grad_version = int(grad._version)
    _pending = True


def before_forward(window: ActiveWindow) -> None:
    """A forward of the top-level module starts: a step ends here if the gradients were consumed."""
    _check(window)


def watching() -> bool:
    """Whether the rule still looks for boundaries (the backward hook skips it, and its cost, when not)."""
    return not _stood_down


def stand_down() -> None:
    """A torch optimizer stepped as the window's step source: a gradient boundary could never count again
    (`perfgate.harness.window.Window.boundary`), so the rule stops watching until another window activates."""
    global _stood_down, _pending, _held
    _stood_down, _pending, _held = True, False, {}


def watch() -> None:
    """A window activates: the rule watches again (its step source is not known yet)."""
    global _stood_down
    _stood_down = False


def update_ran() -> None:
    """A torch optimizer or a GradScaler stepped: that update consumed the gradients, not the rule's."""
    global _pending
    _pending = False


def _check(window: ActiveWindow) -> None:
    global _pending, _held
    if not _pending:
        return
    leaf = _leaf() if _leaf is not None else None
    if leaf is None:
        _pending = False
        return
    grad = leaf.grad
    if grad is None or _grad is None or grad is not _grad() or int(grad._version) != _grad_version:
        _pending = False
        window.boundary("gradients")
        capture.on_manual_update(window, _held)
        _held = {}


def _find_leaf(tensors: Any) -> Any:
    """A leaf tensor that requires grad in the graph of ``tensors`` (the first ``backward()`` argument), by a
    bounded breadth-first search; None when there is none."""
    roots: list[Any] = list(cast("list[Any]", tensors)) if isinstance(tensors, (list, tuple)) else [tensors]
    queue: deque[Any] = deque(fn for t in roots if (fn := getattr(t, "grad_fn", None)) is not None)
    seen: set[int] = set()
    while queue and len(seen) < _GRAPH_NODES:
        fn = queue.popleft()
        if id(fn) in seen:
            continue
        seen.add(id(fn))
        variable = getattr(fn, "variable", None)  # an AccumulateGrad node holds its leaf
        if variable is not None:
            return variable
        queue.extend(nxt for nxt, _ in getattr(fn, "next_functions", ()) if nxt is not None)
    return None
