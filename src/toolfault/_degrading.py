"""A store outage never crashes the agent loop: the degrading wrappers.

:class:`DegradingStore` wraps whichever store is configured: on an error it falls back to a
local :class:`~toolfault.stores.MemoryStore` (``policy="open"``) or refuses with
``state_unavailable`` (``policy="closed"``), and writes back what the outage recorded
locally when the store answers again.  Composed of :class:`DegradingCounters`,
:class:`DegradingKeyLocks` and :class:`DegradingRecords` over one shared outage state.
"""

from __future__ import annotations

import inspect
import logging
import threading
import time
import warnings
from collections import OrderedDict
from collections.abc import Callable, Iterable
from typing import ParamSpec, TypeVar

from toolfault._admission import (
    Admission,
    AdmissionRequest,
    CallKey,
)
from toolfault._errors import StateUnavailableError
from toolfault._forking import renew_locks_after_fork
from toolfault._keykeeper import KeyKeeper
from toolfault._records import Incident, IncidentKind, LedgerEntry
from toolfault.stores._memory import MemoryStore
from toolfault.stores._protocol import Counters, KeyLocks, Records, Store

log = logging.getLogger("toolfault")

_P = ParamSpec("_P")
_R = TypeVar("_R")


#: Seconds a refused side effect is told to wait before it is tried again during an outage.
RETRY_HINT = 1.0
#: Seconds between two looks at the primary's epoch while this process has journal entries.
WATCH_EVERY = 1.0
#: Ledger entries kept for a restart that loses them (the newest), and for how long.
JOURNAL_MAX = 10_000
JOURNAL_SECONDS = 86_400.0


