"""SQLiteStore on a real file: durability across crashes, reopening and several processes."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from _replay import assert_replay_is_answered_from_the_ledger
from _requests import request

from toolfault import Guard, Incident, IncidentKind, LedgerEntry, Limits, Outcome
from toolfault.stores import CallKey, SQLiteStore

WORKER = Path(__file__).with_name("_worker.py")


def test_sigkilled_worker_leaves_an_in_flight_ledger_entry(tmp_path: Path) -> None:
    """A process killed mid-call leaves a ledger entry a new guard reads as in flight."""
    db, marker = tmp_path / "state.db", tmp_path / "ran"
    proc = subprocess.Popen([sys.executable, str(WORKER), "hang", "sqlite", str(db), "-",
                             str(marker)], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    while not marker.exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline
        time.sleep(0.01)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)
    assert proc.returncode == -signal.SIGKILL

    guard = Guard(store=SQLiteStore(db), task_id="t1")
    (found,) = guard.ledger
    assert (found.tool, found.args) == ("book_seat", {"seat": "12A"})
    assert found.in_flight
    assert found.effect is Outcome.UNKNOWN

    ran: list[str] = []

    @guard.tool(side_effect=True)
    def book_seat(seat: str) -> str:
        ran.append(seat)
        return "booked"

    again = guard.call("book_seat", {"seat": "12A"})
    assert not again.ok and again.code in ("in_progress", "effect_unknown")
    assert ran == []
    guard.close()


def test_workers_sharing_a_task_keep_separate_ledger_entries(tmp_path: Path) -> None:
    """Side effects of two worker processes in one task are two ledger entries, not one."""
    db = tmp_path / "state.db"
    for seat in ("1A", "2B"):
        done = subprocess.run([sys.executable, str(WORKER), "book_once", "sqlite", str(db), "-",
                               seat], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
    store = SQLiteStore(db)
    assert sorted(e.args["seat"] for e in store.ledger("t1")) == ["1A", "2B"]
    store.close()


def test_state_survives_reopening(tmp_path: Path) -> None:
    """Counters, spend, held keys, ledger and incidents are all still there in a new handle."""
    db = tmp_path / "state.db"
    key = CallKey("t1", 0, "fp")
    first = SQLiteStore(db)
    first.admit(request(key, cost=2.5))
    first.record_failure(key, "invalid_argument", 1)
    first.acquire("t1", "tok", 60)
    ledger = LedgerEntry("c1", "t1", "book", "fp", "k", {"seat": "1A"}, Outcome.UNKNOWN)
    incident = Incident(IncidentKind.RETRY_CAP, "book", "invalid_argument", "cap", "t1", 0)
    first.put_ledger(ledger)
    first.add_incident(incident)
    first.close()

    second = SQLiteStore(db)
    adm = second.admit(request(key, cost=1.0))
    assert adm.blocked and adm.calls_in_turn == 2 and adm.spend == pytest.approx(2.5)
    assert not second.acquire("t1", "tok", 60)
    assert second.ledger("t1") == [ledger]
    assert second.incidents("t1") == [incident]
    second.close()


def test_wal_and_synchronous_are_set(tmp_path: Path) -> None:
    """The file is in WAL mode and connections commit with the requested synchronous level."""
    db = tmp_path / "state.db"
    store = SQLiteStore(db, synchronous="FULL")
    store.admit(request(CallKey("t", 0, "fp")))
    with sqlite3.connect(db) as other:
        assert other.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert store._connect().execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
    store.close()


def test_processes_share_one_spend_ceiling(tmp_path: Path) -> None:
    """Four processes racing on one file admit exactly as many paid calls as the budget allows."""
    db = tmp_path / "state.db"
    SQLiteStore(db).close()
    script = textwrap.dedent(f"""
        import sys
        from toolfault.stores import CallKey, Ceiling, Counter, AdmissionRequest
        from toolfault._admission import LazyFingerprint
        from toolfault.stores import SQLiteStore
        store = SQLiteStore({str(db)!r})
        ceilings = (Ceiling(Counter.SPEND_IN_TASK, 30.0),)
        ok = sum(store.admit(AdmissionRequest("t1", 0, LazyFingerprint(f"fp{{i}}"), 1.0, None,
                                              ceilings)).admitted for i in range(25))
        print(ok)
    """)
    procs = [subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(4)]
    admitted = []
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        admitted.append(int(out))
    assert sum(admitted) == 30
    last = SQLiteStore(db).admit(request(CallKey("t1", 0, "x")))
    assert last.calls_in_turn == 101
    assert last.spend == pytest.approx(30.0)


def test_rows_expire_after_the_ttl(tmp_path: Path) -> None:
    """Rows untouched for ttl_seconds are pruned; ttl_seconds=None keeps them."""
    db = tmp_path / "state.db"
    key = CallKey("t1", 0, "fp")
    store = SQLiteStore(db, ttl_seconds=None)
    store.record_failure(key, "bad", 1)
    store.put_ledger(LedgerEntry("c1", "t1", "book", "fp", "k", {}, Outcome.UNKNOWN))
    store.close()
    time.sleep(0.1)
    kept = SQLiteStore(db, ttl_seconds=None)
    assert kept.admit(request(key)).blocked
    assert len(kept.ledger("t1")) == 1
    kept.close()
    pruned = SQLiteStore(db, ttl_seconds=0.05)
    assert not pruned.admit(request(key)).blocked
    assert pruned.ledger("t1") == []
    pruned.close()


def test_closed_store_degrades_the_guard(tmp_path: Path) -> None:
    """A store that fails (here: closed underneath) degrades the guard instead of raising."""
    store = SQLiteStore(tmp_path / "state.db")
    guard = Guard(store=store, task_id="t1", state_failure="open",
                  limits=Limits(no_progress_repeats=None))  # the same lookup twice on purpose

    @guard.tool
    def lookup(city: str) -> str:
        return city.upper()

    assert guard.call("lookup", {"city": "oslo"}).ok and not guard.degraded
    store.close()
    assert guard.call("lookup", {"city": "oslo"}).text == "OSLO"
    assert guard.degraded
    assert IncidentKind.STATE_DEGRADED in [i.kind for i in guard.incidents]
    with pytest.raises(sqlite3.ProgrammingError):
        store.ledger("t1")


def test_bad_synchronous_is_refused(tmp_path: Path) -> None:
    """Only the two durable synchronous levels are accepted."""
    from toolfault import ConfigurationError

    with pytest.raises(ConfigurationError):
        SQLiteStore(tmp_path / "x.db", synchronous="OFF")  # type: ignore[arg-type]


def test_a_deleted_state_file_degrades_instead_of_splitting_state(tmp_path: Path) -> None:
    """Removing the SQLite file under a running guard is noticed: the guard degrades, loudly."""
    path = tmp_path / "state.db"
    guard = Guard(store=SQLiteStore(path), task_id="t", limits=Limits(no_progress_repeats=None))
    guard.tool(name="ping")(lambda: "pong")
    assert guard.call("ping", {}).ok
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    time.sleep(1.1)  # the file identity is checked at most once a second
    assert guard.call("ping", {}).ok
    assert guard.degraded
    assert IncidentKind.STATE_DEGRADED in [i.kind for i in guard.incidents]


def test_a_replayed_call_id_gets_its_answer_without_a_second_dispatch(tmp_path: Path) -> None:
    """A worker killed after its side effect succeeded: the resumed agent replays the same call
    id and gets the recorded answer; the tool does not run again."""
    db, marker = tmp_path / "state.db", tmp_path / "ran"
    proc = subprocess.run([sys.executable, str(WORKER), "effect_then_die", "sqlite", str(db),
                           "-", str(marker)], capture_output=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert marker.read_text() == "ran\n"

    assert_replay_is_answered_from_the_ledger(SQLiteStore(db))


def _count_writes(store: SQLiteStore) -> list[str]:
    """Record every statement this thread's connection runs (its write transactions)."""
    seen: list[str] = []
    store._connect().set_trace_callback(seen.append)
    return seen


