"""Traces: GenAI execute_tool spans and a redacted JSONL trace."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
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


def test_a_call_id_is_redacted_in_spans_as_in_the_jsonl_trace(
        exporter: InMemorySpanExporter) -> None:
    """gen_ai.tool.call.id carries the call id through the same redaction as the trace."""
    guard = _guard(secrets=["4242-secret"])
    guard.call("charge", {"card": "4242", "amount": 5}, call_id="id-4242-secret")
    guard.call("charge", {"card": "4242", "amount": 5}, call_id="sk-proj-Mn4bVc7xZl2kJh9gFd5s")
    first, second = exporter.get_finished_spans()
    assert first.attributes is not None and second.attributes is not None
    assert first.attributes["gen_ai.tool.call.id"] == "id-[REDACTED]"
    assert second.attributes["gen_ai.tool.call.id"] == "[REDACTED]"


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
    for _ in range(4):
        guard.call("charge", {"card": "tok_live_123456", "amount": 0})
    guard.close()
    text = path.read_text()
    assert "tok_live_123456" not in text
    records = [json.loads(line) for line in text.splitlines()]
    kinds = [r["type"] for r in records]
    assert kinds.count("call") == 4
    incidents = [r["kind"] for r in records if r["type"] == "incident"]
    assert incidents == ["retry_cap", "halt"]  # blocked once, the second refusal ends the turn
    call = records[0]
    assert call["args"] == {"card": "[REDACTED]", "amount": 0}
    for key in ("tool", "fingerprint", "code", "outcome", "terminal", "blocked", "attempts",
                "error_tokens", "turn", "task", "mode"):
        assert key in call


def test_a_span_covers_the_call_and_a_success_carries_no_failure_fields(
        exporter: InMemorySpanExporter) -> None:
    """The span is back-dated to the call's start; terminal/blocked/outcome are failure-only."""
    import time

    guard = Guard(scan_env_secrets=False)

    @guard.tool
    def slow(n: int) -> int:
        time.sleep(0.02)
        return n

    guard.call("slow", {"n": 1})
    (span,) = exporter.get_finished_spans()
    assert span.start_time is not None and span.end_time is not None
    assert span.end_time - span.start_time >= 15_000_000  # ns: the 20 ms the tool slept
    assert span.attributes is not None
    assert "toolfault.attempts" not in span.attributes  # absent: one attempt
    assert len(str(span.attributes["toolfault.fingerprint"])) == 64
    for failure_only in ("toolfault.terminal", "toolfault.blocked", "toolfault.outcome",
                         "error.type"):
        assert failure_only not in span.attributes


def _event(**overrides: object) -> object:
    from toolfault._errors import Outcome
    from toolfault._trace import CallEvent

    fields: dict[str, object] = {
        "tool": "t", "call_id": "c", "task": "default", "turn": 1, "fingerprint": "f" * 64,
        "ok": True, "code": None, "outcome": Outcome.NO_EFFECT, "terminal": False,
        "blocked": False, "attempts": 1, "dispatched": True, "error_tokens": 0,
        "mode": "enforce", "args": {"q": "x"}}
    fields.update(overrides)
    return CallEvent(**fields)  # type: ignore[arg-type]


def test_call_lines_keep_their_field_order_and_values() -> None:
    """A call line has every field, in the documented order, with 'type' last."""
    from toolfault._trace import _FIELDS, CallEvent

    event = _event(shadow={"would_say": "x"})
    assert isinstance(event, CallEvent)
    record = event.to_dict()
    assert list(record) == [*_FIELDS, "type"]
    assert record["outcome"] == "none" and record["type"] == "call"
    assert record["args"] == {"q": "x"} and record["shadow"] == {"would_say": "x"}


def test_call_lines_are_buffered_and_flushed_within_the_interval(tmp_path: Path) -> None:
    """A call line reaches the file within flush_interval, even if no further call comes."""
    import time

    from toolfault._trace import JsonlSink

    path = tmp_path / "t.jsonl"
    sink = JsonlSink(path, flush_interval=0.05)
    sink(_event())  # type: ignore[arg-type]
    assert path.read_text() == ""  # buffered, not yet written
    deadline = time.monotonic() + 5
    while not path.read_text() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert json.loads(path.read_text())["tool"] == "t"
    sink.close()


