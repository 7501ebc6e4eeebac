"""Agents SDK adapter, driven end to end by ``Runner`` with real OpenAI models against a stub."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace
from typing import Any

import pytest
from _frameworks import require

from toolfault import Guard, ToolError

agents = require("agents")
openai = require("openai")

from toolfault.adapters.agents import (  # noqa: E402
    failure_error_function,
    function_tools,
    stop_on_halt,
)

agents.set_tracing_disabled(True)

CHAT, RESPONSES = "/v1/chat/completions", "/v1/responses"
TERMINAL = "Retrying the same call is not allowed."
MODELS = pytest.mark.parametrize("api", ["chat", "responses"])


@pytest.fixture
def runs() -> dict[str, int]:
    return {}


@pytest.fixture
def guard(fast_guard: Guard, runs: dict[str, int]) -> Guard:
    def ran(name: str) -> int:
        runs[name] = runs.get(name, 0) + 1
        return runs[name]

    @fast_guard.tool
    def get_weather(city: str, days: int = 1) -> str:
        """Current weather for a city."""
        ran("get_weather")
        return f"sunny in {city}"

    @fast_guard.tool
    async def flaky_forecast(city: str) -> dict[str, Any]:
        """A forecast from a backend that drops the first connection."""
        if ran("flaky_forecast") == 1:
            raise ConnectionError("connection reset by peer")
        return {"city": city, "forecast": "rain"}

    @fast_guard.tool
    def find_city(name: str) -> str:
        """Look a city up by name."""
        ran("find_city")
        raise ToolError("not_found", f"there is no city named {name}", param="name")

    @fast_guard.tool
    def crash(x: int) -> str:
        """A tool with a bug."""
        raise RuntimeError("segfault in libfoo at 0xdeadbeef")

    return fast_guard


def _model(api: str, stub: Any, canned: SimpleNamespace, steps: list[Any]
           ) -> tuple[Any, Any]:
    client = openai.AsyncOpenAI(base_url=f"{stub.url}/v1", api_key="test", max_retries=0)
    if api == "chat":
        stub.add(CHAT, *canned.script(canned.chat, steps))
        return agents.OpenAIChatCompletionsModel(model="gpt-x", openai_client=client), client
    stub.add(RESPONSES, *canned.script(canned.response, steps))
    return agents.OpenAIResponsesModel(model="gpt-x", openai_client=client), client


async def _run(api: str, stub: Any, canned: SimpleNamespace, tools: list[Any],
               steps: list[Any]) -> Any:
    model, client = _model(api, stub, canned, steps)
    agent = agents.Agent(name="assistant", instructions="Help.", tools=tools, model=model)
    try:
        result = await agents.Runner.run(agent, "What is the weather?",
                                         run_config=agents.RunConfig(tracing_disabled=True))
    finally:
        await client.close()
    assert stub.unexpected == []
    return result


def _sent(api: str, stub: Any) -> list[list[tuple[str, str]]]:
    """Per request, the new ``(call_id, text)`` tool outputs the SDK sent to the model."""
    out: list[list[tuple[str, str]]] = []
    seen: set[str] = set()
    for body in stub.bodies(CHAT if api == "chat" else RESPONSES):
        if api == "chat":
            found = [(m["tool_call_id"], m["content"]) for m in body["messages"]
                     if m.get("role") == "tool"]
        else:
            items = body["input"] if isinstance(body["input"], list) else []
            found = [(i["call_id"], i["output"]) for i in items
                     if i.get("type") == "function_call_output"]
        out.append([f for f in found if f[0] not in seen])
        seen.update(cid for cid, _ in found)
    return out


@MODELS
async def test_invalid_argument_reaches_the_model_as_four_part_text(
        api: str, stub_server: Any, canned: SimpleNamespace, guard: Guard,
        runs: dict[str, int]) -> None:
    """The SDK sends the four-part text back for a bad call; the tool body never runs."""
    result = await _run(api, stub_server, canned, function_tools(guard),
                        [[("get_weather", {"town": "Oslo"}, "call_bad")], "I need a city."])
    assert result.final_output == "I need a city."
    [(call_id, text)] = _sent(api, stub_server)[1]
    assert call_id == "call_bad"
    lines = text.splitlines()
    assert lines[0] == "get_weather failed (code: invalid_argument)."
    assert lines[1].startswith("Reason: city is required")
    assert lines[2] == 'Rejected arguments: {"town": "Oslo"}.'
    assert lines[3] == "Effect: none. Retrying the same call will not help."
    assert lines[4].startswith("Next action: call get_weather")
    assert "get_weather" not in runs


@MODELS
async def test_transient_failure_is_retried_inside_the_wrapper(
        api: str, stub_server: Any, canned: SimpleNamespace, guard: Guard,
        runs: dict[str, int]) -> None:
    """A dropped connection is retried by the guard; the model only sees the success."""
    await _run(api, stub_server, canned, function_tools(guard),
               [[("flaky_forecast", {"city": "Oslo"}, "call_1")], "Rain."])
    assert runs["flaky_forecast"] == 2
    [(call_id, text)] = _sent(api, stub_server)[1]
    assert call_id == "call_1"
    assert json.loads(text) == {"city": "Oslo", "forecast": "rain"}


@MODELS
async def test_identical_failing_calls_end_in_the_terminal_message(
        api: str, stub_server: Any, canned: SimpleNamespace, guard: Guard,
        runs: dict[str, int]) -> None:
    """Repeating one failing call: the terminal stop at the cap, the same stop again for the
    blocked repeat (body not run), then the halt; body capped."""
    repeat = [("find_city", {"name": "Atlantis"})]
    await _run(api, stub_server, canned, function_tools(guard),
               [repeat, repeat, repeat, repeat, repeat, "I give up."])
    texts = [text for turn in _sent(api, stub_server) for _, text in turn]
    assert len(texts) == 5
    assert texts[0].startswith("find_city failed (code: not_found).")
    assert TERMINAL not in texts[0]
    assert texts[1].startswith("find_city failed 2 times with identical arguments")
    assert TERMINAL in texts[1]
    assert texts[2] == texts[1]
    assert all(text.startswith("find_city failed (code: halted).") for text in texts[3:])
    assert runs["find_city"] == 2


@MODELS
async def test_success_crash_and_tool_definitions_on_the_wire(
        api: str, stub_server: Any, canned: SimpleNamespace, guard: Guard) -> None:
    """A good call returns its value, a crashing tool does not fail the run, schemas are ours."""
    result = await _run(api, stub_server, canned, function_tools(guard),
                        [[("get_weather", {"city": "Oslo"}, "call_ok"),
                          ("crash", {"x": 1}, "call_crash")], "Sunny."])
    assert result.final_output == "Sunny."
    sent = dict(_sent(api, stub_server)[1])
    assert sent["call_ok"] == "sunny in Oslo"
    assert sent["call_crash"].startswith("crash failed (code: internal_error).")
    assert "libfoo" not in sent["call_crash"]
    assert "deadbeef" not in sent["call_crash"]
    wire = {(t.get("function") or t)["name"]: (t.get("function") or t)
            for t in stub_server.bodies()[0]["tools"]}
    assert set(wire) == {"get_weather", "flaky_forecast", "find_city", "crash"}
    assert wire["get_weather"]["parameters"] == guard.tools["get_weather"].schema
    assert wire["get_weather"]["description"] == "Current weather for a city."


@MODELS
async def test_parallel_calls_of_one_turn_run_concurrently(
        api: str, stub_server: Any, canned: SimpleNamespace, fast_guard: Guard) -> None:
    """The SDK runs one turn's guarded calls at the same time and answers each call id."""
    state = {"now": 0, "peak": 0}

    @fast_guard.tool
    async def lookup(key: str) -> str:
        """Look a key up."""
        state["now"] += 1
        state["peak"] = max(state["peak"], state["now"])
        await asyncio.sleep(0.05)
        state["now"] -= 1
        return f"value of {key}"

    await _run(api, stub_server, canned, function_tools(fast_guard),
               [[("lookup", {"key": "a"}, "call_a"), ("lookup", {"key": "b"}, "call_b")],
                "done"])
    assert state["peak"] == 2
    assert dict(_sent(api, stub_server)[1]) == {"call_a": "value of a", "call_b": "value of b"}


