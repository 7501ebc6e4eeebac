"""Legitimate families in an OpenAI tool loop (Chat Completions and Responses), issue 25 item 5.

The real ``openai`` client talks to a loopback stub scripted as the model; the loop is the one
the adapter's docs describe (append the assistant turn, run its calls with ``messages=``, stop
on ``outputs.halt``).  What the model received is read from the requests the client sent.
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

from toolfault.adapters.openai import (
    arun_chat_tool_calls,
    arun_response_function_calls,
    chat_tools,
    responses_tools,
    run_chat_tool_calls,
    run_response_function_calls,
)

openai = require("openai")

CHAT, RESPONSES = "/v1/chat/completions", "/v1/responses"
APIS = pytest.mark.parametrize("api", ["chat", "responses"])
RUNS = pytest.mark.parametrize("concurrent", [False, True], ids=["sync", "async"])


async def _loop(api: str, concurrent: bool, stub: Any, canned: SimpleNamespace, world: World,
                steps: list[Any]) -> tuple[list[Any], int]:
    """The documented loop; returns the conversation and the model requests made."""
    guard = world.guard
    client = openai.AsyncOpenAI(base_url=f"{stub.url}/v1", api_key="test", max_retries=0)
    messages: list[Any] = [{"role": "user", "content": "Please sort out my orders."}]
    try:
        for n in range(1, len(steps) + 2):
            if api == "chat":
                stub.add(CHAT, canned.chat(steps[n - 1], n))
                reply = await client.chat.completions.create(
                    model="gpt-x", messages=messages, tools=chat_tools(guard))
                message = reply.choices[0].message
                messages.append(message.model_dump(exclude_none=True))
                run = arun_chat_tool_calls if concurrent else run_chat_tool_calls
                outputs = run(guard, message, messages=messages)
                done = not message.tool_calls
            else:
                stub.add(RESPONSES, canned.response(steps[n - 1], n))
                reply = await client.responses.create(model="gpt-x", input=messages,
                                                      tools=responses_tools(guard))
                messages += [item.model_dump(exclude_none=True) for item in reply.output]
                run = arun_response_function_calls if concurrent else \
                    run_response_function_calls
                outputs = run(guard, reply, messages=messages)
                done = not reply.output or all(i.type != "function_call" for i in reply.output)
            if concurrent:
                outputs = await outputs
            messages.extend(outputs)
            if done or outputs.halt:
                return messages, n
    finally:
        await client.close()
    raise AssertionError("the loop did not finish")


def _received(api: str, body: Any) -> dict[str, Received]:
    """The tool outputs in one request the client sent, by call id (no error flag on OpenAI)."""
    if api == "chat":
        return {m["tool_call_id"]: Received(m["content"]) for m in body["messages"]
                if m.get("role") == "tool"}
    return {i["call_id"]: Received(i["output"]) for i in body["input"]
            if i.get("type") == "function_call_output"}


@APIS
@RUNS
@pytest.mark.parametrize("family", family_params())
async def test_legitimate_family_is_never_refused(
        api: str, concurrent: bool, family: Family, stub_server: Any,
        canned: SimpleNamespace) -> None:
    """Each family runs to the model's final answer; every call gets what it should."""
    world = World(**(SLOW if concurrent else {}))
    _, requests = await _loop(api, concurrent, stub_server, canned, world, family.script())
    assert requests == len(family.steps) + 1  # the model was asked again after every step
    assert stub_server.unexpected == []
    last = stub_server.bodies(CHAT if api == "chat" else RESPONSES)[-1]
    check(family, world, _received(api, last))


@APIS
@RUNS
async def test_a_model_that_never_stops_repeating_ends_on_the_halt(
        api: str, concurrent: bool, stub_server: Any, canned: SimpleNamespace) -> None:
    """The other side: the same failing call for ever ends the loop on outputs.halt."""
    world = World()
    messages, requests = await _loop(api, concurrent, stub_server, canned, world,
                                     LOOP.script())
    assert requests == HALT_AT
    got = [Received(m["content"]) if api == "chat" else Received(m["output"])
           for m in messages if m.get("role") == "tool" or m.get("type") ==
           "function_call_output"]
    assert len(got) == HALT_AT
    check_loop(world, got)
