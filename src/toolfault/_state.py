"""Where counters, budgets, in-flight keys and the effect ledger live.

The state protocol comes in three parts, so a store (or a test double) implements what it
backs and a wrapper can be typed per part:

- :class:`Counters`: the hot path.  :meth:`Counters.admit` evaluates one
  :class:`~toolfault._admission.AdmissionRequest` atomically (the order is documented in
  ``_admission.py``); failures, reservations and spend live here.
- :class:`KeyLocks`: idempotency keys held while a side effect is in flight.
- :class:`Records`: the effect ledger and incidents.

:class:`Store` is all three plus ``close``.  One process uses :class:`MemoryStore`; an
embedded durable file ``SQLiteStore``; a fleet of workers ``RedisStore``.
:class:`DegradingStore` wraps whichever is configured so an outage never crashes the agent.
"""

from __future__ import annotations

import inspect
import logging
import queue
import threading
import time
import warnings
from collections import OrderedDict
from collections.abc import Callable
from typing import ParamSpec, Protocol, TypeVar, runtime_checkable

from toolfault._admission import (
    Admission,
    AdmissionRequest,
    CallKey,
    Ceiling,
    Counter,
    LazyFingerprint,
)
from toolfault._errors import StateUnavailableError
from toolfault._forking import renew_locks_after_fork
from toolfault._records import Incident, IncidentKind, LedgerEntry

log = logging.getLogger("toolfault")

__all__ = [
    "Admission",
    "AdmissionRequest",
    "CallKey",
    "Ceiling",
    "Counter",
    "Counters",
    "DegradingCounters",
    "DegradingKeyLocks",
    "DegradingRecords",
    "DegradingStore",
    "KeyKeeper",
    "KeyLocks",
    "LazyFingerprint",
    "MemoryStore",
    "Records",
    "Store",
    "ceilings_of",
]

_P = ParamSpec("_P")
_R = TypeVar("_R")

#: Tolerance when comparing spend with its ceiling (float sums of per-call costs).
SPEND_EPSILON = 1e-12


@runtime_checkable
class Counters(Protocol):
    """Failure records, calls per turn, spend per task and reservations (thread-safe)."""

    def admit(self, request: AdmissionRequest) -> Admission:
        """Evaluate ``request`` once, atomically, in the order ``_admission.py`` documents.

        With ``request.lease`` an admitted call holds one reservation until :meth:`settle`
        is given the same request (or the lease runs out), so identical concurrent calls
        count toward the cap atomically.
        """
        ...

    def settle(self, request: AdmissionRequest) -> None:
        """Drop the reservation ``request`` was admitted with (no-op when it holds none)."""
        ...

    def record_failure(self, key: CallKey, code: str, limit: int) -> int:
        """Add one consecutive failure for the fingerprint; returns the new count."""
        ...

    def clear_failures(self, key: CallKey) -> None:
        """A success (or a verified effect) resets the fingerprint's count."""
        ...

    def refund(self, task: str, cost: float) -> None:
        """Give back spend charged for a call that was never dispatched."""
        ...


@runtime_checkable
class KeyLocks(Protocol):
    """Idempotency keys: one holder at a time per (task, key), with a TTL.

    ``holder`` names who claimed a key (one random token per claim).  Only its holder may
    release or extend a key, so a claim that ended late (a timed-out attempt that finally
    returned) cannot free a key another worker claimed since.  The guard extends the keys it
    holds while their holders run (:class:`KeyKeeper`), so the TTL frees a key only when
    the process that held it is gone.

    A store written to the earlier protocol (no ``holder``, no ``extend``) still works,
    with a ``DeprecationWarning``: its keys are released by whoever asks and are not
    extended (see :class:`DegradingKeyLocks`).
    """

    def acquire(self, task: str, token: str, ttl: float, holder: str = "") -> bool:
        """Claim an idempotency key for ``holder`` for ``ttl`` seconds; False when another
        holder has it.  Claiming a key one already holds extends it (True)."""
        ...

    def release(self, task: str, token: str, holder: str = "") -> None:
        """Release the key if ``holder`` holds it (``""``: whoever holds it)."""
        ...

    def extend(self, task: str, token: str, ttl: float, holder: str) -> bool:
        """Hold the key ``ttl`` seconds more; False when ``holder`` no longer holds it (it
        expired and was claimed, or was released): nothing is changed then."""
        ...


