"""Side effects: timeouts after dispatch are verified, never blindly repeated."""

from __future__ import annotations

import asyncio
import hashlib
import threading
import time
from typing import Any

import pytest

from toolfault import (
    Backoff,
    Guard,
    IncidentKind,
    LedgerEntry,
    Limits,
    MemoryStore,
    Outcome,
    ToolContext,
)

FAST = Backoff(attempts=3, initial=0.001, maximum=0.01, jitter=0.0)


class Airline:
    """A booking backend whose answer can be slower than the guard's timeout."""

    def __init__(self, delay: float = 0.0, fail_check: bool = False) -> None:
        self.bookings: list[str] = []
        self.delay = delay
        self.fail_check = fail_check
        self.lock = threading.Lock()

    def book(self, flight: str, passenger: str) -> dict[str, str]:
        with self.lock:
            self.bookings.append(f"{flight}/{passenger}")
        time.sleep(self.delay)
        return {"booking": f"BK{len(self.bookings)}"}

    def landed(self, args: dict[str, Any]) -> bool:
        if self.fail_check:
            raise ConnectionError("status api down")
        return f"{args['flight']}/{args['passenger']}" in self.bookings


def guarded(airline: Airline, **tool_kw: Any) -> Guard:
    guard = Guard(limits=Limits(backoff=FAST), scan_env_secrets=False)
    tool_kw.setdefault("postcondition", airline.landed)

    @guard.tool(side_effect=True, timeout=0.05, check_with="get_booking", **tool_kw)
    def book_flight(flight: str, passenger: str) -> dict[str, str]:
        """Book a seat. Use it once the user confirmed."""
        return airline.book(flight, passenger)

    @guard.tool
    def get_booking(flight: str) -> str:
        """Read bookings. Use it to check whether a booking exists."""
        return ",".join(airline.bookings)

    return guard


ARGS = {"flight": "UA1", "passenger": "Ada"}


def test_timeout_after_effect_landed_is_applied_and_not_retried() -> None:
    """A timeout whose effect landed is reported as applied; the tool is not called again."""
    airline = Airline(delay=0.2)
    guard = guarded(airline)
    result = guard.call("book_flight", ARGS)
    assert result.outcome is Outcome.APPLIED
    assert result.code == "already_applied"
    assert "Effect: applied. The action already happened; do not repeat it." in result.text
    assert "do not call book_flight again" in result.text
    assert airline.bookings == ["UA1/Ada"]
    again = guard.call("book_flight", ARGS)
    assert again.outcome is Outcome.APPLIED and again.attempts == 0
    assert airline.bookings == ["UA1/Ada"]
    (entry,) = guard.ledger
    assert entry.effect is Outcome.APPLIED and entry.confirmed_by == "postcondition"
    assert entry.told == "already_applied" and not entry.mismatch


def test_timeout_without_effect_is_retried() -> None:
    """A timeout whose postcondition says nothing landed is retried inside the wrapper."""
    airline = Airline()
    state = {"n": 0}
    guard = Guard(limits=Limits(backoff=FAST), scan_env_secrets=False)

    @guard.tool(side_effect=True, postcondition=airline.landed, timeout=0.05)
    def book_flight(flight: str, passenger: str) -> dict[str, str]:
        state["n"] += 1
        if state["n"] == 1:
            raise TimeoutError("the client gave up before the airline answered")
        return airline.book(flight, passenger)

    result = guard.call("book_flight", ARGS)
    assert result.ok and result.attempts == 2
    assert airline.bookings == ["UA1/Ada"]
    assert guard.ledger[-1].effect is Outcome.APPLIED


