"""Seeing what the guard did: OpenTelemetry spans, a JSONL trace and call events.

Spans follow the GenAI semantic conventions for tool execution (``execute_tool {name}``,
``gen_ai.tool.name``, ``error.type``) and are only created when an OpenTelemetry tracer
provider is installed, so an untraced process pays nothing.  Arguments and results go on
spans only when the user opts in (``capture_content=True``).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any, Protocol

from opentelemetry import trace

from toolfault._errors import Outcome

TRACER_NAME = "toolfault"


_FIELDS = (
    "tool", "call_id", "task", "turn", "fingerprint", "ok", "code", "outcome", "terminal",
    "blocked", "attempts", "dispatched", "error_tokens", "mode", "args", "side_effect",
    "duration_s", "shadow", "at",
)


class CallEvent:
    """One guarded call, as observers and the JSONL trace see it (already redacted).

    Read-only.  ``fingerprint`` and ``args`` may be given as zero-argument callables: they are
    resolved on first read, so an observer that only counts calls costs almost nothing.
    """

    __slots__ = tuple(f"_{name}" for name in _FIELDS)

    def __init__(
        self, *, tool: str, call_id: str, task: str, turn: int,
        fingerprint: str | Callable[[], str], ok: bool, code: str | None, outcome: Outcome,
        terminal: bool, blocked: bool, attempts: int, dispatched: bool, error_tokens: int,
        mode: str, args: Any = None, side_effect: bool = False, duration_s: float = 0.0,
        shadow: dict[str, Any] | None = None, at: float = 0.0,
    ) -> None:
        # Public names are setter-less properties, so the event is read-only from outside.
        self._tool, self._call_id, self._task, self._turn = tool, call_id, task, turn
        self._fingerprint, self._ok, self._code, self._outcome = fingerprint, ok, code, outcome
        self._terminal, self._blocked, self._attempts = terminal, blocked, attempts
        self._dispatched, self._error_tokens, self._mode = dispatched, error_tokens, mode
        self._args, self._side_effect, self._duration_s = args, side_effect, duration_s
        self._shadow = shadow if shadow is not None else {}
        self._at = at

    @classmethod
    def _success(cls, tool: str, call_id: str, task: str, turn: int, fingerprint: Any,
                 mode: str, args: Any, duration_s: float, at: float) -> CallEvent:
        """A first-attempt success, built without keyword binding (the guard's hot path)."""
        event = cls.__new__(cls)
        event._tool, event._call_id, event._task, event._turn = tool, call_id, task, turn
        event._fingerprint, event._ok, event._code = fingerprint, True, None
        event._outcome, event._terminal, event._blocked = Outcome.NO_EFFECT, False, False
        event._attempts, event._dispatched, event._error_tokens = 1, True, 0
        event._mode, event._args, event._side_effect = mode, args, False
        event._duration_s, event._shadow, event._at = duration_s, {}, at
        return event

    def _lazy(self, name: str) -> Any:
        value = getattr(self, f"_{name}")
        if callable(value):
            value = value()
            setattr(self, f"_{name}", value)
        return value

    tool = property(lambda self: self._tool)
    call_id = property(lambda self: self._call_id)
    task = property(lambda self: self._task)
    turn = property(lambda self: self._turn)
    ok = property(lambda self: self._ok)
    code = property(lambda self: self._code)
    outcome = property(lambda self: self._outcome)
    terminal = property(lambda self: self._terminal)
    blocked = property(lambda self: self._blocked)
    attempts = property(lambda self: self._attempts)
    dispatched = property(lambda self: self._dispatched)
    error_tokens = property(lambda self: self._error_tokens)
    mode = property(lambda self: self._mode)
    side_effect = property(lambda self: self._side_effect)
    duration_s = property(lambda self: self._duration_s)
    shadow = property(lambda self: self._shadow)
    at = property(lambda self: self._at)

    @property
    def fingerprint(self) -> str:
        return str(self._lazy("fingerprint"))

    @property
    def args(self) -> Any:
        return self._lazy("args")

    def __repr__(self) -> str:
        return f"CallEvent(tool={self.tool!r}, ok={self.ok!r}, code={self.code!r})"

    def to_dict(self) -> dict[str, Any]:
        out = {name: getattr(self, name) for name in _FIELDS}
        out["outcome"] = self.outcome.value
        out["shadow"] = dict(self.shadow)
        out["type"] = "call"
        return out


class CallObserver(Protocol):
    """A hook called after every guarded call (keep it fast; exceptions are swallowed)."""

    def __call__(self, event: CallEvent) -> None: ...


class JsonlSink:
    """Appends one JSON line per call and per incident; thread-safe, flushed per line."""

    def __init__(self, target: str | Path | IO[str], *,
                 redact: Callable[[str], str] | None = None) -> None:
        #: The single exit of the trace channel: every line passes through ``redact``.
        self._redact = redact
        self._lock = threading.Lock()
        if isinstance(target, (str, Path)):
            self._file: IO[str] = open(target, "a", encoding="utf-8")  # noqa: SIM115
            self._owned = True
        else:
            self._file = target
            self._owned = False

    def write(self, record: dict[str, Any]) -> None:
        line = json.dumps(record, ensure_ascii=False, default=str)
        if self._redact is not None:
            line = self._redact(line)
        with self._lock:
            self._file.write(line + "\n")
            self._file.flush()

    def __call__(self, event: CallEvent) -> None:
        self.write(event.to_dict())

    def close(self) -> None:
        if self._owned:
            self._file.close()


def tracing_active() -> bool:
    """True once the application installed a real tracer provider (cheap: a global read)."""
    provider = getattr(trace, "_TRACER_PROVIDER", _MISSING)
    if provider is None:
        return False
    if provider is _MISSING:  # a future opentelemetry-api without the global
        return not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)
    return True


