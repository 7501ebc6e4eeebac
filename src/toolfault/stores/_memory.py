"""The default store: one process, in memory, thread-safe (see :class:`MemoryStore`)."""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Protocol, TypeVar

from toolfault._admission import (
    Admission,
    AdmissionRequest,
    CallKey,
    Ceiling,
)
from toolfault._forking import renew_locks_after_fork
from toolfault._records import Incident, LedgerEntry
from toolfault.stores._protocol import (
    _UNBOUNDED,
    SPEND_EPSILON,
    _fingerprint_or_none,
    _limits_of,
)

_monotonic = time.monotonic

#: A new turn runs an expiry sweep at most this often (a turn beyond the bound always does).
_SWEEP_SECONDS = 1.0


class _Aging(Protocol):
    """A task or turn as eviction sees it: last use, and last use when placed in order."""

    used: float
    placed: float


_K = TypeVar("_K")
_A = TypeVar("_A", bound=_Aging)


def _evict(entries: OrderedDict[_K, _A], current: _K | None, now: float, ttl: float | None,
           bound: int | None, forget: Callable[[_K], None]) -> None:
    """Forget, least recently used first, what outlived ``ttl`` or exceeds ``bound`` (LRU by
    the clock algorithm: one used since it was placed gets a second chance, moved to the
    end).  ``current`` (in use) is never evicted; past it a second time, the sweep stops."""
    passed = False
    while entries:
        oldest, entry = next(iter(entries.items()))
        if oldest == current:
            if passed:
                break
            passed = True
        if entry.used > entry.placed or oldest == current:
            entry.placed = entry.used
            entries.move_to_end(oldest)
            continue
        if not ((ttl is not None and now - entry.used > ttl)
                or (bound is not None and len(entries) > bound)):
            break
        forget(oldest)


class _Turn:
    """Counters of one (task, turn)."""

    __slots__ = ("calls", "failures", "lone", "lone_expires", "pending", "placed", "task",
                 "used")

    def __init__(self, task: _Task, now: float) -> None:
        self.task = task
        #: Last use, and the last use when it was put at the end of the LRU order.
        self.used = self.placed = now
        self.calls = 0
        #: fingerprint -> (count, last code, limit)
        self.failures: dict[str, tuple[int, str, int]] = {}
        #: fingerprint -> {request: lease expiry}: reservations under a known fingerprint.
        self.pending: dict[str, dict[AdmissionRequest, float]] = {}
        #: The one call of a quiet scope, admitted without its fingerprint.
        self.lone: AdmissionRequest | None = None
        self.lone_expires = 0.0


class _Task:
    """Everything one task keeps: spend, its turns, ledger and incidents."""

    __slots__ = ("by_key", "incidents", "ledger", "placed", "spend", "turns", "used")

    def __init__(self, now: float) -> None:
        self.used = self.placed = now
        self.spend = 0.0
        self.turns: set[int] = set()
        self.ledger: dict[str, LedgerEntry] = {}
        self.by_key: dict[str, str] = {}
        self.incidents: list[Incident] = []


#: Poller fingerprints a memory store remembers (the oldest are forgotten first).
_MAX_POLLERS = 100_000


