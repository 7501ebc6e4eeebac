"""Where counters, budgets, in-flight keys and the effect ledger live.

One small :class:`Store` protocol, so a single process (``MemoryStore``), an embedded durable
file (``SQLiteStore``) and a fleet of workers (``RedisStore``) behave the same.  The hot path
is :meth:`Store.admit`: one atomic step that reads the fingerprint's failure record, counts
the call against the turn and charges the task's spend.
"""

from __future__ import annotations

import inspect
import threading
import time
from collections import OrderedDict, defaultdict
from collections.abc import Callable
from typing import Any, NamedTuple, Protocol, runtime_checkable

from toolfault._admission import Admission as Admission  # noqa: E402
from toolfault._admission import CallKey as CallKey  # noqa: E402
from toolfault._errors import StateUnavailableError
from toolfault._records import Incident, LedgerEntry


class _OldAdmission(NamedTuple):
    """What :meth:`Store.admit` found and did, atomically (a tuple: cheap on the hot path).

    ``blocked``: the fingerprint already failed ``failures`` times, reaching its limit; the
    call was counted against the turn but not charged.  ``over``: a ceiling would be crossed
    (``"calls_per_turn"`` or ``"spend_per_task"``); nothing was charged then either.
    ``busy``: the fingerprint already failed, and its failures plus the identical calls still
    running reach the limit; counted in the turn, not charged, not dispatched.  A call
    admitted with a ``lease`` holds one reservation until :meth:`Store.settle`.
    """

    failures: int
    last_code: str | None
    blocked: bool
    calls_in_turn: int
    spend: float
    over: str | None = None
    busy: bool = False

    @property
    def admitted(self) -> bool:
        return not self.blocked and not self.busy and self.over is None


@runtime_checkable
class Store(Protocol):
    """The state protocol every store implements (all methods thread-safe)."""

    def admit(
        self, key: CallKey, *, cost: float, max_calls: int | None, max_spend: float | None,
        lease: float | None = None, limit: int | None = None,
    ) -> Admission:
        """Read the failure record, count the call in the turn, charge the spend: atomically.

        With ``lease``, an admitted call reserves its attempt for at most ``lease`` seconds
        (until :meth:`settle`), so concurrent identical calls cannot overrun the retry limit:
        failures plus reservations must stay under the recorded limit, or under ``limit``
        before the fingerprint ever failed.
        """
        ...

    def record_failure(self, key: CallKey, code: str, limit: int) -> int:
        """Add one consecutive failure for the fingerprint; returns the new count."""
        ...

    def clear_failures(self, key: CallKey) -> None:
        """A success (or a verified effect) resets the fingerprint's count."""
        ...

    def settle(self, key: CallKey) -> None:
        """Drop one reservation taken by :meth:`admit`; the guard calls it as each call ends."""
        ...

    def refund(self, task: str, cost: float) -> None:
        """Give back spend charged for a call that was never dispatched."""
        ...

    def acquire(self, task: str, token: str, ttl: float) -> bool:
        """Claim an idempotency key for an in-flight call; False when someone holds it."""
        ...

    def release(self, task: str, token: str) -> None:
        """Release an idempotency key claimed by :meth:`acquire`."""
        ...

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

    def close(self) -> None:
        """Release connections and files."""
        ...


