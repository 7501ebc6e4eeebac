"""RedisStore against a real redis-server: a fleet of workers, crashes and outages.

Each test that needs isolation uses its own key prefix on the session's server; the tests
that kill the server start one of their own.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis
from _redis_server import RedisServer, free_port
from _replay import assert_replay_is_answered_from_the_ledger
from _requests import request

from toolfault import Guard, Incident, IncidentKind, LedgerEntry, Limits, Outcome
from toolfault.stores import CallKey, RedisStore

pytestmark = pytest.mark.redis

WORKER = Path(__file__).with_name("_worker.py")


def spawn(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, str(WORKER), *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def race(url: str, prefix: str, mode: str, calls: int, workers: int = 2
         ) -> list[list[dict[str, Any]]]:
    """Run ``workers`` worker processes released at the same instant; their results."""
    client = redis.Redis.from_url(url)
    procs = [spawn(mode, "redis", url, prefix, str(calls)) for _ in range(workers)]
    deadline = time.monotonic() + 60
    while client.scard(f"{prefix}:ready") < workers:
        assert time.monotonic() < deadline, "workers did not start"
        assert all(p.poll() is None for p in procs), [p.communicate() for p in procs]
        time.sleep(0.01)
    client.set(f"{prefix}:go", "1", ex=60)
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        results.append(json.loads(out.strip().splitlines()[-1]))
    return results


def test_two_workers_never_exceed_the_retry_cap(redis_url: str, prefix: str) -> None:
    """Two processes repeating one failing call in one task run the tool at most limit times."""
    results = race(redis_url, prefix, "retry_cap", calls=8)
    runs = int(redis.Redis.from_url(redis_url).get(f"{prefix}:runs") or 0)
    assert runs <= 2  # invalid_argument (bad input): 2 identical failures, then blocked
    assert runs >= 1
    for calls in results:
        assert not any(r["ok"] for r in calls)
        # in_progress: refused while the other worker's identical attempt was running (a
        # worker may use up all its calls that way when the other one starts slowly)
        # halted: a repeat after the terminal message ends the turn (blocked and terminal)
        assert {r["code"] for r in calls} <= {"invalid_argument", "in_progress", "halted"}
        assert calls[-1]["code"] in ("invalid_argument", "in_progress", "halted")
    assert any(calls[-1]["terminal"] and calls[-1]["blocked"] for calls in results)


def test_an_identical_call_in_flight_is_not_run_again(redis_url: str, prefix: str) -> None:
    """While a repeat of a failed call runs in one worker, the other worker does not run it."""
    store_a, store_b = (RedisStore(redis_url, prefix=prefix) for _ in range(2))
    guards = [Guard(store=s, task_id="t1") for s in (store_a, store_b)]
    a_running, b_ran = threading.Event(), threading.Event()
    runs: list[str] = []

    def charge_in(worker: str) -> Callable[[str], str]:
        def charge(card: str) -> str:
            runs.append(worker)
            if worker == "a" and len(runs) > 1:
                a_running.set()
                b_ran.wait(1.0)  # hold the attempt open while worker b decides
            else:
                b_ran.set()
            raise ValueError("card must be a valid card number")
        return charge

    guards[0].tool(name="charge")(charge_in("a"))
    guards[1].tool(name="charge")(charge_in("b"))
    assert guards[0].call("charge", {"card": "4111"}).code == "invalid_argument"  # 1 failure
    b_ran.clear()
    second = threading.Thread(target=guards[0].call, args=("charge", {"card": "4111"}))
    second.start()
    assert a_running.wait(5)
    seen_by_b = guards[1].call("charge", {"card": "4111"})
    second.join()
    for guard in guards:
        guard.close()
    assert runs.count("b") == 0, (runs, seen_by_b.code)
    assert len(runs) == 2
    assert seen_by_b.code == "in_progress"


def test_two_workers_do_not_duplicate_a_timed_out_side_effect(redis_url: str, prefix: str
                                                               ) -> None:
    """Two processes retrying a side effect that timed out after landing apply it once."""
    results = race(redis_url, prefix, "side_effect", calls=4)
    effects = int(redis.Redis.from_url(redis_url).get(f"{prefix}:effects") or 0)
    assert effects == 1
    codes = [r["code"] for calls in results for r in calls]
    assert not any(r["ok"] for calls in results for r in calls)
    assert "already_applied" in codes
    assert set(codes) <= {"already_applied", "in_progress"}


def test_sigkilled_worker_leaves_an_in_flight_ledger_entry(redis_url: str, prefix: str,
                                                           tmp_path: Path) -> None:
    """A worker killed mid-call leaves an entry a new guard reads as in flight, effect unknown."""
    marker = tmp_path / "ran"
    proc = spawn("hang", "redis", redis_url, prefix, str(marker))
    deadline = time.monotonic() + 60
    while not marker.exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline
        time.sleep(0.01)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)
    assert proc.returncode == -signal.SIGKILL

    guard = Guard(store=RedisStore(redis_url, prefix=prefix), task_id="t1")
    (found,) = guard.ledger
    assert found.tool == "book_seat" and found.args == {"seat": "12A"}
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
    assert marker.read_text() == "ran\n"
    guard.close()


def test_outage_fails_open(redis_server: RedisServer) -> None:
    """With state_failure="open" a dead Redis degrades to local counting and reports it."""
    guard = Guard(store=RedisStore(redis_server.url, socket_timeout=0.2), task_id="t1",
                  state_failure="open", limits=Limits(no_progress_repeats=None))

    @guard.tool
    def lookup(city: str) -> str:
        return city.upper()

    assert guard.call("lookup", {"city": "oslo"}).text == "OSLO"
    assert not guard.degraded
    redis_server.kill()
    start = time.monotonic()
    results = [guard.call("lookup", {"city": "oslo"}) for _ in range(3)]
    assert time.monotonic() - start < 2.0
    assert [r.text for r in results] == ["OSLO"] * 3
    assert guard.degraded
    kinds = [i.kind for i in guard.incidents]
    assert IncidentKind.STATE_DEGRADED in kinds
    guard.close()


def test_outage_fails_closed(redis_server: RedisServer) -> None:
    """With state_failure="closed" a dead Redis refuses the call with state_unavailable."""
    guard = Guard(store=RedisStore(redis_server.url, socket_timeout=0.2), task_id="t1",
                  state_failure="closed")
    ran: list[str] = []

    @guard.tool
    def lookup(city: str) -> str:
        ran.append(city)
        return city.upper()

    assert guard.call("lookup", {"city": "oslo"}).ok
    redis_server.kill()
    start = time.monotonic()
    result = guard.call("lookup", {"city": "oslo"})
    assert time.monotonic() - start < 2.0
    assert not result.ok
    assert result.code == "state_unavailable"
    assert ran == ["oslo"]
    guard.close()


def test_unreachable_server_raises_quickly() -> None:
    """Nothing listening: a store call raises within the socket timeout instead of hanging."""
    store = RedisStore(f"redis://127.0.0.1:{free_port()}/0", socket_timeout=0.2)
    start = time.monotonic()
    with pytest.raises(redis.ConnectionError):
        store.admit(request(CallKey("t", 0, "fp")))
    assert time.monotonic() - start < 1.0


def exercise(store: RedisStore, task: str) -> None:
    key = CallKey(task, 0, "fp")
    store.admit(request(key, cost=1.5, max_calls=10, max_spend=100.0))
    store.record_failure(key, "bad", 3)
    store.admit(request(CallKey(task, 0, "fp2")))
    store.refund(task, 0.5)
    store.acquire(task, "tok", 30)
    store.put_ledger(LedgerEntry("c1", task, "book", "fp", "k", {}, Outcome.UNKNOWN))
    store.add_incident(Incident(IncidentKind.RETRY_CAP, "book", "bad", "d", task, 0))


def test_every_key_has_a_ttl_and_one_slot(redis_url: str, prefix: str) -> None:
    """All of a task's keys expire and hash to one cluster slot, whatever the task id."""
    from redis.crc import key_slot

    store = RedisStore(redis_url, prefix=prefix, ttl_seconds=600)
    client = redis.Redis.from_url(redis_url)
    for task in ("t1", "a{b}c", "x:y"):
        exercise(store, task)
    keys = sorted(client.scan_iter(match=f"{prefix}:*"))
    # fail, calls, spend, held, ledger, ledger order, ledger by key, incidents
    assert len(keys) == 3 * 8
    for k in keys:
        assert 0 < client.pttl(k) <= 600_000, k
    slots: dict[str, set[int]] = {}
    for k in keys:
        tag = k.split(b"{", 1)[1].split(b"}", 1)[0].decode()
        slots.setdefault(tag, set()).add(key_slot(k))
    assert len(slots) == 3
    assert all(len(s) == 1 for s in slots.values())
    store.close()


