"""Batches of tool calls from a user's own loop: reading each item, or saying why not.

``(name, args)`` pairs, ``{"name", "arguments", "id"}`` dicts and SDK tool-call objects are
read; anything else becomes :class:`Malformed`, which the guard answers with
``invalid_call`` in that item's place.
"""

from __future__ import annotations

import contextvars
from collections.abc import Mapping
from typing import Any


class Malformed(Exception):
    """A tool-call item that names no tool (answered with ``invalid_call``)."""

    def __init__(self, reason: str, name: str = "tool_call", call_id: str | None = None
                 ) -> None:
        super().__init__(reason)
        self.reason, self.name, self.call_id = reason, name, call_id


class InOrder:
    """One call's place in a turn's parallel batch: its bodies run at once, but what each
    result teaches the ladder (a failure in a row, a repeated result) is recorded in the
    model's order, so a batch gets the decisions it would get in sequence."""

    __slots__ = ("before", "done")

    def __init__(self, before: InOrder | None) -> None:
        import asyncio  # a batch runs in an event loop: asyncio is loaded already

        self.before = before
        self.done = asyncio.Event()


#: The batch slot of the call being run (set by ``Guard.arun_tool_calls`` for each item).
IN_ORDER: contextvars.ContextVar[InOrder | None] = contextvars.ContextVar(
    "toolfault_in_order", default=None)


def take_slot() -> InOrder | None:
    """This call's batch slot; calls the tool makes itself are not in the batch."""
    slot = IN_ORDER.get()
    if slot is not None:
        IN_ORDER.set(None)
    return slot


async def after_earlier(slot: InOrder | None) -> None:
    """Wait until the call before this one in the batch has been recorded."""
    if slot is not None and slot.before is not None:
        await slot.before.done.wait()


def named(name: Any, call_id: Any) -> str:
    if isinstance(name, str) and name.strip():
        return name
    cid = str(call_id) if isinstance(call_id, (str, int)) else None
    if name is None:
        raise Malformed("the tool call has no tool name", call_id=cid)
    raise Malformed(f"the tool name must be a non-empty string, not {type(name).__name__}",
                     call_id=cid)


def unpack_call(item: Any) -> tuple[str, Any, str | None]:
    """Accept ``(name, args)``, ``{"name", "arguments", "id"}`` and SDK tool-call objects.

    Anything else raises :class:`Malformed`, which the batch answers with ``invalid_call``.
    """
    if isinstance(item, tuple):
        return _from_tuple(item)
    if isinstance(item, Mapping):
        return _from_mapping(item)
    if item is None or isinstance(item, (str, bytes, int, float, list, set)):
        raise Malformed(f"a tool call must be a (name, arguments) pair, a dict or a tool-call "
                         f"object, not {type(item).__name__}")
    return _from_object(item)


def _from_tuple(item: tuple[Any, ...]) -> tuple[str, Any, str | None]:
    """``(name, args)`` or ``(name, args, id)``: the form a hand-written loop builds."""
    if len(item) not in (2, 3):
        raise Malformed(f"a tool call tuple must be (name, arguments) or (name, arguments, "
                         f"id), not {len(item)} items")
    cid = item[2] if len(item) == 3 else None
    return named(item[0], cid), item[1], (str(cid) if cid is not None else None)


def _from_mapping(item: Mapping[str, Any]) -> tuple[str, Any, str | None]:
    """A Chat Completions dict (``{"function": {...}, "id"}``) or a flat one, whichever of
    the providers' argument keys (``arguments``, ``args``, ``input``) it uses."""
    fn = item.get("function")
    if isinstance(fn, Mapping):
        return named(fn.get("name"), item.get("id")), fn.get("arguments"), item.get("id")
    args = item.get("arguments", item.get("args", item.get("input")))
    cid = item.get("call_id") or item.get("id")
    return named(item.get("name"), cid), args, cid


def _from_object(item: Any) -> tuple[str, Any, str | None]:
    """An SDK tool-call object, read by the same names as its dict form."""
    fn = getattr(item, "function", None)
    if fn is not None:
        cid = getattr(item, "id", None)
        return named(getattr(fn, "name", None), cid), getattr(fn, "arguments", None), cid
    name = getattr(item, "name", None)
    args = getattr(item, "arguments", getattr(item, "input", getattr(item, "args", None)))
    cid = getattr(item, "call_id", None) or getattr(item, "id", None)
    return named(name, cid), args, cid


def batch_items(calls: Any) -> list[Any]:
    """The items of a batch: one call, or nothing usable, is answered item by item."""
    if isinstance(calls, (str, bytes, Mapping, tuple)) or calls is None:
        return [calls]
    try:
        return list(calls)
    except Exception:  # noqa: BLE001 - not iterable, or it broke while iterating
        return [calls]


def unusable_item(item: Any, exc: BaseException) -> tuple[str, Any, str | None, str]:
    """``(name, shown arguments, call id, reason)`` for an item that is not a tool call."""
    if isinstance(exc, Malformed):
        reason, name, cid = exc.reason, exc.name, exc.call_id
    else:
        reason, name, cid = "the tool call could not be read", "tool_call", None
    shown: Any = item if isinstance(item, (dict, list)) else (
        item if isinstance(item, str) else repr(item)[:200])
    if isinstance(item, Mapping) and not isinstance(item, dict):
        shown = repr(item)[:200]
    return name, shown, cid, reason