async def test_failure_error_function_shapes_sdk_decorated_tools(
        stub_server: Any, canned: SimpleNamespace, fast_guard: Guard) -> None:
    """A tool decorated with ``@function_tool`` gets four-part errors but, by design, no cap."""
    runs = {"n": 0}

    @agents.function_tool(failure_error_function=failure_error_function(fast_guard))
    def find_city(name: str) -> str:
        """Look a city up by name."""
        runs["n"] += 1
        raise ToolError("not_found", f"there is no city named {name}", param="name")

    repeat = [("find_city", {"name": "Atlantis"})]
    await _run("chat", stub_server, canned, [find_city],
               [[("find_city", {"town": "Atlantis"}, "call_bad"), ("find_city", "{nope")],
                repeat, repeat, repeat, "I give up."])
    texts = [text for turn in _sent("chat", stub_server) for _, text in turn]
    assert texts[0].startswith("find_city failed (code: invalid_argument).\nReason: name is")
    assert 'Rejected arguments: {"town": "Atlantis"}.' in texts[0]
    assert texts[1].startswith("find_city failed (code: invalid_json).")
    for text in texts[2:]:
        assert text.startswith("find_city failed (code: not_found).")
        assert TERMINAL not in text
    assert runs["n"] == 3


async def test_failure_error_function_redacts_the_guards_secrets(
        stub_server: Any, canned: SimpleNamespace, fast_guard: Guard) -> None:
    """Secrets registered on the guard never reach the model through the SDK's error path."""
    fast_guard.add_secret("hunter2-blue-ocean")

    @agents.function_tool(failure_error_function=failure_error_function(fast_guard))
    def charge(card: str) -> str:
        """Charge a card."""
        raise ToolError("invalid_argument", "card hunter2-blue-ocean was declined", param="card")

    await _run("chat", stub_server, canned, [charge],
               [[("charge", {"card": "visa"}, "call_1")], "Declined."])
    [(_, text)] = _sent("chat", stub_server)[1]
    assert text.startswith("charge failed (code: invalid_argument).")
    assert "hunter2-blue-ocean" not in text


