"""Google ADK plugin, driven by ``Runner.run_async`` with a scripted ``BaseLlm`` (no network)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Callable
from typing import Any

import pytest
from _frameworks import require
from pydantic import Field

from toolfault import Guard, ToolError

require("google.adk")

from google.adk.agents import LlmAgent, SequentialAgent  # noqa: E402
from google.adk.apps import App  # noqa: E402
from google.adk.models.base_llm import BaseLlm  # noqa: E402
from google.adk.models.llm_request import LlmRequest  # noqa: E402
from google.adk.models.llm_response import LlmResponse  # noqa: E402
from google.adk.runners import InMemoryRunner  # noqa: E402
from google.adk.tools import FunctionTool, LongRunningFunctionTool  # noqa: E402
from google.genai import types  # noqa: E402

from toolfault.adapters.adk import ToolfaultPlugin, session_guard  # noqa: E402

TERMINAL = "Retrying the same call is not allowed."
NOTE = "(Note: same result as your previous identical call.)"
REPEAT = [("find_city", {"name": "Atlantis"})]

Step = list[tuple[str, Any]] | str


def _answered(request: LlmRequest) -> int:
    """Tool responses already in the request: where a conversation is."""
    return sum(1 for c in request.contents for p in c.parts or () if p.function_response)


class Scripted(BaseLlm):
    """A model that answers each request with the next step (tool calls or a final text), or
    with ``respond(request)`` when given; it records every request it got."""

    steps: list[Any] = Field(default_factory=list)
    respond: Any = None
    requests: list[LlmRequest] = Field(default_factory=list)

    async def generate_content_async(self, llm_request: LlmRequest, stream: bool = False
                                     ) -> AsyncGenerator[LlmResponse, None]:
        self.requests.append(llm_request)
        step = await self.respond(llm_request) if self.respond else self.steps.pop(0)
        if isinstance(step, str):
            parts = [types.Part.from_text(text=step)]
        else:
            n = len(self.requests)
            parts = [types.Part(function_call=types.FunctionCall(name=name, args=args,
                                                                 id=f"call_{n}_{i}"))
                     for i, (name, args) in enumerate(step)]
        yield LlmResponse(content=types.Content(role="model", parts=parts))


@pytest.fixture
def runs() -> dict[str, int]:
    return {}


@pytest.fixture
def tools(runs: dict[str, int]) -> list[Any]:
    def ran(name: str) -> int:
        runs[name] = runs.get(name, 0) + 1
        return runs[name]

    def get_weather(city: str, days: int = 1) -> str:
        """Current weather for a city."""
        ran("get_weather")
        return f"sunny in {city}"

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

    return [get_weather, flaky_forecast, find_city, crash]


class Session:
    """A runner with the plugin, and what one invocation of a session yielded."""

    def __init__(self, guard: Guard, agent: Any, **plugin_options: Any) -> None:
        self.runner = InMemoryRunner(app=App(
            name="app", root_agent=agent, plugins=[ToolfaultPlugin(guard, **plugin_options)]))
        self.session_id: str | None = None

    async def send(self, text: str, user: str = "u") -> list[Any]:
        if self.session_id is None:
            session = await self.runner.session_service.create_session(app_name="app",
                                                                       user_id=user)
            self.session_id = session.id
        message = types.Content(role="user", parts=[types.Part.from_text(text=text)])
        return [event async for event in self.runner.run_async(
            user_id=user, session_id=self.session_id, new_message=message)]


def _agent(tools: list[Any], steps: list[Step] | None = None,
           respond: Callable[[LlmRequest], Any] | None = None, name: str = "assistant"
           ) -> tuple[LlmAgent, Scripted]:
    model = Scripted(model="scripted", steps=list(steps or []), respond=respond, requests=[])
    return LlmAgent(name=name, model=model, tools=tools, instruction="Help."), model


def responses(events: list[Any]) -> list[Any]:
    """The tool responses of the invocation, in order."""
    return [p.function_response.response for e in events for p in e.content.parts or ()
            if p.function_response]


def final_text(events: list[Any]) -> str:
    finals = [e for e in events if e.is_final_response() and e.content and e.content.parts]
    return "".join(p.text or "" for p in finals[-1].content.parts)


async def test_invalid_argument_reaches_the_model_as_four_part_text(
        fast_guard: Guard, tools: list[Any], runs: dict[str, int]) -> None:
    """A call missing a parameter gets ``{"error": <contract>}``; the tool never ran."""
    agent, _ = _agent(tools, [[("get_weather", {"town": "Oslo"})], "I need a city."])
    events = await Session(fast_guard, agent).send("Weather?")
    assert final_text(events) == "I need a city."
    [response] = responses(events)
    assert response["error"].splitlines() == [
        "get_weather failed (code: invalid_argument).",
        "Reason: city is required (a string).",
        'Rejected arguments: {"town": "Oslo"}.',
        "Effect: none. Retrying the same call will not help.",
        "Next action: call get_weather again and include city as a string.",
    ]
    assert "get_weather" not in runs


async def test_transient_failure_is_retried_and_success_is_the_tools_value(
        fast_guard: Guard, tools: list[Any], runs: dict[str, int]) -> None:
    """A dropped connection is retried inside the wrapper; the model sees the value as ADK
    would send it."""
    agent, _ = _agent(tools, [[("flaky_forecast", {"city": "Oslo"}),
                               ("get_weather", {"city": "Oslo"})], "Rain."])
    events = await Session(fast_guard, agent).send("Forecast?")
    assert runs["flaky_forecast"] == 2
    assert responses(events) == [{"city": "Oslo", "forecast": "rain"},
                                 {"result": "sunny in Oslo"}]


async def test_a_crashing_tool_never_fails_the_invocation_nor_leaks_internals(
        fast_guard: Guard, tools: list[Any]) -> None:
    """An exception in the tool is a four-part internal_error, with no traceback detail."""
    agent, _ = _agent(tools, [[("crash", {"x": 1})], "Broken."])
    events = await Session(fast_guard, agent).send("Go")
    assert final_text(events) == "Broken."
    [response] = responses(events)
    assert response["error"].startswith("crash failed (code: internal_error).")
    assert "libfoo" not in response["error"]
    assert "deadbeef" not in response["error"]


async def test_a_stubborn_model_is_capped_and_the_halt_ends_the_invocation(
        fast_guard: Guard, tools: list[Any], runs: dict[str, int]) -> None:
    """The model repeats one failing call for ever: the body runs twice, then the terminal
    stop, the same stop again (blocked), then the halt; the final response names it and the
    model is not asked again."""
    agent, model = _agent(tools, [REPEAT] * 50)
    events = await Session(fast_guard, agent).send("Find Atlantis.")
    texts = [r["error"] for r in responses(events)]
    assert len(texts) == 4
    assert texts[0].startswith("find_city failed (code: not_found).")
    assert TERMINAL not in texts[0]
    assert texts[1].startswith("find_city failed 2 times with identical arguments")
    assert texts[2] == texts[1]
    assert texts[3].startswith("find_city failed (code: halted).")
    assert final_text(events).startswith("Stopped: find_city failed (code: halted).")
    assert len(model.requests) == 4
    assert runs["find_city"] == 2


async def test_two_sessions_at_once_are_counted_apart(
        fast_guard: Guard, tools: list[Any], runs: dict[str, int]) -> None:
    """Two concurrent sessions each fail once, interleaved: each sees a first failure."""
    both_failed = asyncio.Event()
    first = 0

    async def respond(request: LlmRequest) -> Step:
        nonlocal first
        done = _answered(request)
        if done == 0:
            return REPEAT
        if done == 1:
            first += 1
            if first == 2:
                both_failed.set()
            await asyncio.wait_for(both_failed.wait(), 5)
            return REPEAT
        return "gave up"

    agent, _ = _agent(tools, respond=respond)
    one, two = Session(fast_guard, agent), Session(fast_guard, agent)
    results = await asyncio.gather(one.send("a", user="ann"), two.send("b", user="bob"))
    for events in results:
        first_text, second_text = (r["error"] for r in responses(events))
        assert first_text.startswith("find_city failed (code: not_found).")
        assert TERMINAL in second_text  # its own second identical failure
        assert final_text(events) == "gave up"
    assert runs["find_city"] == 4
    assert fast_guard.incidents == []


async def test_a_sessions_next_invocation_is_a_new_turn_of_its_scope(
        fast_guard: Guard, tools: list[Any], runs: dict[str, int]) -> None:
    """After a halt, the user's next message runs the call again (new turn, same scope)."""
    agent, _ = _agent(tools, [REPEAT] * 4 + [REPEAT, "Still nothing."])
    session = Session(fast_guard, agent)
    assert final_text(await session.send("Find Atlantis.")).startswith("Stopped: ")
    events = await session.send("Try once more.")
    assert final_text(events) == "Still nothing."
    assert responses(events)[0]["error"].startswith("find_city failed (code: not_found).")
    assert runs["find_city"] == 3
    assert session.session_id is not None
    scope = session_guard(fast_guard, "app", "u", session.session_id)
    assert {i.turn for i in scope.incidents} == {0}