def test_postcondition_failure_stays_unknown_and_names_the_read_tool() -> None:
    """A failing check leaves the effect unknown, retries nothing and names the read tool."""
    airline = Airline(delay=0.2, fail_check=True)
    guard = guarded(airline)
    result = guard.call("book_flight", ARGS)
    assert result.outcome is Outcome.UNKNOWN and result.code == "effect_unknown"
    assert "Effect: unknown." in result.text
    assert "check whether it happened with get_booking" in result.text
    assert len(airline.bookings) == 1
    again = guard.call("book_flight", ARGS)  # the timed-out attempt still runs
    assert again.code == "in_progress" and again.attempts == 0
    assert len(airline.bookings) == 1


def test_failing_check_after_the_attempt_ended_stays_unknown() -> None:
    """Once the attempt ended without answering, a failing check still dispatches nothing."""
    airline = Airline(fail_check=True)
    guard = guarded(airline)

    @guard.tool(side_effect=True, postcondition=airline.landed)
    def pay(flight: str, passenger: str) -> str:
        airline.book(flight, passenger)
        raise TimeoutError("gateway timed out")

    assert guard.call("pay", ARGS).code == "effect_unknown"
    again = guard.call("pay", ARGS)
    assert again.code == "effect_unknown" and again.attempts == 0
    assert len(airline.bookings) == 1


def test_unknown_effect_without_postcondition_is_never_redispatched() -> None:
    """No postcondition: an identical call after an unknown outcome is refused, not repeated."""
    airline = Airline(delay=0.2)
    guard = guarded(airline, postcondition=None)
    first = guard.call("book_flight", ARGS)
    assert first.outcome is Outcome.UNKNOWN
    for _ in range(3):
        guard.call("book_flight", ARGS)
    assert len(airline.bookings) == 1


def test_model_retry_verifies_before_dispatch_and_flags_mismatch() -> None:
    """A later identical call is verified first; a landed effect told as failed is an incident."""
    airline = Airline(delay=0.2, fail_check=True)
    guard = guarded(airline)
    assert guard.call("book_flight", ARGS).outcome is Outcome.UNKNOWN
    airline.fail_check = False
    again = guard.call("book_flight", ARGS)
    assert again.outcome is Outcome.APPLIED and again.attempts == 0
    assert len(airline.bookings) == 1
    kinds = [i.kind for i in guard.incidents]
    assert IncidentKind.EFFECT_MISMATCH in kinds


def test_different_arguments_are_a_new_action() -> None:
    """Another passenger is another booking, even right after an unknown outcome."""
    airline = Airline(delay=0.2)
    guard = guarded(airline)
    guard.call("book_flight", ARGS)
    guard.call("book_flight", {**ARGS, "passenger": "Grace"})
    assert sorted(airline.bookings) == ["UA1/Ada", "UA1/Grace"]


def test_confirmed_success_allows_a_new_identical_action() -> None:
    """After a confirmed success an identical call is a new action (not deduplicated)."""
    airline = Airline()
    guard = guarded(airline)
    assert guard.call("book_flight", ARGS).ok
    assert guard.call("book_flight", ARGS).ok
    assert len(airline.bookings) == 2
    assert [e.told for e in guard.ledger] == ["ok", "ok"]


def test_idempotency_key_is_passed_and_concurrent_duplicates_refused() -> None:
    """The key reaches the tool via ctx; a concurrent call with the same key is in_progress."""
    guard = Guard(limits=Limits(backoff=FAST), scan_env_secrets=False)
    started = threading.Event()
    release = threading.Event()
    keys: list[str | None] = []

    @guard.tool(side_effect=True, idempotency_key=["order_id"])
    def charge(order_id: str, amount: int, ctx: ToolContext) -> str:
        keys.append(ctx.idempotency_key)
        started.set()
        release.wait(2)
        return "charged"

    results: list[Any] = []
    worker = threading.Thread(target=lambda: results.append(
        guard.call("charge", {"order_id": "o-1", "amount": 5})))
    worker.start()
    assert started.wait(2)
    second = guard.call("charge", {"order_id": "o-1", "amount": 7})
    release.set()
    worker.join(2)
    assert second.code == "in_progress" and second.outcome is Outcome.UNKNOWN
    assert "wait for the running call to finish" in second.text
    assert results[0].ok
    digest = hashlib.sha256(b"charge:order_id='o-1'").hexdigest()[:32]
    assert keys == [f"charge:{digest}"]  # a stable hash: no argument value in any store
    assert guard.call("charge", {"order_id": "o-2", "amount": 7}).ok


