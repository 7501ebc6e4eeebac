"""The pluggable model interface: simulated agents and real endpoints behind one Protocol.

A model sees what a model sees in production: the tool schemas and the conversation (OpenAI
chat format, tool results as text).  It never sees toolfault's internals, so a simulated agent
and a real model are compared on the same footing.  ``OpenAICompatibleModel`` drives any
OpenAI-compatible ``/chat/completions`` endpoint, through the ``openai`` package when it is
installed (imported lazily) or plain ``urllib`` otherwise.
"""

from __future__ import annotations

import json
import re
import socket
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol
from urllib.parse import urlsplit

from toolfault_cli.bench._tasks import TaskBrief, ToolCall

SYSTEM_PROMPT = (
    "You are an agent that completes the user's request by calling the tools provided. "
    "Read every tool result carefully. When the request is done, or cannot be done, answer "
    "the user in one sentence without calling a tool."
)


@dataclass(frozen=True, slots=True)
class AgentTurn:
    """One model turn: tool calls to run, or a final answer (no calls) that ends the episode."""

    calls: tuple[ToolCall, ...] = ()
    final: str | None = None


class AgentModel(Protocol):
    """Anything that can play the model in an episode.

    ``reset`` starts an episode (the brief, the tool schemas in OpenAI ``tools`` format, a seed
    string); ``next_turn`` gets the whole conversation so far and answers with tool calls or a
    final answer.
    """

    name: str

    def reset(self, brief: TaskBrief, tools: Sequence[Mapping[str, Any]], seed: str) -> None: ...

    def next_turn(self, messages: Sequence[Mapping[str, Any]]) -> AgentTurn: ...


class ModelError(RuntimeError):
    """The model endpoint failed or answered something that is not a chat completion.

    ``status`` is the HTTP status when the server answered one (``None`` when it could not be
    reached or its answer was not a chat completion).
    """

    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


def parse_completion(data: Mapping[str, Any]) -> AgentTurn:
    """A chat-completion response (as a dict) as an :class:`AgentTurn`."""
    try:
        message = data["choices"][0]["message"]
        if not isinstance(message, Mapping):
            raise TypeError("message is not an object")
    except (KeyError, IndexError, TypeError) as exc:
        shown = " ".join(str(data).split())[:200]
        raise ModelError(f"not a chat completion: {shown}") from exc
    calls = []
    for index, item in enumerate(message.get("tool_calls") or ()):
        function = item.get("function") or {}
        arguments = function.get("arguments")
        if not isinstance(arguments, str):
            arguments = json.dumps(arguments if arguments is not None else {})
        calls.append(ToolCall(str(function.get("name")), arguments,
                              str(item.get("id") or f"call_{index}")))
    if calls:
        return AgentTurn(tuple(calls))
    return AgentTurn(final=str(message.get("content") or ""))


#: The probe's one tool: servers that cannot take ``tools`` fail the check, not every episode.
_PROBE_TOOL = {"type": "function", "function": {
    "name": "ping", "description": "Answer a ping. Never needed: reply in words instead.",
    "parameters": {"type": "object", "properties": {}, "required": []}}}


