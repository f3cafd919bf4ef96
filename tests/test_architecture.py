"""The package's own wiring: every module imports, every lazily exported name resolves, and the import
contracts in pyproject.toml hold.

A package's ``__getattr__`` hides a stale name from the type checker (any attribute of such a module
type-checks), so the names are resolved here instead.
"""

from __future__ import annotations

import importlib
import pkgutil
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import perfgate

ROOT = Path(__file__).resolve().parents[1]


def _modules() -> list[str]:
    found = pkgutil.walk_packages(perfgate.__path__, "perfgate.")
    return sorted(m.name for m in found if not m.name.endswith(".__main__"))  # __main__ runs the CLI


def test_every_module_imports() -> None:
    failures: list[str] = []
    for name in _modules():
        try:
            importlib.import_module(name)
        except ImportError as exc:
            failures.append(f"{name}: {exc}")
    assert not failures, "\n".join(failures)


def test_every_lazy_export_resolves() -> None:
    unresolved: list[str] = []
    for name in _modules():
        module = importlib.import_module(name)
        if not hasattr(module, "__path__"):
            continue  # only packages export lazily
        for exported in getattr(module, "__all__", ()):
            try:
                getattr(module, exported)
            except (AttributeError, ImportError) as exc:
                unresolved.append(f"{name}.{exported}: {exc}")
    assert not unresolved, "\n".join(unresolved)


def test_a_stale_lazy_name_is_reported() -> None:
    from perfgate.helpers.lazy import lazy_exports

    namespace: dict[str, object] = {"__all__": ["gone"]}
    getattr_, _ = lazy_exports("fake", {"gone": "perfgate.errors"}, namespace)
    with pytest.raises(AttributeError):
        getattr_("gone")  # perfgate.errors has no attribute "gone"


def test_import_contracts_hold() -> None:
    lint = shutil.which("lint-imports") or str(Path(sys.executable).with_name("lint-imports"))
    if not Path(lint).exists():
        pytest.skip("import-linter is not installed (pip install -e '.[dev]')")
    done = subprocess.run([lint], cwd=ROOT, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]


def test_no_two_packages_import_each_other() -> None:
    """The layers contract lets domain packages import one another; none may do it both ways (a
    ``TYPE_CHECKING`` or function-level import counts: the circle is in the design either way)."""
    grimp = pytest.importorskip("grimp", reason="grimp comes with import-linter (the dev extra)")
    graph = grimp.build_graph("perfgate")
    tops = sorted({m.split(".")[1] for m in graph.modules if m.count(".") >= 1})
    circles = [
        (a, b)
        for i, a in enumerate(tops)
        for b in tops[i + 1 :]
        if graph.chain_exists(importer=f"perfgate.{a}", imported=f"perfgate.{b}", as_packages=True)
        and graph.chain_exists(importer=f"perfgate.{b}", imported=f"perfgate.{a}", as_packages=True)
    ]
    assert not circles, circles
