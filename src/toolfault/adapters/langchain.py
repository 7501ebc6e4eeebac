"""LangChain / LangGraph tools backed by a guard (``pip install toolfault[langchain]``).

Each tool publishes the guard's JSON Schema as ``args_schema``; with a dict schema LangChain
validates nothing, so toolfault does, and the model gets a four-part message rather than a
pydantic dump.  ``ToolNode``'s default error handling re-raises everything but
argument-validation errors and crashes the graph; these tools never raise.

What each call gives back: invoked with a ``ToolCall`` (as LangGraph's ``ToolNode`` does), a
``ToolMessage`` with the call's id.  A success is ``status="success"``, the text as content and
the tool's value as ``artifact`` (LangChain's ``content_and_artifact``); a failure is
``status="error"``, our four-part text as content and the problem dict as ``artifact``
(``artifact["halt"]`` is true when the guard ended the turn).  Invoked with a plain dict, the
text alone.

Conversations scope themselves: calls count per LangGraph ``thread_id``
(``config["configurable"]["thread_id"]``), each thread in its own :meth:`Guard.scoped` scope,
and a new user message in the thread's ``messages`` starts a new turn (``ToolNode`` hands the
tool the graph state).  Without a ``thread_id`` (no checkpointer) each invocation's message
list is its own conversation (keyed by its first message's id); calls made outside a
``ToolNode`` without a ``thread_id`` count on the guard itself.

A halt ends the run without a recursion error: pass :func:`halt_middleware` to LangChain v1's
``create_agent(..., middleware=[halt_middleware()])``, or :func:`halt_hook` as
``create_react_agent(..., post_model_hook=halt_hook)`` (or run it as a node between the model
and ``tools_condition``); after a halted tool message it drops the model's next tool calls
and answers with the halt, so the graph reaches ``END`` normally.
"""

from __future__ import annotations

import contextvars
import copy
import functools
import threading
import weakref
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field

from toolfault._errors import ToolError
from toolfault._guard import Guard
from toolfault._result import ToolContext, ToolResult
from toolfault.adapters._extras import missing_extra

try:
    from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
    from langchain_core.runnables import RunnableConfig
    from langchain_core.tools import BaseTool, InjectedToolArg, ToolException
except ModuleNotFoundError as exc:
    missing_extra(exc, "langchain", "langchain", "langchain_core")

__all__ = ["GuardedTool", "guard_langchain_tool", "halt_hook", "halt_middleware", "halted",
           "langchain_tools", "thread_guard"]

#: Threads whose scopes a guard keeps (least recently used dropped first).
MAX_THREADS = 4096

_tool_call_id: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "toolfault_lc_tool_call_id", default=None)


class _Injected(BaseModel):
    """The input schema LangGraph's ``ToolNode`` reads: asks for its ``ToolRuntime``.

    The model-facing schema stays the guard's (``args_schema``); this only tells ``ToolNode``
    to hand over the graph state, the tool call id and the config.
    """

    runtime: Annotated[Any, InjectedToolArg] = None


