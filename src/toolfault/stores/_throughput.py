"""What a store costs per guarded call, measured against calling the tool bare.

A plain function, not a timed test: timings depend on the machine, so they are reported
(``toolfault bench``, the benchmarks) rather than asserted.  Each row compares guarded
successful calls per second on one store with unguarded calls of the same function, measured
in the same run so the ratio is meaningful even on a noisy machine.
"""

from __future__ import annotations

import tempfile
import time
import uuid
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from toolfault._guard import Guard
from toolfault.stores._memory import MemoryStore
from toolfault.stores._protocol import Store


def lookup(city: str) -> str:
    """The measured tool: trivial, so the numbers are the guard's and the store's cost."""
    return city.upper()


def _rate(fn: Callable[[], object], seconds: float, batch: int) -> float:
    """Calls per second of ``fn`` over about ``seconds`` (timer read once per batch)."""
    fn()  # warm up: connections, script loading, caches
    calls = 0
    start = time.perf_counter()
    deadline = start + seconds
    while True:
        for _ in range(batch):
            fn()
        calls += batch
        now = time.perf_counter()
        if now >= deadline:
            return calls / (now - start)


def _guarded(store: Store) -> Guard:
    guard = Guard(store=store, task_id=f"bench-{uuid.uuid4().hex[:8]}", scan_env_secrets=False)
    guard.tool(cost=0.001)(lookup)
    return guard


def store_throughput(seconds: float = 1.0, *, redis_url: str | None = None
                     ) -> list[dict[str, Any]]:
    """Guarded calls/s for MemoryStore, SQLiteStore (temp file) and RedisStore (if a URL).

    Rows: ``store``, ``calls_per_second``, ``us_per_call``, ``ratio_vs_bare`` (guarded
    rate divided by the bare rate of the same function) and ``overhead_us`` (added per call).
    """
    from toolfault.stores._sqlite import SQLiteStore

    bare = _rate(lambda: lookup(city="oslo"), seconds, batch=1000)
    rows: list[dict[str, Any]] = [_row("bare", bare, bare)]
    with tempfile.TemporaryDirectory(prefix="toolfault-bench-") as tmp:
        stores: list[tuple[str, Callable[[], Store]]] = [
            ("memory", MemoryStore),
            ("sqlite", lambda: SQLiteStore(Path(tmp) / "state.db")),
        ]
        if redis_url is not None:
            from toolfault.stores._redis import RedisStore

            url = redis_url
            stores.append(("redis", lambda: RedisStore(
                url, prefix=f"toolfault-bench-{uuid.uuid4().hex[:8]}", ttl_seconds=300)))
        for name, make in stores:
            guard = _guarded(make())
            try:
                rate = _rate(partial(guard.call, "lookup", {"city": "oslo"}), seconds,
                             batch=20)
            finally:
                guard.close()
            rows.append(_row(name, rate, bare))
    return rows


def _row(store: str, rate: float, bare: float) -> dict[str, Any]:
    return {
        "store": store,
        "calls_per_second": round(rate, 1),
        "us_per_call": round(1e6 / rate, 2),
        "ratio_vs_bare": round(rate / bare, 6),
        "overhead_us": round(1e6 / rate - 1e6 / bare, 2),
    }
