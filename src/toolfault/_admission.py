"""Admission as data: what one call asks of the counters, and what it was granted.

The guard builds one frozen :class:`AdmissionRequest` per call: the scope (task, turn), the
call's fingerprint, its cost, how long it may hold a reservation and a tuple of
:class:`Ceiling` values.  Each store evaluates that request once, atomically, the same way;
a new ceiling is a new :class:`Counter` member and one clause per store, not a new parameter
threaded through every layer.

Evaluation order (every store follows it; ``tests/stores/test_store_contract.py`` checks it):

1. ``CALLS_IN_TURN``: the call is counted in its turn, unless that crosses the ceiling
   (``over="calls_per_turn"``; nothing counted, nothing charged).  A call refused later
   (blocked, busy, over spend) stays counted: the model did make it.
2. The fingerprint's failure record: at or past its own limit the call is ``blocked``.
3. ``IDENTICAL_RUNNING`` (only with a ``lease``): failures plus identical calls still holding
   a reservation must stay under the record's limit, or under this ceiling's limit before the
   fingerprint ever failed; else ``busy``.
4. ``SPEND_IN_TASK``: the task's spend plus ``cost`` must not pass the ceiling
   (``over="spend_per_task"``).
5. Admitted: the spend is charged and, with a ``lease``, one reservation is held until
   :meth:`Store.settle` is given the same request (or the lease runs out).
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple


@dataclass(frozen=True, slots=True)
class CallKey:
    """Scope of a counter: one fingerprint in one turn of one task."""

    task: str
    turn: int
    fingerprint: str


class Counter(enum.Enum):
    """What a :class:`Ceiling` bounds."""

    #: Tool calls the model made in this turn (charged when made, even if then refused).
    CALLS_IN_TURN = "calls_per_turn"
    #: Spend charged to the task (``AdmissionRequest.cost`` per admitted call).
    SPEND_IN_TASK = "spend_per_task"
    #: Identical calls in flight plus the fingerprint's recorded failures.
    IDENTICAL_RUNNING = "identical_running"


@dataclass(frozen=True, slots=True)
class Ceiling:
    """One bound a call must stay within: ``limit`` on ``counter``."""

    counter: Counter
    limit: float


class LazyFingerprint:
    """A call's fingerprint, computed at most once and only when someone needs it.

    A local store admits a call in a quiet scope (no failure, nothing else in flight) without
    it; shared stores and every failure resolve it.  ``compute`` must be pure.
    """

    __slots__ = ("_compute", "_value")

    def __init__(self, compute: Callable[[], str] | str) -> None:
        if isinstance(compute, str):
            self._value: str | None = compute
            self._compute: Callable[[], str] | None = None
        else:
            self._value = None
            self._compute = compute

    @property
    def resolved(self) -> bool:
        return self._value is not None

    def __call__(self) -> str:
        value = self._value
        if value is None:
            assert self._compute is not None
            value = self._value = self._compute()
            self._compute = None
        return value


class AdmissionRequest(NamedTuple):
    """Everything one call asks of the counters, evaluated by the store in one step.

    Immutable, and compared by identity: the request a call was admitted with is the handle
    that settles its reservation.
    """

    task: str
    turn: int
    fingerprint: LazyFingerprint
    cost: float = 0.0
    #: Seconds the reservation may be held (``None``: no reservation is taken).
    lease: float | None = None
    ceilings: tuple[Ceiling, ...] = ()

    def __hash__(self) -> int:
        return id(self)

    def __eq__(self, other: object) -> bool:
        return self is other

    def __ne__(self, other: object) -> bool:
        return self is not other

    @property
    def key(self) -> CallKey:
        """The counter scope (resolves the fingerprint)."""
        return CallKey(self.task, self.turn, self.fingerprint())

    def limit(self, counter: Counter) -> float | None:
        """The ceiling on ``counter`` in this request, if any."""
        for ceiling in self.ceilings:
            if ceiling.counter is counter:
                return ceiling.limit
        return None


class Admission(NamedTuple):
    """What :meth:`Store.admit` found and did, atomically.

    ``blocked``: the fingerprint already failed ``failures`` times, reaching its limit; the
    call was counted against the turn but not charged.  ``over``: a ceiling would be crossed
    (``"calls_per_turn"`` or ``"spend_per_task"``); nothing was charged then either.
    ``busy``: failures plus the identical calls still running reach the limit; counted in
    the turn, not charged, not dispatched.
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
