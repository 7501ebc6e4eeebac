"""One behavioural contract, run against MemoryStore, SQLiteStore and RedisStore.

The guard only knows the :class:`Store` protocol, so every store must give the same answers
for the same sequence of steps; these tests pin the answers ``MemoryStore`` gives.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import _requests
import pytest

from toolfault import Incident, IncidentKind, LedgerEntry, Outcome
from toolfault._admission import LazyFingerprint
from toolfault.stores import Admission, AdmissionRequest, CallKey, Ceiling, Counter, Store

K = CallKey("task-a", 0, "fp-1")


def request(key: CallKey = K, **kw: Any) -> AdmissionRequest:
    return _requests.request(key, **kw)


def admit(store: Store, key: CallKey = K, *, cost: float = 0.0, max_calls: int | None = None,
          max_spend: float | None = None) -> Admission:
    return store.admit(request(key, cost=cost, max_calls=max_calls, max_spend=max_spend))


def entry(call_id: str, *, at: float, task: str = "task-a", **kw: object) -> LedgerEntry:
    fields: dict[str, object] = {
        "call_id": call_id, "task": task, "tool": "book", "fingerprint": "fp",
        "idempotency_key": f"book:{call_id}", "args": {"seat": "12A", "note": "naïve {x}"},
        "effect": Outcome.UNKNOWN, "at": at,
    }
    fields.update(kw)
    return LedgerEntry(**fields)  # type: ignore[arg-type]


def test_is_a_store(store: Store) -> None:
    """Every store satisfies the runtime-checkable Store protocol."""
    assert isinstance(store, Store)


def test_fresh_admission(store: Store) -> None:
    """A first call is admitted, counted once in its turn and charged its cost."""
    adm = admit(store, cost=0.25)
    assert adm.admitted
    assert (adm.failures, adm.last_code, adm.blocked, adm.over) == (0, None, False, None)
    assert adm.calls_in_turn == 1
    assert adm.spend == pytest.approx(0.25)


def test_calls_are_counted_per_turn_and_task(store: Store) -> None:
    """Calls in a turn accumulate across fingerprints; a new turn or another task starts at 1."""
    assert [admit(store, CallKey("task-a", 0, fp)).calls_in_turn for fp in "abc"] == [1, 2, 3]
    assert admit(store, CallKey("task-a", 1, "a")).calls_in_turn == 1
    assert admit(store, CallKey("task-b", 0, "a")).calls_in_turn == 1
    assert admit(store, CallKey("task-a", 0, "a")).calls_in_turn == 4


def test_failures_block_at_the_limit(store: Store) -> None:
    """Once a fingerprint failed ``limit`` times it is blocked, counted in the turn, not charged."""
    assert store.record_failure(K, "invalid_argument:max_price", 2) == 1
    first = admit(store, cost=1.0)
    assert (first.failures, first.last_code, first.blocked) == (1, "invalid_argument:max_price",
                                                               False)
    assert store.record_failure(K, "invalid_argument:max_price", 2) == 2
    blocked = admit(store, cost=1.0)
    assert blocked.blocked and not blocked.admitted
    assert (blocked.failures, blocked.last_code) == (2, "invalid_argument:max_price")
    assert blocked.calls_in_turn == 2
    assert blocked.spend == pytest.approx(1.0)


def test_latest_code_and_limit_win(store: Store) -> None:
    """A later failure's code and limit replace the earlier ones while the count carries on."""
    store.record_failure(K, "timeout", 5)
    assert store.record_failure(K, "rate_limited", 2) == 2
    adm = admit(store)
    assert adm.blocked and adm.last_code == "rate_limited"


def test_failures_are_scoped_to_fingerprint_turn_and_task(store: Store) -> None:
    """A blocked fingerprint does not block another fingerprint, turn or task."""
    store.record_failure(K, "bad", 1)
    assert admit(store).blocked
    for other in (CallKey("task-a", 0, "fp-2"), CallKey("task-a", 1, "fp-1"),
                  CallKey("task-b", 0, "fp-1")):
        adm = admit(store, other)
        assert not adm.blocked and adm.failures == 0


