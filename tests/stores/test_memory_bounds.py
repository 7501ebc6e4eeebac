"""MemoryStore keeps bounded memory: old turns, idle tasks and surplus tasks are dropped."""

from __future__ import annotations

import time
import tracemalloc

import pytest

from toolfault import Guard, MemoryStore, Outcome
from toolfault._admission import CallKey, LazyFingerprint
from toolfault._records import LedgerEntry
from toolfault.stores import AdmissionRequest, Ceiling, Counter


def _request(task: str, turn: int, fp: str = "fp") -> AdmissionRequest:
    return AdmissionRequest(task, turn, LazyFingerprint(fp), 0.0, 30.0,
                            (Ceiling(Counter.IDENTICAL_RUNNING, 2),))


def _fail(store: MemoryStore, task: str, turn: int, fp: str = "fp") -> None:
    request = _request(task, turn, fp)
    store.admit(request)
    store.settle(request)
    store.record_failure(CallKey(task, turn, fp), "invalid_argument", 2)


def _failures(store: MemoryStore, task: str, turn: int, fp: str = "fp") -> int:
    """The fingerprint's failure count as a new admission sees it (0 once evicted)."""
    request = _request(task, turn, fp)
    failures = store.admit(request).failures
    store.settle(request)
    return failures


def test_turns_beyond_max_turns_are_evicted_least_recently_used_first() -> None:
    """With max_turns=2, the oldest turn's counters go; the two latest keep theirs."""
    store = MemoryStore(max_turns=2)
    for turn in range(3):
        _fail(store, "t", turn)
    assert _failures(store, "t", 2) == 1 and _failures(store, "t", 1) == 1
    assert _failures(store, "t", 0) == 0


def test_guards_on_different_turns_of_one_task_keep_their_counters() -> None:
    """Two guards sharing a store and a task id, one turns ahead, never erase each other."""
    store = MemoryStore()
    _fail(store, "shared", 0)
    for turn in range(1, 50):
        _fail(store, "shared", turn, fp="other")
    assert _failures(store, "shared", 0) == 1


def test_least_recently_used_tasks_are_evicted_beyond_max_tasks() -> None:
    """With max_tasks=3 the oldest task's ledger and budget go; the newest stay."""
    store = MemoryStore(max_tasks=3)
    for task in "abcd":
        store.put_ledger(LedgerEntry(task=task, call_id=f"{task}1", tool="pay", fingerprint="f",
                                     idempotency_key=f"k{task}", args={},
                                     effect=Outcome.APPLIED))
    assert store.ledger("a") == [] and store.ledger_entry("a", "ka") is None
    assert [e.call_id for e in store.ledger("d")] == ["d1"]
    assert store.ledger_entry("b", "kb") is not None


def test_idle_tasks_expire_after_ttl() -> None:
    """A task untouched for longer than ttl_seconds is forgotten at the next use of the store."""
    store = MemoryStore(ttl_seconds=0.05)
    _fail(store, "idle", 0)
    time.sleep(0.1)
    _fail(store, "busy", 0)
    assert _failures(store, "busy", 0) == 1
    assert _failures(store, "idle", 0) == 0


def test_held_idempotency_keys_survive_eviction() -> None:
    """Evicting a task never frees a key an attempt still holds."""
    store = MemoryStore(max_tasks=1)
    assert store.acquire("a", "key", 60.0)
    _fail(store, "b", 0)
    assert not store.acquire("a", "key", 60.0)


def test_a_long_lived_guard_has_bounded_memory() -> None:
    """20,000 conversations through one guard hold no more than ~max_tasks of state."""
    store = MemoryStore(max_tasks=100)
    guard = Guard(store=store, scan_env_secrets=False)

    @guard.tool
    def lookup(n: int) -> int:
        if n < 0:
            raise ValueError("n must not be negative")
        return n

    def run(conversations: range) -> None:
        for i in conversations:
            scope = guard.scoped(f"conversation-{i}")
            scope.call("lookup", {"n": -1})
            scope.new_turn()
            scope.call("lookup", {"n": -2})

    run(range(200))
    tracemalloc.start()
    first, _ = tracemalloc.get_traced_memory()
    run(range(200, 2_200))
    middle, _ = tracemalloc.get_traced_memory()
    run(range(2_200, 20_200))
    last, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    # 9x more conversations must not cost anywhere near 9x more memory.
    assert last - first < 3 * max(middle - first, 64 * 1024)
    assert len(store._tasks) <= 100


def test_bounds_are_validated() -> None:
    """Nonsense bounds are refused at construction."""
    with pytest.raises(ValueError, match="ttl_seconds"):
        MemoryStore(ttl_seconds=0)
    with pytest.raises(ValueError, match="max_tasks"):
        MemoryStore(max_tasks=0)
    with pytest.raises(ValueError, match="max_turns"):
        MemoryStore(max_turns=0)


def test_a_finished_task_leaves_nothing_behind_once_evicted() -> None:
    """Beyond max_tasks, tasks that failed, spent and wrote a ledger free all of their state."""
    store = MemoryStore(max_tasks=10, max_turns=20)

    def task(i: int) -> None:
        name = f"task-{i}"
        for turn in range(2):
            _fail(store, name, turn)
        store.put_ledger(LedgerEntry(task=name, call_id=f"c{i}", tool="pay", fingerprint="f",
                                     idempotency_key=f"k{i}", args={}, effect=Outcome.APPLIED))

    for i in range(200):
        task(i)
    tracemalloc.start()  # the first window re-allocates the live state: a constant
    for i in range(200, 1200):
        task(i)
    first, _ = tracemalloc.get_traced_memory()
    for i in range(1200, 2200):
        task(i)
    second, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert len(store._tasks) <= 10 and len(store._turns) <= 20
    assert (second - first) / 1000 < 16  # bytes per finished task: nothing accumulates
