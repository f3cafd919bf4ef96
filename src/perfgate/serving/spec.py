"""What a tool module declares: its models, its function and its annotation hints."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from pydantic import BaseModel

from perfgate.execution.request import CommandRequest
from perfgate.serving.runtime import ToolRuntime

__all__ = ["ToolSpec"]

InT = TypeVar("InT", bound=BaseModel)
OutT = TypeVar("OutT", bound=BaseModel)


@dataclass(frozen=True)
class ToolSpec(Generic[InT, OutT]):
    """One MCP tool.

    ``run`` receives the validated input model and a per-call `ToolRuntime`; it returns the output
    model, whose ``evidence_id`` and ``state`` come from the record it committed. The four hints are
    always explicit (clients decide what needs a human's confirmation from them).

    ``runs_commands`` tools are not registered on a ``--read-only`` server, nor are ``writes``
    tools (those that change decisions or other non-evidence state).

    A tool that runs commands declares ``command``: it returns the `CommandRequest` a call wants to run
    (None when that call runs nothing). It must be deterministic in its input: the approval gate calls it
    before the tool body (possibly once per protocol round), and the body may run only that request,
    through ``rt.run_command``.

    ``description`` is what tools/list carries, in every turn of the client's context: what the tool is
    for and when to call it, in a sentence or two. ``details`` (the tool's skill reference page, with every
    field's description) has the rest.

    ``brief`` returns the few lines that lead the text an agent reads (headline figures, the next call);
    without it the common fields lead (see `perfgate.serving.answer`).
    """

    name: str
    title: str
    description: str
    input_model: type[InT]
    output_model: type[OutT]
    run: Callable[[InT, ToolRuntime], Awaitable[OutT]]
    read_only: bool
    destructive: bool
    idempotent: bool
    open_world: bool
    runs_commands: bool = False
    writes: bool = False
    command: Callable[[InT, ToolRuntime], CommandRequest | None] | None = None
    brief: Callable[[OutT], list[str]] | None = None
    details: str = ""

    def __post_init__(self) -> None:
        assert self.runs_commands == (self.command is not None), (
            f"{self.name}: runs_commands=True needs a command function, and only then"
        )


AnySpec = ToolSpec[Any, Any]
