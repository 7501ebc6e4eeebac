"""One pipeline, two drivers: ``call`` and ``acall`` take the same decisions by construction."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any, Literal

import pytest

from toolfault import Backoff, Guard, Limits, Outcome, ToolError

FAST = Backoff(attempts=3, initial=0.01, maximum=0.05, jitter=0.0, max_seconds=5)


class Booking:
    """A side-effecting backend whose first request lands but answers too late."""

    def __init__(self) -> None:
        self.booked: list[str] = []
        self.slow = True
        self.lock = threading.Lock()

    def book(self, seat: str) -> str:
        with self.lock:
            self.booked.append(seat)
        if self.slow:
            self.slow = False
            time.sleep(0.3)
        return f"booked {seat}"

    def landed(self, args: dict[str, Any]) -> bool:
        with self.lock:
            return args["seat"] in self.booked


def build(sleeps: list[float]) -> tuple[Guard, Booking, dict[str, int]]:
    """A guard with one tool per decision the pipeline can take."""
    guard = Guard(scan_env_secrets=False, sleep=sleeps.append,
                  limits=Limits(retry_limit=2, backoff=FAST, max_calls_per_turn=100))
    booking = Booking()
    runs = {"flaky": 0}

    @guard.tool
    def search(origin: str, max_price: float, airlines: list[str],
               cabin: Literal["economy", "business"]) -> dict[str, Any]:
        """Search flights."""
        if max_price <= 0:
            raise ValueError("max_price must be greater than 0")
        return {"origin": origin, "offers": len(airlines)}

    @guard.tool
    def flaky(q: str) -> str:
        """Fails twice with a 503-like error, then answers."""
        runs["flaky"] += 1
        if runs["flaky"] < 3:
            raise ToolError("unavailable", "the search backend is restarting",
                            retryable=True, retry_after=0.02)
        return "ok"

    @guard.tool
    def status(job: str) -> dict[str, Any]:
        """A tool that reports failure in its return value."""
        return {"success": False, "message": "job not found"}

    guard.tool(side_effect=True, postcondition=booking.landed, timeout=0.05)(booking.book)
    return guard, booking, runs


BAD = {"origin": "SFO", "max_price": -1, "airlines": ["UA"], "cabin": "economy"}
#: Turns of calls: every decision the pipeline can take, in order.
SCRIPT: list[list[tuple[str, Any]]] = [
    [("search", {"origin": "SFO", "max_price": 420, "airlines": ["UA"], "cabin": "economy"}),
     ("search", '{"origin": "SFO", "max_price": "cheap", "airlines": [], "cabin": "economy"}'),
     ("search", BAD), ("search", BAD)],
    [("flaky", {"q": "x"}), ("status", {"job": "7"}), ("book", {"seat": "12A"}),
     ("serach", {"origin": "SFO"}), ("search", "{not json")],
    [("search", BAD), ("search", BAD), ("search", BAD), ("search", BAD),
     ("status", {"job": "8"})],
]
CODES = [None, "invalid_argument", "invalid_argument", "invalid_argument",
         None, "not_found", "already_applied", "unknown_tool", "invalid_json",
         "invalid_argument", "invalid_argument", "invalid_argument", "halted", "halted"]


def outline(result: Any) -> tuple[Any, ...]:
    return (result.tool, result.ok, result.code, result.outcome, result.terminal,
            result.attempts, result.text)


def test_call_and_acall_answer_every_decision_identically() -> None:
    """The same script through the sync and the async driver gives the same results."""
    sync_sleeps: list[float] = []
    guard, booking, runs = build(sync_sleeps)
    sync = []
    for turn in SCRIPT:
        sync += [outline(guard.call(name, args)) for name, args in turn]
        guard.new_turn()

    async_sleeps: list[float] = []
    aguard, abooking, aruns = build(async_sleeps)

    async def run() -> list[tuple[Any, ...]]:
        out = []
        for turn in SCRIPT:
            out += [outline(await aguard.acall(name, args)) for name, args in turn]
            aguard.new_turn()
        return out

    assert asyncio.run(run()) == sync
    assert sync_sleeps == async_sleeps == [0.02, 0.02]  # Retry-After beat the backoff
    assert runs == aruns == {"flaky": 3}
    assert booking.booked == abooking.booked == ["12A"]  # landed once, verified, not redone
    assert [row[2] for row in sync] == CODES
    assert sync[3][4] is True  # the second identical failure is terminal (retry_limit=2)
    assert sync[6][3] is Outcome.APPLIED
    assert sync[11][4] is True and "halted" in sync[13][6]  # blocked once, then the halt


def test_retries_stop_at_the_backoffs_attempts() -> None:
    """A transient failure is tried ``Backoff.attempts`` times, waits growing exponentially."""
    sleeps: list[float] = []
    guard = Guard(scan_env_secrets=False, sleep=sleeps.append,
                  limits=Limits(backoff=Backoff(attempts=4, initial=0.01, maximum=1.0,
                                                jitter=0.0, max_seconds=5)))
    runs = [0]

    @guard.tool
    def down(q: str) -> str:
        """Always unavailable."""
        runs[0] += 1
        raise ToolError("unavailable", "the backend is down", retryable=True)

    result = guard.call("down", {"q": "x"})
    assert runs[0] == 4 and result.attempts == 4
    assert sleeps == [0.01, 0.01, 0.02]
    assert result.code == "unavailable" and not result.ok


def test_a_wait_past_max_seconds_is_not_taken() -> None:
    """Backoff stops before a wait that would pass ``max_seconds``."""
    sleeps: list[float] = []
    guard = Guard(scan_env_secrets=False, sleep=sleeps.append,
                  limits=Limits(backoff=Backoff(attempts=10, initial=0.4, maximum=10.0,
                                                jitter=0.0, max_seconds=1.0)))

    @guard.tool
    def down(q: str) -> str:
        """Always unavailable."""
        raise ToolError("unavailable", "the backend is down", retryable=True)

    result = guard.call("down", {"q": "x"})
    assert sleeps == [0.4, 0.4]  # the next wait (0.8 s) would pass the 1 s budget
    assert result.attempts == 3


def test_a_scope_is_a_new_facade_over_the_same_parts() -> None:
    """Scopes share tools, store and observers, count on their own, and keep their mode."""
    seen: list[str] = []
    guard = Guard(scan_env_secrets=False, limits=Limits(retry_limit=2),
                  observers=[lambda event: seen.append(event.task)])
    scope = guard.scoped("worker-1")

    @guard.tool
    def echo(n: int) -> int:
        """Registered after the scope was made: the scope sees it too."""
        if n < 0:
            raise ValueError("n must be at least 0")
        return n

    assert scope.call("echo", {"n": 1}).text == "1"
    for _ in range(2):
        scope.call("echo", {"n": -1})
    assert scope.call("echo", {"n": -1}).blocked
    assert not guard.call("echo", {"n": -1}).blocked  # the parent's task counts apart
    scope.mode = "observe"
    assert guard.mode == "enforce"
    assert seen[:1] == ["worker-1"] and "default" in seen
    assert guard.tools.keys() == scope.tools.keys()


@pytest.mark.parametrize("entry", ["call", "acall"])
def test_a_tool_raising_base_exception_is_shaped_not_raised(entry: str) -> None:
    """Whatever the tool raises but KeyboardInterrupt/SystemExit comes back as a result."""
    guard = Guard(scan_env_secrets=False)

    @guard.tool
    def odd(q: str) -> str:
        """Raises a BaseException that is not an Exception."""
        raise GeneratorExit("odd")

    run: Callable[[], Any] = (lambda: guard.call("odd", {"q": "x"})) if entry == "call" \
        else (lambda: asyncio.run(guard.acall("odd", {"q": "x"})))
    result = run()
    assert not result.ok and result.code == "internal_error"


JSON_TEXTS = [
    '{"a": 1}', '  {"a": [1, 2.5, "x"]}  ', '{"a": 1, "a": 2}', '{"a": "\\ud800"}',
    '{"a": "\\u0000"}', '{"a": 123456789012345678901234567890}', '{"a": -0.0}',
    '{"a": 2.5e-324}', '{"a": {"b": {"c": [true, false, null]}}}', '{"a": "é 漢字"}',
    '{"a": ' + '[' * 300 + ']' * 300 + '}', '',
]
BAD_JSON_TEXTS = ['{"a": NaN}', '{"a": Infinity}', '{"a": 1} x', '{"a": 1,}', '[1]', '"x"',
                  'null', '{"a": ' + '[' * 100_000 + ']' * 100_000 + '}',
                  '{"a": ' + '1' * 5000 + '}']


@pytest.mark.parametrize("text", JSON_TEXTS)
def test_json_arguments_parse_as_the_standard_library_parses_them(text: str) -> None:
    """The fast parser gives the values json.loads gives (the stdlib decides what it refuses)."""
    import json

    from toolfault._call import _Call
    from toolfault._pipeline import _parse_json

    call = _Call(None, "t", text, "c", 0.0)
    expected = json.loads(text) if text.strip() else {}
    parsed = _parse_json(call, text)
    assert parsed == expected and repr(parsed) == repr(expected)


@pytest.mark.parametrize("text", BAD_JSON_TEXTS)
def test_json_the_fast_parser_refuses_is_worded_by_the_standard_library(text: str) -> None:
    """What is not a JSON object with finite numbers gets a reason, never a raise."""
    from toolfault._call import NOT_JSON, _Call
    from toolfault._pipeline import _parse_json

    call = _Call(None, "t", text, "c", 0.0)
    assert _parse_json(call, text) is NOT_JSON
    reason = call.shadow["json_reason"]
    assert reason.startswith("the arguments ") and "pydantic" not in reason


def test_guard_results_equal_the_dataclass_they_are_built_as() -> None:
    """A result built on the hot path is a ToolResult like any other: equal, frozen, repr."""
    import dataclasses

    from toolfault import ToolResult
    from toolfault._result import new_result

    fast = new_result("t", True, "text", {"a": 1}, 1, "c1", None, "fp")
    slow = ToolResult("t", True, "text", {"a": 1}, 1, "c1", None, "fp")
    assert fast == slow and repr(fast) == repr(slow) and fast.fingerprint == "fp"
    with pytest.raises(dataclasses.FrozenInstanceError):
        fast.text = "other"  # type: ignore[misc]
    assert dataclasses.replace(fast, text="x").text == "x"


def test_failure_info_built_unsealed_equals_the_dataclass() -> None:
    """A failure's FailureInfo, built as a result is, is a FailureInfo like any other."""
    import dataclasses

    from toolfault import FailureClass, Outcome
    from toolfault._result import FailureInfo, new_failure_info

    cause = ValueError("x")
    fast = new_failure_info("tool_error", Outcome.UNKNOWN, True, False, True, False,
                            FailureClass.TRANSIENT, None, cause)
    slow = FailureInfo("tool_error", Outcome.UNKNOWN, True, False, True, False,
                       FailureClass.TRANSIENT, None, cause)
    assert type(fast) is FailureInfo and fast == slow and repr(fast) == repr(slow)
    with pytest.raises(dataclasses.FrozenInstanceError):
        fast.code = "other"  # type: ignore[misc]


