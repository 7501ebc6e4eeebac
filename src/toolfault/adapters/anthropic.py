"""Anthropic Messages API: tool definitions and ``tool_result`` blocks from a guard.

Anthropic has an error flag, so every result carries ``is_error`` as well as the four-part
text.  SDK objects are read by their attributes and plain dicts by their keys, so
``anthropic`` is only imported for type checking.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from toolfault._result import ToolResult

if TYPE_CHECKING:
    from anthropic.types import MessageParam, ToolParam, ToolResultBlockParam

    from toolfault._guard import Guard

__all__ = ["arun_tool_uses", "atool_results_message", "run_tool_uses", "tool_results_message",
           "tools"]

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


def run_tool_uses(guard: Guard, message_or_content: Any) -> list[ToolResultBlockParam]:
    """Run a message's ``tool_use`` blocks one by one; one ``tool_result`` block each, in order.

    Accepts the ``Message`` (SDK object or dict) or its ``content`` list; text, thinking and
    server-tool blocks are skipped.  Use :func:`arun_tool_uses` to run them concurrently.
    """
    calls = _tool_uses(message_or_content)
    results = guard.run_tool_calls(_batch(calls))
    return [_tool_result(c, r) for c, r in zip(calls, results, strict=True)]


async def arun_tool_uses(guard: Guard, message_or_content: Any) -> list[ToolResultBlockParam]:
    """Async twin of :func:`run_tool_uses`: one turn's tool uses run concurrently, in order."""
    calls = _tool_uses(message_or_content)
    results = await guard.arun_tool_calls(_batch(calls))
    return [_tool_result(c, r) for c, r in zip(calls, results, strict=True)]


def tool_results_message(guard: Guard, message: Any) -> MessageParam:
    """The ``user`` turn that answers an assistant message's tool uses (append it and resend)."""
    return {"role": "user", "content": run_tool_uses(guard, message)}


async def atool_results_message(guard: Guard, message: Any) -> MessageParam:
    """Async twin of :func:`tool_results_message`."""
    return {"role": "user", "content": await arun_tool_uses(guard, message)}


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
