"""A gate's verdict as the module that evaluates it returns it; the registry (`perfgate.decisions.gates.registry`)
names it and makes it a ``Gate``."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["OK_STATES", "Check"]

OK_STATES = frozenset({"executed", "passed"})
"""Evidence states a gate can build on: something ran and produced data, or a check passed."""


@dataclass
class Check:
    """A gate's verdict: ``applies`` False means not applicable (``ok`` is then meaningless); ``fix`` is the
    call that satisfies a failed gate; ``observed`` False means the figure the gate reads could not be
    observed here (reported as unmeasured, never as passed, and not blocking)."""

    applies: bool
    ok: bool
    reason: str
    ids: list[str]
    fix: str | None = None
    observed: bool = True