def test_clear_failures_resets_the_count(store: Store) -> None:
    """A success resets the fingerprint so the next failure counts from 1 again."""
    store.record_failure(K, "bad", 2)
    store.record_failure(K, "bad", 2)
    store.clear_failures(K)
    adm = admit(store)
    assert (adm.failures, adm.last_code, adm.blocked) == (0, None, False)
    assert store.record_failure(K, "bad", 2) == 1
    store.clear_failures(CallKey("task-a", 0, "never-failed"))  # harmless


def test_calls_per_turn_ceiling(store: Store) -> None:
    """The call over the turn ceiling is refused without being counted or charged."""
    assert admit(store, cost=1.0, max_calls=2).admitted
    assert admit(store, cost=1.0, max_calls=2).admitted
    over = admit(store, cost=1.0, max_calls=2)
    assert over.over == "calls_per_turn" and not over.admitted and not over.blocked
    assert over.calls_in_turn == 2
    assert over.spend == pytest.approx(2.0)
    assert admit(store, cost=1.0, max_calls=2).calls_in_turn == 2
    assert admit(store, CallKey("task-a", 1, "fp-1"), max_calls=2).admitted


def test_turn_ceiling_is_checked_before_the_block(store: Store) -> None:
    """Over the turn ceiling a blocked fingerprint reports the ceiling, as MemoryStore does."""
    store.record_failure(K, "bad", 1)
    assert admit(store, max_calls=1).blocked
    over = admit(store, max_calls=1)
    assert over.over == "calls_per_turn" and not over.blocked and over.failures == 1


def test_spend_per_task_ceiling(store: Store) -> None:
    """Spend carries across turns; the call that would cross the ceiling is not charged."""
    assert admit(store, cost=0.5, max_spend=1.0).admitted
    assert admit(store, CallKey("task-a", 3, "x"), cost=0.5, max_spend=1.0).admitted
    over = admit(store, cost=0.5, max_spend=1.0)
    assert over.over == "spend_per_task"
    assert over.spend == pytest.approx(1.0)
    assert over.calls_in_turn == 2
    assert admit(store, cost=0.0, max_spend=1.0).admitted
    assert admit(store, CallKey("task-b", 0, "x"), cost=0.5, max_spend=1.0).admitted


def test_blocked_call_is_not_charged(store: Store) -> None:
    """A blocked identical call costs nothing."""
    store.record_failure(K, "bad", 1)
    assert admit(store, cost=3.0).blocked
    assert admit(store, CallKey("task-a", 0, "other"), cost=0.0).spend == 0.0


def test_refund(store: Store) -> None:
    """A refund gives back spend, never below zero."""
    admit(store, cost=1.0)
    store.refund("task-a", 0.25)
    assert admit(store, CallKey("task-a", 0, "x")).spend == pytest.approx(0.75)
    store.refund("task-a", 10.0)
    assert admit(store, CallKey("task-a", 0, "y")).spend == 0.0
    store.refund("never-charged", 1.0)
    assert admit(store, CallKey("never-charged", 0, "x")).spend == 0.0


def test_acquire_and_release(store: Store) -> None:
    """An idempotency key has one holder at a time, per task, until released."""
    assert store.acquire("task-a", "book:12A", 30)
    assert not store.acquire("task-a", "book:12A", 30)
    assert store.acquire("task-b", "book:12A", 30)
    assert store.acquire("task-a", "book:14C", 30)
    store.release("task-a", "book:12A")
    assert store.acquire("task-a", "book:12A", 30)
    store.release("task-a", "never-held")


def test_acquire_expires(store: Store) -> None:
    """A key whose holder died is free again once its TTL passed."""
    assert store.acquire("task-a", "tok", 0.05)
    assert not store.acquire("task-a", "tok", 0.05)
    time.sleep(0.15)
    assert store.acquire("task-a", "tok", 30)
    assert not store.acquire("task-a", "tok", 30)


def test_only_the_holder_releases_a_key(store: Store) -> None:
    """A late release by an earlier holder cannot free a key another holder claimed since."""
    assert store.acquire("task-a", "tok", 0.05, "first")
    time.sleep(0.15)  # the first holder's key expired
    assert store.acquire("task-a", "tok", 30, "second")
    store.release("task-a", "tok", "first")  # the first attempt ends late
    assert not store.acquire("task-a", "tok", 30, "third")
    store.release("task-a", "tok", "second")
    assert store.acquire("task-a", "tok", 30, "third")


