"""A tool's skill reference page, rendered from its documented schemas (``perfgate schemas`` writes it).

tools/list carries each tool's short description and a listed schema without field descriptions
(`perfgate.serving.lean`); this page has the rest: what the tool is for at length, every input field with
its type, default, bounds and meaning (nested objects included), and the fields its answer leads with.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, cast

__all__ = ["render_tool_reference"]

_BOUNDS = (
    ("minimum", ">= {}"),
    ("exclusiveMinimum", "> {}"),
    ("maximum", "<= {}"),
    ("exclusiveMaximum", "< {}"),
    ("minLength", "at least {} characters"),
    ("maxLength", "at most {} characters"),
    ("minItems", "at least {} items"),
    ("maxItems", "at most {} items"),
    ("pattern", "matching `{}`"),
)


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _def_name(node: Mapping[str, Any]) -> str | None:
    ref = node.get("$ref")
    return ref.rsplit("/", 1)[-1] if isinstance(ref, str) and ref.startswith("#/$defs/") else None


def _type(node: Mapping[str, Any]) -> str:
    """A field's type in words: ``integer``, ``'a' | 'b'``, ``array of string``, ``object Name``."""
    name = _def_name(node)
    if name is not None:
        return f"`{name}`"
    if "const" in node:
        return json.dumps(node["const"])
    if "enum" in node:
        return " \\| ".join(json.dumps(v) for v in cast("list[Any]", node["enum"]) if v is not None)
    options = node.get("anyOf")
    if isinstance(options, list):
        kinds = [_type(o) for o in cast("list[Mapping[str, Any]]", options) if o.get("type") != "null"]
        return " or ".join(kinds)
    kind = node.get("type")
    kinds = [k for k in cast("list[str]", kind) if k != "null"] if isinstance(kind, list) else [kind]
    words: list[str] = []
    for k in kinds:
        if k == "array" and isinstance(node.get("items"), Mapping):
            words.append(f"array of {_type(cast('Mapping[str, Any]', node['items']))}")
        elif k == "array" and isinstance(node.get("prefixItems"), list):
            items = cast("list[Mapping[str, Any]]", node["prefixItems"])
            words.append(f"[{', '.join(_type(i) for i in items)}]")
        elif k == "object" and isinstance(node.get("additionalProperties"), Mapping):
            values = _type(cast("Mapping[str, Any]", node["additionalProperties"]))
            words.append(f"object of {values}")
        elif isinstance(k, str):
            words.append(k)
    return " or ".join(words) or "any"


def _bounds(node: Mapping[str, Any]) -> list[str]:
    found = [text.format(node[key]) for key, text in _BOUNDS if key in node]
    for option in cast("list[Mapping[str, Any]]", node.get("anyOf") or []):
        found += _bounds(option)
    items = node.get("items")
    if isinstance(items, Mapping):
        found += [f"each {b}" for b in _bounds(cast("Mapping[str, Any]", items))]
    return found


def _fields(schema: Mapping[str, Any]) -> list[str]:
    properties = cast("Mapping[str, Mapping[str, Any]]", schema.get("properties") or {})
    required = set(cast("list[str]", schema.get("required") or []))
    lines: list[str] = []
    for name, node in properties.items():
        facts = [_type(node)]
        if name in required:
            facts.append("required")
        elif "default" in node and node["default"] not in (None, {}, []):
            facts.append(f"default {json.dumps(node['default'])}")
        facts += _bounds(node)
        text = _one_line(str(node.get("description") or ""))
        lines.append(f"- `{name}` ({', '.join(facts)})" + (f": {text}" if text else ""))
    return lines


def _used_defs(node: Any, defs: Mapping[str, Any], seen: list[str]) -> None:
    """Names of the ``$defs`` reachable from ``node``, in the order a reader meets them."""
    if isinstance(node, list):
        for v in cast("list[Any]", node):
            _used_defs(v, defs, seen)
    elif isinstance(node, Mapping):
        mapping = cast("Mapping[str, Any]", node)
        name = _def_name(mapping)
        if name is not None and name in defs and name not in seen:
            seen.append(name)
            _used_defs(defs[name], defs, seen)
        for key, value in mapping.items():
            if key != "$defs":
                _used_defs(value, defs, seen)


def render_tool_reference(
    heading: str, tool: Mapping[str, Any], documented: Mapping[str, Any], details: str
) -> str:
    """The page for ``tool`` (its tools/list entry, with ``outputSchema``) under ``heading``, from its
    documented input schema and the spec's ``details`` (the listed description where it has none)."""
    about = _one_line(details or tool.get("description") or "")
    title = tool.get("title")
    lead = f"**{title}.** {about}" if title else about
    parts = [f"# {heading}", "", lead, "", "## Inputs", "", *_fields(documented)]
    defs = cast("Mapping[str, Any]", documented.get("$defs") or {})
    order: list[str] = []
    _used_defs(documented.get("properties"), defs, order)
    for def_name in order:
        node = cast("Mapping[str, Any]", defs[def_name])
        parts += ["", f"### `{def_name}`", ""]
        if node.get("description"):
            parts += [_one_line(str(node["description"])), ""]
        parts += _fields(node)
    output = cast("Mapping[str, Any]", tool.get("outputSchema") or {})
    fields = cast("Mapping[str, Mapping[str, Any]]", output.get("properties") or {})
    if fields:
        parts += ["", "## The answer's fields", ""]
        for field, node in fields.items():
            text = _one_line(str(node.get("description") or ""))
            parts.append(f"- `{field}`" + (f": {text}" if text else ""))
    return "\n".join(parts).rstrip() + "\n"
