"""A Messages API tool loop guarded by toolfault.

    python examples/anthropic_loop.py            # against Anthropic when ANTHROPIC_API_KEY is set
    python examples/anthropic_loop.py --offline  # against a tiny local stand-in model

The stand-in first calls ``get_weather`` with a wrong parameter name, reads the four-part
``tool_result`` (``is_error: true``), then follows its ``Next action``.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

# --8<-- [start:loop]
from typing import Any

from anthropic import Anthropic

from toolfault import Guard
from toolfault.adapters.anthropic import run_tool_uses, tools

guard = Guard()


@guard.tool
def get_weather(city: str) -> str:
    """Current weather for a city. Use it when the user asks about the weather.

    Args:
        city: the city's name, e.g. Oslo.
    """
    return f"sunny in {city}"


def run(client: Anthropic, model: str) -> str:
    messages: list[Any] = [{"role": "user", "content": "What is the weather in Oslo?"}]
    for _ in range(10):
        reply = client.messages.create(model=model, max_tokens=1024, messages=messages,
                                       tools=tools(guard))
        messages.append({"role": "assistant", "content": reply.content})
        if reply.stop_reason != "tool_use":
            return "".join(block.text for block in reply.content if block.type == "text")
        # one tool_result block per tool_use, in order; a new user message is a new turn
        results = run_tool_uses(guard, reply, messages=messages)
        for block in results:
            print(f"is_error={block['is_error']}\n{block['content']}", end="\n\n")
        messages.append({"role": "user", "content": results})
        if results.halt:  # the guard ended the turn: stop instead of asking the model again
            return "stopped: " + results.results[-1].text.splitlines()[0]
    return "(stopped after 10 model calls)"
# --8<-- [end:loop]


def stand_in(body: dict[str, Any]) -> dict[str, Any]:
    """A model that makes one mistake, then does what the last tool_result says."""
    last = body["messages"][-1]["content"]
    result = last[0] if isinstance(last, list) else None
    if result is not None and not result["is_error"]:
        content: list[Any] = [{"type": "text", "text": f"It is {result['content']}."}]
    else:
        args = {"city": "Oslo"} if result is not None else {"town": "Oslo"}
        content = [{"type": "tool_use", "id": f"toolu_{len(body['messages'])}",
                    "name": "get_weather", "input": args}]
    stop = "tool_use" if content[0]["type"] == "tool_use" else "end_turn"
    return {"id": "msg", "type": "message", "role": "assistant", "model": "stand-in",
            "content": content, "stop_reason": stop, "stop_sequence": None,
            "usage": {"input_tokens": 1, "output_tokens": 1}}


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
    if "--offline" in sys.argv or not os.environ.get("ANTHROPIC_API_KEY"):
        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        url = f"http://127.0.0.1:{server.server_address[1]}"
        print(run(Anthropic(base_url=url, api_key="offline", max_retries=0), "stand-in"))
    else:
        print(run(Anthropic(), os.environ.get("ANTHROPIC_MODEL", "claude-sonnet-4-5")))
