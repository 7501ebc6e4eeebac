"""The pluggable model interface: simulated agents and real endpoints behind one Protocol.

A model sees what a model sees in production: the tool schemas and the conversation (OpenAI
chat format, tool results as text).  It never sees toolfault's internals, so a simulated agent
and a real model are compared on the same footing.  ``OpenAICompatibleModel`` drives any
OpenAI-compatible ``/chat/completions`` endpoint, through the ``openai`` package when it is
installed (imported lazily) or plain ``urllib`` otherwise.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from toolfault.bench._tasks import TaskBrief, ToolCall

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
    """The model endpoint failed or answered something that is not a chat completion."""


def parse_completion(data: Mapping[str, Any]) -> AgentTurn:
    """A chat-completion response (as a dict) as an :class:`AgentTurn`."""
    try:
        message = data["choices"][0]["message"]
    except (KeyError, IndexError, TypeError) as exc:
        raise ModelError(f"not a chat completion: {str(data)[:200]}") from exc
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


class OpenAICompatibleModel:
    """A real model behind an OpenAI-compatible endpoint (vLLM, llama.cpp, Ollama, OpenAI…).

    ``client="auto"`` uses the ``openai`` package when importable, else ``urllib``; the answer
    is parsed the same way either way.  No retries here: a failing endpoint ends the episode
    (``model_error``) rather than skewing the tool-call counts.
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

    def reset(self, brief: TaskBrief, tools: Sequence[Mapping[str, Any]], seed: str) -> None:
        self._tools = list(tools)

    def next_turn(self, messages: Sequence[Mapping[str, Any]]) -> AgentTurn:
        payload: dict[str, Any] = {
            "model": self.model,
            "messages": [dict(m) for m in messages],
            "tools": self._tools,
            "tool_choice": "auto",
            "temperature": self.temperature,
        }
        if self.client == "openai":
            return parse_completion(self._via_sdk(payload))
        return parse_completion(self._via_urllib(payload))

    def _via_sdk(self, payload: dict[str, Any]) -> dict[str, Any]:
        import openai

        if self._sdk is None:
            self._sdk = openai.OpenAI(base_url=self.base_url, api_key=self.api_key or "unused",
                                      timeout=self.timeout, max_retries=0)
        try:
            response = self._sdk.chat.completions.create(**payload)
        except openai.OpenAIError as exc:
            raise ModelError(f"{type(exc).__name__}: {exc}") from exc
        dumped: dict[str, Any] = response.model_dump()
        return dumped

    def _via_urllib(self, payload: dict[str, Any]) -> dict[str, Any]:
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        request = urllib.request.Request(f"{self.base_url}/chat/completions",
                                         data=json.dumps(payload).encode(), headers=headers,
                                         method="POST")
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:  # noqa: S310
                data = json.loads(response.read().decode("utf-8"))
        except (urllib.error.URLError, TimeoutError, ValueError) as exc:
            raise ModelError(f"{type(exc).__name__}: {exc}") from exc
        if not isinstance(data, dict):
            raise ModelError("the endpoint did not answer with a JSON object")
        return data


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
    """The assistant message that records a turn in the conversation."""
    if not turn.calls:
        return {"role": "assistant", "content": turn.final or ""}
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": c.id, "type": "function",
             "function": {"name": c.name, "arguments": c.arguments}}
            for c in turn.calls
        ],
    }