@runtime_checkable
class Records(Protocol):
    """The effect ledger (what happened, apart from what the model was told) and incidents."""

    def put_ledger(self, entry: LedgerEntry) -> None:
        """Insert or replace a ledger entry (by ``call_id``)."""
        ...

    def ledger(self, task: str) -> list[LedgerEntry]:
        """Ledger entries for a task, oldest first."""
        ...

    def ledger_entry(self, task: str, idempotency_key: str) -> LedgerEntry | None:
        """The latest entry written for an idempotency key (one indexed read, not a scan)."""
        ...

    def ledger_call(self, task: str, call_id: str) -> LedgerEntry | None:
        """The entry of one call id (a replayed call finds what it was told)."""
        ...

    def swap_ledger(self, entry: LedgerEntry, expected: LedgerEntry) -> bool:
        """Compare-and-set: replace the entry with ``entry``'s ``call_id`` only while it still
        equals ``expected``; False (nothing written) when someone changed it meanwhile."""
        ...

    def add_incident(self, incident: Incident) -> None:
        """Record an incident."""
        ...

    def incidents(self, task: str) -> list[Incident]:
        """Incidents for a task, oldest first."""
        ...


@runtime_checkable
class Pollers(Protocol):
    """What the fleet learned about calls whose result changes (optional for a store).

    A call (fingerprint) whose identical call ever returned a different result is a poller:
    it is never ``no_progress``.  A store without these methods keeps that per process.
    """

    def mark_poller(self, fingerprint: str) -> None:
        """Remember ``fingerprint`` as a poller (for the store's retention)."""
        ...

    def is_poller(self, fingerprint: str) -> bool:
        """Whether any worker saw this call's result change."""
        ...


@runtime_checkable
class Store(Counters, KeyLocks, Records, Protocol):
    """The whole state protocol: counters, key locks and records, plus ``close``."""

    def close(self) -> None:
        """Release connections and files (and flush anything deferred)."""
        ...


def ceilings_of(request: AdmissionRequest) -> tuple[float | None, float | None, float | None]:
    """The request's ceilings as (calls in turn, identical running, spend in task).

    One clause per :class:`Counter`; the tightest wins when a counter is bounded twice.  A
    new counter is a new clause here and one step in each store, nowhere else.
    """
    return _limits_of(request.ceilings)


#: The limits of ceilings that bound nothing.
_UNBOUNDED: tuple[float | None, float | None, float | None] = (None, None, None)


def _limits_of(ceilings: tuple[Ceiling, ...]) -> tuple[float | None, float | None,
                                                       float | None]:
    calls = running = spend = None
    for ceiling in ceilings:
        counter, limit = ceiling.counter, ceiling.limit
        if counter is Counter.CALLS_IN_TURN:
            calls = limit if calls is None else min(calls, limit)
        elif counter is Counter.IDENTICAL_RUNNING:
            running = limit if running is None else min(running, limit)
        elif counter is Counter.SPEND_IN_TASK:
            spend = limit if spend is None else min(spend, limit)
        else:  # pragma: no cover - a Counter member without a clause is a programming error
            raise ValueError(f"no store clause for {counter!r}")
    return calls, running, spend


def _fingerprint_or_none(request: AdmissionRequest) -> str | None:
    """A reserved call's fingerprint, or ``None`` when computing it fails: no other call can
    be identical to that one, so it counts nowhere."""
    try:
        return request.fingerprint()
    except Exception:  # noqa: BLE001 - its own call's problem, not this one's
        return None


# -- MemoryStore ---------------------------------------------------------------------------


#: Builds an admitting :class:`Admission` on the hot path (a NamedTuple's own ``__new__``
#: is a Python-level call; ``tuple.__new__`` is not).
_new_tuple = tuple.__new__
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
                return _new_tuple(Admission, (0, None, False, calls, task.spend, None, False))
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
            return _new_tuple(Admission, (0, None, False, calls, spend, None, False))
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
        return _new_tuple(Admission, (failures, code, False, calls, spend, None, False))

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
        turn = self._turns.get((request[0], request[1]))
        if turn is None:
            return
        if turn.lone is request:
            # Without the lock: a turn's unresolved call is only replaced once it is None,
            # and only its own call's settle (or its lease, long past) makes it None.
            turn.lone = None
            return
        if turn.pending and request.fingerprint.resolved:
            fp = request.fingerprint()
            with self._lock:
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


