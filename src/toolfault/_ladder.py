"""The ladder after the cap: stop the smallest thing first, and never good work.

Counting identical failures (the store's job) caps one call.  This module decides the rungs
above it (see :class:`~toolfault._limits.Limits`): a tool failing again and again with
changing arguments is blocked for the turn; a read returning the same result again is
answered with its result and a note, and only at ``no_progress_repeats`` identical results is
it ``no_progress``; a turn halts only when the model keeps ignoring blocks.  Repetition is
not failure: a success resets its tool's count, a changed result marks a poller, and results
are compared without their volatile fields.

Every decision is taken the same way in every mode, so observe mode predicts exactly what
enforce does (the pipeline acts on it only in enforce).  Per-turn state lives in
:class:`~toolfault._progress.Progress`.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable, Collection
from typing import Any

from toolfault._admission import Admission, CallKey
from toolfault._call import NOT_JSON, _Call, resolve_fp
from toolfault._classify import Failure, from_entry
from toolfault._degrading import DegradingStore, best_effort
from toolfault._emission import Emitter
from toolfault._errors import Outcome
from toolfault._message import format_seconds
from toolfault._progress import MAX_RESULTS, Progress, Seen, TurnState
from toolfault._records import IncidentKind
from toolfault._result import ToolResult
from toolfault._sameness import MAX_COMPARED_CHARS, digest
from toolfault._settings import Scope, Settings
from toolfault._shaping import Shaper
from toolfault._tool import ToolSpec

#: What a read-only success repeated adds to the result the model reads.
REPEAT_NOTE = "(Note: same result as your previous identical call.)"
#: The result shown inside a ``no_progress`` message is cut to this many characters.
_MAX_RESULT_IN_MESSAGE = 2_000


class Repeat(enum.Enum):
    """What a success is, compared with the identical call's earlier results in the turn."""

    NEW = "new"
    #: A different result than the identical call's last one: the call is a poller.
    CHANGED = "changed"
    #: The same result again: returned with :data:`REPEAT_NOTE`.
    SAME = "same"
    #: The same result ``no_progress_repeats`` times: ``no_progress``, the call is blocked.
    NO_PROGRESS = "no_progress"


def _fingerprint_of(call: _Call) -> str:
    """The call's fingerprint, computed now ("" when it cannot have one)."""
    return call.fingerprint() if call.fingerprint is not None else ""


def _first_seen(text: str, volatile: Collection[str]) -> Seen:
    """What is kept of a result seen for the first time: the text itself when short
    enough to compare, else its digest."""
    if len(text) <= MAX_COMPARED_CHARS:
        return Seen(text, None)
    return Seen(None, digest(text, volatile))


