"""Streaming paths end to end against a loopback server-sent-events stand-in for the provider:
OpenAI ``responses.stream()``, Anthropic ``messages.stream()``, Agents SDK ``run_streamed``;
and Responses with ``previous_response_id``, where ``conversation=`` keeps users apart."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace
from typing import Any

import pytest
from _frameworks import require

from toolfault import Guard, ToolError

TERMINAL = "Retrying the same call is not allowed."
REPEAT = [("find_city", {"name": "Atlantis"})]


class SSEServer:
    """Answers each POST with the next queued list of ``(event, data)`` pairs as an SSE stream,
    and records the JSON bodies it received."""

    def __init__(self) -> None:
        self.streams: list[list[tuple[str, Any]]] = []
        self.bodies: list[Any] = []
        self.lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                body = json.loads(self.rfile.read(length) or b"null")
                with server.lock:
                    server.bodies.append(body)
                    events = server.streams.pop(0) if server.streams else None
                if events is None:
                    self.send_response(500)
                    self.send_header("content-length", "0")
                    self.end_headers()
                    return
                data = "".join(f"event: {name}\ndata: {json.dumps(payload)}\n\n"
                               for name, payload in events).encode()
                self.send_response(200)
                self.send_header("content-type", "text/event-stream")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.05,),
                                       daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def sse() -> Iterator[SSEServer]:
    server = SSEServer()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def guard() -> tuple[Guard, dict[str, int]]:
    runs: dict[str, int] = {}
    guard = Guard()

    @guard.tool
    def find_city(name: str) -> str:
        """Look a city up by name."""
        runs["find_city"] = runs.get("find_city", 0) + 1
        raise ToolError("not_found", f"there is no city named {name}", param="name")

    return guard, runs


def responses_stream(done: dict[str, Any]) -> list[tuple[str, Any]]:
    """A Responses API event stream that ends with the whole response (as the API sends)."""
    created = {**done, "status": "in_progress", "output": []}
    events: list[tuple[str, Any]] = [("response.created", {
        "type": "response.created", "sequence_number": 0, "response": created})]
    for i, item in enumerate(done["output"]):
        events.append(("response.output_item.added", {
            "type": "response.output_item.added", "sequence_number": len(events),
            "output_index": i, "item": item}))
        events.append(("response.output_item.done", {
            "type": "response.output_item.done", "sequence_number": len(events),
            "output_index": i, "item": item}))
    events.append(("response.completed", {"type": "response.completed",
                                          "sequence_number": len(events), "response": done}))
    return events


def anthropic_stream(message: dict[str, Any]) -> list[tuple[str, Any]]:
    """An Anthropic Messages event stream for one message (tool uses sent as JSON deltas)."""
    start = {**message, "content": [], "stop_reason": None}
    events: list[tuple[str, Any]] = [("message_start", {"type": "message_start",
                                                        "message": start})]
    for i, block in enumerate(message["content"]):
        if block["type"] == "text":
            events += [
                ("content_block_start", {"type": "content_block_start", "index": i,
                                         "content_block": {"type": "text", "text": ""}}),
                ("content_block_delta", {"type": "content_block_delta", "index": i, "delta": {
                    "type": "text_delta", "text": block["text"]}})]
        else:
            events += [
                ("content_block_start", {"type": "content_block_start", "index": i,
                                         "content_block": {**block, "input": {}}}),
                ("content_block_delta", {"type": "content_block_delta", "index": i, "delta": {
                    "type": "input_json_delta", "partial_json": json.dumps(block["input"])}})]
        events.append(("content_block_stop", {"type": "content_block_stop", "index": i}))
    events += [("message_delta", {"type": "message_delta", "delta": {
        "stop_reason": message["stop_reason"], "stop_sequence": None},
        "usage": {"output_tokens": 1}}), ("message_stop", {"type": "message_stop"})]
    return events


def test_openai_responses_stream_loop(sse: SSEServer, canned: SimpleNamespace,
                                      guard: tuple[Guard, dict[str, int]]) -> None:
    """``client.responses.stream()``: the final response's calls go to the adapter as any
    response's; a stubborn model is capped and the loop stops on ``outputs.halt``."""
    openai = require("openai")
    from toolfault.adapters.openai import responses_tools, run_response_function_calls

    g, runs = guard
    sse.streams = [responses_stream(canned.response(REPEAT, n)) for n in range(10)]
    client = openai.OpenAI(base_url=f"{sse.url}/v1", api_key="test", max_retries=0)
    items: list[Any] = [{"role": "user", "content": "Find Atlantis."}]
    texts: list[str] = []
    for _ in range(10):
        with client.responses.stream(model="gpt-x", input=items,
                                     tools=responses_tools(g)) as stream:
            reply = stream.get_final_response()
        outputs = run_response_function_calls(g, reply, messages=items)
        items += [item.model_dump(exclude_none=True) for item in reply.output] + outputs
        texts += [o["output"] for o in outputs]
        if outputs.halt:
            break
    assert texts[0].startswith("find_city failed (code: not_found).")
    assert TERMINAL in texts[1]
    assert texts[2] == texts[1]  # the blocked repeat: the terminal text again, no body run
    assert "(code: halted)" in texts[3] and len(texts) == 4
    assert runs["find_city"] == 2


