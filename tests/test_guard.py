"""The guard: four-part shape, validation, caps, transient retries and budgets."""

from __future__ import annotations

import asyncio
import json
import re
from typing import Annotated, Any, Literal

import httpx
import pytest
import requests
from pydantic import Field

from toolfault import (
    Backoff,
    ConfigurationError,
    FailureClass,
    Guard,
    IncidentKind,
    Limits,
    Outcome,
    ToolContext,
    ToolError,
    ToolResult,
    count_tokens,
)

FAST = Backoff(attempts=3, initial=0.001, maximum=0.01, jitter=0.0, max_seconds=5)
FOUR_PART = re.compile(
    r"^(?P<tool>\S+) failed \(code: (?P<code>[a-z_]+)\)\.\n"
    r"Reason: (?P<reason>.+)\.\n"
    r"Rejected arguments: (?P<args>.+)\.\n"
    r"Effect: (?P<effect>none|unknown|applied)\. (?P<verdict>.+)\n"
    r"Next action: (?P<next>.+)\.$"
)


def make_guard(**kw: Any) -> tuple[Guard, dict[str, int]]:
    calls = {"search_flights": 0}
    kw.setdefault("limits", Limits(retry_limit=3, max_calls_per_turn=50, backoff=FAST))
    guard = Guard(scan_env_secrets=False, **kw)

    @guard.tool(alternatives={"search_flights_any_price": "if no budget constraint applies"})
    def search_flights(origin: str, destination: str, max_price: int) -> list[dict[str, Any]]:
        """Search flights under a price cap. Use it when the user gave a budget."""
        calls["search_flights"] += 1
        if max_price <= 0:
            raise ToolError(
                "invalid_argument", "max_price must be greater than 0",
                next_action="call search_flights again with max_price as a positive number",
            )
        return [{"flight": "UA1", "price": max_price}]

    @guard.tool
    def search_flights_any_price(origin: str, destination: str) -> list[dict[str, Any]]:
        """Search flights with no cap. Use it when no budget applies."""
        return [{"flight": "UA1"}]

    return guard, calls


BAD = {"origin": "SFO", "destination": "JFK", "max_price": -1}


def test_design_example_message_is_exact() -> None:
    """The first failure renders exactly the contract example from DESIGN.md."""
    guard, _ = make_guard()
    result = guard.call("search_flights", BAD)
    assert result.text == (
        "search_flights failed (code: invalid_argument).\n"
        "Reason: max_price must be greater than 0.\n"
        'Rejected arguments: {"origin": "SFO", "destination": "JFK", "max_price": -1}.\n'
        "Effect: none. Retrying the same call will not help.\n"
        "Next action: call search_flights again with max_price as a positive number, or call "
        "search_flights_any_price if no budget constraint applies."
    )
    assert result.is_error and not result.ok
    assert result.code == "invalid_argument"
    assert result.outcome is Outcome.NO_EFFECT
    assert result.failure_class is FailureClass.BAD_INPUT
    assert not result.terminal
    assert count_tokens(result.text) < 100


def test_terminal_message_after_cap_and_tool_not_called_again() -> None:
    """At the cap the model gets the terminal text; further identical calls never reach the tool."""
    guard, calls = make_guard()
    results = [guard.call("search_flights", BAD) for _ in range(6)]
    assert [r.terminal for r in results] == [False, False, True, True, True, True]
    assert calls["search_flights"] == 3
    assert results[2].text == (
        "search_flights failed 3 times with identical arguments (code: invalid_argument).\n"
        "Retrying the same call is not allowed.\n"
        "You must now either call search_flights with a different max_price, call "
        "search_flights_any_price if no budget constraint applies, or stop and report this "
        "failure to the user."
    )
    assert results[3].blocked and not results[2].blocked
    assert results[3].text == results[2].text and not results[3].halt  # the same words again
    assert results[4].halt and results[5].halt and not results[2].halt
    assert results[4].code == "halted" and results[5].code == "halted"
    assert [i.kind for i in guard.incidents] == [IncidentKind.RETRY_CAP, IncidentKind.HALT]


def test_without_halting_the_block_repeats_the_terminal_message() -> None:
    """halt_after_refusals=None: every further repeat is blocked with the terminal text."""
    guard, calls = make_guard(limits=Limits(retry_limit=3, halt_after_refusals=None,
                                            backoff=FAST))
    results = [guard.call("search_flights", BAD) for _ in range(5)]
    assert calls["search_flights"] == 3
    assert results[4].text == results[2].text and results[4].blocked
    assert not any(r.halt for r in results)


def test_cosmetic_json_difference_is_the_same_call() -> None:
    """Key order, whitespace and 5.0-vs-5 do not make a new call."""
    guard, calls = make_guard()
    guard.call("search_flights", '{"origin": "SFO", "destination": "JFK", "max_price": -1}')
    guard.call("search_flights", '{"max_price":-1.0,"destination":"JFK","origin":"SFO"}')
    third = guard.call("search_flights", {"destination": "JFK", "origin": "SFO",
                                          "max_price": -1})
    assert third.terminal
    assert calls["search_flights"] == 3


