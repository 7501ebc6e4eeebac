"""A worker process for the multi-process store tests (run as a script, never collected).

Usage: ``python _worker.py MODE STORE TARGET PREFIX [EXTRA]`` where STORE is ``redis`` (TARGET
a URL) or ``sqlite`` (TARGET a file); for ``hammer`` PREFIX is the number of threads and
EXTRA the seconds.  Effects are counted in the shared backend itself, so
the parent can add up what actually ran across workers.  Prints one JSON list of results.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

from toolfault import Guard
from toolfault.stores import Store


def open_store(kind: str, target: str, prefix: str) -> Store:
    if kind == "redis":
        from toolfault.stores import RedisStore

        return RedisStore(target, prefix=prefix, socket_timeout=2.0)
    from toolfault.stores import SQLiteStore

    return SQLiteStore(target)


def barrier(target: str, prefix: str) -> Any:
    """Tell the parent this worker is ready, then wait for its go (so workers race)."""
    import redis

    client = redis.Redis.from_url(target)
    client.sadd(f"{prefix}:ready", str(time.time()))
    deadline = time.monotonic() + 30
    while not client.exists(f"{prefix}:go"):
        if time.monotonic() > deadline:
            raise SystemExit("no go from the parent")
        time.sleep(0.001)
    return client


def retry_cap(target: str, prefix: str, calls: int) -> list[dict[str, Any]]:
    guard = Guard(store=open_store("redis", target, prefix), task_id="t1")
    client = barrier(target, prefix)

    @guard.tool
    def charge(card: str) -> str:
        client.incr(f"{prefix}:runs")
        raise ValueError("card must be a valid card number")

    out = []
    for _ in range(calls):
        r = guard.call("charge", {"card": "4111"})
        out.append({"ok": r.ok, "code": r.code, "terminal": r.terminal, "blocked": r.blocked})
    guard.close()
    return out


def side_effect(target: str, prefix: str, calls: int) -> list[dict[str, Any]]:
    guard = Guard(store=open_store("redis", target, prefix), task_id="t1")
    client = barrier(target, prefix)
    effects = f"{prefix}:effects"

    def landed(args: dict[str, Any]) -> bool:
        return int(client.get(effects) or 0) >= 1

    @guard.tool(side_effect=True, postcondition=landed, timeout=0.2)
    def send_invoice(customer: str, amount: int) -> str:
        client.incr(effects)
        time.sleep(0.6)
        return "sent"

    out = []
    for _ in range(calls):
        r = guard.call("send_invoice", {"customer": "acme", "amount": 120})
        out.append({"ok": r.ok, "code": r.code, "outcome": r.outcome.value})
        time.sleep(0.05)
    guard.close()
    return out


def hang(kind: str, target: str, prefix: str, marker: str) -> list[dict[str, Any]]:
    guard = Guard(store=open_store(kind, target, prefix), task_id="t1")

    @guard.tool(side_effect=True, timeout=120)
    def book_seat(seat: str) -> str:
        with Path(marker).open("a") as f:
            f.write("ran\n")
        time.sleep(120)  # the parent kills us here, mid-call
        return "booked"

    guard.call("book_seat", {"seat": "12A"})
    return []


def book_once(kind: str, target: str, prefix: str, seat: str) -> list[dict[str, Any]]:
    guard = Guard(store=open_store(kind, target, prefix), task_id="t1")

    @guard.tool(side_effect=True)
    def book_seat(seat: str) -> str:
        return f"booked {seat}"

    r = guard.call("book_seat", {"seat": seat})
    guard.close()
    return [{"ok": r.ok, "code": r.code, "call_id": r.call_id}]


def effect_then_die(kind: str, target: str, prefix: str, marker: str) -> list[dict[str, Any]]:
    """Book with the model's call id, then die before the answer reaches the model."""
    import os
    import signal

    guard = Guard(store=open_store(kind, target, prefix), task_id="t1")

    @guard.tool(side_effect=True)
    def book_seat(seat: str) -> dict[str, str]:
        with Path(marker).open("a") as f:
            f.write("ran\n")
        return {"booking": "BK-7", "seat": seat}

    result = guard.call("book_seat", {"seat": "12A"}, call_id="toolu_01")
    assert result.ok, result.text
    os.kill(os.getpid(), signal.SIGKILL)  # the crash: the model never saw this answer
    return []


def hammer(target: str, threads: int, seconds: float) -> list[dict[str, Any]]:
    """Threads with a store handle each run guard-like steps (admission, side-effect
    bookkeeping, failures, settling) on one SQLite file as fast as they can; how many fell
    back to local counting, and how many steps ran."""
    import threading

    from toolfault import LedgerEntry, Outcome
    from toolfault._admission import LazyFingerprint
    from toolfault._degrading import DegradingStore
    from toolfault.stores import AdmissionRequest, CallKey, Ceiling, Counter, SQLiteStore

    degraded: list[str] = []
    done: list[int] = []
    ceilings = (Ceiling(Counter.IDENTICAL_RUNNING, 2), Ceiling(Counter.SPEND_IN_TASK, 1e9))

    def lane(n: int) -> None:
        store = DegradingStore(SQLiteStore(target),
                               on_degrade=lambda exc: degraded.append(repr(exc)))
        task, calls, end = f"hammer-{time.time_ns()}-{n}", 0, time.monotonic() + seconds
        while time.monotonic() < end:
            calls += 1
            key = CallKey(task, calls // 20, f"fp{calls % 7}")
            request = AdmissionRequest(task, key.turn, LazyFingerprint(key.fingerprint), 0.01,
                                       30.0, ceilings)
            store.admit(request)
            if calls % 5 == 0:  # a side effect: key, ledger entry, lookup, release
                token = f"k{calls}"
                store.acquire(task, token, 30)
                store.put_ledger(LedgerEntry(f"c{calls}", task, "tool", key.fingerprint, token,
                                             {}, Outcome.UNKNOWN))
                store.ledger_entry(task, token)
                store.release(task, token)
            if calls % 3 == 0:
                store.record_failure(key, "timeout", 3)
            store.settle(request)
        store.close()
        done.append(calls)

    pool = [threading.Thread(target=lane, args=(n,)) for n in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    return [{"degraded": len(degraded), "calls": sum(done), "errors": degraded[:1]}]


def main() -> None:
    mode, kind, target, prefix = sys.argv[1:5]
    extra = sys.argv[5] if len(sys.argv) > 5 else ""
    if mode == "retry_cap":
        result = retry_cap(target, prefix, int(extra))
    elif mode == "side_effect":
        result = side_effect(target, prefix, int(extra))
    elif mode == "book_once":
        result = book_once(kind, target, prefix, extra)
    elif mode == "effect_then_die":
        result = effect_then_die(kind, target, prefix, extra)
    elif mode == "hammer":
        result = hammer(target, int(prefix), float(extra))
    elif mode == "hang":
        result = hang(kind, target, prefix, extra)
    else:
        raise SystemExit(f"unknown mode {mode}")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
