"""Anthropic adapter, driven end to end through the real ``anthropic`` client against a stub."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace
from typing import Any

import pytest
from _frameworks import require

from toolfault import Guard, ToolError
from toolfault.adapters.anthropic import (
    arun_tool_uses,
    atool_results_message,
    run_tool_uses,
    tool_results_message,
    tools,
)

anthropic = require("anthropic")

MESSAGES = "/v1/messages"
TERMINAL = "Retrying the same call is not allowed."


@pytest.fixture
def runs() -> dict[str, int]:
    return {}


@pytest.fixture
def guard(fast_guard: Guard, runs: dict[str, int]) -> Guard:
    def ran(name: str) -> int:
        runs[name] = runs.get(name, 0) + 1
        return runs[name]

    @fast_guard.tool
    def get_weather(city: str, days: int = 1) -> str:
        """Current weather for a city."""
        ran("get_weather")
        return f"sunny in {city}"

    @fast_guard.tool
    def flaky_forecast(city: str) -> dict[str, Any]:
        """A forecast from a backend that times out once."""
        if ran("flaky_forecast") == 1:
            raise TimeoutError("read timed out")
        return {"city": city, "forecast": "rain"}

    @fast_guard.tool
    def find_city(name: str) -> str:
        """Look a city up by name."""
        ran("find_city")
        raise ToolError("not_found", f"there is no city named {name}", param="name")

    return fast_guard


def _loop(stub: Any, canned: SimpleNamespace, guard: Guard, steps: list[Any]) -> str:
    """Script the stub, run a real client tool loop, return the model's final text."""
    stub.add(MESSAGES, *canned.script(canned.anthropic, steps))
    messages: list[Any] = [{"role": "user", "content": "What is the weather?"}]
    with anthropic.Anthropic(base_url=stub.url, api_key="test", max_retries=0) as client:
        for _ in range(8):
            reply = client.messages.create(model="claude-x", max_tokens=256, messages=messages,
                                           tools=tools(guard))
            messages.append({"role": "assistant",
                             "content": [b.model_dump(exclude_none=True) for b in reply.content]})
            if reply.stop_reason != "tool_use":
                return str(reply.content[0].text)
            messages.append(tool_results_message(guard, reply))
    raise AssertionError("the loop did not finish")


def _sent(stub: Any) -> list[list[dict[str, Any]]]:
    """Per request, the ``tool_result`` blocks of its last user turn (empty when none)."""
    out = []
    for body in stub.bodies(MESSAGES):
        last = body["messages"][-1]
        blocks = last["content"] if isinstance(last["content"], list) else []
        out.append([b for b in blocks if b.get("type") == "tool_result"])
    return out


def test_invalid_argument_is_an_error_result_with_four_part_text(
        stub_server: Any, canned: SimpleNamespace, guard: Guard, runs: dict[str, int]) -> None:
    """A wrongly named parameter comes back as ``is_error`` plus the four-part instruction."""
    final = _loop(stub_server, canned, guard,
                  [[("get_weather", {"town": "Oslo"}, "toolu_bad")], "I need a city."])
    assert final == "I need a city."
    [block] = _sent(stub_server)[1]
    assert block["tool_use_id"] == "toolu_bad"
    assert block["is_error"] is True
    lines = block["content"].splitlines()
    assert lines[0] == "get_weather failed (code: invalid_argument)."
    assert lines[1].startswith("Reason: city is required")
    assert lines[2] == 'Rejected arguments: {"town": "Oslo"}.'
    assert lines[3] == "Effect: none. Retrying the same call will not help."
    assert lines[4].startswith("Next action: call get_weather")
    assert "get_weather" not in runs
    assert stub_server.bodies(MESSAGES)[1]["messages"][-1]["role"] == "user"


def test_transient_failure_is_retried_inside_the_wrapper(
        stub_server: Any, canned: SimpleNamespace, guard: Guard, runs: dict[str, int]) -> None:
    """A timeout is retried by the guard; the model gets the success, not the error."""
    _loop(stub_server, canned, guard,
          [[("flaky_forecast", {"city": "Oslo"}, "toolu_1")], "Rain."])
    assert runs["flaky_forecast"] == 2
    [block] = _sent(stub_server)[1]
    assert block["is_error"] is False
    assert json.loads(block["content"]) == {"city": "Oslo", "forecast": "rain"}


