"""What a tool module declares: its models, its function and its annotation hints."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from pydantic import BaseModel

from perfgate.tools._runtime import ToolRuntime

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


AnySpec = ToolSpec[Any, Any]
