"""LangChain/LangGraph adapter, driven through real langchain-core tools and a LangGraph graph."""

from __future__ import annotations

import json
import re
import runpy
from pathlib import Path
from typing import Annotated, Any

import pytest
from _frameworks import require
from pydantic import Field

from toolfault import Backoff, Guard, Limits, ToolError

require("langchain_core")
require("langgraph")

from langchain_core.language_models.fake_chat_models import GenericFakeChatModel  # noqa: E402
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage  # noqa: E402
from langchain_core.tools import (  # noqa: E402
    BaseTool,
    InjectedToolArg,
    StructuredTool,
    ToolException,
    tool,
)
from langchain_core.utils.function_calling import convert_to_openai_tool  # noqa: E402
from langgraph.graph import START, MessagesState, StateGraph  # noqa: E402
from langgraph.prebuilt import ToolNode, tools_condition  # noqa: E402

from toolfault.adapters.langchain import (  # noqa: E402
    GuardedTool,
    guard_langchain_tool,
    halted,
    langchain_tools,
)

FAST_BACKOFF = Backoff(initial=0.001, jitter=0, maximum=0.01)
TERMINAL = "Retrying the same call is not allowed."


class Tools:
    """A guard with one tool per scenario, counting how often each body ran."""

    def __init__(self) -> None:
        self.runs: dict[str, int] = {}
        self.guard = guard = Guard(limits=Limits(backoff=FAST_BACKOFF))

        @guard.tool(alternatives={"search_flights_any_price": "if no budget applies"})
        def search_flights(origin: str, max_price: Annotated[int, Field(gt=0)]) -> dict[str, Any]:
            """Find flights under a price."""
            self._ran("search_flights")
            return {"origin": origin, "flights": ["TF100"]}

        @guard.tool
        def get_fare(flight_id: str) -> dict[str, Any]:
            """A fare from a service that drops the first connection."""
            if self._ran("get_fare") == 1:
                raise ConnectionError("connection reset by peer")
            return {"flight_id": flight_id, "fare": 320}

        @guard.tool
        def find_city(city: str) -> str:
            """Look up a city that never exists."""
            self._ran("find_city")
            raise ToolError("not_found", f"there is no city named {city!r}", param="city")

        @guard.tool
        async def aget_fare(flight_id: str) -> dict[str, Any]:
            """Async twin of get_fare."""
            if self._ran("aget_fare") == 1:
                raise ConnectionError("connection reset by peer")
            return {"flight_id": flight_id, "fare": 320}

    def _ran(self, name: str) -> int:
        self.runs[name] = self.runs.get(name, 0) + 1
        return self.runs[name]


@pytest.fixture
def tools() -> Tools:
    return Tools()


def ai_call(name: str, args: dict[str, Any], call_id: str) -> AIMessage:
    return AIMessage(content="", tool_calls=[{"name": name, "args": args, "id": call_id,
                                              "type": "tool_call"}])


def graph(lc_tools: list[BaseTool], script: list[BaseMessage]) -> Any:
    """agent -> ToolNode (default error handling) -> agent, the agent a scripted fake model."""
    model = GenericFakeChatModel(messages=iter(script))

    def agent(state: MessagesState) -> dict[str, list[BaseMessage]]:
        return {"messages": [model.invoke(state["messages"])]}

    builder = StateGraph(MessagesState)
    builder.add_node("agent", agent)
    builder.add_node("tools", ToolNode(lc_tools))
    builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", tools_condition)
    builder.add_edge("tools", "agent")
    return builder.compile()


def tool_messages(state: dict[str, Any]) -> list[ToolMessage]:
    return [m for m in state["messages"] if isinstance(m, ToolMessage)]


def run_graph(lc_tools: list[BaseTool], *calls: AIMessage) -> list[ToolMessage]:
    app = graph(lc_tools, [*calls, AIMessage(content="done")])
    out = app.invoke({"messages": [HumanMessage("book me a flight")]})
    assert out["messages"][-1].content == "done"  # the graph ran to the end, never crashed
    return tool_messages(out)


def test_tools_publish_the_guard_schema_unvalidated_by_langchain(tools: Tools) -> None:
    """args_schema is the guard's JSON Schema, so the model sees it and LangChain skips it."""
    lc = {t.name: t for t in langchain_tools(tools.guard)}
    assert set(lc) == set(tools.guard.tools)
    spec = tools.guard.tools["search_flights"]
    assert isinstance(lc["search_flights"], GuardedTool)
    assert lc["search_flights"].args_schema == spec.schema
    published = convert_to_openai_tool(lc["search_flights"])["function"]
    assert published["name"] == "search_flights"
    assert published["description"] == "Find flights under a price."
    assert published["parameters"]["properties"] == spec.schema["properties"]
    assert published["parameters"]["required"] == spec.schema["required"]