@pytest.mark.filterwarnings("ignore:SequentialAgent is deprecated:DeprecationWarning")
async def test_every_agent_is_guarded_and_a_halt_ends_the_whole_invocation(
        fast_guard: Guard, tools: list[Any], runs: dict[str, int]) -> None:
    """Two agents in sequence: the first's halt ends the invocation before the second runs."""
    first, _ = _agent(tools, [REPEAT] * 10, name="researcher")
    second, second_model = _agent(tools, ["never asked"], name="writer")
    events = await Session(fast_guard, SequentialAgent(name="team", sub_agents=[first, second])
                           ).send("Find Atlantis.")
    assert final_text(events).startswith("Stopped: find_city failed (code: halted).")
    assert second_model.requests == []
    assert runs["find_city"] == 2


async def test_a_read_repeated_once_is_answered(fast_guard: Guard, tools: list[Any]) -> None:
    """Re-reading what it already read is legitimate: both calls return the weather."""
    agent, _ = _agent(tools, [[("get_weather", {"city": "Oslo"})]] * 2 + ["Sunny."])
    events = await Session(fast_guard, agent).send("Weather?")
    assert [r["result"] for r in responses(events)] == ["sunny in Oslo"] * 2


def _sent(request: LlmRequest) -> list[dict[str, Any]]:
    """The function responses in a request the model got, in order."""
    return [p.function_response.response for c in request.contents for p in c.parts or ()
            if p.function_response and p.function_response.response is not None]


