"""Idempotency keys kept alive while their side effect runs (see :class:`KeyKeeper`)."""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable

from toolfault._forking import renew_locks_after_fork

log = logging.getLogger("toolfault")


class KeyKeeper:
    """Extends the idempotency keys this process holds while their holders run.

    A side effect can run past its key's TTL (an attempt that timed out but still runs, or
    retries plus checks); if the key expired, another worker could claim it and run the
    same action while the first still might land.  The keeper renews each held key every
    third of its TTL, at least every ``RENEW_EVERY`` seconds (a lock watchdog, as
    Redisson's), from one daemon thread that exists only while keys are held.  So a key
    expires when the process holding it is gone, or ``max_hold`` seconds after it was
    claimed (an attempt hung for an hour no longer blocks its action for the life of the
    process); a key found lost at renewal is logged.

    Renewals run on up to ``RENEWERS`` worker threads, so one slow renewal (a store that
    takes seconds to answer for one key) does not hold back the others' renewals; a key
    whose renewal is still running is not renewed again meanwhile.
    """

    #: Seconds after its claim a key stops being renewed (its TTL then runs out).
    MAX_HOLD = 3600.0
    #: Renewals running at once.
    RENEWERS = 4
    #: Seconds between renewals at most: a store that restarted without its data has its
    #: held keys claimed again by their holders within this (well inside the store's
    #: ``reconcile_seconds``, during which no other worker may claim them).
    RENEW_EVERY = 1.0

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
        """Keep ``holder``'s key until :meth:`drop` (renewed every ``ttl / 3`` seconds, at
        least every ``RENEW_EVERY``)."""
        now = time.monotonic()
        with self._changed:
            kept = self._keys.get((task, token, holder))
            until = kept[2] if kept is not None else now + self.max_hold
            self._keys[(task, token, holder)] = [ttl, now + min(ttl / 3, self.RENEW_EVERY), until]
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

    def snapshot(self) -> list[tuple[str, str, str, float]]:
        """The keys kept now, as (task, token, holder, ttl)."""
        with self._changed:
            return [(task, token, holder, kept[0])
                    for (task, token, holder), kept in self._keys.items()]

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
                kept[1] = now + min(kept[0] / 3, self.RENEW_EVERY)
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