def client_commands(url: str, action: Callable[[], object]) -> list[str]:
    """The commands clients sent to the server while ``action`` ran (MONITOR; script
    internals excluded)."""
    watcher = redis.Redis.from_url(url, decode_responses=True)
    sentinel = f"done-{time.time_ns()}"
    seen = []
    with watcher.monitor() as monitor:
        action()
        poke = redis.Redis.from_url(url)
        poke.echo(sentinel)
        for event in monitor.listen():
            if event["command"] == f"ECHO {sentinel}":
                break
            if event["client_type"] != "lua":
                seen.append(event["command"].split()[0])
        poke.close()
    watcher.close()
    return [c for c in seen if c != "HELLO"]  # the poking client's own handshake


def test_admit_is_one_round_trip(redis_url: str, prefix: str) -> None:
    """A store admission is exactly one EVALSHA, whatever ceilings are set."""
    store = RedisStore(redis_url, prefix=prefix)
    key = CallKey("t1", 0, "fp")
    store.admit(request(key))  # connects, loads the script

    def admits() -> None:
        for _ in range(10):
            store.admit(request(key, cost=0.1, max_calls=100, max_spend=100.0))

    assert client_commands(redis_url, admits) == ["EVALSHA"] * 10
    store.close()


def test_a_guarded_success_is_one_round_trip(redis_url: str, prefix: str) -> None:
    """A successful guarded call costs one Redis command: its settle rides on the next one."""
    guard = Guard(store=RedisStore(redis_url, prefix=prefix, settle_delay=5.0), task_id="t1",
                  limits=Limits(no_progress_repeats=None))  # oslo twice: not a no-progress test

    @guard.tool(cost=0.01)
    def lookup(city: str) -> str:
        return city.upper()

    guard.call("lookup", {"city": "oslo"})

    def calls() -> None:
        for city in ("oslo", "rome", "oslo"):
            assert guard.call("lookup", {"city": city}).ok

    assert client_commands(redis_url, calls) == ["EVALSHA"] * 3
    guard.close()