def test_claiming_a_key_one_holds_extends_it(store: Store) -> None:
    """The holder may claim its own key again (an outage's write-back does); nobody else."""
    assert store.acquire("task-a", "tok", 30, "me")
    assert store.acquire("task-a", "tok", 30, "me")
    assert not store.acquire("task-a", "tok", 30, "other")
    assert not store.acquire("task-a", "tok", 30)  # no holder named: never re-entrant


def test_extend_keeps_a_key_past_its_ttl(store: Store) -> None:
    """Extended before it expires, a key outlives its first TTL; only its holder extends."""
    assert store.acquire("task-a", "tok", 0.2, "me")
    assert not store.extend("task-a", "tok", 30, "other")
    time.sleep(0.1)
    assert store.extend("task-a", "tok", 0.3, "me")
    time.sleep(0.15)  # past the first TTL, within the extension
    assert not store.acquire("task-a", "tok", 30, "other")
    time.sleep(0.3)  # the extension ran out too
    assert not store.extend("task-a", "tok", 30, "me")  # expired: not brought back
    assert store.acquire("task-a", "tok", 30, "other")
    assert not store.extend("task-a", "never-held", 30, "me")


def test_release_without_a_holder_frees_any_key(store: Store) -> None:
    """The earlier protocol's release (no holder) still frees the key, whoever holds it."""
    assert store.acquire("task-a", "tok", 30, "me")
    store.release("task-a", "tok")
    assert store.acquire("task-a", "tok", 30, "other")


def test_ledger_upsert_and_order(store: Store) -> None:
    """Entries come back oldest first, equal to what was written; a rewrite replaces in place."""
    e1, e2, e3 = entry("c1", at=2000.5), entry("c2", at=1000.25), entry("c3", at=3000.0)
    for e in (e1, e2, e3):
        store.put_ledger(e)
    assert store.ledger("task-a") == [e2, e1, e3]
    assert all(e.in_flight for e in store.ledger("task-a"))
    done = LedgerEntry(**{**e1.to_dict(), "effect": Outcome.APPLIED, "told": "ok",
                          "told_effect": Outcome.APPLIED, "confirmed_by": "return",
                          "attempts": 2})  # type: ignore[arg-type]
    done = LedgerEntry.from_dict(done.to_dict())
    store.put_ledger(done)
    got = store.ledger("task-a")
    assert got == [e2, done, e3]
    assert not got[1].in_flight and got[1].effect is Outcome.APPLIED
    assert store.ledger("task-b") == []


def test_ledger_ties_keep_first_write_order(store: Store) -> None:
    """Entries with the same timestamp keep the order they were first written in."""
    names = ["z", "a", "m"]
    for name in names:
        store.put_ledger(entry(name, at=5.0))
    store.put_ledger(entry("a", at=5.0, told="ok"))
    assert [e.call_id for e in store.ledger("task-a")] == names


def test_ledger_is_per_task(store: Store) -> None:
    """The same call id in two tasks is two entries."""
    store.put_ledger(entry("c1", at=1.0, task="task-a"))
    store.put_ledger(entry("c1", at=2.0, task="task-b", tool="refund"))
    assert [e.tool for e in store.ledger("task-a")] == ["book"]
    assert [e.tool for e in store.ledger("task-b")] == ["refund"]


def test_incidents(store: Store) -> None:
    """Incidents come back per task in the order recorded, equal to what was written."""
    made = [
        Incident(IncidentKind.RETRY_CAP, "search", "invalid_argument", "3 identical", "task-a",
                 0, at=30.0),
        Incident(IncidentKind.BUDGET_EXCEEDED, "search", "budget_exceeded", "spent", "task-a",
                 1, at=10.0),
        Incident(IncidentKind.STATE_DEGRADED, "*", "state_unavailable", "down", "task-b", 0),
    ]
    for incident in made:
        store.add_incident(incident)
    assert store.incidents("task-a") == made[:2]
    assert store.incidents("task-b") == made[2:]
    assert store.incidents("task-c") == []


@pytest.mark.parametrize("task", ["a{b}:c", "a{b}", "ünï cödé", "a:calls:0"])
def test_awkward_task_ids_stay_apart(store: Store, task: str) -> None:
    """Task ids with braces, colons or unicode neither break a store nor share state."""
    store.record_failure(CallKey(task, 0, "fp"), "bad", 1)
    assert admit(store, CallKey(task, 0, "fp")).blocked
    assert not admit(store, CallKey(task + "x", 0, "fp")).blocked
    assert not admit(store, CallKey("a", 0, "fp")).blocked


