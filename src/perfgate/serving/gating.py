"""The approval gate as SDK resolvers: hidden parameters of every tool that runs commands.

A gated tool function gets two parameters the model never sees (they are not in the input schema):

- ``perfgate_prepared_command``: resolver `prepare` validates the input and computes the tool's
  `CommandRequest` (``ToolSpec.command``), once per call;
- ``perfgate_command_approval``: resolver `gate` (depending on `prepare`) returns a `Grant` when the
  allowlist or a human's CLI grant already approves the request, asks the human through elicitation
  (``Elicit``) when the client supports it, and otherwise raises the pending-approval `ToolError`.

The SDK runs resolvers before the tool body on both protocol generations (a mid-call elicitation request
on 2025-11-25, an ``InputRequiredResult`` round on 2026-07-28), passing tool arguments by name. Resolver
bodies re-run on every round, so they only read; decisions that the human's answer settles are recorded
by `settle` in the tool body, which runs once.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any

from mcp.server.mcpserver import (
    AcceptedElicitation,
    Context,
    Elicit,
    ElicitationResult,
    Resolve,
)
from mcp_types.version import is_version_at_least
from pydantic import BaseModel

from perfgate.execution.gate import ConsentForm, Grant
from perfgate.execution.request import CommandRequest
from perfgate.execution.service import ExecutionService
from perfgate.serving.runtime import ToolRuntime
from perfgate.serving.spec import AnySpec

__all__ = ["APPROVAL_PARAM", "PREPARED_PARAM", "Prepared", "client_label", "gate_parameters", "settle"]

PREPARED_PARAM = "perfgate_prepared_command"
INPUT_REQUIRED_VERSION = "2026-07-28"
"""First protocol revision that carries elicitation inside the tool result (no back-channel needed)."""
APPROVAL_PARAM = "perfgate_command_approval"


@dataclass(frozen=True)
class Prepared:
    """The validated input of one call and the command it wants (None: this call runs nothing)."""

    inp: BaseModel
    request: CommandRequest | None


def client_elicits(ctx: Context) -> bool:
    """Whether a form elicitation can reach the human on this call.

    The client must declare form elicitation (a bare ``elicitation: {}`` counts as form). On 2026-07-28
    the question rides the tool result, so that suffices; before it, the server sends a request mid-call,
    which needs a back-channel (a stateless HTTP server has none): without one, fall back to a pending
    approval instead of failing the call.
    """
    caps = ctx.client_capabilities
    elicitation = caps.elicitation if caps is not None else None
    if elicitation is None or (elicitation.form is None and elicitation.url is not None):
        return False
    version = ctx.protocol_version
    return (version is not None and is_version_at_least(version, INPUT_REQUIRED_VERSION)) or (
        ctx.session.can_send_request
    )


def client_label(ctx: Context) -> str:
    """Who answered an elicitation, as far as the server can tell: the MCP client that relayed it."""
    params = ctx.session.client_params
    info = params.client_info if params is not None else None
    name = f"{info.name} {info.version}" if info is not None else "an unnamed client"
    return f"user via MCP client {name} (elicitation; consent mediated by the client)"


def gate_parameters(
    spec: AnySpec,
    validate: Callable[[dict[str, Any]], BaseModel],
    make_runtime: Callable[[Context, BaseModel], ToolRuntime],
    get_execution: Callable[[Context], ExecutionService],
) -> list[inspect.Parameter]:
    """The two hidden resolver parameters to add to ``spec``'s tool function."""
    command = spec.command
    assert command is not None, f"{spec.name} runs commands but declares no ToolSpec.command"
    fields = list(spec.input_model.model_fields)
    assert not {PREPARED_PARAM, APPROVAL_PARAM} & set(fields), f"{spec.name}: input field names clash"

    async def prepare(ctx: Context, **kwargs: Any) -> Prepared:
        inp = validate(kwargs)
        request = command(inp, make_runtime(ctx, inp))
        # The approval binds the code the command runs, not only its argv (the server computes it).
        return Prepared(inp, None if request is None else await get_execution(ctx).bind(request))

    prepare.__qualname__ = f"{spec.name}.prepare"
    prepare.__signature__ = inspect.Signature(  # type: ignore[attr-defined]  # the SDK reads the signature
        [inspect.Parameter("ctx", inspect.Parameter.KEYWORD_ONLY, annotation=Context)]
        + [inspect.Parameter(f, inspect.Parameter.KEYWORD_ONLY) for f in fields]
    )
    prepare.__annotations__ = {"ctx": Context, "return": Prepared}

    prepared_annotation: Any = Annotated[Prepared, Resolve(prepare)]

    async def gate(ctx: Context, prepared: Prepared) -> Grant | Elicit[ConsentForm] | None:
        request = prepared.request
        if request is None:
            return None
        execution = get_execution(ctx)
        grant = await execution.preapproved(request, spec.name)
        if grant is not None:
            return grant
        if client_elicits(ctx):
            return Elicit(execution.gate.elicitation_message(request, spec.name), ConsentForm)
        await execution.require_human(request, spec.name)
        raise AssertionError("require_human always raises")

    gate.__qualname__ = f"{spec.name}.approval"
    # Set explicitly: the string annotations of a closure cannot be evaluated by the SDK.
    gate.__annotations__ = {
        "ctx": Context,
        "prepared": prepared_annotation,
        "return": Grant | Elicit[ConsentForm] | None,
    }
    approval_annotation: Any = Annotated[ElicitationResult[ConsentForm], Resolve(gate)]
    return [
        inspect.Parameter(PREPARED_PARAM, inspect.Parameter.KEYWORD_ONLY, annotation=prepared_annotation),
        inspect.Parameter(APPROVAL_PARAM, inspect.Parameter.KEYWORD_ONLY, annotation=approval_annotation),
    ]


async def settle(
    spec: AnySpec,
    prepared: Prepared,
    outcome: ElicitationResult[Any],
    ctx: Context,
    execution: ExecutionService,
) -> Grant | None:
    """The grant for this call once the resolvers ran; records an elicitation answer.

    Raises:
        ToolError: the human declined or cancelled (recorded in the ledger first).
    """
    request = prepared.request
    if request is None:
        return None
    if isinstance(outcome, AcceptedElicitation):
        data: object = outcome.data
        if isinstance(data, Grant):
            return data
        assert isinstance(data, ConsentForm), f"unexpected approval outcome {data!r}"
        return await execution.settle_elicitation(request, spec.name, "accept", client_label(ctx), data.note)
    return await execution.settle_elicitation(request, spec.name, outcome.action, client_label(ctx))