def test_a_store_success_is_one_round_trip(redis_url: str, prefix: str) -> None:
    """Admit + settle, repeated: one EVALSHA each; the last settle goes out at close."""
    store = RedisStore(redis_url, prefix=prefix, settle_delay=5.0)
    client = redis.Redis.from_url(redis_url)
    key = CallKey("t1", 0, "fp")
    warm = request(key, lease=30, limit=1)
    store.admit(warm)  # connects, loads the script
    store.settle(warm)

    def successes() -> None:
        for _ in range(10):
            one = request(key, cost=0.1, max_calls=100, max_spend=100.0, lease=30, limit=1)
            assert store.admit(one).admitted  # limit 1: the previous settle landed first
            store.settle(one)

    assert client_commands(redis_url, successes) == ["EVALSHA"] * 10
    assert client.zcard(store.key("t1", "pending", 0, "fp")) == 1  # the last, deferred
    assert client_commands(redis_url, store.close) == ["ZREM"]
    assert client.zcard(store.key("t1", "pending", 0, "fp")) == 0


def test_a_deferred_settle_is_flushed_shortly_after(redis_url: str, prefix: str) -> None:
    """With no further admission, the background flush drops the reservation within about
    settle_delay."""
    store = RedisStore(redis_url, prefix=prefix, settle_delay=0.05)
    client = redis.Redis.from_url(redis_url)
    one = request(CallKey("t1", 0, "fp"), lease=30, limit=1)
    store.admit(one)
    store.settle(one)
    pending = store.key("t1", "pending", 0, "fp")
    assert client.zcard(pending) == 1
    deadline = time.monotonic() + 2.0
    while client.zcard(pending) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert client.zcard(pending) == 0
    store.close()


