"""OpenAI Chat Completions and Responses API: tool definitions and tool outputs from a guard.

OpenAI's tool messages carry no error flag, so the four-part text *is* the signal: it goes
into ``content`` (Chat) or ``output`` (Responses) verbatim.  SDK objects are read by their
attributes and plain dicts by their keys, so ``openai`` is only imported for type checking
and any SDK version (or an OpenAI-compatible server's JSON) works.

Tools are published with ``strict`` off: toolfault's schemas keep optional parameters
optional, and the guard validates every call itself, answering a bad one with an
instruction instead of letting a constrained decoder hide the mistake.

The run functions return a :class:`ToolOutputs` list: append it to the conversation as is,
and stop the loop when ``outputs.halt`` is true (the guard ended the turn).  Pass the
conversation as ``messages=`` (Chat messages or Responses input items) and a new user message
in it starts a new turn by itself, and the list names its own conversation (by its first tool
call id), so two conversations on one guard never share a counter; ``conversation=`` names it
explicitly.  Calls of tools the guard does not own (your own function
tools, custom free-form tools) are left out for your code to answer, unless
``others="answer"``.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from toolfault._result import ToolResult
from toolfault.adapters._loop import Others, ToolOutputs, first_call_id, owned, scope_for

if TYPE_CHECKING:
    from openai.types.chat import ChatCompletionToolMessageParam, ChatCompletionToolParam
    from openai.types.responses import FunctionToolParam
    from openai.types.responses.response_input_param import FunctionCallOutput
    from openai.types.shared_params import FunctionDefinition

    from toolfault._guard import Guard

__all__ = [
    "ToolOutputs",
    "arun_chat_tool_calls",
    "arun_response_function_calls",
    "chat_tools",
    "responses_tools",
    "run_chat_tool_calls",
    "run_response_function_calls",
]

_Call = tuple[str, Any, "str | None"]


def chat_tools(guard: Guard) -> list[ChatCompletionToolParam]:
    """The guard's tools as Chat Completions ``tools=`` (``{"type": "function", ...}``)."""
    tools: list[ChatCompletionToolParam] = []
    for spec in guard.tools.values():
        function: FunctionDefinition = {"name": spec.name,
                                        "parameters": copy.deepcopy(spec.schema)}
        if spec.description:
            function["description"] = spec.description
        tools.append({"type": "function", "function": function})
    return tools


def responses_tools(guard: Guard) -> list[FunctionToolParam]:
    """The guard's tools as Responses API ``tools=`` (flat function tools, ``strict`` off)."""
    tools: list[FunctionToolParam] = []
    for spec in guard.tools.values():
        tool: FunctionToolParam = {
            "type": "function", "name": spec.name,
            "parameters": copy.deepcopy(spec.schema), "strict": False,
        }
        if spec.description:
            tool["description"] = spec.description
        tools.append(tool)
    return tools


def run_chat_tool_calls(guard: Guard, message_or_tool_calls: Any, *, messages: Any = None,
                        conversation: str | None = None, others: Others = "skip"
                        ) -> ToolOutputs[ChatCompletionToolMessageParam]:
    """Run an assistant message's ``tool_calls`` one by one; one ``role: tool`` message each.

    Accepts the ``ChatCompletion``, its message (SDK object or dict) or the ``tool_calls``
    list.  Every call of the guard's tools gets an answer, in order.  Use
    :func:`arun_chat_tool_calls` to run a turn's parallel calls concurrently.
    """
    every = _chat_calls(message_or_tool_calls)
    scoped = scope_for(guard, conversation, messages, _is_user, _anchor(messages, every))
    calls = owned(guard, every, _name, others)
    results = scoped.run_tool_calls(_batch(calls))
    return ToolOutputs([_tool_message(c, r) for c, r in zip(calls, results, strict=True)],
                       results)


async def arun_chat_tool_calls(guard: Guard, message_or_tool_calls: Any, *,
                               messages: Any = None, conversation: str | None = None,
                               others: Others = "skip"
                               ) -> ToolOutputs[ChatCompletionToolMessageParam]:
    """Async twin of :func:`run_chat_tool_calls`: a turn's calls run concurrently, in order."""
    every = _chat_calls(message_or_tool_calls)
    scoped = scope_for(guard, conversation, messages, _is_user, _anchor(messages, every))
    calls = owned(guard, every, _name, others)
    results = await scoped.arun_tool_calls(_batch(calls))
    return ToolOutputs([_tool_message(c, r) for c, r in zip(calls, results, strict=True)],
                       results)