def test_a_success_is_one_write_transaction(tmp_path: Path) -> None:
    """Admit + settle, repeated: one BEGIN IMMEDIATE each; the last settle is written at close."""
    store = SQLiteStore(tmp_path / "state.db", settle_delay=5.0)
    key = CallKey("t1", 0, "fp")
    warm = request(key, lease=30, limit=1)
    store.admit(warm)
    store.settle(warm)
    seen = _count_writes(store)
    for _ in range(10):
        one = request(key, cost=0.1, max_calls=100, max_spend=100.0, lease=30, limit=1)
        assert store.admit(one).admitted  # limit 1: the previous settle was carried first
        store.settle(one)
    assert [s for s in seen if s.startswith("BEGIN")] == ["BEGIN IMMEDIATE"] * 10
    seen.clear()
    store.close()
    assert [s for s in seen if s.startswith("BEGIN")] == ["BEGIN IMMEDIATE"]
    with sqlite3.connect(tmp_path / "state.db") as db:
        assert db.execute("SELECT count(*) FROM pending").fetchone()[0] == 0


def test_a_deferred_settle_is_flushed_shortly_after(tmp_path: Path) -> None:
    """With no further admission, the background flush deletes the reservation soon after."""
    store = SQLiteStore(tmp_path / "state.db", settle_delay=0.05)
    one = request(CallKey("t1", 0, "fp"), lease=30, limit=1)
    store.admit(one)
    store.settle(one)
    other = SQLiteStore(tmp_path / "state.db")
    assert other.admit(request(CallKey("t1", 0, "fp"), lease=30, limit=1)).busy
    deadline = time.monotonic() + 2.0
    while time.monotonic() < deadline:
        with sqlite3.connect(tmp_path / "state.db") as db:
            if db.execute("SELECT count(*) FROM pending").fetchone()[0] == 0:
                break
        time.sleep(0.01)
    assert other.admit(request(CallKey("t1", 0, "fp"), lease=30, limit=1)).admitted
    store.close()
    other.close()


