"""Legitimate families in an Anthropic Messages tool loop, issue 25 item 5.

The real ``anthropic`` client talks to a loopback stub scripted as the model; each assistant
turn is answered with ``tool_results_message(guard, reply, messages=...)`` (or its async twin,
which runs the turn's tool uses at once) and the loop stops on a halted result.  What the
model received is read, with ``is_error``, from the requests the client sent.
"""

from __future__ import annotations

from types import SimpleNamespace
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

from toolfault.adapters.anthropic import arun_tool_uses, run_tool_uses, tools

anthropic = require("anthropic")

MESSAGES = "/v1/messages"
RUNS = pytest.mark.parametrize("concurrent", [False, True], ids=["sync", "async"])


async def _loop(concurrent: bool, stub: Any, canned: SimpleNamespace, world: World,
                steps: list[Any]) -> tuple[list[Any], int]:
    """A plain Messages tool loop; returns the conversation and the model requests made."""
    guard = world.guard
    stub.add(MESSAGES, *canned.script(canned.anthropic, steps))
    client = anthropic.AsyncAnthropic(base_url=stub.url, api_key="test", max_retries=0)
    messages: list[Any] = [{"role": "user", "content": "Please sort out my orders."}]
    try:
        for n in range(1, len(steps) + 2):
            reply = await client.messages.create(model="claude-x", max_tokens=256,
                                                 messages=messages, tools=tools(guard))
            messages.append({"role": "assistant",
                             "content": [b.model_dump(exclude_none=True) for b in reply.content]})
            if reply.stop_reason != "tool_use":
                return messages, n
            if concurrent:
                outputs = await arun_tool_uses(guard, reply, messages=messages)
            else:
                outputs = run_tool_uses(guard, reply, messages=messages)
            messages.append({"role": "user", "content": list(outputs)})
            if outputs.halt:
                return messages, n
    finally:
        await client.close()
    raise AssertionError("the loop did not finish")


def _results(messages: list[Any]) -> list[dict[str, Any]]:
    return [b for m in messages if m["role"] == "user" and isinstance(m["content"], list)
            for b in m["content"] if b.get("type") == "tool_result"]


@RUNS
@pytest.mark.parametrize("family", family_params())
async def test_legitimate_family_is_never_refused(
        concurrent: bool, family: Family, stub_server: Any, canned: SimpleNamespace) -> None:
    """Each family runs to the model's final answer; every tool_result is what it should be."""
    world = World(**(SLOW if concurrent else {}))
    _, requests = await _loop(concurrent, stub_server, canned, world, family.script())
    assert requests == len(family.steps) + 1
    assert stub_server.unexpected == []
    sent = _results(stub_server.bodies(MESSAGES)[-1]["messages"])
    check(family, world, {b["tool_use_id"]: Received(b["content"], b["is_error"])
                          for b in sent})


@RUNS
async def test_a_model_that_never_stops_repeating_ends_on_the_halt(
        concurrent: bool, stub_server: Any, canned: SimpleNamespace) -> None:
    """The other side: the same failing call for ever ends the loop at the halt."""
    world = World()
    messages, requests = await _loop(concurrent, stub_server, canned, world, LOOP.script())
    assert requests == HALT_AT
    got = [Received(b["content"], b["is_error"]) for b in _results(messages)]
    assert len(got) == HALT_AT
    check_loop(world, got)
