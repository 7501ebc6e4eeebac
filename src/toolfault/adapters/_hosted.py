"""What the adapters for frameworks that own the tools (Pydantic AI, ADK) share.

Those frameworks hand over a tool object per call rather than a name the guard knows, so the
guard gets one registered body per tool name that runs the call in flight (handed over in a
context variable), and the counters live in one scope per conversation with a turn per run.
"""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any

from toolfault._errors import ConfigurationError
from toolfault._guard import Guard

#: Conversations whose scopes a guard keeps per adapter (least recently used dropped first).
MAX_CONVERSATIONS = 4096

#: The guard's schema for hosted tools: any object.  Each adapter validates against the tool
#: object in flight, so two agents' tools that share a name never share a schema.
ANY_OBJECT: Mapping[str, Any] = {"type": "object"}


class Conversations:
    """One scope per conversation key of one guard, and the run each last saw.

    A call from a run the key has not seen before starts a new turn of its scope.
    """

    def __init__(self, label: str) -> None:
        self.label = label
        self.lock = threading.Lock()
        self.scopes: OrderedDict[str, tuple[Guard, str | None]] = OrderedDict()

    def scope(self, guard: Guard, key: str, run: str | None) -> Guard:
        with self.lock:
            entry = self.scopes.get(key)
            if entry is None:
                scoped = guard.scoped(f"{guard.task_id}/{self.label}-{key}")
                self.scopes[key] = (scoped, run)
                while len(self.scopes) > MAX_CONVERSATIONS:
                    self.scopes.popitem(last=False)
                return scoped
            scoped, seen = entry
            self.scopes.move_to_end(key)
            if run is not None and seen not in (None, run):
                scoped.new_turn()  # the conversation's next run
            if run is not None:
                self.scopes[key] = (scoped, run)
            return scoped


class ScopeRegistry:
    """Per guard, the :class:`Conversations` of one adapter (held weakly by the guard)."""

    def __init__(self, label: str) -> None:
        self.label = label
        self._lock = threading.Lock()
        self._by_guard: weakref.WeakKeyDictionary[Guard, Conversations] = (
            weakref.WeakKeyDictionary())

    def scope(self, guard: Guard, key: str | None, run: str | None) -> Guard:
        """The scope ``key`` counts in (the guard itself for ``None``)."""
        if key is None:
            return guard
        with self._lock:
            found = self._by_guard.get(guard)
            if found is None:
                found = self._by_guard[guard] = Conversations(self.label)
        return found.scope(guard, key, run)


def register(guard: Guard, name: str, description: str, options: Mapping[str, Any],
             mark: str, body: Callable[[], Callable[..., Any]]) -> None:
    """Register ``name`` on the guard with ``body()`` once, again only when ``options`` changed.

    A name the guard already has from elsewhere is a configuration error: the adapter would
    otherwise silently replace the user's own tool.
    """
    spec = guard.tools.get(name)
    if spec is not None:
        mine = getattr(spec.fn, mark, None)
        if mine is None:
            raise ConfigurationError(
                f"{name} is already registered on the guard: the adapter registers the tools it "
                "guards itself (pass Guard.tool options as tool_options=)")
        if mine == dict(options):
            return
    fn = body()
    setattr(fn, mark, dict(options))
    guard.tool(name=name, description=description or name, schema=ANY_OBJECT, **options)(fn)
