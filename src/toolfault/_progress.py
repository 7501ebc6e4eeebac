"""Per-turn escalation state: what :mod:`toolfault._ladder` decides from.

The fingerprint counts live in the store (shared by a fleet); what a turn escalates to lives
here, in the guard's process, per task and turn: how often the model ignored a block, the
consecutive failures of each tool and the tools blocked for the turn, each call's last result
and how many times in a row it came back the same, when each block started, and whether the
turn is halted.  What a conversation learned (which calls are pollers) outlives its turns.
With a shared store the escalation is per process, which only ever makes it later, never wrong.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass, field

from toolfault._admission import CallKey

#: Scopes remembered at once (one per task and live turn); the oldest are forgotten first.
MAX_SCOPES = 4096
#: Distinct calls whose last result a turn remembers (the oldest are forgotten first).
MAX_RESULTS = 512
#: Poller fingerprints a conversation remembers.
MAX_POLLERS = 1024


@dataclass(slots=True)
class Seen:
    """The last result of one call (fingerprint) in a turn, and how often it came back."""

    text: str | None
    digest: int | None
    repeats: int = 1


@dataclass(slots=True)
class TurnState:
    """What one turn of one task has escalated to."""

    halted: str | None = None
    halted_at: float = 0.0
    #: Calls refused because the model ignored a block (blocked call, blocked tool).
    refusals: int = 0
    #: Failures in a row per tool (its success resets the count).
    tool_failures: dict[str, int] = field(default_factory=dict)
    #: Tools blocked for the turn: when, and the clause that says why.
    blocked_tools: dict[str, tuple[float, str]] = field(default_factory=dict)
    #: The last result of each read-only call (by fingerprint).
    results: OrderedDict[str, Seen] = field(default_factory=OrderedDict)
    capped: dict[CallKey, float] = field(default_factory=dict)
    failed: dict[CallKey, str] = field(default_factory=dict)
    #: What each failing call (by fingerprint) last said: its code and reason.
    errors: dict[str, str] = field(default_factory=dict)
    #: Calls admitted and not yet recorded, per tool, by ticket (their admission order).
    running: dict[str, dict[int, None]] = field(default_factory=dict)
    tickets: int = 0

    def reset(self) -> list[CallKey]:
        """Forget everything (a halt expired); returns the keys whose store counts to clear."""
        keys = list(self.failed) + [k for k in self.capped if k not in self.failed]
        self.halted, self.halted_at, self.refusals = None, 0.0, 0
        self.tool_failures.clear()
        self.blocked_tools.clear()
        self.results.clear()
        self.errors.clear()
        self.capped.clear()
        self.failed.clear()
        return keys

    def seen(self, fingerprint: str) -> Seen | None:
        return self.results.get(fingerprint)

    def remember(self, fingerprint: str, seen: Seen) -> None:
        self.results[fingerprint] = seen
        self.results.move_to_end(fingerprint)
        if len(self.results) > MAX_RESULTS:
            self.results.popitem(last=False)


class Progress:
    """Turn states by ``(task, turn)`` and pollers by task, shared by a guard and its
    scopes; thread-safe (callers hold :attr:`lock` around reads and writes of a state)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self._turns: OrderedDict[tuple[str, int], TurnState] = OrderedDict()
        self._pollers: OrderedDict[str, OrderedDict[str, None]] = OrderedDict()
        #: ``(task, turn)`` of halted turns: every call's one cheap check.
        self.halted: set[tuple[str, int]] = set()

    def get(self, task: str, turn: int) -> TurnState | None:
        return self._turns.get((task, turn))

    def state(self, task: str, turn: int) -> TurnState:
        """The turn's state, created on first use (call with :attr:`lock` held)."""
        scope = (task, turn)
        state = self._turns.get(scope)
        if state is None:
            state = self._turns[scope] = TurnState()
            if len(self._turns) > MAX_SCOPES:
                old, _ = self._turns.popitem(last=False)
                self.halted.discard(old)
        else:
            self._turns.move_to_end(scope)  # least recently used goes first
        return state

    def has_capped(self, task: str, turn: int) -> bool:
        """Whether any block is running in the turn (only then can one expire)."""
        state = self._turns.get((task, turn))
        return state is not None and bool(state.capped or state.blocked_tools)

    def forget(self, task: str, turn: int) -> None:
        """Drop one turn of a task (the guard's previous turn, at ``new_turn()``)."""
        with self.lock:
            self._turns.pop((task, turn), None)
            self.halted.discard((task, turn))

    # -- what a conversation learned ------------------------------------------------------
    def is_poller(self, task: str, fingerprint: str) -> bool:
        pollers = self._pollers.get(task)
        return pollers is not None and fingerprint in pollers

    def learn_poller(self, task: str, fingerprint: str) -> None:
        """This call's result changed once: it is a poller for the rest of the conversation."""
        pollers = self._pollers.get(task)
        if pollers is None:
            pollers = self._pollers[task] = OrderedDict()
            if len(self._pollers) > MAX_SCOPES:
                self._pollers.popitem(last=False)
        pollers[fingerprint] = None
        if len(pollers) > MAX_POLLERS:
            pollers.popitem(last=False)
