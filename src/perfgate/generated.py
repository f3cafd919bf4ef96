"""Every file generated from the code: the tool schemas and the ``tools/list`` catalog in `perfgate.schemas`,
the skill's contract vocabulary reference, rendered from the vocabulary the code checks, each tool's
reference page (``references/tool-<name>.md``), rendered from its documented schemas, and the gate table
of every file in ``GATE_TABLE_FILES``, rendered from the gate registry.

`perfgate schemas` writes them; ``--check`` fails on drift. Generating them builds a server, so this module
sits above `perfgate.server`.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import anyio

from perfgate.benchmarking.workload.vocabulary import render_vocabulary
from perfgate.decisions.gates.table import with_gate_table
from perfgate.schemas import SCHEMA_DIR
from perfgate.server import build_server, tool_for
from perfgate.serving.config import ServerConfig
from perfgate.skills.catalog import SKILL_DIR, SKILL_FILE, reference, tool_reference
from perfgate.skills.reference_page import render_tool_reference
from perfgate.tools import registered_specs

__all__ = ["GATE_TABLE_FILES", "check_schemas", "render_schemas", "write_schemas"]

GATE_TABLE_FILES = (Path(__file__).resolve().parents[2] / "docs" / "gates.md", SKILL_DIR / SKILL_FILE)
"""Files that show the gate table between ``<!-- gates-table:start -->`` and ``<!-- gates-table:end -->``.
The docs are there only in a source checkout; an installed package has the skill alone."""


def _dump(value: Any) -> str:
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


async def _tools_list() -> list[dict[str, Any]]:
    with tempfile.TemporaryDirectory() as tmp:
        server = build_server(ServerConfig.create(Path(tmp)), catalog=False)
        tools = await server.list_tools()
    return [t.model_dump(mode="json", by_alias=True, exclude_none=True) for t in tools]


def render_schemas() -> dict[str, str]:
    """File name -> content for every generated schema file.

    ``<tool>.input.json`` is the documented input schema (with every field's description), which the
    server validates with; tools/list carries its listed form (`perfgate.serving.lean.listed_schema`).
    """
    tools = anyio.run(_tools_list)
    specs = registered_specs(read_only=False)
    files = {"tools_list.json": _dump(tools)}
    index = [
        {"name": s.name, "module": s.run.__module__, "runs_commands": s.runs_commands, "writes": s.writes}
        for s in specs
    ]
    files["tools_index.json"] = _dump(index)
    for spec, tool in zip(specs, tools, strict=True):
        files[f"{tool['name']}.input.json"] = _dump(tool_for(spec).documented)
        files[f"{tool['name']}.output.json"] = _dump(tool.get("outputSchema"))
    return files


def _elsewhere(files: dict[str, str]) -> dict[Path, str]:
    """Generated files outside the schema folder (the vocabulary, each tool's skill reference and the gate
    tables), from the schema files ``files``: path -> content."""
    out = {reference("vocabulary").path: render_vocabulary()}
    for path in GATE_TABLE_FILES:
        if path.exists():
            out[path] = with_gate_table(path.read_text(encoding="utf-8"))
    listed = {t["name"]: t for t in json.loads(files["tools_list.json"])}
    for spec in registered_specs(read_only=False):
        page = tool_reference(spec.name)
        if page is not None:
            documented = json.loads(files[f"{spec.name}.input.json"])
            out[page.path] = render_tool_reference(page.title, listed[spec.name], documented, spec.details)
    return out


def write_schemas() -> list[Path]:
    """Regenerate the schema files (removing stale ones); returns the paths written."""
    files = render_schemas()
    for stale in SCHEMA_DIR.glob("*.json"):
        if stale.name not in files:
            stale.unlink()
    targets = {SCHEMA_DIR / name: content for name, content in files.items()} | _elsewhere(files)
    for path, content in targets.items():
        path.write_text(content, encoding="utf-8")
    return list(targets)


def _shown(path: Path) -> str:
    """A generated file's path as a drift line names it: inside the package, else as it is."""
    return str(path.relative_to(SCHEMA_DIR.parent)) if path.is_relative_to(SCHEMA_DIR.parent) else path.name


def check_schemas() -> list[str]:
    """Differences between the checked-in files and freshly generated ones (empty when in sync)."""
    files = render_schemas()
    drift: list[str] = []
    targets = {SCHEMA_DIR / name: content for name, content in files.items()} | _elsewhere(files)
    for path, content in targets.items():
        name = path.name if path.parent == SCHEMA_DIR else _shown(path)
        if not path.exists():
            drift.append(f"missing: {name}")
        elif path.read_text(encoding="utf-8") != content:
            drift.append(f"changed: {name}")
    for path in SCHEMA_DIR.glob("*.json"):
        if path.name not in files:
            drift.append(f"stale: {path.name}")
    return drift
