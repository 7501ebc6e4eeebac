"""Pydantic AI: every call of a toolset through a guard (``pip install 'toolfault[pydantic-ai]'``).

``Agent(model, toolsets=[GuardedToolset(FunctionToolset([...]), guard)])``: the toolset's tools
are published as they are (names, schemas, descriptions unchanged), and each call runs through
:meth:`Guard.acall`, so identical failing calls are capped, transient failures are retried
inside the wrapper, budgets and effect checks apply.  Each tool is registered on the guard
under its own name the first time the toolset lists it (``tool_options`` passes
:meth:`Guard.tool` options such as ``side_effect=True`` or ``alternatives=`` per tool name).

Why failures are not ``ModelRetry``: Pydantic AI counts every ``ModelRetry`` and argument
validation error against the tool's ``retries`` (1 by default) and then ends the run with
``UnexpectedModelBehavior``.  Here the toolset's own validator still decides what is valid
(coercions included), but a refusal, like any other failure, reaches the model as the
four-part text in a ``ToolFailed`` result: a tool return with ``outcome="failed"`` (the
provider's error flag where it has one), no retry prompt prepended, no retry budget used.  The
guard's caps bound the repeats instead.  ``CallDeferred``, ``ApprovalRequired`` and a rejected
``submit_output`` pass through untouched, so approval and deferred toolsets keep working.

Counts follow Pydantic AI's conversations: calls count per ``RunContext.conversation_id`` (a
fresh one per run, or the one carried by ``message_history``), each conversation in its own
:meth:`Guard.scoped` scope, and each new run of it starts a new turn.  Two runs at once never
share a counter.  ``conversation=`` picks another key (``lambda ctx: ctx.deps.user_id``; or
``lambda ctx: ctx.run_id`` to count every run apart).

A halt ends the run normally: the halted call submits ``"Stopped: <halt message>"`` as the
run's output (:meth:`RunContext.submit_output`), so the run ends after that step instead of
going back to a model that would only call again until a usage limit raises.  That needs an
output that accepts text (the default ``str``, or a union with it); with a structured-only
output the halt reaches the model as a failed tool result and ``UsageLimits`` bound the rest.

A read that returns the same result as the identical call before it in the turn keeps its
value as the tool return, and the repeat note (:attr:`ToolResult.note`) goes beside it as a
``ToolReturn``'s ``content``: Pydantic AI sends that to the model as a user-prompt part after
the turn's tool returns, named by the tool it is about.
"""

from __future__ import annotations

import contextvars
import inspect
import json
from collections.abc import Callable, Mapping
from dataclasses import KW_ONLY, dataclass, field, replace
from typing import Any

from toolfault._errors import ToolError
from toolfault._guard import Guard
from toolfault._schema import error_place, expected_words
from toolfault.adapters._extras import missing_extra
from toolfault.adapters._hosted import ScopeRegistry, register

try:
    from pydantic_ai.exceptions import (
        ApprovalRequired,
        CallDeferred,
        ModelRetry,
        ToolFailed,
        ToolRetryError,
        UserError,
    )
    from pydantic_ai.messages import ToolReturn
    from pydantic_ai.tools import AgentDepsT, RunContext
    from pydantic_ai.toolsets import AbstractToolset, FunctionToolset, WrapperToolset
    from pydantic_ai.toolsets.abstract import ToolsetTool
    from pydantic_core import ValidationError
except ModuleNotFoundError as exc:
    missing_extra(exc, "pydantic_ai", "pydantic-ai", "pydantic_ai")

__all__ = ["GuardedToolset", "conversation_guard"]

Conversation = Callable[[RunContext[Any]], "str | None"]

#: What a guard tool registered by this adapter is marked with (and the options it was given).
_MARK = "_toolfault_pydantic_ai"
#: Raised inside a guarded call, meant for Pydantic AI's loop rather than for the model.
_CONTROL = (CallDeferred, ApprovalRequired, ToolRetryError)


class _Sent(dict[str, Any]):
    """Arguments as the model sent them, not yet validated (``raw``: the JSON text, if any)."""

    __slots__ = ("raw",)

    def __init__(self, value: Mapping[str, Any], raw: str | None) -> None:
        super().__init__(value)
        self.raw = raw