def test_meaningful_change_gets_its_own_counter_and_success_resets() -> None:
    """A changed argument is a new call; a success clears the count for that fingerprint."""
    guard, calls = make_guard()
    guard.call("search_flights", BAD)
    guard.call("search_flights", BAD)
    other = guard.call("search_flights", {**BAD, "max_price": -2})
    assert not other.terminal and other.code == "invalid_argument"
    ok = guard.call("search_flights", {**BAD, "max_price": 300})
    assert ok.ok and ok.data == [{"flight": "UA1", "price": 300}]
    assert ok.text == json.dumps([{"flight": "UA1", "price": 300}], separators=(",", ":"))
    assert calls["search_flights"] == 4


def test_success_clears_the_count_of_a_flaky_fingerprint() -> None:
    """Consecutive means consecutive: fail, fail, succeed, fail is one failure, not three."""
    state = {"n": 0}
    guard = Guard(limits=Limits(retry_limit=3, backoff=FAST), scan_env_secrets=False)

    @guard.tool
    def flip(x: int) -> int:
        state["n"] += 1
        if state["n"] in (1, 2, 4):
            raise ToolError("conflict", "the item changed meanwhile")
        return x

    results = [guard.call("flip", {"x": 1}) for _ in range(4)]
    assert [r.ok for r in results] == [False, False, True, False]
    assert not results[3].terminal


def test_new_turn_resets_counters() -> None:
    """Per-turn counters start again after new_turn()."""
    guard, calls = make_guard()
    for _ in range(3):
        guard.call("search_flights", BAD)
    assert guard.call("search_flights", BAD).blocked
    guard.new_turn()
    again = guard.call("search_flights", BAD)
    assert not again.terminal and not again.blocked
    assert calls["search_flights"] == 4


def test_default_limits_follow_failure_class() -> None:
    """Without retry_limit, bad input stops at 2 and transient at 3."""
    guard = Guard(limits=Limits(backoff=Backoff(attempts=1)), scan_env_secrets=False)
    ran = {"bad": 0, "flaky": 0}

    @guard.tool
    def bad(x: int) -> int:
        ran["bad"] += 1
        raise ToolError("invalid_argument", "x must be even")

    @guard.tool
    def flaky(x: int) -> int:
        ran["flaky"] += 1
        raise ConnectionError("reset by peer")

    assert [guard.call("bad", {"x": 1}).terminal for _ in range(3)] == [False, True, True]
    guard.new_turn()  # the refused third call halted the turn
    assert [guard.call("flaky", {"x": 1}).terminal for _ in range(4)] == [
        False, False, True, True]
    assert ran == {"bad": 2, "flaky": 3}


def test_catalog_row_retry_limit_wins(tmp_path: Any) -> None:
    """A catalog row's retry_limit overrides the guard's global limit for that code."""
    catalog = tmp_path / "errors.toml"
    catalog.write_text(
        '[[error]]\ncode = "sold_out"\nclass = "permanent"\nretryable = false\n'
        'retry_limit = 1\nsummary = "No seats left."\n'
        'next_action = "call {tool} with another flight"\n'
    )
    guard = Guard(catalog=catalog, limits=Limits(retry_limit=3), scan_env_secrets=False)

    @guard.tool
    def book(flight: str) -> str:
        raise ToolError("sold_out", "flight UA1 has no seats left")

    first = guard.call("book", {"flight": "UA1"})
    assert first.terminal and "failed 1 times" in first.text


def test_validation_rejects_before_calling() -> None:
    """Missing, extra and mistyped arguments name the parameter and type; the tool never runs."""
    guard, calls = make_guard()
    missing = guard.call("search_flights", {"origin": "SFO", "destination": "JFK"})
    assert missing.code == "invalid_argument"
    assert "max_price is required (an integer)" in missing.text
    assert "include max_price as an integer" in missing.text
    extra = guard.call("search_flights", {**BAD, "max_price": 5, "cabin": "economy"})
    assert "cabin is not a parameter of search_flights" in extra.text
    assert "without cabin" in extra.text
    wrong = guard.call("search_flights", {**BAD, "max_price": "cheap"})
    assert "max_price should be a valid integer" in wrong.text
    assert '"max_price": "cheap"' in wrong.text
    assert calls["search_flights"] == 0
    for r in (missing, extra, wrong):
        assert FOUR_PART.match(r.text), r.text


