"""OpenAI adapter, driven end to end through the real ``openai`` client against a loopback stub."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace
from typing import Any

import pytest
from _frameworks import require

from toolfault import Guard, ToolError
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
TERMINAL = "Retrying the same call is not allowed."


class Tools:
    """A guard with one tool per scenario, counting how often each body ran."""

    def __init__(self, guard: Guard) -> None:
        self.guard = guard
        self.runs: dict[str, int] = {}

        @guard.tool
        def get_weather(city: str, days: int = 1) -> str:
            """Current weather for a city."""
            self._ran("get_weather")
            return f"sunny in {city}"

        @guard.tool
        def flaky_forecast(city: str) -> dict[str, Any]:
            """A forecast from a backend that drops the first connection."""
            if self._ran("flaky_forecast") == 1:
                raise ConnectionError("connection reset by peer")
            return {"city": city, "forecast": "rain"}

        @guard.tool
        def find_city(name: str) -> str:
            """Look a city up by name."""
            self._ran("find_city")
            raise ToolError("not_found", f"there is no city named {name}", param="name")

    def _ran(self, name: str) -> int:
        self.runs[name] = self.runs.get(name, 0) + 1
        return self.runs[name]


@pytest.fixture
def tools(fast_guard: Guard) -> Tools:
    return Tools(fast_guard)


def _chat_loop(client: Any, guard: Guard) -> str:
    messages: list[Any] = [{"role": "user", "content": "What is the weather?"}]
    for _ in range(8):
        reply = client.chat.completions.create(model="gpt-x", messages=messages,
                                               tools=chat_tools(guard))
        message = reply.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        if not message.tool_calls:
            return str(message.content)
        messages.extend(run_chat_tool_calls(guard, message))
    raise AssertionError("the loop did not finish")


def _responses_loop(client: Any, guard: Guard) -> str:
    items: list[Any] = [{"role": "user", "content": "What is the weather?"}]
    for _ in range(8):
        reply = client.responses.create(model="gpt-x", input=items, tools=responses_tools(guard))
        items += [item.model_dump(exclude_none=True) for item in reply.output]
        outputs = run_response_function_calls(guard, reply)
        if not outputs:
            return str(reply.output_text)
        items += outputs
    raise AssertionError("the loop did not finish")


def _run(api: str, stub: Any, canned: SimpleNamespace, guard: Guard, steps: list[Any]) -> str:
    """Script the stub, run the real client loop, return the model's final text."""
    with openai.OpenAI(base_url=f"{stub.url}/v1", api_key="test", max_retries=0) as client:
        if api == "chat":
            stub.add(CHAT, *canned.script(canned.chat, steps))
            return _chat_loop(client, guard)
        stub.add(RESPONSES, *canned.script(canned.response, steps))
        return _responses_loop(client, guard)


def _sent(api: str, stub: Any) -> list[list[tuple[str, str]]]:
    """Per request, the ``(call_id, text)`` tool outputs the client sent (new ones only)."""
    out: list[list[tuple[str, str]]] = []
    seen = 0
    for body in stub.bodies(CHAT if api == "chat" else RESPONSES):
        if api == "chat":
            found = [(m["tool_call_id"], m["content"]) for m in body["messages"]
                     if m.get("role") == "tool"]
        else:
            items = body["input"] if isinstance(body["input"], list) else []
            found = [(i["call_id"], i["output"]) for i in items
                     if i.get("type") == "function_call_output"]
        out.append(found[seen:])
        seen = len(found)
    return out


APIS = pytest.mark.parametrize("api", ["chat", "responses"])


@APIS
def test_invalid_argument_reaches_the_model_as_four_part_text(
        api: str, stub_server: Any, canned: SimpleNamespace, tools: Tools) -> None:
    """A wrongly named parameter is answered with the four-part text; the body never runs."""
    final = _run(api, stub_server, canned, tools.guard,
                 [[("get_weather", {"town": "Oslo"}, "call_bad")], "I need a city."])
    assert final == "I need a city."
    sent = _sent(api, stub_server)
    assert sent[0] == []
    [(call_id, text)] = sent[1]
    assert call_id == "call_bad"
    lines = text.splitlines()
    assert lines[0] == "get_weather failed (code: invalid_argument)."
    assert lines[1].startswith("Reason: city is required")
    assert lines[2] == 'Rejected arguments: {"town": "Oslo"}.'
    assert lines[3] == "Effect: none. Retrying the same call will not help."
    assert lines[4].startswith("Next action: call get_weather")
    assert "get_weather" not in tools.runs