def test_incidents_flush_at_once_and_close_flushes_the_rest(tmp_path: Path) -> None:
    """An incident line flushes with what came before it; close() writes the remainder."""
    from toolfault._trace import JsonlSink

    path = tmp_path / "t.jsonl"
    sink = JsonlSink(path, flush_interval=60)
    sink(_event(tool="a"))  # type: ignore[arg-type]
    sink.write({"type": "incident", "kind": "retry_cap"})
    assert [json.loads(x)["type"] for x in path.read_text().splitlines()] == ["call", "incident"]
    sink(_event(tool="b"))  # type: ignore[arg-type]
    sink.close()
    sink(_event(tool="after close"))  # type: ignore[arg-type]
    assert [json.loads(x).get("tool") for x in path.read_text().splitlines()] == \
        ["a", None, "b"]


def test_call_lines_reach_the_file_in_order_across_batches(tmp_path: Path) -> None:
    """Lines kept in memory are written in batches: none lost, none reordered, an incident
    after every call line before it."""
    from toolfault._trace import _PENDING_LINES, JsonlSink

    path = tmp_path / "t.jsonl"
    sink = JsonlSink(path, flush_interval=60)
    count = 2 * _PENDING_LINES + 7
    for n in range(count):
        sink(_event(tool=f"t{n}"))  # type: ignore[arg-type]
        if n == _PENDING_LINES + 3:
            sink.write({"type": "incident", "kind": "retry_cap"})
    sink.close()
    tools = [json.loads(x).get("tool", "incident") for x in path.read_text().splitlines()]
    calls = [f"t{n}" for n in range(count)]
    assert tools == [*calls[:_PENDING_LINES + 4], "incident", *calls[_PENDING_LINES + 4:]]


def test_a_forked_child_never_writes_the_parents_waiting_lines_again(
        tmp_path: Path, in_forked_child: Callable[..., bytes]) -> None:
    """Lines waiting in the parent are written before the fork: the child, closing its copy
    of the sink, writes only its own."""
    from toolfault._trace import JsonlSink

    path = tmp_path / "trace.jsonl"
    sink = JsonlSink(path, flush_interval=60)
    for n in range(3):
        sink(_event(tool=f"parent{n}"))  # type: ignore[arg-type]

    def child() -> bool:
        sink(_event(tool="child"))  # type: ignore[arg-type]
        sink.close()
        return True

    assert in_forked_child(child) == b"1"
    sink(_event(tool="parent3"))  # type: ignore[arg-type]
    sink.close()
    tools = [json.loads(x)["tool"] for x in path.read_text().splitlines()]
    assert sorted(tools) == ["child", "parent0", "parent1", "parent2", "parent3"]


def test_every_line_is_flushed_with_a_zero_interval(tmp_path: Path) -> None:
    """flush_interval=0 writes each line through, as a log being tailed wants."""
    from toolfault._trace import JsonlSink

    path = tmp_path / "t.jsonl"
    sink = JsonlSink(path, flush_interval=0)
    sink(_event())  # type: ignore[arg-type]
    assert path.read_text().count("\n") == 1
    sink.close()


def test_buffered_lines_are_flushed_at_interpreter_exit(tmp_path: Path) -> None:
    """A process that never closes its guard still leaves every line in the trace."""
    import subprocess
    import sys

    path = tmp_path / "t.jsonl"
    code = (
        "import toolfault\n"
        f"g = toolfault.Guard(scan_env_secrets=False, trace={str(path)!r})\n"
        "g.tool(lambda n: n, name='f')\n"
        "for i in range(3):\n"
        "    g.new_turn(); g.call('f', {'n': i})\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
    assert len(path.read_text().splitlines()) == 3


def test_a_cyclic_record_is_still_written_as_json_errors_do(tmp_path: Path) -> None:
    """A record the fast encoder cannot take falls back to json's own behaviour."""
    from toolfault._trace import JsonlSink

    sink = JsonlSink(tmp_path / "t.jsonl")
    loop: dict[str, object] = {}
    loop["self"] = loop
    with pytest.raises(ValueError, match="Circular"):
        sink.write({"type": "incident", "detail": loop})
    sink.write({"type": "incident", "detail": {"n": object()}})  # default=str
    sink.close()
    assert "object object" in (tmp_path / "t.jsonl").read_text()


_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner,
                                                                  max_size=3),
    max_leaves=8,
)