def test_declared_constraints_and_enums_are_validated() -> None:
    """pydantic constraints in Annotated hints and Literal enums reject before the call."""
    guard = Guard(scan_env_secrets=False)

    @guard.tool
    def book(cabin: Literal["economy", "business"],
             seats: Annotated[int, Field(gt=0, le=9, description="seats to book")]) -> str:
        return f"{seats} {cabin}"

    assert guard.call("book", {"cabin": "first", "seats": 1}).code == "invalid_argument"
    too_many = guard.call("book", {"cabin": "economy", "seats": 12})
    assert "seats should be less than or equal to 9" in too_many.text
    assert guard.call("book", {"cabin": "economy", "seats": 2}).text == "2 economy"
    schema = guard.tools["book"].schema
    assert schema["properties"]["cabin"]["enum"] == ["economy", "business"]
    assert schema["properties"]["seats"]["description"] == "seats to book"
    assert schema["required"] == ["cabin", "seats"]


def test_explicit_json_schema_uses_jsonschema() -> None:
    """A raw JSON Schema given to the tool is enforced with jsonschema."""
    guard = Guard(scan_env_secrets=False)
    schema = {
        "type": "object",
        "properties": {"path": {"type": "string"}, "lines": {"type": "integer", "minimum": 1}},
        "required": ["path"],
        "additionalProperties": False,
    }

    @guard.tool(schema=schema)
    def head(**kwargs: Any) -> str:
        return f"{kwargs['path']}:{kwargs.get('lines', 10)}"

    assert guard.call("head", {"path": "a.txt"}).text == "a.txt:10"
    assert "path is required" in guard.call("head", {}).text
    low = guard.call("head", {"path": "a.txt", "lines": 0})
    assert low.code == "invalid_argument" and "lines must be an integer at least 1" in low.text
    assert "x is not a parameter" in guard.call("head", {"path": "a", "x": 1}).text


def test_unknown_tool_lists_nearest_names() -> None:
    """An unknown tool name is an unknown_tool error naming the closest real tools."""
    guard, _ = make_guard()
    result = guard.call("search_flight", {"origin": "SFO"})
    assert result.code == "unknown_tool"
    assert "there is no tool named 'search_flight'" in result.text
    assert "search_flights" in result.text.splitlines()[-1]


@pytest.mark.parametrize(
    ("raw", "needle"),
    [
        ('{"origin": "SFO"', "not valid JSON"),
        ("[1, 2]", "must be a JSON object, not list"),
        ('{"max_price": NaN}', "NaN is not a valid JSON number"),
        ("not json at all", "not valid JSON"),
    ],
)
def test_malformed_json_is_invalid_json(raw: str, needle: str) -> None:
    """Malformed argument strings become invalid_json with the raw text echoed."""
    guard, calls = make_guard()
    result = guard.call("search_flights", raw)
    assert result.code == "invalid_json"
    assert needle in result.text
    assert FOUR_PART.match(result.text)
    assert calls["search_flights"] == 0


def test_nan_in_a_dict_and_deep_nesting_and_huge_args() -> None:
    """NaN values, absurd nesting and huge arguments are invalid_argument, never a crash."""
    guard = Guard(scan_env_secrets=False)

    @guard.tool
    def store(blob: Any) -> str:
        return "stored"

    assert guard.call("store", {"blob": float("nan")}).code == "invalid_argument"
    deep: Any = []
    for _ in range(100_000):
        deep = [deep]
    nested = guard.call("store", {"blob": deep})
    assert nested.code == "invalid_argument" and "nested too deeply" in nested.text
    nested_json = guard.call("store", '{"blob": ' + "[" * 100_000 + "]" * 100_000 + "}")
    assert nested_json.code in ("invalid_json", "invalid_argument")
    huge = guard.call("store", {"blob": "x" * 3_000_000})
    assert huge.code == "invalid_argument" and "too large" in huge.text
    assert len(huge.text) < 800
    big_ok = guard.call("store", {"blob": "y" * 10_000})
    assert big_ok.ok


def test_raw_exceptions_are_shaped_without_leaking() -> None:
    """A KeyError or DB error becomes internal_error: no traceback, path, host or SQL."""
    guard = Guard(scan_env_secrets=False)

    @guard.tool
    def lookup(user: str) -> str:
        raise KeyError("SELECT * FROM users WHERE name='x' at /srv/app/db.py db1.internal")

    result = guard.call("lookup", {"user": "ada"})
    assert result.code == "internal_error"
    assert FOUR_PART.match(result.text)
    for leak in ("Traceback", "SELECT", "/srv", "db1.internal", "KeyError"):
        assert leak not in result.text
    assert isinstance(result.cause, KeyError)
    with pytest.raises(KeyError):
        result.reraise()


def test_mapped_exceptions_use_catalog_rows() -> None:
    """Builtin exceptions named in the catalog map to their codes."""
    guard = Guard(limits=Limits(backoff=Backoff(attempts=1)), scan_env_secrets=False)

    @guard.tool
    def open_file(path: str) -> str:
        if path == "denied":
            raise PermissionError(13, "Permission denied", "/etc/shadow")
        raise ValueError("path must be relative")

    assert guard.call("open_file", {"path": "denied"}).code == "permission_denied"
    value_error = guard.call("open_file", {"path": "abs"})
    assert value_error.code == "invalid_argument"
    assert "Reason: path must be relative." in value_error.text