@APIS
def test_transient_failure_is_retried_inside_the_wrapper(
        api: str, stub_server: Any, canned: SimpleNamespace, tools: Tools) -> None:
    """A dropped connection is retried by the guard; the model only ever sees the success."""
    _run(api, stub_server, canned, tools.guard,
         [[("flaky_forecast", {"city": "Oslo"}, "call_1")], "Rain in Oslo."])
    assert tools.runs["flaky_forecast"] == 2
    [(call_id, text)] = _sent(api, stub_server)[1]
    assert call_id == "call_1"
    assert json.loads(text) == {"city": "Oslo", "forecast": "rain"}


@APIS
def test_identical_failing_calls_end_in_the_terminal_message(
        api: str, stub_server: Any, canned: SimpleNamespace, tools: Tools) -> None:
    """Repeating one failing call: the terminal stop at the cap, the same stop again for the
    blocked repeat (body not run), then the halt; body capped."""
    repeat = [("find_city", {"name": "Atlantis"})]
    _run(api, stub_server, canned, tools.guard, [repeat] * 5 + ["I give up."])
    texts = [text for turn in _sent(api, stub_server) for _, text in turn]
    assert len(texts) == 5
    assert texts[0].startswith("find_city failed (code: not_found).")
    assert TERMINAL not in texts[0]
    assert texts[1].startswith("find_city failed 2 times with identical arguments")
    assert TERMINAL in texts[1]
    assert texts[2] == texts[1]
    assert all(text.startswith("find_city failed (code: halted).") for text in texts[3:])
    assert tools.runs["find_city"] == 2
    assert stub_server.unexpected == []


@APIS
def test_success_and_tool_definitions_on_the_wire(
        api: str, stub_server: Any, canned: SimpleNamespace, tools: Tools) -> None:
    """A good call returns the tool's value; the tool list the client sent is the guard's."""
    final = _run(api, stub_server, canned, tools.guard,
                 [[("get_weather", {"city": "Oslo"}, "call_ok")], "Sunny."])
    assert final == "Sunny."
    assert _sent(api, stub_server)[1] == [("call_ok", "sunny in Oslo")]
    sent_tools = stub_server.bodies()[0]["tools"]
    by_name = {(t.get("function") or t)["name"]: t for t in sent_tools}
    assert set(by_name) == {"get_weather", "flaky_forecast", "find_city"}
    weather = by_name["get_weather"]
    schema = tools.guard.tools["get_weather"].schema
    if api == "chat":
        assert weather == {"type": "function", "function": {
            "name": "get_weather", "description": "Current weather for a city.",
            "parameters": schema}}
    else:
        assert weather == {"type": "function", "name": "get_weather",
                           "description": "Current weather for a city.",
                           "parameters": schema, "strict": False}


class InFlight:
    """Counts tool bodies running at once, to prove a turn's calls overlap."""

    def __init__(self) -> None:
        self.now = 0
        self.peak = 0

    async def hold(self) -> None:
        self.now += 1
        self.peak = max(self.peak, self.now)
        try:
            await asyncio.sleep(0.05)
        finally:
            self.now -= 1


def _parallel_guard(guard: Guard, flight: InFlight) -> Guard:
    @guard.tool
    async def lookup(key: str) -> str:
        """Look a key up."""
        await flight.hold()
        return f"value of {key}"

    return guard


@APIS
async def test_parallel_calls_of_one_turn_run_concurrently_in_order(
        api: str, stub_server: Any, canned: SimpleNamespace, fast_guard: Guard) -> None:
    """The async twins run one turn's calls at the same time and answer them in call order."""
    flight = InFlight()
    guard = _parallel_guard(fast_guard, flight)
    step = [("lookup", {"key": "a"}, "call_a"), ("lookup", {"key": "b"}, "call_b"),
            ("lookup", {"nope": 1}, "call_c")]
    client = openai.AsyncOpenAI(base_url=f"{stub_server.url}/v1", api_key="test",
                                max_retries=0)
    if api == "chat":
        stub_server.add(CHAT, canned.chat(step), canned.chat("done", 1))
        reply = await client.chat.completions.create(
            model="gpt-x", messages=[{"role": "user", "content": "hi"}], tools=chat_tools(guard))
        message = reply.choices[0].message
        outputs: list[Any] = await arun_chat_tool_calls(guard, message)
        await client.chat.completions.create(
            model="gpt-x", tools=chat_tools(guard),
            messages=[{"role": "user", "content": "hi"}, message.model_dump(exclude_none=True),
                      *outputs])
    else:
        stub_server.add(RESPONSES, canned.response(step), canned.response("done", 1))
        reply = await client.responses.create(model="gpt-x", input="hi",
                                              tools=responses_tools(guard))
        outputs = await arun_response_function_calls(guard, reply)
        await client.responses.create(model="gpt-x", input=outputs, previous_response_id=reply.id,
                                      tools=responses_tools(guard))
    await client.close()
    assert flight.peak == 2
    sent = _sent(api, stub_server)[1]
    assert [cid for cid, _ in sent] == ["call_a", "call_b", "call_c"]
    assert [text for _, text in sent[:2]] == ["value of a", "value of b"]
    assert sent[2][1].startswith("lookup failed (code: invalid_argument).")