def test_failure_error_function_follows_the_guards_mode_and_never_raises() -> None:
    """In observe mode the model sees the unshaped error; a bare context still gets an answer."""
    from agents.tool_context import ToolContext

    guard = Guard(mode="observe")
    fmt = failure_error_function(guard)
    ctx = ToolContext(None, tool_name="lookup", tool_call_id="call_1",
                      tool_arguments='{"key": "a"}')
    assert fmt(ctx, KeyError("a")) == "Error: KeyError: 'a'"
    guard.mode = "enforce"
    assert fmt(ctx, KeyError("a")).startswith("lookup failed (code: ")
    bare = fmt(agents.RunContextWrapper(context=None), RuntimeError("boom"))
    assert bare.startswith("tool failed (code: internal_error).")


def test_failure_error_function_names_the_parameter_to_fix() -> None:
    """Arguments the SDK rejected are checked with the guard's tool, else reported generically."""
    from agents.exceptions import ModelBehaviorError
    from agents.tool_context import ToolContext

    guard = Guard()

    @guard.tool
    def get_weather(city: str) -> str:
        """Current weather for a city."""
        return f"sunny in {city}"

    fmt = failure_error_function(guard)
    rejected = ModelBehaviorError("Invalid JSON input for tool get_weather")
    known = fmt(ToolContext(None, tool_name="get_weather", tool_call_id="call_1",
                            tool_arguments='{"town": "Oslo"}'), rejected)
    assert known.startswith("get_weather failed (code: invalid_argument).\n"
                            "Reason: city is required (a string).")
    assert "Next action: call get_weather again and include city as a string." in known
    unknown = fmt(ToolContext(None, tool_name="lookup", tool_call_id="call_2",
                              tool_arguments='{"key": "a"}'), rejected)
    assert unknown.startswith("lookup failed (code: invalid_argument).\n"
                              "Reason: the arguments do not match the tool's parameters.")
    broken = fmt(ToolContext(None, tool_name="get_weather", tool_call_id="call_3",
                             tool_arguments="{nope"), rejected)
    assert broken.startswith("get_weather failed (code: invalid_json).")


def test_failure_error_function_reports_to_observers_without_counting() -> None:
    """Each shaped error reaches the guard's observers; repeats never reach the terminal stop."""
    from agents.tool_context import ToolContext

    events: list[Any] = []
    guard = Guard(observers=[events.append])
    fmt = failure_error_function(guard)
    ctx = ToolContext(None, tool_name="find_city", tool_call_id="call_1",
                      tool_arguments='{"name": "Atlantis"}')
    error = ToolError("not_found", "there is no city named Atlantis", param="name")
    texts = [fmt(ctx, error) for _ in range(4)]
    assert all(t.startswith("find_city failed (code: not_found).") for t in texts)
    assert all(TERMINAL not in t for t in texts)
    assert [(e.tool, e.call_id, e.ok, e.code, e.terminal) for e in events] == \
        [("find_city", "call_1", False, "not_found", False)] * 4


