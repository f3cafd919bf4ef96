"""tools/list stays lean: what the client keeps in its context is measured over the protocol; the lean
input schemas accept exactly what the full ones accept; the listed ones differ from the documented ones
only where the server still refuses, and every field's description is served and quoted in refusals."""

from __future__ import annotations

import functools
import json
from typing import Any

import pytest
from jsonschema import Draft202012Validator
from mcp import Client
from mcp.server.mcpserver.tools import Tool

from perfgate.server import build_server, tool_for
from perfgate.serving.adapter import make_tool_function
from perfgate.serving.config import ServerConfig
from perfgate.serving.lean import lean_schema
from perfgate.skills.catalog import tool_reference
from perfgate.tools import registered_specs

pytestmark = pytest.mark.anyio

MODEL_FACING_BUDGET = 24_000
"""Bytes of tools/list without output schemas (names, titles, descriptions, input schemas, annotations):
what a client puts in the model's context. 62,763 before input schemas were made lean, 55,206 after (on
05d93cb), 19,229 with listed schemas (no field descriptions, nested objects in place) and short tool
descriptions; 23,253 with run_benchmark_pair (3,299: its baseline is a whole run_benchmark_window input,
listed with every field's type and bounds like the window's own)."""

PROBES: list[Any] = [None, True, 0, 1, -1, 0.5, 2**40, "", "x", "auto", [], [1], ["a"], {}, {"a": 1}]


def _size(value: Any) -> int:
    return len(json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode())


async def test_the_model_facing_tools_list_fits_its_budget(server: Any, mode: str) -> None:
    async with Client(server, mode=mode) as client:
        tools = (await client.list_tools()).tools
    listed = [t.model_dump(mode="json", by_alias=True, exclude_none=True) for t in tools]
    facing = [{k: v for k, v in t.items() if k != "outputSchema"} for t in listed]
    assert _size(facing) <= MODEL_FACING_BUDGET, f"model-facing tools/list is {_size(facing)} bytes"
    for tool in listed:
        assert not list(_repeated(tool["inputSchema"])), tool["name"]
        assert '"description"' not in json.dumps(tool["inputSchema"]), tool["name"]
        assert len(tool["description"]) <= 220, f"{tool['name']}: the rest belongs in its reference page"


def _repeated(node: Any) -> Any:
    """Derived titles and nullable anyOf pairs of a typed schema left in ``node``."""
    if isinstance(node, list):
        for v in node:
            yield from _repeated(v)
    elif isinstance(node, dict):
        if isinstance(node.get("title"), str):
            yield node["title"]
        options = node.get("anyOf")
        if isinstance(options, list) and {"type": "null"} in options:
            yield from (o for o in options if "type" in o and o != {"type": "null"})
        for key, value in node.items():
            if key in ("properties", "$defs"):
                for sub in value.values():
                    yield from _repeated(sub)
            elif key != "title":
                yield from _repeated(value)


def _full_schemas() -> dict[str, dict[str, Any]]:
    return {
        spec.name: Tool.from_function(
            make_tool_function(spec, lambda ctx: None), name=spec.name, structured_output=True
        ).parameters
        for spec in registered_specs(False)
    }


@pytest.mark.parametrize("name", sorted(_full_schemas()))
def test_a_lean_input_schema_accepts_exactly_what_the_full_one_accepts(name: str) -> None:
    full = _full_schemas()[name]
    lean = lean_schema(full)
    assert _size(lean) < _size(full)
    for prop, schema in full["properties"].items():
        whole = Draft202012Validator({"$defs": full.get("$defs", {}), **schema})
        trimmed = Draft202012Validator({"$defs": lean.get("$defs", {}), **lean["properties"][prop]})
        for value in PROBES:
            assert whole.is_valid(value) == trimmed.is_valid(value), (prop, value)


@functools.cache
def _documented() -> dict[str, tuple[dict[str, Any], dict[str, Any]]]:
    """Each tool's (documented, listed) input schema, as the server registers them."""
    out: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {}
    for spec in registered_specs(False):
        tool = tool_for(spec)
        out[spec.name] = (tool.documented, tool.parameters)
    return out