def test_invalid_argument_in_a_graph_is_an_error_tool_message(tools: Tools) -> None:
    """A bad argument in ToolNode: status=error, the call's id, the four-part text; no run."""
    [message] = run_graph(langchain_tools(tools.guard),
                          ai_call("search_flights", {"origin": "SFO", "max_price": -1}, "c1"))
    assert message.status == "error"
    assert message.tool_call_id == "c1"
    assert message.name == "search_flights"
    assert isinstance(message.content, str)
    lines = message.content.splitlines()
    assert lines[0] == "search_flights failed (code: invalid_argument)."
    assert lines[1].startswith("Reason: max_price")
    assert lines[2] == 'Rejected arguments: {"origin": "SFO", "max_price": -1}.'
    assert lines[3].startswith("Effect: none.")
    assert "search_flights_any_price" in lines[4]
    assert "search_flights" not in tools.runs


def test_transient_failure_is_retried_inside_the_wrapper(tools: Tools) -> None:
    """A ConnectionError once, then success: the body ran twice and the graph saw success."""
    [message] = run_graph(langchain_tools(tools.guard),
                          ai_call("get_fare", {"flight_id": "TF100"}, "c1"))
    assert message.status == "success"
    assert tools.runs["get_fare"] == 2
    assert json.loads(str(message.content)) == {"flight_id": "TF100", "fare": 320}
    assert message.artifact == {"flight_id": "TF100", "fare": 320}


def test_identical_failures_end_in_the_terminal_stop(tools: Tools) -> None:
    """The model repeats a failing call: the body runs up to the cap, the blocked repeat gets
    the terminal stop again, then the turn halts."""
    calls = [ai_call("find_city", {"city": "Atlantis"}, f"c{i}") for i in range(5)]
    messages = run_graph(langchain_tools(tools.guard), *calls)
    assert [m.tool_call_id for m in messages] == ["c0", "c1", "c2", "c3", "c4"]
    assert all(m.status == "error" for m in messages)
    assert str(messages[0].content).startswith("find_city failed (code: not_found).")
    assert TERMINAL not in str(messages[0].content)
    assert TERMINAL in str(messages[1].content)
    assert messages[2].content == messages[1].content
    assert [halted(m) for m in messages] == [False, False, False, True, True]
    assert tools.runs["find_city"] == 2


def test_success_in_a_graph(tools: Tools) -> None:
    """A good call: status=success, JSON text for the model, the value as the artifact."""
    [message] = run_graph(langchain_tools(tools.guard),
                          ai_call("search_flights", {"origin": "SFO", "max_price": 500}, "c1"))
    assert message.status == "success"
    assert message.tool_call_id == "c1"
    assert json.loads(str(message.content)) == {"origin": "SFO", "flights": ["TF100"]}
    assert message.artifact == {"origin": "SFO", "flights": ["TF100"]}


def test_parallel_calls_in_one_message_each_get_their_own_result(tools: Tools) -> None:
    """Two tool calls in one AI message: one success and one error, matched by id."""
    both = AIMessage(content="", tool_calls=[
        {"name": "search_flights", "args": {"origin": "SFO", "max_price": 500}, "id": "ok",
         "type": "tool_call"},
        {"name": "search_flights", "args": {"origin": "SFO"}, "id": "bad",
         "type": "tool_call"},
    ])
    messages = {m.tool_call_id: m for m in run_graph(langchain_tools(tools.guard), both)}
    assert messages["ok"].status == "success"
    assert messages["bad"].status == "error"
    assert "max_price is required" in str(messages["bad"].content)


async def test_async_graph_runs_async_tools_through_acall(tools: Tools) -> None:
    """ainvoke drives the async path: the async tool recovers from its transient failure."""
    app = graph(langchain_tools(tools.guard),
                [ai_call("aget_fare", {"flight_id": "TF1"}, "c1"), AIMessage(content="done")])
    out = await app.ainvoke({"messages": [HumanMessage("fare?")]})
    [message] = tool_messages(out)
    assert message.status == "success"
    assert tools.runs["aget_fare"] == 2


def test_direct_invoke_with_a_dict_returns_text_and_with_a_tool_call_a_message(
        tools: Tools) -> None:
    """Outside a graph: dict input gives the text, ToolCall input the error ToolMessage."""
    search = langchain_tools(tools.guard, ["search_flights"])[0]
    text = search.invoke({"origin": 7})
    assert isinstance(text, str)
    assert text.startswith("search_flights failed (code: invalid_argument).")
    message = search.invoke({"type": "tool_call", "id": "x1", "name": "search_flights",
                             "args": {"origin": 7}})
    assert isinstance(message, ToolMessage)
    assert message.status == "error"
    assert message.tool_call_id == "x1"
    assert TERMINAL in str(message.content)  # the same call again: counted across both forms
    assert search.invoke({"origin": "SFO", "max_price": 9}) == \
        '{"origin":"SFO","flights":["TF100"]}'