def test_a_status_key_after_plain_results_is_still_seen() -> None:
    """Remembering a tool's plain result keys never hides a status key seen later."""
    from toolfault._returned import default_error_result

    for _ in range(3):
        assert default_error_result({"id": 1, "message": "booked"}) is None
    assert default_error_result({"booking_status": False, "message": "Card declined"}) \
        == "Card declined"
    assert default_error_result({"id": 1, "message": "booked"}) is None


@pytest.mark.parametrize("text", ['{"a": 1}', '{"a": [1, 2.5, "x"]}', '{"a": 1, "a": 2}',
                                  '{"a": -0.0}', '{"a": {"b": {"c": [true, false, null]}}}',
                                  '{"a": "é 漢字"}', '{"a": 2.0}', '{"a": "e\\u0301"}'])
def test_json_text_arguments_are_fingerprinted_as_their_values_are(text: str) -> None:
    """JSON text the fast parser took whole is fingerprinted lazily: the same fingerprint as
    the parsed values, and identical failing calls still reach the cap."""
    import json

    from toolfault._fingerprint import fingerprint

    guard = Guard(scan_env_secrets=False)

    @guard.tool
    def echo(a: Any = None) -> str:
        """Echo."""
        return "ok"

    @guard.tool
    def broken(a: Any = None) -> str:
        """Always fails."""
        raise ValueError("a is not acceptable")

    ok = guard.call("echo", text)
    assert ok.ok and ok.fingerprint == fingerprint("echo", json.loads(text))
    answers = [guard.call("broken", text) for _ in range(4)]
    assert answers[0].code != "retry_cap_reached" and answers[-1].terminal