async def test_async_postcondition_and_async_tool() -> None:
    """Async tools time out with asyncio and async postconditions are awaited."""
    booked: list[str] = []
    guard = Guard(limits=Limits(backoff=FAST), scan_env_secrets=False)

    async def landed(args: dict[str, Any]) -> bool:
        await asyncio.sleep(0)
        return args["flight"] in booked

    @guard.tool(side_effect=True, postcondition=landed, timeout=0.05)
    async def book(flight: str) -> str:
        booked.append(flight)
        await asyncio.sleep(0.3)
        return "ok"

    result = await guard.acall("book", {"flight": "UA9"})
    assert result.outcome is Outcome.APPLIED and booked == ["UA9"]
    again = await guard.acall("book", {"flight": "UA9"})
    assert again.outcome is Outcome.APPLIED and booked == ["UA9"]


def test_raw_exception_in_side_effect_tool_is_unknown_in_ledger() -> None:
    """A crash mid side effect is recorded as effect unknown in the ledger."""
    guard = Guard(limits=Limits(backoff=FAST), scan_env_secrets=False)

    @guard.tool(side_effect=True)
    def transfer(amount: int) -> str:
        raise RuntimeError("half written")

    result = guard.call("transfer", {"amount": 3})
    assert result.code == "internal_error"
    assert result.outcome is Outcome.UNKNOWN
    assert "Effect: unknown." in result.text
    assert guard.ledger[-1].effect is Outcome.UNKNOWN
    assert guard.ledger[-1].told == "internal_error"


def test_still_running_attempt_is_not_retried_even_if_the_check_says_no() -> None:
    """While a timed-out attempt still runs, "not landed yet" is unknown: no retry, no duplicate."""
    airline = Airline()
    guard = Guard(limits=Limits(backoff=FAST), scan_env_secrets=False)
    release = threading.Event()

    @guard.tool(side_effect=True, postcondition=airline.landed, timeout=0.05)
    def book_flight(flight: str, passenger: str) -> dict[str, str]:
        release.wait(2)  # slow upstream: lands only after the guard gave up
        return airline.book(flight, passenger)

    first = guard.call("book_flight", ARGS)
    assert first.outcome is Outcome.UNKNOWN and first.attempts == 1
    retry = guard.call("book_flight", ARGS)
    assert retry.code == "in_progress" and retry.attempts == 0
    release.set()
    deadline = time.monotonic() + 2
    while not airline.bookings and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.05)
    after = guard.call("book_flight", ARGS)
    assert after.outcome is Outcome.APPLIED and after.attempts == 0
    assert airline.bookings == ["UA1/Ada"]


async def test_async_call_of_a_slow_sync_side_effect_is_not_duplicated() -> None:
    """acall of a sync side-effecting tool keeps its key while the orphaned attempt runs."""
    airline = Airline()
    guard = Guard(limits=Limits(backoff=FAST), scan_env_secrets=False)
    release = threading.Event()

    @guard.tool(side_effect=True, postcondition=airline.landed, timeout=0.05)
    def book_flight(flight: str, passenger: str) -> dict[str, str]:
        release.wait(2)
        return airline.book(flight, passenger)

    assert (await guard.acall("book_flight", ARGS)).outcome is Outcome.UNKNOWN
    assert (await guard.acall("book_flight", ARGS)).code == "in_progress"
    release.set()
    await asyncio.sleep(0.2)
    assert (await guard.acall("book_flight", ARGS)).outcome is Outcome.APPLIED
    assert airline.bookings == ["UA1/Ada"]


