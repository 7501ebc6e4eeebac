"""Google ADK: every tool of every agent through a guard (``pip install 'toolfault[adk]'``).

``Runner(..., plugins=[ToolfaultPlugin(guard)])``.  The plugin answers each tool call from
``before_tool_callback``: it runs the tool (``tool.run_async``, the same call ADK would make,
with the same ``ToolContext``) inside :meth:`Guard.acall`, so arguments are checked against the
tool's own declaration, identical failing calls are capped before the tool runs again,
transient failures are retried inside the wrapper, budgets and effect checks apply, and
nothing is raised into the runner.  A failure is the tool response ``{"error": "<four-part
text>"}`` (ADK's own convention for errors); a success is the tool's value, unchanged.  A read
that returns the same result as the identical call before it in the turn gets the repeat note
(:attr:`ToolResult.note`) beside its value, under ``"note"`` in the response the model reads:
a copy of the tool's dict, or ADK's ``{"result": value}`` wrapping for any other value.
ADK's ``after_tool_callback`` hooks still see every response.

Where ADK must keep the call to itself, the plugin steps aside: a tool waiting on a human
confirmation (ADK asks, and the confirmed call then runs guarded), long-running tools (their
response arrives later), and names no agent has (ADK lists the tools it has).  An exception
from a call the plugin did not run is still answered in the contract by
``on_tool_error_callback``, unless a later plugin or callback answers it.

Counters are scoped per ADK session (app, user and session id), each in its own
:meth:`Guard.scoped` scope, and each invocation (a new user message) starts a new turn.
``conversation=`` picks another key from the ``ToolContext``.

A halt ends the invocation: the model request that would follow a halted call is answered by
the plugin with ``"Stopped: <halt message>"``, a final response, and the invocation is ended,
so no agent of it calls the model again.  Subclass to change :meth:`ToolfaultPlugin.halt_text`.
"""

from __future__ import annotations

import asyncio
import contextvars
import threading
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from toolfault._errors import ToolError
from toolfault._guard import Guard
from toolfault._schema import JsonSchemaValidator
from toolfault.adapters._extras import missing_extra
from toolfault.adapters._hosted import ANY_OBJECT, ScopeRegistry, register

try:
    from google.adk.agents.callback_context import CallbackContext
    from google.adk.models.llm_request import LlmRequest
    from google.adk.models.llm_response import LlmResponse
    from google.adk.plugins.base_plugin import BasePlugin
    from google.adk.tools.base_tool import BaseTool
    from google.adk.tools.tool_context import ToolContext
    from google.genai import types
except ModuleNotFoundError as exc:
    missing_extra(exc, "adk", "adk", "google.adk", "google.genai")

__all__ = ["ToolfaultPlugin", "session_guard"]

Conversation = Callable[[ToolContext], "str | None"]

_MARK = "_toolfault_adk"
_scopes = ScopeRegistry("session")


@dataclass
class _Call:
    """One call in flight: the tool object and context the guard's registered body runs."""

    tool: BaseTool
    context: ToolContext
    validator: JsonSchemaValidator | None

    async def run(self, kwargs: dict[str, Any]) -> Any:
        if self.validator is not None:
            _, problems = self.validator.validate(kwargs)
            if problems:
                first = problems[0]
                raise ToolError("invalid_argument", first.reason, param=first.param,
                                next_action=first.next_action)
        return await self.tool.run_async(args=kwargs, tool_context=self.context)


_current: contextvars.ContextVar[_Call | None] = contextvars.ContextVar(
    "toolfault_adk_call", default=None)


def _body() -> Callable[..., Any]:
    """What the guard runs for an ADK tool: the call in flight."""

    async def run_adk_tool(**kwargs: Any) -> Any:
        call = _current.get()
        if call is None:
            raise ToolError("invalid_call", "this tool runs only inside an ADK invocation",
                            next_action="stop and report this failure to the user")
        return await call.run(kwargs)

    return run_adk_tool


def _declared_schema(tool: BaseTool) -> Mapping[str, Any] | None:
    """The JSON Schema the model was shown for ``tool``, if ADK can say."""
    try:
        declaration = tool._get_declaration()
    except Exception:  # a tool that cannot declare itself is validated by itself
        return None
    schema = getattr(declaration, "parameters_json_schema", None)
    if isinstance(schema, Mapping):
        return schema
    parameters = getattr(declaration, "parameters", None)
    if isinstance(parameters, types.Schema):
        dumped: dict[str, Any] = parameters.json_schema.model_dump(mode="json",
                                                                   exclude_none=True)
        return dumped
    return None