def test_identical_failing_calls_end_in_the_terminal_message(
        stub_server: Any, canned: SimpleNamespace, guard: Guard, runs: dict[str, int]) -> None:
    """Repeating one failing call: the terminal stop at the cap, the same stop again for the
    blocked repeat (body not run), then the halt; body capped."""
    repeat = [("find_city", {"name": "Atlantis"})]
    _loop(stub_server, canned, guard, [repeat] * 5 + ["I give up."])
    blocks = [b for turn in _sent(stub_server) for b in turn]
    assert len(blocks) == 5
    assert all(b["is_error"] is True for b in blocks)
    assert blocks[0]["content"].startswith("find_city failed (code: not_found).")
    assert TERMINAL not in blocks[0]["content"]
    assert blocks[1]["content"].startswith("find_city failed 2 times with identical arguments")
    assert TERMINAL in blocks[1]["content"]
    assert blocks[2]["content"] == blocks[1]["content"]
    assert all(b["content"].startswith("find_city failed (code: halted).") for b in blocks[3:])
    assert runs["find_city"] == 2
    assert stub_server.unexpected == []


def test_success_and_tool_definitions_on_the_wire(
        stub_server: Any, canned: SimpleNamespace, guard: Guard) -> None:
    """A good call is a non-error result with the value; the tools sent are the guard's."""
    final = _loop(stub_server, canned, guard,
                  [[("get_weather", {"city": "Oslo"}, "toolu_ok")], "Sunny."])
    assert final == "Sunny."
    assert _sent(stub_server)[1] == [{"type": "tool_result", "tool_use_id": "toolu_ok",
                                      "content": "sunny in Oslo", "is_error": False}]
    sent_tools = {t["name"]: t for t in stub_server.bodies()[0]["tools"]}
    assert set(sent_tools) == {"get_weather", "flaky_forecast", "find_city"}
    assert sent_tools["get_weather"] == {
        "name": "get_weather", "description": "Current weather for a city.",
        "input_schema": guard.tools["get_weather"].schema}


async def test_parallel_tool_uses_of_one_turn_run_concurrently_in_order(
        stub_server: Any, canned: SimpleNamespace, fast_guard: Guard) -> None:
    """The async twin runs one turn's tool uses at the same time and answers in block order."""
    state = {"now": 0, "peak": 0}

    @fast_guard.tool
    async def lookup(key: str) -> str:
        """Look a key up."""
        state["now"] += 1
        state["peak"] = max(state["peak"], state["now"])
        await asyncio.sleep(0.05)
        state["now"] -= 1
        return f"value of {key}"

    step = [("lookup", {"key": "a"}, "toolu_a"), ("lookup", {"key": "b"}, "toolu_b"),
            ("lookup", {"nope": 1}, "toolu_c")]
    stub_server.add(MESSAGES, canned.anthropic(step), canned.anthropic("done", 1))
    client = anthropic.AsyncAnthropic(base_url=stub_server.url, api_key="test", max_retries=0)
    messages: list[Any] = [{"role": "user", "content": "hi"}]
    reply = await client.messages.create(model="claude-x", max_tokens=64, messages=messages,
                                         tools=tools(fast_guard))
    messages += [{"role": "assistant", "content": [b.model_dump() for b in reply.content]},
                 await atool_results_message(fast_guard, reply)]
    await client.messages.create(model="claude-x", max_tokens=64, messages=messages,
                                 tools=tools(fast_guard))
    await client.close()
    assert state["peak"] == 2
    blocks = _sent(stub_server)[1]
    assert [b["tool_use_id"] for b in blocks] == ["toolu_a", "toolu_b", "toolu_c"]
    assert [b["is_error"] for b in blocks] == [False, False, True]
    assert blocks[2]["content"].startswith("lookup failed (code: invalid_argument).")