def test_hanging_postcondition_is_bounded() -> None:
    """A postcondition that hangs does not hold the call: the effect is reported unknown."""
    guard = Guard(limits=Limits(backoff=FAST), scan_env_secrets=False)
    never = threading.Event()

    @guard.tool(side_effect=True, postcondition=lambda args: never.wait(5), timeout=0.05)
    def send(to: str) -> str:
        raise TimeoutError("gateway timed out")

    started = time.monotonic()
    result = guard.call("send", {"to": "ada"})
    never.set()
    assert result.code == "effect_unknown"
    assert time.monotonic() - started < 4
    assert IncidentKind.POSTCONDITION_FAILED in [i.kind for i in guard.incidents]


def test_a_stale_check_cannot_let_a_second_worker_dispatch() -> None:
    """While one worker holds the key and checks, an identical call neither dispatches nor
    writes a verdict: the check and the dispatch happen under one claim."""
    store = MemoryStore()
    runs: list[str] = []
    landed: list[str] = []
    gate, checking = threading.Event(), threading.Event()
    checks = {"n": 0}

    def check(args: dict[str, Any]) -> bool:
        checks["n"] += 1
        if checks["n"] == 1:
            raise ConnectionError("status api down")  # the first call's own check
        if checks["n"] == 2:  # worker a's check before its retry: slow
            checking.set()
            gate.wait(5)
        return bool(landed)

    def worker(name: str) -> Guard:  # a retry limit high enough not to be what stops b
        guard = Guard(store=store, limits=Limits(retry_limit=5, backoff=FAST),
                      scan_env_secrets=False)

        @guard.tool(side_effect=True, postcondition=check)
        def pay(invoice: str) -> str:
            runs.append(name)
            if len(runs) == 1:
                raise TimeoutError("gateway timed out")  # nothing landed, nobody knows
            landed.append(name)
            return "paid"

        return guard

    a, b = worker("a"), worker("b")
    assert a.call("pay", {"invoice": "7"}).code == "effect_unknown"
    retry: list[Any] = []
    thread = threading.Thread(target=lambda: retry.append(a.call("pay", {"invoice": "7"})))
    thread.start()
    assert checking.wait(5)
    seen_by_b = b.call("pay", {"invoice": "7"})
    gate.set()
    thread.join()
    assert seen_by_b.code == "in_progress" and seen_by_b.attempts == 0
    assert retry[0].ok
    assert runs == ["a", "a"]
    after = b.call("pay", {"invoice": "7"})
    assert after.ok and runs == ["a", "a", "b"]  # after a confirmed success: a new action


async def test_cancelled_acall_keeps_the_key_until_the_thread_ends() -> None:
    """Cancelling acall mid side effect keeps refusing duplicates until the thread ends, then
    records the late success; CancelledError still reaches the caller."""
    airline = Airline()
    guard = Guard(limits=Limits(backoff=FAST), scan_env_secrets=False)
    started, release = threading.Event(), threading.Event()

    @guard.tool(side_effect=True, postcondition=airline.landed)
    def book_flight(flight: str, passenger: str) -> dict[str, str]:
        started.set()
        release.wait(5)
        return airline.book(flight, passenger)

    task = asyncio.ensure_future(guard.acall("book_flight", ARGS))
    while not started.is_set():
        await asyncio.sleep(0.001)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    again = await guard.acall("book_flight", ARGS)
    assert again.code == "in_progress" and again.attempts == 0
    release.set()
    for _ in range(500):
        if guard.ledger and guard.ledger[0].effect is Outcome.APPLIED:
            break
        await asyncio.sleep(0.01)
    (entry,) = guard.ledger
    assert entry.effect is Outcome.APPLIED and entry.confirmed_by == "late return"
    later = await guard.acall("book_flight", ARGS)
    assert later.outcome is Outcome.APPLIED and later.attempts == 0
    assert airline.bookings == ["UA1/Ada"]