# -- runs scope themselves; a halt ends the run ---------------------------------------------
async def _run_agent(api: str, stub: Any, canned: SimpleNamespace, tools: list[Any],
                     steps: list[Any], **agent_options: Any) -> Any:
    model, client = _model(api, stub, canned, steps)
    agent = agents.Agent(name="assistant", instructions="Help.", tools=tools, model=model,
                         **agent_options)
    try:
        return await agents.Runner.run(agent, "Find Atlantis.", max_turns=20,
                                       run_config=agents.RunConfig(tracing_disabled=True))
    finally:
        await client.close()


REPEAT = [("find_city", {"name": "Atlantis"})]


@MODELS
async def test_an_always_repeating_model_ends_with_a_final_output_naming_the_halt(
        api: str, stub_server: Any, canned: SimpleNamespace, guard: Guard,
        runs: dict[str, int]) -> None:
    """stop_on_halt: the model calls the same failing tool for ever; the run ends at cap + 2
    (the blocked repeat reads the terminal stop again, the next call is halted)."""
    result = await _run_agent(api, stub_server, canned, function_tools(guard),
                              [REPEAT] * 12, tool_use_behavior=stop_on_halt)
    assert isinstance(result.final_output, str)
    assert result.final_output.startswith("Stopped: find_city failed (code: halted).")
    # cap (2) + the blocked repeat + the halted call, then no model request
    assert len(stub_server.bodies()) == 4
    assert runs["find_city"] == 2
    sent = [text for step in _sent(api, stub_server) for _, text in step]
    assert len(sent) == 3
    assert TERMINAL not in sent[0]
    assert TERMINAL in sent[1] and sent[2] == sent[1]


@MODELS
async def test_without_stop_on_halt_every_further_call_reads_the_halt(
        api: str, stub_server: Any, canned: SimpleNamespace, guard: Guard,
        runs: dict[str, int]) -> None:
    """The default behaviour runs the model again; each further call gets the halt, no body."""
    await _run_agent(api, stub_server, canned, function_tools(guard),
                     [REPEAT] * 5 + ["I give up."])
    sent = [text for step in _sent(api, stub_server) for _, text in step]
    assert len(sent) == 5
    assert TERMINAL in sent[1] and sent[2] == sent[1]  # the blocked repeat
    assert all("(code: halted)" in text for text in sent[3:])
    assert runs["find_city"] == 2


async def test_two_runs_at_once_never_share_a_counter(
        stub_server: Any, canned: SimpleNamespace, guard: Guard, runs: dict[str, int]) -> None:
    """Two concurrent runs of one agent: each reaches its own cap, each body ran twice."""
    tools = function_tools(guard)
    model, client = _model("chat", stub_server, canned, [REPEAT] * 8)
    agent = agents.Agent(name="assistant", instructions="Help.", tools=tools, model=model,
                         tool_use_behavior=stop_on_halt)
    config = agents.RunConfig(tracing_disabled=True)
    try:
        one, two = await asyncio.gather(agents.Runner.run(agent, "a", run_config=config),
                                        agents.Runner.run(agent, "b", run_config=config))
    finally:
        await client.close()
    assert str(one.final_output).startswith("Stopped: ")
    assert str(two.final_output).startswith("Stopped: ")
    assert runs["find_city"] == 4
    assert len(stub_server.bodies()) == 8  # each run: cap (2), the blocked repeat, the halt
    assert guard.incidents == []  # nothing counted on the shared guard itself


async def test_a_new_run_starts_fresh_and_a_conversation_key_joins_runs(
        stub_server: Any, canned: SimpleNamespace, guard: Guard, runs: dict[str, int]) -> None:
    """Each run is a new turn; with conversation= both runs count under one task id."""
    tools = function_tools(guard, conversation=lambda ctx: "user-7")
    for _ in range(2):
        result = await _run_agent("chat", stub_server, canned, tools, [REPEAT] * 4,
                                  tool_use_behavior=stop_on_halt)
        assert str(result.final_output).startswith("Stopped: ")
    assert runs["find_city"] == 4  # the second run's calls were not blocked by the first's
    incidents = guard.scoped("default/conversation-user-7").incidents
    assert {i.turn for i in incidents} == {0, 1}