def test_a_failed_call_settles_at_once(tmp_path: Path) -> None:
    """After a failure the settle is written at once: another process's retry is not busy."""
    store = SQLiteStore(tmp_path / "state.db", settle_delay=60.0)
    other = SQLiteStore(tmp_path / "state.db", settle_delay=60.0)
    key = CallKey("t1", 0, "fp")
    one = request(key, lease=30, limit=2)
    assert store.admit(one).admitted
    store.record_failure(key, "timeout", 2)
    store.settle(one)
    assert other.admit(request(key, lease=30, limit=2)).admitted  # 1 failure + 0 running
    store.close()
    other.close()


def test_threads_of_one_process_queue_for_the_file(tmp_path: Path) -> None:
    """16 threads with a handle each, writing at once with a short busy_timeout, never see
    "database is locked": they queue on the process's lock for the file."""
    db = tmp_path / "state.db"
    SQLiteStore(db).close()
    errors: list[BaseException] = []
    barrier = threading.Barrier(16)

    def writer(n: int) -> None:
        store = SQLiteStore(db, busy_timeout=2.0)
        barrier.wait()
        try:
            for i in range(30):
                one = request(CallKey("t1", 0, f"fp{n}-{i}"), cost=0.01, lease=30, limit=2)
                store.admit(one)
                store.put_ledger(LedgerEntry(f"c{n}-{i}", "t1", "book", "fp", f"k{n}-{i}", {},
                                             Outcome.UNKNOWN))
                store.settle(one)
        except BaseException as exc:  # noqa: BLE001 - collected and asserted below
            errors.append(exc)
        finally:
            store.close()

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    check = SQLiteStore(db)
    assert len(check.ledger("t1")) == 16 * 30
    check.close()


