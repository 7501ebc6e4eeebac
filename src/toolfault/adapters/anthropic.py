"""Anthropic Messages API: tool definitions and ``tool_result`` blocks from a guard.

Anthropic has an error flag, so every result carries ``is_error`` as well as the four-part
text.  SDK objects are read by their attributes and plain dicts by their keys, so
``anthropic`` is only imported for type checking.

:func:`run_tool_uses` returns a :class:`ToolOutputs` list: stop the loop when
``outputs.halt`` is true (the guard ended the turn).  Pass the conversation as ``messages=``
and a new user message in it (one that is not only ``tool_result`` blocks) starts a new turn,
and the list names its own conversation (by its first ``tool_use`` id); ``conversation=``
names it explicitly.  Tool uses of tools the guard does
not own are left out for your code, unless ``others="answer"``.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from toolfault._result import ToolResult
from toolfault.adapters._loop import Others, ToolOutputs, first_call_id, owned, scope_for

if TYPE_CHECKING:
    from anthropic.types import MessageParam, ToolParam, ToolResultBlockParam

    from toolfault._guard import Guard

__all__ = ["ToolOutputs", "arun_tool_uses", "atool_results_message", "run_tool_uses",
           "tool_results_message", "tools"]

_Call = tuple[str, Any, "str | None"]


def tools(guard: Guard) -> list[ToolParam]:
    """The guard's tools as Messages API ``tools=`` (name, description, input_schema)."""
    out: list[ToolParam] = []
    for spec in guard.tools.values():
        tool: ToolParam = {"name": spec.name, "input_schema": copy.deepcopy(spec.schema)}
        if spec.description:
            tool["description"] = spec.description
        out.append(tool)
    return out


def run_tool_uses(guard: Guard, message_or_content: Any, *, messages: Any = None,
                  conversation: str | None = None, others: Others = "skip"
                  ) -> ToolOutputs[ToolResultBlockParam]:
    """Run a message's ``tool_use`` blocks one by one; one ``tool_result`` block each, in order.

    Accepts the ``Message`` (SDK object or dict) or its ``content`` list; text, thinking and
    server-tool blocks are skipped.  Use :func:`arun_tool_uses` to run them concurrently.
    """
    every = _tool_uses(message_or_content)
    scoped = scope_for(guard, conversation, messages, _is_user, _anchor(messages, every))
    calls = owned(guard, every, _name, others)
    results = scoped.run_tool_calls(_batch(calls))
    return ToolOutputs([_tool_result(c, r) for c, r in zip(calls, results, strict=True)],
                       results)


async def arun_tool_uses(guard: Guard, message_or_content: Any, *, messages: Any = None,
                         conversation: str | None = None, others: Others = "skip"
                         ) -> ToolOutputs[ToolResultBlockParam]:
    """Async twin of :func:`run_tool_uses`: one turn's tool uses run concurrently, in order."""
    every = _tool_uses(message_or_content)
    scoped = scope_for(guard, conversation, messages, _is_user, _anchor(messages, every))
    calls = owned(guard, every, _name, others)
    results = await scoped.arun_tool_calls(_batch(calls))
    return ToolOutputs([_tool_result(c, r) for c, r in zip(calls, results, strict=True)],
                       results)


def tool_results_message(guard: Guard, message: Any, **options: Any) -> MessageParam:
    """The ``user`` turn that answers an assistant message's tool uses (append it and resend).

    ``options`` as for :func:`run_tool_uses`.
    """
    return {"role": "user", "content": run_tool_uses(guard, message, **options)}


async def atool_results_message(guard: Guard, message: Any, **options: Any) -> MessageParam:
    """Async twin of :func:`tool_results_message`."""
    return {"role": "user", "content": await arun_tool_uses(guard, message, **options)}


def _name(call: _Call) -> str:
    return call[0]


def _anchor(messages: Any, calls: list[_Call]) -> str | None:
    """The conversation's first ``tool_use`` id: in ``messages``, else this turn's first."""
    return first_call_id(messages, calls, _tool_use_ids)


def _tool_use_ids(message: Any) -> Iterator[Any]:
    """The ids of an assistant message's ``tool_use`` blocks (the others have none)."""
    if _get(message, "role") != "assistant":
        return
    content = _get(message, "content")
    for block in () if isinstance(content, str) or content is None else content:
        if _get(block, "type") == "tool_use":
            yield _get(block, "id")


def _is_user(message: Any) -> bool:
    """A message the user wrote: role ``user`` and not only ``tool_result`` blocks."""
    if _get(message, "role") != "user":
        return False
    content = _get(message, "content")
    if isinstance(content, str) or content is None:
        return True
    return any(_get(block, "type") != "tool_result" for block in content)


def _batch(calls: list[_Call]) -> list[tuple[Any, ...]]:
    """The guard's ``(name, args[, call_id])`` form; an absent id stays absent, not "None"."""
    return [(name, args) if cid is None else (name, args, str(cid)) for name, args, cid in calls]


def _get(obj: Any, key: str) -> Any:
    """A field of an SDK object or of its dict form."""
    return obj.get(key) if isinstance(obj, Mapping) else getattr(obj, key, None)


def _tool_uses(obj: Any) -> list[_Call]:
    if obj is None:
        return []
    content = _get(obj, "content")
    if content is None:
        content = obj
    if isinstance(content, str):
        return []
    return [(str(_get(block, "name")), _get(block, "input"), _get(block, "id"))
            for block in content if _get(block, "type") == "tool_use"]


def _tool_result(call: _Call, result: ToolResult) -> ToolResultBlockParam:
    return {"type": "tool_result", "tool_use_id": call[2] or result.call_id,
            "content": result.text, "is_error": result.is_error}
