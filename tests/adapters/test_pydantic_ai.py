"""Pydantic AI adapter, driven by ``Agent.run`` with a scripted ``FunctionModel`` (no network)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from _frameworks import require

from toolfault import ConfigurationError, Guard, ToolError

pydantic_ai = require("pydantic_ai")

from pydantic_ai import (  # noqa: E402
    Agent,
    AgentRunResultEvent,
    DeferredToolRequests,
    FunctionToolset,
)
from pydantic_ai.messages import (  # noqa: E402
    FunctionToolResultEvent,
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturn,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models.function import AgentInfo, DeltaToolCall, FunctionModel  # noqa: E402

from toolfault.adapters.pydantic_ai import GuardedToolset, conversation_guard  # noqa: E402

TERMINAL = "Retrying the same call is not allowed."
NOTE = "(Note: same result as your previous identical call.)"
REPEAT = [("find_city", {"name": "Atlantis"})]

Step = list[tuple[str, Any]] | str


@pytest.fixture
def runs() -> dict[str, int]:
    return {}


@pytest.fixture
def toolset(runs: dict[str, int]) -> FunctionToolset[Any]:
    def ran(name: str) -> int:
        runs[name] = runs.get(name, 0) + 1
        return runs[name]

    def get_weather(city: str, days: int = 1) -> str:
        """Current weather for a city."""
        ran("get_weather")
        return f"sunny in {city} for {days} days"

    async def flaky_forecast(city: str) -> dict[str, Any]:
        """A forecast from a backend that drops the first connection."""
        if ran("flaky_forecast") == 1:
            raise ConnectionError("connection reset by peer")
        return {"city": city, "forecast": "rain"}

    def find_city(name: str) -> str:
        """Look a city up by name."""
        ran("find_city")
        raise ToolError("not_found", f"there is no city named {name}", param="name")

    def crash(x: int) -> str:
        """A tool with a bug."""
        raise RuntimeError("segfault in libfoo at 0xdeadbeef")

    return FunctionToolset([get_weather, flaky_forecast, find_city, crash])


def scripted(steps: list[Step], seen: list[list[ModelMessage]] | None = None
             ) -> FunctionModel:
    """A model that answers with the next step: tool calls, or a final text (``seen``: the
    messages it was sent, per step)."""
    queue = list(steps)

    def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        if seen is not None:
            seen.append(list(messages))
        step = queue.pop(0)
        if isinstance(step, str):
            return ModelResponse(parts=[TextPart(step)])
        return ModelResponse(parts=[ToolCallPart(name, args) for name, args in step])

    async def stream(messages: list[ModelMessage], info: AgentInfo
                     ) -> AsyncIterator[str | dict[int, DeltaToolCall]]:
        step = queue.pop(0)
        if isinstance(step, str):
            yield step
        else:
            yield {i: DeltaToolCall(name, json.dumps(args), tool_call_id=f"call_{i}")
                   for i, (name, args) in enumerate(step)}

    return FunctionModel(respond, stream_function=stream)


def returns(messages: list[ModelMessage]) -> list[ToolReturnPart]:
    """Every tool return of the run, in order."""
    return [p for m in messages for p in m.parts if isinstance(p, ToolReturnPart)]


def agent(guard: Guard, toolset: Any, steps: list[Step] | FunctionModel, **options: Any
          ) -> Agent[None, str]:
    model = steps if isinstance(steps, FunctionModel) else scripted(steps)
    return Agent(model, toolsets=[GuardedToolset(toolset, guard, **options)])


async def test_invalid_argument_reaches_the_model_as_four_part_text(
        fast_guard: Guard, toolset: Any, runs: dict[str, int]) -> None:
    """A bad call comes back as a failed tool return in the contract; the body never ran."""
    result = await agent(fast_guard, toolset, [[("get_weather", {"town": "Oslo"})],
                                               "I need a city."]).run("Weather?")
    assert result.output == "I need a city."
    [part] = returns(result.all_messages())
    assert part.outcome == "failed"
    lines = str(part.content).splitlines()
    assert lines == [
        "get_weather failed (code: invalid_argument).",
        "Reason: city is required (a string).",
        'Rejected arguments: {"town": "Oslo"}.',
        "Effect: none. Retrying the same call will not help.",
        "Next action: call get_weather again and include city as a string.",
    ]
    assert "get_weather" not in runs


async def test_the_toolsets_own_validation_still_decides(
        fast_guard: Guard, toolset: Any) -> None:
    """What Pydantic AI would coerce still runs ("2" for an int); broken JSON is invalid_json."""
    result = await agent(fast_guard, toolset, [
        [("get_weather", '{"city": "Oslo", "days": "2"}')],
        [("get_weather", '{"city": "Oslo", "days": "two"}')],
        [("get_weather", '{"city": ')], "done"]).run("Weather?")
    ok, typed, broken = returns(result.all_messages())
    assert (ok.outcome, ok.content) == ("success", "sunny in Oslo for 2 days")
    assert typed.outcome == "failed"
    assert str(typed.content).startswith("get_weather failed (code: invalid_argument).\n"
                                         "Reason: days: should be a valid integer.")
    assert "Next action: call get_weather again with days as an integer." in str(typed.content)
    assert str(broken.content).startswith("get_weather failed (code: invalid_json).")


async def test_success_keeps_the_value_and_the_published_tools_are_the_toolsets(
        fast_guard: Guard, toolset: Any) -> None:
    """A tool's value reaches the model as Pydantic AI serialises it; schemas are unchanged."""
    seen: list[AgentInfo] = []
    steps: list[Step] = [[("flaky_forecast", {"city": "Oslo"})], "Rain."]

    def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        seen.append(info)
        step = steps.pop(0)
        if isinstance(step, str):
            return ModelResponse(parts=[TextPart(step)])
        return ModelResponse(parts=[ToolCallPart(n, a) for n, a in step])

    result = await agent(fast_guard, toolset, FunctionModel(respond)).run("Forecast?")
    [part] = returns(result.all_messages())
    assert part.outcome == "success"
    assert part.content == {"city": "Oslo", "forecast": "rain"}
    published = {t.name: t for t in seen[0].function_tools}
    plain = {t.name: t for t in await _definitions(toolset)}
    assert published.keys() == plain.keys()
    assert all(published[n].parameters_json_schema == plain[n].parameters_json_schema
               for n in plain)


