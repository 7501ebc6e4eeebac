"""OpenAI Agents SDK: the guard's tools as ``FunctionTool`` objects, and a failure formatter.

:func:`function_tools` is the full integration: the SDK hands each call's raw JSON to the
guard, so validation, fingerprint caps, in-wrapper backoff, budgets and effect checks all
apply, and the tool never raises (an exception escaping ``on_invoke_tool`` fails the whole
run).

:func:`failure_error_function` is the light one, for tools already decorated with
``@function_tool``: the SDK still runs the tool, and only its *error text* is shaped into the
four-part contract by :meth:`Guard.shape`.  That is the trade-off: no caps (the SDK runs the
body every time, so the terminal message is never sent, and no retry-cap incident is
raised), no in-wrapper retries, no budgets.  The guard's observers and tracing do see each
shaped error, not counted against anything.  Prefer :func:`function_tools` where you can.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from typing import Any

import jsonschema
from agents import FunctionTool, RunContextWrapper
from agents.exceptions import ModelBehaviorError
from agents.tool import ToolErrorFunction, default_tool_error_function
from agents.tool_context import ToolContext

from toolfault._errors import ToolError
from toolfault._guard import Guard
from toolfault._schema import JsonSchemaValidator
from toolfault._tool import ToolSpec

__all__ = ["failure_error_function", "function_tools"]


def function_tools(guard: Guard) -> list[FunctionTool]:
    """One ``FunctionTool`` per registered tool, each running its calls through the guard.

    The schema is published as the guard built it (``strict_json_schema=False``): the SDK's
    strict rewrite would make optional parameters required.
    """
    return [_function_tool(guard, spec) for spec in guard.tools.values()]


def _function_tool(guard: Guard, spec: ToolSpec) -> FunctionTool:
    name = spec.name

    async def on_invoke_tool(ctx: ToolContext[Any], args_json: str) -> str:
        result = await guard.acall(name, args_json, call_id=ctx.tool_call_id)
        return result.text

    return FunctionTool(
        name=name, description=spec.description,
        params_json_schema=copy.deepcopy(spec.schema), on_invoke_tool=on_invoke_tool,
        strict_json_schema=False,
    )


def failure_error_function(guard: Guard) -> ToolErrorFunction:
    """A ``failure_error_function`` for ``@function_tool`` that answers in the four-part contract.

    Each error goes through :meth:`Guard.shape`, so the guard's catalog, redactor, mode and
    observers apply; see the module docstring for what it cannot do.  Arguments the SDK
    rejected are re-checked against the tool's schema, so the model learns which parameter to
    fix instead of the SDK's bare "Invalid JSON input".
    """

    def format_error(ctx: RunContextWrapper[Any], error: Exception) -> str:
        try:
            # The SDK may hand over a bare RunContextWrapper, without the tool's details.
            name = str(getattr(ctx, "tool_name", "") or "tool")
            args = getattr(ctx, "tool_arguments", None)
            shaped: BaseException = error
            if isinstance(error, ModelBehaviorError):
                shaped = _rejected(guard, ctx, name, args)
            return guard.shape(name, args, shaped,
                               call_id=getattr(ctx, "tool_call_id", None)).text
        except Exception:  # a raising formatter would fail the whole run
            return default_tool_error_function(ctx, error)

    return format_error


def _rejected(guard: Guard, ctx: RunContextWrapper[Any], name: str, args: Any) -> ToolError:
    """Why the SDK rejected the arguments, from the guard's tool or else the agent's schema.

    Arguments that are not JSON need nothing here: :meth:`Guard.shape` answers
    ``invalid_json`` for them before it looks at the error.
    """
    spec = guard.tools.get(name)
    validator = spec.validator if spec is not None else _agent_validator(ctx, name)
    if validator is not None:
        try:
            parsed = json.loads(args) if isinstance(args, (str, bytes)) else args
        except (ValueError, RecursionError):
            parsed = None
        if isinstance(parsed, dict):
            _, problems = validator.validate(parsed)
            if problems:
                first = problems[0]
                return ToolError("invalid_argument", first.reason,
                                 next_action=first.next_action, param=first.param)
    return ToolError("invalid_argument", "the arguments do not match the tool's parameters")


def _agent_validator(ctx: RunContextWrapper[Any], name: str) -> JsonSchemaValidator | None:
    """A validator for the schema the agent published for ``name`` (a ``@function_tool``)."""
    for tool in getattr(getattr(ctx, "agent", None), "tools", None) or ():
        schema = getattr(tool, "params_json_schema", None)
        if getattr(tool, "name", None) == name and isinstance(schema, Mapping):
            try:
                return JsonSchemaValidator(name, schema)
            except jsonschema.SchemaError:
                return None
    return None