@settings(max_examples=200, deadline=None)
@given(tool=st.text(), code=st.none() | st.text(), args=_values, turn=st.integers(),
       duration=st.floats(), shadow=st.dictionaries(st.text(max_size=5), _values, max_size=2),
       ok=st.booleans())
def test_the_written_line_is_exactly_json_dumps_of_the_record(
        tool: str, code: str | None, args: object, turn: int, duration: float,
        shadow: dict[str, object], ok: bool) -> None:
    """to_jsonl() writes what json.dumps(to_dict(), ensure_ascii=False, default=str) would."""
    from toolfault._trace import CallEvent

    event = _event(tool=tool, code=code, args=args, turn=turn, duration_s=duration,
                   shadow=shadow, ok=ok, at=duration)
    assert isinstance(event, CallEvent)
    expected = json.dumps(event.to_dict(), ensure_ascii=False, default=str)
    assert event.to_jsonl() == expected


def test_odd_values_in_a_line_are_written_as_json_would() -> None:
    """Objects JSON has no form for become their str, as json.dumps(default=str) does."""
    from toolfault._trace import CallEvent

    event = _event(args={"when": object, "n": float("nan")}, turn=True, code=b"x")
    assert isinstance(event, CallEvent)
    assert event.to_jsonl() == json.dumps(event.to_dict(), ensure_ascii=False, default=str)


_SECRET = "s3cr3t-Value-9000"
_hiding = st.sampled_from(["", _SECRET, _SECRET.upper(), "sk-proj-abcdefghijklmnopqrstuv",
                           "token=abc123", 'q"uote', "Bearer\tabcdefgh", "\n"])


@settings(max_examples=150, deadline=None)
@given(tool=st.lists(_hiding | st.text(max_size=4), max_size=3).map(" ".join),
       call_id=_hiding, code=st.none() | _hiding, note=st.lists(_hiding, max_size=3),
       pin=st.sampled_from([9000, 1234, 3.5]))
def test_a_guards_call_line_is_redacted_field_by_field_and_stays_json(
        tool: str, call_id: str, code: str | None, note: list[str], pin: float) -> None:
    """The guard redacts a call line's fields one by one when it builds the event: no
    secret in any form and no credential shape survives, and the line is still valid JSON
    with redacted fields."""
    import io
    import time

    from toolfault._call import _Call
    from toolfault._result import FailureInfo, new_result

    out = io.StringIO()
    guard = Guard(trace=out, secrets=[_SECRET, "9000"], scan_env_secrets=False)
    redactor = guard.redactor
    args = {"note": " ".join(note), _SECRET: note, "pin": pin, "nested": {"password": "pw"}}
    call = _Call(None, tool, args, call_id or "c", time.monotonic())
    failure = None if code is None else FailureInfo(code=code)
    guard._emitter.emit(call, new_result(tool, code is None, "done", None, 1, call_id or "c",
                                         failure, "f" * 64))
    guard.close()
    line = out.getvalue()
    record = json.loads(line)
    for needle in (_SECRET, _SECRET.lower(), "abcdefghijklmnopqrstuv", "abc123", "9000"):
        assert needle not in line.lower()
    assert record["tool"] == redactor.secrets(tool)
    assert record["call_id"] == redactor.secrets(call_id or "c")
    assert record["code"] == (None if code is None else redactor.secrets(code))
    assert record["args"] == json.loads(json.dumps(redactor.value(args)))
    assert record["args"]["nested"] == {"password": "[REDACTED]"}


