"""No input makes Guard.call raise, and every failure keeps the four-part shape."""

from __future__ import annotations

import asyncio
import re
import threading
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from toolfault import Backoff, ConfigurationError, Guard, Limits, MemoryStore, Outcome, ToolError

FOUR_PART = re.compile(
    r"^\S+ failed \(code: [a-z_]+\)\.\nReason: .+\.\nRejected arguments: .+\.\n"
    r"Effect: (none|unknown|applied)\. .+\nNext action: .+\.$", re.S)
TERMINAL = re.compile(r"^\S+ failed \d+ times with identical arguments \(code: [a-z_]+\)\.\n"
                      r"Retrying the same call is not allowed\.\nYou must now .+\.$", re.S)

guard = Guard(limits=Limits(retry_limit=2, max_calls_per_turn=10_000,
                            backoff=Backoff(attempts=2, initial=0, jitter=0, maximum=0)),
              scan_env_secrets=False)


@guard.tool
def typed(count: int, name: str, ratio: float = 1.0, tags: list[str] | None = None) -> str:
    """A typed tool. Use it for robustness checks."""
    return f"{count}-{name}"


@guard.tool
def anything(payload: Any = None) -> Any:
    """Echo anything back. Use it for robustness checks."""
    if isinstance(payload, str) and payload.startswith("boom"):
        raise RuntimeError(payload)
    if isinstance(payload, str) and payload.startswith("tool"):
        raise ToolError("conflict", payload)
    return payload


junk = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=30)
    | st.binary(max_size=10),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
        st.one_of(st.text(max_size=6), st.integers()), inner, max_size=4) | st.tuples(inner),
    max_leaves=15,
)
arguments = st.one_of(
    junk,
    st.dictionaries(st.sampled_from(["count", "name", "ratio", "tags", "payload", "x"]), junk,
                    max_size=5),
    st.text(max_size=60),
    st.builds(lambda d: __import__("json").dumps(d), st.dictionaries(st.text(max_size=5),
                                                                      st.integers())),
    st.just(object()),
)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=st.sampled_from(["typed", "anything", "typo", "", "x" * 300]), args=arguments)
def test_guard_call_never_raises(name: str, args: Any) -> None:
    """Any tool name and any argument value gives a ToolResult with a well-formed text."""
    result = guard.call(name, args)
    assert isinstance(result.text, str)
    if not result.ok:
        # no_progress carries the result the model asked for after the four parts
        message, _, _ = result.text.partition("\nResult (unchanged): ")
        assert FOUR_PART.match(message) or TERMINAL.match(message), result.text
        assert "Traceback" not in result.text
        assert isinstance(result.data, dict)


class _HostileTimeout(TimeoutError):
    """A TimeoutError whose text and repr raise."""

    def __str__(self) -> str:
        raise TimeoutError("from __str__")

    def __repr__(self) -> str:
        raise TimeoutError("from __repr__")


class _NoInitTimeout(TimeoutError):
    def __init__(self, *args: Any) -> None:
        pass


class _BadResponse(TimeoutError):
    @property
    def response(self) -> Any:
        raise TimeoutError("from response")


ODD_TIMEOUTS = [_HostileTimeout(), _NoInitTimeout("x"), _BadResponse("y"),
                TimeoutError(*range(200)), TimeoutError(object())]


@pytest.mark.parametrize("error", ODD_TIMEOUTS, ids=lambda e: type(e).__name__)
@pytest.mark.parametrize("side_effect", [False, True])
async def test_odd_timeout_errors_are_shaped_not_raised(error: BaseException,
                                                        side_effect: bool) -> None:
    """A tool raising TimeoutError in odd ways (hostile __str__, no init, raising
    attributes) gets a shaped result from call and acall, never the exception."""
    odd = Guard(scan_env_secrets=False, limits=Limits(backoff=Backoff(attempts=1)))

    @odd.tool(side_effect=side_effect)
    def slow(x: int) -> int:
        raise error

    for result in (odd.call("slow", {"x": 1}), await odd.acall("slow", {"x": 2})):
        assert not result.ok and result.code in ("timeout", "effect_unknown", "internal_error")
        assert FOUR_PART.match(result.text) or TERMINAL.match(result.text), result.text


