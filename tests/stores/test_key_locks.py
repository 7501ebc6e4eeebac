"""Holder-checked idempotency keys, kept while their holders run (``_state.py``).

The store contract (``test_store_contract.py``) pins what each store does with a holder;
these tests pin what the guard and the degrading wrapper do with it: a late release cannot
free a key another call claimed since, a held key outlives its TTL while its holder runs,
an outage that hid a second claim is reported, and a store written to the earlier protocol
still works.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable
from typing import Any

import pytest

from toolfault import Guard, Incident, IncidentKind, LedgerEntry, MemoryStore, Outcome
from toolfault._degrading import DegradingStore


def _held(store: MemoryStore) -> dict[tuple[str, str], tuple[float, str]]:
    return dict(store._held)


def test_a_late_release_does_not_free_a_key_claimed_since() -> None:
    """The bug this fixes: a call whose key expired while it ran (and was claimed by another
    worker) used to delete that worker's key when it ended, letting a third call dispatch
    the same action."""
    shared = MemoryStore()
    guard = Guard(store=shared, task_id="t1", scan_env_secrets=False)
    seen: list[tuple[str, str]] = []

    @guard.tool(side_effect=True)
    def pay(order: str) -> str:
        [(key, (_, holder))] = _held(shared).items()
        seen.append((key[1], holder))
        # Meanwhile the key expired and another worker claimed it for the same action.
        shared.release(*key)
        assert shared.acquire(key[0], key[1], 30, "another-worker")
        return "paid"

    assert guard.call("pay", {"order": "A-1"}).ok
    [(token, holder)] = seen
    assert holder and holder != "another-worker"  # the guard claimed it with a holder
    # The other worker still holds its key: nobody else can claim it.
    assert _held(shared)[("t1", token)][1] == "another-worker"
    assert not shared.acquire("t1", token, 30, "a-third-worker")


def test_the_guard_releases_its_own_key_and_stops_keeping_it() -> None:
    shared = MemoryStore()
    guard = Guard(store=shared, task_id="t1", scan_env_secrets=False)
    keeper = guard._shared.store.key_locks.keeper
    during: list[int] = []

    @guard.tool(side_effect=True)
    def pay(order: str) -> str:
        during.append(keeper.held)
        return "paid"

    assert guard.call("pay", {"order": "A-1"}).ok
    assert during == [1] and keeper.held == 0
    assert _held(shared) == {}


def test_a_held_key_outlives_its_ttl_while_its_holder_runs() -> None:
    """The keeper extends a key every third of its TTL until it is released."""
    primary = MemoryStore()
    store = DegradingStore(primary)
    assert store.acquire("t1", "pay:A-1", 0.6, "me")
    time.sleep(1.8)  # three TTLs
    assert not primary.acquire("t1", "pay:A-1", 30, "other")
    assert store.key_locks.keeper.held == 1
    store.release("t1", "pay:A-1", "me")
    assert store.key_locks.keeper.held == 0
    assert primary.acquire("t1", "pay:A-1", 30, "other")


def test_the_keeper_thread_exists_only_while_keys_are_held() -> None:
    store = DegradingStore(MemoryStore())
    keeper = store.key_locks.keeper
    store.acquire("t1", "tok", 0.15, "me")
    assert keeper._thread is not None
    store.release("t1", "tok", "me")
    deadline = time.monotonic() + 2
    while keeper._thread is not None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert keeper._thread is None


def test_a_key_lost_at_renewal_is_counted_and_no_longer_kept(
        caplog: pytest.LogCaptureFixture) -> None:
    primary = MemoryStore()
    store = DegradingStore(primary)
    keeper = store.key_locks.keeper
    store.acquire("t1", "tok", 0.15, "me")
    primary.release("t1", "tok")  # an operator (or an expiry) freed it ...
    assert primary.acquire("t1", "tok", 30, "other")  # ... and another worker took it
    deadline = time.monotonic() + 2
    while keeper.lost == 0 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert keeper.lost == 1 and keeper.held == 0
    assert "idempotency key expired" in caplog.text
    assert _held(primary)[("t1", "tok")][1] == "other"  # never taken back


class _Flaky(MemoryStore):
    """A shared store that can be made unreachable (its calls raise ConnectionError)."""

    down = False

    def _reach(self) -> None:
        if self.down:
            raise ConnectionError("store unreachable")

    def acquire(self, task: str, token: str, ttl: float, holder: str = "") -> bool:
        self._reach()
        return super().acquire(task, token, ttl, holder)

    def release(self, task: str, token: str, holder: str = "") -> None:
        self._reach()
        super().release(task, token, holder)

    def extend(self, task: str, token: str, ttl: float, holder: str) -> bool:
        self._reach()
        return super().extend(task, token, ttl, holder)

    def put_ledger(self, entry: LedgerEntry) -> None:
        self._reach()
        super().put_ledger(entry)

    def ledger(self, task: str) -> list[LedgerEntry]:
        self._reach()
        return super().ledger(task)

    def add_incident(self, incident: Incident) -> None:
        self._reach()
        super().add_incident(incident)


def test_a_key_claimed_elsewhere_during_an_outage_is_reported_on_recovery() -> None:
    primary = _Flaky()
    store = DegradingStore(primary, retry_after=0.0)
    primary.down = True
    assert store.acquire("t1", "pay:A-1", 30, "me")  # counted locally: the outage
    assert store.degraded
    primary.down = False
    assert primary.acquire("t1", "pay:A-1", 30, "another-worker")  # claimed in the shared store
    store.ledger("t1")  # the next call recovers: the local key is written back
    assert not store.degraded
    kinds = [i.kind for i in primary.incidents("t1")]
    assert IncidentKind.KEY_CONFLICT in kinds
    assert _held(primary)[("t1", "pay:A-1")][1] == "another-worker"
    store.release("t1", "pay:A-1", "me")


def test_a_key_held_during_an_outage_is_written_back_with_its_holder() -> None:
    primary = _Flaky()
    store = DegradingStore(primary, retry_after=0.0)
    primary.down = True
    assert store.acquire("t1", "pay:A-1", 30, "me")
    primary.down = False
    store.ledger("t1")
    assert _held(primary)[("t1", "pay:A-1")][1] == "me"
    assert IncidentKind.KEY_CONFLICT not in [i.kind for i in primary.incidents("t1")]
    store.release("t1", "pay:A-1", "me")
    assert _held(primary) == {}


class _EarlierProtocol(MemoryStore):
    """A third-party store written before holders: ``acquire``/``release`` without them."""

    def acquire(self, task: str, token: str, ttl: float) -> bool:  # type: ignore[override]
        return super().acquire(task, token, ttl)

    def release(self, task: str, token: str) -> None:  # type: ignore[override]
        super().release(task, token)


def test_a_store_on_the_earlier_protocol_still_works_with_a_warning() -> None:
    with pytest.warns(DeprecationWarning, match="earlier KeyLocks protocol"):
        guard = Guard(store=_EarlierProtocol(), task_id="t1", scan_env_secrets=False)
    runs: list[str] = []

    @guard.tool(side_effect=True)
    def pay(order: str) -> str:
        runs.append(order)
        return "paid"

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert guard.call("pay", {"order": "A-1"}).ok
        assert guard.call("pay", {"order": "A-2"}).ok
    assert runs == ["A-1", "A-2"]
    assert guard._shared.store.key_locks.keeper.held == 0


def test_a_key_claimed_before_an_outage_is_not_lost_during_it() -> None:
    """Renewals during an outage cannot reach the primary; a key the fallback never saw is
    kept (not counted lost), and renewed on the primary again after recovery."""
    primary = _Flaky()
    store = DegradingStore(primary, retry_after=0.0)
    keeper = store.key_locks.keeper
    assert store.acquire("t1", "pay:A-1", 1.5, "me")  # on the primary, renewed every 0.5 s
    primary.down = True
    time.sleep(0.7)  # one renewal during the outage, shorter than the TTL
    assert keeper.lost == 0 and keeper.held == 1
    primary.down = False
    time.sleep(1.2)  # renewed on the primary again (recovered at the next renewal)
    assert not store.degraded
    assert keeper.lost == 0
    assert not primary.acquire("t1", "pay:A-1", 30, "other")
    store.release("t1", "pay:A-1", "me")
    assert primary.acquire("t1", "pay:A-1", 30, "other")


def test_claiming_again_with_a_shorter_ttl_is_renewed_at_the_shorter_pace() -> None:
    primary = MemoryStore()
    store = DegradingStore(primary)
    assert store.acquire("t1", "tok", 30, "me")
    assert store.acquire("t1", "tok", 0.6, "me")  # claimed again, for less
    time.sleep(1.5)
    assert not primary.acquire("t1", "tok", 30, "other")
    store.release("t1", "tok", "me")


def test_a_key_is_renewed_for_at_most_max_hold_seconds(caplog: pytest.LogCaptureFixture
                                                       ) -> None:
    """A hung attempt does not hold its action for the life of the process."""
    primary = MemoryStore()
    store = DegradingStore(primary)
    keeper = store.key_locks.keeper
    keeper.max_hold = 0.5
    assert store.acquire("t1", "tok", 0.3, "me")
    time.sleep(1.2)  # renewed until 0.5 s, then its TTL ran out
    assert keeper.held == 0 and keeper.lost == 0
    assert "no longer renewed" in caplog.text
    assert primary.acquire("t1", "tok", 30, "other")


def test_closing_the_store_stops_the_renewals() -> None:
    store = DegradingStore(MemoryStore())
    store.acquire("t1", "tok", 30, "me")
    store.close()
    assert store.key_locks.keeper.held == 0


def test_a_forked_child_keeps_its_own_keys(in_forked_child: Callable[..., bytes]) -> None:
    """The parent's keeper thread does not exist in a forked child: the child starts its
    own, for its own keys only."""
    primary = MemoryStore()
    store = DegradingStore(primary)
    keeper = store.key_locks.keeper
    store.acquire("t1", "parent", 30, "P")

    def child() -> bool:
        store.acquire("t1", "child", 0.6, "C")
        time.sleep(1.5)
        return (not primary.acquire("t1", "child", 30, "other") and keeper.held == 1
                and keeper._thread is not None and keeper._thread.is_alive())

    assert in_forked_child(child, seconds=20.0) == b"1"
    assert keeper.held == 1  # the parent's own key, still kept here
    store.release("t1", "parent", "P")


def test_children_forked_as_the_keeper_starts_do_not_deadlock(
        in_forked_child: Callable[..., bytes]) -> None:
    """A fork right after the claim that starts the keeper's thread, while that thread takes
    the keeper's lock (without fresh locks in the child, about one fork in three hung): the
    child claims and renews a key of its own, every time."""
    for attempt in range(15):
        primary = MemoryStore()
        store = DegradingStore(primary)
        keeper = store.key_locks.keeper
        store.acquire("t1", "parent", 30, "P")  # starts the keeper's thread

        def child() -> bool:
            ok = store.acquire("t1", "child", 0.3, "C")  # noqa: B023 - run before the next
            time.sleep(0.15)  # past its first renewal
            return ok and keeper.held == 1 and not primary.acquire(  # noqa: B023
                "t1", "child", 30, "x")

        assert in_forked_child(child) == b"1", f"fork {attempt}"
        store.close()


class _Wrapped:
    """An instrumentation proxy: every method forwarded with ``*args, **kwargs``."""

    def __init__(self, inner: MemoryStore) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._inner, name)
        if not callable(method):
            return method

        def forward(*args: Any, **kwargs: Any) -> Any:
            return method(*args, **kwargs)
        return forward


def test_a_forwarding_proxy_is_taken_for_the_current_protocol() -> None:
    inner = MemoryStore()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        store = DegradingStore(_Wrapped(inner))  # type: ignore[arg-type]
    assert store.acquire("t1", "tok", 30, "me")
    store.release("t1", "tok", "someone-else")
    assert not inner.acquire("t1", "tok", 30, "other")
    store.release("t1", "tok", "me")
    assert inner.acquire("t1", "tok", 30, "other")


def test_an_earlier_protocol_write_back_retried_reports_no_conflict() -> None:
    """Write-back failing after the keys reached the primary is retried; a store on the
    earlier protocol cannot tell that repeat claim from another worker's, so no conflict is
    reported for it."""

    class Earlier(_Flaky):
        fail_ledger = False

        def acquire(self, task: str, token: str, ttl: float) -> bool:  # type: ignore[override]
            return super().acquire(task, token, ttl)

        def release(self, task: str, token: str) -> None:  # type: ignore[override]
            super().release(task, token)

        def put_ledger(self, entry: LedgerEntry) -> None:
            self._reach()
            if self.fail_ledger:
                self.fail_ledger = False
                raise ConnectionError("down again")
            super().put_ledger(entry)

    primary = Earlier()
    with pytest.warns(DeprecationWarning, match="earlier KeyLocks protocol"):
        store = DegradingStore(primary, retry_after=0.0)
    primary.down = True
    store.acquire("t1", "tok", 30, "me")
    store.put_ledger(LedgerEntry(call_id="c1", task="t1", tool="pay", fingerprint="fp",
                                 idempotency_key="tok", args={}, effect=Outcome.UNKNOWN))
    primary.down, primary.fail_ledger = False, True
    store.ledger("t1")  # recovery fails after the key reached the primary
    store.ledger("t1")  # and is retried
    assert not store.degraded
    assert IncidentKind.KEY_CONFLICT not in [i.kind for i in primary.incidents("t1")]


def test_the_keeper_renews_keys_in_every_store(make_store: Any) -> None:
    """Renewals run on the keeper's own thread: each store's handle must serve it there."""
    primary = make_store()
    other = make_store()  # another worker's handle on the same state
    store = DegradingStore(primary)
    assert store.acquire("t1", "pay:A-1", 0.6, "me")
    time.sleep(1.5)
    assert not other.acquire("t1", "pay:A-1", 30, "another-worker")
    assert store.key_locks.keeper.lost == 0
    store.release("t1", "pay:A-1", "me")
    assert other.acquire("t1", "pay:A-1", 30, "another-worker")


def test_a_child_forked_during_a_write_back_does_not_deadlock(
        in_forked_child: Callable[..., bytes]) -> None:
    """The keeper's thread may be writing an outage's keys back to the primary (holding the
    outage's locks) at the fork: the child claims keys of its own."""
    primary = MemoryStore()
    store = DegradingStore(primary, retry_after=0.0)
    outage = store._outage
    outage.down_since = time.monotonic() - 1  # an outage the next call recovers from

    def child() -> bool:
        return store.acquire("t1", "child", 30, "C") and not primary.acquire(
            "t1", "child", 30, "other")

    assert in_forked_child(child, holding=[outage._recovering, outage._lock]) == b"1"


class _SlowFor(MemoryStore):
    """A store whose renewal of one key takes ``seconds`` (a slow answer for one key)."""

    def __init__(self, token: str, seconds: float) -> None:
        super().__init__()
        self.token, self.seconds = token, seconds
        self.running = self.most = 0  # renewals of that key running at once

    def extend(self, task: str, token: str, ttl: float, holder: str) -> bool:
        if token == self.token:
            self.running += 1
            self.most = max(self.most, self.running)
            time.sleep(self.seconds)
            self.running -= 1
        return super().extend(task, token, ttl, holder)


def test_a_slow_renewal_does_not_hold_back_the_other_keys() -> None:
    """One key's renewal takes twice another key's whole TTL: the other key is still
    renewed in time, and the slow key is not renewed twice at once."""
    primary = _SlowFor("slow", 1.2)
    store = DegradingStore(primary)
    keeper = store.key_locks.keeper
    assert store.acquire("t1", "slow", 3.0, "me")  # due every second, each renewal 1.2 s
    assert store.acquire("t1", "fast", 0.6, "me")  # due every 0.2 s
    deadline = time.monotonic() + 3.5
    while time.monotonic() < deadline:
        assert not primary.acquire("t1", "fast", 30, "another-worker")
        time.sleep(0.05)
    assert keeper.lost == 0
    assert primary.most == 1
    assert not primary.acquire("t1", "slow", 30, "another-worker")
    store.release("t1", "fast", "me")
    store.release("t1", "slow", "me")


def test_a_renewal_hung_on_the_store_does_not_hold_up_the_exit() -> None:
    """The renewers are daemon threads, as the keeper is: a process whose store hangs on a
    renewal still exits when its main thread is done."""
    import subprocess
    import sys
    import textwrap

    code = textwrap.dedent("""
        import time
        from toolfault import MemoryStore
        from toolfault._degrading import DegradingStore

        class Hung(MemoryStore):
            def extend(self, *args):
                time.sleep(120)
                return True

        store = DegradingStore(Hung())
        store.acquire("t1", "tok", 0.3, "me")
        time.sleep(0.5)  # the first renewal is hung by now
        print("done", flush=True)
    """)
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "done", done.stderr
    assert time.monotonic() - started < 30
