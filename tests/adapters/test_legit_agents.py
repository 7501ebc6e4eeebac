"""Legitimate families in the OpenAI Agents SDK's own loop, issue 25 item 5.

``Runner.run`` drives an agent whose tools are ``function_tools(guard)`` and whose model is
the SDK's own OpenAI model (Chat Completions or Responses) over the real ``openai`` client,
pointed at a loopback stub scripted as the model.  Several calls in one model response are
the SDK's parallel tool calls (it runs them at once).  What the model received is read from
the requests the SDK sent.
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

agents = require("agents")
openai = require("openai")

from toolfault.adapters.agents import function_tools, stop_on_halt  # noqa: E402

agents.set_tracing_disabled(True)

CHAT, RESPONSES = "/v1/chat/completions", "/v1/responses"
MODELS = pytest.mark.parametrize("api", ["chat", "responses"])


async def _run(api: str, stub: Any, canned: SimpleNamespace, world: World, steps: list[Any]
               ) -> Any:
    client = openai.AsyncOpenAI(base_url=f"{stub.url}/v1", api_key="test", max_retries=0)
    if api == "chat":
        stub.add(CHAT, *canned.script(canned.chat, steps))
        model: Any = agents.OpenAIChatCompletionsModel(model="gpt-x", openai_client=client)
    else:
        stub.add(RESPONSES, *canned.script(canned.response, steps))
        model = agents.OpenAIResponsesModel(model="gpt-x", openai_client=client)
    agent = agents.Agent(name="assistant", instructions="Help.", model=model,
                         tools=function_tools(world.guard), tool_use_behavior=stop_on_halt,
                         model_settings=agents.ModelSettings(parallel_tool_calls=True))
    try:
        return await agents.Runner.run(agent, "Please sort out my orders.",
                                       max_turns=len(steps) + 5,
                                       run_config=agents.RunConfig(tracing_disabled=True))
    finally:
        await client.close()


def _received(api: str, body: Any) -> list[tuple[str, Received]]:
    """The tool outputs in one request the SDK sent, in order (no error flag on OpenAI)."""
    if api == "chat":
        return [(m["tool_call_id"], Received(m["content"])) for m in body["messages"]
                if m.get("role") == "tool"]
    return [(i["call_id"], Received(i["output"])) for i in body["input"]
            if i.get("type") == "function_call_output"]


@MODELS
@pytest.mark.parametrize("family", family_params())
async def test_legitimate_family_is_never_refused(
        api: str, family: Family, stub_server: Any, canned: SimpleNamespace) -> None:
    """Each family runs to the model's final output; every call gets what it should."""
    world = World(**SLOW)
    result = await _run(api, stub_server, canned, world, family.script())
    assert result.final_output == family.final
    assert stub_server.unexpected == []
    bodies = stub_server.bodies(CHAT if api == "chat" else RESPONSES)
    assert len(bodies) == len(family.steps) + 1
    check(family, world, dict(_received(api, bodies[-1])))


@MODELS
async def test_a_model_that_never_stops_repeating_ends_with_the_halt(
        api: str, stub_server: Any, canned: SimpleNamespace) -> None:
    """The other side: with stop_on_halt the run's final output is the halt, at the halt."""
    world = World()
    result = await _run(api, stub_server, canned, world, LOOP.script())
    assert str(result.final_output).startswith("Stopped: find_city failed (code: halted).")
    bodies = stub_server.bodies(CHAT if api == "chat" else RESPONSES)
    assert len(bodies) == HALT_AT  # the halted call's output never went back to the model
    got = [r for _, r in _received(api, bodies[-1])]
    got.append(Received(str(result.final_output).removeprefix("Stopped: ")))
    check_loop(world, got)