def test_anthropic_messages_stream_loop(sse: SSEServer, canned: SimpleNamespace,
                                        guard: tuple[Guard, dict[str, int]]) -> None:
    """``client.messages.stream()``: the accumulated message's tool uses are answered with
    ``is_error`` results; a stubborn model is capped and the loop stops on the halt."""
    anthropic = require("anthropic")
    from toolfault.adapters.anthropic import run_tool_uses, tools

    g, runs = guard
    sse.streams = [anthropic_stream(canned.anthropic(REPEAT, n)) for n in range(10)]
    client = anthropic.Anthropic(base_url=sse.url, api_key="test", max_retries=0)
    messages: list[Any] = [{"role": "user", "content": "Find Atlantis."}]
    results: list[Any] = []
    for _ in range(10):
        with client.messages.stream(model="claude-x", max_tokens=100, messages=messages,
                                    tools=tools(g)) as stream:
            message = stream.get_final_message()
        outputs = run_tool_uses(g, message, messages=messages)
        messages += [{"role": "assistant", "content": message.content},
                     {"role": "user", "content": list(outputs)}]
        results += outputs
        if outputs.halt:
            break
    assert [r["is_error"] for r in results] == [True, True, True, True]
    assert results[0]["content"].startswith("find_city failed (code: not_found).")
    assert TERMINAL in results[1]["content"]
    assert results[2]["content"] == results[1]["content"]  # the blocked repeat
    assert "(code: halted)" in results[3]["content"]
    assert runs["find_city"] == 2


async def test_agents_sdk_run_streamed_ends_on_the_halt(
        sse: SSEServer, canned: SimpleNamespace, guard: tuple[Guard, dict[str, int]]) -> None:
    """``Runner.run_streamed`` with ``stop_on_halt``: the stream's tool outputs carry the
    contract and the final output names the halt."""
    agents = require("agents")
    openai = require("openai")
    from toolfault.adapters.agents import function_tools, stop_on_halt

    g, runs = guard
    sse.streams = [responses_stream(canned.response(REPEAT, n)) for n in range(10)]
    client = openai.AsyncOpenAI(base_url=f"{sse.url}/v1", api_key="test", max_retries=0)
    agent = agents.Agent(name="assistant", instructions="Help.", tools=function_tools(g),
                         model=agents.OpenAIResponsesModel(model="gpt-x", openai_client=client),
                         tool_use_behavior=stop_on_halt)
    try:
        result = agents.Runner.run_streamed(agent, "Find Atlantis.",
                                            run_config=agents.RunConfig(tracing_disabled=True))
        outputs = [event.item.output async for event in result.stream_events()
                   if event.type == "run_item_stream_event"
                   and event.item.type == "tool_call_output_item"]
    finally:
        await client.close()
    assert str(outputs[0]).startswith("find_city failed (code: not_found).")
    assert len(outputs) == 4 and "(code: halted)" in str(outputs[-1])
    assert TERMINAL in str(outputs[1]) and outputs[2] == outputs[1]  # the blocked repeat
    assert str(result.final_output).startswith("Stopped: find_city failed (code: halted).")
    assert runs["find_city"] == 2


def test_previous_response_id_conversations_need_a_key(
        canned: SimpleNamespace, guard: tuple[Guard, dict[str, int]]) -> None:
    """With ``previous_response_id`` only this turn's items are at hand: without
    ``conversation=`` two users' calls count on one guard, with it each has its own."""
    from toolfault.adapters.openai import run_response_function_calls

    g, _ = guard

    def reply(call_id: str) -> dict[str, Any]:
        return dict(canned.response([("find_city", {"name": "Atlantis"}, call_id)], 0))

    shared = [run_response_function_calls(g, reply(f"call_{user}"))[0]["output"]
              for user in ("ann", "bob")]
    assert TERMINAL in shared[1]  # bob was capped by ann's failure: one counter for both
    g.new_turn()
    apart = [run_response_function_calls(g, reply(f"call_{user}_2"),
                                         conversation=user)[0]["output"]
             for user in ("ann", "bob")]
    assert all(text.startswith("find_city failed (code: not_found).") for text in apart)
    assert all(TERMINAL not in text for text in apart)
