"""The pluggable model interface, driven against a local stub OpenAI-compatible server."""

from __future__ import annotations

import json
import re
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from toolfault_cli._cli import main
from toolfault_cli.bench import OpenAICompatibleModel, Suite, metrics_from_trace, run_suite
from toolfault_cli.bench._model import ModelError, parse_completion


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


def llama_cpp_rejection(body: dict[str, Any]) -> str | None:
    """What llama.cpp's server answers with HTTP 500 in a request, or ``None``.

    Its JSON parser wants strings: ``content: null`` in a message, a ``null`` tool description
    or tool-call id fail the whole request.
    """
    for message in body.get("messages", []):
        if not isinstance(message.get("content"), str):
            return "[json.exception.type_error.302] type must be string, but is null"
        for call in message.get("tool_calls") or ():
            if not isinstance(call.get("id"), str) or not call["id"]:
                return "tool_calls id must be a non-empty string"
    for tool in body.get("tools", []):
        if not isinstance(tool["function"].get("description"), str):
            return "Failed to parse tools: type must be string, but is null"
    return None


class StubServer:
    """http.server on 127.0.0.1 answering /chat/completions like a strict llama.cpp server.

    ``mode``: ``"ok"`` answers with :func:`scripted`; ``"unauthorized"`` with 401,
    ``"html"`` with a 200 web page (not an OpenAI-compatible endpoint), ``"dies"`` with 503
    after the first request, ``"flaky"`` with 503 on every third request after the first
    (an endpoint failing some requests mid-run).  Requests llama.cpp
    rejects get its HTTP 500; other paths get 404.
    """

    def __init__(self, mode: str = "ok") -> None:
        self.requests: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        self.rejected: list[str] = []
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                stub.requests.append(body)
                stub.headers.append({k.lower(): v for k, v in self.headers.items()})
                kind = "application/json"
                if not self.path.rstrip("/").endswith("/v1/chat/completions"):
                    data, status = b'{"error": "not found"}', 404
                elif mode == "unauthorized":
                    data, status = (b'{"error": {"message": "Incorrect API key provided", '
                                    b'"type": "invalid_request_error"}}', 401)
                elif mode == "dies" and len(stub.requests) > 1:
                    data, status = b'{"error": {"message": "model unloaded"}}', 503
                elif mode == "flaky" and len(stub.requests) > 1 and len(stub.requests) % 3 == 0:
                    data, status = b'{"error": {"message": "overloaded, try later"}}', 503
                elif mode == "html":
                    data, status, kind = b"<html><body>router login</body></html>", 200, \
                        "text/html"
                elif (problem := llama_cpp_rejection(body)) is not None:
                    stub.rejected.append(problem)
                    data = json.dumps({"error": {"code": 500, "message": problem,
                                                 "type": "server_error"}}).encode()
                    status = 500
                else:
                    data, status = json.dumps(scripted(body)).encode(), 200
                self.send_response(status)
                self.send_header("Content-Type", kind)
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
                                                    monkeypatch: pytest.MonkeyPatch,
                                                    tmp_path: Path) -> None:
    """`toolfault bench --model-url --model` replaces the simulated agents by the model."""
    monkeypatch.setenv("STUB_KEY", "sk-cli")
    page = tmp_path / "model.html"
    assert main(["bench", "--json", "--model-url", stub.url, "--model", "stub",
                 "--api-key-env", "STUB_KEY", "--report", str(page)]) == 0
    html = page.read_text(encoding="utf-8")
    assert "Same tools, same injected faults, the same model (stub)." in html
    assert "seeded agents" not in html and "Simulated models" not in html
    out = json.loads(capsys.readouterr().out)
    assert out["suite"]["agents"] == ["model:stub"]
    assert set(out["agents"]["toolfault"]) == {"model:stub"}
    assert out["scenarios"]["toolfault"]["flights.bad_input"]["success_rate"] == 1.0
    assert stub.headers[0].get("authorization") == "Bearer sk-cli"


