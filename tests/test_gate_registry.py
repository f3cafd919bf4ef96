"""The gate registry is the one list of gates: the tables the README and the skill show are its rendering,
and the decisions package it sits in stays small enough to read and free of import circles."""

from __future__ import annotations

from pathlib import Path

import grimp
import pytest

from perfgate.decisions.gates.registry import GATES
from perfgate.decisions.gates.table import END, START, render_gate_table, with_gate_table
from perfgate.generated import GATE_TABLE_FILES

DECISIONS = Path(__file__).resolve().parents[1] / "src" / "perfgate" / "decisions"


@pytest.mark.parametrize("path", GATE_TABLE_FILES, ids=lambda p: p.name)
def test_each_gate_table_is_the_registrys_rendering(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    assert text.count(START) == 1 and text.count(END) == 1, (
        f"{path.name} needs one pair of gate-table markers"
    )
    assert with_gate_table(text) == text, f"{path.name}'s gate table drifted: run `perfgate schemas`"


def test_a_stale_table_is_rewritten_and_a_file_without_markers_is_refused() -> None:
    stale = f"intro\n{START}\n| `environment` | old words | never |\n{END}\nafter\n"
    fresh = with_gate_table(stale)
    assert fresh == f"intro\n{START}\n{render_gate_table()}{END}\nafter\n"
    assert "old words" not in fresh
    with pytest.raises(ValueError, match="markers"):
        with_gate_table("a section moved elsewhere, its markers with it\n")


def test_every_row_is_one_table_row_under_a_unique_name() -> None:
    names = [row.name for row in GATES]
    assert len(names) == len(set(names)), "two rows share a gate name"
    for row in GATES:
        for text in (row.protects, row.applies.says):
            assert text and "|" not in text and "\n" not in text, f"{row.name}: {text!r} breaks its table row"
    assert len(render_gate_table().splitlines()) == len(GATES) + 2


def test_the_registry_and_every_decisions_module_stay_short() -> None:
    assert len((DECISIONS / "gates" / "registry.py").read_text(encoding="utf-8").splitlines()) < 200
    long = {
        str(p.relative_to(DECISIONS)): n
        for p in DECISIONS.rglob("*.py")
        if (n := len(p.read_text(encoding="utf-8").splitlines())) > 500
    }
    assert not long, f"split these by responsibility: {long}"


def test_no_module_of_the_decisions_package_imports_itself_round_a_circle() -> None:
    graph = grimp.build_graph("perfgate")
    modules = sorted(m for m in graph.modules if m.startswith("perfgate.decisions"))
    circles = [
        (a, b)
        for a in modules
        for b in graph.find_modules_directly_imported_by(a)
        if b.startswith("perfgate.decisions") and graph.chain_exists(importer=b, imported=a)
    ]
    assert not circles, f"import circles inside perfgate.decisions (function-level imports count): {circles}"