class _Threads:
    """One scope per thread id of one guard, and the user-message count each last saw."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.scopes: OrderedDict[str, tuple[Guard, int | None]] = OrderedDict()
        self.root_humans: int | None = None

    def scope(self, guard: Guard, thread: str | None, humans: int | None,
              label: str = "thread") -> Guard:
        with self.lock:
            if thread is None:
                if humans is not None and self.root_humans not in (None, humans):
                    guard.new_turn()
                self.root_humans = humans if humans is not None else self.root_humans
                return guard
            key = f"{label}\x00{thread}"
            entry = self.scopes.get(key)
            if entry is None:
                scoped = guard.scoped(f"{guard.task_id}/{label}-{thread}")
                self.scopes[key] = (scoped, humans)
                while len(self.scopes) > MAX_THREADS:
                    self.scopes.popitem(last=False)
                return scoped
            scoped, seen = entry
            self.scopes.move_to_end(key)
            if humans is not None and seen not in (None, humans):
                scoped.new_turn()  # the user spoke again in this thread
            self.scopes[key] = (scoped, humans if humans is not None else seen)
            return scoped


_threads: weakref.WeakKeyDictionary[Guard, _Threads] = weakref.WeakKeyDictionary()
_threads_lock = threading.Lock()


def _threads_of(guard: Guard) -> _Threads:
    with _threads_lock:
        threads = _threads.get(guard)
        if threads is None:
            threads = _threads[guard] = _Threads()
        return threads


def thread_guard(guard: Guard, thread_id: str | None) -> Guard:
    """The scope that counts ``thread_id``'s calls (the guard itself for ``None``).

    The same scope the tools of :func:`langchain_tools` use, for code that wants its
    incidents, ledger or turn.
    """
    return _threads_of(guard).scope(guard, thread_id, None)


def _thread_id(config: Mapping[str, Any] | None) -> str | None:
    configurable = (config or {}).get("configurable") or {}
    thread = configurable.get("thread_id") if isinstance(configurable, Mapping) else None
    return None if thread is None or thread == "" else str(thread)


def _messages(state: Any) -> Any:
    return state.get("messages") if isinstance(state, Mapping) else getattr(
        state, "messages", None)


def _first_id(state: Any) -> str | None:
    """The id of the first message of the graph state, if it has one."""
    messages = _messages(state)
    if not isinstance(messages, (list, tuple)) or not messages:
        return None
    first = getattr(messages[0], "id", None)
    return first if isinstance(first, str) and first else None


def _human_count(state: Any) -> int | None:
    """User messages in the graph state, the turn marker (``None`` without a message list)."""
    messages = _messages(state)
    if not isinstance(messages, (list, tuple)):
        return None
    return sum(1 for m in messages if isinstance(m, BaseMessage) and m.type == "human")


def _error_text(error: ToolException) -> str:
    """``handle_tool_error``: the guard already phrased the message; pass it on verbatim."""
    return str(error)


class _Failed(ToolException):
    """A guarded call that failed, carrying the full :class:`ToolResult` for callbacks."""

    def __init__(self, result: ToolResult) -> None:
        super().__init__(result.text)
        self.result = result


class GuardedTool(BaseTool):
    """A LangChain tool whose every call goes through ``guard`` (validation, caps, shaping).

    Calls count in the scope of their LangGraph thread (see the module docstring).
    """

    guard: Guard
    response_format: Literal["content", "content_and_artifact"] = "content_and_artifact"
    handle_tool_error: Any = _error_text
    # Artifacts a guarded content_and_artifact tool left, by guard call id (shared, not copied).
    artifacts: Any = Field(default=None, exclude=True, repr=False)

    def get_input_schema(self, config: RunnableConfig | None = None) -> Any:
        if isinstance(self.args_schema, dict) and "runtime" in (
                self.args_schema.get("properties") or {}):
            return super().get_input_schema(config)  # the model owns "runtime" here
        return _Injected

    def run(self, tool_input: Any, *args: Any, tool_call_id: str | None = None,
            **kwargs: Any) -> Any:
        token = _tool_call_id.set(tool_call_id)
        try:
            return super().run(tool_input, *args, tool_call_id=tool_call_id, **kwargs)
        finally:
            _tool_call_id.reset(token)

    async def arun(self, tool_input: Any, *args: Any, tool_call_id: str | None = None,
                   **kwargs: Any) -> Any:
        token = _tool_call_id.set(tool_call_id)
        try:
            return await super().arun(tool_input, *args, tool_call_id=tool_call_id, **kwargs)
        finally:
            _tool_call_id.reset(token)

    def _scope(self, runtime: Any, config: RunnableConfig | None) -> tuple[Guard, str | None]:
        """The thread's scope and the call id, from ToolNode's runtime or the config."""
        call_id = getattr(runtime, "tool_call_id", None) or _tool_call_id.get()
        run_config = getattr(runtime, "config", None) or config
        state = getattr(runtime, "state", None)
        humans = _human_count(state)
        thread = _thread_id(run_config)
        if thread is None:
            # No thread_id (no checkpointer): the conversation is the message list itself,
            # named by its first message's id, which LangGraph assigns once per invocation.
            first = _first_id(state)
            if first is not None:
                return (_threads_of(self.guard).scope(self.guard, first, humans,
                                                      "conversation"), call_id)
        return _threads_of(self.guard).scope(self.guard, thread, humans), call_id

    def _shape(self, result: ToolResult, call_id: str | None) -> tuple[Any, Any]:
        artifact = result.data
        if self.artifacts is not None:
            artifact = self.artifacts.pop(result.call_id, artifact)
        if result.ok:
            return result.text, artifact
        if call_id is None:
            raise _Failed(result)  # plain-dict input: LangChain turns it into the text
        # LangChain drops the artifact of a handled error, so the message is built here.
        failed = ToolMessage(content=result.text, tool_call_id=call_id, name=self.name,
                             status="error", artifact=result.data)
        return failed, None

    def _parse_input(self, tool_input: str | dict[str, Any], tool_call_id: str | None
                     ) -> str | dict[str, Any]:
        # LangChain refuses a string for a JSON-schema tool before we are reached; a string
        # (legacy agents, tool.invoke("...")) goes to the guard, which answers invalid_json.
        if isinstance(tool_input, str):
            return tool_input
        return super()._parse_input(tool_input, tool_call_id)

    def _run(self, *args: Any, runtime: Annotated[Any, InjectedToolArg] = None,
             config: RunnableConfig, **kwargs: Any) -> tuple[Any, Any]:
        scoped, call_id = self._scope(runtime, config)
        result = scoped.call(self.name, _arguments(args, kwargs), call_id=call_id)
        return self._shape(result, call_id)

    async def _arun(self, *args: Any, runtime: Annotated[Any, InjectedToolArg] = None,
                    config: RunnableConfig, **kwargs: Any) -> tuple[Any, Any]:
        scoped, call_id = self._scope(runtime, config)
        result = await scoped.acall(self.name, _arguments(args, kwargs), call_id=call_id)
        return self._shape(result, call_id)


def _arguments(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """The model's arguments as sent (a lone positional input is passed on for the guard)."""
    if args and not kwargs and len(args) == 1:
        return args[0]
    return kwargs


