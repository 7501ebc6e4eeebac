"""What the state stores cost per call, in counts first: round trips, write transactions,
lookups that must not grow with the ledger, memory a finished task leaves behind.

Counts do not depend on the machine, so they are what a test can assert; the two timed
figures (ledger lookups) are reported as a ratio between sizes measured interleaved in one
run, never as absolute microseconds alone.  Each figure carries its target in the shape
``toolfault bench --overhead --json`` prints: ``label``, ``value``, ``limit``, ``unit``,
``met`` (``None`` when the figure could not be measured, with ``skipped`` saying why).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
import time
import tracemalloc
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from toolfault._admission import AdmissionRequest, CallKey, Ceiling, Counter, LazyFingerprint
from toolfault._errors import Outcome
from toolfault._records import Incident, IncidentKind, LedgerEntry
from toolfault.stores._memory import MemoryStore
from toolfault.stores._protocol import Store

#: Targets, from the issue: one round trip (Redis) and one write transaction (SQLite) per
#: successful call; ledger lookups O(1) in ledger size (20,000 entries within 2x of 10);
#: nothing left per finished task once MemoryStore evicted it.
ROUND_TRIPS_PER_SUCCESS = 1.0
WRITE_TRANSACTIONS_PER_SUCCESS = 1.0
LOOKUP_GROWTH = 2.0
BYTES_PER_FINISHED_TASK = 64.0

_CEILINGS = (Ceiling(Counter.IDENTICAL_RUNNING, 2), Ceiling(Counter.CALLS_IN_TURN, 1_000_000),
             Ceiling(Counter.SPEND_IN_TASK, 1e12))


def _request(task: str, turn: int, fp: str) -> AdmissionRequest:
    """What the guard asks of the store for one call of a tool with a cost and budgets."""
    return AdmissionRequest(task, turn, LazyFingerprint(fp), 0.001, 120.0, _CEILINGS)


def _figure(label: str, value: float | None, limit: float, unit: str,
            **details: Any) -> dict[str, Any]:
    return {"label": label, "value": None if value is None else round(value, 4),
            "limit": limit, "unit": unit, "met": None if value is None else value <= limit,
            **details}


def store_figures(*, successes: int = 200, ledger_sizes: tuple[int, int] = (10, 20_000),
                  tasks: int = 2_000, redis_url: str | None = None) -> dict[str, Any]:
    """Every store figure with its target (see the module docstring).

    ``redis_url``: a server to measure on; otherwise ``TOOLFAULT_REDIS_URL``, otherwise a
    ``redis-server`` started for the run if the binary is installed, otherwise skipped.
    """
    figures: dict[str, Any] = {}
    figures["redis_round_trips_per_success"] = redis_round_trips(successes, redis_url)
    figures["sqlite_write_transactions_per_success"] = sqlite_write_transactions(successes)
    small, big = ledger_sizes
    with tempfile.TemporaryDirectory(prefix="toolfault-bench-") as tmp:
        from toolfault.stores._sqlite import SQLiteStore

        for name, make in (("memory", MemoryStore),
                           ("sqlite", lambda: SQLiteStore(Path(tmp) / "ledger.db"))):
            store = make()
            try:
                figures[f"ledger_lookup_growth_{name}"] = ledger_lookup_growth(store, small, big)
            finally:
                store.close()
    figures["memory_bytes_per_finished_task"] = memory_per_finished_task(tasks)
    return figures


# -- Redis ---------------------------------------------------------------------------------


def redis_round_trips(successes: int, url: str | None = None) -> dict[str, Any]:
    """Round trips a successful call costs on Redis: admit + settle, as the guard does.

    Measured back to back (``settle_delay=5.0``: every settle rides on the next admission).
    At an agent's spacing (50 ms and more) with the default ``settle_delay`` a success costs
    two: the settle is flushed alone, on purpose, so another worker's identical call is not
    told ``in_progress`` for a call that already ended (docs/reliability.md, "Round trips per
    call").
    """
    label = "Redis round trips per successful call"
    try:
        import redis
    except ImportError:
        return _figure(label, None, ROUND_TRIPS_PER_SUCCESS, "round trips",
                       skipped="redis-py is not installed")
    with redis_server(url) as found:
        if found is None:
            return _figure(label, None, ROUND_TRIPS_PER_SUCCESS, "round trips",
                           skipped="no Redis reachable and no redis-server to start")
        from toolfault.stores._redis import RedisStore

        sent = [0]

        class Counting(redis.Connection):
            """Counts what goes over the socket: one send per command or pipeline."""

            def send_packed_command(self, command: Any, check_health: bool = True) -> None:
                sent[0] += 1
                super().send_packed_command(command, check_health)  # type: ignore[no-untyped-call]

        client = redis.Redis.from_url(found, connection_class=Counting, socket_timeout=2.0)
        store = RedisStore(client=client, prefix=f"tfbench{uuid.uuid4().hex[:8]}",
                           ttl_seconds=60, settle_delay=5.0)
        try:
            _successes(store, 5)  # connect, load the script
            before = sent[0]
            _successes(store, successes)
            during = sent[0] - before
            store.close()  # the last settle goes out here
            closing = sent[0] - before - during
        finally:
            client.close()
    return _figure(label, during / successes, ROUND_TRIPS_PER_SUCCESS, "round trips",
                   successes=successes, at_close=closing)


def _successes(store: Store, count: int) -> None:
    task = f"bench-{uuid.uuid4().hex[:8]}"
    for i in range(count):
        request = _request(task, 0, f"fp{i % 3}")
        store.admit(request)
        store.settle(request)


@contextlib.contextmanager
def redis_server(url: str | None) -> Iterator[str | None]:
    """A reachable server: the one given, ``TOOLFAULT_REDIS_URL``, or a temporary one."""
    url = url or os.environ.get("TOOLFAULT_REDIS_URL")
    if url:
        yield url
        return
    binary = shutil.which("redis-server")
    if binary is None:
        yield None
        return
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    proc = subprocess.Popen([binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                             "--appendonly", "no"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        yield f"redis://127.0.0.1:{port}/0" if _answers(port) else None
    finally:
        proc.kill()
        proc.wait(10)


def _answers(port: int, seconds: float = 5.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2) as s:
            s.sendall(b"PING\r\n")
            if s.recv(16).startswith(b"+PONG"):
                return True
        time.sleep(0.02)
    return False


# -- SQLite --------------------------------------------------------------------------------


def sqlite_write_transactions(successes: int) -> dict[str, Any]:
    """Write transactions a successful call costs on SQLite (``BEGIN IMMEDIATE`` traced)."""
    from toolfault.stores._sqlite import SQLiteStore

    with tempfile.TemporaryDirectory(prefix="toolfault-bench-") as tmp:
        store = SQLiteStore(Path(tmp) / "state.db", settle_delay=5.0)
        _successes(store, 5)
        begun: list[str] = []
        store._connect().set_trace_callback(
            lambda sql: begun.append(sql) if sql.startswith("BEGIN") else None)
        _successes(store, successes)
        during = len(begun)
        store.close()
        closing = len(begun) - during
    return _figure("SQLite write transactions per successful call", during / successes,
                   WRITE_TRANSACTIONS_PER_SUCCESS, "transactions", successes=successes,
                   at_close=closing)


# -- ledger lookups ------------------------------------------------------------------------


def ledger_lookup_growth(store: Store, small: int, big: int, *, rounds: int = 7,
                         lookups: int = 200) -> dict[str, Any]:
    """Lookup by idempotency key in a ledger of ``big`` entries over one of ``small``.

    Both ledgers live in the same store and are measured in interleaved rounds (best of
    ``rounds``), so the ratio holds on a noisy machine.
    """
    tasks = {size: f"ledger-{size}-{uuid.uuid4().hex[:6]}" for size in (small, big)}
    for size, task in tasks.items():
        _fill(store, task, size)
    best = {size: float("inf") for size in tasks}
    for _ in range(rounds):
        for size, task in tasks.items():
            keys = [f"key-{(i * 7919) % size}" for i in range(lookups)]
            start = time.perf_counter()
            for key in keys:
                if store.ledger_entry(task, key) is None:
                    raise AssertionError(f"ledger entry {key} not found")
            best[size] = min(best[size], (time.perf_counter() - start) / lookups)
    name = type(store).__name__
    return _figure(f"{name} ledger lookup by key, {big:,} entries / {small}",
                   best[big] / best[small],
                   LOOKUP_GROWTH, "×", at_small_us=round(best[small] * 1e6, 2),
                   at_big_us=round(best[big] * 1e6, 2), sizes=[small, big])


def _fill(store: Store, task: str, size: int) -> None:
    entries = [LedgerEntry(f"call-{i}", task, "pay", f"fp{i}", f"key-{i}", {"n": i},
                           Outcome.APPLIED, told="ok", at=1_000_000.0 + i) for i in range(size)]
    bulk: Callable[[list[LedgerEntry]], None] | None = getattr(store, "_put_ledger_many", None)
    if bulk is not None:  # SQLite: one transaction instead of ``size``
        bulk(entries)
        return
    for entry in entries:
        store.put_ledger(entry)


# -- MemoryStore ---------------------------------------------------------------------------


def memory_per_finished_task(tasks: int, *, max_tasks: int = 100) -> dict[str, Any]:
    """Bytes a MemoryStore keeps per task once the task was evicted (beyond ``max_tasks``).

    Each task: two turns of a call that failed twice, a successful call, a ledger entry and
    an incident.  Measured with tracemalloc after a warm-up past the bound.
    """
    store = MemoryStore(max_tasks=max_tasks, max_turns=max_tasks * 4)

    def run(start: int, stop: int) -> None:
        for n in range(start, stop):
            task = f"task-{n}"
            for turn in range(2):
                for fp in ("bad", "bad", "good"):
                    request = _request(task, turn, fp)
                    store.admit(request)
                    if fp == "bad":
                        store.record_failure(CallKey(task, turn, fp), "invalid_argument", 2)
                    store.settle(request)
            store.put_ledger(LedgerEntry(f"c{n}", task, "pay", "fp", f"k{n}", {"n": n},
                                         Outcome.APPLIED, told="ok"))
            store.add_incident(Incident(IncidentKind.RETRY_CAP, "pay", "invalid_argument",
                                        "cap", task, 0))

    # tracemalloc only sees blocks allocated after it started: the first window replaces the
    # live state allocated before (a constant); the slope over the second is what a
    # finished task leaves behind.
    start = max_tasks * 2
    run(0, start)
    tracemalloc.start()
    try:
        run(start, start + tasks)
        first, _ = tracemalloc.get_traced_memory()
        run(start + tasks, start + 2 * tasks)
        second, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return _figure("MemoryStore bytes kept per finished (evicted) task",
                   max(0, second - first) / tasks, BYTES_PER_FINISHED_TASK, "B",
                   tasks=tasks, live_tasks=len(store._tasks), live_bytes=first)
