"""Per-turn escalation state: what :mod:`toolfault._ladder` decides from.

The fingerprint counts live in the store (shared by a fleet); what a turn escalates to lives
here, in the guard's process, per task and turn: refused repeats after the terminal message,
failures per tool, the recent read-only calls and their results (for repeats and ``A,B,A,B``
cycles), when each block started, and whether the turn is halted.  With a shared store the
escalation is per process, which only ever makes it later, never wrong.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from toolfault._admission import CallKey

#: Scopes remembered at once (one per task and live turn); the oldest are forgotten first.
MAX_SCOPES = 4096
#: A marker that breaks cycles (a failure or a side effect is never "the same again").
_BREAK: Any = object()


@dataclass(slots=True, init=False)
class TurnState:
    """What one turn of one task has escalated to (one per turn: its ``__init__`` is
    written out, as literals cost less than a dataclass's default factories)."""

    halted: str | None
    halted_at: float
    no_progress: int
    tool_failures: dict[str, int]
    #: ``(hash of the result text, tool, arguments)`` of recent calls, newest last.
    history: list[Any]
    capped: dict[CallKey, float]
    refused: dict[CallKey, int]
    failed: dict[CallKey, str]
    #: False once forgotten (a new turn, or the oldest of too many scopes): caches re-read.
    live: bool

    def __init__(self) -> None:
        self.halted, self.halted_at, self.no_progress = None, 0.0, 0
        self.tool_failures = {}
        self.history = []
        self.capped = {}
        self.refused = {}
        self.failed = {}
        self.live = True

    def reset(self) -> list[CallKey]:
        """Forget everything (a halt expired); returns the keys whose store counts to clear."""
        keys = list(self.failed) + [k for k in self.capped if k not in self.failed]
        self.halted, self.halted_at, self.no_progress = None, 0.0, 0
        self.tool_failures.clear()
        self.history.clear()
        self.capped.clear()
        self.refused.clear()
        self.failed.clear()
        return keys


class Progress:
    """Turn states by ``(task, turn)``, shared by a guard and its scopes; thread-safe."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self._turns: OrderedDict[tuple[str, int], TurnState] = OrderedDict()
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
                old, gone = self._turns.popitem(last=False)
                gone.live = False
                self.halted.discard(old)
        else:
            self._turns.move_to_end(scope)  # least recently used goes first
        return state

    def has_capped(self, task: str, turn: int) -> bool:
        """Whether any block is running in the turn (only then can one expire)."""
        state = self._turns.get((task, turn))
        return state is not None and bool(state.capped)

    def forget(self, task: str, turn: int) -> None:
        """Drop one turn of a task (the guard's previous turn, at ``new_turn()``)."""
        with self.lock:
            gone = self._turns.pop((task, turn), None)
            if gone is not None:
                gone.live = False
            self.halted.discard((task, turn))


def repeats(history: list[Any], longest: int, times: int = 2) -> int:
    """Length of the cycle the newest entries repeat ``times`` times in a row, or 0.

    ``A,A`` → 1 and ``A,B,A,B`` → 2 (with ``times=2``).  Called after every read-only
    success, so the usual answer (no repeat) costs one comparison per length, and entries
    compare their result hash first.
    """
    size = len(history)
    last = history[-1] if size else _BREAK
    if last is _BREAK or history.count(last) < times:  # a cycle repeats its last entry
        return 0
    for length in range(1, min(longest, size // times) + 1):
        if history[-1 - length] != last:
            continue
        if _cycle_holds(history, length, times):
            return length
    return 0


def _cycle_holds(history: list[Any], length: int, times: int) -> bool:
    for back in range(1, length + 1):
        entry = history[-back]
        if entry is _BREAK:
            return False
        for k in range(1, times):
            if history[-back - k * length] != entry:
                return False
    return True
