"""Settles that wait to ride along with the next write, so a success costs one round trip.

A shared store's :meth:`settle` only drops a reservation.  Sending it on its own would make
every successful call two round trips (Redis) or two write transactions (SQLite); instead it
is queued here, the store's next admission carries what is queued (in the same script or
transaction, before it evaluates anything), and a background thread flushes what is left
``delay`` seconds after the first queued settle, and at ``close``.

Deferring only ever over-counts: until a settle lands, an identical call elsewhere sees one
more call in flight (at worst a short ``busy``), never one fewer.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Hashable
from typing import Generic, Protocol, TypeVar

from toolfault._forking import renew_locks_after_fork

_T = TypeVar("_T")


class _Flushable(Protocol):
    def flush(self) -> None: ...


class DeferredSettles(Generic[_T]):
    """Queued settles by group (Redis: the task, so a script only touches one slot)."""

    def __init__(self, owner: _Flushable, delay: float) -> None:
        self._owner = weakref.ref(owner)
        self.delay = delay
        self._queued: dict[Hashable, list[_T]] = {}
        self._lock = threading.Lock()
        renew_locks_after_fork(self)  # the flushing thread may hold the lock at a fork
        self._wake = threading.Event()
        self._closing = threading.Event()
        self._thread: threading.Thread | None = None
        self._pid = 0

    def add(self, group: Hashable, items: list[_T] | tuple[_T, ...]) -> None:
        """Queue settles; the flusher sends them if no admission carries them first."""
        with self._lock:
            queued = self._queued.get(group)
            if queued is None:
                self._queued[group] = list(items)
            else:
                queued.extend(items)
        if not self._wake.is_set():
            self._wake.set()
            if self._thread is None or self._pid != os.getpid():
                self._start()

    def _after_fork(self) -> None:
        """In a forked child: a fresh lock (the parent's flushing thread may have held it)."""
        self._lock = threading.Lock()

    def take(self, group: Hashable) -> list[_T]:
        """What is queued for one group (the caller sends it, or gives it back with add)."""
        with self._lock:
            return self._queued.pop(group, [])

    def take_all(self) -> list[_T]:
        """Everything queued (the flusher's wake-up is cleared: nothing is left to send)."""
        with self._lock:
            queued, self._queued = self._queued, {}
            self._wake.clear()
        return [item for items in queued.values() for item in items]

    def close(self) -> None:
        """Stop the flusher (the owner flushes what is left itself)."""
        self._closing.set()
        self._wake.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread() and \
                self._pid == os.getpid():
            thread.join(1.0)

    def _start(self) -> None:
        with self._lock:
            if self._thread is not None and self._pid == os.getpid():
                return
            self._pid = os.getpid()  # a forked child starts its own flusher
            self._thread = threading.Thread(
                target=_flush_loop, args=(self._owner, self._wake, self._closing, self.delay),
                name="toolfault-settle-flush", daemon=True)
            self._thread.start()


def _flush_loop(owner: weakref.ref[_Flushable], wake: threading.Event,
                closing: threading.Event, delay: float) -> None:
    """Flush ``delay`` seconds after the first queued settle; ends with the store."""
    while not closing.is_set():
        if not wake.wait(10.0):
            if owner() is None:  # the store was dropped without close(): end quietly
                return
            continue
        if closing.wait(delay):  # close() flushes what is left, on its own thread
            return
        store = owner()
        if store is None:
            return
        store.flush()
        del store