def run_response_function_calls(guard: Guard, response_or_items: Any, *, messages: Any = None,
                                conversation: str | None = None, others: Others = "skip"
                                ) -> ToolOutputs[FunctionCallOutput]:
    """Run a response's ``function_call`` items; one ``function_call_output`` item each.

    Accepts the ``Response`` (or its dict) or an iterable of output items; other item types
    (messages, reasoning) are skipped.  Append the outputs after the echoed items, or send
    them alone with ``previous_response_id``.
    """
    every = _response_calls(response_or_items)
    scoped = scope_for(guard, conversation, messages, _is_user, _anchor(messages, every))
    calls = owned(guard, every, _name, others)
    results = scoped.run_tool_calls(_batch(calls))
    return ToolOutputs([_call_output(c, r) for c, r in zip(calls, results, strict=True)],
                       results)


async def arun_response_function_calls(guard: Guard, response_or_items: Any, *,
                                       messages: Any = None, conversation: str | None = None,
                                       others: Others = "skip"
                                       ) -> ToolOutputs[FunctionCallOutput]:
    """Async twin of :func:`run_response_function_calls`: calls run concurrently, in order."""
    every = _response_calls(response_or_items)
    scoped = scope_for(guard, conversation, messages, _is_user, _anchor(messages, every))
    calls = owned(guard, every, _name, others)
    results = await scoped.arun_tool_calls(_batch(calls))
    return ToolOutputs([_call_output(c, r) for c, r in zip(calls, results, strict=True)],
                       results)


def _name(call: _Call) -> str:
    return call[0]


def _anchor(messages: Any, calls: list[_Call]) -> str | None:
    """The conversation's first tool call id: in ``messages``, else this turn's first."""
    return first_call_id(messages, calls, _call_ids)


def _call_ids(message: Any) -> Iterator[Any]:
    """The call ids a Chat message (its ``tool_calls``) or a Responses item (a function or
    custom tool call) carries, in order."""
    if isinstance(message, str):
        return
    if _get(message, "type") in ("function_call", "custom_tool_call"):
        yield _get(message, "call_id")
    for item in _get(message, "tool_calls") or ():
        yield _get(item, "id")


def _is_user(message: Any) -> bool:
    """A user message of a Chat conversation or a Responses input list."""
    if isinstance(message, str):
        return False
    return bool(_get(message, "role") == "user")


def _batch(calls: list[_Call]) -> list[tuple[Any, ...]]:
    """The guard's ``(name, args[, call_id])`` form; an absent id stays absent, not "None"."""
    return [(name, args) if cid is None else (name, args, str(cid)) for name, args, cid in calls]


def _get(obj: Any, key: str) -> Any:
    """A field of an SDK object or of its dict form."""
    return obj.get(key) if isinstance(obj, Mapping) else getattr(obj, key, None)


def _chat_calls(obj: Any) -> list[_Call]:
    if obj is None:
        return []
    choices = _get(obj, "choices")
    if choices:
        obj = _get(choices[0], "message")
    if isinstance(obj, Mapping) or hasattr(obj, "tool_calls"):
        obj = _get(obj, "tool_calls") or []
    calls: list[_Call] = []
    for item in obj:
        cid = _get(item, "id")
        if _get(item, "type") == "custom":  # free-form: answered only if registered or asked
            custom = _get(item, "custom")
            calls.append((str(_get(custom, "name")), _get(custom, "input"), cid))
            continue
        fn = _get(item, "function")
        calls.append((str(_get(fn, "name")), _get(fn, "arguments"), cid))
    return calls


def _response_calls(obj: Any) -> list[_Call]:
    if obj is None:
        return []
    items = _get(obj, "output")
    if items is None:
        items = obj
    calls: list[_Call] = []
    for item in items:
        kind = _get(item, "type")
        if kind == "function_call":
            calls.append((str(_get(item, "name")), _get(item, "arguments"),
                          _get(item, "call_id")))
        elif kind == "custom_tool_call":  # free-form: answered in kind when answered at all
            calls.append((str(_get(item, "name")), _get(item, "input"),
                          _CustomId(str(_get(item, "call_id")))))
    return calls


class _CustomId(str):
    """A call id that belongs to a free-form (custom) tool call: its output has its own type."""

    __slots__ = ()


def _tool_message(call: _Call, result: ToolResult) -> ChatCompletionToolMessageParam:
    return {"role": "tool", "tool_call_id": call[2] or result.call_id, "content": result.text}


def _call_output(call: _Call, result: ToolResult) -> FunctionCallOutput:
    call_id = call[2] or result.call_id
    if isinstance(call[2], _CustomId):
        custom: Any = {"type": "custom_tool_call_output", "call_id": str(call_id),
                       "output": result.text}
        return custom  # type: ignore[no-any-return]
    return {"type": "function_call_output", "call_id": call_id, "output": result.text}