def test_transient_failure_is_retried_inside_the_wrapper() -> None:
    """A ConnectionError that clears up is retried with backoff; the model sees only success."""
    guard = Guard(limits=Limits(backoff=FAST), scan_env_secrets=False)
    attempts = {"n": 0}

    @guard.tool
    def status(flight: str) -> str:
        attempts["n"] += 1
        if attempts["n"] < 3:
            raise ConnectionError("connection reset")
        return "on time"

    result = guard.call("status", {"flight": "UA1"})
    assert result.ok and result.text == "on time"
    assert result.attempts == 3


def test_transient_exhausted_says_retrying_later_may_help() -> None:
    """When backoff is exhausted the message says the failure is transient and retryable."""
    guard = Guard(limits=Limits(backoff=FAST), scan_env_secrets=False)
    attempts = {"n": 0}

    @guard.tool
    def status(flight: str) -> str:
        attempts["n"] += 1
        raise TimeoutError("read timed out from 10.0.0.7")

    result = guard.call("status", {"flight": "UA1"})
    assert attempts["n"] == 3 and result.attempts == 3
    assert result.code == "timeout" and result.retryable
    assert "Effect: none. Retrying later may help." in result.text
    assert "10.0.0.7" not in result.text


def test_permanent_failures_are_not_retried_inside_the_wrapper() -> None:
    """Only transient failures are retried automatically."""
    guard = Guard(limits=Limits(backoff=FAST), scan_env_secrets=False)
    attempts = {"n": 0}

    @guard.tool
    def charge(amount: int) -> str:
        attempts["n"] += 1
        raise ToolError("not_found", "card ending 4242 does not exist")

    assert guard.call("charge", {"amount": 5}).attempts == 1
    assert attempts["n"] == 1


def _http_error(status: int, retry_after: str | None = None) -> httpx.HTTPStatusError:
    headers = {"Retry-After": retry_after} if retry_after else {}
    request = httpx.Request("GET", "https://api.example.test/flights")
    response = httpx.Response(status, headers=headers, request=request)
    return httpx.HTTPStatusError(f"HTTP {status}", request=request, response=response)


def test_http_429_honours_retry_after() -> None:
    """httpx 429 with Retry-After waits at least that long between attempts."""
    waits: list[float] = []
    guard = Guard(limits=Limits(backoff=FAST), sleep=waits.append, scan_env_secrets=False)
    attempts = {"n": 0}

    @guard.tool
    def prices(route: str) -> str:
        attempts["n"] += 1
        if attempts["n"] == 1:
            raise _http_error(429, "2")
        return "ok"

    result = guard.call("prices", {"route": "SFO-JFK"})
    assert result.ok and attempts["n"] == 2
    assert waits and waits[0] >= 2.0


def test_retry_after_longer_than_budget_goes_to_the_model() -> None:
    """A Retry-After beyond the wrapper's wait budget is reported with the wait, not slept."""
    waits: list[float] = []
    guard = Guard(limits=Limits(backoff=FAST), sleep=waits.append, scan_env_secrets=False)

    @guard.tool
    def prices(route: str) -> str:
        raise _http_error(429, "120")

    result = guard.call("prices", {"route": "SFO-JFK"})
    assert result.code == "rate_limited" and result.attempts == 1 and waits == []
    assert "Retrying after 120 seconds may help." in result.text
    assert "wait 120 seconds before calling prices again" in result.text


def test_requests_5xx_is_transient_and_4xx_is_not() -> None:
    """requests HTTPError 503 is retried, 404 is not_found and not retried."""
    guard = Guard(limits=Limits(backoff=FAST), scan_env_secrets=False)
    seen = {"n": 0}

    def error(status: int) -> requests.HTTPError:
        response = requests.Response()
        response.status_code = status
        return requests.HTTPError(f"{status}", response=response)

    @guard.tool
    def fetch(item: str) -> str:
        seen["n"] += 1
        raise error(503 if item == "a" else 404)

    assert guard.call("fetch", {"item": "a"}).code == "unavailable"
    assert seen["n"] == 3
    assert guard.call("fetch", {"item": "b"}).code == "not_found"
    assert seen["n"] == 4


def test_budget_calls_per_turn_is_an_incident() -> None:
    """The per-turn ceiling returns budget_exceeded telling the model to stop, and is recorded."""
    guard = Guard(limits=Limits(max_calls_per_turn=3), scan_env_secrets=False)
    ran = {"n": 0}

    @guard.tool
    def ping(n: int) -> int:
        ran["n"] += 1
        return n

    results = [guard.call("ping", {"n": i}) for i in range(5)]
    assert [r.ok for r in results] == [True, True, True, False, False]
    assert results[3].code == "budget_exceeded"
    assert "stop calling tools and report" in results[3].text
    assert ran["n"] == 3
    assert [i.kind for i in guard.incidents].count(IncidentKind.BUDGET_EXCEEDED) == 2
    guard.new_turn()
    assert guard.call("ping", {"n": 9}).ok


