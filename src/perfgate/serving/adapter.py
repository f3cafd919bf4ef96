"""Turn a `ToolSpec` into the function the MCP SDK registers.

The SDK derives a tool's input schema from the function signature. Each tool declares one pydantic
input model; here its fields become flat keyword parameters (so the schema is flat, not nested under
one argument), and the call re-validates them through the model so cross-field validators run too.
"""

from __future__ import annotations

import base64
import functools
import inspect
import logging
from typing import Annotated, Any, cast

from mcp.server.mcpserver import Context
from mcp.server.mcpserver.exceptions import UnexpectedToolError
from mcp.server.mcpserver.tools import Tool
from mcp.server.mcpserver.utilities.func_metadata import FuncMetadata
from mcp.types import CallToolResult, ImageContent, TextContent
from pydantic import BaseModel, Field, PrivateAttr, ValidationError, WithJsonSchema

from perfgate.errors import ToolError
from perfgate.serving.answer import answer_text
from perfgate.serving.failures import argument_message, crash_message, field_errors
from perfgate.serving.gating import APPROVAL_PARAM, PREPARED_PARAM, gate_parameters, settle
from perfgate.serving.lean import inline_refs, lean_schema, listed_schema
from perfgate.serving.runtime import ToolRuntime
from perfgate.serving.spec import AnySpec
from perfgate.serving.state import AppState

__all__ = ["AppState", "PerfgateTool", "make_tool_function", "validation_message"]

logger = logging.getLogger(__name__)


def validation_message(tool: str, exc: ValidationError, model: type[BaseModel]) -> str:
    """Pydantic's errors for ``model`` as one line per field, in words (see `field_errors`)."""
    return argument_message(tool, field_errors(exc, model.model_json_schema()))


_JSON_SPACE = " \t\n\r"


_INPUT = "__perfgate_input__"
"""The keyword under which `_Metadata.validate_arguments` hands the tool function its validated input."""


class _Metadata(FuncMetadata):
    """The SDK's argument handling, without its cost for plain string arguments, and validating once.

    The SDK tries every string argument (of a field not typed ``str``) as JSON and keeps what parses to
    an array, an object or null (clients that send ``"[1, 2]"`` for a list); a failed parse costs more
    than validating the whole call. Only a JSON text opening with ``[``, ``{`` or ``n`` can parse to
    one of those, so the SDK's own pass runs only when an argument could.

    With ``input_model`` (a tool without a command gate), arguments the tool's input model accepts are
    validated by it alone, the one validation whose result the tool uses, instead of by the SDK's model
    of the flat parameters and then again by the input model (the SDK model's fields are the input
    model's: same types and constraints). Arguments it refuses take the two steps as before, so every
    refusal reads as before (tested over each tool's parameters).
    """

    input_model: Annotated[Any, WithJsonSchema(None)] = None

    def validate_arguments(self, arguments_to_validate: dict[str, Any]) -> dict[str, Any]:
        model = self.input_model
        if model is not None:
            try:
                return {_INPUT: model.model_validate(self.pre_parse_json(arguments_to_validate))}
            except ValidationError:
                pass  # refused: the two steps as before, which word the refusal as before
        return super().validate_arguments(arguments_to_validate)

    def pre_parse_json(self, data: dict[str, Any]) -> dict[str, Any]:
        if any(isinstance(v, str) and v.lstrip(_JSON_SPACE)[:1] in ("[", "{", "n") for v in data.values()):
            return super().pre_parse_json(data)
        return data.copy()

    def convert_result(self, result: Any) -> Any:
        """The SDK's conversion, less its second validation of an `_Answer`: the structured content of one
        is the JSON dump of the tool's own output model instance (or the ledger's stored copy of that
        dump, equal to it), so validating it against that model again only rebuilds the model."""
        if type(result) is _Answer and not result.is_error:
            return result
        return super().convert_result(result)


def compact_schema(schema: Any) -> Any:
    """``schema`` with each ``anyOf`` of bare types (``{"type": "number"}, {"type": "null"}``, pydantic's
    form of an optional field) written as one type list (``"type": ["number", "null"]``).

    The same values validate; a client that checks every result against the output schema (the SDK's
    does) evaluates one keyword per optional field instead of a combinator over two subschemas, which
    is most of its cost for a result with many optional fields.
    """
    if isinstance(schema, list):
        return [compact_schema(v) for v in cast("list[Any]", schema)]
    if not isinstance(schema, dict):
        return schema
    node = {k: compact_schema(v) for k, v in cast("dict[str, Any]", schema).items()}
    options = node.get("anyOf")
    if (
        isinstance(options, list)
        and "type" not in node
        and options
        and all(
            isinstance(o, dict) and set(cast("dict[str, Any]", o)) == {"type"} and isinstance(o["type"], str)
            for o in cast("list[Any]", options)
        )
    ):
        types = [cast("dict[str, str]", o)["type"] for o in cast("list[Any]", options)]
        if len(set(types)) == len(types):
            del node["anyOf"]
            node["type"] = types
    return node


