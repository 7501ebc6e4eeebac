"""Shared fixtures for adapter tests: a loopback HTTP stub that stands in for a model provider.

``stub_server`` serves canned responses in sequence per path and records every request, so a
test drives the *real* SDK client end to end and then asserts on what that client actually
sent next.  ``canned`` builds provider-shaped JSON (OpenAI Chat Completions, OpenAI Responses,
Anthropic Messages) from a small script: a step is either a list of tool calls
``(name, args)`` / ``(name, args, call_id)`` or a final text.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace
from typing import Any

import pytest

from toolfault import Backoff, Guard, Limits

# The Agents SDK reads this once at import: never export traces from a test run.
os.environ.setdefault("OPENAI_AGENTS_DISABLE_TRACING", "1")

FAST_BACKOFF = Backoff(initial=0.001, jitter=0, maximum=0.01)

Call = tuple[str, Any] | tuple[str, Any, str]
Step = Sequence[Call] | str


@dataclass(frozen=True, slots=True)
class Recorded:
    """One request the stub received."""

    method: str
    path: str
    headers: dict[str, str]
    body: Any


@dataclass(frozen=True, slots=True)
class Reply:
    """A canned response other than a plain ``200`` JSON body."""

    body: Any = None
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)


Responder = Callable[[Recorded], Any]


class StubServer:
    """A tiny provider stand-in on 127.0.0.1 (random port), served from a background thread.

    ``add(path, *responses)`` queues responses for a path; each is a JSON-able body, a
    :class:`Reply`, or a callable ``(Recorded) -> body | Reply``.  A request past the end of
    a queue gets a 500 (and is listed in ``unexpected``) rather than a repeat, so a runaway
    loop fails loudly instead of spinning.
    """

    def __init__(self) -> None:
        self.requests: list[Recorded] = []
        self.unexpected: list[Recorded] = []
        self._queues: dict[str, list[Any]] = {}
        self._lock = threading.Lock()
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._httpd.daemon_threads = True
        self.port = int(self._httpd.server_address[1])
        self.url = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self._httpd.serve_forever, args=(0.05,),
                                        daemon=True)
        self._thread.start()

    def add(self, path: str, *responses: Any) -> None:
        with self._lock:
            self._queues.setdefault(path, []).extend(responses)

    def reply(self, body: Any = None, *, status: int = 200,
              headers: dict[str, str] | None = None) -> Reply:
        return Reply(body, status, dict(headers or {}))

    def bodies(self, path: str | None = None) -> list[Any]:
        """JSON bodies received, in order (optionally only those sent to ``path``)."""
        return [r.body for r in self.requests if path is None or r.path == path]

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)

    def _respond(self, rec: Recorded) -> Reply:
        with self._lock:
            self.requests.append(rec)
            queue = self._queues.get(rec.path)
            item = queue.pop(0) if queue else None
            if item is None:
                self.unexpected.append(rec)
        if item is None:
            return Reply({"error": {"type": "stub_exhausted", "message":
                                    f"no canned response left for {rec.method} {rec.path}"}},
                         status=500)
        if callable(item):
            item = item(rec)
        return item if isinstance(item, Reply) else Reply(item)

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        stub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def _serve(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                raw = self.rfile.read(length).decode() if length else ""
                try:
                    body: Any = json.loads(raw) if raw else None
                except ValueError:
                    body = raw
                rec = Recorded(self.command, self.path.split("?")[0],
                               {k.lower(): v for k, v in self.headers.items()}, body)
                reply = stub._respond(rec)
                data = b"" if reply.body is None else json.dumps(reply.body).encode()
                self.send_response(reply.status)
                headers = {"content-type": "application/json", **reply.headers}
                for key, value in headers.items():
                    self.send_header(key, value)
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _serve

        return Handler


@pytest.fixture
def stub_server() -> Iterator[StubServer]:
    """A fresh loopback provider stub per test."""
    server = StubServer()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def fast_guard() -> Guard:
    """A guard whose in-wrapper backoff takes milliseconds, so transient tests stay fast."""
    return Guard(limits=Limits(backoff=FAST_BACKOFF))


# -- provider-shaped canned responses ----------------------------------------------------
def _args(args: Any) -> str:
    return args if isinstance(args, str) else json.dumps(args)


def _calls(step: Sequence[Call], n: int) -> list[tuple[str, Any, str]]:
    return [(c[0], c[1], c[2] if len(c) == 3 else f"call_{n}_{i}")  # type: ignore[misc]
            for i, c in enumerate(step)]


def chat_completion(step: Step, n: int = 0) -> dict[str, Any]:
    """An OpenAI ``chat.completion``: tool calls, or a final assistant text."""
    message: dict[str, Any] = {"role": "assistant", "content": None}
    if isinstance(step, str):
        message["content"] = step
    else:
        message["tool_calls"] = [
            {"id": cid, "type": "function", "function": {"name": name, "arguments": _args(a)}}
            for name, a, cid in _calls(step, n)
        ]
    return {"id": f"chatcmpl-{n}", "object": "chat.completion", "created": 0, "model": "gpt-x",
            "choices": [{"index": 0, "message": message,
                         "finish_reason": "stop" if isinstance(step, str) else "tool_calls"}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}


def response(step: Step, n: int = 0) -> dict[str, Any]:
    """An OpenAI Responses ``response``: ``function_call`` items, or one output message."""
    if isinstance(step, str):
        output: list[dict[str, Any]] = [{
            "type": "message", "id": f"msg_{n}", "role": "assistant", "status": "completed",
            "content": [{"type": "output_text", "text": step, "annotations": []}],
        }]
    else:
        output = [{"type": "function_call", "id": f"fc_{n}_{i}", "call_id": cid, "name": name,
                   "arguments": _args(a), "status": "completed"}
                  for i, (name, a, cid) in enumerate(_calls(step, n))]
    return {"id": f"resp_{n}", "object": "response", "created_at": 0, "model": "gpt-x",
            "status": "completed", "parallel_tool_calls": True, "tool_choice": "auto",
            "tools": [], "output": output,
            "usage": {"input_tokens": 1, "output_tokens": 1, "total_tokens": 2,
                      "input_tokens_details": {"cached_tokens": 0},
                      "output_tokens_details": {"reasoning_tokens": 0}}}


def anthropic_message(step: Step, n: int = 0) -> dict[str, Any]:
    """An Anthropic ``message``: ``tool_use`` blocks, or a final text block."""
    if isinstance(step, str):
        content: list[dict[str, Any]] = [{"type": "text", "text": step}]
    else:
        content = [{"type": "tool_use", "id": cid, "name": name,
                    "input": a if isinstance(a, dict) else json.loads(a)}
                   for name, a, cid in _calls(step, n)]
    return {"id": f"msg_{n}", "type": "message", "role": "assistant", "model": "claude-x",
            "content": content, "stop_reason": "end_turn" if isinstance(step, str) else "tool_use",
            "stop_sequence": None, "usage": {"input_tokens": 1, "output_tokens": 1}}


def script(build: Callable[[Step, int], dict[str, Any]], steps: Sequence[Step]) -> list[Any]:
    """Canned responses for ``steps``, numbered so call ids are unique across the run."""
    return [build(step, n) for n, step in enumerate(steps)]


@pytest.fixture
def canned() -> SimpleNamespace:
    """Builders for provider-shaped responses (see the module docstring)."""
    return SimpleNamespace(chat=chat_completion, response=response,
                           anthropic=anthropic_message, script=script)
