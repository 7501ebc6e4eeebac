"""What the hand-written-loop adapters (OpenAI, Anthropic) share: outputs, turns, scopes."""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Literal, TypeVar

from toolfault._guard import Guard
from toolfault._result import ToolResult

T = TypeVar("T")

#: Conversations whose scopes a guard keeps for these adapters (oldest dropped first).
MAX_CONVERSATIONS = 4096

Others = Literal["skip", "answer"]


class ToolOutputs(list[T]):
    """The answers to one assistant turn's tool calls, ready to append to the messages.

    A plain list of API-shaped dicts (nothing extra goes on the wire), plus ``results`` (the
    :class:`~toolfault.ToolResult` of each, in order) and ``halt``: true when the guard ended
    the turn, so the loop must stop calling the model for tools and report.
    """

    results: list[ToolResult]

    def __init__(self, items: Iterable[T] = (), results: Iterable[ToolResult] = ()) -> None:
        super().__init__(items)
        self.results = list(results)

    @property
    def halt(self) -> bool:
        """A call of this turn was halted: end the loop (see ``Limits``)."""
        return any(r.halt for r in self.results)


class _Scopes:
    """Per guard: one scope per conversation key, and the user-message count each last saw."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.scopes: OrderedDict[str, tuple[Guard, int | None]] = OrderedDict()
        self.root_seen: int | None = None

    def scope(self, guard: Guard, key: str | None, users: int | None) -> Guard:
        with self.lock:
            if key is None:
                if users is not None and self.root_seen not in (None, users):
                    guard.new_turn()
                if users is not None:
                    self.root_seen = users
                return guard
            entry = self.scopes.get(key)
            if entry is None:
                scoped = guard.scoped(f"{guard.task_id}/conversation-{key}")
                self.scopes[key] = (scoped, users)
                while len(self.scopes) > MAX_CONVERSATIONS:
                    self.scopes.popitem(last=False)
                return scoped
            scoped, seen = entry
            self.scopes.move_to_end(key)
            if users is not None and seen not in (None, users):
                scoped.new_turn()  # the user spoke again
            self.scopes[key] = (scoped, users if users is not None else seen)
            return scoped


_registry: weakref.WeakKeyDictionary[Guard, _Scopes] = weakref.WeakKeyDictionary()
_registry_lock = threading.Lock()


def scope_for(guard: Guard, conversation: str | None, messages: Any,
              is_user: Callable[[Any], bool], anchor: str | None = None) -> Guard:
    """The guard (scope) a turn's calls count in; a new user message starts a new turn.

    Without ``conversation``, a message list names its own conversation by ``anchor``: the id
    of its first tool call (provider ids are unique per call, and stay first as the list grows,
    copied or not).
    """
    users = None
    if messages is not None and not isinstance(messages, (str, bytes)):
        users = sum(1 for m in messages if is_user(m))
        if conversation is None and anchor:
            conversation = f"call-{anchor}"
    if conversation is None and users is None:
        return guard
    with _registry_lock:
        scopes = _registry.get(guard)
        if scopes is None:
            scopes = _registry[guard] = _Scopes()
    return scopes.scope(guard, conversation, users)


def first_call_id(messages: Any, calls: Iterable[tuple[Any, Any, Any]],
                  ids_in: Callable[[Any], Iterable[Any]]) -> str | None:
    """The anchor a conversation is named by (see :func:`scope_for`): the first tool call id
    in ``messages`` (``ids_in`` reads a message's, in order), else this turn's first."""
    if messages is not None and not isinstance(messages, (str, bytes)):
        for message in messages:
            for found in ids_in(message):
                if found:
                    return str(found)
    for _, _, cid in calls:
        if cid:
            return str(cid)
    return None


def get(obj: Any, key: str) -> Any:
    """A field of an SDK object or of its dict form."""
    return obj.get(key) if isinstance(obj, Mapping) else getattr(obj, key, None)


def owned(guard: Guard, calls: list[T], name_of: Callable[[T], str], others: Others
          ) -> list[T]:
    """The calls this guard answers: its own tools, or every call with ``others="answer"``."""
    if others == "answer":
        return calls
    if others != "skip":
        raise ValueError("others must be 'skip' or 'answer'")
    names = guard.tools
    return [c for c in calls if name_of(c) in names]