class PerfgateTool(Tool):
    """A registered tool whose failures all reach the agent as sentences.

    Arguments are checked before the SDK sees them: unknown fields are refused by name (the input schema
    says ``additionalProperties: false``) and type errors come one line per field, instead of pydantic's
    raw text. A crash the tool did not anticipate becomes a `ToolError` naming what happened (the
    traceback still goes to the server log) instead of a bare "Error executing tool X".
    """

    _documented: dict[str, Any] = PrivateAttr(default_factory=dict[str, Any])

    @property
    def documented(self) -> dict[str, Any]:
        """The input schema with every field's description (``parameters`` is the listed one)."""
        return self._documented

    @classmethod
    def for_function(cls, fn: Any, **kwargs: Any) -> PerfgateTool:
        tool = cls.from_function(fn, **kwargs)
        assert isinstance(tool, PerfgateTool)
        tool._documented = {**lean_schema(tool.parameters), "additionalProperties": False}
        tool.parameters = listed_schema(tool._documented)
        meta = tool.fn_metadata
        tool.fn_metadata = _Metadata(
            arg_model=meta.arg_model,
            output_schema=(
                compact_schema(inline_refs(meta.output_schema)) if meta.output_schema is not None else None
            ),
            output_model=meta.output_model,
            wrap_output=meta.wrap_output,
            input_model=getattr(fn, _INPUT, None),
        )
        return tool

    def _argument_error(self, arguments: dict[str, Any], exc: ValidationError | None) -> ToolError | None:
        """Every problem with ``arguments`` in words: unknown fields by name, then one line per field
        from ``exc`` (the SDK's validation of the same arguments, when it failed)."""
        model = self.fn_metadata.arg_model
        known = {info.alias or name for name, info in model.model_fields.items()}
        lines = [
            f"{key}: unknown field; this tool takes: {', '.join(sorted(known))}"
            for key in sorted(arguments)
            if key not in known
        ]
        if exc is None and lines:
            try:  # the parameters' own model: the unknown fields are reported above, not again
                FuncMetadata.validate_arguments(self.fn_metadata, arguments)
            except ValidationError as found:
                exc = found
        if exc is not None:
            lines += field_errors(exc, self._documented)
        return ToolError(argument_message(self.name, lines)) if lines else None

    async def run(self, arguments: dict[str, Any], context: Any, convert_result: bool = False) -> Any:
        # Arguments are validated once, by the SDK: its failure (a ToolError caused by the
        # ValidationError itself, where a failing tool body's is caused by the body's error) is rewritten.
        properties = cast("dict[str, Any]", self.parameters.get("properties") or {})
        if any(key not in properties for key in arguments):
            error = self._argument_error(arguments, None)
            assert error is not None
            raise error
        try:
            return await super().run(arguments, context, convert_result=convert_result)
        except UnexpectedToolError as exc:
            cause = exc.__cause__
            if cause is None or isinstance(cause, UnexpectedToolError):
                raise
            logger.error("tool %r crashed", self.name, exc_info=cause)
            raise ToolError(crash_message(self.name, cause)) from cause
        except ToolError as exc:
            if isinstance(exc.__cause__, ValidationError):
                error = self._argument_error(arguments, exc.__cause__)
                if error is not None:
                    raise error from None
            raise


class _Answer(CallToolResult):
    """What `_answer` returns: a `CallToolResult` (same fields, same wire form) whose structured content is
    the dump of a validated instance of the tool's output model."""


