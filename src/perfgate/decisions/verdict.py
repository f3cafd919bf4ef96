"""A gate's verdict as a module that evaluates one returns it; `perfgate.decisions.gates` makes it a ``Gate``."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["OK_STATES", "Check"]

OK_STATES = frozenset({"executed", "passed"})
"""Evidence states a gate can build on: something ran and produced data, or a check passed."""


@dataclass
class Check:
    """A gate's verdict: ``applies`` False means not applicable (``ok`` is then meaningless); ``fix`` is the
    call that satisfies a failed gate."""

    applies: bool
    ok: bool
    reason: str
    ids: list[str]
    fix: str | None = None