def _open(node: Any) -> Any:
    """``node`` with no ``additionalProperties: false`` (what a listed schema leaves to the server)."""
    if isinstance(node, list):
        return [_open(v) for v in node]
    if not isinstance(node, dict):
        return node
    return {k: _open(v) for k, v in node.items() if not (k == "additionalProperties" and v is False)}


@pytest.mark.parametrize("name", sorted(_documented()))
def test_a_listed_schema_differs_from_the_documented_one_only_where_the_server_refuses(name: str) -> None:
    """Every field is listed with its type, bounds and enums: a value validates the same by both, except
    null (the listed schema leaves it out: an optional field is omitted instead, which the server reads
    the same) and an unknown key in a nested object (the server refuses it by name, tested below)."""
    documented, listed = _documented()[name]
    assert listed["additionalProperties"] is False
    assert list(listed["properties"]) == list(documented["properties"])
    assert listed.get("required") == documented.get("required")
    for prop, schema in documented["properties"].items():
        full = Draft202012Validator(_open({"$defs": documented.get("$defs", {}), **schema}))
        shown = Draft202012Validator(listed["properties"][prop])
        for value in PROBES:
            if value is None:
                assert not shown.is_valid(None) or full.is_valid(None), prop
            else:
                assert full.is_valid(value) == shown.is_valid(value), (prop, value)


async def test_an_unknown_nested_key_is_refused_by_name_with_the_fields_described(
    server: Any, mode: str
) -> None:
    """What the listed schema no longer says (nested additionalProperties: false, field descriptions) the
    refusal says: the unknown key by name with the keys allowed, the documentation of each field it names,
    and where every field is described; that page is served."""
    args = {
        "buckets": [{"name": "b", "flops_per_step": 1e14, "step_time_s": 0.5, "step": 10}],
        "device": "H100",
        "precision": "bf16",
    }
    async with Client(server, mode=mode) as client:
        result = await client.call_tool("compute_mfu", args)
        page = tool_reference("compute_mfu")
        assert page is not None
        served = (await client.read_resource(page.uri)).contents[0].text  # type: ignore[union-attr]
    text = result.content[0].text  # type: ignore[union-attr]
    assert result.is_error
    assert "buckets[0].step: unknown field; allowed here: " in text and "steps" in text
    assert "flops_kind: required, but missing. flops_kind: " in text
    assert f"(every field: {page.uri})" in text
    assert served == page.path.read_text(encoding="utf-8")


@pytest.mark.parametrize("name", sorted(_documented()))
def test_every_field_is_described_on_its_tool_page(name: str) -> None:
    documented, _ = _documented()[name]
    page = tool_reference(name)
    assert page is not None
    text = page.path.read_text(encoding="utf-8")
    assert text.splitlines()[0] == f"# {page.title}"
    schemas = [documented, *documented.get("$defs", {}).values()]
    for schema in schemas:
        for field, node in schema.get("properties", {}).items():
            description = " ".join(str(node.get("description", "")).split())
            assert description, f"{name}.{field} has no description"
            assert f"- `{field}` (" in text and description in text, f"{name}.{field} is not on its page"


async def test_a_read_only_server_lists_less_and_names_the_same_pages(workspace: Any) -> None:
    async with Client(build_server(ServerConfig.create(workspace, read_only=True))) as client:
        tools = (await client.list_tools()).tools
        uris = {str(r.uri) for r in (await client.list_resources()).resources}
    facing = [
        t.model_dump(mode="json", by_alias=True, exclude_none=True, exclude={"output_schema"}) for t in tools
    ]
    assert _size(facing) <= MODEL_FACING_BUDGET
    for tool in tools:
        page = tool_reference(tool.name)
        assert page is not None and page.uri in uris


def test_data_inside_a_schema_keeps_its_own_description_and_title_keys() -> None:
    from perfgate.serving.lean import listed_schema

    data = {"description": "a value, not a doc", "title": "T"}
    schema = {
        "type": "object",
        "properties": {"a": {"const": data, "title": "A", "description": "doc"}, "b": {"enum": [data, None]}},
        "additionalProperties": False,
    }
    listed = listed_schema(lean_schema(schema))
    assert listed["properties"] == {"a": {"const": data}, "b": {"enum": [data]}}