class Ladder:
    """One scope's per-turn escalation: its limits and clock, the turns' progress, the
    store's shared failure counts and pollers; words by the shaper, incidents by the emitter."""

    def __init__(self, settings: Settings, scope: Scope, progress: Progress,
                 store: DegradingStore, shaper: Shaper, emitter: Emitter,
                 clock: Callable[[], float]) -> None:
        self._limits = settings.limits
        self._catalog = settings.catalog
        self._scope = scope
        self._progress = progress
        self._store = store
        self._shaper = shaper
        self._emitter = emitter
        self._clock = clock

    def _state(self) -> TurnState:
        """This scope's current turn (call with the progress lock held)."""
        return self._progress.state(self._scope.task_id, self._scope.turn)

    # -- refusals: a block ignored, and the halt as the last rung ---------------------------
    def _refusal(self, call: _Call, told: str) -> str | None:
        """Count one refused call; the halt clause when this refusal ends the turn."""
        with self._progress.lock:
            state = self._state()
            state.refusals += 1
            refusals = state.refusals
        limit = self._limits.halt_after_refusals
        if limit is None or refusals < limit:
            return None
        return f"{call.name} was called again after being told {told}"

    def blocked(self, call: _Call, adm: Admission) -> ToolResult:
        """The identical call after its cap (or after ``no_progress``): the same terminal
        message again, not dispatched; the halt when the model keeps ignoring blocks."""
        key = call.key
        assert key is not None
        now = self._clock()
        with self._progress.lock:
            state = self._state()
            since = state.capped.setdefault(key, now)  # capped by another process: from now
            state.failed.setdefault(key, call.name)
        no_progress = adm.last_code == "no_progress"
        told = "it would not change anything" if no_progress else "retrying it was not allowed"
        clause = self._refusal(call, told)
        if clause is not None:
            return self.halt(call, clause)
        window = self._limits.block_seconds
        blocked_for = None if window is None else float(max(1, math.ceil(window - (now - since))))
        if no_progress:
            reason = f"{call.name} keeps returning the same result for these arguments"
            if blocked_for is not None:
                reason += f", so it is refused for the next {format_seconds(blocked_for)}"
            failure = from_entry(self._catalog.get("no_progress"), reason)
            return self._shaper.blocked_tool(call, failure)
        code, _, param = (adm.last_code or "tool_error").partition(":")
        failure = from_entry(self._catalog.get(code), "identical call blocked")
        alternatives = self._shaper.alternatives(call, failure)
        failure.param = param or None
        return self._shaper.terminal(call, failure, adm.failures, alternatives,
                                  blocked_for=blocked_for, blocked=True)

    def tool_refused(self, call: _Call) -> ToolResult | None:
        """A call of a tool blocked for the turn (``None``: the tool is not blocked)."""
        with self._progress.lock:
            state = self._progress.get(self._scope.task_id, self._scope.turn)
            block = state.blocked_tools.get(call.name) if state is not None else None
        if block is None:
            return None
        since, why = block
        clause = self._refusal(call, f"{call.name} may not be called again in this turn")
        if clause is not None:
            return self.halt(call, clause)
        return self._tool_blocked(call, f"{why}, so it is blocked for the rest of this turn",
                                  since=since, outcome=Outcome.NO_EFFECT)

    def halt(self, call: _Call, clause: str, *, outcome: Outcome = Outcome.NO_EFFECT,
             blocked: bool = True) -> ToolResult:
        """End the turn: an incident, the halt message, and every later call refused."""
        where = (self._scope.task_id, self._scope.turn)
        progress = self._progress
        now = self._clock()
        with progress.lock:
            state = progress.state(*where)
            first = state.halted is None
            if first:
                state.halted, state.halted_at = clause, now
                progress.halted.add(where)
            else:
                clause = state.halted or clause
            since = state.halted_at
        window = self._limits.block_seconds
        left = None if window is None else float(max(1, math.ceil(window - (now - since))))
        over = "this turn is over" if left is None else \
            f"calls are refused for the next {format_seconds(left)}"
        if first:
            if self._scope.mode == "enforce":
                self._emitter.incident(IncidentKind.HALT, call.name, "halted", clause)
            reason = f"{clause}, so {over}"
        else:
            reason = f"{over} because {clause}"
        failure = from_entry(self._catalog.get("halted"), reason, outcome=outcome)
        return self._shaper.halted(call, failure, retry_after=left, blocked=blocked)

    def still_halted(self, call: _Call, spec: ToolSpec | None, args: Any) -> ToolResult | None:
        """The halt message while the turn is halted (lifted after ``block_seconds``)."""
        where = (self._scope.task_id, self._scope.turn)
        if where not in self._progress.halted or self._lift_expired_halt(where):
            return None
        self._name_refused(call, spec, args)
        return self.halt(call, "")

    def _lift_expired_halt(self, where: tuple[str, int]) -> bool:
        """Lift the turn's halt once ``block_seconds`` have passed (or its state is gone),
        forgetting its counts; whether it was lifted."""
        window = self._limits.block_seconds
        progress = self._progress
        with progress.lock:
            state = progress.get(*where)
            expired = state is None or (window is not None
                                        and self._clock() - state.halted_at >= window)
            if not expired:
                return False
            progress.halted.discard(where)
            keys = state.reset() if state is not None else []
        for key in keys:
            best_effort(self._store.clear_failures, key)
        return True

    def _name_refused(self, call: _Call, spec: ToolSpec | None, args: Any) -> None:
        """Give the call the halt refuses its tool and arguments, so the trace names it."""
        call.spec = spec
        if args is NOT_JSON:  # arguments that did not parse are shown as they came
            args = call.args if isinstance(call.args, str) else repr(call.args)
        call.args = args
        call.shadow.pop("json_reason", None)
        if spec is not None and isinstance(call.args, dict):
            resolve_fp(call, self._scope)

    def lift_expired(self, key: CallKey) -> None:
        """Lift blocks older than ``Limits.block_seconds`` (the store forgets the count)."""
        window = self._limits.block_seconds
        if window is None:
            return
        now = self._clock()
        with self._progress.lock:
            state = self._progress.get(key.task, key.turn)
            if state is None:
                return
            for tool, (since, _) in list(state.blocked_tools.items()):
                if now - since >= window:
                    del state.blocked_tools[tool]
                    state.tool_failures.pop(tool, None)
            capped = state.capped.get(key)
            if capped is None or now - capped < window:
                return
            del state.capped[key]
            state.failed.pop(key, None)
            state.results.pop(key.fingerprint, None)
        best_effort(self._store.clear_failures, key)

    # -- calls in flight ---------------------------------------------------------------------
    def started(self, call: _Call) -> None:
        """Give an admitted call its place in the turn (frameworks start a message's parallel
        calls in the model's order, but they finish in any order)."""
        with self._progress.lock:
            state = self._state()
            call.ticket = state.tickets
            state.tickets += 1
            state.running.setdefault(call.name, {})[call.ticket] = None
        call.running_in = state

    def finished(self, call: _Call) -> None:
        """The call is recorded (or ended without being recorded): out of the running set."""
        state, ticket = call.running_in, call.ticket
        if state is None or ticket is None:
            return
        call.ticket = None
        with self._progress.lock:
            running = state.running.get(call.name)
            if running is not None:
                running.pop(ticket, None)

    def _earlier_running(self, state: TurnState, call: _Call) -> bool:
        """Whether a call of the same tool admitted before this one is still running: its
        outcome comes first in the model's order (call with the progress lock held)."""
        ticket = call.ticket
        running = state.running.get(call.name)
        return ticket is not None and bool(running) and min(running) < ticket  # type: ignore[arg-type]

    # -- after the call ------------------------------------------------------------------------
    def failure_changed(self, call: _Call, failure: Failure) -> bool:
        """Whether the identical call failed differently last time (another code, or words
        that differ beyond times and ids): an observation that changed is progress, not a
        loop, so its identical-failure count starts over."""
        said = f"{failure.code}\n{failure.reason}"
        with self._progress.lock:
            errors = self._state().errors
            before = errors.get(call.fp)
            errors[call.fp] = said
            if len(errors) > MAX_RESULTS:
                del errors[next(iter(errors))]
        if before is None or before == said:  # the usual repeat: equal words, no digest
            return False
        volatile = self._limits.volatile_fields
        return digest(before, volatile) != digest(said, volatile)

    def note_failure(self, call: _Call, failure: Failure, *, terminal: bool
                     ) -> ToolResult | None:
        """Count a failure of the tool (one per call, its retries included); at the tool's
        ceiling of failures in a row, the tool is blocked for the turn."""
        key = call.key
        with self._progress.lock:
            state = self._state()
            failures = state.tool_failures.get(call.name, 0) + 1
            state.tool_failures[call.name] = failures
            # An earlier call of this tool still running may be a success that ends the
            # failures in a row: the block waits for the next failure after it.
            hold = self._earlier_running(state, call)
            if key is not None:
                state.failed[key] = call.name
                state.results.pop(key.fingerprint, None)
                if terminal:
                    state.capped.setdefault(key, self._clock())
        self.finished(call)
        ceiling = self._limits.max_tool_failures_per_turn
        if ceiling is None or failures < ceiling or failure.code == "invalid_call" or hold:
            return None
        why = f"{call.name} failed {failures} times in a row in this turn (last: {failure.code})"
        now = self._clock()
        with self._progress.lock:
            self._state().blocked_tools[call.name] = (now, why)
        if self._scope.mode == "enforce":
            self._emitter.incident(IncidentKind.TOOL_BLOCKED, call.name, "tool_blocked", why)
        return self._tool_blocked(call, f"{why}, so it is blocked for the rest of this turn",
                                  since=now, outcome=failure.outcome)

    def _tool_blocked(self, call: _Call, reason: str, *, since: float, outcome: Outcome
                      ) -> ToolResult:
        window = self._limits.block_seconds
        if window is not None:
            left = max(1, math.ceil(window - (self._clock() - since)))
            reason = reason.replace("for the rest of this turn",
                                    f"for the next {format_seconds(float(left))}")
        failure = from_entry(self._catalog.get("tool_blocked"), reason, outcome=outcome)
        return self._shaper.blocked_tool(call, failure)

    def note_success(self, call: _Call, text: str) -> Repeat:
        """Record a success: its tool's failures in a row end, and a read-only call's result
        is compared with the identical call's last one (see :class:`Repeat`)."""
        limits = self._limits
        spec = call.spec
        assert spec is not None
        with self._progress.lock:
            state = self._state()
            if state.tool_failures:
                state.tool_failures.pop(call.name, None)
        self.finished(call)
        # A side effect changed the world: a call that failed before may succeed now (run the
        # tests, edit, run them again), so the identical-failure blocks of other tools end.
        if (limits.success_lifts_blocks or spec.side_effect) and state.failed:
            self._lift_after_success(state, call.name)
        times = limits.no_progress_repeats
        if spec.side_effect or times is None:
            return Repeat.NEW
        fingerprint = call.fp or _fingerprint_of(call)
        if not fingerprint:
            return Repeat.NEW
        return self._compare_read(state, spec, fingerprint, text, times)

    def _compare_read(self, state: TurnState, spec: ToolSpec, fingerprint: str, text: str,
                      times: int) -> Repeat:
        """A read-only success against the identical call's last result: remembered when new
        or changed (a changed one marks a poller), counted when the same."""
        with self._progress.lock:
            seen = state.seen(fingerprint)
            if seen is None:
                state.remember(fingerprint, _first_seen(text, self._limits.volatile_fields))
                return Repeat.NEW
            same = self._same(seen, text)
            if not same:
                state.remember(fingerprint, Seen(text, None))
            else:
                seen.repeats += 1
            repeats = seen.repeats
        if not same:
            self._learn_poller(fingerprint)
            return Repeat.CHANGED
        if spec.name in self._limits.progress_exempt:
            return Repeat.NEW  # the same answer is what this tool is for: no note either
        if repeats < times or self._is_poller(fingerprint):
            return Repeat.SAME
        return Repeat.NO_PROGRESS

    def compared(self, call: _Call, text: str) -> Repeat:
        """How a result compares with the identical call's last one, counting nothing: for
        the trace of a call enforce would have refused (observe mode ran it anyway)."""
        if call.spec is None or call.spec.side_effect or not call.fp:
            return Repeat.NEW
        with self._progress.lock:
            state = self._progress.get(self._scope.task_id, self._scope.turn)
            seen = state.seen(call.fp) if state is not None else None
            if seen is None:
                return Repeat.NEW
            return Repeat.SAME if self._same(seen, text) else Repeat.CHANGED

    def _same(self, seen: Seen, text: str) -> bool:
        """Whether ``text`` says what the last result said (volatile fields aside)."""
        if seen.text is not None and seen.text == text:
            return True
        volatile = self._limits.volatile_fields
        if seen.digest is None:
            if seen.text is None:
                return False
            seen.digest = digest(seen.text, volatile)
            seen.text = None  # the digest stands for it from now on
        return seen.digest == digest(text, volatile)

    def _learn_poller(self, fingerprint: str) -> None:
        """A changed result: this call is a poller, here and (through the store) everywhere."""
        with self._progress.lock:
            self._progress.learn_poller(self._scope.task_id, fingerprint)
        best_effort(self._store.mark_poller, fingerprint)

    def _is_poller(self, fingerprint: str) -> bool:
        if self._progress.is_poller(self._scope.task_id, fingerprint):
            return True
        return bool(best_effort(self._store.is_poller, fingerprint))

    def _lift_after_success(self, state: TurnState, tool: str) -> None:
        """``Limits.success_lifts_blocks``: the blocks of other tools end."""
        with self._progress.lock:
            lifted = self._lift_others(state, tool)
        for key in lifted:
            best_effort(self._store.clear_failures, key)

    @staticmethod
    def _lift_others(state: TurnState, tool: str) -> list[CallKey]:
        """Forget the blocks of tools other than ``tool``; the keys to clear in the store."""
        lifted = []
        for key, name in list(state.failed.items()):
            if name != tool:
                del state.failed[key]
                state.capped.pop(key, None)
                lifted.append(key)
        for name in list(state.blocked_tools):
            if name != tool:
                del state.blocked_tools[name]
                state.tool_failures.pop(name, None)
        return lifted

    def no_progress(self, call: _Call, text: str, data: Any) -> ToolResult:
        """The ``no_progress`` message with the result still in it; the call is blocked."""
        if not call.fp:
            resolve_fp(call, self._scope)
        key = CallKey(self._scope.task_id, self._scope.turn, call.fp)
        call.key = key
        times = self._limits.no_progress_repeats
        reason = (f"{call.name} returned the same result {times} times; calling it again "
                  "will not change anything")
        if self._scope.mode == "enforce":
            self._emitter.incident(IncidentKind.NO_PROGRESS, call.name, "no_progress", reason)
        failure = from_entry(self._catalog.get("no_progress"), reason)
        best_effort(self._store.record_failure, key, "no_progress", 1)
        with self._progress.lock:
            state = self._state()
            state.failed[key] = call.name
            state.capped.setdefault(key, self._clock())
        shown = text if len(text) <= _MAX_RESULT_IN_MESSAGE else \
            f"{text[:_MAX_RESULT_IN_MESSAGE]}... ({len(text)} characters in all)"
        return self._shaper.no_progress(call, failure, shown, data)
