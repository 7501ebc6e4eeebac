"""LangGraph conversations: counters per thread_id, turns per user message, a halt that ends."""

from __future__ import annotations

import asyncio
import itertools
import warnings
from collections.abc import Iterator
from typing import Any

import pytest
from _frameworks import require

from toolfault import Backoff, Guard, Limits, ToolError

require("langchain_core")
require("langgraph")

from langchain_core.language_models.fake_chat_models import GenericFakeChatModel  # noqa: E402
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage  # noqa: E402
from langchain_core.tools import StructuredTool, ToolException  # noqa: E402
from langgraph.checkpoint.memory import InMemorySaver  # noqa: E402

with warnings.catch_warnings():  # create_react_agent is deprecated in favour of langchain's
    warnings.simplefilter("ignore")
    from langgraph.prebuilt import create_react_agent  # noqa: E402

from toolfault.adapters.langchain import (  # noqa: E402
    guard_langchain_tool,
    halt_hook,
    halted,
    langchain_tools,
    thread_guard,
)

TERMINAL = "Retrying the same call is not allowed."
FAST = Limits(backoff=Backoff(initial=0.001, jitter=0, maximum=0.01))


class RepeatingModel(GenericFakeChatModel):
    """A chat model that ignores every tool result and asks for the same call again."""

    def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
        return self


def repeating(name: str, args: dict[str, Any]) -> RepeatingModel:
    """A model emitting ``name(args)`` for ever, each time with a fresh call id."""
    def messages() -> Iterator[AIMessage]:
        for n in itertools.count():
            yield AIMessage("", tool_calls=[{"name": name, "args": args, "id": f"call_{n}",
                                             "type": "tool_call"}])
    return RepeatingModel(messages=messages())


class Scripted(GenericFakeChatModel):
    """A scripted chat model that accepts tools."""

    def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
        return self


def call(name: str, args: dict[str, Any], call_id: str) -> AIMessage:
    return AIMessage("", tool_calls=[{"name": name, "args": args, "id": call_id,
                                      "type": "tool_call"}])


@pytest.fixture
def guard() -> tuple[Guard, dict[str, int]]:
    runs: dict[str, int] = {}
    guard = Guard(limits=FAST)

    @guard.tool
    def find_city(city: str) -> str:
        """Look up a city that never exists."""
        runs["find_city"] = runs.get("find_city", 0) + 1
        raise ToolError("not_found", f"there is no city named {city!r}", param="city")

    return guard, runs


def tool_messages(state: dict[str, Any]) -> list[ToolMessage]:
    return [m for m in state["messages"] if isinstance(m, ToolMessage)]


def agent(guard: Guard, model: GenericFakeChatModel, **kwargs: Any) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return create_react_agent(model, langchain_tools(guard), post_model_hook=halt_hook,
                                  **kwargs)


def test_an_always_repeating_model_ends_normally_within_cap_plus_two(
        guard: tuple[Guard, dict[str, int]]) -> None:
    """create_react_agent with a model that never stops ends at END, halt last, no recursion."""
    g, runs = guard
    out = agent(g, repeating("find_city", {"city": "Atlantis"})).invoke(
        {"messages": [HumanMessage("find Atlantis")]}, {"recursion_limit": 50})
    messages = tool_messages(out)
    assert len(messages) == 4  # cap (2) + the blocked repeat + the halt
    assert runs["find_city"] == 2
    assert TERMINAL in str(messages[1].content)
    assert messages[2].content == messages[1].content  # blocked: the terminal text again
    assert halted(messages[-1]) and not any(halted(m) for m in messages[:3])
    assert isinstance(messages[-1].artifact, dict) and messages[-1].artifact["halt"] is True
    final = out["messages"][-1]
    assert isinstance(final, AIMessage) and not final.tool_calls
    assert str(final.content).startswith("Stopped: ")
    assert "halted" in str(final.content)


def test_without_the_hook_the_tool_message_still_says_halt(
        guard: tuple[Guard, dict[str, int]]) -> None:
    """Every further call of a halted turn gets the halt message and flag; the body never runs."""
    g, runs = guard
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        app = create_react_agent(repeating("find_city", {"city": "Atlantis"}),
                                 langchain_tools(g))
    out = app.invoke({"messages": [HumanMessage("find Atlantis")]}, {"recursion_limit": 12})
    messages = tool_messages(out)
    assert len(messages) >= 5
    assert TERMINAL in str(messages[1].content) and messages[2].content == messages[1].content
    assert not halted(messages[2])
    assert all(halted(m) for m in messages[3:])
    assert runs["find_city"] == 2