def _post(url: str, body: dict[str, Any]) -> int:
    request = urllib.request.Request(f"{url}/chat/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:  # noqa: S310
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code


def test_the_stub_rejects_null_content_like_llama_cpp(stub: StubServer) -> None:
    """The stub is strict: an assistant turn with ``content: null`` gets HTTP 500."""
    tools = [{"type": "function", "function": {"name": "f", "description": "d",
                                               "parameters": {"type": "object"}}}]
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    base = [{"role": "user", "content": "hi"}]
    assert _post(stub.url, {"model": "stub", "tools": tools, "messages": [
        *base, {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "ok"}]}) == 500
    assert _post(stub.url, {"model": "stub", "tools": tools, "messages": [
        *base, {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "ok"}]}) == 200


@pytest.mark.parametrize("client", ["urllib", "openai"])
def test_no_request_carries_null_content(stub: StubServer, client: str) -> None:
    """A whole CLI run against the strict stub: every assistant turn is accepted."""
    if client == "openai":
        pytest.importorskip("openai")
    result = _one_episode(stub.url, client)
    assert stub.rejected == []
    assert any(m.get("tool_calls") and m["content"] == ""
               for r in stub.requests for m in r["messages"])
    stops = {r["stop"] for r in result.records if r["type"] == "episode"}
    assert "model_error" not in stops


def test_null_descriptions_and_contents_are_sent_as_strings(stub: StubServer) -> None:
    """A schema without a description and a null message content reach the server as ""."""
    from toolfault_cli.bench._tasks import SCENARIOS

    model = OpenAICompatibleModel(stub.url, "stub", client="urllib")
    model.reset(SCENARIOS[0].brief, [{"type": "function", "function": {
        "name": "f", "description": None, "parameters": {"type": "object"}}}], "1")
    turn = model.next_turn([{"role": "user", "content": "hi"},
                            {"role": "assistant", "content": None}])
    assert stub.rejected == [] and turn.final == "I cannot do this task."
    assert stub.requests[0]["tools"][0]["function"]["description"] == ""


@pytest.mark.parametrize(("mode", "path", "expected"), [
    ("ok", "/v1", "cannot reach"),
    ("ok", "/wrong", "HTTP 404"),
    ("unauthorized", "/v1", "HTTP 401"),
    ("html", "/v1", "OpenAI-compatible"),
])
@pytest.mark.parametrize("client", ["urllib", "openai"])
def test_a_bad_endpoint_fails_before_any_episode(mode: str, path: str, expected: str,
                                                 client: str,
                                                 capsys: pytest.CaptureFixture[str],
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Unreachable, 404, 401 or not OpenAI-compatible: one stderr line, exit 1, no episodes."""
    if client == "openai":
        pytest.importorskip("openai")
    else:
        monkeypatch.setattr("toolfault_cli.bench._model._pick_client", lambda _: "urllib")
    monkeypatch.setenv("STUB_KEY", "sk-secret-123")
    with StubServer(mode) as server:
        url = "http://u:pw-secret-9@127.0.0.1:1/v1" if expected == "cannot reach" else \
            server.url.removesuffix("/v1") + path
        code = main(["bench", "--model-url", url, "--model", "stub", "--api-key-env",
                     "STUB_KEY"])
        seen = len(server.requests)
    captured = capsys.readouterr()
    assert code == 1
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("toolfault bench: error: model endpoint")
    assert expected in lines[0] and "no episodes were run" in lines[0]
    assert "Errno" not in lines[0]
    assert "sk-secret-123" not in captured.err and captured.out == ""
    assert "pw-secret-9" not in captured.err
    assert seen <= 1  # the check only
    if expected == "HTTP 401":
        assert "$STUB_KEY" in lines[0]


def test_an_endpoint_that_dies_during_the_run_fails_the_command(
        capsys: pytest.CaptureFixture[str]) -> None:
    """The check passes, then every episode ends in a model error: exit 1 and say so."""
    with StubServer("dies") as server:
        code = main(["bench", "--json", "--model-url", server.url, "--model", "stub"])
    captured = capsys.readouterr()
    assert code == 1
    assert "every episode ended in a model error" in captured.err
    payload = json.loads(captured.out)
    assert payload["policies"]["toolfault"]["model_errors"] >= 1
    assert payload["policies"]["toolfault"]["crashes"] == 0
    assert payload["model_errors"][0]["endpoint"] == server.url


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


def test_an_endpoint_failing_some_requests_is_named_and_fails_the_command(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Some episodes end in model errors: counted apart from crashes, the endpoint and count
    named in the terminal and on the page, and exit status 1."""
    page = tmp_path / "page.html"
    with StubServer("flaky") as server:
        code = main(["bench", "--model-url", server.url, "--model", "stub", "--report",
                     str(page)])
    captured = capsys.readouterr()
    assert code == 1
    out = " ".join(captured.out.split())
    failed = re.search(rf"model endpoint errors: {re.escape(server.url)} failed in (\d+) of "
                       rf"(\d+) episodes \(first: .*overloaded, try later", out)
    assert failed is not None, out
    n, total = int(failed.group(1)), int(failed.group(2))
    assert 0 < n < total
    assert f"{n} of {total} episodes ended in a model error" in captured.err
    assert server.url in captured.err
    html = page.read_text(encoding="utf-8")
    assert f'data-endpoint="{server.url}"' in html
    assert f"failed in <b>{n}</b> of {total} episodes" in html
    assert 'data-group="model_error"' in html  # its own segment of how episodes ended