def _noted(value: Any, note: str) -> dict[str, Any]:
    """The function response for ``value`` with ``note`` beside it: a copy of a dict (never
    the tool's own), or ADK's ``{"result": value}`` wrapping of any other value, plus
    ``"note"`` (``"_note"`` and so on if the tool's dict has that key), so the value stays
    where ADK would have put it."""
    response: dict[str, Any] = dict(value) if isinstance(value, dict) else {"result": value}
    key = "note"
    while key in response:
        key = f"_{key}"
    response[key] = note
    return response


def session_guard(guard: Guard, app_name: str, user_id: str, session_id: str) -> Guard:
    """The scope that counts one ADK session's calls (its incidents, ledger and turn)."""
    return _scopes.scope(guard, f"{app_name}/{user_id}/{session_id}", None)


class ToolfaultPlugin(BasePlugin):
    """An ADK plugin that runs every tool call of every agent through ``guard``.

    ``tool_options`` passes :meth:`Guard.tool` options per tool name (``side_effect=True``,
    ``alternatives=[...]``); each tool is registered on the guard the first time it is called.
    """

    def __init__(self, guard: Guard, *, name: str = "toolfault",
                 tool_options: Mapping[str, Mapping[str, Any]] | None = None,
                 conversation: Conversation | None = None) -> None:
        super().__init__(name)
        self.guard = guard
        self.tool_options = dict(tool_options or {})
        self.conversation = conversation
        self._lock = threading.Lock()
        self._halted: dict[str, str] = {}  # invocation id -> halt message
        self._validators: weakref.WeakKeyDictionary[BaseTool, JsonSchemaValidator | None] = (
            weakref.WeakKeyDictionary())

    def halt_text(self, message: str) -> str:
        """The final response that ends a halted invocation."""
        return f"Stopped: {message}"

    async def before_tool_callback(self, *, tool: BaseTool, tool_args: dict[str, Any],
                                   tool_context: ToolContext) -> dict[str, Any] | None:
        if not await self._guards(tool, tool_args, tool_context):
            return None
        name = tool.name
        register(self.guard, name, tool.description, self.tool_options.get(name, {}), _MARK,
                 _body)
        call = _Call(tool, tool_context, self._validator(tool))
        token = _current.set(call)
        try:
            result = await self._scope(tool_context).acall(
                name, tool_args, call_id=tool_context.function_call_id)
        finally:
            _current.reset(token)
        if result.ok:
            value = result.data
            if result.note is not None:
                return _noted(value, result.note)
            return {"result": None} if value is None else value
        if result.halt:
            with self._lock:
                self._halted.setdefault(tool_context.invocation_id, result.text)
        return {"error": result.text}

    async def on_tool_error_callback(self, *, tool: BaseTool, tool_args: dict[str, Any],
                                     tool_context: ToolContext, error: Exception
                                     ) -> dict[str, Any] | None:
        if isinstance(error, asyncio.CancelledError) or type(tool) is BaseTool:
            return None  # a cancellation stays one; an unknown name is ADK's to answer
        shaped = self.guard.shape(tool.name, tool_args, error,
                                  call_id=tool_context.function_call_id)
        return {"error": shaped.text}

    async def before_model_callback(self, *, callback_context: CallbackContext,
                                    llm_request: LlmRequest) -> LlmResponse | None:
        with self._lock:
            message = self._halted.get(callback_context.invocation_id)
        if message is None:
            return None
        callback_context.get_invocation_context().end_invocation = True
        return LlmResponse(content=types.Content(
            role="model", parts=[types.Part.from_text(text=self.halt_text(message))]))

    async def after_run_callback(self, *, invocation_context: Any) -> None:
        with self._lock:
            self._halted.pop(invocation_context.invocation_id, None)

    async def _guards(self, tool: BaseTool, args: dict[str, Any], context: ToolContext
                      ) -> bool:
        """Whether the plugin runs this call (see the module docstring for when it does not)."""
        if (type(tool) is BaseTool or tool.is_long_running
                or getattr(tool, "_defers_response", False)):
            return False
        if await tool.check_require_confirmation(args, context) is True:
            confirmation = context.tool_confirmation
            return confirmation is not None and confirmation.confirmed
        return True

    def _validator(self, tool: BaseTool) -> JsonSchemaValidator | None:
        """The validator for ``tool``'s declared schema (kept per tool object)."""
        with self._lock:
            if tool in self._validators:
                return self._validators[tool]
        schema = _declared_schema(tool)
        validator = None
        if schema is not None and schema != ANY_OBJECT:
            try:
                validator = JsonSchemaValidator(tool.name, schema)
            except Exception:  # a schema jsonschema cannot check is left to the tool
                validator = None
        with self._lock:
            self._validators[tool] = validator
        return validator

    def _scope(self, context: ToolContext) -> Guard:
        if self.conversation is not None:
            key = self.conversation(context)
        else:
            session = context.session
            key = f"{session.app_name}/{session.user_id}/{session.id}"
        return _scopes.scope(self.guard, key, context.invocation_id)