def test_a_sync_tool_stuck_past_the_deadline_is_abandoned() -> None:
    """The call returns a timeout while the tool is still blocked in its worker thread; a
    side-effecting one says the effect is unknown."""
    release = threading.Event()
    stuck = Guard(scan_env_secrets=False, deadline=0.2, isolate_sync_tools=True,
                  limits=Limits(backoff=Backoff(attempts=1)))

    @stuck.tool
    def hang() -> str:
        release.wait(30)
        return "late"

    @stuck.tool(side_effect=True)
    def hang_effect() -> str:
        release.wait(30)
        return "late"

    plain, effect = stuck.call("hang", {}), stuck.call("hang_effect", {})
    still_running = not release.is_set()
    release.set()
    assert still_running
    assert plain.code == "timeout" and plain.outcome is Outcome.NO_EFFECT
    assert effect.outcome is Outcome.UNKNOWN and "Effect: unknown" in effect.text


async def test_an_async_tool_past_the_deadline_is_cancelled_and_answered() -> None:
    """An async tool that never finishes is cancelled at the deadline and shaped."""
    cancelled = asyncio.Event()
    stuck = Guard(scan_env_secrets=False, deadline=0.2,
                  limits=Limits(backoff=Backoff(attempts=1)))

    @stuck.tool
    async def forever() -> str:
        try:
            await asyncio.Event().wait()
        finally:
            cancelled.set()
        return "never"

    result = await stuck.acall("forever", {})
    assert result.code == "timeout" and cancelled.is_set()


async def test_cancelling_acall_propagates_and_releases_the_key() -> None:
    """Cancelling the awaiting task raises CancelledError and frees the idempotency key."""
    started = asyncio.Event()
    guard_c = Guard(scan_env_secrets=False)
    runs: list[int] = []

    @guard_c.tool(side_effect=True)
    async def pay(n: int) -> str:
        runs.append(n)
        if len(runs) == 1:
            started.set()
            await asyncio.Event().wait()
        return "paid"

    task = asyncio.ensure_future(guard_c.acall("pay", {"n": 1}))
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    again = await guard_c.acall("pay", {"n": 1})
    assert again.code != "in_progress"


def test_hostile_names_and_a_failing_store_never_raise() -> None:
    """A name whose __str__ raises, and a store whose release raises, still give results."""

    class BadName:
        def __str__(self) -> str:
            raise RuntimeError("no")

    assert guard.call(BadName(), {}).code == "internal_error"  # type: ignore[arg-type]

    class Store(MemoryStore):
        def release(self, task: str, key: str, holder: str = "") -> None:
            raise RuntimeError("store down")

    flaky = Guard(store=Store(), scan_env_secrets=False)

    @flaky.tool(side_effect=True)
    def act(n: int) -> int:
        return n

    assert flaky.call("act", {"n": 1}).ok


def test_deadline_must_be_positive() -> None:
    """A zero or negative deadline is a configuration error; None turns it off."""
    with pytest.raises(ConfigurationError):
        Guard(deadline=0)
    assert Guard(deadline=None, scan_env_secrets=False).deadline is None


@pytest.mark.parametrize("said", ["", "   ", "...", ". . .", "\n\t"])
def test_blank_reasons_and_next_actions_keep_the_four_part_shape(said: str) -> None:
    """A tool whose ToolError says nothing (blank, dots, whitespace) still gets a reason and
    a next action."""
    blank = Guard(scan_env_secrets=False)

    @blank.tool
    def quiet(x: int) -> int:
        raise ToolError("conflict", said, next_action=said)

    text = blank.call("quiet", {"x": 1}).text
    assert FOUR_PART.match(text), text


def test_sync_tools_run_on_the_callers_thread_by_default() -> None:
    """Without isolate_sync_tools a sync tool sees the caller's thread (a sqlite3 connection
    made there works), and the deadline still bounds a tool given ``timeout=``."""
    import sqlite3

    conn = sqlite3.connect(":memory:")  # usable only on this thread
    guard = Guard(scan_env_secrets=False, deadline=0.5,
                  limits=Limits(backoff=Backoff(attempts=1)))
    release = threading.Event()

    @guard.tool
    def count() -> int:
        return int(conn.execute("select 41 + 1").fetchone()[0])

    @guard.tool(timeout=5.0)
    def slow() -> str:
        release.wait(30)
        return "late"

    assert guard.call("count", {}).text == "42"
    try:
        assert guard.call("slow", {}).code == "timeout"  # the deadline (0.5 s) came first
    finally:
        release.set()
