"""import_benchmark's glob patterns are confined to the workspace before they are expanded, and bounded.

A pattern that starts outside the workspace, climbs out with ``..`` or reaches a folder elsewhere through a
link is refused or matches nothing there, without walking the file system; no refusal names a file
outside the workspace (that would tell the agent which files exist there). A pattern that would look at
too many names is refused with the bound.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
from mcp import Client

from perfgate.server import build_server
from perfgate.serving import globs
from perfgate.serving.runtime import ServerConfig

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(120)]

LOGS = Path(__file__).parent / "fixtures" / "logs"
SECRET = "only-outside-7f3a"


@pytest.fixture
def outside(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("elsewhere")
    (root / f"{SECRET}.log").write_text((LOGS / "nanogpt.log").read_text())
    (root / "hop").symlink_to(root / f"{SECRET}.log")
    return root


async def _import(workspace: Path, paths: list[str]) -> Any:
    args = {"paths": paths, "format": "nanogpt", "warmup_steps": 10, "windows": 1, "world_size": 8}
    async with Client(build_server(ServerConfig.create(workspace))) as client:
        return await client.call_tool("import_benchmark", args)


def _text(result: Any) -> str:
    return " ".join(getattr(c, "text", "") for c in result.content)


@pytest.mark.parametrize("pattern", ["/**/*", "/*/*.log", "/tmp/**/*.log"])
async def test_an_absolute_pattern_outside_the_workspace_is_refused_before_expanding(
    workspace: Path, outside: Path, pattern: str
) -> None:
    result = await _import(workspace, [pattern])
    text = _text(result)
    assert result.is_error and "starts outside the workspace" in text and SECRET not in text


@pytest.mark.parametrize("pattern", ["../*/*.log", "logs/../../*/*.log", "./../**/*.log"])
async def test_a_pattern_climbing_out_is_refused(workspace: Path, outside: Path, pattern: str) -> None:
    shutil.copytree(LOGS, workspace / "logs")
    result = await _import(workspace, [pattern])
    text = _text(result)
    assert result.is_error and "contains '..'" in text and SECRET not in text


@pytest.mark.parametrize("pattern", ["away/*.log", "*/only-*.log", "**/*.log"])
async def test_a_link_to_a_folder_elsewhere_is_not_walked(
    workspace: Path, outside: Path, pattern: str
) -> None:
    (workspace / "away").symlink_to(outside, target_is_directory=True)
    result = await _import(workspace, [pattern])
    text = _text(result)
    assert result.is_error and "no file matches" in text and SECRET not in text


async def test_a_refusal_never_names_where_a_link_leads(workspace: Path, outside: Path) -> None:
    """``ws/x -> elsewhere/hop -> elsewhere/<secret>``: the refusal names what the agent sent, not the file
    the chain of links ends at (an oracle for names outside)."""
    (workspace / "x.log").symlink_to(outside / "hop")
    for paths in (["x.log"], ["x.*"]):
        result = await _import(workspace, paths)
        text = _text(result)
        assert result.is_error and "leads outside the workspace" in text and SECRET not in text, text


async def test_a_pattern_that_looks_at_too_many_names_is_refused_with_the_bound(
    workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(globs, "MAX_ENTRIES", 50)
    tree = workspace / "many"
    for i in range(30):
        (tree / f"d{i}").mkdir(parents=True)
        (tree / f"d{i}" / "x.txt").write_text("")
    result = await _import(workspace, ["many/**/*.log"])
    text = _text(result)
    assert result.is_error and "looks at more than 50 names" in text and "next: narrow it" in text


async def test_patterns_inside_the_workspace_still_match(workspace: Path) -> None:
    shutil.copytree(LOGS, workspace / "logs")
    (workspace / "logs" / "deeper").mkdir()
    shutil.copy(LOGS / "nanogpt.log", workspace / "logs" / "deeper" / "nanogpt.log")
    for pattern in (
        "logs/nano*.log",
        f"{workspace}/logs/nano*.log",
        "**/deeper/*.log",
        "logs/**/nanogpt.log",
    ):
        result = await _import(workspace, [pattern])
        assert not result.is_error, (pattern, _text(result))
