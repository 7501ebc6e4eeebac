"""Legitimate families in LangGraph's own loop, issue 25 item 5.

The prebuilt ReAct agent (``create_react_agent``: a model node, ``ToolNode`` and
``tools_condition``) with ``halt_hook`` and a scripted chat model runs the guard's tools.
Several tool calls in one ``AIMessage`` are ``ToolNode``'s parallel calls (a thread pool with
``invoke``, ``asyncio.gather`` with ``ainvoke``).  What the model received is the
``ToolMessage`` list of the final state: content and ``status``.
"""

from __future__ import annotations

import warnings
from typing import Any

import pytest
from _frameworks import require
from _legit import (
    HALT_AT,
    LOOP,
    SLOW,
    Family,
    Received,
    World,
    check,
    check_loop,
    family_params,
)

require("langchain_core")
require("langgraph")

from langchain_core.language_models.fake_chat_models import GenericFakeChatModel  # noqa: E402
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage  # noqa: E402

with warnings.catch_warnings():  # create_react_agent is deprecated in favour of langchain's
    warnings.simplefilter("ignore")
    from langgraph.prebuilt import create_react_agent  # noqa: E402

from toolfault.adapters.langchain import halt_hook, halted, langchain_tools  # noqa: E402

RUNS = pytest.mark.parametrize("concurrent", [False, True], ids=["invoke", "ainvoke"])


class Scripted(GenericFakeChatModel):
    """A scripted chat model that accepts tools."""

    def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
        return self


def _model(steps: list[Any]) -> Scripted:
    messages = [AIMessage(step) if isinstance(step, str) else AIMessage("", tool_calls=[
        {"name": name, "args": args, "id": cid, "type": "tool_call"}
        for name, args, cid in step]) for step in steps]
    return Scripted(messages=iter(messages))


async def _run(concurrent: bool, world: World, steps: list[Any]) -> dict[str, Any]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        app = create_react_agent(_model(steps), langchain_tools(world.guard),
                                 post_model_hook=halt_hook)
    state = {"messages": [HumanMessage("Please sort out my orders.")]}
    config: Any = {"recursion_limit": 4 * len(steps) + 10}
    if concurrent:
        return await app.ainvoke(state, config)
    return app.invoke(state, config)


def _tool_messages(out: dict[str, Any]) -> list[ToolMessage]:
    return [m for m in out["messages"] if isinstance(m, ToolMessage)]


def _received(message: ToolMessage) -> Received:
    assert isinstance(message.content, str)
    assert message.status in ("success", "error")
    return Received(message.content, message.status == "error")


@RUNS
@pytest.mark.parametrize("family", family_params())
async def test_legitimate_family_is_never_refused(concurrent: bool, family: Family) -> None:
    """Each family runs to the model's final answer; every ToolMessage is what it should be."""
    world = World(**SLOW)
    out = await _run(concurrent, world, family.script())
    final = out["messages"][-1]
    assert isinstance(final, AIMessage) and final.content == family.final
    messages = _tool_messages(out)
    assert not any(halted(m) for m in messages)
    check(family, world, {m.tool_call_id: _received(m) for m in messages})


@RUNS
async def test_a_model_that_never_stops_repeating_ends_with_the_halt(concurrent: bool) -> None:
    """The other side: the graph reaches END with halt_hook's "Stopped:" after the halt."""
    world = World()
    out = await _run(concurrent, world, LOOP.script())
    messages = _tool_messages(out)
    assert len(messages) == HALT_AT
    assert halted(messages[-1]) and not any(halted(m) for m in messages[:-1])
    check_loop(world, [_received(m) for m in messages])
    final = out["messages"][-1]
    assert isinstance(final, AIMessage) and not final.tool_calls
    assert str(final.content).startswith("Stopped: find_city failed (code: halted).")
