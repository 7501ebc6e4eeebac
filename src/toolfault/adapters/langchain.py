"""LangChain / LangGraph tools backed by a guard (``pip install toolfault[langchain]``).

Each tool publishes the guard's JSON Schema as ``args_schema``; with a dict schema LangChain
validates nothing, so toolfault does, and the model gets a four-part message rather than a
pydantic dump.  A failure is raised as a ``ToolException`` the tool handles itself, which is
LangChain's own route to ``ToolMessage(status="error")``: invoked with a ``ToolCall`` (as
LangGraph's ``ToolNode`` does) the tool returns that message with the tool call's id and our
text; invoked with a plain dict it returns the text.  ``ToolNode``'s default error handling
re-raises everything but argument-validation errors and crashes the graph; these tools never
raise, so the default is fine as it is.

Successes return ``(text, value)`` as LangChain's ``content_and_artifact``: the model reads the
text, the graph keeps the value as ``ToolMessage.artifact``.  Adapters never start a turn:
call ``guard.new_turn()`` when the user speaks.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable
from typing import Any, Literal

from langchain_core.tools import BaseTool, ToolException
from pydantic import BaseModel

from toolfault._errors import ToolError
from toolfault._guard import Guard
from toolfault._result import ToolResult

__all__ = ["GuardedTool", "guard_langchain_tool", "langchain_tools"]


def _error_text(error: ToolException) -> str:
    """``handle_tool_error``: the guard already phrased the message; pass it on verbatim."""
    return str(error)


class _Failed(ToolException):
    """A guarded call that failed, carrying the full :class:`ToolResult` for callbacks."""

    def __init__(self, result: ToolResult) -> None:
        super().__init__(result.text)
        self.result = result


class GuardedTool(BaseTool):
    """A LangChain tool whose every call goes through ``guard`` (validation, caps, shaping)."""

    guard: Guard
    response_format: Literal["content", "content_and_artifact"] = "content_and_artifact"
    handle_tool_error: Any = _error_text

    def _shape(self, result: ToolResult) -> tuple[str, Any]:
        if not result.ok:
            raise _Failed(result)
        return result.text, result.data

    def _parse_input(self, tool_input: str | dict[str, Any], tool_call_id: str | None
                     ) -> str | dict[str, Any]:
        # LangChain refuses a string for a JSON-schema tool before we are reached; a string
        # (legacy agents, tool.invoke("...")) goes to the guard, which answers invalid_json.
        if isinstance(tool_input, str):
            return tool_input
        return super()._parse_input(tool_input, tool_call_id)

    def _run(self, *args: Any, **kwargs: Any) -> tuple[str, Any]:
        return self._shape(self.guard.call(self.name, _arguments(args, kwargs)))

    async def _arun(self, *args: Any, **kwargs: Any) -> tuple[str, Any]:
        return self._shape(await self.guard.acall(self.name, _arguments(args, kwargs)))


def _arguments(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """The model's arguments as sent (a lone positional input is passed on for the guard)."""
    if args and not kwargs and len(args) == 1:
        return args[0]
    return kwargs


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

    def run(**kwargs: Any) -> Any:
        try:
            return original.invoke(kwargs)
        except ToolException as exc:
            raise ToolError("tool_error", str(exc) or f"{tool.name} reported an error") from exc

    async def arun(**kwargs: Any) -> Any:
        try:
            return await original.ainvoke(kwargs)
        except ToolException as exc:
            raise ToolError("tool_error", str(exc) or f"{tool.name} reported an error") from exc

    async_only = (getattr(tool, "func", "") is None
                  and getattr(tool, "coroutine", None) is not None)
    fn = arun if async_only else run
    guard.tool(name=tool.name, description=options.pop("description", tool.description),
               schema=schema, **options)(fn)
    return langchain_tools(guard, [tool.name])[0]
