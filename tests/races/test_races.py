"""Side effects raced by threads, tasks and processes run at most once (0 duplicated trials)."""

from __future__ import annotations

import signal
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
    thread_trials,
)
from _redis_server import RedisServer, start_redis, start_redis_on

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


def test_redis_pause_during_a_side_effect(tmp_path: Path, record: Any) -> None:
    """A side effect recorded locally while Redis is paused (fail-open) is not run again
    after Redis answers again, by the same worker or another."""
    server = start_redis()
    try:
        check(outage_trials("redis-pause", server.url, tmp_path,
                            down=lambda: server.proc.send_signal(signal.SIGSTOP),
                            up=lambda: server.proc.send_signal(signal.SIGCONT),
                            trials=TRIALS), record)
    finally:
        server.proc.send_signal(signal.SIGCONT)
        server.kill()


def test_redis_restart_during_a_side_effect(tmp_path: Path, record: Any) -> None:
    """Redis killed and restarted empty while a side effect is recorded locally: the local
    ledger is written back on recovery, before the effect could be dispatched again."""
    server = start_redis()
    box = [server]

    def down() -> None:
        box[0].kill()

    def up() -> None:
        box[0] = start_redis_on(box[0].port)

    try:
        check(outage_trials("redis-restart", server.url, tmp_path, down=down, up=up,
                            trials=TRIALS), record)
    finally:
        box[0].kill()