def test_chat_accepts_completions_dicts_and_tool_call_lists(tools: Tools) -> None:
    """A completion, its message, a dict message and a bare list all get the same answers."""
    message = openai.types.chat.ChatCompletion.model_validate(
        {"id": "c", "object": "chat.completion", "created": 0, "model": "m", "choices": [
            {"index": 0, "finish_reason": "tool_calls", "message": {
                "role": "assistant", "content": None, "tool_calls": [
                    {"id": "call_1", "type": "function",
                     "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}]}}]})
    expected = [{"role": "tool", "tool_call_id": "call_1", "content": "sunny in Oslo"}]
    as_dict = message.choices[0].message.model_dump()
    for form in (message, message.choices[0].message, as_dict, as_dict["tool_calls"]):
        tools.guard.new_turn()  # the identical read again in one turn would be no progress
        assert run_chat_tool_calls(tools.guard, form) == expected
    [no_id] = run_chat_tool_calls(tools.guard, [
        {"type": "function", "function": {"name": "get_weather", "arguments": "{}"}}])
    assert no_id["tool_call_id"] not in ("", "None")
    assert run_chat_tool_calls(tools.guard, {"role": "assistant", "content": "hi"}) == []
    assert run_chat_tool_calls(tools.guard, None) == []


def test_custom_chat_tool_calls_are_left_to_their_owner_unless_asked(tools: Tools) -> None:
    """A free-form call the guard does not own is not answered, unless others="answer"."""
    calls = [{"id": "call_x", "type": "custom", "custom": {"name": "shell", "input": "ls -la"}},
             {"id": "call_y", "type": "function",
              "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}]
    assert [a["tool_call_id"] for a in run_chat_tool_calls(tools.guard, calls)] == ["call_y"]
    answer, _ = run_chat_tool_calls(tools.guard, calls, others="answer")
    assert answer["tool_call_id"] == "call_x"
    assert str(answer["content"]).startswith("shell failed (code: ")


def test_responses_skips_non_call_items_and_accepts_dicts(tools: Tools) -> None:
    """Only ``function_call`` items are run; reasoning and message items are passed over."""
    items = [{"type": "reasoning", "id": "rs_1", "summary": []},
             {"type": "function_call", "call_id": "call_9", "name": "get_weather",
              "arguments": '{"city": "Rome"}'}]
    expected = [{"type": "function_call_output", "call_id": "call_9", "output": "sunny in Rome"}]
    assert run_response_function_calls(tools.guard, items) == expected
    tools.guard.new_turn()  # the identical read again in one turn would be no progress
    assert run_response_function_calls(tools.guard, {"output": items}) == expected
    assert run_response_function_calls(tools.guard, None) == []


def test_custom_tool_calls_in_a_response_are_answered_in_kind(fast_guard: Guard) -> None:
    """A custom_tool_call the guard does not own is skipped; asked to, it is answered in kind."""
    from openai.types.responses import Response

    @fast_guard.tool
    def search(query: str) -> str:
        """Search. Use it to look things up."""
        return f"found {query}"

    response = Response.model_validate({
        "id": "resp_1", "object": "response", "created_at": 0, "model": "m",
        "parallel_tool_calls": True, "tool_choice": "auto", "tools": [],
        "output": [
            {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "search",
             "arguments": '{"query": "oslo"}'},
            {"type": "custom_tool_call", "id": "ct_1", "call_id": "call_2",
             "name": "shell", "input": "ls -la"},
        ],
    })
    assert [o["call_id"] for o in run_response_function_calls(fast_guard, response)] == [
        "call_1"]
    outputs = run_response_function_calls(fast_guard, response, others="answer")
    assert [(o["type"], o["call_id"]) for o in outputs] == [
        ("function_call_output", "call_1"), ("custom_tool_call_output", "call_2")]
    assert "unknown_tool" in outputs[1]["output"]


# -- the loop ends on halt; turns from the messages; conversations apart ------------------
def _chat_loop_until_halt(client: Any, guard: Guard, messages: list[Any],
                          conversation: str | None = None) -> int:
    """A hand-written loop that stops on ``outputs.halt``; returns the model requests made."""
    for n in range(1, 20):
        reply = client.chat.completions.create(model="gpt-x", messages=messages,
                                               tools=chat_tools(guard))
        message = reply.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        outputs = run_chat_tool_calls(guard, message, messages=messages,
                                      conversation=conversation)
        messages.extend(outputs)
        if outputs.halt or not message.tool_calls:
            return n
    raise AssertionError("the loop did not finish")


def test_a_chat_loop_ends_on_the_halt_flag_within_cap_plus_two(
        stub_server: Any, canned: SimpleNamespace, tools: Tools) -> None:
    """An always-repeating model: the third call is refused with the terminal text, outputs.halt
    ends the loop at the fourth; body ran twice."""
    repeat = [("find_city", {"name": "Atlantis"})]
    stub_server.add(CHAT, *canned.script(canned.chat, [repeat] * 10))
    with openai.OpenAI(base_url=f"{stub_server.url}/v1", api_key="t", max_retries=0) as client:
        requests = _chat_loop_until_halt(client, tools.guard,
                                         [{"role": "user", "content": "find Atlantis"}])
    assert requests == 4
    assert tools.runs["find_city"] == 2


def test_a_new_user_message_starts_a_new_turn(
        stub_server: Any, canned: SimpleNamespace, tools: Tools) -> None:
    """After a halt the user speaks again: the same call reaches the tool again."""
    repeat = [("find_city", {"name": "Atlantis"})]
    stub_server.add(CHAT, *canned.script(canned.chat, [repeat] * 10))
    messages: list[Any] = [{"role": "user", "content": "find Atlantis"}]
    with openai.OpenAI(base_url=f"{stub_server.url}/v1", api_key="t", max_retries=0) as client:
        _chat_loop_until_halt(client, tools.guard, messages)
        messages.append({"role": "user", "content": "try again"})
        _chat_loop_until_halt(client, tools.guard, messages)
    assert tools.runs["find_city"] == 4


def test_two_conversations_on_one_guard_never_share_a_counter(tools: Tools) -> None:
    """conversation= keeps counts apart: B's first call is not A's terminal message."""
    call = [{"id": "c", "type": "function",
             "function": {"name": "find_city", "arguments": '{"name": "X"}'}}]
    a1, = run_chat_tool_calls(tools.guard, call, conversation="A")
    a2, = run_chat_tool_calls(tools.guard, call, conversation="A")
    b1, = run_chat_tool_calls(tools.guard, call, conversation="B")
    assert TERMINAL in str(a2["content"])
    assert TERMINAL not in str(a1["content"]) and TERMINAL not in str(b1["content"])
    assert tools.runs["find_city"] == 3


def test_responses_outputs_carry_results_and_the_halt(tools: Tools) -> None:
    """The output list is plain API items; results and halt ride beside them."""
    item = {"type": "function_call", "call_id": "c", "name": "find_city",
            "arguments": '{"name": "X"}'}
    halts, blocked, texts = [], [], []
    for _ in range(4):
        outputs = run_response_function_calls(tools.guard, [item])
        assert set(outputs[0]) == {"type", "call_id", "output"}
        assert [r.code for r in outputs.results] in (["not_found"], ["halted"])
        halts.append(outputs.halt)
        blocked.append(outputs.results[0].blocked)
        texts.append(outputs[0]["output"])
    assert halts == [False, False, False, True]
    assert blocked == [False, False, True, True]
    assert TERMINAL in texts[1] and texts[2] == texts[1]
    assert tools.runs["find_city"] == 2


def test_two_message_lists_are_two_conversations_without_a_key(tools: Tools) -> None:
    """messages= alone: each list is named by its first tool call id; counts never mix."""
    def turn(messages: list[Any], call_id: str) -> str:
        message = {"role": "assistant", "content": None, "tool_calls": [
            {"id": call_id, "type": "function",
             "function": {"name": "find_city", "arguments": '{"name": "X"}'}}]}
        messages.append(message)
        [answer] = run_chat_tool_calls(tools.guard, message, messages=messages)
        messages.append(answer)
        return str(answer["content"])

    alice: list[Any] = [{"role": "user", "content": "find X"}]
    bob: list[Any] = [{"role": "user", "content": "find X"}]
    a1, b1 = turn(alice, "call_a1"), turn(bob, "call_b1")
    a2 = turn(list(alice), "call_a2")  # a copy of the list is still alice's conversation
    assert TERMINAL not in a1 and TERMINAL not in b1
    assert TERMINAL in a2
    assert tools.runs["find_city"] == 3