def test_two_thread_ids_never_share_a_counter(guard: tuple[Guard, dict[str, int]]) -> None:
    """Thread A reaches the halt; thread B's first identical call still runs the tool."""
    g, runs = guard
    app = agent(g, repeating("find_city", {"city": "Atlantis"}), checkpointer=InMemorySaver())
    a = app.invoke({"messages": [HumanMessage("find Atlantis")]},
                   {"configurable": {"thread_id": "A"}})
    b = app.invoke({"messages": [HumanMessage("find Atlantis")]},
                   {"configurable": {"thread_id": "B"}})
    for out in (a, b):
        first, second, blocked, last = tool_messages(out)
        assert str(first.content).startswith("find_city failed (code: not_found).")
        assert TERMINAL in str(second.content) and blocked.content == second.content
        assert not halted(blocked) and halted(last)
    assert runs["find_city"] == 4  # two per thread: B's calls were never blocked by A's
    assert thread_guard(g, "A").task_id == "default/thread-A"
    assert thread_guard(g, "A").task_id != thread_guard(g, "B").task_id
    assert g.incidents == []  # nothing counted on the shared guard itself


async def test_several_conversations_at_once_each_count_alone(
        guard: tuple[Guard, dict[str, int]]) -> None:
    """Five threads run concurrently against one guard; each ends at its own cap + 2."""
    g, runs = guard
    app = agent(g, repeating("find_city", {"city": "Atlantis"}), checkpointer=InMemorySaver())
    outs = await asyncio.gather(*[
        app.ainvoke({"messages": [HumanMessage("find Atlantis")]},
                    {"configurable": {"thread_id": f"t{i}"}}) for i in range(5)])
    assert [len(tool_messages(o)) for o in outs] == [4] * 5
    assert all(halted(tool_messages(o)[-1]) for o in outs)
    assert runs["find_city"] == 10


def test_a_new_user_message_in_the_thread_starts_a_new_turn(
        guard: tuple[Guard, dict[str, int]]) -> None:
    """After a halt, the user speaks again in the same thread: the call runs again."""
    g, runs = guard
    atlantis = {"city": "Atlantis"}
    model = Scripted(messages=iter([
        call("find_city", atlantis, "a1"), call("find_city", atlantis, "a2"),
        call("find_city", atlantis, "a3"), call("find_city", atlantis, "a4"),
        call("find_city", atlantis, "a5"),
        call("find_city", atlantis, "b1"), AIMessage("it does not exist"),
    ]))
    app = agent(g, model, checkpointer=InMemorySaver())
    config: Any = {"configurable": {"thread_id": "T"}}
    first = app.invoke({"messages": [HumanMessage("find Atlantis")]}, config)
    assert [m.tool_call_id for m in tool_messages(first)] == ["a1", "a2", "a3", "a4"]
    assert halted(tool_messages(first)[-1])
    second = app.invoke({"messages": [HumanMessage("try once more")]}, config)
    latest = tool_messages(second)[-1]
    assert latest.tool_call_id == "b1"
    assert not halted(latest) and TERMINAL not in str(latest.content)
    assert runs["find_city"] == 3
    assert second["messages"][-1].content == "it does not exist"


def test_plain_invoke_scopes_by_the_config_thread_id(guard: tuple[Guard, dict[str, int]]) -> None:
    """Without ToolNode, tool.invoke with a thread_id config counts in that thread's scope."""
    g, _ = guard
    [tool] = langchain_tools(g)
    args = {"city": "Atlantis"}
    x: Any = {"configurable": {"thread_id": "X"}}
    assert TERMINAL not in tool.invoke(args, x)
    terminal = tool.invoke(args, x)
    assert TERMINAL in terminal
    assert TERMINAL not in tool.invoke(args, {"configurable": {"thread_id": "Y"}})
    assert tool.invoke(args, x) == terminal  # blocked in X: the terminal text again
    assert "(code: halted)" in tool.invoke(args, x)


def test_guarding_a_content_and_artifact_tool_keeps_its_artifact() -> None:
    """The wrapped tool's (content, artifact) pair reaches the ToolMessage as it was."""
    def search(query: str) -> tuple[str, dict[str, Any]]:
        """Search the catalogue."""
        return f"2 hits for {query}", {"hits": [1, 2], "query": query}

    original = StructuredTool.from_function(search, response_format="content_and_artifact")
    guard = Guard(limits=FAST)
    guarded = guard_langchain_tool(guard, original)
    message = guarded.invoke({"name": "search", "args": {"query": "tea"}, "id": "c1",
                              "type": "tool_call"})
    assert isinstance(message, ToolMessage)
    assert message.status == "success"
    assert message.content == "2 hits for tea"
    assert message.artifact == {"hits": [1, 2], "query": "tea"}


