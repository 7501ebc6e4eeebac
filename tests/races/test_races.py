"""Side effects raced by threads, tasks and processes run at most once (0 duplicated trials)."""

from __future__ import annotations

import os
import signal
import socket
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from _harness import (
    StoreMaker,
    Tally,
    cancel_trials,
    cap_gather_trials,
    cap_thread_trials,
    gather_trials,
    outage_trials,
    process_trials,
    sequential_key_trials,
    thread_trials,
)
from _redis_server import RedisCluster, RedisServer, start_redis, start_redis_on

from toolfault import MemoryStore
from toolfault.stores import Store

TRIALS = 200


def sqlite_maker(path: Path) -> Callable[[], Store]:
    return StoreMaker("sqlite", str(path))


def redis_maker(url: str) -> Callable[[], Store]:
    return StoreMaker("redis", url, f"race{uuid.uuid4().hex[:8]}")


def check(tally: Tally, record: Callable[[Tally], None]) -> None:
    record(tally)
    print(tally.line())
    assert tally.duplicated == 0, tally.line()


@pytest.mark.parametrize("postcondition", [True, False], ids=["check", "nocheck"])
@pytest.mark.parametrize("workers", [2, 8])
def test_threads_on_one_memory_store(tmp_path: Path, record: Any, workers: int,
                                     postcondition: bool) -> None:
    """Threads racing one side effect on a shared MemoryStore never run it twice."""
    shared = MemoryStore()
    tally = thread_trials(f"threads-memory-{workers}w-{'check' if postcondition else 'nocheck'}",
                          lambda: shared, tmp_path, workers=workers, trials=TRIALS,
                          postcondition=postcondition)
    check(tally, record)


@pytest.mark.parametrize("postcondition", [True, False], ids=["check", "nocheck"])
@pytest.mark.parametrize("workers", [2, 8])
def test_processes_on_sqlite(tmp_path: Path, record: Any, workers: int,
                             postcondition: bool) -> None:
    """Processes racing one side effect on one SQLite file never run it twice."""
    effects = tmp_path / "effects"
    effects.mkdir()
    tally = process_trials(
        f"processes-sqlite-{workers}w-{'check' if postcondition else 'nocheck'}",
        sqlite_maker(tmp_path / "state.db"), effects, workers=workers, trials=TRIALS,
        postcondition=postcondition)
    check(tally, record)


@pytest.mark.parametrize("postcondition", [True, False], ids=["check", "nocheck"])
@pytest.mark.parametrize("workers", [2, 8])
def test_processes_on_redis(tmp_path: Path, record: Any, race_redis: RedisServer,
                            workers: int, postcondition: bool) -> None:
    """Processes racing one side effect on one Redis never run it twice."""
    tally = process_trials(
        f"processes-redis-{workers}w-{'check' if postcondition else 'nocheck'}",
        redis_maker(race_redis.url), tmp_path, workers=workers, trials=TRIALS,
        postcondition=postcondition)
    check(tally, record)


@pytest.mark.parametrize("kind", ["sqlite", pytest.param("redis")])
def test_threads_on_shared_stores(tmp_path: Path, record: Any, race_redis: RedisServer,
                                  kind: str) -> None:
    """Threads with a store handle each (SQLite file, Redis) never run a side effect twice."""
    effects = tmp_path / "effects"
    effects.mkdir()
    make = sqlite_maker(tmp_path / "state.db") if kind == "sqlite" else \
        redis_maker(race_redis.url)
    check(thread_trials(f"threads-{kind}-4w-check", make, effects, workers=4, trials=TRIALS,
                        postcondition=True), record)


@pytest.mark.parametrize("postcondition", [True, False], ids=["check", "nocheck"])
def test_gather_of_identical_acalls(tmp_path: Path, record: Any, postcondition: bool) -> None:
    """Identical acalls of a sync side effect in one asyncio.gather run it once."""
    check(gather_trials(f"gather-8-{'check' if postcondition else 'nocheck'}", tmp_path,
                        workers=8, trials=TRIALS, postcondition=postcondition), record)


@pytest.mark.parametrize("stalls", [False, True], ids=["", "stalls"])
@pytest.mark.parametrize("postcondition", [True, False], ids=["check", "nocheck"])
def test_cancelled_acall_then_retry(tmp_path: Path, record: Any, postcondition: bool,
                                    stalls: bool) -> None:
    """Cancelling acall while its sync side effect runs, then retrying, never runs it twice
    (also when a stalled event loop lets the cancel meet the tool's answer)."""
    name = f"cancel-retry-{'check' if postcondition else 'nocheck'}{'-stalls' if stalls else ''}"
    check(cancel_trials(name, tmp_path, trials=TRIALS, postcondition=postcondition,
                        stalls=stalls), record)


def test_gather_of_identical_failing_calls_respects_the_cap(record: Any) -> None:
    """250 (and 200 x 25) identical failing acalls in a gather dispatch at most the limit."""
    check(cap_gather_trials("cap-gather-250-limit2", calls=250, trials=1), record)
    check(cap_gather_trials("cap-gather-25-limit2", calls=25, trials=TRIALS), record)


def test_threads_making_identical_failing_calls_respect_the_cap(record: Any) -> None:
    """32 threads making one identical failing call each dispatch at most the limit."""
    check(cap_thread_trials("cap-threads-32-limit2", threads=32, trials=TRIALS), record)


#: Trials of the slower settings (outages, the cluster, explicit keys): 100 each in CI.
SLOW_TRIALS = int(os.environ.get("TOOLFAULT_RACES_SLOW_TRIALS", "100"))


