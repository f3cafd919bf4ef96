"""Bad arguments and crashes reach the agent as sentences: one line per field, nothing from pydantic."""

from __future__ import annotations

import dataclasses
import gzip
import json
import zlib
from pathlib import Path
from typing import Any

import pytest
from mcp import Client

from perfgate import server as server_module
from perfgate.evidence import Ledger
from perfgate.schemas import SCHEMA_DIR
from perfgate.server import build_server
from perfgate.serving.failures import crash_message
from perfgate.serving.runtime import ServerConfig
from perfgate.tools import REGISTRY

pytestmark = pytest.mark.anyio

MFU_ARGS: dict[str, Any] = {
    "buckets": [{"name": "seq2048", "flops_per_step": 4.0e14, "step_time_s": 1.0}],
    "flops_kind": "model",
    "device": "NVIDIA H100 80GB HBM3",
    "precision": "bf16",
}


def _text(result: Any) -> str:
    return "\n".join(getattr(c, "text", "") for c in result.content)


async def test_a_misspelled_argument_is_refused_by_name_and_records_nothing(
    server: Any, workspace: Path, mode: str
) -> None:
    # Before: the unknown field was dropped silently and compute_mfu answered with the wrong peak.
    args = {**MFU_ARGS, "peak_tflop": 100.0}
    async with Client(server, mode=mode) as client:
        result = await client.call_tool("compute_mfu", args)
    assert result.is_error
    lines = _text(result).splitlines()
    assert lines[0] == "compute_mfu: 1 invalid argument"
    assert lines[1].startswith("- peak_tflop: unknown field; this tool takes: buckets, device,")
    assert "peak_tflops" in lines[1]
    assert lines[-1] == (
        "Fix these and call compute_mfu again (every field: skill://perfgate/references/tool-compute_mfu.md)."
    )
    assert Ledger(workspace).records() == []


async def test_an_unknown_field_inside_a_nested_object_is_named_with_its_path(server: Any, mode: str) -> None:
    args = {**MFU_ARGS, "buckets": [{**MFU_ARGS["buckets"][0], "stpes": 3}]}
    async with Client(server, mode=mode) as client:
        result = await client.call_tool("compute_mfu", args)
    assert result.is_error
    line = next(x for x in _text(result).splitlines() if x.startswith("- buckets[0].stpes: "))
    assert line.startswith("- buckets[0].stpes: unknown field; allowed here: ")
    assert {"name", "steps", "step_time_s"} <= set(line.split("allowed here: ")[1].split(", "))


async def test_each_bad_field_gets_one_line_with_allowed_values_and_no_pydantic_internals(
    server: Any, mode: str
) -> None:
    args = {"buckets": "x", "flops_kind": "modle"}
    async with Client(server, mode=mode) as client:
        result = await client.call_tool("compute_mfu", args)
    text = _text(result)
    assert result.is_error
    assert text.splitlines()[0] == "compute_mfu: 2 invalid arguments"
    assert "- buckets: must be a valid list (got 'x')" in text
    assert "- flops_kind: must be 'model', 'hardware' or 'profiler_attributed' (got 'modle')" in text
    assert "pydantic" not in text and "http" not in text and "validation error" not in text.lower()


def _objects(node: Any, path: str = "") -> list[tuple[str, dict[str, Any]]]:
    found: list[tuple[str, dict[str, Any]]] = []
    if isinstance(node, dict):
        if "properties" in node:
            found.append((path, node))
        for key, value in node.items():
            found += _objects(value, f"{path}/{key}")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            found += _objects(value, f"{path}/{i}")
    return found


async def test_every_object_in_every_input_schema_refuses_unknown_fields(server: Any) -> None:
    """The documented schema the server validates with refuses unknown keys in every object; tools/list
    says so at the top level (nested objects leave it to the server's refusal by name, which
    test_tools_list_size tests)."""
    async with Client(server) as client:
        tools = (await client.list_tools()).tools
    for tool in tools:
        assert tool.input_schema.get("additionalProperties") is False, tool.name
        objects = _objects(json.loads((SCHEMA_DIR / f"{tool.name}.input.json").read_text()))
        assert objects, tool.name
        for path, obj in objects:
            assert obj.get("additionalProperties") is False, f"{tool.name}{path or '/'}"


@pytest.mark.parametrize(
    ("exc", "expected"),
    [
        (RecursionError("maximum recursion depth exceeded"), "nested too deeply"),
        (OverflowError("int too large to convert to float"), "number in the input is too large"),
        (
            zlib.error("Error -3 while decompressing data: invalid stored block lengths"),
            "corrupt or truncated",
        ),
        (gzip.BadGzipFile("Not a gzipped file (b'ab')"), "corrupt or truncated"),
        (
            EOFError("Compressed file ended before the end-of-stream marker was reached"),
            "corrupt or truncated",
        ),
        (OSError(36, "File name too long", "/x/" + "a" * 400), "too long for the file system"),
        (MemoryError(), "ran out of memory"),
        (ZeroDivisionError("division by zero"), "unexpected ZeroDivisionError: division by zero"),
    ],
)
async def test_a_crash_in_a_tool_reaches_the_agent_as_a_sentence(
    workspace: Path, monkeypatch: pytest.MonkeyPatch, exc: BaseException, expected: str
) -> None:
    async def crash(inp: Any, rt: Any) -> Any:
        raise exc

    mfu = next(s for s in REGISTRY if s.name == "compute_mfu")
    monkeypatch.setattr(
        server_module, "registered_specs", lambda read_only: [dataclasses.replace(mfu, run=crash)]
    )
    server = build_server(
        ServerConfig.create(workspace), catalog=False
    )  # the registered specs, not the catalog
    async with Client(server) as client:
        result = await client.call_tool("compute_mfu", MFU_ARGS)
    text = _text(result)
    assert result.is_error
    assert text.startswith("compute_mfu failed: ") and expected in text
    assert len(text) < 400  # a long file name is shortened, not echoed whole


def test_crash_messages_never_come_out_empty() -> None:
    assert crash_message("t", ValueError()) == (
        "t failed: an unexpected ValueError. This is a perfgate bug: the server log has the traceback; "
        "report it with the arguments of this call."
    )