class MemoryStore:
    """The default store: one process, thread-safe, asyncio-safe (no awaits inside a step).

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
        # Last use of each task and of each (task, turn), least recently used first.
        self._tasks: OrderedDict[str, float] = OrderedDict()
        self._turns: OrderedDict[tuple[str, int], float] = OrderedDict()
        self._turn_keys: dict[tuple[str, int], set[CallKey]] = {}
        self._turns_of: dict[str, set[int]] = {}
        self._failures: dict[CallKey, tuple[int, str, int]] = {}
        self._pending: dict[CallKey, list[float]] = {}
        self._dirty: dict[tuple[str, int], int] = defaultdict(int)
        self._calls: dict[tuple[str, int], int] = defaultdict(int)
        self._spend: dict[str, float] = defaultdict(float)
        self._held: dict[tuple[str, str], float] = {}
        self._ledger: dict[str, dict[str, LedgerEntry]] = defaultdict(dict)
        self._by_key: dict[tuple[str, str], str] = {}
        self._incidents: dict[str, list[Incident]] = defaultdict(list)
        # Calls between admission and release (plus the one unreserved fast call): the
        # guard's fast path runs unreserved only while no other call is under way.
        self._live = 0
        self._fast: tuple[str, int, str, dict[str, Any], CallKey | None] | None = None

    def admit(
        self, key: CallKey, *, cost: float, max_calls: int | None, max_spend: float | None,
        lease: float | None = None, limit: int | None = None,
    ) -> Admission:
        with self._lock:
            self._touch(key.task, key.turn)
            record = self._failures.get(key)
            turn = (key.task, key.turn)
            calls = self._calls[turn] + 1
            spend = self._spend[key.task]
            if max_calls is not None and calls > max_calls:
                return Admission(record[0] if record else 0, record[1] if record else None,
                                 False, calls - 1, spend, "calls_per_turn")
            self._calls[turn] = calls
            if record is not None and record[0] >= record[2]:
                return Admission(record[0], record[1], True, calls, spend)
            live: list[float] = []
            if lease is not None:
                now = time.monotonic()
                live = [t for t in self._pending.get(key, ()) if t > now]
                cap = record[2] if record is not None else limit
                if cap is not None and (record[0] if record else 0) + len(live) >= cap:
                    return Admission(record[0] if record else 0, record[1] if record else None,
                                     False, calls, spend, busy=True)
                live.append(now + lease)
            if max_spend is not None and spend + cost > max_spend + 1e-12:
                return Admission(record[0] if record else 0, record[1] if record else None,
                                 False, calls, spend, "spend_per_task")
            spend += cost
            self._spend[key.task] = spend
            if lease is not None:
                self._pending[key] = live
                self._turn_keys.setdefault(turn, set()).add(key)
            return Admission(record[0] if record else 0, record[1] if record else None, False,
                             calls, spend)

    def record_failure(self, key: CallKey, code: str, limit: int) -> int:
        with self._lock:
            self._touch(key.task, key.turn)
            previous = self._failures.get(key)
            if previous is None:
                self._dirty[(key.task, key.turn)] += 1
                self._turn_keys.setdefault((key.task, key.turn), set()).add(key)
            count = (previous[0] if previous else 0) + 1
            self._failures[key] = (count, code, limit)
            return count

    def clear_failures(self, key: CallKey) -> None:
        with self._lock:
            if self._failures.pop(key, None) is not None:
                self._dirty[(key.task, key.turn)] -= 1

    def settle(self, key: CallKey) -> None:
        with self._lock:
            live = self._pending.get(key)
            if live:
                live.remove(min(live))
            if not live:
                self._pending.pop(key, None)

    def has_failures(self, task: str, turn: int) -> bool:
        """Whether any fingerprint failed in this turn (lets the guard skip work when not)."""
        return self._dirty.get((task, turn), 0) > 0

    def refund(self, task: str, cost: float) -> None:
        if cost:
            with self._lock:
                self._spend[task] = max(0.0, self._spend[task] - cost)

    def acquire(self, task: str, token: str, ttl: float) -> bool:
        now = time.monotonic()
        with self._lock:
            expiry = self._held.get((task, token))
            if expiry is not None and expiry > now:
                return False
            self._held[(task, token)] = now + ttl
            return True

    def release(self, task: str, token: str) -> None:
        with self._lock:
            self._held.pop((task, token), None)

    def put_ledger(self, entry: LedgerEntry) -> None:
        with self._lock:
            self._touch(entry.task, None)
            entries = self._ledger[entry.task]
            if entry.call_id not in entries and entry.idempotency_key is not None:
                self._by_key[(entry.task, entry.idempotency_key)] = entry.call_id
            entries[entry.call_id] = entry

    def ledger(self, task: str) -> list[LedgerEntry]:
        with self._lock:
            return sorted(self._ledger.get(task, {}).values(), key=lambda e: e.at)

    def ledger_entry(self, task: str, idempotency_key: str) -> LedgerEntry | None:
        with self._lock:
            call_id = self._by_key.get((task, idempotency_key))
            return None if call_id is None else self._ledger[task].get(call_id)

    def ledger_call(self, task: str, call_id: str) -> LedgerEntry | None:
        with self._lock:
            return self._ledger.get(task, {}).get(call_id)

    def swap_ledger(self, entry: LedgerEntry, expected: LedgerEntry) -> bool:
        with self._lock:
            entries = self._ledger[entry.task]
            if entries.get(entry.call_id) != expected:
                return False
            entries[entry.call_id] = entry
            return True

    def has_entry(self, task: str, call_id: str) -> bool:
        """Whether this store holds the entry (a fallback: written during an outage)."""
        with self._lock:
            return call_id in self._ledger.get(task, {})

    def drain(self) -> tuple[list[LedgerEntry], list[tuple[str, str, float]]]:
        """Take out every ledger entry and every live idempotency key (task, token, seconds
        left): what an outage left here, to be written into the shared store on recovery."""
        now = time.monotonic()
        with self._lock:
            entries = [e for task in self._ledger.values() for e in task.values()]
            held = [(task, token, expiry - now) for (task, token), expiry in self._held.items()
                    if expiry > now]
            self._ledger.clear()
            self._by_key.clear()
            self._held.clear()
        return entries, held

    # -- the guard's fast path: one unreserved call while nothing else is in flight -----
    def fast_enter(self, task: str, turn: int, tool: str, args: dict[str, Any]) -> bool:
        """Let one call run unreserved, only while no other call is in flight."""
        with self._lock:
            if self._live:
                return False
            self._live = 1
            self._fast = (task, turn, tool, args, None)
            return True

    def fast_exit(self) -> None:
        """The unreserved call ended (settling the reservation a racing call gave it)."""
        with self._lock:
            fast, self._fast = self._fast, None
            self._live -= 1
        if fast is not None and fast[4] is not None:
            self.settle(fast[4])

    def fast_call(self, task: str, turn: int) -> tuple[str, dict[str, Any]] | None:
        """The unreserved call in flight in this turn, if any: (tool, arguments)."""
        fast = self._fast
        if fast is None or fast[0] != task or fast[1] != turn or fast[4] is not None:
            return None
        return fast[2], fast[3]

    def reserve_fast(self, key: CallKey, lease: float, args: dict[str, Any]) -> None:
        """Count the unreserved call (identical to the caller's) as in flight under ``key``."""
        with self._lock:
            fast = self._fast
            if fast is None or fast[3] is not args or fast[4] is not None:
                return
            self._fast = (*fast[:4], key)
            self._pending.setdefault(key, []).append(time.monotonic() + lease)

    def enter(self) -> None:
        """A call on the general path is under way (the fast path waits its turn)."""
        with self._lock:
            self._live += 1

    def leave(self) -> None:
        """That call ended."""
        with self._lock:
            self._live -= 1

    def add_incident(self, incident: Incident) -> None:
        with self._lock:
            self._touch(incident.task, None)
            self._incidents[incident.task].append(incident)

    def incidents(self, task: str) -> list[Incident]:
        with self._lock:
            return list(self._incidents.get(task, ()))

    def close(self) -> None:
        """Nothing to release."""

    # -- bounded memory (call with the lock held) ----------------------------------------
    def _touch(self, task: str, turn: int | None) -> None:
        """Mark the task (and turn) used; evict what outlived its use or the bounds."""
        now = time.monotonic()
        tasks, turns = self._tasks, self._turns
        new_task = task not in tasks
        tasks[task] = now
        tasks.move_to_end(task)
        new_turn = False
        if turn is not None:
            scope = (task, turn)
            new_turn = scope not in turns
            turns[scope] = now
            turns.move_to_end(scope)
            if new_turn:
                self._turns_of.setdefault(task, set()).add(turn)
        ttl = self.ttl_seconds
        if new_task or ttl is not None:
            while tasks:
                oldest, used = next(iter(tasks.items()))
                if oldest == task or not ((ttl is not None and now - used > ttl) or (
                        self.max_tasks is not None and len(tasks) > self.max_tasks)):
                    break
                self._forget_task(oldest, now)
        if new_turn or ttl is not None:
            while turns:
                (old_task, old_turn), used = next(iter(turns.items()))
                if (old_task, old_turn) == (task, turn) or not (
                        (ttl is not None and now - used > ttl)
                        or (self.max_turns is not None and len(turns) > self.max_turns)):
                    break
                self._forget_turn(old_task, old_turn)

    def _forget_turn(self, task: str, turn: int) -> None:
        scope = (task, turn)
        self._turns.pop(scope, None)
        for key in self._turn_keys.pop(scope, ()):
            self._failures.pop(key, None)
            self._pending.pop(key, None)
        self._dirty.pop(scope, None)
        self._calls.pop(scope, None)
        turns = self._turns_of.get(task)
        if turns is not None:
            turns.discard(turn)
            if not turns:
                del self._turns_of[task]

    def _forget_task(self, task: str, now: float) -> None:
        """Everything one task left behind, except idempotency keys still held."""
        del self._tasks[task]
        for turn in list(self._turns_of.get(task, ())):
            self._forget_turn(task, turn)
        self._spend.pop(task, None)
        for entry in self._ledger.pop(task, {}).values():
            if entry.idempotency_key is not None:
                self._by_key.pop((task, entry.idempotency_key), None)
        self._incidents.pop(task, None)
        for held in [h for h, expiry in self._held.items() if h[0] == task and expiry <= now]:
            del self._held[held]


class DegradingStore:
    """Wraps the configured store so an outage never crashes the agent loop.

    ``policy="open"``: on a store error, fall back to a local :class:`MemoryStore` (counting
    goes on, per process) and try the primary again after ``retry_after`` seconds.
    ``policy="closed"``: raise :class:`StateUnavailableError`, which the guard turns into a
    ``state_unavailable`` message.  ``on_degrade`` is told once per outage.
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
        self.policy = policy
        self.fallback = MemoryStore()
        self._retry_after = retry_after
        self._down_since: float | None = None
        self._on_degrade = on_degrade
        self._lock = threading.Lock()
        self._recovering = threading.Lock()
        # A store written to the earlier protocol: no in-flight limit, no keyed ledger reads.
        self._admit_limit = _accepts(primary.admit, "limit")
        self._keyed = all(callable(getattr(primary, name, None))
                          for name in ("ledger_entry", "ledger_call", "swap_ledger"))

    @property
    def degraded(self) -> bool:
        """True while calls are being counted locally because the primary is unreachable."""
        return self._down_since is not None

    def _target(self) -> Store:
        down = self._down_since
        if down is None:
            return self.primary
        if time.monotonic() - down >= self._retry_after and self._recover():
            return self.primary
        if self.policy == "closed":
            raise StateUnavailableError("the state store is unavailable")
        return self.fallback

    def _recover(self) -> bool:
        """Back from an outage: first write what was kept locally into the primary.

        Ledger entries and live idempotency keys recorded in the fallback during the outage
        go to the shared store before it serves anything else, so a pending effect recorded
        only here is seen by every worker before any of them dispatches that key again.
        False (still down, nothing lost) when the primary fails meanwhile.
        """
        with self._recovering:
            if self._down_since is None:
                return True
            entries, held = self.fallback.drain()
            try:
                for task, token, left in held:
                    self.primary.acquire(task, token, max(left, 0.001))
                for entry in sorted(entries, key=lambda e: e.at):
                    self.primary.put_ledger(entry)
            except Exception:
                for entry in entries:
                    self.fallback.put_ledger(entry)
                for task, token, left in held:
                    self.fallback.acquire(task, token, left)
                with self._lock:
                    self._down_since = time.monotonic()
                return False
            with self._lock:
                self._down_since = None
            # Entries a racing thread wrote locally while this ran: moved over as well.
            late, late_held = self.fallback.drain()
            for task, token, left in late_held:
                _quietly(self.primary.acquire, task, token, max(left, 0.001))
            for entry in late:
                _quietly(self.primary.put_ledger, entry)
            return True

    def _degrade(self, exc: BaseException) -> None:
        """Mark the primary down (told once per outage); raise when failing closed."""
        with self._lock:
            first = self._down_since is None
            self._down_since = time.monotonic()
        if first and self._on_degrade is not None:
            self._on_degrade(exc)
        if self.policy == "closed":
            raise StateUnavailableError("the state store is unavailable") from exc

    def _run(self, op: str, *args: Any, **kwargs: Any) -> Any:
        target = self._target()
        try:
            result = getattr(target, op)(*args, **kwargs)
        except Exception as exc:
            if target is not self.primary:
                raise
            self._degrade(exc)
            return getattr(self.fallback, op)(*args, **kwargs)
        return result

    @property
    def knows_clean_turns(self) -> bool:
        """The primary can say cheaply whether a turn has failures (local stores can)."""
        return callable(getattr(self.primary, "has_failures", None))

    def has_failures(self, task: str, turn: int) -> bool:
        """Conservative: True unless the current target store can say there are none."""
        target = self.fallback if self._down_since is not None else self.primary
        check = getattr(target, "has_failures", None)
        return True if check is None else bool(check(task, turn))

    def admit(self, request: Any) -> Any:  # TEMPORARY shim until the stores branch lands
        from toolfault._admission import Counter
        calls = request.limit(Counter.CALLS_IN_TURN)
        spend = request.limit(Counter.SPEND_IN_TASK)
        running = request.limit(Counter.IDENTICAL_RUNNING)
        return self._admit_old(request.key, cost=request.cost,
                               max_calls=None if calls is None else int(calls),
                               max_spend=spend, lease=request.lease,
                               limit=None if running is None else int(running))

    def _admit_old(
        self, key: CallKey, *, cost: float, max_calls: int | None, max_spend: float | None,
        lease: float | None = None, limit: int | None = None,
    ) -> Admission:
        if not self._admit_limit:
            return self._admit_without_limit(key, cost=cost, max_calls=max_calls,
                                             max_spend=max_spend, lease=lease)
        if self._down_since is None:  # the hot path: one direct call
            try:
                return self.primary.admit(key, cost=cost, max_calls=max_calls,
                                          max_spend=max_spend, lease=lease, limit=limit)
            except Exception as exc:
                self._degrade(exc)
                return self.fallback.admit(key, cost=cost, max_calls=max_calls,
                                           max_spend=max_spend, lease=lease, limit=limit)
        result: Admission = self._run("admit", key, cost=cost, max_calls=max_calls,
                                      max_spend=max_spend, lease=lease, limit=limit)
        return result

    def _admit_without_limit(self, key: CallKey, **kwargs: Any) -> Admission:
        target = self._target()
        try:
            result: Admission = target.admit(key, **kwargs)
        except Exception as exc:
            if target is not self.primary:
                raise
            self._degrade(exc)
            return self.fallback.admit(key, **kwargs)
        return result

    def record_failure(self, key: CallKey, code: str, limit: int) -> int:
        count: int = self._run("record_failure", key, code, limit)
        return count

    def clear_failures(self, key: CallKey) -> None:
        self._run("clear_failures", key)

    def settle(self, request: Any) -> None:  # TEMPORARY shim
        self._run("settle", request.key)

    def refund(self, task: str, cost: float) -> None:
        self._run("refund", task, cost)

    def acquire(self, task: str, token: str, ttl: float) -> bool:
        held: bool = self._run("acquire", task, token, ttl)
        return held

    def release(self, task: str, token: str) -> None:
        self._run("release", task, token)

    def put_ledger(self, entry: LedgerEntry) -> None:
        self._run("put_ledger", entry)

    def ledger(self, task: str) -> list[LedgerEntry]:
        entries: list[LedgerEntry] = self._run("ledger", task)
        return entries

    def ledger_entry(self, task: str, idempotency_key: str) -> LedgerEntry | None:
        local = self.fallback.ledger_entry(task, idempotency_key)
        if local is not None:  # recorded during an outage, not yet moved over
            return local
        if not self._keyed:
            found = [e for e in self.ledger(task) if e.idempotency_key == idempotency_key]
            return found[-1] if found else None
        entry: LedgerEntry | None = self._run("ledger_entry", task, idempotency_key)
        return entry

    def ledger_call(self, task: str, call_id: str) -> LedgerEntry | None:
        local = self.fallback.ledger_call(task, call_id)
        if local is not None:
            return local
        if not self._keyed:
            return next((e for e in self.ledger(task) if e.call_id == call_id), None)
        entry: LedgerEntry | None = self._run("ledger_call", task, call_id)
        return entry

    def swap_ledger(self, entry: LedgerEntry, expected: LedgerEntry) -> bool:
        if self.fallback.has_entry(entry.task, entry.call_id):
            return self.fallback.swap_ledger(entry, expected)
        if not self._keyed:  # best effort: read, compare, write
            if self.ledger_call(entry.task, entry.call_id) != expected:
                return False
            self.put_ledger(entry)
            return True
        swapped: bool = self._run("swap_ledger", entry, expected)
        return swapped

    def add_incident(self, incident: Incident) -> None:
        try:
            self._run("add_incident", incident)
        except StateUnavailableError:
            self.fallback.add_incident(incident)

    def incidents(self, task: str) -> list[Incident]:
        try:
            found: list[Incident] = self._run("incidents", task)
        except StateUnavailableError:
            found = []
        local = self.fallback.incidents(task) if found is not None else []
        seen = {(i.kind, i.at, i.tool) for i in found}
        return found + [i for i in local if (i.kind, i.at, i.tool) not in seen]

    def close(self) -> None:
        self.primary.close()


def _accepts(fn: Callable[..., Any], name: str) -> bool:
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return True
    return name in params or any(p.kind is p.VAR_KEYWORD for p in params.values())


def _quietly(op: Callable[..., Any], *args: Any) -> None:
    try:
        op(*args)
    except Exception:  # noqa: BLE001 - best effort; the next recovery or a TTL catches up
        pass
