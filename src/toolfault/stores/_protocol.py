"""The state protocol: what a store implements, in parts.

A store (or a test double) implements what it backs and a wrapper can be typed per part:

- :class:`Counters`: the hot path.  :meth:`Counters.admit` evaluates one
  :class:`~toolfault.stores.AdmissionRequest` atomically (the order is documented in
  ``toolfault/_admission.py``); failures, reservations and spend live here.
- :class:`KeyLocks`: idempotency keys held while a side effect is in flight.
- :class:`Records`: the effect ledger and incidents.
- :class:`Pollers` (optional): calls seen to change their result, shared by a fleet.

:class:`Store` is the first three plus ``close``.  One process uses
:class:`~toolfault.stores.MemoryStore`; an embedded durable file ``SQLiteStore``; a fleet
of workers ``RedisStore``.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from toolfault._admission import (
    Admission,
    AdmissionRequest,
    CallKey,
    Ceiling,
    Counter,
)
from toolfault._records import Incident, LedgerEntry

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