def test_a_failure_puts_the_problem_in_the_artifact() -> None:
    """A failing guarded tool's ToolMessage carries the structured problem as its artifact."""
    def lookup(key: str) -> str:
        """Look a key up."""
        raise ToolException("no such key")

    guard = Guard(limits=FAST)
    guarded = guard_langchain_tool(guard, StructuredTool.from_function(lookup))
    message = guarded.invoke({"name": "lookup", "args": {"key": "k"}, "id": "c9",
                              "type": "tool_call"})
    assert isinstance(message, ToolMessage)
    assert message.status == "error" and message.tool_call_id == "c9"
    assert isinstance(message.artifact, dict)
    assert message.artifact["code"] == "tool_error"
    assert message.artifact.get("halt") is not True
    assert "no such key" in str(message.content)


def test_halt_hook_passes_everything_else() -> None:
    """The hook changes nothing without a halted tool message right before the model's call."""
    plain: list[BaseMessage] = [HumanMessage("hi"), call("find_city", {"city": "X"}, "c1")]
    assert halt_hook({"messages": plain}) == {}
    assert halt_hook({"messages": [HumanMessage("hi"), AIMessage("done")]}) == {}
    assert halt_hook({"messages": []}) == {}


def test_a_hand_built_graph_ends_with_halt_hook_as_a_node(
        guard: tuple[Guard, dict[str, int]]) -> None:
    """agent -> halt_hook -> tools_condition: the hand-built loop reaches END at cap + 2."""
    from langgraph.graph import START, MessagesState, StateGraph
    from langgraph.prebuilt import ToolNode, tools_condition

    g, runs = guard
    model = repeating("find_city", {"city": "Atlantis"})

    def agent_node(state: MessagesState) -> dict[str, list[BaseMessage]]:
        return {"messages": [model.invoke(state["messages"])]}

    builder = StateGraph(MessagesState)
    builder.add_node("agent", agent_node)
    builder.add_node("halt", halt_hook)
    builder.add_node("tools", ToolNode(langchain_tools(g)))
    builder.add_edge(START, "agent")
    builder.add_edge("agent", "halt")
    builder.add_conditional_edges("halt", tools_condition)
    builder.add_edge("tools", "agent")
    out = builder.compile().invoke({"messages": [HumanMessage("find Atlantis")]},
                                   {"recursion_limit": 40})
    messages = tool_messages(out)
    assert len(messages) == 4 and halted(messages[-1]) and not halted(messages[2])
    assert messages[2].content == messages[1].content
    assert runs["find_city"] == 2
    assert str(out["messages"][-1].content).startswith("Stopped: ")


def test_without_a_thread_id_each_invocation_is_its_own_conversation(
        guard: tuple[Guard, dict[str, int]]) -> None:
    """No checkpointer: two users invoking one agent each get their own cap, never the other's."""
    g, runs = guard
    app = agent(g, repeating("find_city", {"city": "Atlantis"}))
    for user in ("alice", "bob"):
        out = app.invoke({"messages": [HumanMessage(f"{user}: find Atlantis")]})
        first, second, blocked, last = tool_messages(out)
        assert TERMINAL not in str(first.content)
        assert TERMINAL in str(second.content) and blocked.content == second.content
        assert not halted(blocked) and halted(last)
    assert runs["find_city"] == 4
    assert g.incidents == []


def test_resume_after_an_interrupt_never_re_dispatches_a_recorded_side_effect() -> None:
    """LangGraph re-runs the whole ToolNode on resume: the booking that already landed before
    the interrupt is answered from the ledger by its call id, not booked twice."""
    from langchain_core.tools import tool
    from langgraph.types import Command, interrupt

    bookings: list[str] = []
    g = Guard(limits=FAST)

    @g.tool(side_effect=True)
    def book(flight: str) -> str:
        """Book a flight."""
        bookings.append(flight)
        return f"booked {flight}"

    @tool
    def confirm(question: str) -> str:
        """Ask the user to confirm."""
        return str(interrupt(question))

    model = Scripted(messages=iter([
        AIMessage("", tool_calls=[
            {"name": "book", "args": {"flight": "UA1"}, "id": "call_book", "type": "tool_call"},
            {"name": "confirm", "args": {"question": "ok?"}, "id": "call_ok",
             "type": "tool_call"}]),
        AIMessage("all done"),
    ]))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        app = create_react_agent(model, [*langchain_tools(g), confirm],
                                 checkpointer=InMemorySaver())
    config = {"configurable": {"thread_id": "trip"}}
    first = app.invoke({"messages": [HumanMessage("book UA1")]}, config)
    assert "__interrupt__" in first and bookings == ["UA1"]
    final = app.invoke(Command(resume="yes"), config)
    assert bookings == ["UA1"]  # the re-run ToolNode did not book again
    answers = {m.tool_call_id: m.content for m in tool_messages(final)}
    assert answers == {"call_book": "booked UA1", "call_ok": "yes"}
    assert final["messages"][-1].content == "all done"
