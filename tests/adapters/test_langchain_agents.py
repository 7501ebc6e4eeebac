"""LangChain v1 ``create_agent`` with ``halt_middleware``, and LangGraph's streaming paths."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import pytest
from _frameworks import require

from toolfault import Backoff, Guard, Limits, ToolError

require("langchain_core")
require("langgraph")
require("langchain")

from langchain.agents import create_agent  # noqa: E402
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel  # noqa: E402
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage  # noqa: E402
from langgraph.checkpoint.memory import InMemorySaver  # noqa: E402

from toolfault.adapters.langchain import (  # noqa: E402
    halt_hook,
    halt_middleware,
    halted,
    langchain_tools,
    thread_guard,
)

TERMINAL = "Retrying the same call is not allowed."
FAST = Limits(backoff=Backoff(initial=0.001, jitter=0, maximum=0.01))


class Scripted(GenericFakeChatModel):
    """A scripted chat model that accepts tools (``create_agent`` binds them); it answers
    whole messages even when streamed (the fake's streaming drops tool calls)."""

    disable_streaming: bool = True

    def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
        return self


def call(name: str, args: dict[str, Any], call_id: str) -> AIMessage:
    return AIMessage("", tool_calls=[{"name": name, "args": args, "id": call_id,
                                      "type": "tool_call"}])


def stubborn() -> Scripted:
    """A model that asks for find_city("Atlantis") for ever, whatever it is told."""
    def messages() -> Iterator[AIMessage]:
        for n in itertools.count():
            yield call("find_city", {"city": "Atlantis"}, f"call_{n}")
    return Scripted(messages=messages())


@pytest.fixture
def guard() -> tuple[Guard, dict[str, int]]:
    runs: dict[str, int] = {}
    guard = Guard(limits=FAST)

    @guard.tool
    def find_city(city: str) -> str:
        """Look up a city that never exists."""
        runs["find_city"] = runs.get("find_city", 0) + 1
        raise ToolError("not_found", f"there is no city named {city!r}", param="city")

    @guard.tool
    def get_weather(city: str) -> str:
        """Current weather for a city."""
        return f"sunny in {city}"

    return guard, runs


def tool_messages(state: dict[str, Any]) -> list[ToolMessage]:
    return [m for m in state["messages"] if isinstance(m, ToolMessage)]


def test_create_agent_with_halt_middleware_ends_a_stubborn_model_normally(
        guard: tuple[Guard, dict[str, int]]) -> None:
    """The model never stops: the body runs twice, the blocked repeat reads the terminal stop
    again, the halt follows, the agent ends at END."""
    g, runs = guard
    agent = create_agent(stubborn(), langchain_tools(g), middleware=[halt_middleware()])
    out = agent.invoke({"messages": [HumanMessage("Find Atlantis.")]}, {"recursion_limit": 50})
    messages = tool_messages(out)
    assert len(messages) == 4
    assert TERMINAL in str(messages[1].content)
    assert messages[2].content == messages[1].content and not halted(messages[2])
    assert halted(messages[-1])
    final = out["messages"][-1]
    assert isinstance(final, AIMessage) and not final.tool_calls
    assert str(final.content).startswith("Stopped: find_city failed (code: halted).")
    assert runs["find_city"] == 2


async def test_the_async_path_and_threads_count_apart(
        guard: tuple[Guard, dict[str, int]]) -> None:
    """``ainvoke`` with a checkpointer: each thread halts on its own counts."""
    g, runs = guard
    agent = create_agent(stubborn(), langchain_tools(g), middleware=[halt_middleware()],
                         checkpointer=InMemorySaver())
    for thread in ("alice", "bob"):
        out = await agent.ainvoke({"messages": [HumanMessage("Find Atlantis.")]},
                                  {"configurable": {"thread_id": thread}})
        first, second, blocked, last = tool_messages(out)
        assert str(first.content).startswith("find_city failed (code: not_found).")
        assert TERMINAL in str(second.content) and blocked.content == second.content
        assert not halted(blocked) and halted(last)
        assert str(out["messages"][-1].content).startswith("Stopped: ")
    assert runs["find_city"] == 4
    assert thread_guard(g, "alice").task_id != thread_guard(g, "bob").task_id


def test_a_cooperative_model_is_left_alone(guard: tuple[Guard, dict[str, int]]) -> None:
    """Without a halt the middleware changes nothing: a failure, a success, a final answer."""
    g, _ = guard
    model = Scripted(messages=iter([call("find_city", {"city": "Atlantis"}, "call_1"),
                                    call("get_weather", {"city": "Oslo"}, "call_2"),
                                    AIMessage("Sunny in Oslo.")]))
    agent = create_agent(model, langchain_tools(g), middleware=[halt_middleware()])
    out = agent.invoke({"messages": [HumanMessage("Weather in Atlantis, else Oslo?")]})
    failed, ok = tool_messages(out)
    assert failed.status == "error" and ok.status == "success"
    assert out["messages"][-1].content == "Sunny in Oslo."


def test_the_middleware_is_the_documented_after_model_lambda(
        guard: tuple[Guard, dict[str, int]]) -> None:
    """``after_model(lambda state, runtime: halt_hook(state))`` does the same by hand."""
    from langchain.agents.middleware import after_model

    g, runs = guard
    by_hand = after_model(lambda state, runtime: halt_hook(state))
    out = create_agent(stubborn(), langchain_tools(g), middleware=[by_hand]).invoke(
        {"messages": [HumanMessage("Find Atlantis.")]}, {"recursion_limit": 50})
    assert str(out["messages"][-1].content).startswith("Stopped: ")
    assert runs["find_city"] == 2


def test_stream_updates_show_the_four_part_text_and_the_halt(
        guard: tuple[Guard, dict[str, int]]) -> None:
    """``stream(stream_mode="updates")``: each tool update carries the contract, the last
    model update the halt."""
    g, runs = guard
    agent = create_agent(stubborn(), langchain_tools(g), middleware=[halt_middleware()])
    updates = list(agent.stream({"messages": [HumanMessage("Find Atlantis.")]},
                                {"recursion_limit": 50}, stream_mode="updates"))
    streamed = [m for u in updates for node in u.values() if node
                for m in node.get("messages", ())]
    tools = [m for m in streamed if isinstance(m, ToolMessage)]
    assert [halted(m) for m in tools] == [False, False, False, True]
    assert str(tools[0].content).startswith("find_city failed (code: not_found).")
    assert TERMINAL in str(tools[1].content) and tools[2].content == tools[1].content
    assert str(streamed[-1].content).startswith("Stopped: ")
    assert runs["find_city"] == 2


async def test_astream_events_show_the_tool_errors(guard: tuple[Guard, dict[str, int]]) -> None:
    """``astream_events(version="v2")``: on_tool_end events carry the error messages."""
    g, runs = guard
    agent = create_agent(stubborn(), langchain_tools(g), middleware=[halt_middleware()])
    ends = [event async for event in agent.astream_events(
        {"messages": [HumanMessage("Find Atlantis.")]}, {"recursion_limit": 50},
        version="v2") if event["event"] == "on_tool_end"]
    outputs = [e["data"]["output"] for e in ends]
    assert len(outputs) == 4
    assert all(isinstance(o, ToolMessage) and o.status == "error" for o in outputs)
    assert outputs[2].content == outputs[1].content and TERMINAL in str(outputs[2].content)
    assert [halted(o) for o in outputs] == [False, False, False, True]
    assert runs["find_city"] == 2
