"""Traces: GenAI execute_tool spans and a redacted JSONL trace."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from toolfault import Guard, Limits, ToolError

_EXPORTER = InMemorySpanExporter()


@pytest.fixture(scope="module", autouse=True)
def provider() -> Iterator[None]:
    tp = TracerProvider()
    tp.add_span_processor(SimpleSpanProcessor(_EXPORTER))
    trace.set_tracer_provider(tp)
    yield
    tp.shutdown()


@pytest.fixture
def exporter() -> InMemorySpanExporter:
    _EXPORTER.clear()
    return _EXPORTER


def _guard(**kw: object) -> Guard:
    guard = Guard(limits=Limits(retry_limit=2), scan_env_secrets=False, **kw)  # type: ignore[arg-type]

    @guard.tool
    def charge(card: str, amount: int) -> str:
        if amount <= 0:
            raise ToolError("invalid_argument", "amount must be positive")
        return "charged"

    return guard


def test_spans_follow_genai_conventions(exporter: InMemorySpanExporter) -> None:
    """One INTERNAL execute_tool span per call, with gen_ai.* attributes and error.type."""
    guard = _guard()
    guard.call("charge", {"card": "4242", "amount": 5}, call_id="c1")
    guard.call("charge", {"card": "4242", "amount": -5}, call_id="c2")
    ok, failed = exporter.get_finished_spans()
    assert ok.name == "execute_tool charge"
    assert ok.kind is trace.SpanKind.INTERNAL
    assert ok.attributes is not None and failed.attributes is not None
    assert ok.attributes["gen_ai.operation.name"] == "execute_tool"
    assert ok.attributes["gen_ai.tool.name"] == "charge"
    assert ok.attributes["gen_ai.tool.call.id"] == "c1"
    assert ok.attributes["gen_ai.tool.type"] == "function"
    assert "error.type" not in ok.attributes
    assert failed.attributes["error.type"] == "invalid_argument"
    assert failed.attributes["toolfault.code"] == "invalid_argument"
    assert failed.status.status_code is trace.StatusCode.ERROR
    assert len(str(failed.attributes["toolfault.fingerprint"])) == 64
    assert "gen_ai.tool.call.arguments" not in failed.attributes


def test_content_only_when_opted_in(exporter: InMemorySpanExporter) -> None:
    """Arguments and results go on spans only with capture_content=True, redacted."""
    guard = _guard(capture_content=True, secrets=["4242-secret"])
    guard.call("charge", {"card": "4242-secret", "amount": 5})
    (span,) = exporter.get_finished_spans()
    assert span.attributes is not None
    assert "[REDACTED]" in str(span.attributes["gen_ai.tool.call.arguments"])
    assert "4242-secret" not in str(span.attributes["gen_ai.tool.call.arguments"])
    assert span.attributes["gen_ai.tool.call.result"] == "charged"


def test_terminal_and_attempts_are_recorded(exporter: InMemorySpanExporter) -> None:
    """The terminal stop and the blocked call are visible on their spans."""
    guard = _guard()
    for _ in range(3):
        guard.call("charge", {"card": "1", "amount": 0})
    spans = exporter.get_finished_spans()
    terminal = [s.attributes["toolfault.terminal"] for s in spans if s.attributes]
    blocked = [s.attributes["toolfault.blocked"] for s in spans if s.attributes]
    assert terminal == [False, True, True]
    assert blocked == [False, False, True]


def test_jsonl_trace_is_redacted_and_has_incidents(tmp_path: Path) -> None:
    """The JSONL trace has a line per call and per incident, with secrets removed."""
    path = tmp_path / "run.jsonl"
    guard = _guard(trace=path, secrets=["tok_live_123456"])
    for _ in range(3):
        guard.call("charge", {"card": "tok_live_123456", "amount": 0})
    guard.close()
    text = path.read_text()
    assert "tok_live_123456" not in text
    records = [json.loads(line) for line in text.splitlines()]
    kinds = [r["type"] for r in records]
    assert kinds.count("call") == 3
    incidents = [r["kind"] for r in records if r["type"] == "incident"]
    assert incidents == ["retry_cap", "halt"]  # the third identical call ends the turn
    call = records[0]
    assert call["args"] == {"card": "[REDACTED]", "amount": 0}
    for key in ("tool", "fingerprint", "code", "outcome", "terminal", "blocked", "attempts",
                "error_tokens", "turn", "task", "mode"):
        assert key in call