def test_budget_spend_per_task_persists_across_turns() -> None:
    """Spend is per task: it carries across turns and a call that would cross it is refused."""
    guard = Guard(limits=Limits(max_spend_per_task=1.0), scan_env_secrets=False)

    @guard.tool(cost=0.4)
    def search(q: str) -> str:
        return q

    assert guard.call("search", {"q": "a"}).ok
    guard.new_turn()
    assert guard.call("search", {"q": "b"}).ok
    refused = guard.call("search", {"q": "c"})
    assert refused.code == "budget_exceeded" and "spent 0.8 of its 1 budget" in refused.text
    assert guard.incidents[-1].kind is IncidentKind.BUDGET_EXCEEDED


def test_invalid_arguments_do_not_charge_spend() -> None:
    """A call rejected before dispatch gives its cost back."""
    guard = Guard(limits=Limits(max_spend_per_task=1.0), scan_env_secrets=False)

    @guard.tool(cost=0.6)
    def search(q: str) -> str:
        return q

    assert guard.call("search", {"q": 1}).code == "invalid_argument"
    assert guard.call("search", {"q": "ok"}).ok


async def test_async_tools_and_async_callers() -> None:
    """acall runs async and sync tools; call runs async tools too."""
    guard = Guard(limits=Limits(backoff=FAST), scan_env_secrets=False)
    state = {"n": 0}

    @guard.tool
    async def slow_add(a: int, b: int) -> int:
        await asyncio.sleep(0)
        state["n"] += 1
        if state["n"] == 1:
            raise ConnectionError("blip")
        return a + b

    @guard.tool
    def mul(a: int, b: int) -> int:
        return a * b

    first = await guard.acall("slow_add", {"a": 1, "b": 2})
    assert first.ok and first.text == "3" and first.attempts == 2
    assert (await guard.acall("mul", '{"a": 2, "b": 4}')).text == "8"
    bad = await guard.acall("mul", {"a": "x", "b": 1})
    assert bad.code == "invalid_argument"
    assert guard.call("slow_add", {"a": 2, "b": 2}).text == "4"


def test_sync_call_of_async_tool_inside_running_loop() -> None:
    """Guard.call works on an async tool even when the caller is inside an event loop."""
    guard = Guard(scan_env_secrets=False)

    @guard.tool
    async def hello(name: str) -> str:
        return f"hi {name}"

    async def main() -> ToolResult:
        return guard.call("hello", {"name": "ada"})

    assert asyncio.run(main()).text == "hi ada"


async def test_parallel_calls_run_concurrently() -> None:
    """arun_tool_calls overlaps a turn's async calls and keeps their order."""
    guard = Guard(scan_env_secrets=False)
    live = {"now": 0, "peak": 0}

    @guard.tool
    async def work(n: int) -> int:
        live["now"] += 1
        live["peak"] = max(live["peak"], live["now"])
        await asyncio.sleep(0.05)
        live["now"] -= 1
        return n

    results = await guard.arun_tool_calls([("work", {"n": 1}), ("work", {"n": 2}),
                                           {"name": "work", "arguments": '{"n": 3}'}])
    assert [r.text for r in results] == ["1", "2", "3"]
    assert live["peak"] == 3


def test_run_tool_calls_accepts_common_shapes() -> None:
    """The plain-loop helper takes tuples, OpenAI-style dicts and objects with name/arguments."""
    guard, _ = make_guard()

    class Call:
        name = "search_flights_any_price"
        arguments = '{"origin": "SFO", "destination": "JFK"}'
        id = "c3"

    results = guard.run_tool_calls([
        ("search_flights", {**BAD, "max_price": 10}),
        {"id": "c2", "function": {"name": "search_flights", "arguments": json.dumps(BAD)}},
        Call(),
    ])
    assert [r.ok for r in results] == [True, False, True]
    assert results[1].call_id == "c2" and results[2].call_id == "c3"


def test_tool_context_is_injected_and_not_in_schema() -> None:
    """A ToolContext parameter is filled by the guard and hidden from the model's schema."""
    guard = Guard(scan_env_secrets=False)
    seen: list[ToolContext] = []

    @guard.tool
    def whoami(name: str, ctx: ToolContext) -> str:
        seen.append(ctx)
        return name

    assert "ctx" not in guard.tools["whoami"].schema["properties"]
    assert guard.call("whoami", {"name": "a"}, call_id="abc").ok
    assert seen[0].call_id == "abc" and seen[0].tool == "whoami" and seen[0].attempt == 1