def test_four_processes_hammering_one_file_never_fall_back(tmp_path: Path) -> None:
    """4 processes x 4 threads writing as fast as they can, with the default busy handling:
    no handle falls back to local counting (it did on "database is locked" before)."""
    db = tmp_path / "state.db"
    procs = [subprocess.Popen([sys.executable, str(WORKER), "hammer", "sqlite", str(db), "4",
                               "2.0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for _ in range(4)]
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=180)
        assert proc.returncode == 0, err
        results.append(json.loads(out.strip().splitlines()[-1])[0])
    assert [r["degraded"] for r in results] == [0] * 4, results
    assert all(r["calls"] > 0 for r in results)


def test_a_degradation_is_reported_in_the_shared_store(tmp_path: Path) -> None:
    """A guard that fell back to local counting writes its state_degraded incident into the
    file on recovery, where every worker and operator sees it."""
    db = tmp_path / "state.db"
    guard = Guard(store=SQLiteStore(db, busy_timeout=0.2), task_id="t1",
                  limits=Limits(no_progress_repeats=None))
    guard._shared.store._retry_after = 0.0
    guard.tool(name="ping")(lambda: "pong")
    assert guard.call("ping", {}).ok
    blocker = sqlite3.connect(db, isolation_level=None)
    blocker.execute("BEGIN EXCLUSIVE")  # another program holds the file
    try:
        assert guard.call("ping", {}).ok
        assert guard.degraded
    finally:
        blocker.execute("ROLLBACK")
        blocker.close()
    assert guard.call("ping", {}).ok and not guard.degraded
    other = SQLiteStore(db)
    assert [i.kind for i in other.incidents("t1")] == [IncidentKind.STATE_DEGRADED]
    other.close()
    guard.close()


def test_a_file_from_before_holders_gains_the_holder_column(tmp_path: Path) -> None:
    """A state file written before keys had holders opens, and its keys become
    holder-checked (a key held there before is released by whoever asks, as it was)."""
    path = tmp_path / "old.db"
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE held (task TEXT NOT NULL, token TEXT NOT NULL, "
                   "expires REAL NOT NULL, PRIMARY KEY (task, token)) WITHOUT ROWID")
        db.execute("INSERT INTO held VALUES ('t1', 'old', ?)", (time.time() + 30,))
    db.close()
    store = SQLiteStore(path)
    try:
        assert not store.acquire("t1", "old", 30, "me")
        store.release("t1", "old")
        assert store.acquire("t1", "old", 30, "me")
        store.release("t1", "old", "someone-else")
        assert not store.acquire("t1", "old", 30, "other")
        store.release("t1", "old", "me")
        assert store.acquire("t1", "old", 30, "other")
    finally:
        store.close()


def test_a_child_forked_while_a_thread_holds_the_store_lock_does_not_hang(
        tmp_path: Path, in_forked_child: Callable[..., bytes]) -> None:
    """A thread of the parent held the store's lock (connecting, settling) at the fork: that
    thread does not exist in the child, which still counts, writes and reads its ledger."""
    store = SQLiteStore(tmp_path / "s.db")
    key = CallKey("t1", 0, "f" * 64)
    assert store.admit(request(key, max_calls=5)).admitted

    def child() -> bool:
        admitted = store.admit(request(key, max_calls=5)).admitted
        store.put_ledger(LedgerEntry(call_id="c-child", task="t1", tool="pay",
                                     fingerprint="f" * 64, idempotency_key=None, args={},
                                     effect=Outcome.APPLIED))
        return admitted and store.ledger_call("t1", "c-child") is not None

    assert in_forked_child(child, holding=[store._lock], seconds=10.0) == b"1"
    assert store.ledger_call("t1", "c-child") is not None  # the same file, seen from here
    store.close()