class OpenAICompatibleModel:
    """A real model behind an OpenAI-compatible endpoint (vLLM, llama.cpp, Ollama, OpenAI…).

    ``client="auto"`` uses the ``openai`` package when importable, else ``urllib``; the answer
    is parsed the same way either way.  No retries here: a failing endpoint ends the episode
    (``model_error``) rather than skewing the tool-call counts.  What is sent is the subset
    every one of those servers accepts: assistant turns with tool calls carry ``content: ""``
    (llama.cpp answers ``null`` with HTTP 500), tool descriptions are strings, ids are never
    empty.  :meth:`check` sends one small request first so a wrong URL fails before a run.
    """

    def __init__(self, base_url: str, model: str, *, api_key: str | None = None,
                 client: Literal["auto", "openai", "urllib"] = "auto", timeout: float = 120.0,
                 temperature: float = 0.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.name = f"model:{model}"
        self.api_key = api_key
        self.timeout = timeout
        self.temperature = temperature
        self.client = _pick_client(client)
        self._tools: list[Mapping[str, Any]] = []
        self._sdk: Any = None
        #: The base URL as reports name it (a password in it shown as ``***``).
        self.endpoint = self._scrub(self.base_url)

    def reset(self, brief: TaskBrief, tools: Sequence[Mapping[str, Any]], seed: str) -> None:
        self._tools = [_portable_tool(t) for t in tools]

    def next_turn(self, messages: Sequence[Mapping[str, Any]]) -> AgentTurn:
        payload: dict[str, Any] = {
            "model": self.model,
            "messages": [_portable_message(m) for m in messages],
            "tools": self._tools,
            "tool_choice": "auto",
            "temperature": self.temperature,
        }
        return parse_completion(self._post(payload))

    def check(self) -> None:
        """One small chat completion with one tool; raises :class:`ModelError` if it fails.

        Catches what would otherwise turn every episode into a ``model_error``: an unreachable
        host, a URL that is not the ``/v1`` base (404), a model the server does not serve, a
        rejected key, a server started without tool support, an answer that is not a chat
        completion.
        """
        payload = {"model": self.model, "temperature": self.temperature,
                   "messages": [{"role": "user", "content": "Reply with the word OK."}],
                   "tools": [_PROBE_TOOL], "tool_choice": "auto"}
        parse_completion(self._post(payload))

    def _post(self, payload: dict[str, Any]) -> dict[str, Any]:
        if self.client == "openai":
            return self._via_sdk(payload)
        return self._via_urllib(payload)

    def _scrub(self, text: str) -> str:
        """One line, at most 300 characters, never the API key or a password in the URL."""
        text = " ".join(str(text).split())
        for secret in (self.api_key, urlsplit(self.base_url).password):
            if secret:
                text = text.replace(secret, "***")
        return text if len(text) <= 300 else text[:297] + "..."

    def _reason(self, cause: object) -> str:
        """Why a connection failed, in words: ``connection refused``, not ``[Errno 111] ...``."""
        if isinstance(cause, OSError) and cause.strerror:
            text = cause.strerror
        elif isinstance(cause, TimeoutError | socket.timeout) or "timed out" in str(cause):
            text = "timed out"
        else:
            text = re.sub(r"\[Errno -?\d+\]\s*", "", str(cause)) or type(cause).__name__
        return self._scrub(text[:1].lower() + text[1:])

    def _status_error(self, status: int, detail: str, *, json_body: bool = True) -> ModelError:
        url = self._scrub(f"{self.base_url}/chat/completions")
        if not json_body:
            detail = ""
        if status == 404:
            hint = (f"is {self._scrub(self.base_url)} the OpenAI-compatible base URL "
                    f"(usually ending in /v1) and is model {self.model!r} served there?")
        elif status in (401, 403):
            hint = "the server rejected the API key"
        elif not json_body:
            hint = "is it an OpenAI-compatible endpoint?"
        else:
            hint = ""
        parts = [f"{url} answered HTTP {status}", detail and self._scrub(detail), hint]
        return ModelError(": ".join(p for p in parts if p), status=status)

    def _via_sdk(self, payload: dict[str, Any]) -> dict[str, Any]:
        import openai

        if self._sdk is None:
            self._sdk = openai.OpenAI(base_url=self.base_url, api_key=self.api_key or "unused",
                                      timeout=self.timeout, max_retries=0)
        try:
            response = self._sdk.chat.completions.create(**payload)
        except openai.APIStatusError as exc:
            raise self._status_error(exc.status_code, _error_detail(exc.body, exc.message),
                                     json_body=isinstance(exc.body, dict)) from exc
        except openai.APIConnectionError as exc:
            cause = exc.__cause__ or exc
            raise ModelError(self._scrub(f"cannot reach {self.base_url}: {self._reason(cause)}")
                             ) from exc
        except openai.OpenAIError as exc:
            raise ModelError(self._scrub(f"{type(exc).__name__}: {exc}")) from exc
        if not hasattr(response, "model_dump"):
            raise ModelError(self._scrub(f"{self.base_url}/chat/completions did not answer "
                                         f"with a chat completion (is it an OpenAI-compatible "
                                         f"endpoint?)"))
        dumped: dict[str, Any] = response.model_dump()
        return dumped

    def _via_urllib(self, payload: dict[str, Any]) -> dict[str, Any]:
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        url = f"{self.base_url}/chat/completions"
        request = urllib.request.Request(url, data=json.dumps(payload).encode(),
                                         headers=headers, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:  # noqa: S310
                body = response.read()
        except urllib.error.HTTPError as exc:
            try:
                raw = exc.read().decode("utf-8", "replace")
            except OSError:
                raw = ""
            try:
                parsed: Any = json.loads(raw)
            except ValueError:
                parsed = None
            raise self._status_error(exc.code, _error_detail(parsed, raw),
                                     json_body=isinstance(parsed, dict)) from exc
        except (urllib.error.URLError, TimeoutError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise ModelError(self._scrub(f"cannot reach {self.base_url}: {self._reason(reason)}")
                             ) from exc
        try:
            data = json.loads(body.decode("utf-8"))
        except ValueError as exc:
            raise ModelError(self._scrub(f"{url} did not answer with JSON (is it an "
                                         f"OpenAI-compatible endpoint?)")) from exc
        if not isinstance(data, dict):
            raise ModelError(self._scrub(f"{url} did not answer with a JSON object"))
        return data


def _error_detail(body: Any, fallback: str) -> str:
    """The server's own error message: OpenAI, vLLM, llama.cpp and Ollama nest it alike."""
    if isinstance(body, dict):
        inner = body.get("error", body)
        if isinstance(inner, dict):
            message = inner.get("message") or inner.get("detail")
            if message:
                return str(message)
        elif isinstance(inner, str):
            return inner
        if isinstance(body.get("detail"), str):
            return str(body["detail"])
    return fallback


def _portable_tool(tool: Mapping[str, Any]) -> dict[str, Any]:
    """A tool schema with a string description (llama.cpp rejects ``null``)."""
    out = dict(tool)
    function = dict(out.get("function") or {})
    if not isinstance(function.get("description"), str):
        function["description"] = ""
    out["function"] = function
    return out


def _portable_message(message: Mapping[str, Any]) -> dict[str, Any]:
    """A message every OpenAI-compatible server accepts: content is a string, never null."""
    out = dict(message)
    if out.get("content") is None:
        out["content"] = ""
    return out


def _pick_client(client: str) -> Literal["openai", "urllib"]:
    if client == "urllib":
        return "urllib"
    try:
        import openai  # noqa: F401
    except ImportError:
        if client == "openai":
            raise
        return "urllib"
    return "openai"


def assistant_message(turn: AgentTurn) -> dict[str, Any]:
    """The assistant message that records a turn in the conversation.

    With tool calls the content is ``""``, not ``null``: OpenAI, vLLM and Ollama take either,
    llama.cpp's server answers ``null`` with HTTP 500.
    """
    if not turn.calls:
        return {"role": "assistant", "content": turn.final or ""}
    return {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"id": c.id, "type": "function",
             "function": {"name": c.name, "arguments": c.arguments}}
            for c in turn.calls
        ],
    }