def test_a_deferred_settle_never_lets_another_worker_past_the_cap(redis_url: str,
                                                                  prefix: str) -> None:
    """Another worker's identical call is at most briefly busy, never admitted past the cap."""
    one = RedisStore(redis_url, prefix=prefix, settle_delay=0.05)
    two = RedisStore(redis_url, prefix=prefix, settle_delay=0.05)
    key = CallKey("t1", 0, "fp")
    first = request(key, lease=30, limit=1)
    assert one.admit(first).admitted
    assert two.admit(request(key, lease=30, limit=1)).busy  # still running
    one.settle(first)
    assert two.admit(request(key, lease=30, limit=1)).busy  # settled, not yet sent: busy
    time.sleep(0.3)
    assert two.admit(request(key, lease=30, limit=1)).admitted
    assert one.admit(request(key, lease=30, limit=1)).busy  # two holds it now
    one.close()
    two.close()


def test_scripts_survive_a_script_flush(redis_url: str, prefix: str) -> None:
    """A server that forgot the scripts (restart, failover) gets them again transparently."""
    store = RedisStore(redis_url, prefix=prefix)
    key = CallKey("t1", 0, "fp")
    store.admit(request(key))
    redis.Redis.from_url(redis_url).script_flush()
    assert store.record_failure(key, "bad", 1) == 1
    assert store.admit(request(key)).blocked
    store.close()


def test_given_client_is_used_and_left_open(redis_url: str, prefix: str) -> None:
    """A caller's client (e.g. with decoded responses) works and is not closed by the store."""
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    store = RedisStore(prefix=prefix, client=client)
    store.record_failure(CallKey("t1", 0, "fp"), "invalid_argument:x", 1)
    adm = store.admit(request(CallKey("t1", 0, "fp"), cost=0.5))
    assert adm.blocked and adm.last_code == "invalid_argument:x"
    store.put_ledger(LedgerEntry("c1", "t1", "book", "fp", "k", {"a": 1}, Outcome.APPLIED))
    assert store.ledger("t1")[0].args == {"a": 1}
    store.close()
    assert client.ping()


def test_prefix_must_not_carry_a_hash_tag() -> None:
    """A brace in the prefix would move every task into one slot, so it is refused."""
    from toolfault import ConfigurationError

    with pytest.raises(ConfigurationError):
        RedisStore(prefix="{shared}")


def test_outage_ledger_is_written_back_before_the_key_is_dispatched_again(
        redis_server: RedisServer) -> None:
    """Fail-open with local side effects opted in: a side effect recorded locally during an
    outage reaches Redis on recovery, before this worker or another dispatches it again."""
    def worker() -> Guard:
        guard = Guard(store=RedisStore(redis_server.url, socket_timeout=0.2), task_id="t1",
                      state_failure="open", scan_env_secrets=False,
                      local_side_effects=["refund"])
        guard._shared.store._retry_after = 0.0  # try Redis again at the next call

        @guard.tool(side_effect=True)
        def refund(order: str) -> str:
            runs.append(order)
            raise TimeoutError("payment gateway timed out")  # after the refund went out

        return guard

    runs: list[str] = []
    a, b = worker(), worker()
    redis_server.proc.send_signal(signal.SIGSTOP)
    try:
        first = a.call("refund", {"order": "A-1"})
    finally:
        redis_server.proc.send_signal(signal.SIGCONT)
    assert a.degraded and first.outcome is Outcome.UNKNOWN
    again = a.call("refund", {"order": "A-1"})
    assert not a.degraded
    assert again.code == "effect_unknown" and again.attempts == 0
    from_b = b.call("refund", {"order": "A-1"})
    assert from_b.code == "effect_unknown" and from_b.attempts == 0
    assert runs == ["A-1"]
    assert [e.call_id for e in b.ledger] == [first.call_id]
    a.close()
    b.close()


def test_a_replayed_call_id_gets_its_answer_without_a_second_dispatch(
        redis_url: str, prefix: str, tmp_path: Path) -> None:
    """A worker killed after its side effect succeeded: the resumed agent replays the same call
    id and gets the recorded answer; the tool does not run again."""
    marker = tmp_path / "ran"
    proc = spawn("effect_then_die", "redis", redis_url, prefix, str(marker))
    proc.communicate(timeout=120)
    assert proc.returncode == -signal.SIGKILL
    assert marker.read_text() == "ran\n"

    assert_replay_is_answered_from_the_ledger(RedisStore(redis_url, prefix=prefix))