class MemoryStore:
    """The default store: one process, thread-safe, asyncio-safe (no awaits inside a step).

    A call in a quiet scope (no failure recorded in its turn, no other call of the turn
    holding a reservation) is admitted without computing its fingerprint: it is kept as the
    turn's one unresolved call.  A call of that turn admitted while it runs computes its
    fingerprint (pure and cached) and counts it with the calls under that key, so identical
    concurrent calls still count toward the cap atomically.  Its settle needs no lock: only
    it clears the turn's unresolved call, and nothing replaces one that is not cleared.

    Memory stays bounded in a long-running process: the counters of one turn and whole tasks
    (budgets, ledger, incidents) are evicted when idle for ``ttl_seconds`` or, least recently
    used first, beyond ``max_turns`` / ``max_tasks`` - the lifetime SQLite and Redis give
    their keys.  Nothing in use is dropped early: guards sharing a store may be on
    different turns of one task.
    """

    def __init__(self, *, ttl_seconds: float | None = 86400.0, max_tasks: int | None = 10_000,
                 max_turns: int | None = 100_000) -> None:
        if ttl_seconds is not None and ttl_seconds <= 0:
            raise ValueError("ttl_seconds must be positive (or None for no expiry)")
        if max_tasks is not None and max_tasks < 1:
            raise ValueError("max_tasks must be at least 1 (or None for no bound)")
        if max_turns is not None and max_turns < 1:
            raise ValueError("max_turns must be at least 1 (or None for no bound)")
        self.ttl_seconds = ttl_seconds
        self.max_tasks = max_tasks
        self.max_turns = max_turns
        self._lock = threading.Lock()
        renew_locks_after_fork(self)
        # In the order they were last placed; a use only stamps ``used`` (no reordering on
        # the hot path): the sweep gives an entry used since it was placed a second chance
        # (moves it to the end) before it may evict it - LRU by the clock algorithm.
        self._tasks: OrderedDict[str, _Task] = OrderedDict()
        self._turns: OrderedDict[tuple[str, int], _Turn] = OrderedDict()
        #: (task, token) -> (expiry, holder)
        self._held: dict[tuple[str, str], tuple[float, str]] = {}
        #: Fingerprints whose result was seen to change (see :class:`Pollers`).
        self._pollers: OrderedDict[str, None] = OrderedDict()
        # Expiry sweeps run when a task is new, a turn is beyond max_turns, or at the first
        # use a second after the last sweep (expiry needs no finer clock).
        self._next_sweep = 0.0
        # The last ceilings tuple seen (guards reuse one per tool), its limits, and whether a
        # call of a quiet scope can reach none of them (see ``_parse``).
        self._parsed: tuple[tuple[Ceiling, ...], tuple[float | None, float | None,
                                                       float | None], bool] = ((), _UNBOUNDED,
                                                                               True)

    def _after_fork(self) -> None:
        """In a forked child: a lock another thread held at the fork is never released
        there, so the child starts with a fresh one (the counters are copied as they were)."""
        self._lock = threading.Lock()

    # -- counters -----------------------------------------------------------------------
    def admit(self, request: AdmissionRequest) -> Admission:
        now = _monotonic()  # the lease and the TTL need it; one read per admission
        # One unpacking, not an attribute lookup per field.
        task_id, turn_no, _, cost, lease, ceilings = request
        seen, limits, unreachable = self._parsed
        if seen is not ceilings:
            _, limits, unreachable = self._parse(ceilings)
        lock = self._lock
        lock.acquire()  # not ``with``: half its cost, on every call
        try:
            turn = self._turns.get((task_id, turn_no))
            if turn is None or now >= self._next_sweep:
                turn = self._use(task_id, turn_no, now)
            else:
                turn.used = turn.task.used = now
            if turn.failures or (lease is not None and (turn.lone is not None or turn.pending)):
                return self._admit_keyed(turn, request, now, limits)
            # A quiet scope (no failure in the turn, no other reservation): the steps of
            # ``_admission.py`` without the fingerprint, which nothing here needs.
            task = turn.task
            if unreachable:  # no ceiling this call could reach: count and reserve
                calls = turn.calls = turn.calls + 1
                if cost:
                    task.spend += cost
                if lease is not None:
                    turn.lone = request
                    turn.lone_expires = now + lease
                return Admission(0, None, False, calls, task.spend)
            max_calls, max_running, max_spend = limits
            calls = turn.calls + 1
            spend = task.spend
            if max_calls is not None and calls > max_calls:
                return Admission(0, None, False, calls - 1, spend, "calls_per_turn")
            turn.calls = calls
            if lease is not None and max_running is not None and max_running <= 0:
                return Admission(0, None, False, calls, spend, busy=True)
            if max_spend is not None and spend + cost > max_spend + SPEND_EPSILON:
                return Admission(0, None, False, calls, spend, "spend_per_task")
            if cost:
                spend = task.spend = spend + cost
            if lease is not None:
                turn.lone = request
                turn.lone_expires = now + lease
            return Admission(0, None, False, calls, spend)
        finally:
            lock.release()

    def _parse(self, ceilings: tuple[Ceiling, ...]) -> tuple[
            tuple[Ceiling, ...], tuple[float | None, float | None, float | None], bool]:
        """The ceilings with their limits (see :func:`ceilings_of`), remembered for the next
        call, and whether a call of a quiet scope can reach none of them: no ceiling on
        calls or spend, and at least one identical call may run."""
        limits = _limits_of(ceilings)
        max_calls, max_running, max_spend = limits
        unreachable = max_calls is None and max_spend is None and (max_running is None
                                                                   or max_running > 0)
        parsed = self._parsed = (ceilings, limits, unreachable)
        return parsed

    def _admit_keyed(self, turn: _Turn, request: AdmissionRequest, now: float,
                     limits: tuple[float | None, float | None, float | None]) -> Admission:
        """The general case: count by fingerprint (the turn's unresolved call included)."""
        self._expire(turn, now)
        task = turn.task
        max_calls, max_running, max_spend = limits
        fp = request.fingerprint()
        record = turn.failures.get(fp)
        failures, code = (record[0], record[1]) if record is not None else (0, None)
        calls = turn.calls + 1
        spend = task.spend
        # 1. calls in the turn
        if max_calls is not None and calls > max_calls:
            return Admission(failures, code, False, calls - 1, spend, "calls_per_turn")
        turn.calls = calls
        # 2. the fingerprint's failure record
        if record is not None and failures >= record[2]:
            return Admission(failures, code, True, calls, spend)
        # 3. identical calls running
        lease = request.lease
        if lease is not None:
            live = turn.pending.get(fp)
            running = len(live) if live else 0
            lone = turn.lone
            if lone is not None and _fingerprint_or_none(lone) == fp:
                running += 1
            cap = record[2] if record is not None else max_running
            if cap is not None and failures + running >= cap:
                return Admission(failures, code, False, calls, spend, busy=True)
        # 4. spend in the task
        cost = request.cost
        if max_spend is not None and spend + cost > max_spend + SPEND_EPSILON:
            return Admission(failures, code, False, calls, spend, "spend_per_task")
        # 5. admitted
        if cost:
            spend = task.spend = spend + cost
        if lease is not None:
            turn.pending.setdefault(fp, {})[request] = now + lease
        return Admission(failures, code, False, calls, spend)

    @staticmethod
    def _expire(turn: _Turn, now: float) -> None:
        """Drop the reservations past their lease (a call that never settled)."""
        if turn.lone is not None and turn.lone_expires <= now:
            turn.lone = None
        if turn.pending:
            for fp in list(turn.pending):
                live = turn.pending[fp]
                for request in [r for r, expiry in live.items() if expiry <= now]:
                    del live[request]
                if not live:
                    del turn.pending[fp]

    def settle(self, request: AdmissionRequest) -> None:
        with self._lock:
            turn = self._turns.get((request.task, request.turn))
            if turn is None:
                return
            if turn.lone is request:
                turn.lone = None
                return
            if turn.pending and request.fingerprint.resolved:
                fp = request.fingerprint()
                live = turn.pending.get(fp)
                if live is not None and live.pop(request, None) is not None and not live:
                    del turn.pending[fp]

    def record_failure(self, key: CallKey, code: str, limit: int) -> int:
        with self._lock:
            turn = self._use(key.task, key.turn, time.monotonic())
            previous = turn.failures.get(key.fingerprint)
            count = (previous[0] if previous else 0) + 1
            turn.failures[key.fingerprint] = (count, code, limit)
            return count

    def clear_failures(self, key: CallKey) -> None:
        with self._lock:
            turn = self._turns.get((key.task, key.turn))
            if turn is not None:
                turn.failures.pop(key.fingerprint, None)

    def refund(self, task: str, cost: float) -> None:
        if cost:
            with self._lock:
                found = self._tasks.get(task)
                if found is not None:
                    found.spend = max(0.0, found.spend - cost)

    # -- key locks ----------------------------------------------------------------------
    def acquire(self, task: str, token: str, ttl: float, holder: str = "") -> bool:
        now = time.monotonic()
        with self._lock:
            held = self._held.get((task, token))
            if held is not None and held[0] > now and (not holder or held[1] != holder):
                return False
            self._held[(task, token)] = (now + ttl, holder)
            return True

    def release(self, task: str, token: str, holder: str = "") -> None:
        with self._lock:
            held = self._held.get((task, token))
            if held is not None and (not holder or held[1] == holder):
                del self._held[(task, token)]

    def extend(self, task: str, token: str, ttl: float, holder: str) -> bool:
        now = time.monotonic()
        with self._lock:
            held = self._held.get((task, token))
            if held is None or held[1] != holder or held[0] <= now:
                return False
            self._held[(task, token)] = (now + ttl, holder)
            return True

    # -- records ------------------------------------------------------------------------
    def put_ledger(self, entry: LedgerEntry) -> None:
        with self._lock:
            task = self._use_task(entry.task, time.monotonic())
            if entry.call_id not in task.ledger and entry.idempotency_key is not None:
                task.by_key[entry.idempotency_key] = entry.call_id
            task.ledger[entry.call_id] = entry

    def ledger(self, task: str) -> list[LedgerEntry]:
        with self._lock:
            found = self._tasks.get(task)
            entries = list(found.ledger.values()) if found is not None else []
        return sorted(entries, key=lambda e: e.at)

    def ledger_entry(self, task: str, idempotency_key: str) -> LedgerEntry | None:
        with self._lock:
            found = self._tasks.get(task)
            if found is None:
                return None
            call_id = found.by_key.get(idempotency_key)
            return None if call_id is None else found.ledger.get(call_id)

    def ledger_call(self, task: str, call_id: str) -> LedgerEntry | None:
        with self._lock:
            found = self._tasks.get(task)
            return None if found is None else found.ledger.get(call_id)

    def swap_ledger(self, entry: LedgerEntry, expected: LedgerEntry) -> bool:
        with self._lock:
            found = self._tasks.get(entry.task)
            if found is None or found.ledger.get(entry.call_id) != expected:
                return False
            found.ledger[entry.call_id] = entry
            return True

    def has_entry(self, task: str, call_id: str) -> bool:
        """Whether this store holds the entry (a fallback: written during an outage)."""
        with self._lock:
            found = self._tasks.get(task)
            return found is not None and call_id in found.ledger

    def add_incident(self, incident: Incident) -> None:
        with self._lock:
            self._use_task(incident.task, time.monotonic()).incidents.append(incident)

    def mark_poller(self, fingerprint: str) -> None:
        with self._lock:
            self._pollers[fingerprint] = None
            self._pollers.move_to_end(fingerprint)
            if len(self._pollers) > _MAX_POLLERS:
                self._pollers.popitem(last=False)

    def is_poller(self, fingerprint: str) -> bool:
        return fingerprint in self._pollers

    def incidents(self, task: str) -> list[Incident]:
        with self._lock:
            found = self._tasks.get(task)
            return list(found.incidents) if found is not None else []

    def drain(self) -> tuple[list[LedgerEntry], list[tuple[str, str, float, str]],
                             list[Incident]]:
        """Take out every ledger entry, live idempotency key (task, token, seconds left,
        holder) and incident: what an outage left here, to be written into the shared store
        on recovery."""
        now = time.monotonic()
        with self._lock:
            entries = [e for task in self._tasks.values() for e in task.ledger.values()]
            incidents = [i for task in self._tasks.values() for i in task.incidents]
            held = [(task, token, expiry - now, holder)
                    for (task, token), (expiry, holder) in self._held.items() if expiry > now]
            for task in self._tasks.values():
                task.ledger.clear()
                task.by_key.clear()
                task.incidents.clear()
            self._held.clear()
        return entries, held, incidents

    def close(self) -> None:
        """Nothing to release."""

    # -- bounded memory (call with the lock held) ----------------------------------------
    def _use(self, task_id: str, turn_no: int, now: float) -> _Turn:
        """The turn's counters, marked used (created, with an expiry sweep, when new)."""
        scope = (task_id, turn_no)
        turn = self._turns.get(scope)
        if turn is None:
            task = self._use_task(task_id, now)
            turn = self._turns[scope] = _Turn(task, now)
            task.turns.add(turn_no)
            # A new turn sweeps when it crosses the bound, or when the last sweep is a second
            # old (expiry needs no finer clock).
            if now >= self._next_sweep or (self.max_turns is not None
                                           and len(self._turns) > self.max_turns):
                self._sweep(now, task_id, scope)
            return turn
        turn.used = turn.task.used = now
        if now >= self._next_sweep:
            self._sweep(now, task_id, scope)
        return turn

    def _use_task(self, task_id: str, now: float) -> _Task:
        task = self._tasks.get(task_id)
        if task is None:
            task = self._tasks[task_id] = _Task(now)
            self._sweep(now, task_id, None)
            return task
        task.used = now
        return task

    def _sweep(self, now: float, task_id: str, scope: tuple[str, int] | None) -> None:
        """Evict, least recently used first, what outlived the TTL or the bounds."""
        self._next_sweep = now + _SWEEP_SECONDS
        ttl = self.ttl_seconds
        _evict(self._tasks, task_id, now, ttl, self.max_tasks,
               lambda oldest: self._forget_task(oldest, now))
        _evict(self._turns, scope, now, ttl, self.max_turns, self._forget_turn)

    def _forget_turn(self, scope: tuple[str, int]) -> None:
        turn = self._turns.pop(scope)
        turn.task.turns.discard(scope[1])

    def _forget_task(self, task_id: str, now: float) -> None:
        """Everything one task left behind, except idempotency keys still held."""
        task = self._tasks.pop(task_id)
        for turn_no in task.turns:
            self._turns.pop((task_id, turn_no), None)
        for held in [h for h, (expiry, _) in self._held.items()
                     if h[0] == task_id and expiry <= now]:
            del self._held[held]


# -- degrading wrappers --------------------------------------------------------------------

