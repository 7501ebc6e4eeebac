"""Side effects: timeouts after dispatch are verified, never blindly repeated."""

from __future__ import annotations

import asyncio
import hashlib
import threading
import time
from typing import Any

from toolfault import Backoff, Guard, IncidentKind, Limits, Outcome, ToolContext

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
    again = guard.call("book_flight", ARGS)
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
