"""The ordered tool registry: the server registers exactly these, in this order.

The tool modules (their models, their domain packages) load on first use of ``REGISTRY`` or of a module,
not with this package: a server started from the generated catalog (`perfgate.tools._catalog`) imports a
tool's module only when that tool is first called.
"""

from __future__ import annotations

import importlib
import sys
from typing import TYPE_CHECKING, Any

from perfgate._toolnames import TOOL_MODULES

if TYPE_CHECKING:
    from perfgate.tools._spec import AnySpec, ToolSpec

    REGISTRY: tuple[AnySpec, ...]

__all__ = ["REGISTRY", "ToolSpec", "registered_specs", "shipped_registry"]


def _shipped() -> tuple[AnySpec, ...]:
    return tuple(importlib.import_module(f"{__name__}.{m}").SPEC for m in TOOL_MODULES)


def __getattr__(name: str) -> Any:
    if name == "REGISTRY":
        value: Any = _shipped()
    elif name == "ToolSpec":
        from perfgate.tools._spec import ToolSpec as value
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value  # later lookups skip __getattr__
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