_MISSING = object()


def start_tool_span(tool: str, call_id: str, *, content: str | None = None) -> trace.Span:
    """Start an ``execute_tool`` span per the GenAI semantic conventions."""
    tracer = _tracer()
    attributes: dict[str, Any] = {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": tool,
        "gen_ai.tool.call.id": call_id,
        "gen_ai.tool.type": "function",
    }
    if content is not None:
        attributes["gen_ai.tool.call.arguments"] = content
    return tracer.start_span(f"execute_tool {tool}", kind=trace.SpanKind.INTERNAL,
                             attributes=attributes)


def finish_tool_span(span: trace.Span, event: CallEvent, *, result: str | None = None,
                     budget: dict[str, float] | None = None) -> None:
    """Record toolfault's attributes and the error type (one ``set_attributes``), then end."""
    attributes: dict[str, Any] = {
        "toolfault.fingerprint": event.fingerprint,
        "toolfault.attempts": event.attempts,
        "toolfault.outcome": event.outcome.value,
        "toolfault.terminal": event.terminal,
        "toolfault.blocked": event.blocked,
        "toolfault.mode": event.mode,
    }
    for key, value in (budget or {}).items():
        attributes[f"toolfault.budget.{key}"] = value
    if result is not None:
        attributes["gen_ai.tool.call.result"] = result
    if not event.ok:
        attributes["error.type"] = attributes["toolfault.code"] = event.code or "tool_error"
        span.set_status(trace.Status(trace.StatusCode.ERROR, event.code or "tool_error"))
    span.set_attributes(attributes)
    span.end()


_tracer_for: tuple[object, trace.Tracer] | None = None


def _tracer() -> trace.Tracer:
    """toolfault's tracer, fetched once per installed provider (not once per call)."""
    global _tracer_for
    provider = trace.get_tracer_provider()
    cached = _tracer_for
    if cached is not None and cached[0] is provider:
        return cached[1]
    tracer = trace.get_tracer(TRACER_NAME)
    _tracer_for = (provider, tracer)
    return tracer


def safe_notify(observers: list[Callable[[CallEvent], None]], event: CallEvent) -> None:
    """Call every observer; an observer's bug must not break the agent loop."""
    for observer in observers:
        try:
            observer(event)
        except Exception:
            continue