def test_langchain_tools_picks_names_in_order_and_rejects_unknown_ones(tools: Tools) -> None:
    """names= selects and orders tools; an unknown name fails loudly at wiring time."""
    picked = langchain_tools(tools.guard, ["get_fare", "search_flights"])
    assert [t.name for t in picked] == ["get_fare", "search_flights"]
    with pytest.raises(KeyError, match="nope"):
        langchain_tools(tools.guard, ["nope"])


def test_guarding_an_existing_tool_shapes_its_tool_exception() -> None:
    """An existing @tool's ToolException becomes a four-part message; successes pass through."""
    guard = Guard(limits=Limits(backoff=FAST_BACKOFF))
    ran: list[str] = []

    @tool
    def get_weather(city: str) -> str:
        """Weather for a city."""
        ran.append(city)
        if city != "Oslo":
            raise ToolException(f"unknown city {city!r}; try 'Oslo'")
        return "sunny"

    guarded = guard_langchain_tool(guard, get_weather)
    assert "get_weather" in guard.tools
    messages = run_graph([guarded], ai_call("get_weather", {"city": "Paris"}, "c1"),
                         ai_call("get_weather", {"city": "Paris"}, "c2"),
                         ai_call("get_weather", {"town": "Oslo"}, "c3"),
                         ai_call("get_weather", {"city": "Oslo"}, "c4"))
    first, second, invalid, ok = messages
    assert first.status == "error"
    assert str(first.content).splitlines()[:2] == [
        "get_weather failed (code: tool_error).", "Reason: unknown city 'Paris'; try 'Oslo'."]
    assert TERMINAL in str(second.content)
    assert invalid.status == "error"
    assert "city is required" in str(invalid.content)
    assert ok.status == "success" and ok.content == "sunny"
    assert ran == ["Paris", "Paris", "Oslo"]


async def test_guarding_an_async_only_tool_uses_its_coroutine() -> None:
    """A StructuredTool with only a coroutine is guarded through ainvoke."""
    guard = Guard(limits=Limits(backoff=FAST_BACKOFF))

    async def lookup(key: str) -> str:
        return f"value of {key}"

    async_tool = StructuredTool.from_function(coroutine=lookup, name="lookup",
                                              description="Look a key up.")
    guarded = guard_langchain_tool(guard, async_tool)
    assert await guarded.ainvoke({"key": "a"}) == "value of a"
    assert guarded.invoke({"key": "b"}) == "value of b"


def test_tools_with_injected_arguments_are_refused() -> None:
    """The model never sends injected arguments, so such a tool cannot be guarded."""

    @tool
    def with_user(query: str, user_id: Annotated[str, InjectedToolArg]) -> str:
        """Search as a user."""
        return query + user_id

    with pytest.raises(ValueError, match="injected"):
        guard_langchain_tool(Guard(), with_user)


def test_the_example_graph_runs_offline(capsys: pytest.CaptureFixture[str]) -> None:
    """examples/langchain_graph.py: error, terminal, the alternative, a recovered fare."""
    example = Path(__file__).resolve().parents[2] / "examples" / "langchain_graph.py"
    namespace = runpy.run_path(str(example))
    messages = namespace["main"]()
    statuses = [m.status for m in messages if isinstance(m, ToolMessage)]
    assert statuses == ["error", "error", "success", "success"]
    assert TERMINAL in capsys.readouterr().out


def test_the_docs_page_example_runs_and_prints_what_the_page_shows(
        capsys: pytest.CaptureFixture[str]) -> None:
    """docs/adapters/langchain.md: each program runs as shown and prints its sample output."""
    page = Path(__file__).resolve().parents[2] / "docs" / "adapters" / "langchain.md"
    markdown = page.read_text()
    programs = re.findall(r"^```python\n(.*?)^```$", markdown, re.MULTILINE | re.DOTALL)
    samples = re.findall(r"^```text\n(.*?)^```$", markdown, re.MULTILINE | re.DOTALL)
    assert len(programs) == len(samples) == 2
    for program, sample in zip(programs, samples, strict=True):
        exec(compile(program, str(page), "exec"), {"__name__": "docs_example"})
        assert capsys.readouterr().out == sample


def test_a_plain_string_input_is_answered_not_raised(tools: Tools) -> None:
    """Legacy string inputs reach the guard, which answers invalid_json instead of crashing."""
    lc = {t.name: t for t in langchain_tools(tools.guard)}
    name = next(iter(lc))
    out = lc[name].invoke("not json at all")
    assert f"{name} failed (code: invalid_json)." in str(out)
