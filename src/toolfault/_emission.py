"""Emission: the single exit of every result, and where incidents are recorded.

Each result leaves through :meth:`Emitter.emit`: sealed (redacted, cut to the token budget),
then, only when someone listens, described once as a :class:`~toolfault._trace.CallEvent`
for the observers, the JSONL trace and an OpenTelemetry span.  The caller's and the model's
text in that description (tool name, call id, task, code, arguments, shadow) is redacted
here, once, for all three; what toolfault computes itself (fingerprint, counts, clocks,
outcome, mode, an id it made) holds none of their text and is written as it is.  Emitting
never turns a result into a raise.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Callable

from toolfault import _trace
from toolfault._call import _Call, own_call_id
from toolfault._degrading import DegradingStore
from toolfault._records import Incident, IncidentKind
from toolfault._redact import Redactor
from toolfault._result import ToolResult
from toolfault._settings import Scope, Settings
from toolfault._shaping import Shaper

log = logging.getLogger("toolfault")
_time, _monotonic = time.time, time.monotonic


class Emitter:
    """Seals and publishes results and incidents for one guard scope."""

    def __init__(self, settings: Settings, scope: Scope, shaper: Shaper, store: DegradingStore,
                 redactor: Redactor, observers: list[Callable[[_trace.CallEvent], None]],
                 sink: _trace.JsonlSink | None) -> None:
        self._settings = settings
        self._scope = scope
        self._shaper = shaper
        self._store = store
        self._redactor = redactor
        self._observers = observers
        self._sink = sink

    def emit(self, call: _Call, result: ToolResult) -> ToolResult:
        """Seal the result and tell whoever listens; never raises."""
        try:
            if not result.ok:
                result = self._shaper.seal(result)
            # No observer, and no tracer provider (none can exist before OpenTelemetry's API
            # is imported): nothing more to do, decided without a call.
            tracing = _trace._OTEL in sys.modules and _trace.tracing_active()
            if tracing or self._observers:  # the span, the observers and the trace line
                now, duration = _time(), _monotonic() - call.started
                # The same redacted name and id for every channel; a caller's id is their
                # text (any value: shape() takes what it is given) and may hold anything.
                redactor, call_id = self._redactor, result.call_id
                tool = redactor.secrets(result.tool)
                if not own_call_id(call_id):
                    call_id = redactor.value(call_id)
                if tracing:
                    self._span(call, result, tool, call_id, now, duration)
                if self._observers:
                    self._notify(call, result, tool, call_id, now, duration)
            return result
        except Exception:  # noqa: BLE001 - tracing must not turn a result into a raise
            try:
                return self._shaper.seal(result)
            except Exception:  # noqa: BLE001
                return result

    def _notify(self, call: _Call, result: ToolResult, tool: str, call_id: str, now: float,
                duration: float) -> None:
        """Tell the observers (the JSONL trace is one): one event, redacted once (``tool`` and
        ``call_id`` come redacted)."""
        scope, redactor, args, spec = self._scope, self._redactor, call.args, call.spec
        event = _trace.CallEvent(
            tool=tool, call_id=call_id, task=redactor.value(scope.task_id), turn=scope.turn,
            fingerprint=lambda: result.fingerprint, ok=result.ok, code=redactor.value(result.code),
            outcome=result.outcome, terminal=result.terminal, blocked=result.blocked,
            attempts=result.attempts, dispatched=call.dispatched,
            error_tokens=0 if result.ok else self._settings.count_tokens(result.text),
            mode=scope.mode,
            args=(lambda: redactor.value(args)) if isinstance(args, dict) else None,
            side_effect=spec is not None and spec.side_effect,
            duration_s=round(duration, 6), at=round(now, 6),
            shadow=redactor.value(dict(call.shadow)) if call.shadow else None)
        _trace.safe_notify(self._observers, event)

    def _span(self, call: _Call, result: ToolResult, tool: str, call_id: str, now: float,
              duration: float) -> None:
        """The call's OpenTelemetry span (content only when the user opted in; ``tool`` and
        ``call_id`` come redacted)."""
        redactor = self._redactor
        content = text = budget = None
        if self._settings.capture_content:
            args = redactor.value(call.args) if isinstance(call.args, dict) else None
            content = redactor.secrets(json.dumps(args, default=str))
            text = redactor.secrets(result.text)
        adm, limits = call.admission, self._settings.limits
        if adm is not None and (limits.max_calls_per_turn is not None
                                or limits.max_spend_per_task is not None):
            budget = {"calls_in_turn": float(adm.calls_in_turn), "spend": adm.spend}
        _trace.record_span(tool, call_id, result.fingerprint, result.attempts, self._scope.mode,
                           result, now, duration, content=content, result=text, budget=budget)

    def incident(self, kind: IncidentKind, tool: str, code: str, detail: str) -> None:
        """Record an incident (the shared store, else the local fallback) and trace it."""
        scope, store = self._scope, self._store
        incident = Incident(kind, tool, code, self._redactor.prose(detail), scope.task_id,
                            scope.turn)
        try:
            store.add_incident(incident)
        except Exception:
            store.fallback.add_incident(incident)
        self._write(incident)

    def degraded(self, exc: BaseException) -> None:
        """The store became unreachable: a warning, an incident kept locally, a trace line."""
        scope, store = self._scope, self._store
        scope.last_degraded_error = type(exc).__name__
        log.warning("toolfault state store unavailable (%s); policy=%s",
                    type(exc).__name__, store.policy)
        incident = Incident(IncidentKind.STATE_DEGRADED, "*", "state_unavailable",
                            f"store unreachable ({type(exc).__name__}); "
                            f"policy {store.policy}", scope.task_id, scope.turn)
        store.fallback.add_incident(incident)
        self._write(incident)

    def _write(self, incident: Incident) -> None:
        sink = self._sink
        if sink is not None:
            try:
                sink.write({"type": "incident", **incident.to_dict()})
            except Exception:  # noqa: BLE001 - a full disk must not break the call
                log.info("toolfault could not write an incident to the trace")
