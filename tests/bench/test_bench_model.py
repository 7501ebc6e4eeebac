"""The pluggable model interface, driven against a local stub OpenAI-compatible server."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from toolfault._cli import main
from toolfault.bench import OpenAICompatibleModel, Suite, metrics_from_trace, run_suite
from toolfault.bench._model import ModelError, parse_completion


def _reply(tool_calls: list[dict[str, Any]] | None = None, content: str | None = None
           ) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if tool_calls:
        message["tool_calls"] = [
            {"id": f"call_{i}", "type": "function",
             "function": {"name": name, "arguments": json.dumps(args)}}
            for i, (name, args) in enumerate((c["name"], c["args"]) for c in tool_calls)
        ]
    return {"id": "chatcmpl-stub", "object": "chat.completion", "created": 0, "model": "stub",
            "choices": [{"index": 0, "message": message, "finish_reason": "stop"}]}


def scripted(payload: dict[str, Any]) -> dict[str, Any]:
    """A canned model: search with a bad price, fix it when told, book, then answer."""
    last = payload["messages"][-1]
    names = {t["function"]["name"] for t in payload.get("tools", [])}
    if "search_flights" not in names:
        return _reply(content="I cannot do this task.")
    search = {"origin": "SFO", "destination": "JFK", "max_price": -1}
    if last["role"] == "user":
        return _reply([{"name": "search_flights", "args": search}])
    text = last["content"] or ""
    if "Next action" in text and "max_price" in text:
        return _reply([{"name": "search_flights", "args": {**search, "max_price": 450}}])
    if '"flights"' in text:
        return _reply([{"name": "book_flight",
                        "args": {"flight_id": "UA101", "passenger": "Ada Lovelace"}}])
    return _reply(content="Booked." if "confirmed" in text else "I could not finish.")


class StubServer:
    """http.server on 127.0.0.1 answering /chat/completions with :func:`scripted`."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                stub.requests.append(body)
                stub.headers.append({k.lower(): v for k, v in self.headers.items()})
                if self.path.rstrip("/").endswith("/chat/completions"):
                    data, status = json.dumps(scripted(body)).encode(), 200
                else:
                    data, status = b'{"error": "not found"}', 404
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> StubServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def stub() -> Iterator[StubServer]:
    """A running stub endpoint, shut down after the test."""
    with StubServer() as server:
        yield server


def _one_episode(url: str, client: str) -> Any:
    suite = Suite(seed=1, episodes=1, scenarios=("flights.bad_input",), agents=(),
                  policies=("toolfault", "error_failed"))
    factory = {"model:stub": lambda: OpenAICompatibleModel(url, "stub", api_key="sk-test",
                                                           client=client)}  # type: ignore[arg-type]
    return run_suite(suite, models=factory)


@pytest.mark.parametrize("client", ["urllib", "openai"])
def test_a_real_endpoint_drives_an_episode(stub: StubServer, client: str) -> None:
    """The model gets the tool schemas and the conversation, and its tool calls are run."""
    if client == "openai":
        pytest.importorskip("openai")
    result = _one_episode(stub.url, client)
    summary = metrics_from_trace(result.records)
    assert summary.policies["toolfault"].success_rate == 1.0  # fixed max_price when told
    assert summary.policies["error_failed"].success_rate == 0.0  # "Error: failed" names nothing
    first = stub.requests[0]
    assert first["model"] == "stub"
    assert {t["function"]["name"] for t in first["tools"]} >= {"search_flights", "book_flight"}
    assert first["tools"][0]["function"]["parameters"]["type"] == "object"
    assert [m["role"] for m in first["messages"]] == ["system", "user"]
    later = stub.requests[1]["messages"]
    assert later[-2]["tool_calls"][0]["function"]["name"] == "search_flights"
    assert later[-1]["role"] == "tool" and "Next action" in later[-1]["content"]
    assert stub.headers[0].get("authorization") == "Bearer sk-test"


def test_the_cli_runs_the_suite_against_a_model_url(stub: StubServer,
                                                    capsys: pytest.CaptureFixture[str],
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """`toolfault bench --model-url --model` replaces the simulated agents by the model."""
    monkeypatch.setenv("STUB_KEY", "sk-cli")
    assert main(["bench", "--json", "--model-url", stub.url, "--model", "stub",
                 "--api-key-env", "STUB_KEY"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["suite"]["agents"] == ["model:stub"]
    assert set(out["agents"]["toolfault"]) == {"model:stub"}
    assert out["scenarios"]["toolfault"]["flights.bad_input"]["success_rate"] == 1.0
    assert stub.headers[0].get("authorization") == "Bearer sk-cli"


def test_an_unreachable_endpoint_ends_the_episode_as_a_model_error() -> None:
    """A dead endpoint is recorded (stop=model_error), not raised into the harness."""
    result = _one_episode("http://127.0.0.1:9/v1", "urllib")
    stops = {r["stop"] for r in result.records if r["type"] == "episode"}
    assert stops == {"model_error"}


def test_completions_without_choices_are_model_errors() -> None:
    """A body that is not a chat completion raises ModelError with a readable message."""
    with pytest.raises(ModelError):
        parse_completion({"error": "quota"})
    turn = parse_completion(_reply([{"name": "x", "args": {"a": 1}}]))
    assert turn.calls[0].name == "x" and json.loads(turn.calls[0].arguments) == {"a": 1}