async def test_stop_iteration_from_a_sync_tool_does_not_hang_acall() -> None:
    """A sync tool (or check) raising StopIteration gives acall a shaped failure, not a hang."""
    guard = Guard(limits=Limits(backoff=FAST), scan_env_secrets=False)

    @guard.tool
    def first_item(items: list[int]) -> int:
        return next(iter(items))

    def check(args: dict[str, Any]) -> bool:
        raise StopIteration

    @guard.tool(side_effect=True, timeout=0.05, postcondition=check)
    def push(item: int) -> str:
        raise TimeoutError("queue timed out")

    result = await asyncio.wait_for(guard.acall("first_item", {"items": []}), 30)
    assert not result.ok and result.code == "internal_error"
    pushed = await asyncio.wait_for(guard.acall("push", {"item": 1}), 30)
    assert pushed.code == "effect_unknown"
    assert guard.call("first_item", {"items": []}).code == "internal_error"


class _Unprintable:
    def __str__(self) -> str:
        raise RuntimeError("no name")

    def __bool__(self) -> bool:
        raise RuntimeError("no truth")


async def test_odd_names_and_call_ids_come_back_as_results() -> None:
    """A name or call id that cannot be turned into text is answered, never raised."""
    guard = Guard(scan_env_secrets=False)

    @guard.tool
    def ping() -> str:
        return "pong"

    for result in (guard.call(_Unprintable(), {}),  # type: ignore[arg-type]
                   await guard.acall(_Unprintable(), {}),  # type: ignore[arg-type]
                   guard.call("ping", {}, call_id=_Unprintable()),  # type: ignore[arg-type]
                   await guard.acall("ping", {}, call_id=_Unprintable())):  # type: ignore[arg-type]
        assert not result.ok and result.code == "internal_error"
    assert guard.call("ping", {}, call_id=7).call_id == "7"  # type: ignore[arg-type]


def test_hung_tools_do_not_starve_checks() -> None:
    """Tools hung past their timeout fill only their own pool: checks still run."""
    guard = Guard(limits=Limits(backoff=Backoff(attempts=1), max_tool_failures_per_turn=None),
                  scan_env_secrets=False)
    hang = threading.Event()
    checked: list[str] = []

    @guard.tool(timeout=0.01)
    def slow(n: int) -> str:
        hang.wait(10)
        return "late"

    def check(args: dict[str, Any]) -> bool:
        checked.append(args["to"])
        return False

    @guard.tool(side_effect=True, timeout=0.05, postcondition=check)
    def send(to: str) -> str:
        hang.wait(10)
        return "sent"

    try:
        for n in range(40):  # more hung calls than the tools pool has threads
            assert guard.call("slow", {"n": n}).code == "timeout"
        result = guard.call("send", {"to": "ada"})
        assert checked == ["ada"]
        assert result.outcome is Outcome.NO_EFFECT  # never started, and the check agrees
    finally:
        hang.set()
        guard.close()


async def test_identical_failing_acalls_in_one_gather_respect_the_cap() -> None:
    """250 identical failing acalls gathered at once dispatch at most the retry limit."""
    guard = Guard(limits=Limits(retry_limit=2, backoff=FAST), scan_env_secrets=False)
    runs: list[int] = []

    @guard.tool
    def charge(card: str) -> str:
        runs.append(1)
        time.sleep(0.05)
        raise ValueError("card must be a valid card number")

    results = await asyncio.gather(*(guard.acall("charge", {"card": "4111"})
                                     for _ in range(250)))
    assert len(runs) <= 2
    assert {r.code for r in results} <= {"invalid_argument", "in_progress"}
    assert sum(r.code == "invalid_argument" for r in results) == len(runs)