class _Outage:
    """The outage state the three degrading wrappers share: one primary, one fallback.

    ``policy="open"``: on a store error, fall back to the local :class:`MemoryStore` and try
    the primary again after ``retry_after`` seconds.  ``policy="closed"``: raise
    :class:`StateUnavailableError`.  ``on_degrade`` is told once per outage.
    """

    def __init__(self, primary: Store, fallback: MemoryStore, *, policy: str,
                 retry_after: float, on_degrade: Callable[[BaseException], None] | None
                 ) -> None:
        self.primary = primary
        self.fallback = fallback
        self.policy = policy
        self.retry_after = retry_after
        self.down_since: float | None = None
        self.on_degrade = on_degrade
        self._lock = threading.Lock()
        self._recovering = threading.Lock()
        #: The primary takes holders (the current :class:`KeyLocks` protocol).
        self.holders = _takes_holders(primary)
        renew_locks_after_fork(self)

    def _after_fork(self) -> None:
        """In a forked child: the key keeper's thread may have been writing back (holding
        ``_recovering``) at the fork; that thread does not exist here."""
        self._lock = threading.Lock()
        self._recovering = threading.Lock()

    def acquire_primary(self, task: str, token: str, ttl: float, holder: str) -> bool:
        """Claim a key on the primary, with its holder where the primary takes one."""
        if self.holders:
            return self.primary.acquire(task, token, ttl, holder)
        return self.primary.acquire(task, token, ttl)

    def run(self, on_primary: Callable[_P, _R], on_fallback: Callable[_P, _R],
            *args: _P.args, **kwargs: _P.kwargs) -> _R:
        """``on_primary`` while it answers; ``on_fallback`` (or a raise) during an outage."""
        if self.down_since is not None and not self._back():
            if self.policy == "closed":
                raise StateUnavailableError("the state store is unavailable")
            return on_fallback(*args, **kwargs)
        try:
            return on_primary(*args, **kwargs)
        except Exception as exc:
            self.degrade(exc)
            return on_fallback(*args, **kwargs)

    def _back(self) -> bool:
        down = self.down_since
        return down is None or (time.monotonic() - down >= self.retry_after and self.recover())

    def degrade(self, exc: BaseException) -> None:
        """Mark the primary down (told once per outage); raise when failing closed."""
        with self._lock:
            first = self.down_since is None
            self.down_since = time.monotonic()
        if first and self.on_degrade is not None:
            self.on_degrade(exc)
        if self.policy == "closed":
            raise StateUnavailableError("the state store is unavailable") from exc

    def recover(self) -> bool:
        """Back from an outage: first write what was kept locally into the primary.

        Ledger entries and live idempotency keys recorded in the fallback during the outage
        go to the shared store before it serves anything else, so a pending effect recorded
        only here is seen by every worker before any of them dispatches that key again; the
        incidents (the outage's own ``state_degraded`` first) follow, so the degradation is
        reported where every worker and operator looks, not only in this process.  False
        (still down, nothing lost) when the primary fails meanwhile.
        """
        with self._recovering:
            if self.down_since is None:
                return True
            entries, held, incidents = self.fallback.drain()
            try:
                self._write_back(entries, held, incidents)
            except Exception:
                for entry in entries:
                    self.fallback.put_ledger(entry)
                for task, token, left, holder in held:
                    self.fallback.acquire(task, token, left, holder)
                for incident in incidents:
                    self.fallback.add_incident(incident)
                with self._lock:
                    self.down_since = time.monotonic()
                return False
            with self._lock:
                self.down_since = None
            # What a racing thread wrote locally while this ran: moved over as well.
            late = self.fallback.drain()
            _quietly(self._write_back, *late)
            return True

    def _write_back(self, entries: list[LedgerEntry],
                    held: list[tuple[str, str, float, str]], incidents: list[Incident]) -> None:
        primary = self.primary
        for task, token, left, holder in held:
            if not self.acquire_primary(task, token, max(left, 0.001), holder) \
                    and self.holders:  # (the earlier protocol: a repeat claim looks the same)
                # Another worker claimed the key in the shared store while this one held it
                # locally: both may dispatch the same action.  Reported, not ignored.
                log.warning("toolfault: an idempotency key held during the outage was "
                            "claimed by another worker meanwhile")
                incidents.insert(0, Incident(
                    IncidentKind.KEY_CONFLICT, "*", "effect_unknown",
                    "an idempotency key held locally during a store outage was claimed by "
                    "another worker meanwhile; the action may have run twice", task, 0))
        for entry in sorted(entries, key=lambda e: e.at):
            primary.put_ledger(entry)
        for incident in incidents:
            primary.add_incident(incident)