async def _definitions(toolset: Any) -> list[Any]:
    """The tool definitions the unguarded toolset publishes."""
    seen: list[Any] = []

    def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        seen.extend(info.function_tools)
        return ModelResponse(parts=[TextPart("ok")])

    await Agent(FunctionModel(respond), toolsets=[toolset]).run("list")
    return seen


async def test_transient_failure_is_retried_inside_the_wrapper(
        fast_guard: Guard, toolset: Any, runs: dict[str, int]) -> None:
    """A dropped connection is retried by the guard; the model only sees the success."""
    result = await agent(fast_guard, toolset, [[("flaky_forecast", {"city": "Oslo"})],
                                               "Rain."]).run("Forecast?")
    assert runs["flaky_forecast"] == 2
    [part] = returns(result.all_messages())
    assert part.outcome == "success"


async def test_a_crashing_tool_never_fails_the_run_nor_leaks_internals(
        fast_guard: Guard, toolset: Any) -> None:
    """An exception in the tool is a four-part internal_error, with no traceback detail."""
    result = await agent(fast_guard, toolset, [[("crash", {"x": 1})], "Broken."]).run("Go")
    assert result.output == "Broken."
    [part] = returns(result.all_messages())
    assert str(part.content).startswith("crash failed (code: internal_error).")
    assert "libfoo" not in str(part.content)
    assert "deadbeef" not in str(part.content)


async def test_identical_failures_are_capped_and_a_stubborn_model_ends_with_a_halt(
        fast_guard: Guard, runs: dict[str, int]) -> None:
    """A model that never stops: the body runs twice, then the terminal stop, then the halt
    ends the run with an output naming it; a tool with ``max_retries=0`` never crashes it."""

    def find_city(name: str) -> str:
        """Look a city up by name."""
        runs["find_city"] = runs.get("find_city", 0) + 1
        raise ToolError("not_found", f"there is no city named {name}", param="name")

    stubborn = FunctionToolset([find_city], max_retries=0)
    result = await agent(fast_guard, stubborn, [REPEAT] * 50).run("Find Atlantis.")
    assert result.output.startswith("Stopped: find_city failed (code: halted).")
    texts = [str(p.content) for p in returns(result.all_messages())]
    assert len(texts) == 4  # cap (2), the blocked repeat, the halted call; no further request
    assert texts[0].startswith("find_city failed (code: not_found).")
    assert TERMINAL not in texts[0]
    assert texts[1].startswith("find_city failed 2 times with identical arguments")
    assert TERMINAL in texts[1] and texts[2] == texts[1]
    assert runs["find_city"] == 2


