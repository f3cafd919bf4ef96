"""Input schemas as ``tools/list`` sends them: what a caller must send, and nothing a model re-reads for
nothing on every turn.

Every tool's input schema travels in the client's context on every turn, so the registration step drops
what carries no meaning for a caller and no constraint for a validator: the titles pydantic derives from
field names ("Warmup Steps" for ``warmup_steps``), ``"default": null`` (an optional field left out is
null already), and the ``anyOf`` pydantic writes for an optional field (``[{"type": "integer",
"minimum": 1}, {"type": "null"}]`` is ``{"type": ["integer", "null"], "minimum": 1}``: a numeric keyword
constrains numbers only). The same arguments validate before and after (tested over every tool). That
is the *documented* schema: the server validates and words refusals with it, and `perfgate schemas`
writes it to ``<tool>.input.json`` and renders it into the tool's skill reference.

`listed_schema` is what ``tools/list`` carries, about a third of the documented schema's size: types,
required fields, enums, bounds and informative defaults, without the field descriptions (each refusal
quotes the description of every field it names, and ``references/tool-<name>.md`` has them all), without
``null`` as a listed option (an optional field is left out instead), and with nested objects written in
place. Its one looser point: nested objects do not list ``additionalProperties: false``; the server refuses
an unknown key there as at the top level, by name, with the keys allowed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

__all__ = ["inline_refs", "lean_schema", "listed_schema"]

_SCHEMA_MAPS = frozenset({"properties", "$defs", "patternProperties"})
"""Keywords whose value maps names to schemas: the names are field names, never keywords."""
_NOT_MERGED = frozenset({"$ref", "const", "anyOf", "oneOf", "allOf", "not"})
_NULL: dict[str, Any] = {"type": "null"}
_DATA = frozenset({"const", "enum", "default", "examples"})
"""Keywords whose value is data (a description key inside it is the data's own)."""


def _rewrite(
    schema: Any, drop: Callable[[str, Any], bool], finish: Callable[[dict[str, Any]], dict[str, Any]]
) -> Any:
    """``schema`` rebuilt bottom-up: in every schema node, the keywords ``drop(key, value)`` names are left
    out and ``finish`` rewrites the node last. Field names (keys of `_SCHEMA_MAPS`) and data (`_DATA`)
    are never taken for keywords."""
    if isinstance(schema, list):
        return [_rewrite(v, drop, finish) for v in cast("list[Any]", schema)]
    if not isinstance(schema, dict):
        return schema
    node: dict[str, Any] = {}
    for key, value in cast("dict[str, Any]", schema).items():
        if key in _SCHEMA_MAPS and isinstance(value, dict):
            node[key] = {name: _rewrite(v, drop, finish) for name, v in cast("dict[str, Any]", value).items()}
        elif drop(key, value):
            continue
        elif key in _DATA:
            node[key] = value
        else:
            node[key] = _rewrite(value, drop, finish)
    return finish(node)


def lean_schema(schema: Any) -> Any:
    """``schema`` without derived titles and null defaults, and with nullable ``anyOf`` pairs as one type
    list (see the module docstring)."""
    return _rewrite(schema, _derived, _nullable_pair)


def _derived(key: str, value: Any) -> bool:
    return (key == "title" and isinstance(value, str)) or (key == "default" and value is None)


def _nullable_pair(node: dict[str, Any]) -> dict[str, Any]:
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


def listed_schema(documented: dict[str, Any]) -> dict[str, Any]:
    """The part of ``documented`` (a `lean_schema`) that ``tools/list`` sends (see the module docstring)."""
    top = cast("dict[str, Any]", _rewrite(inline_refs(documented), _unlisted, _without_null))
    if documented.get("additionalProperties") is False:
        top["additionalProperties"] = False
    return top


def _unlisted(key: str, value: Any) -> bool:
    """Descriptions; ``additionalProperties`` true (the default) or false (the server enforces it); a
    default a caller learns nothing from (nothing, off, empty, or a nested object's own defaults)."""
    if key == "description":
        return isinstance(value, str)
    if key == "additionalProperties":
        return isinstance(value, bool)
    return key == "default" and (
        value is None or value is False or value == "" or isinstance(value, (dict, list))
    )


def _without_null(node: dict[str, Any]) -> dict[str, Any]:
    """``node`` with ``null`` taken out of its options, types and enum (an optional field is left out)."""
    options = node.get("anyOf")
    if isinstance(options, list) and _NULL in options:
        rest = [o for o in cast("list[Any]", options) if o != _NULL]
        if (
            len(rest) == 1
            and isinstance(rest[0], dict)
            and not set(cast("dict[str, Any]", rest[0])) & set(node)
        ):
            del node["anyOf"]
            node.update(cast("dict[str, Any]", rest[0]))
        else:
            node["anyOf"] = rest
    kinds = node.get("type")
    if isinstance(kinds, list) and "null" in kinds:
        kept = [k for k in cast("list[Any]", kinds) if k != "null"]
        node["type"] = kept[0] if len(kept) == 1 else kept
    if isinstance(node.get("enum"), list) and None in node["enum"]:
        node["enum"] = [v for v in node["enum"] if v is not None]
    return node


_ANNOTATIONS = frozenset(
    {"title", "description", "default", "examples", "deprecated", "readOnly", "writeOnly"}
)
_DEF_PREFIX = "#/$defs/"


def inline_refs(schema: Any) -> Any:
    """``schema`` with every ``$ref`` to one of its ``$defs`` replaced by the definition itself, and no
    ``$defs`` left; unchanged when a definition refers to itself (a recursive model).

    The same values validate. A client that checks every result against the output schema resolves each
    ``$ref`` it meets through its reference registry, once per list item: for a result with a list of
    models that lookup costs about as much as validating the items themselves. Output models refer to
    most definitions once, so the schema barely grows.
    """
    if not isinstance(schema, dict):
        return schema
    root = cast("dict[str, Any]", schema)
    if not isinstance(root.get("$defs"), dict):
        return root
    defs = cast("dict[str, Any]", root["$defs"])

    class _Recursive(Exception):
        pass

    def expand(node: Any, within: frozenset[str]) -> Any:
        if isinstance(node, list):
            return [expand(v, within) for v in cast("list[Any]", node)]
        if not isinstance(node, dict):
            return node
        items = cast("dict[str, Any]", node)
        ref = items.get("$ref")
        if isinstance(ref, str) and ref.startswith(_DEF_PREFIX) and ref[len(_DEF_PREFIX) :] in defs:
            name = ref[len(_DEF_PREFIX) :]
            if name in within:
                raise _Recursive
            target = cast("dict[str, Any]", expand(defs[name], within | {name}))
            rest = {k: expand(v, within) for k, v in items.items() if k != "$ref"}
            if set(rest) & set(target) <= _ANNOTATIONS:  # siblings that only annotate: the field's win
                return {**target, **rest}
            return {"allOf": [target], **rest}
        return {k: expand(v, within) for k, v in items.items() if not (node is root and k == "$defs")}

    try:
        return expand(root, frozenset())
    except _Recursive:
        return root
