"""The ladder after the cap: blocks first, the halt only when the model keeps ignoring them.

Every test drives the real guard with a repeating "model" (a loop) and counts what the model
was told and how often the tool body ran.
"""

from __future__ import annotations

import asyncio
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from toolfault import Backoff, Guard, IncidentKind, Limits, ToolError, ToolResult
from toolfault.stores import Store

FAST = Backoff(attempts=1)


class Clock:
    """A hand-moved monotonic clock (no timed assertions)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def make(limits: Limits | None = None, **kw: Any) -> tuple[Guard, dict[str, int]]:
    ran = {"find_city": 0, "weather": 0, "book": 0}
    guard = Guard(limits=limits or Limits(backoff=FAST), scan_env_secrets=False, **kw)

    @guard.tool
    def find_city(name: str) -> str:
        ran["find_city"] += 1
        raise ToolError("not_found", f"no city named {name}", param="name")

    @guard.tool
    def weather(city: str) -> str:
        ran["weather"] += 1
        return f"sunny in {city}"

    @guard.tool(side_effect=True)
    def book(hotel: str) -> str:
        ran["book"] += 1
        raise ToolError("conflict", "the hotel is full")

    return guard, ran


def repeat(guard: Guard, n: int, name: str = "find_city",
           args: dict[str, Any] | None = None) -> list[ToolResult]:
    """A model that sends the same call until the loop sees ``halt`` (at most ``n`` times)."""
    told: list[ToolResult] = []
    for _ in range(n):
        result = guard.call(name, args if args is not None else {"name": "Atlantis"})
        told.append(result)
        if result.halt:
            break
    return told


def test_a_repeating_model_is_blocked_then_halted() -> None:
    """Repeating one failing call: four-part, terminal, the same terminal text again (not
    run), then the halt at the second refusal (cap + 2 calls; the body ran twice)."""
    guard, ran = make()
    told = repeat(guard, 50)
    assert [r.code for r in told] == ["not_found", "not_found", "not_found", "halted"]
    assert [r.terminal for r in told] == [False, True, True, True]
    assert told[2].blocked and not told[2].halt and told[2].text == told[1].text
    assert told[-1].halt and told[-1].blocked
    assert ran["find_city"] == 2
    assert told[-1].data["halt"] is True and told[-1].data["code"] == "halted"
    assert told[-1].text.splitlines()[-1] == (
        "Next action: stop calling tools and report to the user what was done and what failed.")
    assert "so this turn is over" in told[-1].text
    assert [i.kind for i in guard.incidents] == [IncidentKind.RETRY_CAP, IncidentKind.HALT]


def test_a_meaningful_change_after_a_block_is_let_through() -> None:
    """After the terminal message and one ignored block, a changed call runs: the behaviour
    the terminal message asks for is never refused before the halt."""
    guard, ran = make()
    told = repeat(guard, 3)
    assert [r.code for r in told] == ["not_found", "not_found", "not_found"]
    assert told[2].blocked and not told[2].halt
    changed = guard.call("find_city", {"name": "Atlantic City"})
    assert changed.code == "not_found" and not changed.blocked and not changed.halt
    assert ran["find_city"] == 3
    assert guard.call("weather", {"city": "Oslo"}).ok


def test_a_halted_turn_refuses_every_tool_until_new_turn() -> None:
    """After the halt, other tools are refused too and never run; new_turn() lifts it."""
    guard, ran = make()
    repeat(guard, 10)
    other = guard.call("weather", {"city": "Oslo"})
    assert other.halt and other.code == "halted" and ran["weather"] == 0
    assert "this turn is over because find_city was called again" in other.text
    assert len([i for i in guard.incidents if i.kind is IncidentKind.HALT]) == 1
    guard.new_turn()
    assert guard.call("weather", {"city": "Oslo"}).ok and ran["weather"] == 1


def test_halt_after_refusals_sets_the_rung() -> None:
    """halt_after_refusals=3 allows two blocked repeats with the terminal text before the halt."""
    guard, ran = make(Limits(backoff=FAST, halt_after_refusals=3))
    told = repeat(guard, 50)
    assert [r.code for r in told] == ["not_found"] * 4 + ["halted"]
    assert all(r.blocked and r.terminal and not r.halt for r in told[2:4])
    assert ran["find_city"] == 2


def test_refusals_count_across_calls_in_the_turn() -> None:
    """Two different blocked calls ignored once each halt the turn (the model keeps ignoring
    what it was told, whichever call it repeats)."""
    guard, _ = make()
    repeat(guard, 3, args={"name": "Atlantis"})
    assert not any(r.halt for r in repeat(guard, 3, args={"name": "Lemuria"})[:2])
    assert guard.call("find_city", {"name": "Lemuria"}).halt


def test_the_deprecated_name_still_sets_the_rung() -> None:
    """Limits(halt_after_terminal=N) is read as halt_after_refusals=N, with a warning."""
    with pytest.warns(DeprecationWarning, match="halt_after_terminal"):
        limits = Limits(halt_after_terminal=None)
    assert limits.halt_after_refusals is None


def test_never_halting_keeps_blocking() -> None:
    """halt_after_refusals=None blocks every further repeat and never halts."""
    guard, ran = make(Limits(backoff=FAST, halt_after_refusals=None))
    told = repeat(guard, 20)
    assert len(told) == 20 and not any(r.halt for r in told)
    assert all(r.blocked for r in told[2:]) and ran["find_city"] == 2


def test_one_tool_failing_five_times_in_a_row_is_blocked_for_the_turn() -> None:
    """The same tool failing with five different arguments is blocked (the fifth call's answer
    names it); other tools keep working; calling it again counts as a refusal."""
    guard, ran = make()
    told = [guard.call("find_city", {"name": f"Atlantis {i}"}) for i in range(5)]
    assert [r.code for r in told] == ["not_found"] * 4 + ["tool_blocked"]
    assert told[4].blocked and told[4].terminal and not told[4].halt
    assert "find_city failed 5 times in a row in this turn (last: not_found)" in told[4].text
    assert "blocked for the rest of this turn" in told[4].text
    assert ran["find_city"] == 5  # the fifth ran (and failed)
    assert guard.call("weather", {"city": "Oslo"}).ok  # the other tools still work
    again = guard.call("find_city", {"name": "Atlantis 9"})
    assert again.code == "tool_blocked" and ran["find_city"] == 5
    assert guard.call("find_city", {"name": "Atlantis 10"}).halt
    assert IncidentKind.TOOL_BLOCKED in [i.kind for i in guard.incidents]


def test_a_success_of_the_tool_resets_its_failures() -> None:
    """Five items, each a bad call then the corrected one: nothing blocked (the count is of
    failures in a row; a corrected mistake is not a strike)."""
    guard = Guard(limits=Limits(backoff=FAST), scan_env_secrets=False)

    @guard.tool
    def price(item: str, qty: int) -> str:
        if qty < 1:
            raise ToolError("invalid_argument", "qty must be at least 1", param="qty")
        return f"{qty} x {item}"

    told = []
    for item in ["a", "b", "c", "d", "e", "f"]:
        told += [guard.call("price", {"item": item, "qty": 0}),
                 guard.call("price", {"item": item, "qty": 2})]
    assert [r.ok for r in told] == [False, True] * 6
    assert not any(r.halt or r.blocked for r in told)


def test_per_tool_ceiling_is_configurable_and_can_be_off() -> None:
    """max_tool_failures_per_turn=2 blocks at the second failure; None never counts."""
    guard, _ = make(Limits(backoff=FAST, max_tool_failures_per_turn=2))
    assert guard.call("find_city", {"name": "a"}).code == "not_found"
    assert guard.call("find_city", {"name": "b"}).code == "tool_blocked"
    guard, ran = make(Limits(backoff=FAST, max_tool_failures_per_turn=None))
    told = [guard.call("find_city", {"name": f"x{i}"}) for i in range(12)]
    assert not any(r.halt or r.blocked for r in told) and ran["find_city"] == 12


def test_failures_of_other_tools_do_not_count_toward_one_tools_ceiling() -> None:
    """Four failures of one tool and a failure of another do not halt (the count is per tool)."""
    guard, _ = make()
    for i in range(4):
        guard.call("find_city", {"name": f"n{i}"})
    assert not guard.call("book", {"hotel": "Ritz"}).halt
    assert guard.call("weather", {"city": "Oslo"}).ok


def test_the_halt_of_a_side_effect_keeps_its_effect_verdict() -> None:
    """A tool blocked on a failure whose effect is unknown still says the effect is unknown."""
    guard = Guard(limits=Limits(backoff=FAST, max_tool_failures_per_turn=1),
                  scan_env_secrets=False)

    @guard.tool(side_effect=True)
    def pay(amount: int) -> str:
        raise TimeoutError("gateway timed out")

    result = guard.call("pay", {"amount": 5})
    assert result.code == "tool_blocked" and not result.halt
    assert "Effect: unknown." in result.text
    assert result.data["effect"] == "unknown"


def test_block_seconds_states_the_time_and_expires() -> None:
    """With block_seconds the terminal text states the window; after it the call runs again."""
    clock = Clock()
    guard, ran = make(Limits(backoff=FAST, block_seconds=60, halt_after_refusals=None),
                      clock=clock)
    _, terminal = repeat(guard, 2)
    assert "Retrying the same call is not allowed for the next 60 seconds." in terminal.text
    assert terminal.data["retry_after"] == 60
    clock.now += 45
    blocked = guard.call("find_city", {"name": "Atlantis"})
    assert blocked.blocked
    assert "not allowed for the next 15 seconds." in blocked.text
    assert ran["find_city"] == 2
    clock.now += 15
    again = guard.call("find_city", {"name": "Atlantis"})
    assert ran["find_city"] == 3 and not again.terminal  # the count started over


def test_block_seconds_also_lifts_a_halt() -> None:
    """A halted scope without turn boundaries (sessionless MCP) is open again after the window."""
    clock = Clock()
    guard, ran = make(Limits(backoff=FAST, block_seconds=30), clock=clock)
    halted = repeat(guard, 10)[-1]
    assert halted.halt
    assert "so calls are refused for the next 30 seconds." in halted.text
    assert halted.data["retry_after"] == 30
    clock.now += 29
    later = guard.call("weather", {"city": "Oslo"})
    assert later.halt and "Reason: calls are refused for the next 1 second because" in later.text
    clock.now += 1
    assert guard.call("weather", {"city": "Oslo"}).ok and ran["weather"] == 1
    assert guard.call("find_city", {"name": "Atlantis"}).code == "not_found"
    assert ran["find_city"] == 3


def test_a_success_of_another_tool_lifts_blocks_when_asked() -> None:
    """success_lifts_blocks: once another tool succeeds, the capped call may run again."""
    guard, ran = make(Limits(backoff=FAST, success_lifts_blocks=True,
                             halt_after_refusals=None))
    repeat(guard, 3)
    assert ran["find_city"] == 2
    assert guard.call("weather", {"city": "Oslo"}).ok
    result = guard.call("find_city", {"name": "Atlantis"})
    assert ran["find_city"] == 3 and result.code == "not_found" and not result.terminal


def test_without_the_option_a_success_elsewhere_keeps_the_block() -> None:
    """By default a success of another tool does not lift a block."""
    guard, ran = make(Limits(backoff=FAST, halt_after_refusals=None))
    repeat(guard, 3)
    assert guard.call("weather", {"city": "Oslo"}).ok
    assert guard.call("find_city", {"name": "Atlantis"}).blocked and ran["find_city"] == 2


def test_scopes_do_not_share_a_halt() -> None:
    """A halt in one conversation scope leaves another scope (and the parent) running."""
    guard, _ = make()
    alice, bob = guard.scoped("alice"), guard.scoped("bob")
    assert repeat(alice, 10)[-1].halt
    assert bob.call("weather", {"city": "Oslo"}).ok
    assert bob.call("find_city", {"name": "Atlantis"}).code == "not_found"
    assert not bob.call("find_city", {"name": "Atlantis"}).halt
    assert guard.call("weather", {"city": "Rome"}).ok
    assert alice.call("weather", {"city": "Rome"}).halt


def test_observe_mode_never_halts() -> None:
    """Observe mode reports what it would do but lets every call through."""
    guard, ran = make(mode="observe")
    told = [guard.call("find_city", {"name": "Atlantis"}) for _ in range(7)]
    assert not any(r.halt for r in told) and ran["find_city"] == 7
    assert [bool(r.failure and r.failure.halt) for r in told] == [False] * 7


def test_async_calls_halt_the_same_way() -> None:
    """acall follows the same ladder as call."""
    guard, ran = make()

    async def main() -> list[ToolResult]:
        return [await guard.acall("find_city", {"name": "Atlantis"}) for _ in range(5)]

    told = asyncio.run(main())
    assert [r.code for r in told] == ["not_found", "not_found", "not_found", "halted", "halted"]
    assert ran["find_city"] == 2


def test_run_tool_calls_reports_halt_per_item() -> None:
    """A batch after the halt gets the halt for every item, and the tools do not run."""
    guard, ran = make()
    repeat(guard, 10)
    results = guard.run_tool_calls([("weather", {"city": "Oslo"}),
                                    {"name": "find_city", "arguments": '{"name": "x"}'}])
    assert [r.halt for r in results] == [True, True]
    assert ran["weather"] == 0


# -- with the durable stores --------------------------------------------------------------
@pytest.fixture(params=["sqlite", pytest.param("redis", marks=pytest.mark.redis)])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    """A real SQLite file or a real redis-server."""
    if request.param == "sqlite":
        from toolfault.stores import SQLiteStore

        sqlite = SQLiteStore(tmp_path / "state.db")
        yield sqlite
        sqlite.close()
        return
    sys.path.insert(0, str(Path(__file__).parent / "stores"))
    try:
        from _redis_server import start_redis
    finally:
        sys.path.pop(0)
    from toolfault.stores import RedisStore

    server = start_redis()
    redis = RedisStore(server.url, prefix=f"tf{uuid.uuid4().hex[:10]}")
    yield redis
    redis.close()
    server.kill()


def test_the_ladder_holds_with_durable_stores(store: Store) -> None:
    """SQLite and Redis stores give the same three messages and the same halt."""
    guard, ran = make(store=store)
    told = repeat(guard, 20)
    assert [r.code for r in told] == ["not_found", "not_found", "not_found", "halted"]
    assert ran["find_city"] == 2
    assert guard.call("weather", {"city": "Oslo"}).halt
    kinds = [i.kind for i in guard.incidents]
    assert IncidentKind.HALT in kinds and IncidentKind.RETRY_CAP in kinds
    guard.new_turn()
    assert guard.call("weather", {"city": "Oslo"}).ok


def test_block_window_with_a_durable_store(store: Store) -> None:
    """An expired block is cleared in the durable store too, so the call runs again."""
    clock = Clock()
    guard, ran = make(Limits(backoff=FAST, block_seconds=10, halt_after_refusals=None),
                      store=store, clock=clock)
    repeat(guard, 4)
    assert ran["find_city"] == 2
    clock.now += 10
    assert guard.call("find_city", {"name": "Atlantis"}).code == "not_found"
    assert ran["find_city"] == 3


def test_a_success_elsewhere_does_not_lift_a_halt() -> None:
    """success_lifts_blocks lifts blocks, never a halted turn (the other tool is refused too)."""
    guard, ran = make(Limits(backoff=FAST, success_lifts_blocks=True))
    assert repeat(guard, 10)[-1].halt
    assert guard.call("weather", {"city": "Oslo"}).halt and ran["weather"] == 0


@pytest.mark.parametrize("bad", [
    {"halt_after_refusals": 0}, {"max_tool_failures_per_turn": 0}, {"no_progress_repeats": 1},
    {"progress_exempt": "poll"}, {"block_seconds": 0}, {"block_seconds": -5.0},
])
def test_limits_reject_rungs_that_cannot_work(bad: dict[str, Any]) -> None:
    """A ladder setting below its minimum is a configuration error, not a silent no-op."""
    from toolfault import ConfigurationError

    with pytest.raises(ConfigurationError):
        Limits(**bad)


def test_progress_exempt_accepts_any_collection() -> None:
    """progress_exempt given as a list or set is stored as a frozenset (membership is cheap)."""
    limits = Limits(progress_exempt=["poll"])  # type: ignore[arg-type]
    assert limits.progress_exempt == frozenset({"poll"})


def test_a_transient_tool_counts_once_per_call_not_per_attempt() -> None:
    """One call's retries inside the wrapper are one failure of the tool: a flaky tool with an
    outage (3 attempts), 3 successes and a second outage is never blocked or halted."""
    guard = Guard(limits=Limits(backoff=Backoff(attempts=3, initial=0, jitter=0)),
                  scan_env_secrets=False, sleep=lambda _: None)
    runs = {"n": 0}
    down = {"now": True}

    @guard.tool
    def fetch(url: str) -> str:
        runs["n"] += 1
        if down["now"]:
            raise ConnectionError("connection reset by peer")
        return f"page {url}"

    first = guard.call("fetch", {"url": "https://example.com/1"})
    assert first.code == "unavailable" and runs["n"] == 3
    down["now"] = False
    assert all(guard.call("fetch", {"url": f"https://example.com/{i}"}).ok for i in range(3))
    down["now"] = True
    second = guard.call("fetch", {"url": "https://example.com/9"})
    assert second.code == "unavailable" and not second.halt and not second.blocked


def test_a_transient_tool_failing_every_attempt_is_capped_then_halted() -> None:
    """The identical transient failure: capped at 3 calls (9 runs), then blocked, then halt."""
    guard = Guard(limits=Limits(backoff=Backoff(attempts=3, initial=0, jitter=0)),
                  scan_env_secrets=False, sleep=lambda _: None)
    runs = {"n": 0}

    @guard.tool
    def fetch(url: str) -> str:
        runs["n"] += 1
        raise ConnectionError("connection reset by peer")

    told = repeat(guard, 20, "fetch", {"url": "https://example.com"})
    assert [r.code for r in told] == ["unavailable"] * 4 + ["halted"]
    assert told[2].terminal and told[3].blocked
    assert runs["n"] == 9


def test_an_identical_call_that_fails_differently_is_progress() -> None:
    """run_tests, edit, run_tests...: the same call failing with other words (fewer failing
    tests) is a changed observation, not a loop: its identical-failure count starts over."""
    guard = Guard(limits=Limits(backoff=FAST), scan_env_secrets=False)
    failing = {"n": 3}

    @guard.tool
    def run_tests(path: str) -> str:
        if failing["n"]:
            raise ToolError("tool_error", f"{failing['n']} tests failed")
        return "all passed"

    told = []
    for _ in range(4):
        told.append(guard.call("run_tests", {"path": "tests"}))
        failing["n"] = max(0, failing["n"] - 1)
    assert [r.code for r in told] == ["tool_error"] * 3 + [None]
    assert not any(r.terminal or r.blocked for r in told)


def test_a_side_effect_success_lifts_the_blocks_of_other_calls() -> None:
    """A call capped on identical failures may run again once a side effect changed the world
    (the edit between two test runs that fail the same way)."""
    guard, ran = make()
    told = repeat(guard, 2)
    assert told[-1].terminal and ran["find_city"] == 2

    @guard.tool(side_effect=True)
    def add_city(name: str) -> str:
        return f"added {name}"

    assert guard.call("add_city", {"name": "Atlantis"}).ok
    again = guard.call("find_city", {"name": "Atlantis"})
    assert ran["find_city"] == 3 and not again.blocked


def test_parallel_calls_of_one_tool_are_not_blocked_by_the_order_they_finish() -> None:
    """Six parallel calls of one tool, five bad and one slow good one in the middle: in the
    model's order that is never five failures in a row, so nothing is blocked, whatever
    finishes first (also without arun_tool_calls: a framework's own gather)."""
    guard = Guard(limits=Limits(backoff=FAST), scan_env_secrets=False)

    @guard.tool
    async def quote_item(sku: str, quantity: int) -> str:
        if quantity < 1:
            raise ToolError("invalid_argument", "quantity must be at least 1",
                            param="quantity")
        await asyncio.sleep(0.05)
        return f"{quantity} x {sku}"

    batch = [("quote_item", {"sku": f"SKU-{i}", "quantity": 2 if i == 3 else 0})
             for i in range(1, 7)]

    async def main() -> list[ToolResult]:
        return list(await asyncio.gather(*(guard.acall(n, a) for n, a in batch)))

    codes = [r.code for r in asyncio.run(main())]
    assert codes == ["invalid_argument"] * 2 + [None] + ["invalid_argument"] * 3