class _PassThrough:
    """An ``args_validator`` that accepts anything: validation moves inside the guarded call."""

    def validate_json(self, input: str | bytes | bytearray, *, allow_partial: Any = False,
                      **kwargs: Any) -> Any:
        text = input.decode() if isinstance(input, (bytes, bytearray)) else input
        try:
            value = json.loads(text or "{}")
        except ValueError:
            value = None
        return _Sent(value if isinstance(value, dict) else {}, text or "{}")

    def validate_python(self, input: Any, *, allow_partial: Any = False, **kwargs: Any) -> Any:
        if isinstance(input, Mapping):
            return _Sent(input, None)
        return _Sent({}, input if isinstance(input, str) else json.dumps(input, default=str))


_PASS_THROUGH = _PassThrough()


@dataclass(kw_only=True)
class _GuardedTool(ToolsetTool[AgentDepsT]):
    """A listed tool whose validation was moved into the guarded call; ``inner`` is the original."""

    inner: ToolsetTool[AgentDepsT]


@dataclass
class _Call:
    """One call in flight: what the guard's registered body needs to run it (a context var)."""

    toolset: AbstractToolset[Any]
    name: str
    ctx: RunContext[Any]
    tool: _GuardedTool[Any]
    raw: str | None
    escaped: BaseException | None = None

    async def run(self, kwargs: dict[str, Any]) -> Any:
        inner = self.tool.inner
        context = self.ctx.validation_context
        try:
            if self.raw is not None:
                args = inner.args_validator.validate_json(self.raw, context=context)
            else:
                args = inner.args_validator.validate_python(kwargs, context=context)
        except ValidationError as exc:
            raise _invalid(self.name, exc, inner.tool_def.parameters_json_schema) from exc
        try:
            if inner.args_validator_func is not None:
                try:
                    checked = inner.args_validator_func(self.ctx, **args)
                    if inspect.isawaitable(checked):
                        await checked
                except ModelRetry as exc:
                    raise ToolError("invalid_argument", exc.message) from exc
            original = replace(inner, tool_def=self.tool.tool_def)
            return await self.toolset.call_tool(self.name, args, self.ctx, original)
        except (ModelRetry, ToolFailed) as exc:  # the tool's own words become the reason
            raise ToolError("tool_error", exc.message or f"{self.name} failed") from exc
        except _CONTROL as exc:  # for Pydantic AI's loop: re-raised once the guard returns
            self.escaped = exc
            return None


_current: contextvars.ContextVar[_Call | None] = contextvars.ContextVar(
    "toolfault_pydantic_ai_call", default=None)


def _invalid(name: str, exc: ValidationError, schema: Mapping[str, Any]) -> ToolError:
    """The first argument Pydantic rejected, in the guard's words (reason, param, next action)."""
    errors = exc.errors(include_url=False)
    err: Mapping[str, Any] = errors[0] if errors else {}
    param, where = error_place(err)
    props = schema.get("properties") or {}
    expected = expected_words(props.get(param) if isinstance(props, Mapping) else None)
    kind = err.get("type", "")
    if kind == "missing":
        return ToolError("invalid_argument", f"{where} is required ({expected})", param=param,
                         next_action=f"call {name} again and include {param} as {expected}")
    if kind == "extra_forbidden":
        return ToolError("invalid_argument", f"{where} is not a parameter of {name}",
                         param=param, next_action=f"call {name} again without {param}")
    message = str(err.get("msg") or "is invalid").split(", unable to", 1)[0]
    message = message.replace("Input should", "should", 1)
    return ToolError("invalid_argument", f"{where}: {message}", param=param,
                     next_action=f"call {name} again with {param} as {expected}")


def _body() -> Callable[..., Any]:
    """What the guard runs for a tool of a guarded toolset: the call in flight."""

    async def run_toolset_tool(**kwargs: Any) -> Any:
        call = _current.get()
        if call is None:
            raise ToolError("invalid_call", "this tool runs only inside a Pydantic AI agent run",
                            next_action="stop and report this failure to the user")
        return await call.run(kwargs)

    return run_toolset_tool


_scopes = ScopeRegistry("conversation")


def conversation_guard(guard: Guard, conversation: str) -> Guard:
    """The scope that counts ``conversation``'s calls (its incidents, ledger and turn).

    The same scope a :class:`GuardedToolset` on ``guard`` uses for that conversation key.
    """
    return _scopes.scope(guard, conversation, None)


