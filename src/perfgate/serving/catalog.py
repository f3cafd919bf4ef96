"""Tools registered from the generated catalog, each module imported when its tool is first called.

Listing a tool needs only its name, description, schemas and hints, which `perfgate schemas` writes to
``schemas/tools_list.json`` (the exact ``tools/list`` answer of a default server; ``perfgate schemas
--check`` fails on any drift) with ``schemas/tools_index.json`` (each tool's module and whether it runs
commands or writes decisions). A server registered from them lists its tools without importing the tool
modules, their pydantic models and domain packages (about 0.3 s of a cold start); the first call of a
tool builds the real tool from its module and hands every call to it. A catalog that does not match the
code the first call loads is reported in the log, and the code's tool is used.
"""

from __future__ import annotations

import importlib
import json
import logging
from collections.abc import Callable
from typing import Any, cast

from mcp.server.mcpserver.tools import Tool
from mcp.types import ToolAnnotations
from pydantic import PrivateAttr

from perfgate.schemas import SCHEMA_DIR

__all__ = ["INDEX_FILE", "LIST_FILE", "CatalogTool", "catalog_tools"]

LIST_FILE = "tools_list.json"
INDEX_FILE = "tools_index.json"

logger = logging.getLogger(__name__)

Builder = Callable[[Any], Tool]
"""The server's own construction of a tool from its module's ``SPEC``."""


async def _never_called(**_: Any) -> None:
    raise AssertionError("a catalog tool runs through the tool its module builds")


class CatalogTool(Tool):
    """A listed tool whose module is imported on its first call; every call is handed to the real tool."""

    _module: str = PrivateAttr(default="")
    _build: Builder | None = PrivateAttr(default=None)
    _output: dict[str, Any] | None = PrivateAttr(default=None)
    _loaded: Tool | None = PrivateAttr(default=None)

    @property
    def output_schema(self) -> dict[str, Any] | None:  # pyright: ignore[reportIncompatibleVariableOverride]  # the SDK's is a cached_property
        return self._output

    def loaded(self) -> Tool:
        """The tool built from its module (imported now, the first time)."""
        if self._loaded is None:
            assert self._build is not None
            tool = self._build(importlib.import_module(self._module).SPEC)
            if tool.parameters != self.parameters or tool.output_schema != self._output:
                logger.warning(
                    "perfgate: the schemas of %s in %s differ from its code; calls use the code's "
                    "(run `perfgate schemas` to regenerate the catalog)",
                    self.name,
                    SCHEMA_DIR / LIST_FILE,
                )
            self._loaded = tool
        return self._loaded

    async def run(self, arguments: dict[str, Any], context: Any, convert_result: bool = False) -> Any:
        return await self.loaded().run(arguments, context, convert_result=convert_result)


def _read(name: str) -> Any:
    return json.loads((SCHEMA_DIR / name).read_text(encoding="utf-8"))


def catalog_tools(read_only: bool, build: Builder) -> list[Tool] | None:
    """The shipped tools as listed by the catalog, in registry order (a read-only server without those
    that run commands or write); ``None`` when the catalog is missing or unreadable."""
    try:
        listed = {t["name"]: t for t in cast("list[dict[str, Any]]", _read(LIST_FILE))}
        index = cast("list[dict[str, Any]]", _read(INDEX_FILE))
    except (OSError, ValueError, KeyError, TypeError):
        return None
    tools: list[Tool] = []
    for entry in index:
        if read_only and (entry["runs_commands"] or entry["writes"]):
            continue
        listing = listed.get(entry["name"])
        if listing is None:
            return None
        tool = CatalogTool.model_construct(
            fn=_never_called,
            name=listing["name"],
            title=listing.get("title"),
            description=listing.get("description", ""),
            parameters=listing["inputSchema"],
            fn_metadata=None,
            is_async=True,
            context_kwarg=None,
            resolved_params={},
            resolver_plans={},
            annotations=ToolAnnotations.model_validate(listing["annotations"])
            if "annotations" in listing
            else None,
            icons=None,
            meta=None,
        )
        tool._module = entry["module"]  # pyright: ignore[reportPrivateUsage]
        tool._build = build  # pyright: ignore[reportPrivateUsage]
        tool._output = listing.get("outputSchema")  # pyright: ignore[reportPrivateUsage]
        tools.append(tool)
    return tools
