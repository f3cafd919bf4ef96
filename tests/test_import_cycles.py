"""No circle between modules: no module reaches itself by following imports.

The layers contract (pyproject.toml) holds packages apart; this holds modules apart, inside a package too.
A function-level or ``TYPE_CHECKING`` import counts: the circle is in the design either way. A circle names
each module on it, so the fix can start from the piece two of them share.
"""

from __future__ import annotations

from collections.abc import Iterable

import pytest

grimp = pytest.importorskip("grimp", reason="grimp comes with import-linter (the dev extra)")


def _circles(graph: grimp.ImportGraph) -> list[list[str]]:
    """Each set of modules that import one another round a circle (a strongly connected component of more
    than one module, or one that imports itself), sorted; Tarjan's algorithm without recursion."""
    modules = sorted(graph.modules)
    imports = {m: sorted(graph.find_modules_directly_imported_by(m)) for m in modules}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in modules:
        if root in index:
            continue
        work: list[tuple[str, Iterable[str]]] = [(root, iter(imports[root]))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            module, pending = work[-1]
            step = next(iter(pending), None)
            if step is not None:
                if step not in index:
                    index[step] = low[step] = len(index)
                    stack.append(step)
                    on_stack.add(step)
                    work.append((step, iter(imports.get(step, []))))
                elif step in on_stack:
                    low[module] = min(low[module], index[step])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[module])
            if low[module] == index[module]:
                component: list[str] = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == module:
                        break
                if len(component) > 1 or module in imports[module]:
                    found.append(sorted(component))
    return sorted(found)


def test_no_module_imports_itself_round_a_circle() -> None:
    circles = [c for c in _circles(grimp.build_graph("perfgate"))]
    assert not circles, "import circles:\n" + "\n".join(" <-> ".join(c) for c in circles)


def test_a_circle_names_its_modules() -> None:
    graph = grimp.ImportGraph()
    for importer, imported in [
        ("p.a", "p.b"),
        ("p.b", "p.c"),
        ("p.c", "p.a"),
        ("p.c", "p.d"),
        ("p.e", "p.e"),
    ]:
        graph.add_import(importer=importer, imported=imported)
    graph.add_module("p.f")
    assert _circles(graph) == [["p.a", "p.b", "p.c"], ["p.e"]]