def test_tool_error_fields_override_catalog() -> None:
    """retryable, outcome, failure class and alternatives given on ToolError are honoured."""
    guard = Guard(limits=Limits(backoff=Backoff(attempts=1)), scan_env_secrets=False)

    @guard.tool
    def transfer(amount: int) -> str:
        raise ToolError("ledger_locked", "the ledger is locked for maintenance",
                        retryable=True, failure_class=FailureClass.TRANSIENT,
                        alternatives=["schedule_transfer"], retry_after=30)

    result = guard.call("transfer", {"amount": 1})
    assert result.code == "ledger_locked" and result.retryable
    assert "Retrying after 30 seconds may help." in result.text
    assert "call schedule_transfer" in result.text
    assert result.data["retry_after"] == 30


def test_structured_problem_matches_text() -> None:
    """result.data on failure is an RFC 9457-style problem with the same content as the text."""
    guard, _ = make_guard()
    problem = guard.call("search_flights", BAD).data
    assert problem["type"] == "urn:toolfault:error:invalid_argument"
    assert problem["code"] == "invalid_argument"
    assert problem["detail"] == "max_price must be greater than 0."
    assert problem["effect"] == "none" and problem["retryable"] is False
    assert problem["rejected_arguments"] == json.dumps(BAD)
    assert problem["next_action"].startswith("call search_flights again")


def test_observer_errors_never_break_the_call(tmp_path: Any) -> None:
    """A broken observer is ignored; the JSONL trace gets one line per call."""
    trace = tmp_path / "run.jsonl"

    def broken(event: Any) -> None:
        raise RuntimeError("observer bug")

    guard, _ = make_guard(observers=[broken], trace=trace)
    assert guard.call("search_flights", BAD).code == "invalid_argument"
    guard.call("search_flights", {**BAD, "max_price": 3})
    guard.close()
    lines = [json.loads(line) for line in trace.read_text().splitlines()]
    assert [line["ok"] for line in lines if line["type"] == "call"] == [False, True]
    assert lines[0]["code"] == "invalid_argument" and lines[0]["error_tokens"] > 0


def test_unknown_tool_wins_over_bad_json() -> None:
    """A call to a tool that does not exist is unknown_tool even when its arguments are not JSON."""
    guard, _ = make_guard()
    result = guard.call("free_text_tool", "just some words")
    assert result.code == "unknown_tool"
    assert 'Rejected arguments: "just some words".' in result.text


def test_shape_formats_an_outside_exception_without_counting() -> None:
    """Guard.shape turns an exception caught elsewhere into the four-part text, uncounted."""
    guard, calls = make_guard()
    shaped = [guard.shape("search_flights", BAD, TimeoutError("slow")) for _ in range(4)]
    assert all(r.code == "timeout" and not r.terminal for r in shaped)
    assert guard.shape("search_flights", "{bad", ValueError("x")).code == "invalid_json"
    assert calls["search_flights"] == 0


def test_three_tuple_without_id_gets_a_generated_id() -> None:
    """(name, args, None) does not produce the call id 'None'."""
    guard, _ = make_guard()
    (result,) = guard.run_tool_calls([("search_flights", {**BAD, "max_price": 5}, None)])
    assert result.call_id != "None"


def test_scoped_guard_counts_separately_but_shares_tools() -> None:
    """A scoped guard shares the registry and store but has its own task counters."""
    guard, calls = make_guard()
    other = guard.scoped("session-2")
    for _ in range(3):
        guard.call("search_flights", BAD)
    assert guard.call("search_flights", BAD).blocked
    first = other.call("search_flights", BAD)
    assert not first.terminal and not first.blocked
    assert other.task_id == "session-2" and guard.task_id == "default"
    assert calls["search_flights"] == 4


def test_parameter_named_in_reason_needs_a_whole_word() -> None:
    """A one-letter argument is not "named" by every reason that contains that letter."""
    guard = Guard(scan_env_secrets=False)

    @guard.tool
    def pair(a: int, b: int) -> int:
        raise ToolError("invalid_argument", "the values do not match")

    text = guard.call("pair", {"a": 1, "b": 2}).text
    assert "with the rejected argument corrected" in text


def test_5xx_on_a_side_effect_is_unknown_but_503_is_not() -> None:
    """A 504 after a side-effecting request may have landed; a 503 says it was not served."""
    guard = Guard(limits=Limits(backoff=FAST), scan_env_secrets=False)
    ran = {"n": 0}

    @guard.tool(side_effect=True)
    def charge(amount: int) -> str:
        ran["n"] += 1
        raise _http_error(504 if amount == 1 else 503)

    gateway = guard.call("charge", {"amount": 1})
    assert gateway.outcome is Outcome.UNKNOWN and gateway.attempts == 1
    unavailable = guard.call("charge", {"amount": 2})
    assert unavailable.outcome is Outcome.NO_EFFECT and unavailable.attempts == 3


