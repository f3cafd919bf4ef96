"""The ordered tool registry: the server registers exactly these, in this order.

Each tool is a module here defining ``SPEC`` (a `perfgate.serving.spec.ToolSpec`): an adapter from its
domain packages to the serving framework (`perfgate.serving`), which knows no tool by name.
`trace_analysis` and `run_benchmark_window_models` are not tools: they hold what two tools share.

The tool modules (their models, their domain packages) load on first use of ``REGISTRY`` or of a module,
not with this package: a server started from the generated catalog (`perfgate.serving.catalog`) imports a
tool's module only when that tool is first called.
"""

from __future__ import annotations

import importlib
import sys
from typing import TYPE_CHECKING, Any

from perfgate._toolnames import TOOL_MODULES

if TYPE_CHECKING:
    from perfgate.serving.spec import AnySpec

    REGISTRY: tuple[AnySpec, ...]

__all__ = ["REGISTRY", "registered_specs", "shipped_registry"]


def _shipped() -> tuple[AnySpec, ...]:
    return tuple(importlib.import_module(f"{__name__}.{m}").SPEC for m in TOOL_MODULES)


def __getattr__(name: str) -> Any:
    if name != "REGISTRY":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = globals()[name] = _shipped()  # later lookups skip __getattr__
    return value


def shipped_registry() -> bool:
    """Whether ``REGISTRY`` is the shipped one: never loaded, or loaded and not replaced (tests add tools
    to it); only then does the generated catalog describe the tools a server registers."""
    registry = globals().get("REGISTRY")
    return registry is None or registry == _shipped()


def registered_specs(read_only: bool) -> list[AnySpec]:
    """The specs a server exposes: read-only servers drop tools that run commands or write decisions."""
    registry: tuple[AnySpec, ...] = sys.modules[__name__].REGISTRY
    return [s for s in registry if not (read_only and (s.runs_commands or s.writes))]
