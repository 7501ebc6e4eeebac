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
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import IO, TYPE_CHECKING, Any, Protocol

from toolfault._call import is_own_call_id
from toolfault._errors import Outcome
from toolfault._jsontext import prebuilt_encoder
from toolfault._jsontext import quote_text as _quote
from toolfault._redact import Redactor

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

    Read-only.  ``fingerprint`` and ``args`` may be given as zero-argument callables: they are
    resolved on first read, so an observer that only counts calls costs almost nothing.
    """

    __slots__ = (*(f"_{name}" for name in _FIELDS), "_by")

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
        #: The Redactor that already redacted ``args`` and ``shadow`` (None: nobody said so).
        self._by: Redactor | None = None

    @classmethod
    def _emitted(cls, by: Redactor, tool: str, call_id: str, task: str, turn: int,
                 fingerprint: Any, result: Any, dispatched: bool, error_tokens: int,
                 mode: str, args: Any, side_effect: bool, duration_s: float,
                 shadow: dict[str, Any] | None, at: float) -> CallEvent:
        """An event whose args and shadow ``by`` redacted, built without keyword binding
        (the emitter's hot path); ``result`` gives ok, code, outcome, terminal, blocked and
        attempts."""
        event = cls.__new__(cls)
        event._tool, event._call_id, event._task, event._turn = tool, call_id, task, turn
        event._fingerprint, event._ok, event._code = fingerprint, result.ok, result.code
        event._outcome, event._terminal = result.outcome, result.terminal
        event._blocked, event._attempts = result.blocked, result.attempts
        event._dispatched, event._error_tokens = dispatched, error_tokens
        event._mode, event._args, event._side_effect = mode, args, side_effect
        event._duration_s, event._at, event._by = duration_s, at, by
        event._shadow = shadow if shadow is not None else {}
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
        """``json.dumps(self.to_dict(), ensure_ascii=False, default=str)``, written straight
        from the fields: the trace's hot path, with no intermediate dict."""
        return _line_text(_json(self._tool), _json(self._call_id), _json(self._task),
                          self._turn, self.fingerprint, self, _json(self._code),
                          self._dispatched, self._error_tokens, _json(self._mode),
                          _json(self.args), self._side_effect, _json(self._duration_s),
                          self._shadow, _json(self._at))


    def _redacted_jsonl(self, redactor: Redactor) -> str:
        """:meth:`to_jsonl` for an event whose args and shadow ``redactor`` already redacted
        (see :func:`call_line`)."""
        return call_line(redactor, self._tool, self._call_id, self._task, self._turn,
                         self.fingerprint, self, self._dispatched, self._error_tokens,
                         self._mode, _json(self.args), self._side_effect,
                         _json(self._duration_s), self._shadow, _json(self._at))


class _Done(Protocol):
    """What a call line or a span says about how a call ended (a CallEvent or a ToolResult)."""

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


def call_line(redactor: Redactor, tool: str, call_id: str, task: str, turn: int,
              fingerprint: str, done: _Done, dispatched: bool, error_tokens: int, mode: str,
              args: str, side_effect: bool, duration_s: str, shadow: Mapping[str, Any] | None,
              at: str) -> str:
    """A call line (what :meth:`CallEvent.to_jsonl` writes) from ``args`` (JSON text) and
    ``shadow`` already redacted by ``redactor``, its text fields redacted here, one by one;
    ``duration_s`` and ``at`` are JSON numbers' text.

    Equal to redacting the whole line, without a pass over the line: field names are fixed
    words, the fingerprint is a hash, the numbers are counters and clocks, and the redactor
    already checked every string, key and number of the arguments (see :func:`args_json`).
    """
    code = None if getattr(done, "failure", False) is None else done.code  # None: a success
    if type(tool) is str and type(call_id) is str and type(task) is str and type(mode) is str:
        # Text fields as they come (the usual case): the tool, task and mode as the
        # redactor remembers them quoted, an id of the guard's own making as it is (neither
        # a credential shape nor a registered form can be in one: see Redactor.plain_ids).
        memory = redactor._quoted
        texts = (memory.get(tool) or redactor.quoted(tool),
                 f'"{call_id}"' if redactor._plain_ids and is_own_call_id(call_id)
                 else _quote(redactor.secrets(call_id)),
                 memory.get(task) or redactor.quoted(task),
                 memory.get(mode) or redactor.quoted(mode))
    else:
        secrets = redactor.secrets
        texts = _quote(_redacted(tool, secrets)), _quote(_redacted(call_id, secrets)), \
            _quote(_redacted(task, secrets)), _quote(_redacted(mode, secrets))
    return _line_text(
        texts[0], texts[1], texts[2], turn, fingerprint, done,
        "null" if code is None else _quote(_redacted(code, redactor.secrets)), dispatched,
        error_tokens, texts[3], args, side_effect, duration_s, shadow, at)


#: The fields ``ok`` to ``blocked`` of every success (a result with no failure).
_SUCCEEDED = '"ok": true, "code": null, "outcome": "none", "terminal": false, "blocked": false'


def _line_text(tool: str, call_id: str, task: str, turn: Any, fingerprint: Any, done: _Done,
               code: str, dispatched: Any, error_tokens: Any, mode: str, args: str,
               side_effect: Any, duration_s: str, shadow: Mapping[str, Any] | None,
               at: str) -> str:
    """The call line from its fields, the text ones (``tool``, ``call_id``, ``task``,
    ``code``, ``mode``), ``args`` and the clocks given as JSON text already: one f-string
    instead of an encoder walk over a record (the C encoder spends more on a 20-field dict
    than the fields cost)."""
    if getattr(done, "failure", False) is None and done.ok is True:
        if (done.attempts == 1 and dispatched is True and error_tokens == 0
                and side_effect is False and not shadow and type(turn) is int
                and type(fingerprint) is str):
            # The usual line: a first-attempt success of a tool without side effects, its
            # fixed fields written as constants (the general line, with a third of its work).
            return (f'{{"tool": {tool}, "call_id": {call_id}, "task": {task}, "turn": {turn}, '
                    f'"fingerprint": {_quote(fingerprint)}, {_SUCCEEDED}, "attempts": 1, '
                    f'"dispatched": true, "error_tokens": 0, "mode": {mode}, "args": {args}, '
                    f'"side_effect": false, "duration_s": {duration_s}, "shadow": {{}}, '
                    f'"at": {at}, "type": "call"}}')
        ended = _SUCCEEDED  # a ToolResult's success: every one of these is fixed
    else:
        ended = (f'"ok": {_json(done.ok)}, "code": {code}, '
                 f'"outcome": {_json(done.outcome.value)}, '
                 f'"terminal": {_json(done.terminal)}, "blocked": {_json(done.blocked)}')
    return (
        f'{{"tool": {tool}, "call_id": {call_id}, "task": {task}, "turn": {_json(turn)}, '
        f'"fingerprint": {_json(fingerprint)}, {ended}, "attempts": {_json(done.attempts)}, '
        f'"dispatched": {_json(dispatched)}, "error_tokens": {_json(error_tokens)}, '
        f'"mode": {mode}, "args": {args}, "side_effect": {_json(side_effect)}, '
        f'"duration_s": {duration_s}, '
        f'"shadow": {_dumps(dict(shadow)) if shadow else "{}"}, '
        f'"at": {at}, "type": "call"}}'
    )


def _redacted(value: Any, secrets: Callable[[str], str]) -> str:
    """A text field, redacted; anything else by its JSON text (``default=str``), redacted."""
    return secrets(value if type(value) is str else _json(value))


def args_json(redactor: Redactor, args: dict[str, Any], sent: str | None) -> str:
    """The arguments' JSON text for a call line, redacted by ``redactor``.

    ``sent`` is the JSON text the arguments were parsed from (``None``: they came as an
    object).  Clean as a whole, by the rules of :meth:`Redactor.verbatim`, that text is the
    line's, as sent (spacing and number spelling as the model wrote them: the same values);
    else the arguments' own JSON text, clean as a whole; else the redacted copy's text (the
    walk over every value, as before).
    """
    if type(args) is not dict:  # a subclass may iterate its keys as it likes
        return _json(redactor.value(args))
    if sent is not None and redactor.verbatim(sent, args, parsed=True):
        return sent
    try:
        text = _encode_strict(args)
    except (TypeError, ValueError, RecursionError):  # not plain JSON values: the walk
        return _json(redactor.value(args))
    return text if redactor.verbatim(text, args) else _json(redactor.value(args))


def micros(count: int) -> str:
    """``count`` microseconds as a JSON number of seconds, in integer arithmetic (a float's
    shortest repr costs several times as much): ``1500`` is ``0.001500``."""
    if count >= 1_000_000:  # a clock: its digits with a point six from the end
        digits = str(count)
        return digits[:-6] + "." + digits[-6:]
    if count < 0:
        return f"-{micros(-count)}"
    return "0.%06d" % count  # noqa: UP031 - a third cheaper than f"{...:06d}"


class CallObserver(Protocol):
    """A hook called after every guarded call (keep it fast; exceptions are swallowed)."""

    def __call__(self, event: CallEvent) -> None: ...


#: ``json.dumps(record, ensure_ascii=False, default=str)`` without an encoder per line.
_encode_line = prebuilt_encoder(sort_keys=False, separators=(", ", ": "), allow_nan=True,
                                default=str)


#: The same text for plain JSON values, raising for anything else (``default=str`` would
#: write an object's ``str``, where the redacting walk writes its redacted ``repr``).
_encode_strict = prebuilt_encoder(sort_keys=False, separators=(", ", ": "), allow_nan=True)


def _dumps(record: Any) -> str:
    try:
        return _encode_line(record)
    except RecursionError:  # a cycle (the prebuilt encoder keeps no markers): json says so
        return json.dumps(record, ensure_ascii=False, default=str)


_INFINITE = (float("inf"), float("-inf"))


def _json(value: Any) -> str:
    """One value as ``json.dumps(value, ensure_ascii=False, default=str)`` writes it."""
    kind = type(value)
    if kind is str:
        return _quote(value)
    if value is None:
        return "null"
    if kind is bool:
        return "true" if value else "false"
    if kind is int:
        return int.__repr__(value)
    if kind is float and value == value and value not in _INFINITE:
        return float.__repr__(value)
    return _dumps(value)


#: Bytes a trace file buffers between flushes (a line is about 600).
_FILE_BUFFER = 1 << 18
#: Call lines kept in memory before they are written as one piece (about 300 KB).
_PENDING_LINES = 512


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
    """

    def __init__(self, target: str | Path | IO[str], *,
                 redact: Callable[[str], str] | None = None,
                 flush_interval: float = 1.0) -> None:
        #: The single exit of the trace channel: every line passes through ``redact``.
        self._redact = redact
        #: When ``redact`` is a Redactor's ``secrets``: that Redactor.  A call line of an event
        #: it already redacted is redacted field by field (the same text, far cheaper).
        owner = getattr(redact, "__self__", None)
        self._redactor = owner if isinstance(owner, Redactor) and \
            getattr(redact, "__func__", None) is Redactor.secrets else None
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
        """Append ``record`` as one line; anything but a call line is flushed at once."""
        self._line(_dumps(record), now=record.get("type") != "call")

    def __call__(self, event: CallEvent) -> None:
        if event._by is not None and event._by is self._redactor:
            self._line(event._redacted_jsonl(self._redactor), now=False, done=True)
        else:
            self._line(event.to_jsonl(), now=False)

    def _redacted_call(self, line: str) -> None:
        """Keep a call line already redacted field by field with this sink's Redactor
        (:func:`call_line`): the guard's path when no other observer needs an event."""
        lock = self._lock
        lock.acquire()  # not ``with``: on every traced call
        try:
            if self._closed:
                return
            pending = self._pending
            pending.append(line)
            if len(pending) >= self._batch:
                self._write_pending(flush=self._interval <= 0)
            if self._timer is None and self._interval > 0:
                self._start_timer()
        finally:
            lock.release()

    def _line(self, line: str, *, now: bool, done: bool = False) -> None:
        if self._redact is not None and not done:
            line = self._redact(line)
        if not now:
            self._redacted_call(line)
            return
        with self._lock:
            if self._closed:
                return
            self._pending.append(line)
            self._write_pending(flush=True)

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
    """True once the application installed a real tracer provider (cheap: two global reads).

    Without ``opentelemetry.trace`` imported no provider can have been installed, so toolfault
    never imports it itself just to find out.
    """
    otel = sys.modules.get(_OTEL)
    if otel is None:
        return False
    provider = getattr(otel, "_TRACER_PROVIDER", _MISSING)
    if provider is None:
        return False
    if provider is _MISSING:  # a future opentelemetry-api without the global
        return not isinstance(otel.get_tracer_provider(), otel.ProxyTracerProvider)
    return True


_MISSING = object()


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
    ok = done.ok
    if not ok:
        code = done.code or "tool_error"
        attributes["error.type"] = attributes["toolfault.code"] = code
        attributes["toolfault.outcome"] = done.outcome.value
        attributes["toolfault.terminal"] = done.terminal
        attributes["toolfault.blocked"] = done.blocked
    end = int(at * 1e9) if at else None
    start = end - int(duration_s * 1e9) if end is not None else None
    span = _tracer(otel).start_span(f"execute_tool {tool}", attributes=attributes,
                                    start_time=start)
    if not ok:
        span.set_status(otel.Status(otel.StatusCode.ERROR, code))
    span.end(end_time=end)


_tracer_for: tuple[object, trace.Tracer] | None = None


def _tracer(otel: ModuleType) -> trace.Tracer:
    """toolfault's tracer, fetched once per installed provider (not once per call)."""
    global _tracer_for
    # The global itself (tracing_active() saw it set), else the API's own lookup.
    provider = getattr(otel, "_TRACER_PROVIDER", None) or otel.get_tracer_provider()
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