async def test_content_lists_and_dicts_are_accepted(guard: Guard) -> None:
    """A message, its dict form and a bare content list give the same blocks; text is skipped."""
    content = [{"type": "text", "text": "Let me check."},
               {"type": "tool_use", "id": "toolu_1", "name": "get_weather",
                "input": {"city": "Rome"}}]
    expected = [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny in Rome",
                 "is_error": False}]
    message = anthropic.types.Message.model_validate(
        {"id": "m", "type": "message", "role": "assistant", "model": "claude-x",
         "content": content, "stop_reason": "tool_use", "stop_sequence": None,
         "usage": {"input_tokens": 1, "output_tokens": 1}})
    for form in (message, {"role": "assistant", "content": content}, content):
        guard.new_turn()  # the identical read again in one turn would be no progress
        assert run_tool_uses(guard, form) == expected
        guard.new_turn()
        assert await arun_tool_uses(guard, form) == expected
    assert run_tool_uses(guard, {"role": "assistant", "content": "just text"}) == []
    assert run_tool_uses(guard, None) == []


def test_an_anthropic_loop_ends_on_halt_and_a_new_user_message_is_a_new_turn(
        stub_server: Any, canned: SimpleNamespace, guard: Guard, runs: dict[str, int]) -> None:
    """outputs.halt stops the loop at cap + 2 (the blocked repeat, then the halted call);
    tool_result turns are not user messages."""
    repeat = [("find_city", {"name": "Atlantis"})]
    stub_server.add(MESSAGES, *canned.script(canned.anthropic, [repeat] * 10))
    messages: list[Any] = [{"role": "user", "content": "find Atlantis"}]
    requests, texts = [], []
    with anthropic.Anthropic(base_url=stub_server.url, api_key="t", max_retries=0) as client:
        for question in ("find Atlantis", "try again"):
            if len(messages) > 1:
                messages.append({"role": "user", "content": question})
            for n in range(1, 10):
                reply = client.messages.create(model="claude-x", max_tokens=64,
                                               messages=messages, tools=tools(guard))
                messages.append({"role": "assistant", "content": [
                    b.model_dump(exclude_none=True) for b in reply.content]})
                outputs = run_tool_uses(guard, reply, messages=messages)
                messages.append({"role": "user", "content": outputs})
                texts.append(outputs[0]["content"])
                if outputs.halt:
                    requests.append(n)
                    break
    assert requests == [4, 4]
    for turn in (texts[:4], texts[4:]):
        assert TERMINAL in turn[1] and turn[2] == turn[1]  # the blocked repeat, not halted
        assert turn[3].startswith("find_city failed (code: halted).")
    assert runs["find_city"] == 4


def test_tool_uses_the_guard_does_not_own_are_left_alone(guard: Guard) -> None:
    """A tool_use of the caller's own tool gets no tool_result unless others="answer"."""
    content = [{"type": "tool_use", "id": "t1", "name": "my_own_tool", "input": {}},
               {"type": "tool_use", "id": "t2", "name": "get_weather",
                "input": {"city": "Oslo"}}]
    assert [b["tool_use_id"] for b in run_tool_uses(guard, content)] == ["t2"]
    answered = run_tool_uses(guard, content, others="answer")
    assert [b["tool_use_id"] for b in answered] == ["t1", "t2"]
    assert answered[0]["is_error"] is True


def test_two_message_lists_are_two_conversations_without_a_key(
        guard: Guard, runs: dict[str, int]) -> None:
    """messages= alone: each list is named by its first tool_use id; counts never mix."""
    def turn(messages: list[Any], use_id: str) -> str:
        content = [{"type": "tool_use", "id": use_id, "name": "find_city",
                    "input": {"name": "X"}}]
        messages.append({"role": "assistant", "content": content})
        [block] = run_tool_uses(guard, content, messages=messages)
        messages.append({"role": "user", "content": [block]})
        return str(block["content"])

    alice: list[Any] = [{"role": "user", "content": "find X"}]
    bob: list[Any] = [{"role": "user", "content": "find X"}]
    a1, b1, a2 = turn(alice, "toolu_a1"), turn(bob, "toolu_b1"), turn(alice, "toolu_a2")
    assert TERMINAL not in a1 and TERMINAL not in b1
    assert TERMINAL in a2
    assert runs["find_city"] == 3
