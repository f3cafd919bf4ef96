"""How a refused keep reads: the failed gates, one line each, and the ``next:`` line."""

from __future__ import annotations

import re

from perfgate.decisions.gates.base import Gate

__all__ = ["next_step", "summarize"]

_CLOSE = "or decide 'revert', 'inconclusive' or 'blocked'"
"""The way out of every refused keep, offered once."""


def next_step(gates: list[Gate]) -> str:
    """The refusal's ``next:`` line: the first unmet gate's fix, then closing the experiment as the
    alternative unless that fix already offers a decision (never the same choice twice)."""
    first = next((g.satisfy_with for g in gates if g.status == "failed" and g.satisfy_with), None)
    if first is None:
        return f"next: add the evidence named below, {_CLOSE}"
    if re.search(r"\b(decide|revert)\b", first):
        return f"next: {first}"
    return f"next: {first}, {_CLOSE}"


def summarize(gates: list[Gate]) -> str:
    failed = [g for g in gates if g.status == "failed"]
    lines = [f"- {g.name}: {g.reason}" + (f" -> {g.satisfy_with}" if g.satisfy_with else "") for g in failed]
    return "\n".join(lines)
