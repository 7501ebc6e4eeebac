"""The ladder after the cap: blocks, halts, per-tool failure ceilings and no progress.

Counting identical failures (the store's job) stops one call; this stops a turn that keeps
going nowhere: a call made again after it was blocked halts the turn, so does a tool that
failed ``max_tool_failures_per_turn`` times, and a read repeated with identical results is
``no_progress``.  Per-turn state lives in :class:`~toolfault._progress.Progress`.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from toolfault._admission import Admission, CallKey
from toolfault._call import NOT_JSON, _Call
from toolfault._classify import Failure, from_entry
from toolfault._errors import Outcome
from toolfault._message import format_seconds
from toolfault._progress import _BREAK, TurnState, repeats
from toolfault._records import IncidentKind
from toolfault._result import ToolResult
from toolfault._tool import ToolSpec

if TYPE_CHECKING:
    from toolfault._guard import Guard


class Ladder:
    """The guard's per-turn escalation (reads the guard's limits, clock and progress)."""

    def __init__(self, guard: Guard) -> None:
        self._g = guard
        self._cached_state: TurnState | None = None  # this scope's current turn, for speed
        self._cached_for: str | None = None
        self._cached_turn = -1

    def blocked(self, call: _Call, adm: Admission) -> ToolResult:
        g = self._g
        key = call.key
        assert key is not None
        now = g._clock()
        progress = g._progress
        with progress.lock:
            state = progress.state(g.task_id, g._turn)
            refused = state.refused.get(key, 0) + 1
            state.refused[key] = refused
            since = state.capped.setdefault(key, now)  # capped by another process: from now
            state.failed.setdefault(key, call.name)
        halt_after = g.limits.halt_after_terminal
        if halt_after is not None and refused >= halt_after:
            told = "it would not change anything" if adm.last_code == "no_progress" else \
                "retrying it was not allowed"
            return self.halt(call, f"{call.name} was called again after being told {told}")
        window = g.limits.block_seconds
        blocked_for = None if window is None else float(max(1, math.ceil(window - (now - since))))
        code, _, param = (adm.last_code or "tool_error").partition(":")
        entry = g.catalog.get(code)
        failure = from_entry(entry, "identical call blocked")
        alternatives = g._shaper.alternatives(call, failure)
        failure.param = param or None
        return g._shaper.terminal(call, failure, adm.failures, alternatives,
                                  blocked_for=blocked_for, blocked=True)

    def halt(self, call: _Call, clause: str, *, outcome: Outcome = Outcome.NO_EFFECT,
             blocked: bool = True) -> ToolResult:
        """End the turn: an incident, the halt message, and every later call refused."""
        g = self._g
        scope = (g.task_id, g._turn)
        progress = g._progress
        now = g._clock()
        with progress.lock:
            state = progress.state(*scope)
            first = state.halted is None
            if first:
                state.halted, state.halted_at = clause, now
                progress.halted.add(scope)
            else:
                clause = state.halted or clause
            since = state.halted_at
        window = g.limits.block_seconds
        left = None if window is None else float(max(1, math.ceil(window - (now - since))))
        over = "this turn is over" if left is None else \
            f"calls are refused for the next {format_seconds(left)}"
        if first:
            g._emitter.incident(IncidentKind.HALT, call.name, "halted", clause)
            reason = f"{clause}, so {over}"
        else:
            reason = f"{over} because {clause}"
        failure = from_entry(g.catalog.get("halted"), reason, outcome=outcome)
        return g._shaper.halted(call, failure, retry_after=left, blocked=blocked)

    def still_halted(self, call: _Call, spec: ToolSpec | None, args: Any) -> ToolResult | None:
        """The halt message while the turn is halted (lifted after ``block_seconds``)."""
        g = self._g
        scope = (g.task_id, g._turn)
        progress = g._progress
        if scope not in progress.halted:
            return None
        window = g.limits.block_seconds
        with progress.lock:
            state = progress.get(*scope)
            expired = state is None or (window is not None
                                        and g._clock() - state.halted_at >= window)
            keys: list[CallKey] = []
            if expired:
                progress.halted.discard(scope)
                if state is not None:
                    keys = state.reset()
        if expired:
            for key in keys:
                g._safe_store(g._store.clear_failures, key)
            return None
        call.spec = spec
        call.args = args if args is not NOT_JSON else (
            call.args if isinstance(call.args, str) else repr(call.args))
        call.shadow.pop("json_reason", None)
        return self.halt(call, "")

    def lift_expired(self, key: CallKey) -> None:
        """Lift a block older than ``Limits.block_seconds`` (the store forgets the count)."""
        g = self._g
        window = g.limits.block_seconds
        progress = g._progress
        with progress.lock:
            state = progress.get(key.task, key.turn)
            since = state.capped.get(key) if state is not None else None
            if state is None or since is None or window is None \
                    or g._clock() - since < window:
                return
            del state.capped[key]
            state.refused.pop(key, None)
            state.failed.pop(key, None)
        g._safe_store(g._store.clear_failures, key)

    def note_failure(self, call: _Call, failure: Failure, *, terminal: bool
                     ) -> ToolResult | None:
        """Count a genuine failure per tool (each attempt); the halt at the tool's ceiling."""
        g = self._g
        key = call.key
        progress = g._progress
        with progress.lock:
            state = progress.state(g.task_id, g._turn)
            # Every failed run of the body counts, retries inside the wrapper included: a
            # transient tool that failed 3 attempts twice has failed 6 times.
            failures = state.tool_failures.get(call.name, 0) + max(1, call.attempts)
            state.tool_failures[call.name] = failures
            history = state.history
            history.append(_BREAK)
            keep = (g.limits.no_progress_cycle or 1) * g.limits.no_progress_repeats
            if len(history) > keep:
                del history[:-keep]
            if key is not None:
                state.failed[key] = call.name
                if terminal:
                    state.capped.setdefault(key, g._clock())
        ceiling = g.limits.max_tool_failures_per_turn
        if ceiling is not None and failures >= ceiling and failure.code != "invalid_call":
            return self.halt(call, f"{call.name} failed {failures} times in this turn "
                                   f"(last: {failure.code})", outcome=failure.outcome,
                             blocked=False)
        return None

    def note_success(self, spec: ToolSpec, args: Any, text: str) -> int:
        """Record a success; the length of the no-progress cycle it completes, else 0.

        Also lifts the blocks of other tools when ``Limits.success_lifts_blocks`` is set.
        On the hot path: one cached turn state, one append, one or three comparisons.
        """
        g = self._g
        limits = g.limits
        state = self._cached_state
        if state is None or not state.live or self._cached_for is not g.task_id \
                or self._cached_turn != g._turn:
            state = self._current_state()
        if limits.success_lifts_blocks and state.failed:
            self._lift_after_success(state, spec.name)
        longest = limits.no_progress_cycle
        if longest is None:
            return 0
        # No lock: appends are atomic, and a race between two threads of one turn can at
        # worst miss a repeat, never invent one (entries must be equal).
        history = state.history
        times = limits.no_progress_repeats
        if len(history) >= longest * times:  # the newest longest * times entries are kept
            del history[0]
        if spec.side_effect or spec.name in limits.progress_exempt:
            history.append(_BREAK)
            return 0
        # The result's hash first: a different result fails a comparison at once; a cycle
        # repeats its newest entry, so one seen once completes none.
        entry = (hash(text), spec.name, args)
        history.append(entry)
        return repeats(history, longest, times) if history.count(entry) >= times else 0

    def _current_state(self) -> TurnState:
        """The turn's state, cached for the calls that follow in the same turn and task."""
        g = self._g
        progress = g._progress
        with progress.lock:
            state = progress.state(g.task_id, g._turn)
        self._cached_state, self._cached_for, self._cached_turn = state, g.task_id, g._turn
        return state

    def _lift_after_success(self, state: TurnState, tool: str) -> None:
        """``Limits.success_lifts_blocks``: the blocks of other tools end."""
        g = self._g
        with g._progress.lock:
            lifted = self._lift_others(state, tool)
        for key in lifted:
            g._safe_store(g._store.clear_failures, key)

    @staticmethod
    def _lift_others(state: TurnState, tool: str) -> list[CallKey]:
        """Forget the blocks of tools other than ``tool``; the keys to clear in the store."""
        lifted = []
        for key, name in list(state.failed.items()):
            if name != tool:
                del state.failed[key]
                state.capped.pop(key, None)
                state.refused.pop(key, None)
                lifted.append(key)
        return lifted

    def no_progress(self, call: _Call, cycle: int) -> ToolResult:
        """The ``no_progress`` message (the call is blocked from now on), or the halt."""
        g = self._g
        if not call.fp:
            g._pipeline.resolve_fp(call)
        key = CallKey(g.task_id, g._turn, call.fp)
        call.key = key
        progress = g._progress
        with progress.lock:
            state = progress.state(g.task_id, g._turn)
            state.no_progress += 1
            told = state.no_progress
        if cycle == 1:
            reason = (f"{call.name} returned the same result as the identical call before it; "
                      "calling it again will not change anything")
        else:
            reason = (f"the last {cycle} calls repeat the {cycle} before them with identical "
                      "results; repeating them again will not change anything")
        halt_after = g.limits.halt_after_no_progress
        if halt_after is not None and told > halt_after:
            return self.halt(call, "the calls keep returning the same results",
                             blocked=False)
        g._emitter.incident(IncidentKind.NO_PROGRESS, call.name, "no_progress", reason)
        failure = from_entry(g.catalog.get("no_progress"), reason)
        g._safe_store(g._store.record_failure, key, "no_progress", 1)
        with progress.lock:
            state.failed[key] = call.name
            state.capped.setdefault(key, g._clock())
        return g._shaper.no_progress(call, failure)