def test_identical_failing_calls_from_threads_respect_the_cap() -> None:
    """32 threads making the same failing call at once dispatch at most the retry limit."""
    guard = Guard(limits=Limits(retry_limit=2, backoff=FAST), scan_env_secrets=False)
    runs: list[int] = []
    barrier = threading.Barrier(32)

    @guard.tool
    def charge(card: str) -> str:
        runs.append(1)
        time.sleep(0.05)
        raise ValueError("card must be a valid card number")

    def one() -> None:
        barrier.wait()
        guard.call("charge", {"card": "4111"})

    threads = [threading.Thread(target=one) for _ in range(32)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert 1 <= len(runs) <= 2


class _CountingStore(MemoryStore):
    """A MemoryStore that counts full-ledger reads (the guard should look up by key)."""

    scans = 0

    def ledger(self, task: str) -> list[LedgerEntry]:
        self.scans += 1
        return super().ledger(task)


def test_pending_effects_are_looked_up_by_key_not_scanned() -> None:
    """Finding an earlier identical side effect reads one entry by key, not the ledger."""
    airline = Airline(delay=0.2)
    store = _CountingStore()
    guard = Guard(store=store, limits=Limits(backoff=FAST), scan_env_secrets=False)

    @guard.tool(side_effect=True, timeout=0.05, postcondition=airline.landed)
    def book_flight(flight: str, passenger: str) -> dict[str, str]:
        return airline.book(flight, passenger)

    for n in range(20):
        assert guard.call("book_flight", {"flight": f"UA{n}", "passenger": "Ada"}).code == \
            "already_applied"
    time.sleep(0.3)
    again = guard.call("book_flight", {"flight": "UA3", "passenger": "Ada"})
    assert again.code == "already_applied" and again.attempts == 0
    assert len(airline.bookings) == 20
    assert store.scans == 0


async def test_a_replayed_call_id_is_answered_from_the_ledger() -> None:
    """The same call id again (a resumed agent replaying its history) returns the recorded
    answer without a dispatch; a failure replayed is verified, never blindly repeated."""
    airline = Airline()
    guard = guarded(airline)
    first = guard.call("book_flight", ARGS, call_id="call_abc")
    assert first.ok and airline.bookings == ["UA1/Ada"]
    replay = await guard.acall("book_flight", ARGS, call_id="call_abc")
    assert replay.ok and replay.attempts == 0 and replay.text == first.text
    assert replay.data == first.data
    assert airline.bookings == ["UA1/Ada"]
    (entry,) = guard.ledger
    assert entry.told == "ok" and entry.told_text == first.text
    other = guard.call("book_flight", {**ARGS, "passenger": "Grace"}, call_id="call_abc")
    assert other.ok and len(airline.bookings) == 2  # same id, other arguments: not a replay

    slow = Airline(delay=0.2, fail_check=True)
    unsure = guarded(slow)
    told = unsure.call("book_flight", ARGS, call_id="call_x")
    assert told.code == "effect_unknown"
    time.sleep(0.3)
    again = unsure.call("book_flight", ARGS, call_id="call_x")
    assert not again.ok and again.attempts == 0 and len(slow.bookings) == 1


class _EarlierProtocolStore:
    """A store written to the earlier protocol: no keyed ledger reads or swaps."""

    def __init__(self) -> None:
        self.inner = MemoryStore()

    def __getattr__(self, name: str) -> Any:
        if name in ("ledger_entry", "ledger_call", "swap_ledger"):
            raise AttributeError(name)
        return getattr(self.inner, name)


def test_a_store_written_to_the_earlier_protocol_still_works() -> None:
    """A custom store without the newer methods neither degrades the guard nor loses dedup."""
    airline = Airline(delay=0.2)
    guard = Guard(store=_EarlierProtocolStore(), limits=Limits(backoff=FAST),  # type: ignore[arg-type]
                  scan_env_secrets=False)

    @guard.tool(side_effect=True, timeout=0.05, postcondition=airline.landed)
    def book_flight(flight: str, passenger: str) -> dict[str, str]:
        return airline.book(flight, passenger)

    assert guard.call("book_flight", ARGS).code == "already_applied"
    time.sleep(0.3)
    assert guard.call("book_flight", ARGS).code == "already_applied"
    assert airline.bookings == ["UA1/Ada"]
    assert not guard.degraded