def _answer(spec: AnySpec, out: BaseModel, runtime: ToolRuntime) -> CallToolResult:
    """The structured result; as text, its budgeted brief (`answer_text`); the key plot as an image (or
    a note that plots are off)."""
    aliased = _aliased(type(out))
    committed = runtime.committed
    if not aliased and committed is not None and committed[0] is out:
        # What the ledger stored of this very output: its dump, through JSON. Stored keys are sorted; the
        # answer lists the top-level fields in the model's order, as a dump would (the lead fields first).
        stored = committed[1]
        structured = {**{name: stored[name] for name in type(out).model_fields if name in stored}, **stored}
    else:
        structured = out.model_dump(mode="json", by_alias=True)
    # Without aliases the dump by alias is the dump by name: made once for both.
    text = answer_text(spec.name, out, spec.brief, result=None if aliased else structured)
    content: list[TextContent | ImageContent] = [TextContent(type="text", text=text)]
    if runtime.key_image is not None:
        data = base64.b64encode(runtime.key_image).decode()
        content.append(ImageContent(type="image", data=data, mime_type="image/png"))
    if runtime.plots_off is not None:
        content.append(TextContent(type="text", text=runtime.plots_off))
    # Only an instance of the declared model skips the SDK's second validation (`_Metadata.convert_result`).
    kind = _Answer if isinstance(out, spec.output_model) else CallToolResult
    return kind(content=list(content), structured_content=structured)


@functools.cache
def _aliased(model: type[BaseModel]) -> bool:
    """Whether some field of ``model`` (at any depth) is named otherwise on the wire."""
    return model.model_json_schema(by_alias=True, mode="serialization") != model.model_json_schema(
        by_alias=False, mode="serialization"
    )


def _parameters(model: type[BaseModel]) -> list[inspect.Parameter]:
    params: list[inspect.Parameter] = []
    for name, info in model.model_fields.items():
        described = Field(
            description=info.description,
            title=info.title,
            examples=info.examples,
            json_schema_extra=info.json_schema_extra,
        )
        annotation: Any = Annotated[(info.annotation, *info.metadata, described)]  # pyright: ignore[reportInvalidTypeArguments]
        if info.is_required():
            default: Any = inspect.Parameter.empty
        else:
            default = info.get_default(call_default_factory=True)
        params.append(
            inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=annotation)
        )
    return params


def make_tool_function(spec: AnySpec, get_state: Any) -> Any:
    """Build the async function registered with the SDK for ``spec``.

    ``get_state(ctx)`` returns the `AppState` of the running server.
    """

    def validate(kwargs: dict[str, Any]) -> BaseModel:
        try:
            return spec.input_model.model_validate(kwargs)
        except ValidationError as exc:
            raise ToolError(validation_message(spec.name, exc, spec.input_model)) from exc

    def make_runtime(ctx: Context, inp: BaseModel) -> ToolRuntime:
        state: AppState = get_state(ctx)
        return ToolRuntime(
            config=state.config, ledger=state.ledger, tool=spec.name, inputs=inp.model_dump(mode="json")
        )

    async def tool_function(ctx: Context, **kwargs: Any) -> Any:
        state: AppState = get_state(ctx)
        grant = None
        if spec.command is not None:
            prepared = kwargs.pop(PREPARED_PARAM)
            grant = await settle(spec, prepared, kwargs.pop(APPROVAL_PARAM), ctx, state.execution)
            inp = prepared.inp
        else:
            inp = kwargs.pop(_INPUT, None)
            if inp is None:  # validated by the SDK's parameter model only: the input model's turn
                inp = validate(kwargs)

        async def report(progress: float, total: float | None, message: str | None) -> None:
            await ctx.report_progress(progress, total, message)

        runtime = ToolRuntime(
            config=state.config,
            ledger=state.ledger,
            tool=spec.name,
            inputs=inp.model_dump(mode="json"),
            report=report,
            commands=state.execution.runner(grant, report) if spec.command is not None else None,
        )
        out = await spec.run(inp, runtime)
        return _answer(spec, out, runtime)

    params = [
        inspect.Parameter("ctx", inspect.Parameter.KEYWORD_ONLY, annotation=Context),
        *_parameters(spec.input_model),
    ]
    if spec.command is not None:
        params += gate_parameters(spec, validate, make_runtime, lambda ctx: get_state(ctx).execution)
    tool_function.__name__ = spec.name
    tool_function.__qualname__ = spec.name
    tool_function.__doc__ = spec.description
    tool_function.__signature__ = inspect.Signature(params, return_annotation=spec.output_model)  # type: ignore[attr-defined]  # the SDK reads the signature
    tool_function.__annotations__ = {p.name: p.annotation for p in params} | {"return": spec.output_model}
    if spec.command is None:  # validated once, by the input model (`_Metadata`); gated tools keep both
        setattr(tool_function, _INPUT, spec.input_model)
    return tool_function