def halted(message: Any) -> bool:
    """Whether ``message`` is a tool message of a call with which the guard ended the turn."""
    if not isinstance(message, ToolMessage):
        return False
    artifact = message.artifact
    return isinstance(artifact, Mapping) and artifact.get("halt") is True


def halt_hook(state: Any) -> dict[str, Any]:
    """End a LangGraph agent normally once the guard halted: a ``post_model_hook``.

    When the model answers a halted tool message with more tool calls, its message is
    replaced (same id) by one without tool calls that reports the halt, so the agent routes
    to ``END`` instead of looping until ``GraphRecursionError``.  Anything else passes.
    """
    messages = state.get("messages") if isinstance(state, Mapping) else getattr(
        state, "messages", None)
    if not messages or not isinstance(messages[-1], AIMessage) or not messages[-1].tool_calls:
        return {}
    for message in reversed(messages[:-1]):
        if not isinstance(message, ToolMessage):
            break
        if halted(message):
            last = messages[-1]
            stop = AIMessage(content=f"Stopped: {message.content}", id=last.id,
                             response_metadata={"toolfault_halt": True})
            return {"messages": [stop]}
    return {}


def langchain_tools(guard: Guard, names: Iterable[str] | None = None) -> list[BaseTool]:
    """The guard's tools (all, or those in ``names``, in that order) as LangChain tools."""
    specs = guard.tools
    chosen = list(specs) if names is None else list(names)
    missing = [n for n in chosen if n not in specs]
    if missing:
        raise KeyError(f"not registered on the guard: {', '.join(missing)}")
    return [
        GuardedTool(guard=guard, name=name, description=specs[name].description or name,
                    args_schema=copy.deepcopy(specs[name].schema))
        for name in chosen
    ]


def _json_schema(tool: BaseTool) -> dict[str, Any]:
    schema = tool.tool_call_schema
    if isinstance(schema, dict):
        return copy.deepcopy(schema)
    if isinstance(schema, type) and issubclass(schema, BaseModel):
        out = schema.model_json_schema()
        out.pop("title", None)
        out.pop("description", None)
        return out
    raise TypeError(f"{tool.name}: cannot read a JSON Schema from {schema!r}")


