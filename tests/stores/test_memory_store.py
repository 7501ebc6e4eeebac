"""MemoryStore's lazy fingerprint: a quiet scope admits without it, a busy one resolves it."""

from __future__ import annotations

import sys
import threading
import time

import pytest

from toolfault import MemoryStore
from toolfault._admission import LazyFingerprint
from toolfault.stores import AdmissionRequest, CallKey, Ceiling, Counter


class Thunk:
    """A fingerprint computation that counts how often it ran."""

    def __init__(self, value: str) -> None:
        self.value = value
        self.calls = 0

    def __call__(self) -> str:
        self.calls += 1
        return self.value


def request(thunk: Thunk | str, *, task: str = "t", turn: int = 0, lease: float | None = 30.0,
            limit: int = 2, cost: float = 0.0) -> AdmissionRequest:
    return AdmissionRequest(task, turn, LazyFingerprint(thunk), cost, lease,
                            (Ceiling(Counter.IDENTICAL_RUNNING, limit),))


def test_a_quiet_scope_never_computes_the_fingerprint() -> None:
    """Admit and settle one call at a time in a clean turn: the fingerprint is never needed."""
    store = MemoryStore()
    thunks = [Thunk(f"fp{i % 3}") for i in range(50)]
    for thunk in thunks:
        one = request(thunk, cost=0.5)
        adm = store.admit(one)
        assert adm.admitted
        store.settle(one)
    assert sum(t.calls for t in thunks) == 0
    assert store.admit(request("x")).calls_in_turn == 51
    assert store.admit(request("y")).spend == 25.0


def test_a_second_call_resolves_the_first_and_counts_it() -> None:
    """An identical call arriving while the unresolved one runs sees it under its key."""
    store = MemoryStore()
    first_fp, second_fp = Thunk("same"), Thunk("same")
    first = request(first_fp, limit=1)
    assert store.admit(first).admitted and first_fp.calls == 0
    second = store.admit(request(second_fp, limit=1))
    assert second.busy and not second.admitted
    assert (first_fp.calls, second_fp.calls) == (1, 1)
    store.settle(first)  # the unresolved call, cleared by its own settle
    assert store.admit(request("same", limit=1)).admitted


def test_a_different_call_alongside_is_admitted() -> None:
    """Two different calls in flight in one turn both run; each keeps its own count."""
    store = MemoryStore()
    a, b = request(Thunk("a"), limit=1), request(Thunk("b"), limit=1)
    assert store.admit(a).admitted and store.admit(b).admitted
    store.settle(a)
    store.settle(b)
    assert store.admit(request("a", limit=1)).admitted


def test_a_failure_in_the_turn_makes_every_call_resolve() -> None:
    """Once a fingerprint failed in the turn, calls are looked up by fingerprint."""
    store = MemoryStore()
    store.record_failure(CallKey("t", 0, "bad"), "invalid_argument", 1)
    thunk = Thunk("bad")
    adm = store.admit(request(thunk))
    assert adm.blocked and thunk.calls == 1
    other = Thunk("fine")
    assert store.admit(request(other)).admitted and other.calls == 1
    assert store.admit(request(Thunk("bad"), turn=1)).admitted  # a clean turn is quiet again


def test_a_failure_while_the_lone_call_runs_still_counts_it() -> None:
    """A failure recorded while the unresolved call runs: the next identical call counts both."""
    store = MemoryStore()
    lone = request(Thunk("fp"))
    assert store.admit(lone).admitted
    store.record_failure(CallKey("t", 0, "fp"), "timeout", 2)  # another identical call failed
    assert store.admit(request("fp")).busy  # 1 failure + 1 running reach 2
    store.settle(lone)
    assert store.admit(request("fp")).admitted


def test_an_unsettled_lone_call_expires_with_its_lease() -> None:
    """A lone call never settled stops counting once its lease passed."""
    store = MemoryStore()
    assert store.admit(request(Thunk("fp"), lease=0.05, limit=1)).admitted
    assert store.admit(request("fp", lease=0.05, limit=1)).busy
    time.sleep(0.1)
    assert store.admit(request("fp", lease=0.05, limit=1)).admitted


def test_calls_without_a_lease_take_no_reservation() -> None:
    """Without a lease nothing is reserved, so no fingerprint is needed in a clean turn."""
    store = MemoryStore()
    thunk = Thunk("fp")
    for _ in range(3):
        assert store.admit(request(thunk, lease=None, limit=1)).admitted
    assert thunk.calls == 0


def _race(trial: int) -> int:
    """32 threads admit one identical call at the same instant; how many were admitted."""
    store = MemoryStore()
    admitted: list[bool] = []
    barrier = threading.Barrier(32)

    def one() -> None:
        barrier.wait()
        admitted.append(store.admit(request(Thunk(f"fp{trial}"), limit=2)).admitted)

    threads = [threading.Thread(target=one) for _ in range(32)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(admitted)


def test_threads_racing_identical_calls_never_pass_the_cap() -> None:
    """32 threads admitting one identical call at once: exactly the limit is admitted."""
    assert [_race(trial) for trial in range(50)] == [2] * 50


def _unusable() -> str:
    raise ValueError("arguments cannot be fingerprinted")


def test_an_unusable_fingerprint_fails_only_its_own_call() -> None:
    """A lone call whose fingerprint raises does not break the next call of its turn, and a
    caller's own fingerprint error reaches that caller without degrading the store."""
    from toolfault._degrading import DegradingStore

    store = DegradingStore(MemoryStore())
    broken = AdmissionRequest("t", 0, LazyFingerprint(_unusable), 0.0, 30.0, ())
    assert store.admit(broken).admitted  # quiet: nothing computed it
    assert store.admit(request("fp")).admitted
    store.settle(broken)
    with pytest.raises(ValueError, match="fingerprinted"):
        store.admit(AdmissionRequest("t", 0, LazyFingerprint(_unusable), 0.0, 30.0, ()))
    assert not store.degraded


def test_settles_racing_admissions_leave_no_reservation_behind() -> None:
    """Calls of one turn admitted and settled from 8 threads at once, identical and
    different, with the GIL switching as often as it can: the cap of 2 identical calls
    running holds throughout, and once all settled nothing stays reserved (the unresolved
    call's settle takes no lock)."""
    store = MemoryStore()
    running = {f"fp{k}": 0 for k in range(3)}
    most = dict.fromkeys(running, 0)
    count_lock, barrier = threading.Lock(), threading.Barrier(8)
    admitted: list[int] = []

    def worker() -> None:
        barrier.wait()
        took = 0
        for n in range(1500):
            fp = f"fp{n % 3}"
            one = request(Thunk(fp), limit=2)
            if store.admit(one).admitted:
                took += 1
                with count_lock:  # counted inside the store's reservation
                    running[fp] += 1
                    most[fp] = max(most[fp], running[fp])
                time.sleep(0)  # the call runs: let the other threads in
                with count_lock:
                    running[fp] -= 1
                store.settle(one)
        admitted.append(took)

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        threads = [threading.Thread(target=worker) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(interval)
    assert max(most.values()) == 2 and sum(admitted) > 0  # it ran at the cap, never past
    turn = store._turns[("t", 0)]
    assert turn.lone is None and not turn.pending
    quiet = Thunk("fp0")
    assert store.admit(request(quiet, limit=1)).admitted and quiet.calls == 0