class DegradingCounters:
    """:class:`Counters` of the primary, or of the fallback during an outage."""

    def __init__(self, outage: _Outage) -> None:
        self._outage = outage
        self._primary: Counters = outage.primary
        self._fallback = outage.fallback

    def admit(self, request: AdmissionRequest) -> Admission:
        outage = self._outage
        if outage.down_since is None:  # the hot path: one direct call
            try:
                return self._primary.admit(request)
            except Exception as exc:
                if not request.fingerprint.resolved:
                    raise  # the call's fingerprint failed: the caller's error, not an outage
                outage.degrade(exc)
                return self._fallback.admit(request)
        return outage.run(self._primary.admit, self._fallback.admit, request)

    def settle(self, request: AdmissionRequest) -> None:
        """Drop the reservation; one taken on the primary before an outage expires there."""
        outage = self._outage
        if outage.down_since is None:
            try:
                self._primary.settle(request)
            except Exception as exc:  # the reservation expires with its lease
                _quietly(outage.degrade, exc)
            return
        self._fallback.settle(request)

    def record_failure(self, key: CallKey, code: str, limit: int) -> int:
        return self._outage.run(self._primary.record_failure, self._fallback.record_failure,
                                key, code, limit)

    def clear_failures(self, key: CallKey) -> None:
        self._outage.run(self._primary.clear_failures, self._fallback.clear_failures, key)

    def refund(self, task: str, cost: float) -> None:
        self._outage.run(self._primary.refund, self._fallback.refund, task, cost)


class DegradingKeyLocks:
    """:class:`KeyLocks` of the primary, or of the fallback during an outage.

    Every key it grants is kept by a :class:`KeyKeeper` until released: extended while its
    holder runs, wherever it lives now (the fallback during an outage).  A primary written
    to the earlier protocol (``acquire``/``release`` without ``holder``, no ``extend``) is
    called the earlier way: its keys are neither holder-checked nor extended.
    """

    def __init__(self, outage: _Outage) -> None:
        self._outage = outage
        self._primary: KeyLocks = outage.primary
        self._fallback = outage.fallback
        self.keeper = KeyKeeper(self.extend)
        if not outage.holders:
            warnings.warn(
                f"{type(outage.primary).__name__} implements the earlier KeyLocks protocol: "
                "add holder= to acquire and release, and extend(), so a late release cannot "
                "free a key another worker holds", DeprecationWarning, stacklevel=4)

    def acquire(self, task: str, token: str, ttl: float, holder: str = "") -> bool:
        outage = self._outage
        got = outage.run(self._acquire_primary, self._fallback.acquire, task, token, ttl, holder)
        if got and holder:
            self.keeper.hold(task, token, holder, ttl)
        return got

    def release(self, task: str, token: str, holder: str = "") -> None:
        if holder:
            self.keeper.drop(task, token, holder)
        self._outage.run(self._release_primary, self._fallback.release, task, token, holder)

    def extend(self, task: str, token: str, ttl: float, holder: str) -> bool:
        return self._outage.run(self._extend_primary, self._extend_fallback,
                                task, token, ttl, holder)

    def _extend_fallback(self, task: str, token: str, ttl: float, holder: str) -> bool:
        """During an outage a renewal claims the key locally for its holder (one claimed on
        the primary before the outage is not here yet): written back on recovery, where a
        claim by another worker meanwhile is reported as a ``key_conflict``."""
        return self._fallback.acquire(task, token, ttl, holder)

    def _acquire_primary(self, task: str, token: str, ttl: float, holder: str) -> bool:
        return self._outage.acquire_primary(task, token, ttl, holder)

    def _release_primary(self, task: str, token: str, holder: str) -> None:
        if self._outage.holders:
            self._primary.release(task, token, holder)
        else:
            self._primary.release(task, token)

    def _extend_primary(self, task: str, token: str, ttl: float, holder: str) -> bool:
        if self._outage.holders:
            return self._primary.extend(task, token, ttl, holder)
        return True  # the earlier protocol cannot extend: the key's own TTL decides