def _send(port: int, command: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(command)
        return sock.recv(64)


def _wait_until_up(port: int) -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            if _send(port, b"PING\r\n").startswith(b"+PONG"):
                return
        except OSError:
            pass
        time.sleep(0.01)
    raise RuntimeError("redis did not answer again")


def _outage(kind: str, box: list[RedisServer]) -> tuple[Callable[[], None],
                                                         Callable[[], None]]:
    """down() and up() for one kind of outage of the server in ``box``."""
    if kind == "sigstop":
        def cont() -> None:
            box[0].proc.send_signal(signal.SIGCONT)
            _wait_until_up(box[0].port)

        return lambda: box[0].proc.send_signal(signal.SIGSTOP), cont
    if kind == "client-pause":
        until = [0.0]

        def pause() -> None:
            until[0] = time.monotonic() + 0.8
            _send(box[0].port, b"CLIENT PAUSE 800 ALL\r\n")

        def unpause() -> None:
            time.sleep(max(0.0, until[0] - time.monotonic()))
            _wait_until_up(box[0].port)

        return pause, unpause
    if kind == "debug-sleep":
        sleeper: list[threading.Thread] = []

        def sleep() -> None:
            t = threading.Thread(target=_send, args=(box[0].port, b"DEBUG SLEEP 0.8\r\n"))
            t.start()
            sleeper[:] = [t]
            time.sleep(0.01)

        def wake() -> None:
            sleeper[0].join()
            _wait_until_up(box[0].port)

        return sleep, wake
    assert kind == "restart"

    def kill() -> None:
        box[0].kill()

    def restart() -> None:  # empty: no persistence, so a new epoch
        box[0] = start_redis_on(box[0].port, "--enable-debug-command", "yes")

    return kill, restart


@pytest.mark.parametrize("policy", ["open", "closed"])
@pytest.mark.parametrize("delay", [0.05, 6.0], ids=["0.05s", "6s"])
@pytest.mark.parametrize("kind", ["sigstop", "client-pause", "debug-sleep", "restart"])
def test_outage_while_a_side_effect_is_in_flight(tmp_path: Path, record: Any, kind: str,
                                                 delay: float, policy: str) -> None:
    """Redis goes down (paused, asleep, or restarted without its data) while a side effect
    is in flight; retried by another process 0.05 s or 6 s after Redis answers again, fail-
    open or fail-closed, the action never runs twice."""
    server = start_redis("--enable-debug-command", "yes")
    box = [server]
    down, up = _outage(kind, box)
    try:
        check(outage_trials(f"outage-{kind}-{delay:g}s-{policy}", server.url, tmp_path,
                            down=down, up=up, trials=SLOW_TRIALS, delay=delay,
                            policy=policy), record)
    finally:
        if box[0].proc.poll() is None:
            box[0].proc.send_signal(signal.SIGCONT)
        box[0].kill()


@pytest.mark.parametrize("delay", [0.05, 6.0], ids=["0.05s", "6s"])
def test_restart_with_data_loss_after_explicit_key_successes(tmp_path: Path, record: Any,
                                                            delay: float) -> None:
    """Successes under explicit keys, then Redis restarts without its data: another process
    repeating them 0.05 s later is refused, 6 s later gets the replay (the worker that
    recorded them wrote its ledger again at the new epoch); nothing runs twice."""
    server = start_redis("--enable-debug-command", "yes")
    box = [server]
    down, up = _outage("restart", box)
    try:
        check(outage_trials(f"restart-data-loss-explicit-key-{delay:g}s", server.url,
                            tmp_path, down=down, up=up, trials=SLOW_TRIALS, delay=delay,
                            explicit=True), record)
    finally:
        box[0].kill()


@pytest.mark.parametrize("kind", ["sqlite", "redis", "redis-cluster"])
def test_explicit_key_repeats_after_success_in_sequence(
        tmp_path: Path, record: Any, kind: str, race_redis: RedisServer,
        race_cluster: RedisCluster) -> None:
    """The same successful call under an explicit key, three times in a row and then from a
    second worker, runs once."""
    make = sqlite_maker(tmp_path / "state.db") if kind == "sqlite" else \
        redis_maker(race_redis.url if kind == "redis" else race_cluster.url)
    effects = tmp_path / "effects"
    effects.mkdir()
    check(sequential_key_trials(f"explicit-key-sequential-{kind}", make, effects,
                                trials=SLOW_TRIALS), record)


@pytest.mark.parametrize("kind", ["sqlite", "redis", "redis-cluster"])
def test_explicit_key_raced_by_8_processes(tmp_path: Path, record: Any, kind: str,
                                           race_redis: RedisServer,
                                           race_cluster: RedisCluster) -> None:
    """8 processes racing a fast successful call under one explicit key run it once."""
    make = sqlite_maker(tmp_path / "state.db") if kind == "sqlite" else \
        redis_maker(race_redis.url if kind == "redis" else race_cluster.url)
    effects = tmp_path / "effects"
    effects.mkdir()
    check(process_trials(f"explicit-key-processes-{kind}-8w", make, effects, workers=8,
                         trials=SLOW_TRIALS, postcondition=False, explicit=True), record)


@pytest.mark.parametrize("postcondition", [True, False], ids=["check", "nocheck"])
def test_processes_on_a_redis_cluster(tmp_path: Path, record: Any,
                                      race_cluster: RedisCluster, postcondition: bool) -> None:
    """8 processes racing one side effect on a 3-master Redis Cluster (the URL of one node)
    never run it twice."""
    check(process_trials(
        f"processes-redis-cluster-8w-{'check' if postcondition else 'nocheck'}",
        redis_maker(race_cluster.url), tmp_path, workers=8, trials=SLOW_TRIALS,
        postcondition=postcondition), record)