def test_fast_success_path_matches_the_general_path() -> None:
    """A first-attempt success reports the same fingerprint and redacted event either way."""
    from toolfault import fingerprint

    events: list[Any] = []
    fast = Guard(observers=[events.append], scan_env_secrets=False)
    slow = Guard(observers=[events.append], limits=Limits(max_calls_per_turn=100),
                 scan_env_secrets=False)
    for guard in (fast, slow):
        guard.tool(name="login")(lambda user, password: f"hi {user}")
    args = {"user": "ada", "password": "pw-123456"}
    a, b = fast.call("login", args), slow.call("login", args)
    assert (a.text, a.ok, a.attempts) == (b.text, b.ok, b.attempts)
    assert a.fingerprint == b.fingerprint == fingerprint("login", args)
    assert events[0].fingerprint == events[1].fingerprint == a.fingerprint
    assert events[0].args == events[1].args == {"user": "ada", "password": "[REDACTED]"}
    assert events[0].to_dict()["type"] == "call"


def test_async_tool_behind_a_plain_decorator_is_awaited() -> None:
    """A coroutine returned by a wrapped async tool is run, not reported as the result."""
    import functools

    sent: list[str] = []

    def logged(fn: Any) -> Any:
        @functools.wraps(fn)
        def wrapper(*a: Any, **k: Any) -> Any:
            return fn(*a, **k)
        return wrapper

    async def send_email(to: str) -> str:
        sent.append(to)
        return "sent"

    guard = Guard(scan_env_secrets=False)
    guard.tool(name="send_email")(logged(send_email))
    assert guard.call("send_email", {"to": "ada"}).text == "sent"
    assert asyncio.run(guard.acall("send_email", {"to": "bob"})).text == "sent"
    assert sent == ["ada", "bob"]


def test_base_exceptions_from_tools_are_shaped_on_every_path() -> None:
    """A tool raising a non-Exception BaseException is internal_error, fast path or not."""

    class Abort(BaseException):
        pass

    for limits in (Limits(), Limits(max_calls_per_turn=100)):
        guard = Guard(limits=limits, scan_env_secrets=False)

        @guard.tool
        def explode(x: int) -> int:
            raise Abort

        assert guard.call("explode", {"x": 1}).code == "internal_error"


def test_different_invalid_json_is_not_counted_as_identical() -> None:
    """Two different malformed argument strings of equal length have separate counters."""
    guard = Guard(limits=Limits(retry_limit=2), scan_env_secrets=False)
    guard.tool(name="search")(lambda q, limit: q)
    a = '{"q": "' + "x" * 70 + '", "limit": 1O}'
    b = '{"q": "' + "x" * 70 + '", "limit": 10 '
    assert len(a) == len(b)
    assert not guard.call("search", a).terminal
    assert not guard.call("search", b).terminal
    assert guard.call("search", a).terminal


def test_many_keys_are_cheap_to_shape() -> None:
    """An unknown tool called with a hundred thousand keys is shaped without regex storms."""
    import time as _time

    guard = Guard(scan_env_secrets=False)
    guard.tool(name="h")(lambda: "x")
    args = {f"k{i}": i for i in range(100_000)}
    started = _time.process_time()
    assert guard.call("nope", args).code == "unknown_tool"
    assert guard.call("h", args).code == "invalid_argument"
    assert _time.process_time() - started < 30  # generous: the old path took minutes here


def test_wide_tools_keep_validation_messages_near_the_budget() -> None:
    """Two bad arguments on an eight-parameter tool still fit about 100 tokens."""
    guard = Guard(scan_env_secrets=False)

    @guard.tool(alternatives={"search_any": "if no budget constraint applies"})
    def search(origin: str, destination: str, date: str, cabin: str = "economy",
               passengers: Annotated[int, Field(ge=1, le=9)] = 1, max_price: float = 0.0,
               nonstop: bool = False, airline: str = "") -> str:
        return "ok"

    result = guard.call("search", {"origin": "SFO", "destination": "JFK", "date": "2025-01-02",
                                   "passengers": "two", "nonstop": "maybe", "seat": "aisle"})
    assert result.code == "invalid_argument"
    assert count_tokens(result.text) <= 110
    assert "an integer from 1 to 9" in result.text


def test_alternative_comes_before_stop_and_report() -> None:
    """When the catalog says stop, a named alternative is offered first."""
    guard = Guard(scan_env_secrets=False)

    @guard.tool(alternatives=["read_public_copy"])
    def read_secret_file(name: str) -> str:
        raise PermissionError("denied")

    text = guard.call("read_secret_file", {"name": "plan"}).text
    assert text.endswith("Next action: call read_public_copy, or stop and report to the user "
                         "that permission is missing.")


def test_run_tool_calls_prefers_call_id_over_item_id() -> None:
    """A Responses-style dict item answers to its call_id, not its item id."""
    guard, _ = make_guard()
    item = {"type": "function_call", "id": "fc_1", "call_id": "call_1",
            "name": "search_flights_any_price", "arguments": '{"origin": "A", "destination": "B"}'}
    (result,) = guard.run_tool_calls([item])
    assert result.call_id == "call_1"


