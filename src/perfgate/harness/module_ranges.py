"""Name every nn.Module call in a profiled run: a record_function range ``nn.Module: <qualified name> (<Class>)``.

torch.profiler's ``with_modules`` records the module hierarchy for TorchScript only; in eager mode the
Python tracer (``with_stack``) names module *instances* (``Linear_1``), not where they sit in the model.
These ranges carry the qualified name (``Net.blocks.3.mlp``) into any trace, stacks or not, so the
analysis (`perfgate.traces.analyses.code`) can say which module owns the time at stake.

Qualified names are learnt as modules are called: a module first seen with no known name is a root
(named by its class), and calling a module names its direct children ``parent.child``. Global forward
hooks do this only while the profiler records (`ModuleRanges.install` / `remove`); the post hook runs
even when forward raises (``always_call``), so ranges always close.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

__all__ = ["ModuleRanges"]


class ModuleRanges:
    """Global module forward hooks that open and close one profiler range per module call."""

    def __init__(self) -> None:
        self._names: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()
        self._named_children: weakref.WeakSet[Any] = weakref.WeakSet()
        self._local = threading.local()
        self._handles: list[Any] = []

    def install(self) -> None:
        from torch.nn.modules import module

        if self._handles:
            return
        try:
            post = module.register_module_forward_hook(self._exit, always_call=True)
        except TypeError:  # torch before 2.1: a forward that raises leaves its range to `remove`
            post = module.register_module_forward_hook(self._exit)
        self._handles = [module.register_module_forward_pre_hook(self._enter), post]

    def remove(self) -> None:
        """Remove the hooks and close the ranges this thread left open (a step that ended mid-forward)."""
        for handle in self._handles:
            handle.remove()
        self._handles = []
        stack: list[Any] = getattr(self._local, "stack", None) or []
        while stack:
            _close(stack.pop())

    def _name(self, mod: Any) -> str:
        name = self._names.get(mod)
        if name is None:
            name = type(mod).__name__
            self._names[mod] = name
        if mod not in self._named_children:
            for child_name, child in mod.named_children():
                self._names.setdefault(child, f"{name}.{child_name}")
            self._named_children.add(mod)
        return name

    def _enter(self, mod: Any, args: Any) -> None:
        import torch

        stack: list[Any] | None = getattr(self._local, "stack", None)
        if stack is None:
            stack = self._local.stack = []
        compiling = getattr(getattr(torch, "compiler", None), "is_compiling", None)
        if compiling is not None and compiling():
            # Inside a graph being compiled a range would be traced (or break the graph): the profile
            # must see the program the job runs, so compiled regions stay unnamed.
            stack.append(None)
            return
        # The op record_function itself calls: a user_annotation range, with fewer Python calls (which a
        # stack-traced profile would record and time too) than the context manager.
        stack.append(
            torch.ops.profiler._record_function_enter_new(
                f"nn.Module: {self._name(mod)} ({type(mod).__name__})", None
            )
        )

    def _exit(self, mod: Any, args: Any, output: Any) -> None:
        stack: list[Any] | None = getattr(self._local, "stack", None)
        if stack:
            _close(stack.pop())


def _close(handle: Any) -> None:
    if handle is not None:
        import torch

        torch.ops.profiler._record_function_exit._RecordFunction(handle)