def _noted(value: Any, note: str) -> ToolReturn[Any]:
    """``value`` as the tool return, with ``note`` as content beside it for the model.

    The value's type is untouched; a tool that returned a ``ToolReturn`` itself keeps its
    return value, metadata and content, the note after its content."""
    if not isinstance(value, ToolReturn):
        return ToolReturn(return_value=value, content=note)
    content = value.content
    if content is None:
        joined: str | list[Any] = note
    elif isinstance(content, str):
        joined = f"{content}\n{note}"
    else:
        joined = [*content, note]
    return replace(value, content=joined)


async def _end_run(ctx: RunContext[Any], text: str) -> bool:
    """Submit the halt as the run's output, when the output takes text; whether it was taken."""
    for name, definition in ctx.output_tools.items():
        properties = definition.parameters_json_schema.get("properties")
        if not isinstance(properties, Mapping) or list(properties) != ["response"]:
            continue
        if properties["response"].get("type") != "string":
            continue
        try:
            await ctx.submit_output(name, {"response": f"Stopped: {text}"})
        except (UserError, ToolRetryError):  # already ended, or an output validator refused it
            return False
        return True
    return False


@dataclass
class GuardedToolset(WrapperToolset[AgentDepsT]):
    """A Pydantic AI toolset whose every function-tool call goes through ``guard``.

    Wrap the toolset outermost (``GuardedToolset(toolset.prefixed("x"), guard)``), so the
    names the guard counts and the messages name are the names the model sees.  Output,
    external and unapproved tools pass through unguarded.
    """

    guard: Guard
    _: KW_ONLY
    #: :meth:`Guard.tool` options per tool name (``side_effect``, ``alternatives``, ...).
    tool_options: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    #: The key calls count under: ``RunContext.conversation_id`` unless given.
    conversation: Conversation | None = None

    def __post_init__(self) -> None:
        # A function toolset's tools are known now: registered at once, so the guard (and
        # ``toolfault lint``) sees them before the first run; other toolsets' at first listing.
        if isinstance(self.wrapped, FunctionToolset):
            for name, tool in self.wrapped.tools.items():
                register(self.guard, name, tool.description or name,
                         self.tool_options.get(name, {}), _MARK, _body)

    async def get_tools(self, ctx: RunContext[AgentDepsT]
                        ) -> dict[str, ToolsetTool[AgentDepsT]]:
        tools = await super().get_tools(ctx)
        out: dict[str, ToolsetTool[AgentDepsT]] = {}
        for name, tool in tools.items():
            if tool.tool_def.kind != "function":
                out[name] = tool
                continue
            register(self.guard, name, tool.tool_def.description or name,
                     self.tool_options.get(name, {}), _MARK, _body)
            out[name] = _GuardedTool(
                toolset=tool.toolset, tool_def=tool.tool_def, max_retries=tool.max_retries,
                args_validator=_PASS_THROUGH, args_validator_func=None, inner=tool)
        return out

    async def call_tool(self, name: str, tool_args: dict[str, Any],
                        ctx: RunContext[AgentDepsT], tool: ToolsetTool[AgentDepsT]) -> Any:
        if not isinstance(tool, _GuardedTool):
            return await super().call_tool(name, tool_args, ctx, tool)
        raw = tool_args.raw if isinstance(tool_args, _Sent) else None
        call = _Call(self.wrapped, name, ctx, tool, raw)
        token = _current.set(call)
        try:
            result = await self._scope(ctx).acall(
                name, raw if raw is not None else dict(tool_args), call_id=ctx.tool_call_id)
        finally:
            _current.reset(token)
        if call.escaped is not None:
            raise call.escaped
        if result.ok:
            if result.note is not None:
                return _noted(result.data, f"{name}: {result.note}")
            return result.data
        if result.halt and await _end_run(ctx, result.text):
            return result.text
        raise ToolFailed(result.text)

    def _scope(self, ctx: RunContext[Any]) -> Guard:
        key = self.conversation(ctx) if self.conversation is not None else ctx.conversation_id
        if key is None:
            key = ctx.run_id
        return _scopes.scope(self.guard, None if key is None else str(key), ctx.run_id)