async def test_two_runs_at_once_are_counted_apart(
        fast_guard: Guard, toolset: Any, runs: dict[str, int]) -> None:
    """Two concurrent runs each fail once, interleaved: each sees a first failure, not a cap."""
    both_failed = asyncio.Event()
    first = 0

    async def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        nonlocal first
        done = len(returns(messages))
        if done == 0:
            return ModelResponse(parts=[ToolCallPart(*REPEAT[0])])
        if done == 1:
            first += 1
            if first == 2:
                both_failed.set()
            await asyncio.wait_for(both_failed.wait(), 5)
            return ModelResponse(parts=[ToolCallPart(*REPEAT[0])])
        return ModelResponse(parts=[TextPart("gave up")])

    shared = agent(fast_guard, toolset, FunctionModel(respond))
    one, two = await asyncio.gather(shared.run("a"), shared.run("b"))
    for result in (one, two):
        first_text, second_text = (str(p.content) for p in returns(result.all_messages()))
        assert first_text.startswith("find_city failed (code: not_found).")
        assert TERMINAL not in first_text
        assert TERMINAL in second_text  # its own second identical failure
    assert runs["find_city"] == 4
    assert one.conversation_id != two.conversation_id
    assert fast_guard.incidents == []  # nothing counted on the shared guard itself


async def test_a_conversations_next_run_is_a_new_turn_of_the_same_scope(
        fast_guard: Guard, toolset: Any, runs: dict[str, int]) -> None:
    """Continuing with message_history: the capped call runs again (new turn), same scope."""
    first = await agent(fast_guard, toolset, [REPEAT] * 4).run("Find Atlantis.")
    assert first.output.startswith("Stopped: ")
    second = await agent(fast_guard, toolset, [REPEAT, "Still nothing."]).run(
        "Try once more.", message_history=first.all_messages())
    assert second.output == "Still nothing."
    assert second.conversation_id == first.conversation_id
    assert str(returns(second.new_messages())[0].content).startswith(
        "find_city failed (code: not_found).")
    assert runs["find_city"] == 3
    incidents = conversation_guard(fast_guard, first.conversation_id).incidents
    assert {i.turn for i in incidents} == {0}


async def test_a_conversation_key_joins_runs_and_run_id_keeps_them_apart(
        fast_guard: Guard, toolset: Any) -> None:
    """conversation= picks the key: one user's runs share a scope; ``ctx.run_id`` splits them."""
    for _ in range(2):
        result = await agent(fast_guard, toolset, [REPEAT] * 4,
                             conversation=lambda ctx: "user-7").run("Find Atlantis.")
        assert result.output.startswith("Stopped: ")
    assert {i.turn for i in conversation_guard(fast_guard, "user-7").incidents} == {0, 1}
    apart = await agent(fast_guard, toolset, [REPEAT] * 4,
                        conversation=lambda ctx: ctx.run_id).run("Find Atlantis.")
    assert apart.output.startswith("Stopped: ")
    assert {i.turn for i in conversation_guard(fast_guard, apart.run_id).incidents} == {0}


async def test_a_read_repeated_once_is_answered(fast_guard: Guard, toolset: Any) -> None:
    """Re-reading what it already read is legitimate: both calls return the weather."""
    result = await agent(fast_guard, toolset, [[("get_weather", {"city": "Oslo"})]] * 2
                         + ["Sunny."]).run("Weather?")
    assert result.output == "Sunny."
    assert [p.outcome for p in returns(result.all_messages())] == ["success", "success"]


def _sent_last(messages: list[ModelMessage]) -> list[Any]:
    """The parts of the request the model was just sent (the tool returns and what follows)."""
    last = messages[-1]
    assert isinstance(last, ModelRequest)
    return list(last.parts)


async def test_a_repeated_read_keeps_its_value_and_the_model_sees_the_note_beside_it(
        fast_guard: Guard, toolset: Any) -> None:
    """The second identical read returns the tool's own value, and the repeat note reaches
    the model beside it (a user-prompt part from ``ToolReturn.content``); the first, none."""
    seen: list[list[ModelMessage]] = []
    model = scripted([[("get_weather", {"city": "Oslo"})]] * 2 + ["Sunny."], seen)
    result = await agent(fast_guard, toolset, model).run("Weather?")
    assert result.output == "Sunny."
    first, second = _sent_last(seen[1]), _sent_last(seen[2])
    assert [type(p) for p in first] == [ToolReturnPart]
    assert first[0].content == "sunny in Oslo for 1 days"
    assert [type(p) for p in second] == [ToolReturnPart, UserPromptPart]
    assert second[0].content == "sunny in Oslo for 1 days"  # the value, its type unchanged
    assert second[0].outcome == "success" and NOTE not in str(second[0].content)
    assert second[1].content == f"get_weather: {NOTE}"