def test_a_sinks_redact_passes_over_every_line_unless_the_guard_redacted_its_calls() -> None:
    """A sink a user builds with ``redact`` runs it over every line, call lines included;
    a guard's own sink (``redacted_calls=True``) writes the call event it redacted as it is,
    and runs ``redact`` over the other records (an incident) as one line."""
    import io

    from toolfault._trace import JsonlSink

    lines = []
    for redacted_calls in (False, True):
        out = io.StringIO()
        sink = JsonlSink(out, redact=lambda line: line.replace("x", "?"),
                         redacted_calls=redacted_calls)
        sink(_event())  # type: ignore[arg-type]
        sink.write({"type": "incident", "detail": "x"})
        lines.append(list(map(json.loads, out.getvalue().splitlines())))
    (users_call, users_incident), (guards_call, guards_incident) = lines
    assert users_call["args"] == {"q": "?"} and users_incident["detail"] == "?"
    assert guards_call["args"] == {"q": "x"} and guards_incident["detail"] == "?"


def test_the_trace_alone_writes_the_line_an_observed_guard_writes() -> None:
    """With no other observer the guard writes its call line straight from the call; with
    one it goes through a CallEvent: the lines are the same (clocks and ids aside)."""
    import io

    lines = []
    for observers in ([], [lambda event: None]):
        out = io.StringIO()
        guard = _guard(trace=out, observers=observers, secrets=["tok_live_123456"])
        guard.call("charge", {"card": "tok_live_123456", "amount": 5}, call_id="c1")
        guard.call("charge", {"card": "4242", "amount": -1, "password": 7}, call_id="c2")
        guard.close()
        records = [json.loads(line) for line in out.getvalue().splitlines()]
        for record in records:
            assert record.pop("duration_s") >= 0 and record.pop("at") > 0
            record.pop("task")
        lines.append(records)
    assert lines[0] == lines[1]
    assert lines[0][0]["args"] == {"card": "[REDACTED]", "amount": 5}
    assert lines[0][1]["args"]["password"] == "[REDACTED]" and not lines[0][1]["ok"]


def test_a_span_names_the_mode_only_when_it_is_not_the_default(
        exporter: InMemorySpanExporter) -> None:
    """``toolfault.mode`` is absent under the default (enforce) and set under any other."""
    for mode in ("enforce", "observe", "shape"):
        guard = Guard(mode=mode, scan_env_secrets=False)  # type: ignore[arg-type]

        @guard.tool
        def echo(n: int) -> int:
            return n

        guard.call("echo", {"n": 1})
    enforced, observed, shaped = exporter.get_finished_spans()
    assert enforced.attributes is not None and "toolfault.mode" not in enforced.attributes
    assert observed.attributes is not None and observed.attributes["toolfault.mode"] == "observe"
    assert shaped.attributes is not None and shaped.attributes["toolfault.mode"] == "shape"


def test_a_fork_waits_for_a_sink_another_thread_holds(
        tmp_path: Path, in_forked_child: Callable[..., bytes]) -> None:
    """A thread of the parent (its flush timer, another call) held the sink's lock: the fork
    waits until it is free (no thread is inside the file while the child is copied), and the
    child, with a fresh lock, writes its own lines."""
    from toolfault._trace import JsonlSink

    path = tmp_path / "trace.jsonl"
    sink = JsonlSink(path, flush_interval=0)

    def child() -> bool:
        sink.write({"type": "incident", "from": "child"})
        return True

    assert in_forked_child(child, holding=[sink._lock], release_after=0.2) == b"1"
    sink.close()
    assert '"from": "child"' in path.read_text()


def _own_head() -> str:
    """The head of the call ids this process makes (read late: a fork changes it)."""
    from toolfault import _call

    return _call._id_head


@settings(max_examples=300, deadline=None)
@given(tool=st.text(max_size=8), task=st.text(max_size=8),
       call_id=st.text(max_size=8) | st.integers(0, 10**12).map(lambda n: f"{_own_head()}{n}"),
       turn=st.integers() | st.booleans(), attempts=st.integers(1, 3),
       dispatched=st.booleans(), error_tokens=st.integers(0, 2), side_effect=st.booleans(),
       shadow=st.none() | st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
       args=_values, duration=st.integers(0, 10**9), at=st.integers(0, 2 * 10**15))
