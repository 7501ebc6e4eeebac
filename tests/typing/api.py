"""Type-checked by mypy in CI, never run by pytest: the public API as users write it."""

from __future__ import annotations

from typing import Any

from toolfault import Backoff, Catalog, Guard, Limits, Outcome, ToolError, ToolResult

guard = Guard(limits=Limits(retry_limit=3, max_calls_per_turn=50, backoff=Backoff()))


@guard.tool(alternatives=["search_flights_any_price"], normalize={"origin": "casefold"})
def search_flights(origin: str, destination: str, max_price: int) -> list[dict[str, Any]]:
    if max_price <= 0:
        raise ToolError("invalid_argument", "max_price must be greater than 0",
                        next_action="call search_flights again with max_price as a positive number")
    return []


@guard.tool
def ping() -> str:
    return "pong"


plain: list[dict[str, Any]] = search_flights("SFO", "JFK", 10)
result: ToolResult = guard.call("search_flights", {"origin": "SFO"})
flags: tuple[bool, bool, bool] = (result.ok, result.is_error, result.terminal)
halted: bool = result.halt
ladder = Limits(halt_after_refusals=2, max_tool_failures_per_turn=5, no_progress_repeats=5,
                progress_exempt=frozenset({"job_status"}), volatile_fields=frozenset({"ts"}),
                block_seconds=60.0, success_lifts_blocks=True)
code: str | None = result.code
outcome: Outcome = result.outcome
text: str = result.text
catalog: Catalog = Catalog.default()


async def use_async() -> ToolResult:
    return await guard.acall("ping", "{}")


def stores() -> None:
    from toolfault.stores import RedisStore, SQLiteStore, Store

    durable: Store = SQLiteStore("state.db")
    shared: Store = RedisStore("redis://127.0.0.1:6379/0")
    Guard(store=durable, state_failure="closed")
    Guard(store=shared, task_id="task-1")
    fleet: Store = RedisStore(["redis://10.0.0.1:7000/0", "redis://10.0.0.2:7000/0"],
                              reconcile_seconds=3.0)
    keyed = Guard(store=fleet, local_side_effects=["send_email"], idempotency_retention=3600)
    replayed: bool = keyed.call("book", {"ref": "X"}).replayed
    assert isinstance(replayed, bool)
    Guard(local_side_effects=True)


def admission() -> None:
    from toolfault.stores import (
        Admission,
        AdmissionRequest,
        Ceiling,
        Counter,
        Counters,
        KeyLocks,
        LazyFingerprint,
        MemoryStore,
        Records,
    )

    store = MemoryStore()
    counters: Counters = store
    locks: KeyLocks = store
    records: Records = store
    request = AdmissionRequest("task-1", 0, LazyFingerprint(lambda: "fp"), 0.5, 30.0,
                               (Ceiling(Counter.CALLS_IN_TURN, 10),))
    granted: Admission = counters.admit(request)
    counters.settle(request)
    held: bool = locks.acquire("task-1", "book:abc", 30.0)
    entries = records.ledger("task-1")
    print(granted.admitted, held, entries)
