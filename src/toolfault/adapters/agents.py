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

Runs scope themselves: each ``Runner.run`` counts in a :meth:`Guard.scoped` scope of its own
(keyed by the run's context), so two runs at once never share a counter and a new run starts
fresh.  Pass ``conversation=`` (a function of the tool context returning a key, such as
``lambda ctx: ctx.context.user_id``) to carry counts across the runs of one conversation; each
new run is then a new turn of it.

A halt ends the run: with ``tool_use_behavior=stop_on_halt`` on the agent, a tool call the
guard halted becomes the run's final output (``"Stopped: <halt message>"``) instead of going
back to a model that would only call again until ``MaxTurnsExceeded``.
"""

from __future__ import annotations

import copy
import json
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any

import jsonschema

from toolfault._errors import ToolError
from toolfault._guard import Guard
from toolfault._schema import JsonSchemaValidator
from toolfault._tool import ToolSpec
from toolfault.adapters._extras import missing_extra

try:
    from agents import FunctionTool, RunContextWrapper
    from agents.agent import ToolsToFinalOutputResult
    from agents.exceptions import ModelBehaviorError
    from agents.tool import FunctionToolResult, ToolErrorFunction, default_tool_error_function
    from agents.tool_context import ToolContext
except ModuleNotFoundError as exc:
    missing_extra(exc, "agents", "agents", "agents", "openai")

__all__ = ["HaltedOutput", "failure_error_function", "function_tools", "stop_on_halt"]

#: Runs and conversations whose scopes one set of tools keeps (oldest dropped first).
MAX_SCOPES = 4096

Conversation = Callable[[ToolContext[Any]], "str | None"]


class HaltedOutput(str):
    """A tool output with which the guard ended the turn (reads as the halt message)."""

    __slots__ = ()
    halt = True


class _Runs:
    """One scope per run (or per conversation key), and a new turn for each new run."""

    def __init__(self, guard: Guard, conversation: Conversation | None) -> None:
        self.guard = guard
        self.conversation = conversation
        self.lock = threading.Lock()
        self.scopes: OrderedDict[Any, tuple[Guard, weakref.ReferenceType[Any] | None]] = (
            OrderedDict())
        self.serial = 0

    def scope(self, ctx: ToolContext[Any]) -> Guard:
        """The scope ``ctx``'s call counts in: its run's (or its conversation's, where one
        is named), a new turn of it for each new run."""
        # The run's Usage object is shared by every tool context of one run, and only by it.
        run = getattr(ctx, "usage", None)
        run_ref = _weak(run)
        key = self._key(ctx, run)
        with self.lock:
            entry = self._live(key, run)
            if entry is None:
                return self._new_scope(key, run_ref)
            scoped, seen = entry
            self.scopes.move_to_end(key)
            if seen is None or seen() is not run:
                scoped.new_turn()  # the conversation's next run
                self.scopes[key] = (scoped, run_ref)
            return scoped

    def _key(self, ctx: ToolContext[Any], run: Any) -> tuple[str, Any]:
        """The conversation ``conversation(ctx)`` names, else the run itself."""
        if self.conversation is not None:
            named = self.conversation(ctx)
            if named is not None:
                return ("conversation", str(named))
        return ("run", id(run))

    def _live(self, key: tuple[str, Any], run: Any
              ) -> tuple[Guard, weakref.ReferenceType[Any] | None] | None:
        """The key's entry, unless it is a run's and that run is gone (its id reused by a
        later run): then it is none."""
        entry = self.scopes.get(key)
        if entry is not None and key[0] == "run" and (entry[1] is None or entry[1]() is not run):
            return None
        return entry

    def _new_scope(self, key: tuple[str, Any], run_ref: weakref.ReferenceType[Any] | None
                   ) -> Guard:
        """A fresh scope for the key, the oldest dropped past ``MAX_SCOPES``."""
        self.serial += 1
        label = f"conversation-{key[1]}" if key[0] == "conversation" else f"run-{self.serial}"
        scoped = self.guard.scoped(f"{self.guard.task_id}/{label}")
        self.scopes[key] = (scoped, run_ref)
        while len(self.scopes) > MAX_SCOPES:
            self.scopes.popitem(last=False)
        return scoped


def _weak(run: Any) -> weakref.ReferenceType[Any] | None:
    """A weak reference to the run (``None`` where it takes none): a finished run is not
    kept alive by its scope."""
    try:
        return weakref.ref(run)
    except TypeError:
        return None


def function_tools(guard: Guard, *, conversation: Conversation | None = None
                   ) -> list[FunctionTool]:
    """One ``FunctionTool`` per registered tool, each running its calls through the guard.

    The schema is published as the guard built it (``strict_json_schema=False``): the SDK's
    strict rewrite would make optional parameters required.  Calls count per run, or per
    ``conversation(ctx)`` key when given (see the module docstring).
    """
    runs = _Runs(guard, conversation)
    return [_function_tool(guard, spec, runs) for spec in guard.tools.values()]


def stop_on_halt(ctx: RunContextWrapper[Any], results: list[FunctionToolResult]
                 ) -> ToolsToFinalOutputResult:
    """``tool_use_behavior`` that ends the run when the guard halted one of the tool calls.

    The final output is ``"Stopped: "`` and the halt message; otherwise the model runs on, as
    with the default ``"run_llm_again"``.
    """
    for result in results:
        if getattr(result.output, "halt", False) is True:
            return ToolsToFinalOutputResult(is_final_output=True,
                                            final_output=f"Stopped: {result.output}")
    return ToolsToFinalOutputResult(is_final_output=False, final_output=None)


def _function_tool(guard: Guard, spec: ToolSpec, runs: _Runs) -> FunctionTool:
    name = spec.name

    async def on_invoke_tool(ctx: ToolContext[Any], args_json: str) -> str:
        scoped = runs.scope(ctx)
        result = await scoped.acall(name, args_json, call_id=ctx.tool_call_id)
        if result.halt:
            return HaltedOutput(result.text)
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