class _Outage:
    """The outage state the three degrading wrappers share: one primary, one fallback.

    ``policy="open"``: on a store error, read-only counting falls back to the local
    :class:`MemoryStore`, and the primary is probed again every ``retry_after`` seconds (by a
    background prober, and by the next side-effect claim, which waits for its answer).
    A side-effect claim is never made on the fallback unless ``local_side_effects`` names its
    tool (``True``: every tool): it is refused with :class:`StateUnavailableError`.
    ``policy="closed"``: every call raises :class:`StateUnavailableError`.  ``on_degrade`` is
    told once per outage.
    """

    def __init__(self, primary: Store, fallback: MemoryStore, *, policy: str,
                 retry_after: float, on_degrade: Callable[[BaseException], None] | None,
                 local_side_effects: bool | Iterable[str] = False) -> None:
        self.primary = primary
        self.fallback = fallback
        self.policy = policy
        self.retry_after = retry_after
        self.down_since: float | None = None
        self.on_degrade = on_degrade
        #: Tools whose side effects may be claimed locally during an outage (None: all).
        self.local_tools: frozenset[str] | None
        if local_side_effects is True:
            self.local_tools = None
        elif local_side_effects is False:
            self.local_tools = frozenset()
        else:
            self.local_tools = frozenset(local_side_effects)
        #: The primary's epoch as last seen (stores with ``epoch()``); a new one after an
        #: outage means it lost its data, and the keys this process holds are claimed again.
        self.epoch: str | None = None
        #: Told when the primary came back with a new epoch (claims the held keys again).
        self.on_epoch_change: Callable[[], None] | None = None
        self.last_probe = 0.0
        self.closed = False
        #: Keys released during the outage (released on the primary at recovery, by holder).
        self._released: list[tuple[str, str, str]] = []
        #: The ledger entries this process wrote to a primary that can lose its data (it has
        #: an epoch), newest last: written again when the epoch changes (see :meth:`remember`).
        self.journal: OrderedDict[tuple[str, str], LedgerEntry] = OrderedDict()
        self._watcher: threading.Thread | None = None
        self._prober: threading.Thread | None = None
        self._lock = threading.Lock()
        self._recovering = threading.Lock()
        #: The primary takes holders (the current :class:`KeyLocks` protocol).
        self.holders = _takes_holders(primary)
        renew_locks_after_fork(self)

    def _after_fork(self) -> None:
        """In a forked child: the key keeper's thread may have been writing back (holding
        ``_recovering``) at the fork; that thread does not exist here, nor the prober or
        the epoch watcher (started again by the next outage or ledger write)."""
        self._lock = threading.Lock()
        self._recovering = threading.Lock()
        self._prober = self._watcher = None

    def local_ok(self, tool: str) -> bool:
        """Whether ``tool``'s side effects may be claimed locally during an outage."""
        return self.policy == "open" and (self.local_tools is None or tool in self.local_tools)

    def note_release(self, task: str, token: str, holder: str) -> None:
        with self._lock:
            if len(self._released) < 100_000:  # past that, their TTLs free them
                self._released.append((task, token, holder))

    def acquire_primary(self, task: str, token: str, ttl: float, holder: str) -> bool:
        """Claim a key on the primary, with its holder where the primary takes one."""
        if self.holders:
            return self.primary.acquire(task, token, ttl, holder)
        return self.primary.acquire(task, token, ttl)

    def refused(self) -> StateUnavailableError:
        return StateUnavailableError("the state store is unavailable", retry_after=RETRY_HINT)

    def run(self, on_primary: Callable[_P, _R], on_fallback: Callable[_P, _R],
            *args: _P.args, **kwargs: _P.kwargs) -> _R:
        """``on_primary`` while it answers; ``on_fallback`` (or a raise) during an outage."""
        if self.down_since is not None and not self._back():
            if self.policy == "closed":
                raise self.refused()
            return on_fallback(*args, **kwargs)
        try:
            return on_primary(*args, **kwargs)
        except Exception as exc:
            self.degrade(exc)
            return on_fallback(*args, **kwargs)

    def _back(self) -> bool:
        """Back from the outage?  Probed on this call when no probe ran in the last
        ``retry_after`` seconds and no other thread is probing (then its answer stands)."""
        if self.down_since is None:
            return True
        if self._prober is None:
            self._start_prober()
        if time.monotonic() - self.last_probe < self.retry_after:
            return False
        return self.recover(blocking=False)

    def degrade(self, exc: BaseException) -> None:
        """Mark the primary down (told once per outage); raise when failing closed."""
        with self._lock:
            first = self.down_since is None
            self.down_since = time.monotonic()
        if first:
            self._start_prober()
            if self.on_degrade is not None:
                self.on_degrade(exc)
        if self.policy == "closed":
            raise StateUnavailableError("the state store is unavailable",
                                        retry_after=RETRY_HINT) from exc

    def _start_prober(self) -> None:
        with self._lock:
            if self._prober is not None or self.closed:
                return
            self._prober = threading.Thread(target=self._probe_loop, daemon=True,
                                            name="toolfault-store-probe")
            self._prober.start()

    def _probe_loop(self) -> None:
        """Probe the primary every ``retry_after`` seconds until it is back: what this
        process kept locally is written back even when it makes no further call."""
        try:
            while not self.closed and self.down_since is not None:
                time.sleep(max(self.retry_after, 0.01))
                self.recover(blocking=False)
        finally:
            with self._lock:
                self._prober = None

    def remember(self, entry: LedgerEntry) -> None:
        """Keep an entry written to the primary, so a restart that loses it cannot make its
        action look new: while the journal holds entries, a watcher reads the primary's epoch
        every ``WATCH_EVERY`` seconds (well within the store's ``reconcile_seconds``) and, at
        a new one, writes them all again (and claims the held keys again)."""
        if not callable(getattr(self.primary, "epoch", None)):
            return
        with self._lock:
            key = (entry.task, entry.call_id)
            self.journal.pop(key, None)
            self.journal[key] = entry
            while len(self.journal) > JOURNAL_MAX:
                self.journal.popitem(last=False)
            if self._watcher is not None or self.closed:
                return
            self._watcher = threading.Thread(target=self._watch, daemon=True,
                                             name="toolfault-store-epoch")
            self._watcher.start()

    def _watch(self) -> None:
        try:
            while not self.closed and self.journal:
                time.sleep(WATCH_EVERY)
                if self.down_since is not None:
                    continue  # the prober looks at the epoch when the store is back
                try:
                    epoch = str(self.primary.epoch())  # type: ignore[attr-defined]
                    if self.epoch is not None and epoch != self.epoch:
                        self._epoch_changed()
                    self.epoch = epoch
                except Exception:  # noqa: BLE001 - an outage: the next call degrades
                    continue
                cutoff = time.time() - JOURNAL_SECONDS
                with self._lock:
                    while self.journal and next(iter(self.journal.values())).at < cutoff:
                        self.journal.popitem(last=False)
        finally:
            with self._lock:
                self._watcher = None

    def _epoch_changed(self) -> None:
        """The primary lost its data: claim the held keys again, write the journal again."""
        log.warning("toolfault: the state store came back without its data; claiming the "
                    "keys held here again and writing back this worker's ledger")
        self.fallback.add_incident(Incident(
            IncidentKind.STATE_DEGRADED, "*", "state_unavailable",
            "the state store restarted without its data; held keys and this worker's ledger "
            "were written back", "*", 0))
        if self.on_epoch_change is not None:
            self.on_epoch_change()
        with self._lock:
            entries = sorted(self.journal.values(), key=lambda e: e.at)
        for entry in entries:
            self.primary.put_ledger(entry)

    def learn_epoch(self) -> None:
        """Remember the primary's epoch (once), so a restart that lost it is seen."""
        epoch_of = getattr(self.primary, "epoch", None)
        if callable(epoch_of):
            self.epoch = str(epoch_of())

    def _probe(self) -> None:
        """Ask the primary for its epoch (or anything, for a store without one); when it is
        a new one, the primary lost its data: the keys held here are claimed again."""
        epoch_of = getattr(self.primary, "epoch", None)
        if not callable(epoch_of):
            self.primary.incidents("toolfault-probe")
            return
        epoch = str(epoch_of())
        if self.epoch is not None and epoch != self.epoch:
            self._epoch_changed()
        self.epoch = epoch

    def recover(self, *, blocking: bool = True) -> bool:
        """Back from an outage: probe the primary, then write what was kept locally into it.

        Ledger entries and live idempotency keys recorded in the fallback during the outage
        go to the shared store before it serves anything else, so a pending effect recorded
        only here is seen by every worker before any of them dispatches that key again; the
        incidents (the outage's own ``state_degraded`` first) follow, so the degradation is
        reported where every worker and operator looks, not only in this process.  False
        (still down, nothing lost) when the primary fails meanwhile.  ``blocking=False``:
        False at once while another thread probes.  A caller that waited for another
        thread's probe takes its answer.
        """
        asked = time.monotonic()
        if not self._recovering.acquire(blocking=blocking):
            return self.down_since is None
        try:
            if self.down_since is None:
                return True
            if self.last_probe >= asked:  # probed while we waited: its answer stands
                return False
            return self._probe_and_write_back()
        finally:
            self._recovering.release()

    def _probe_and_write_back(self) -> bool:
        """One recovery attempt (under ``_recovering``): the primary probed, then the
        fallback's records written into it; False, and still down, when either fails."""
        self.last_probe = time.monotonic()
        try:
            self._probe()
        except Exception:
            self._still_down()
            return False
        entries, held, incidents = self.fallback.drain()
        try:
            self._write_back(entries, held, incidents)
        except Exception:
            self._keep_locally(entries, held, incidents)
            self._still_down()
            return False
        self._back_up()
        return True

    def _still_down(self) -> None:
        """A recovery attempt failed: the outage goes on from now (the next probe waits)."""
        with self._lock:
            self.down_since = time.monotonic()

    def _keep_locally(self, entries: list[LedgerEntry],
                      held: list[tuple[str, str, float, str]], incidents: list[Incident]
                      ) -> None:
        """What a failed write-back drained from the fallback, put back there: nothing
        recorded during the outage is lost, and the next recovery writes it back."""
        for entry in entries:
            self.fallback.put_ledger(entry)
        for task, token, left, holder in held:
            self.fallback.acquire(task, token, left, holder)
        for incident in incidents:
            self.fallback.add_incident(incident)

    def _back_up(self) -> None:
        """The primary serves again: keys released during the outage released there too,
        and what a racing thread wrote locally meanwhile moved over as well."""
        with self._lock:
            self.down_since = None
            released, self._released = self._released, []
        if self.holders:  # after the ledger: an entry is there before its key is free
            for task, token, holder in released:
                _quietly(self.primary.release, task, token, holder)
        late = self.fallback.drain()
        _quietly(self._write_back, *late)

    def _write_back(self, entries: list[LedgerEntry],
                    held: list[tuple[str, str, float, str]], incidents: list[Incident]) -> None:
        primary = self.primary
        for task, token, left, holder in held:
            if not self._claim_back(task, token, max(left, 0.001), holder) \
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


    def _claim_back(self, task: str, token: str, ttl: float, holder: str) -> bool:
        """A key held locally, claimed on the primary again: extended when it is still (or,
        after a restart without data, again) its holder's, else claimed."""
        if self.holders and self.primary.extend(task, token, ttl, holder):
            return True
        try:
            return self.acquire_primary(task, token, ttl, holder)
        except StateUnavailableError:  # a young epoch: not claimable yet, reported as lost
            return False


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

    def acquire(self, task: str, token: str, ttl: float, holder: str = "", *,
                local: bool = True) -> bool:
        """Claim a key on the primary.  During an outage (or when the primary fails now) the
        claim is made locally only when ``local`` (the tool opted in): else, and when failing
        closed, :class:`StateUnavailableError`.  A side-effect claim during an outage first
        probes the primary and waits for the answer: back, it is claimed there."""
        outage = self._outage
        if outage.down_since is not None and not outage.recover(blocking=True):
            got = self._acquire_during_outage(task, token, ttl, holder, local=local)
        else:
            got = self._acquire_on_primary(task, token, ttl, holder, local=local)
        if got and holder:
            self.keeper.hold(task, token, holder, ttl)
        return got

    def _acquire_during_outage(self, task: str, token: str, ttl: float, holder: str, *,
                               local: bool) -> bool:
        """Still down after the probe: claimed locally only when the tool opted in and the
        store fails open; else refused."""
        if not local or self._outage.policy == "closed":
            raise self._outage.refused()
        return self._fallback.acquire(task, token, ttl, holder)

    def _acquire_on_primary(self, task: str, token: str, ttl: float, holder: str, *,
                            local: bool) -> bool:
        """Claimed on the primary; when it fails now, the outage begins and the claim is
        made as during one."""
        outage = self._outage
        try:
            if outage.epoch is None:
                outage.learn_epoch()
            return outage.acquire_primary(task, token, ttl, holder)
        except StateUnavailableError:
            raise  # the primary answered: it cannot vouch for a claim yet (young epoch)
        except Exception as exc:
            outage.degrade(exc)  # raises when failing closed
            if not local:
                raise outage.refused() from exc
            return self._fallback.acquire(task, token, ttl, holder)

    def reclaim_held(self) -> None:
        """The primary lost its data: claim every key this process holds there again."""
        for task, token, holder, ttl in self.keeper.snapshot():
            _quietly(self._outage.primary.extend, task, token, ttl, holder)

    def release(self, task: str, token: str, holder: str = "") -> None:
        if holder:
            self.keeper.drop(task, token, holder)
        self._outage.run(self._release_primary, self._release_fallback, task, token, holder)

    def _release_fallback(self, task: str, token: str, holder: str) -> None:
        """Released during an outage: locally now, and on the primary at recovery (a key
        claimed there before the outage would otherwise be held until its TTL ran out)."""
        self._fallback.release(task, token, holder)
        if holder:
            self._outage.note_release(task, token, holder)

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
        self._outage.run(self._put_primary, self._fallback.put_ledger, entry)

    def _put_primary(self, entry: LedgerEntry) -> None:
        self._primary.put_ledger(entry)
        self._outage.remember(entry)

    def _swap_primary(self, entry: LedgerEntry, expected: LedgerEntry) -> bool:
        swapped = self._primary.swap_ledger(entry, expected)
        if swapped:
            self._outage.remember(entry)
        return swapped

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
        return self._outage.run(self._swap_primary, self._fallback.swap_ledger,
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
        retry_after: float = 0.25,
        on_degrade: Callable[[BaseException], None] | None = None,
        local_side_effects: bool | Iterable[str] = False,
    ) -> None:
        if policy not in ("open", "closed"):
            from toolfault._errors import ConfigurationError

            raise ConfigurationError("state_failure must be 'open' or 'closed'")
        self.primary = primary
        self.fallback = MemoryStore()
        if isinstance(local_side_effects, str):
            local_side_effects = (local_side_effects,)
        self._outage = _Outage(primary, self.fallback, policy=policy, retry_after=retry_after,
                               on_degrade=on_degrade, local_side_effects=local_side_effects)
        self.counters = DegradingCounters(self._outage)
        self.key_locks = DegradingKeyLocks(self._outage)
        self._outage.on_epoch_change = self.key_locks.reclaim_held
        self.local_ok = self._outage.local_ok
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
        self._outage.closed = True
        self.key_locks.keeper.close()
        self.primary.close()


def _quietly(op: Callable[_P, object], *args: _P.args, **kwargs: _P.kwargs) -> None:
    try:
        op(*args, **kwargs)
    except Exception:  # noqa: BLE001 - best effort; the next recovery or a TTL catches up
        pass


def best_effort(op: Callable[..., _R], *args: object) -> _R | None:
    """A store operation whose failure only costs a count, never the call."""
    try:
        return op(*args)
    except StateUnavailableError:
        return None