class KeyKeeper:
    """Extends the idempotency keys this process holds while their holders run.

    A side effect can run past its key's TTL (an attempt that timed out but still runs, or
    retries plus checks); if the key expired, another worker could claim it and run the
    same action while the first still might land.  The keeper renews each held key every
    third of its TTL (a lock watchdog, as Redisson's), from one daemon thread that exists
    only while keys are held.  So a key expires when the process holding it is gone, or
    ``max_hold`` seconds after it was claimed (an attempt hung for an hour no longer blocks
    its action for the life of the process); a key found lost at renewal is logged.

    Renewals run on up to ``RENEWERS`` worker threads, so one slow renewal (a store that
    takes seconds to answer for one key) does not hold back the others' renewals; a key
    whose renewal is still running is not renewed again meanwhile.
    """

    #: Seconds after its claim a key stops being renewed (its TTL then runs out).
    MAX_HOLD = 3600.0
    #: Renewals running at once.
    RENEWERS = 4

    def __init__(self, extend: Callable[[str, str, float, str], bool], *,
                 max_hold: float = MAX_HOLD) -> None:
        self._extend = extend
        self.max_hold = max_hold
        #: (task, token, holder) -> [ttl, next renewal, renew until]
        self._keys: dict[tuple[str, str, str], list[float]] = {}
        self._changed = threading.Condition()
        self._thread: threading.Thread | None = None
        #: Keys whose renewal is running now.
        self._renewing: set[tuple[str, str, str]] = set()
        #: Keys found lost at renewal (for tests and operators).
        self.lost = 0
        renew_locks_after_fork(self)

    def _after_fork(self) -> None:
        """In a forked child: the parent's threads and keys are not ours, and the parent's
        thread may have held the condition's lock at the fork (it would never be released)."""
        self._changed = threading.Condition()
        self._thread, self._keys, self._renewing = None, {}, set()

    def hold(self, task: str, token: str, holder: str, ttl: float) -> None:
        """Keep ``holder``'s key until :meth:`drop` (renewed every ``ttl / 3`` seconds)."""
        now = time.monotonic()
        with self._changed:
            kept = self._keys.get((task, token, holder))
            until = kept[2] if kept is not None else now + self.max_hold
            self._keys[(task, token, holder)] = [ttl, now + ttl / 3, until]
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="toolfault-keys",
                                                daemon=True)
                self._thread.start()
            self._changed.notify()

    def drop(self, task: str, token: str, holder: str) -> None:
        """Stop renewing ``holder``'s key (it is being released)."""
        with self._changed:
            self._keys.pop((task, token, holder), None)
            self._changed.notify()  # the last one: the thread ends now, not at its next renewal

    def close(self) -> None:
        """Stop renewing every key (the guard is closing; their TTLs run out)."""
        with self._changed:
            self._keys.clear()
            self._changed.notify()

    @property
    def held(self) -> int:
        """How many keys are being kept now."""
        return len(self._keys)

    def _run(self) -> None:
        # Daemon renewers, as the keeper itself: a renewal hung on a store never holds up
        # the interpreter's exit (a pool's workers are joined at exit).  They live as long
        # as this thread; a new hold starts all of them again.
        jobs: queue.SimpleQueue[tuple[tuple[str, str, str], float] | None] = queue.SimpleQueue()
        for n in range(self.RENEWERS):
            threading.Thread(target=self._renewer, args=(jobs,), daemon=True,
                             name=f"toolfault-key-renewal-{n}").start()
        try:
            while self._schedule(jobs):
                pass
        finally:
            for _ in range(self.RENEWERS):
                jobs.put(None)  # each renewer ends after the renewal it is running

    def _renewer(self, jobs: queue.SimpleQueue[tuple[tuple[str, str, str], float] | None]
                 ) -> None:
        while (job := jobs.get()) is not None:
            self._renew(*job)

    def _schedule(self, jobs: queue.SimpleQueue[tuple[tuple[str, str, str], float] | None]
                  ) -> bool:
        """Hand the keys due for renewal to the renewers, or wait until one is due;
        ``False`` when nothing is held (the thread ends: a new hold starts one)."""
        with self._changed:
            if not self._keys:
                self._thread = None
                return False
            now = time.monotonic()
            due = [key for key, kept in self._keys.items() if kept[1] <= now]
            if not due:
                self._changed.wait(min(kept[1] for kept in self._keys.values()) - now)
                return True
            for key in due:
                kept = self._keys[key]
                if kept[2] <= now:  # held past max_hold: its TTL decides from here
                    del self._keys[key]
                    log.warning("toolfault: an idempotency key was held for %.0f s; it is "
                                "no longer renewed", self.max_hold)
                    continue
                kept[1] = now + kept[0] / 3
                if key not in self._renewing:  # else its last renewal is still running
                    self._renewing.add(key)
                    jobs.put((key, kept[0]))
        return True

    def _renew(self, key: tuple[str, str, str], ttl: float) -> None:
        try:
            kept_key = self._extend(key[0], key[1], ttl, key[2])
        except Exception:  # noqa: BLE001 - try again next time; the TTL is the backstop
            kept_key = True
        with self._changed:
            self._renewing.discard(key)
            lost = not kept_key and self._keys.pop(key, None) is not None
            if lost:  # not released meanwhile: really lost
                self.lost += 1
        if lost:
            log.warning("toolfault: an idempotency key expired while its call still ran, "
                        "and another call may hold it now")