def test_state_is_shared_between_handles(make_store: Callable[[], Store]) -> None:
    """Two handles on the same backing state (file, server) see each other's writes."""
    one, two = make_store(), make_store()
    one.record_failure(K, "bad", 1)
    one.put_ledger(entry("c1", at=1.0))
    assert admit(two).blocked
    assert [e.call_id for e in two.ledger("task-a")] == ["c1"]
    assert two.acquire("task-a", "tok", 30)
    assert not one.acquire("task-a", "tok", 30)


def test_admit_is_atomic_under_threads(make_store: Callable[[], Store]) -> None:
    """Threads racing on one task's spend ceiling admit exactly the affordable number of calls."""
    admitted: list[bool] = []
    lock = threading.Lock()

    def worker() -> None:
        store = make_store()
        for i in range(20):
            adm = admit(store, CallKey("task-a", 0, f"fp{i}"), cost=1.0, max_spend=25.0)
            with lock:
                admitted.append(adm.admitted)

    threads = [threading.Thread(target=worker) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(admitted) == 120
    assert sum(admitted) == 25
    last = admit(make_store(), CallKey("task-a", 0, "last"))
    assert last.calls_in_turn == 121
    assert last.spend == pytest.approx(25.0)


def test_concurrent_repeats_of_a_failed_call_are_busy(store: Store) -> None:
    """With a lease, identical calls in flight count against the limit until each settles."""
    store.record_failure(K, "bad", 2)
    one = request(cost=1.0, lease=30)
    first, second = store.admit(one), store.admit(request(cost=1.0, lease=30))
    assert first.admitted and not first.busy
    assert second.busy and not second.admitted and not second.blocked
    assert second.spend == pytest.approx(1.0)  # the busy call was not charged
    store.settle(one)
    assert store.admit(request(lease=30)).admitted


def test_reservations_expire_with_their_lease(store: Store) -> None:
    """A reservation whose caller died stops counting once its lease passed."""
    store.record_failure(K, "bad", 2)
    assert store.admit(request(lease=0.05)).admitted
    assert store.admit(request(lease=0.05)).busy
    time.sleep(0.15)
    assert store.admit(request(lease=0.05)).admitted


def test_first_calls_reserve_too(store: Store) -> None:
    """Calls admitted before any failure still count once the fingerprint starts failing."""
    first = request(lease=30)
    a = store.admit(first)
    assert a.admitted and a.failures == 0
    store.record_failure(K, "bad", 2)  # another worker's identical call failed meanwhile
    assert store.admit(request(lease=30)).busy
    store.settle(first)
    assert store.admit(request(lease=30)).admitted


def test_in_flight_limit_applies_before_any_failure(store: Store) -> None:
    """With an IDENTICAL_RUNNING ceiling, identical calls in flight are capped before any
    failure."""
    one = request(lease=30, limit=2)
    first, second = store.admit(one), store.admit(request(lease=30, limit=2))
    third = store.admit(request(lease=30, limit=2))
    assert first.admitted and second.admitted
    assert third.busy and not third.admitted
    store.settle(one)
    assert store.admit(request(lease=30, limit=2)).admitted


def test_settle_releases_the_calls_own_reservation(store: Store) -> None:
    """Settling a request drops that request's reservation, not another identical call's."""
    short, long = request(lease=0.05, limit=2), request(lease=30, limit=2)
    assert store.admit(short).admitted and store.admit(long).admitted
    store.settle(long)
    assert store.admit(request(lease=30, limit=2)).admitted  # short still held: 1 + 1
    time.sleep(0.15)
    assert store.admit(request(lease=30, limit=2)).admitted  # short expired: 1 + 1


def test_settling_twice_or_unadmitted_is_harmless(store: Store) -> None:
    """A request that holds no reservation (refused, settled already, no lease) settles to a
    no-op."""
    store.record_failure(K, "bad", 3)
    one, never = request(lease=30, limit=1), request(lease=30, limit=1)
    assert store.admit(one).admitted
    assert store.admit(request(lease=30, limit=1)).admitted  # limit 3 from the record
    store.settle(one)
    store.settle(one)
    store.settle(never)
    store.settle(request())
    assert store.admit(request(lease=30)).admitted
    assert store.admit(request(lease=30)).busy


def test_the_order_of_ceilings_in_the_request_does_not_matter(store: Store) -> None:
    """Ceilings are evaluated in the documented order whatever order the request lists them."""
    store.record_failure(K, "bad", 1)
    ceilings = (Ceiling(Counter.SPEND_IN_TASK, 0.0), Ceiling(Counter.IDENTICAL_RUNNING, 0),
                Ceiling(Counter.CALLS_IN_TURN, 5))
    adm = store.admit(AdmissionRequest("task-a", 0, LazyFingerprint("fp-1"), 1.0, 30, ceilings))
    assert adm.blocked and adm.over is None and adm.calls_in_turn == 1
    other = AdmissionRequest("task-a", 0, LazyFingerprint("fp-2"), 1.0, 30, ceilings[::-1])
    assert store.admit(other).busy  # identical-running before spend
    third = AdmissionRequest("task-a", 0, LazyFingerprint("fp-3"), 1.0, None, ceilings[1:])
    assert store.admit(third).over is None  # no lease: no identical-running clause
    over = AdmissionRequest("task-a", 0, LazyFingerprint("fp-4"), 1.0, None, ceilings)
    assert store.admit(over).over == "spend_per_task"


def test_the_tightest_of_two_ceilings_on_one_counter_wins(store: Store) -> None:
    """Two ceilings on one counter: the lower limit applies."""
    ceilings = (Ceiling(Counter.CALLS_IN_TURN, 5), Ceiling(Counter.CALLS_IN_TURN, 1))
    assert store.admit(AdmissionRequest("task-a", 0, LazyFingerprint("a"), 0, None,
                                        ceilings)).admitted
    assert store.admit(AdmissionRequest("task-a", 0, LazyFingerprint("b"), 0, None,
                                        ceilings)).over == "calls_per_turn"


def test_ledger_entry_is_the_latest_for_its_key(store: Store) -> None:
    """Looking an entry up by idempotency key gives the latest written for that key."""
    assert store.ledger_entry("task-a", "book:12A") is None
    old = entry("c1", at=1.0, idempotency_key="book:12A")
    new = entry("c2", at=2.0, idempotency_key="book:12A")
    other = entry("c3", at=3.0, idempotency_key="book:14C")
    for e in (old, new, other):
        store.put_ledger(e)
    store.put_ledger(entry("c1", at=1.0, idempotency_key="book:12A", told="ok"))
    assert store.ledger_entry("task-a", "book:12A") == new
    assert store.ledger_entry("task-a", "book:14C") == other
    assert store.ledger_entry("task-b", "book:12A") is None


def test_swap_ledger_is_compare_and_set(store: Store) -> None:
    """A swap writes only over the entry it expects; a stale one changes nothing."""
    first = entry("c1", at=1.0)
    store.put_ledger(first)
    landed = entry("c1", at=1.0, effect=Outcome.APPLIED, confirmed_by="late return")
    assert store.swap_ledger(landed, first)
    stale = entry("c1", at=1.0, effect=Outcome.NO_EFFECT, confirmed_by="postcondition")
    assert not store.swap_ledger(stale, first)
    assert store.ledger("task-a") == [landed]
    assert not store.swap_ledger(entry("c9", at=1.0), entry("c9", at=1.0))
    assert [e.call_id for e in store.ledger("task-a")] == ["c1"]


def test_swap_ledger_races_have_one_winner(make_store: Callable[[], Store]) -> None:
    """Threads swapping the same entry from the same expected value: exactly one wins."""
    first = entry("c1", at=1.0)
    make_store().put_ledger(first)
    wins: list[bool] = []
    barrier = threading.Barrier(6)

    def swap(n: int) -> None:
        store = make_store()
        barrier.wait()
        wins.append(store.swap_ledger(entry("c1", at=1.0, attempts=n + 1), first))

    threads = [threading.Thread(target=swap, args=(n,)) for n in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(wins) == [False] * 5 + [True]


def test_pollers_are_remembered_for_every_task(store: Store) -> None:
    """A fingerprint marked as a poller is one for any task sharing the store (the fleet)."""
    from toolfault.stores import Pollers

    assert isinstance(store, Pollers)
    assert not store.is_poller("fp-poll")
    store.mark_poller("fp-poll")
    store.mark_poller("fp-poll")  # idempotent
    assert store.is_poller("fp-poll") and not store.is_poller("fp-other")
