"""Input schemas as ``tools/list`` sends them: what validates, without what pydantic repeats.

Every tool's input schema travels in the client's context on every turn, so the registration step drops
what carries no meaning for a caller and no constraint for a validator: the titles pydantic derives from
field names ("Warmup Steps" for ``warmup_steps``), ``"default": null`` (an optional field left out is
null already), and the ``anyOf`` pydantic writes for an optional field (``[{"type": "integer",
"minimum": 1}, {"type": "null"}]`` is ``{"type": ["integer", "null"], "minimum": 1}``: a numeric keyword
constrains numbers only). The same arguments validate before and after (tested over every tool).
"""

from __future__ import annotations

from typing import Any, cast

__all__ = ["lean_schema"]

_SCHEMA_MAPS = frozenset({"properties", "$defs", "patternProperties"})
"""Keywords whose value maps names to schemas: the names are field names, never keywords."""
_NOT_MERGED = frozenset({"$ref", "const", "anyOf", "oneOf", "allOf", "not"})
_NULL: dict[str, Any] = {"type": "null"}


def lean_schema(schema: Any) -> Any:
    """``schema`` without derived titles and null defaults, and with nullable ``anyOf`` pairs as one type
    list (see the module docstring)."""
    if isinstance(schema, list):
        return [lean_schema(v) for v in cast("list[Any]", schema)]
    if not isinstance(schema, dict):
        return schema
    node: dict[str, Any] = {}
    for key, value in cast("dict[str, Any]", schema).items():
        if key in _SCHEMA_MAPS and isinstance(value, dict):
            node[key] = {name: lean_schema(v) for name, v in cast("dict[str, Any]", value).items()}
        elif (key == "title" and isinstance(value, str)) or (key == "default" and value is None):
            continue
        else:
            node[key] = lean_schema(value)
    options = node.get("anyOf")
    if isinstance(options, list) and len(cast("list[Any]", options)) == 2 and _NULL in options:
        (other,) = [o for o in cast("list[Any]", options) if o != _NULL]
        merged = cast("dict[str, Any]", other) if isinstance(other, dict) else {}
        if isinstance(merged.get("type"), str) and not _NOT_MERGED & set(merged):
            clash = set(merged) & (set(node) - {"anyOf"})
            if not clash:
                del node["anyOf"]
                node.update(merged)
                node["type"] = [merged["type"], "null"]
                if "enum" in merged:
                    node["enum"] = [*merged["enum"], None]
    return node
