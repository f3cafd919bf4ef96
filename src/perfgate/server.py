"""Build the MCP server: tools from the registry, the skill as resources and prompts, state in the lifespan."""

from __future__ import annotations

from collections.abc import AsyncGenerator
from contextlib import asynccontextmanager
from importlib import resources
from pathlib import Path

from mcp.server import MCPServer
from mcp.server.mcpserver import Context
from mcp.types import ToolAnnotations

from perfgate import __version__
from perfgate.tools import registered_specs
from perfgate.tools._adapter import AppState, make_tool_function
from perfgate.tools._runtime import ServerConfig

__all__ = ["INSTRUCTIONS", "build_server"]

INSTRUCTIONS = (
    "perfgate measures and proves deep-learning training speedups. Before optimizing, read the skill "
    "resource skill://perfgate/SKILL.md: it gives the loop (environment -> baseline windows -> profile -> "
    "one change -> correctness -> candidate windows -> compare -> decide) and which tool answers which "
    "question. Every tool result is evidence with an evidence_id and a state; cite evidence ids in "
    "record_decision. Profiled runs are never throughput evidence; profiler FLOPs are never MFU."
)


def _state(ctx: Context) -> AppState:
    state = ctx.request_context.lifespan_context
    assert isinstance(state, AppState)
    return state


def build_server(config: ServerConfig) -> MCPServer[AppState]:
    """A fully registered server for ``config`` (not yet running)."""

    @asynccontextmanager
    async def lifespan(_: MCPServer[AppState]) -> AsyncGenerator[AppState]:
        state = AppState(config)
        try:
            yield state
        finally:
            await state.aclose()  # stop any command still running: no orphan outlives the server

    server: MCPServer[AppState] = MCPServer(
        "perfgate",
        title="perfgate",
        version=__version__,
        instructions=INSTRUCTIONS,
        lifespan=lifespan,
    )
    for spec in registered_specs(config.read_only):
        server.add_tool(
            make_tool_function(spec, _state),
            name=spec.name,
            title=spec.title,
            description=spec.description,
            annotations=ToolAnnotations(
                read_only_hint=spec.read_only,
                destructive_hint=spec.destructive,
                idempotent_hint=spec.idempotent,
                open_world_hint=spec.open_world,
            ),
            structured_output=True,
        )
    _add_skill(server)
    return server


def _add_skill(server: MCPServer[AppState]) -> None:
    from mcp.server.mcpserver.resources import FileResource

    skill = resources.files("perfgate.skills").joinpath("SKILL.md")
    server.add_resource(
        FileResource(
            uri="skill://perfgate/SKILL.md",
            name="perfgate-skill",
            title="perfgate skill: how to optimize training with evidence",
            mime_type="text/markdown",
            path=Path(str(skill)),
        )
    )
