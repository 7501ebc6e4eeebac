"""Real backends for the store tests: a temp SQLite file and a real ``redis-server`` process.

No mocks: the point of these stores is how they behave under real concurrency, crashes and
outages.  Without a ``redis-server`` binary the Redis tests skip locally but fail in CI
(``CI=true``), where ``.ci/run`` installs it, so a broken CI image cannot pass silently.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from _redis_server import RedisServer, seed_cluster_epoch, start_cluster, start_redis

from toolfault import MemoryStore
from toolfault.stores import Store


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    """A redis-server shared by the session's tests (each test uses its own key prefix)."""
    server = start_redis()
    yield server.url
    server.kill()


@pytest.fixture(scope="session")
def redis_cluster_url() -> Iterator[str]:
    """A 3-master Redis Cluster on loopback (``.ci/run`` starts one and names a node in
    ``TOOLFAULT_REDIS_CLUSTER_URL``; otherwise one of the session's own); the URL of one
    node, as a user gives it."""
    given = os.environ.get("TOOLFAULT_REDIS_CLUSTER_URL")
    if given:
        seed_cluster_epoch(given)
        yield given
        return
    cluster = start_cluster()
    yield cluster.url
    cluster.kill()


@pytest.fixture
def redis_server() -> Iterator[RedisServer]:
    """A redis-server of the test's own, for tests that kill it."""
    server = start_redis()
    yield server
    server.kill()


@pytest.fixture
def prefix() -> str:
    """A key prefix no other test uses, so tests sharing a server cannot see each other."""
    return f"tf{uuid.uuid4().hex[:10]}"


@pytest.fixture(params=[
    "memory",
    "sqlite",
    pytest.param("redis", marks=pytest.mark.redis),
    pytest.param("redis-cluster", marks=pytest.mark.redis),
])
def make_store(request: pytest.FixtureRequest, tmp_path: Path
               ) -> Iterator[Callable[[], Store]]:
    """Opens stores of one kind over the same backing state (same file / same prefix)."""
    opened: list[Store] = []
    memory = MemoryStore()
    kind = request.param
    db = tmp_path / "state.db"
    url = request.getfixturevalue("redis_url") if kind == "redis" else \
        request.getfixturevalue("redis_cluster_url") if kind == "redis-cluster" else ""
    key_prefix = f"tf{uuid.uuid4().hex[:10]}"

    def make() -> Store:
        store: Store
        if kind == "memory":
            return memory
        if kind == "sqlite":
            from toolfault.stores import SQLiteStore

            store = SQLiteStore(db)
        else:
            from toolfault.stores import RedisStore

            store = RedisStore(url, prefix=key_prefix)
        opened.append(store)
        return store

    yield make
    for store in opened:
        store.close()


@pytest.fixture
def store(make_store: Callable[[], Store]) -> Store:
    """One store of each kind, fresh for the test."""
    return make_store()