def test_an_int_sent_for_a_float_parameter_stays_an_int() -> None:
    """The tool receives what the model sent where it satisfies the annotation (int for float)."""
    guard = Guard(scan_env_secrets=False)
    seen: list[Any] = []

    @guard.tool
    def scale(factor: float, weights: list[float], limits: dict[str, float] | None = None) -> str:
        seen.append((factor, weights, limits))
        return "ok"

    assert guard.call("scale", {"factor": 3, "weights": [1, 2.5], "limits": {"a": 2}}).ok
    assert guard.call("scale", '{"factor": 3, "weights": [1]}').ok
    assert guard.call("scale", {"factor": 2.5, "weights": []}).ok
    assert guard.call("scale", {"factor": "4", "weights": []}).ok  # lax: a string is converted
    types = [(type(f), [type(w) for w in ws], limits) for f, ws, limits in seen]
    assert types == [(int, [int, float], {"a": 2}), (int, [int], None), (float, [], None),
                     (float, [], None)]
    assert type(seen[0][2]["a"]) is int


def test_run_tool_calls_answers_malformed_items_with_invalid_call() -> None:
    """Malformed batch items get a four-part invalid_call in place; the good items still run."""
    guard = Guard(scan_env_secrets=False)
    ran: list[int] = []

    @guard.tool
    def add(a: int, b: int) -> int:
        ran.append(a + b)
        return a + b

    batch: list[Any] = [None, 42, ("add",), {"arguments": {}},
                        {"type": "function", "function": {"arguments": "{}"}, "id": "c1"},
                        {"name": 5}, ("add", {"a": 1, "b": 2}), {"name": "add", "args": {"a": 2,
                                                                                      "b": 2}}]
    results = guard.run_tool_calls(batch)
    assert [r.code for r in results] == ["invalid_call"] * 6 + [None, None]
    assert ran == [3, 4]
    assert results[3].text == (
        "tool_call failed (code: invalid_call).\n"
        "Reason: the tool call has no tool name.\n"
        'Rejected arguments: {"arguments": {}}.\n'
        "Effect: none. Retrying the same call will not help.\n"
        "Next action: send each tool call with a tool name and a JSON object of arguments."
    )
    assert results[4].call_id == "c1"
    assert "not NoneType" in results[0].text and "not 1 items" in results[2].text
    assert "must be a non-empty string, not int" in results[5].text
    assert [r.code for r in guard.run_tool_calls(None)] == ["invalid_call"]  # type: ignore[arg-type]
    assert [r.code for r in asyncio.run(guard.arun_tool_calls([42, ("add", {"a": 1, "b": 1})]))
            ] == ["invalid_call", None]


def test_a_tool_spec_is_frozen_and_a_changed_copy_takes_effect() -> None:
    """Assigning to a spec raises (a silently ignored timeout was a bug); a changed copy given
    to add_spec replaces the tool, and its derived settings follow it."""
    import dataclasses
    import time

    guard = Guard(scan_env_secrets=False, limits=Limits(backoff=Backoff(attempts=1)))

    @guard.tool
    def slow(x: int) -> int:
        time.sleep(0.3)
        return x

    with pytest.raises(dataclasses.FrozenInstanceError):
        guard.tools["slow"].timeout = 0.05  # type: ignore[misc]
    assert guard.tools["slow"].direct
    guard.add_spec(dataclasses.replace(guard.tools["slow"], timeout=0.05))
    assert not guard.tools["slow"].direct
    assert guard.call("slow", {"x": 1}).code == "timeout"
    with pytest.raises(ConfigurationError):
        guard.add_spec("slow")  # type: ignore[arg-type]


def test_a_removed_tool_is_unknown_until_registered_again() -> None:
    """remove_tool unregisters a tool (giving back its spec); a call of it is then
    unknown_tool, naming the tools there are; removing it again gives ``None``."""
    guard = Guard(scan_env_secrets=False)

    @guard.tool
    def lookup(city: str) -> str:
        """Look a city up. Use it for populations."""
        return city

    @guard.tool
    def forecast(city: str) -> str:
        """Forecast a city's weather. Use it before travel."""
        raise ValueError(f"no forecast for {city}")

    assert not guard.call("forecast", {"city": "Oslo"}).ok
    spec = guard.remove_tool("forecast")
    assert spec is not None and spec.name == "forecast"
    assert set(guard.tools) == {"lookup"}
    gone = guard.call("forecast", {"city": "Oslo"})
    assert gone.code == "unknown_tool" and "lookup" in gone.text
    assert guard.remove_tool("forecast") is None
    guard.add_spec(spec)  # registered again: its body runs again
    again = guard.call("forecast", {"city": "Bergen"})
    assert not again.ok and "no forecast for Bergen" in again.text
