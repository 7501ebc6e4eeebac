"""Seeing what the guard did: OpenTelemetry spans, a JSONL trace and call events.

Spans follow the GenAI semantic conventions for tool execution (``execute_tool {name}``,
``gen_ai.tool.name``, ``error.type``) and are only created when an OpenTelemetry tracer
provider is installed, so an untraced process pays nothing: not even the import, since an
application that installed a provider has imported ``opentelemetry.trace`` itself.  Arguments
and results go on spans only when the user opts in (``capture_content=True``).
"""

from __future__ import annotations

import atexit
import json
import os
import sys
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import IO, TYPE_CHECKING, Any, Protocol

from toolfault._errors import Outcome
from toolfault._jsontext import prebuilt_encoder

if TYPE_CHECKING:
    from opentelemetry import trace

TRACER_NAME = "toolfault"
#: The guard's default mode: a span says ``toolfault.mode`` only when it is another.
DEFAULT_MODE = "enforce"
_OTEL = "opentelemetry.trace"


_FIELDS = (
    "tool", "call_id", "task", "turn", "fingerprint", "ok", "code", "outcome", "terminal",
    "blocked", "attempts", "dispatched", "error_tokens", "mode", "args", "side_effect",
    "duration_s", "shadow", "at",
)


class CallEvent:
    """One guarded call, as observers and the JSONL trace see it (already redacted).

    The guard redacts the caller's and the model's text (tool, call id, task, code, args,
    shadow) when it builds one; the other fields are its own (a fingerprint, counts, clocks,
    an id it made itself).  Read-only.  ``fingerprint`` and ``args`` may be given as
    zero-argument callables: they are resolved on first read, so an observer that only
    counts calls costs almost nothing.
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
        """The event as a JSON-ready record (the JSONL trace's ``call`` line), fields in order."""
        shadow = self._shadow
        return {
            "tool": self._tool, "call_id": self._call_id, "task": self._task,
            "turn": self._turn, "fingerprint": self.fingerprint, "ok": self._ok,
            "code": self._code, "outcome": self._outcome.value, "terminal": self._terminal,
            "blocked": self._blocked, "attempts": self._attempts,
            "dispatched": self._dispatched, "error_tokens": self._error_tokens,
            "mode": self._mode, "args": self.args, "side_effect": self._side_effect,
            "duration_s": self._duration_s, "shadow": dict(shadow) if shadow else {},
            "at": self._at, "type": "call",
        }


    def to_jsonl(self) -> str:
        """The trace's ``call`` line: :meth:`to_dict` as one JSON line (the only renderer)."""
        return _dumps(self.to_dict())


class _Done(Protocol):
    """What a span reads of a finished call (a :class:`~toolfault.ToolResult` is one)."""

    @property
    def ok(self) -> bool: ...
    @property
    def code(self) -> str | None: ...
    @property
    def outcome(self) -> Outcome: ...
    @property
    def terminal(self) -> bool: ...
    @property
    def blocked(self) -> bool: ...
    @property
    def attempts(self) -> int: ...


class CallObserver(Protocol):
    """A hook called after every guarded call (keep it fast; exceptions are swallowed)."""

    def __call__(self, event: CallEvent) -> None: ...


#: ``json.dumps(record, ensure_ascii=False, default=str)`` without an encoder per line.
_encode_line = prebuilt_encoder(sort_keys=False, separators=(", ", ": "), allow_nan=True,
                                default=str)


def _dumps(record: Any) -> str:
    try:
        return _encode_line(record)
    except RecursionError:  # a cycle (the prebuilt encoder keeps no markers): json says so
        return json.dumps(record, ensure_ascii=False, default=str)


#: Bytes a trace file buffers between flushes (a line is about 600).
_FILE_BUFFER = 1 << 18
#: Call lines kept in memory before they are written as one piece (about 300 KB).
_PENDING_LINES = 512


#: A call line's text fields, which a sink's own ``redact`` passes over one by one.
_TEXT_FIELDS = ("tool", "call_id", "task", "code", "mode")


class JsonlSink:
    """Appends one JSON line per call and per incident; thread-safe.

    Durability is traded for speed on purpose: a call's line is kept in memory (a stream
    given by the user gets it at once) and reaches the file within ``flush_interval``
    seconds (a timer writes and flushes it, whether or not more calls come), when
    ``_PENDING_LINES`` are waiting, at :meth:`flush` and :meth:`close`, before a fork and at
    interpreter exit.  An incident line is flushed at once, with everything before it, in
    order.  So a crash that skips ``atexit`` (``kill -9``, power loss) loses at most the call
    lines of the last interval.
    ``flush_interval=0`` flushes every line, as a log you tail may want.

    ``redact`` passes over every line: a call line's text fields one by one (before JSON
    escapes them), then each line whole.  ``redacted_calls=True`` says call lines come from
    events the guard redacted already, field by field (a guard's own ``trace=`` sink): they
    are written as they are, and ``redact`` passes over the other lines (incidents, records
    given to :meth:`write`).
    """

    def __init__(self, target: str | Path | IO[str], *,
                 redact: Callable[[str], str] | None = None,
                 flush_interval: float = 1.0, redacted_calls: bool = False) -> None:
        self._redact = redact
        #: Call lines need no pass of ``redact`` (see the class docstring).
        self._redacted_calls = redacted_calls
        self._lock = threading.Lock()
        self._interval = flush_interval
        self._timer: threading.Timer | None = None
        self._closed = False
        #: Call lines not yet written: appending one costs a fraction of a file write, and
        #: the file gets them joined, in one write per batch.
        self._pending: list[str] = []
        if isinstance(target, (str, Path)):
            # A buffer about the size of a batch: each write to the file costs a system
            # call, so fewer and larger ones (8 KiB by default).
            self._file: IO[str] = open(target, "a", encoding="utf-8",  # noqa: SIM115
                                       buffering=_FILE_BUFFER)
            self._owned = True
        else:
            self._file = target
            self._owned = False
        #: Lines kept before a write: a stream of the user's (stderr, a socket, a pipe) gets
        #: each line at once, as before; only its flush waits for the timer.
        self._batch = _PENDING_LINES if self._owned and flush_interval > 0 else 1
        _flush_at_exit(self)

    def write(self, record: dict[str, Any]) -> None:
        """Append ``record`` as one line, redacted whole; anything but a call line is
        flushed at once."""
        line = _dumps(record)
        if self._redact is not None:
            line = self._redact(line)
        self._line(line, now=record.get("type") != "call")

    def __call__(self, event: CallEvent) -> None:
        """Append the event's call line.  A guard's own sink writes it as it is: the guard
        redacted its fields one by one, before JSON escaped them, and redacting the whole
        line again found no secret they kept (it only ever changed a line by eating a
        field's closing quote, ``token="``, which broke the JSON: tests/test_emission.py
        compares the lines)."""
        redact = self._redact
        if redact is None or self._redacted_calls:
            self._line(event.to_jsonl(), now=False)
            return
        record = event.to_dict()
        for key in _TEXT_FIELDS:
            value = record[key]
            if isinstance(value, str):
                record[key] = redact(value)
        self._line(redact(_dumps(record)), now=False)

    def _line(self, line: str, *, now: bool) -> None:
        """Keep a line; a call line waits for its batch, others flush."""
        with self._lock:
            if self._closed:
                return
            pending = self._pending
            pending.append(line)
            if now or len(pending) >= self._batch:
                self._write_pending(flush=now or self._interval <= 0)
            elif self._timer is None and self._interval > 0:
                self._start_timer()

    def _start_timer(self) -> None:
        timer = threading.Timer(self._interval, self._flush_later)
        timer.daemon = True
        self._timer = timer
        timer.start()

    def _write_pending(self, *, flush: bool) -> None:
        """Write the waiting lines, in order, as one piece (call with the lock held)."""
        pending = self._pending
        if pending:
            self._pending = []
            self._file.write("\n".join(pending) + "\n")
        if flush:
            self._file.flush()

    def _flush_later(self) -> None:
        try:
            with self._lock:
                self._timer = None
                if not self._closed:
                    self._write_pending(flush=True)
        except (OSError, ValueError):  # the user closed their stream: nothing to keep
            pass

    def flush(self) -> None:
        """Write every waiting line to the file now."""
        with self._lock:
            if not self._closed:
                self._write_pending(flush=True)

    def close(self) -> None:
        """Flush, stop the timer and close the file (a stream given by the user stays open)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            timer, self._timer = self._timer, None
            try:
                self._write_pending(flush=True)
            except (OSError, ValueError):
                pass
            if self._owned:
                self._file.close()
        if timer is not None:
            timer.cancel()


#: Sinks still open, flushed at interpreter exit (weakly held: a dropped sink is not kept).
_OPEN_SINKS: weakref.WeakSet[JsonlSink] = weakref.WeakSet()


def _flush_at_exit(sink: JsonlSink) -> None:
    _OPEN_SINKS.add(sink)


#: The sinks locked and flushed for a fork in progress (released on both sides after it).
_FORKING: list[JsonlSink] = []


def _sinks_before_fork() -> None:
    """Before a fork: each open sink locked (no thread is inside its file while the child is
    copied) and flushed (the child inherits an empty buffer: no line is written twice)."""
    for sink in list(_OPEN_SINKS):
        sink._lock.acquire()
        _FORKING.append(sink)
        try:
            if not sink._closed:
                sink._write_pending(flush=True)
        except (OSError, ValueError):  # the user closed their stream: nothing to keep
            pass


def _sinks_after_fork_in_parent() -> None:
    while _FORKING:
        _FORKING.pop()._lock.release()


def _sinks_after_fork_in_child() -> None:
    """In a forked child: the parent's flush timer does not exist here; each sink gets a
    fresh lock (the copied one is held by the fork itself) and no line of the parent's (it
    wrote them before the fork)."""
    _FORKING.clear()
    for sink in list(_OPEN_SINKS):
        sink._lock = threading.Lock()
        sink._timer = None
        sink._pending = []


os.register_at_fork(before=_sinks_before_fork, after_in_parent=_sinks_after_fork_in_parent,
                    after_in_child=_sinks_after_fork_in_child)


@atexit.register
def _flush_open_sinks() -> None:
    for sink in list(_OPEN_SINKS):
        try:
            sink.flush()
        except Exception:  # noqa: BLE001 - exiting: keep flushing the others
            continue


def tracing_active() -> bool:
    """True once the application installed a real tracer provider.

    Without ``opentelemetry.trace`` imported no provider can have been installed, so toolfault
    never imports it itself just to find out.
    """
    otel = sys.modules.get(_OTEL)
    if otel is None:
        return False
    return not isinstance(otel.get_tracer_provider(), otel.ProxyTracerProvider)


@dataclass(frozen=True, slots=True)
class PendingSpan:
    """What :func:`start_tool_span` knew; the span is recorded whole by :func:`finish_tool_span`."""

    tool: str
    call_id: str
    content: str | None


def start_tool_span(tool: str, call_id: str, *, content: str | None = None) -> PendingSpan:
    """Begin an ``execute_tool`` span: nothing is sent to the SDK until it is finished."""
    return PendingSpan(tool, call_id, content)


def finish_tool_span(span: PendingSpan, event: CallEvent, *, result: str | None = None,
                     budget: dict[str, float] | None = None) -> None:
    """Record the span begun by :func:`start_tool_span` (see :func:`record_tool_span`)."""
    record_tool_span(event, content=span.content, result=result, budget=budget)


def record_tool_span(event: CallEvent, *, content: str | None = None,
                     result: str | None = None, budget: dict[str, float] | None = None
                     ) -> None:
    """One ``execute_tool`` span per the GenAI semantic conventions, for a finished call
    (see :func:`record_span`)."""
    record_span(event._tool, event._call_id, event.fingerprint, event._attempts,
                event._mode, event, event._at, event._duration_s, content=content,
                result=result, budget=budget)


def record_span(tool: str, call_id: str, fingerprint: str, attempts: int, mode: str,
                done: _Done, at: float, duration_s: float, *, content: str | None = None,
                result: str | None = None, budget: dict[str, float] | None = None) -> None:
    """One ``execute_tool`` span per the GenAI semantic conventions, for a finished call.

    Every attribute is known by now, so the SDK is handed them once, at the start, and the
    span is back-dated to cover the call (``at - duration_s`` to ``at``).  The SDK checks
    each attribute (about a microsecond apiece), so a span carries only what says something
    about its call: ``toolfault.outcome``, ``.terminal`` and ``.blocked`` describe failures
    and are set on failed calls only (absent means ``false``), ``toolfault.attempts`` only
    when it is not 1 (absent means one attempt), and ``toolfault.mode`` is set
    only when it is not the default (absent means ``enforce``).  No event is needed: a guard
    with no observers builds none.
    """
    otel = sys.modules.get(_OTEL)
    if otel is None:
        return
    attributes = _span_attributes(tool, call_id, fingerprint, attempts, mode, content=content,
                                  result=result, budget=budget)
    code = None if done.ok else _failure_attributes(attributes, done)
    end = int(at * 1e9) if at else None
    start = end - int(duration_s * 1e9) if end is not None else None
    span = _tracer(otel).start_span(f"execute_tool {tool}", attributes=attributes,
                                    start_time=start)
    if code is not None:
        span.set_status(otel.Status(otel.StatusCode.ERROR, code))
    span.end(end_time=end)


def _span_attributes(tool: str, call_id: str, fingerprint: str, attempts: int, mode: str, *,
                     content: str | None, result: str | None,
                     budget: dict[str, float] | None) -> dict[str, Any]:
    """A span's attributes that every call has, and those that say something only when
    they differ from what their absence means."""
    attributes: dict[str, Any] = {
        "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": tool,
        "gen_ai.tool.call.id": call_id, "gen_ai.tool.type": "function",
        "toolfault.fingerprint": fingerprint,
    }
    if attempts != 1:  # retried (or refused before any attempt): absent means one attempt
        attributes["toolfault.attempts"] = attempts
    if mode != DEFAULT_MODE:
        attributes["toolfault.mode"] = mode
    if budget:
        for key, value in budget.items():
            attributes[f"toolfault.budget.{key}"] = value
    if content is not None:
        attributes["gen_ai.tool.call.arguments"] = content
    if result is not None:
        attributes["gen_ai.tool.call.result"] = result
    return attributes


def _failure_attributes(attributes: dict[str, Any], done: _Done) -> str:
    """Add what describes a failed call to its span's attributes; its error code."""
    code = done.code or "tool_error"
    attributes["error.type"] = attributes["toolfault.code"] = code
    attributes["toolfault.outcome"] = done.outcome.value
    attributes["toolfault.terminal"] = done.terminal
    attributes["toolfault.blocked"] = done.blocked
    return code


_tracer_for: tuple[object, trace.Tracer] | None = None


def _tracer(otel: ModuleType) -> trace.Tracer:
    """toolfault's tracer, fetched once per installed provider (not once per call)."""
    global _tracer_for
    provider = otel.get_tracer_provider()
    cached = _tracer_for
    if cached is not None and cached[0] is provider:
        return cached[1]
    tracer: trace.Tracer = otel.get_tracer(TRACER_NAME)
    _tracer_for = (provider, tracer)
    return tracer


def safe_notify(observers: list[Callable[[CallEvent], None]], event: CallEvent) -> None:
    """Call every observer; an observer's bug must not break the agent loop."""
    for observer in observers:
        try:
            observer(event)
        except Exception:
            continue