async def test_a_tools_own_tool_return_keeps_its_parts_and_gains_the_note(
        fast_guard: Guard) -> None:
    """A tool that returns a ``ToolReturn`` keeps its value, metadata and content; the note
    follows its content."""
    def chart(city: str) -> ToolReturn:
        """A chart of a city's weather."""
        return ToolReturn(return_value={"city": city, "max": 21}, content="see the chart",
                          metadata={"rows": 3})

    seen: list[list[ModelMessage]] = []
    model = scripted([[("chart", {"city": "Oslo"})]] * 2 + ["Warm."], seen)
    result = await agent(fast_guard, FunctionToolset([chart]), model).run("Chart?")
    assert result.output == "Warm."
    first, second = _sent_last(seen[1]), _sent_last(seen[2])
    for part in (first, second):
        assert part[0].content == {"city": "Oslo", "max": 21}
        assert part[0].metadata == {"rows": 3}
    assert first[1].content == "see the chart"
    assert second[1].content == f"see the chart\nchart: {NOTE}"


async def test_a_poll_whose_result_changes_is_answered(fast_guard: Guard) -> None:
    """Polling until a job is done: every poll returns the job's state."""
    states = iter(["running", "running", "done"])

    def poll_job(job: str) -> str:
        """The state of a job."""
        return next(states)

    result = await agent(fast_guard, FunctionToolset([poll_job]),
                         [[("poll_job", {"job": "7"})]] * 3 + ["Done."]).run("Wait.")
    assert result.output == "Done."
    assert [p.content for p in returns(result.all_messages())] == ["running", "running", "done"]


async def test_a_bad_call_then_the_corrected_call_succeeds(
        fast_guard: Guard, toolset: Any) -> None:
    """A corrected mistake is the behaviour we want: the fixed call runs and returns."""
    result = await agent(fast_guard, toolset, [
        [("get_weather", {"town": "Oslo"})], [("get_weather", {"city": "Oslo"})],
        "Sunny."]).run("Weather?")
    assert result.output == "Sunny."
    bad, good = returns(result.all_messages())
    assert (bad.outcome, good.outcome) == ("failed", "success")
    assert good.content == "sunny in Oslo for 1 days"


async def test_tool_options_reach_the_guard_and_a_foreign_name_is_refused(
        fast_guard: Guard, toolset: Any) -> None:
    """tool_options are Guard.tool options; a name the guard already owns is a config error."""
    await agent(fast_guard, toolset, ["hi"], tool_options={
        "get_weather": {"alternatives": ["find_city"]}}).run("hi")
    assert [a.name for a in fast_guard.tools["get_weather"].alternatives] == ["find_city"]
    assert fast_guard.tools["find_city"].alternatives == ()

    other = Guard()

    @other.tool
    def get_weather(city: str) -> str:
        """Someone else's tool."""
        return city

    with pytest.raises(ConfigurationError, match="already registered"):
        await agent(other, toolset, ["hi"]).run("hi")


async def test_approval_required_passes_through_the_guard(fast_guard: Guard) -> None:
    """An approval toolset inside the guard still defers the call to the application."""
    ran: list[str] = []

    def delete_file(path: str) -> str:
        """Delete a file."""
        ran.append(path)
        return "deleted"

    guarded = GuardedToolset(FunctionToolset([delete_file]).approval_required(), fast_guard)
    needs_ok: Agent[None, str | DeferredToolRequests] = Agent(
        scripted([[("delete_file", {"path": "a.txt"})]]), toolsets=[guarded],
        output_type=[str, DeferredToolRequests])
    result = await needs_ok.run("Delete a.txt")
    assert isinstance(result.output, DeferredToolRequests)
    assert [c.tool_name for c in result.output.approvals] == ["delete_file"]
    assert ran == []


async def test_streamed_runs_take_the_same_path(fast_guard: Guard, toolset: Any) -> None:
    """``run_stream_events``: the four-part failure and the halt arrive as events and output."""
    stream_agent = agent(fast_guard, toolset, [REPEAT] * 10)
    texts: list[str] = []
    output: Any = None
    async with stream_agent.run_stream_events("Find Atlantis.") as events:
        async for event in events:
            if isinstance(event, FunctionToolResultEvent):
                texts.append(str(event.part.content))
            elif isinstance(event, AgentRunResultEvent):
                output = event.result.output
    assert texts[0].startswith("find_city failed (code: not_found).")
    assert isinstance(output, str) and output.startswith("Stopped: ")


def test_the_four_part_text_is_json_free_of_pydantic_dumps(
        fast_guard: Guard, toolset: Any) -> None:
    """``run_sync`` works too, and no pydantic error URL or dump reaches the model."""
    result = agent(fast_guard, toolset, [[("get_weather", {"city": ["Oslo"]})], "ok"]
                   ).run_sync("Weather?")
    [part] = returns(result.all_messages())
    text = str(part.content)
    assert text.startswith("get_weather failed (code: invalid_argument).\nReason: city: ")
    assert "errors.pydantic.dev" not in text
    assert json.loads(text.split("Rejected arguments: ", 1)[1].split(".\n", 1)[0]) == {
        "city": ["Oslo"]}

