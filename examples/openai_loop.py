"""A Chat Completions tool loop guarded by toolfault.

    python examples/openai_loop.py            # against OpenAI when OPENAI_API_KEY is set
    python examples/openai_loop.py --offline  # against a tiny local stand-in model

The stand-in first calls ``get_weather`` with a wrong parameter name, reads the four-part
answer, then follows its ``Next action``; every tool message is printed as it is sent.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

# --8<-- [start:loop]
from typing import Any

from openai import OpenAI

from toolfault import Guard
from toolfault.adapters.openai import chat_tools, run_chat_tool_calls

guard = Guard()


@guard.tool
def get_weather(city: str) -> str:
    """Current weather for a city. Use it when the user asks about the weather.

    Args:
        city: the city's name, e.g. Oslo.
    """
    return f"sunny in {city}"


def run(client: OpenAI, model: str) -> str:
    messages: list[Any] = [{"role": "user", "content": "What is the weather in Oslo?"}]
    for _ in range(10):
        reply = client.chat.completions.create(model=model, messages=messages,
                                               tools=chat_tools(guard))
        message = reply.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        if not message.tool_calls:
            return message.content or ""
        # messages=: a new user message in it starts a new turn, with no new_turn() to call
        outputs = run_chat_tool_calls(guard, message, messages=messages)
        for tool_message in outputs:
            print(tool_message["content"], end="\n\n")  # no error flag: the text is the signal
        messages.extend(outputs)
        if outputs.halt:  # the guard ended the turn: stop instead of asking the model again
            return "stopped: " + outputs.results[-1].text.splitlines()[0]
    return "(stopped after 10 model calls)"
# --8<-- [end:loop]


def stand_in(body: dict[str, Any]) -> dict[str, Any]:
    """A model that makes one mistake, then does what the last tool message says."""
    last = body["messages"][-1]
    message: dict[str, Any] = {"role": "assistant", "content": None}
    if last["role"] == "tool" and "failed (code:" not in last["content"]:
        message["content"] = f"It is {last['content']}."
    else:
        args = '{"town": "Oslo"}' if last["role"] == "user" else '{"city": "Oslo"}'
        message["tool_calls"] = [{"id": f"call_{len(body['messages'])}", "type": "function",
                                  "function": {"name": "get_weather", "arguments": args}}]
    done = "tool_calls" not in message
    return {"id": "c", "object": "chat.completion", "created": 0, "model": "stand-in",
            "choices": [{"index": 0, "message": message,
                         "finish_reason": "stop" if done else "tool_calls"}]}


class Handler(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["content-length"])))
        data = json.dumps(stand_in(body)).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:
        pass


if __name__ == "__main__":
    if "--offline" in sys.argv or not os.environ.get("OPENAI_API_KEY"):
        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        url = f"http://127.0.0.1:{server.server_address[1]}/v1"
        print(run(OpenAI(base_url=url, api_key="offline", max_retries=0), "stand-in"))
    else:
        print(run(OpenAI(), os.environ.get("OPENAI_MODEL", "gpt-4.1-mini")))