async def test_a_repeated_read_gets_the_note_beside_its_unchanged_value(
        fast_guard: Guard, tools: list[Any]) -> None:
    """The second identical read's response, as the model gets it, carries the repeat note
    under ``"note"`` beside ADK's ``{"result": value}``; the first has none."""
    agent, model = _agent(tools, [[("get_weather", {"city": "Oslo"})]] * 2 + ["Sunny."])
    events = await Session(fast_guard, agent).send("Weather?")
    assert final_text(events) == "Sunny."
    assert _sent(model.requests[-1]) == [{"result": "sunny in Oslo"},
                                         {"result": "sunny in Oslo", "note": NOTE}]


async def test_a_repeated_dict_read_is_noted_in_a_copy(fast_guard: Guard) -> None:
    """A dict the tool returns gets the note in a copy: the tool's own dict is untouched, and
    a ``note`` key of its own keeps its value (the guard's note goes under ``_note``)."""
    returned: list[dict[str, Any]] = []

    def lookup_order(order: str) -> dict[str, Any]:
        """An order's status."""
        value = {"order": order, "status": "shipped", "note": "leave at door"}
        returned.append(value)
        return value

    agent, model = _agent([lookup_order], [[("lookup_order", {"order": "A1"})]] * 2 + ["Ok."])
    events = await Session(fast_guard, agent).send("Order?")
    assert final_text(events) == "Ok."
    plain = {"order": "A1", "status": "shipped", "note": "leave at door"}
    assert _sent(model.requests[-1]) == [plain, {**plain, "_note": NOTE}]
    assert returned == [plain, plain]


async def test_a_poll_whose_result_changes_is_answered(fast_guard: Guard) -> None:
    """Polling until a job is done: every poll returns the job's state."""
    states = iter(["running", "running", "done"])

    def poll_job(job: str) -> str:
        """The state of a job."""
        return next(states)

    agent, _ = _agent([poll_job], [[("poll_job", {"job": "7"})]] * 3 + ["Done."])
    events = await Session(fast_guard, agent).send("Wait.")
    assert [r["result"] for r in responses(events)] == ["running", "running", "done"]


async def test_a_bad_call_then_the_corrected_call_succeeds(
        fast_guard: Guard, tools: list[Any]) -> None:
    """A corrected mistake is the behaviour we want: the fixed call runs and returns."""
    agent, _ = _agent(tools, [[("get_weather", {"town": "Oslo"})],
                              [("get_weather", {"city": "Oslo"})], "Sunny."])
    events = await Session(fast_guard, agent).send("Weather?")
    bad, good = responses(events)
    assert bad["error"].startswith("get_weather failed (code: invalid_argument).")
    assert good == {"result": "sunny in Oslo"}
    assert final_text(events) == "Sunny."


async def test_a_tool_awaiting_confirmation_is_left_to_adk(fast_guard: Guard) -> None:
    """ADK asks the human first; the tool does not run and no failure is counted."""
    ran: list[str] = []

    def delete_file(path: str) -> str:
        """Delete a file."""
        ran.append(path)
        return "deleted"

    agent, _ = _agent([FunctionTool(delete_file, require_confirmation=True)],
                      [[("delete_file", {"path": "a.txt"})], "Waiting."])
    events = await Session(fast_guard, agent).send("Delete a.txt")
    [response] = responses(events)
    assert "requires confirmation" in response["error"]
    assert ran == []


async def test_an_exception_from_a_call_adk_ran_is_still_shaped(fast_guard: Guard) -> None:
    """A long-running tool runs as ADK runs it; its exception is answered in the contract."""

    def start_export(table: str) -> dict[str, Any]:
        """Start an export."""
        raise PermissionError(f"no access to {table}")

    agent, _ = _agent([LongRunningFunctionTool(start_export)],
                      [[("start_export", {"table": "users"})], "No access."])
    events = await Session(fast_guard, agent).send("Export users")
    [response] = responses(events)
    assert response["error"].startswith("start_export failed (code: ")
    assert final_text(events) == "No access."