def guard_langchain_tool(guard: Guard, tool: BaseTool, **options: Any) -> BaseTool:
    """Guard an existing LangChain tool: register it on ``guard`` and return the guarded twin.

    The guard validates against the tool's own schema and calls ``tool.invoke`` with the
    model's arguments, so the tool's behaviour is unchanged; its exceptions become four-part
    messages.  A ``ToolException`` is LangChain's "the model should read this", so its text
    becomes the reason (code ``tool_error``); other exceptions are classified by the catalog.
    ``options`` go to :meth:`Guard.tool` (``side_effect``, ``alternatives``, ...).  Tools with
    injected arguments (``InjectedToolArg``) are refused: the model never sends those, so the
    guard could not supply them.
    """
    schema = _json_schema(tool)
    visible = set(schema.get("properties", {}))
    declared = tool.args_schema
    if isinstance(declared, dict):
        every = set(declared.get("properties", {}))
    elif isinstance(declared, type) and issubclass(declared, BaseModel):
        every = set(declared.model_fields)
    else:
        every = set(tool.args)
    if every - visible:
        raise ValueError(f"{tool.name}: tools with injected arguments cannot be guarded")
    # The copy raises what the original would have turned into text, so the guard sees it.
    original = tool.model_copy(update={"handle_tool_error": False,
                                       "handle_validation_error": False})

    # A content_and_artifact tool keeps both: it is invoked with a ToolCall (the only way
    # LangChain hands out the artifact), the content goes to the guard and the artifact waits
    # for the guarded twin under the guard's call id.
    artifacts: OrderedDict[str, Any] | None = (
        OrderedDict() if tool.response_format == "content_and_artifact" else None)

    def unpack(output: Any, ctx: ToolContext) -> Any:
        if artifacts is None or not isinstance(output, ToolMessage):
            return output
        artifacts[ctx.call_id] = output.artifact
        while len(artifacts) > MAX_THREADS:  # calls made on the guard directly never collect
            artifacts.popitem(last=False)
        return output.content

    def tool_input(kwargs: dict[str, Any], ctx: ToolContext) -> Any:
        if artifacts is None:
            return kwargs
        return {"name": tool.name, "args": kwargs, "id": ctx.call_id, "type": "tool_call"}

    def run(ctx: ToolContext, **kwargs: Any) -> Any:
        try:
            return unpack(original.invoke(tool_input(kwargs, ctx)), ctx)
        except ToolException as exc:
            raise ToolError("tool_error", str(exc) or f"{tool.name} reported an error") from exc

    async def arun(ctx: ToolContext, **kwargs: Any) -> Any:
        try:
            return unpack(await original.ainvoke(tool_input(kwargs, ctx)), ctx)
        except ToolException as exc:
            raise ToolError("tool_error", str(exc) or f"{tool.name} reported an error") from exc

    async_only = (getattr(tool, "func", "") is None
                  and getattr(tool, "coroutine", None) is not None)
    fn = arun if async_only else run
    guard.tool(name=tool.name, description=options.pop("description", tool.description),
               schema=schema, **options)(fn)
    [guarded] = langchain_tools(guard, [tool.name])
    if artifacts is not None:
        guarded.artifacts = artifacts
    return guarded


@functools.cache
def _halt_middleware_class() -> type[Any]:
    """``HaltMiddleware``, built on first use: only ``create_agent`` users need ``langchain``."""
    try:
        from langchain.agents.middleware import AgentMiddleware
    except ModuleNotFoundError as exc:
        missing_extra(exc, "langchain", "langchain", "langchain")

    class HaltMiddleware(AgentMiddleware):
        """Runs :func:`halt_hook` after each model call of a ``create_agent`` agent."""

        def after_model(self, state: Any, runtime: Any) -> dict[str, Any] | None:
            return halt_hook(state) or None

        async def aafter_model(self, state: Any, runtime: Any) -> dict[str, Any] | None:
            return halt_hook(state) or None

    return HaltMiddleware


def halt_middleware() -> Any:
    """End a LangChain v1 ``create_agent`` agent normally once the guard halted.

    ``create_agent(model, tools, middleware=[halt_middleware()])``: after each model call,
    :func:`halt_hook` replaces tool calls that follow a halted tool message with a final
    ``"Stopped: ..."`` message, so the agent ends instead of looping until the recursion limit.
    (``create_agent`` has no ``post_model_hook``, and its ``after_model`` hooks take
    ``(state, runtime)``; this is that hook.)  Needs the ``langchain`` package.
    """
    return _halt_middleware_class()()
