"""The gate table the README and the skill show, rendered from the registry: what a reader sees is what
the keep evaluates. `perfgate.generated` writes it between the markers of each file that shows it."""

from __future__ import annotations

from perfgate.decisions.gates.registry import GATES

__all__ = ["END", "START", "render_gate_table", "with_gate_table"]

START = "<!-- gates-table:start -->"
END = "<!-- gates-table:end -->"


def render_gate_table() -> str:
    """The registry as a markdown table, one row per gate in evaluation order."""
    lines = ["| Gate | What it protects | When it applies |", "|---|---|---|"]
    lines += [f"| `{row.name}` | {row.protects} | {row.applies.says} |" for row in GATES]
    return "\n".join(lines) + "\n"


def with_gate_table(text: str) -> str:
    """``text`` with what lies between the markers replaced by the rendered table (the markers kept on
    lines of their own); ValueError when ``text`` lacks them, so a moved section is never silently
    left stale."""
    start, end = text.find(START), text.find(END)
    if start == -1 or end < start:
        raise ValueError(f"no {START} ... {END} markers")
    head = text[: start + len(START)]
    return f"{head}\n{render_gate_table()}{text[end:]}"