def _takes_holders(store: object) -> bool:
    """Whether ``store`` implements the current :class:`KeyLocks` protocol (``holder`` on
    ``acquire`` and ``release``, and ``extend``)."""
    try:
        acquire = inspect.signature(store.acquire)  # type: ignore[attr-defined]
        release = inspect.signature(store.release)  # type: ignore[attr-defined]
    except (AttributeError, TypeError, ValueError):
        return False
    def takes(sig: inspect.Signature) -> bool:  # by name, or a wrapper's **kwargs
        return "holder" in sig.parameters or any(
            p.kind is inspect.Parameter.VAR_KEYWORD for p in sig.parameters.values())

    return takes(acquire) and takes(release) and callable(getattr(store, "extend", None))


class DegradingRecords:
    """:class:`Records` of the primary, with what an outage left locally read first.

    A primary written to an earlier protocol (no ``ledger_entry`` / ``ledger_call`` /
    ``swap_ledger``) is served by scanning its ledger: slower, never wrong.
    """

    def __init__(self, outage: _Outage) -> None:
        self._outage = outage
        self._primary: Records = outage.primary
        self._fallback = outage.fallback
        self._keyed = all(callable(getattr(outage.primary, name, None))
                          for name in ("ledger_entry", "ledger_call", "swap_ledger"))

    def put_ledger(self, entry: LedgerEntry) -> None:
        self._outage.run(self._primary.put_ledger, self._fallback.put_ledger, entry)

    def ledger(self, task: str) -> list[LedgerEntry]:
        return self._outage.run(self._primary.ledger, self._fallback.ledger, task)

    def ledger_entry(self, task: str, idempotency_key: str) -> LedgerEntry | None:
        local = self._fallback.ledger_entry(task, idempotency_key)
        if local is not None:  # recorded during an outage, not yet moved over
            return local
        if not self._keyed:
            found = [e for e in self.ledger(task) if e.idempotency_key == idempotency_key]
            return found[-1] if found else None
        return self._outage.run(self._primary.ledger_entry, self._fallback.ledger_entry,
                                task, idempotency_key)

    def ledger_call(self, task: str, call_id: str) -> LedgerEntry | None:
        local = self._fallback.ledger_call(task, call_id)
        if local is not None:
            return local
        if not self._keyed:
            return next((e for e in self.ledger(task) if e.call_id == call_id), None)
        return self._outage.run(self._primary.ledger_call, self._fallback.ledger_call,
                                task, call_id)

    def swap_ledger(self, entry: LedgerEntry, expected: LedgerEntry) -> bool:
        if self._fallback.has_entry(entry.task, entry.call_id):
            return self._fallback.swap_ledger(entry, expected)
        if not self._keyed:  # best effort: read, compare, write
            if self.ledger_call(entry.task, entry.call_id) != expected:
                return False
            self.put_ledger(entry)
            return True
        return self._outage.run(self._primary.swap_ledger, self._fallback.swap_ledger,
                                entry, expected)

    def mark_poller(self, fingerprint: str) -> None:
        self._fallback.mark_poller(fingerprint)
        mark = getattr(self._primary, "mark_poller", None)
        if callable(mark):
            self._outage.run(mark, self._fallback.mark_poller, fingerprint)

    def is_poller(self, fingerprint: str) -> bool:
        if self._fallback.is_poller(fingerprint):
            return True
        check = getattr(self._primary, "is_poller", None)
        if not callable(check):
            return False
        return bool(self._outage.run(check, self._fallback.is_poller, fingerprint))

    def add_incident(self, incident: Incident) -> None:
        try:
            self._outage.run(self._primary.add_incident, self._fallback.add_incident, incident)
        except StateUnavailableError:
            self._fallback.add_incident(incident)

    def incidents(self, task: str) -> list[Incident]:
        try:
            found = self._outage.run(self._primary.incidents, _no_incidents, task)
        except StateUnavailableError:
            found = []
        seen = {(i.kind, i.at, i.tool) for i in found}
        return found + [i for i in self._fallback.incidents(task)
                        if (i.kind, i.at, i.tool) not in seen]