def test_a_success_line_is_json_dumps_of_the_record(
        tool: str, call_id: str, task: str, turn: int, attempts: int, dispatched: bool,
        error_tokens: int, side_effect: bool, shadow: dict[str, int] | None, args: object,
        duration: int, at: int) -> None:
    """A call line is exactly json.dumps of its record (ids, numbers and clocks as given):
    one renderer, whatever the fields."""
    from toolfault._errors import Outcome
    from toolfault._trace import CallEvent

    event = CallEvent(tool=tool, call_id=call_id, task=task, turn=turn, fingerprint="ab" * 32,
                      ok=True, code=None, outcome=Outcome.NO_EFFECT, terminal=False,
                      blocked=False, attempts=attempts, dispatched=dispatched,
                      error_tokens=error_tokens, mode="enforce", args=args,
                      side_effect=side_effect, duration_s=duration / 1e6, shadow=shadow,
                      at=at / 1e6)
    assert event.to_jsonl() == json.dumps(event.to_dict(), ensure_ascii=False, default=str)
    # Compared as text: NaN is a float the line keeps, and NaN != NaN.
    assert json.dumps(json.loads(event.to_jsonl())["args"]) == \
        json.dumps(json.loads(json.dumps(args, default=str)))


def test_a_retried_call_says_how_many_attempts_it_took(exporter: InMemorySpanExporter) -> None:
    from toolfault import Backoff, Limits

    guard = Guard(scan_env_secrets=False,
                  limits=Limits(backoff=Backoff(attempts=3, initial=0.0, maximum=0.0,
                                                jitter=0.0)))
    tries = {"n": 0}

    @guard.tool
    def flaky(n: int) -> int:
        tries["n"] += 1
        if tries["n"] < 3:
            raise ConnectionError("reset")
        return n

    assert guard.call("flaky", {"n": 1}).ok
    (span,) = exporter.get_finished_spans()
    assert span.attributes is not None and span.attributes["toolfault.attempts"] == 3


def test_a_forked_child_never_writes_the_parents_lines_again(tmp_path: Path) -> None:
    """Lines buffered in the parent at a fork are flushed before it: the child's buffer
    starts empty, so its own flush writes only its own line."""
    import os

    from toolfault._trace import JsonlSink

    path = tmp_path / "trace.jsonl"
    sink = JsonlSink(path, flush_interval=60)
    for i in range(3):
        sink.write({"type": "call", "n": i})  # buffered: no flush for a minute
    pid = os.fork()
    if pid == 0:  # the child
        try:
            sink.write({"type": "call", "n": "child"})
            sink.flush()
        finally:
            os._exit(0)
    os.waitpid(pid, 0)
    sink.close()
    written = [json.loads(line)["n"] for line in path.read_text().splitlines()]
    assert sorted(map(str, written)) == ["0", "1", "2", "child"]


def test_a_callers_call_id_is_redacted_and_the_guards_own_is_written_as_it_is(
        tmp_path: Path) -> None:
    """A caller's id is their text and is always redacted, also one that starts as the
    guard's own ids do.  An id the guard made is its random head and a counter, nothing of
    the caller's: it is written as it is, even where a registered value happens to match
    those digits (they are not the caller's secret)."""
    from toolfault import _call

    path = tmp_path / "trace.jsonl"
    guard = Guard(scan_env_secrets=False, trace=path)

    @guard.tool
    def ping(n: int) -> int:
        return n

    first = guard.call("ping", {"n": 1})
    guard.add_secret("model-9f8e7d6c")
    given = guard.call("ping", {"n": 2}, call_id="call_model-9f8e7d6c")
    alike = guard.call("ping", {"n": 3}, call_id=f"{_call._id_head}model-9f8e7d6c")
    head = _call._id_head[len("call_"):-1]  # the hex digits every id of this process holds
    guard.add_secret(head)
    last = guard.call("ping", {"n": 4})
    guard.close()
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [line["args"]["n"] for line in lines] == [1, 2, 3, 4]
    assert lines[0]["call_id"] == first.call_id
    assert given.call_id == "call_model-9f8e7d6c"
    assert lines[1]["call_id"] == "call_[REDACTED]"
    assert "model-9f8e7d6c" in alike.call_id and "model-9f8e7d6c" not in lines[2]["call_id"]
    assert lines[3]["call_id"] == last.call_id
