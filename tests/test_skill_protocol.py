"""The skill as an agent reaches it: listed resources and workflow prompts, both protocol generations."""

from __future__ import annotations

import re
from typing import Any

import pytest
from mcp import Client, MCPError

from perfgate.skills.catalog import REFERENCES, SKILL_DIR, SKILL_FILE, SKILL_URI, URI_PREFIX
from perfgate.skills.prompts import PROMPTS

pytestmark = pytest.mark.anyio

ARGS: dict[str, dict[str, str]] = {
    "optimize_training": {
        "command": "torchrun --nproc-per-node 8 train.py --config base.yaml",
        "goal": "tokens/s at global batch 256",
        "constraints": "two GPU hours",
    },
    "check_speedup": {
        "claim": "1.4x tokens/s from torch.compile",
        "change": "PR 1234",
        "evidence_ids": "ev-aaa, ev-bbb",
    },
    "port_cuda_to_musa": {"command": "python train.py --device cuda", "cuda_reference": "captures/cuda"},
    "tune_moe": {
        "command": "torchrun pretrain_gpt.py --num-experts 64",
        "model": "48 layers, 64 experts, top-8",
        "cluster": "4 nodes x 8 H100 SXM",
    },
}


def _text(contents: Any) -> str:
    (item,) = contents
    return str(item.text)


async def test_skill_md_and_every_reference_are_listed_as_markdown(server: Any, mode: str) -> None:
    async with Client(server, mode=mode) as client:
        listed = {str(r.uri): r for r in (await client.list_resources()).resources}
    expected = [SKILL_URI, *(ref.uri for ref in REFERENCES)]
    assert [u for u in listed if u.startswith(URI_PREFIX)] == expected
    for uri in expected:
        assert listed[uri].mime_type == "text/markdown"
        assert listed[uri].description, f"{uri} has no description telling when to read it"


async def test_every_skill_resource_reads_back_as_the_packaged_file(server: Any, mode: str) -> None:
    files = {SKILL_URI: SKILL_DIR / SKILL_FILE, **{ref.uri: ref.path for ref in REFERENCES}}
    async with Client(server, mode=mode) as client:
        for uri, path in files.items():
            result = await client.read_resource(uri)
            assert _text(result.contents) == path.read_text(encoding="utf-8"), uri


async def test_an_unknown_reference_is_a_not_found_error(server: Any, mode: str) -> None:
    async with Client(server, mode=mode) as client:
        with pytest.raises(MCPError, match="Unknown resource"):
            await client.read_resource(URI_PREFIX + "references/nonexistent.md")


async def test_prompts_are_listed_with_their_arguments(server: Any, mode: str) -> None:
    async with Client(server, mode=mode) as client:
        prompts = {p.name: p for p in (await client.list_prompts()).prompts}
    assert list(prompts) == [spec.name for spec in PROMPTS]
    assert set(ARGS) == set(prompts)
    for name, prompt in prompts.items():
        arguments = {a.name: a for a in prompt.arguments or []}
        assert set(arguments) == set(ARGS[name]), name
        required = [a for a in arguments.values() if a.required]
        assert len(required) == 1, f"{name}: exactly one required argument keeps it easy to start"
        assert all(a.description for a in arguments.values()), f"{name} has an undocumented argument"
        assert prompt.title
        assert prompt.description


def test_prompts_are_registered_as_the_sdk_would_from_their_functions() -> None:
    from mcp.server.mcpserver.prompts import Prompt

    from perfgate.server import prompt_for

    for spec in PROMPTS:
        sdk = Prompt.from_function(
            spec.render, name=spec.name, title=spec.title, description=spec.description
        )
        ours = prompt_for(spec)
        assert ours.model_dump(exclude={"fn"}) == sdk.model_dump(exclude={"fn"}), spec.name


@pytest.mark.parametrize("name", list(ARGS))
async def test_every_prompt_renders_with_its_arguments(server: Any, mode: str, name: str) -> None:
    async with Client(server, mode=mode) as client:
        result = await client.get_prompt(name, ARGS[name])
    (message,) = result.messages
    assert message.role == "user"
    text = str(getattr(message.content, "text", ""))
    for value in ARGS[name].values():
        assert value in text, f"{name} dropped the argument value {value!r}"
    assert SKILL_URI in text
    assert "record_decision(" in text


@pytest.mark.parametrize("name", list(ARGS))
async def test_every_prompt_renders_with_only_its_required_argument(
    server: Any, mode: str, name: str
) -> None:
    required = next(iter(ARGS[name]))
    async with Client(server, mode=mode) as client:
        result = await client.get_prompt(name, {required: ARGS[name][required]})
        with pytest.raises(MCPError):  # the SDK reports it as an internal error, without detail
            await client.get_prompt(name, {})
    text = str(getattr(result.messages[0].content, "text", ""))
    assert ARGS[name][required] in text
    assert not re.search(r": +$", text, re.MULTILINE), "an omitted argument left an empty field"