def _no_incidents(task: str) -> list[Incident]:
    """During an outage the primary's incidents are unknown; the fallback's are added."""
    return []


class DegradingStore:
    """Wraps the configured store so an outage never crashes the agent loop.

    Composes :class:`DegradingCounters`, :class:`DegradingKeyLocks` and
    :class:`DegradingRecords` over one shared outage state, and exposes their methods under
    the :class:`Store` names.  ``policy="open"``: on a store error, fall back to a local
    :class:`MemoryStore` (counting goes on, per process) and try the primary again after
    ``retry_after`` seconds; what the outage recorded locally (ledger, held keys, incidents)
    is written back first.  ``policy="closed"``: raise :class:`StateUnavailableError`, which
    the guard turns into a ``state_unavailable`` message.  ``on_degrade`` is told once per
    outage.
    """

    def __init__(
        self,
        primary: Store,
        *,
        policy: str = "open",
        retry_after: float = 5.0,
        on_degrade: Callable[[BaseException], None] | None = None,
    ) -> None:
        if policy not in ("open", "closed"):
            from toolfault._errors import ConfigurationError

            raise ConfigurationError("state_failure must be 'open' or 'closed'")
        self.primary = primary
        self.fallback = MemoryStore()
        self._outage = _Outage(primary, self.fallback, policy=policy, retry_after=retry_after,
                               on_degrade=on_degrade)
        self.counters = DegradingCounters(self._outage)
        self.key_locks = DegradingKeyLocks(self._outage)
        self.records = DegradingRecords(self._outage)
        counters, locks, records = self.counters, self.key_locks, self.records
        # The Store surface, bound once (no per-call dispatch).
        self.admit = counters.admit
        self.settle = counters.settle
        if type(primary) is MemoryStore:  # in-process: it has no outage to survive
            self.admit, self.settle = primary.admit, primary.settle
        self.record_failure = counters.record_failure
        self.clear_failures = counters.clear_failures
        self.refund = counters.refund
        self.acquire = locks.acquire
        self.release = locks.release
        self.extend = locks.extend
        self.put_ledger = records.put_ledger
        self.ledger = records.ledger
        self.ledger_entry = records.ledger_entry
        self.ledger_call = records.ledger_call
        self.swap_ledger = records.swap_ledger
        self.add_incident = records.add_incident
        self.incidents = records.incidents
        self.mark_poller = records.mark_poller
        self.is_poller = records.is_poller

    @property
    def policy(self) -> str:
        """``"open"`` (count locally during an outage) or ``"closed"`` (refuse)."""
        return self._outage.policy

    @property
    def degraded(self) -> bool:
        """True while calls are being counted locally because the primary is unreachable."""
        return self._outage.down_since is not None

    @property
    def _down_since(self) -> float | None:
        return self._outage.down_since

    @property
    def _retry_after(self) -> float:
        return self._outage.retry_after

    @_retry_after.setter
    def _retry_after(self, seconds: float) -> None:
        self._outage.retry_after = seconds

    def close(self) -> None:
        self.key_locks.keeper.close()
        self.primary.close()


def _quietly(op: Callable[_P, object], *args: _P.args, **kwargs: _P.kwargs) -> None:
    try:
        op(*args, **kwargs)
    except Exception:  # noqa: BLE001 - best effort; the next recovery or a TTL catches up
        pass
