"""Per-call cost of each store on the guard's hot path (pytest-benchmark; nothing asserted).

Run: ``pytest benchmarks/bench_stores.py --benchmark-enable`` (the Redis case starts its own
``redis-server`` on a free loopback port, and is skipped without the binary).  The bare case
is the same function called without a guard, for comparison in the same run.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from toolfault import Guard, MemoryStore
from toolfault.stores import SQLiteStore, Store
from toolfault.stores._throughput import lookup
from toolfault_cli.bench._store_overhead import redis_server


@pytest.fixture(scope="module")
def redis_url() -> Iterator[str]:
    """A throwaway redis-server for the benchmark (or ``TOOLFAULT_REDIS_URL``)."""
    with redis_server(None) as url:
        if url is None:
            pytest.skip("no redis-server could be started")
        yield url


def guarded(store: Store) -> Guard:
    guard = Guard(store=store, task_id=f"bench-{uuid.uuid4().hex[:8]}", scan_env_secrets=False)
    guard.tool(cost=0.001)(lookup)
    return guard


def run(benchmark: Any, guard: Guard) -> None:
    result = benchmark(guard.call, "lookup", {"city": "oslo"})
    assert result.ok
    guard.close()


def test_bare_call(benchmark: Any) -> None:
    """The tool called directly: the floor every store is compared with."""
    assert benchmark(lookup, city="oslo") == "OSLO"


def test_guarded_memory(benchmark: Any) -> None:
    """A guarded successful call on the in-process MemoryStore."""
    run(benchmark, guarded(MemoryStore()))


def test_guarded_sqlite(benchmark: Any, tmp_path: Path) -> None:
    """A guarded successful call on SQLiteStore (WAL, synchronous=NORMAL, temp file)."""
    run(benchmark, guarded(SQLiteStore(tmp_path / "state.db")))


def test_guarded_sqlite_full_sync(benchmark: Any, tmp_path: Path) -> None:
    """The same with synchronous=FULL: the price of surviving power loss, not just kill -9."""
    run(benchmark, guarded(SQLiteStore(tmp_path / "state.db", synchronous="FULL")))


def test_guarded_redis(benchmark: Any, redis_url: str) -> None:
    """A guarded successful call on RedisStore over loopback: one EVALSHA per call."""
    from toolfault.stores import RedisStore

    run(benchmark, guarded(RedisStore(redis_url, prefix=f"bench{uuid.uuid4().hex[:8]}")))
