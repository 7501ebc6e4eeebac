"""Side effects raced by threads, tasks and processes run at most once (0 duplicated trials)."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from _harness import Tally, process_trials, thread_trials
from _redis_server import RedisServer

from toolfault import MemoryStore, Store

TRIALS = 200


def sqlite_maker(path: Path) -> Callable[[], Store]:
    def make() -> Store:
        from toolfault.stores import SQLiteStore

        return SQLiteStore(path, busy_timeout=10.0)

    return make


def redis_maker(url: str) -> Callable[[], Store]:
    prefix = f"race{uuid.uuid4().hex[:8]}"

    def make() -> Store:
        from toolfault.stores import RedisStore

        return RedisStore(url, prefix=prefix, socket_timeout=5.0)

    return make


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
