"""Budgets and admission: the request a call makes of the counters, and what a refusal says.

The guard turns :class:`~toolfault.Limits` and a tool's spec into one frozen
:class:`~toolfault._admission.AdmissionRequest`; the store evaluates it atomically.  When a
ceiling is reached the model gets ``budget_exceeded`` (stop and report) and an incident is
recorded, never a silent stop.  Observe and shape modes only mark it in the trace.
"""

from __future__ import annotations

from toolfault._admission import (
    Admission,
    AdmissionRequest,
    Ceiling,
    Counter,
    LazyFingerprint,
)
from toolfault._call import _Call
from toolfault._classify import from_entry
from toolfault._degrading import DegradingStore
from toolfault._emission import Emitter
from toolfault._errors import FailureClass
from toolfault._failing import Failures
from toolfault._limits import Limits
from toolfault._records import IncidentKind
from toolfault._result import ToolResult
from toolfault._settings import Scope, Settings
from toolfault._tool import ToolSpec


class Budgets:
    """Builds one scope's admission requests and answers refused ones."""

    def __init__(self, settings: Settings, scope: Scope, store: DegradingStore, *,
                 failures: Failures, emitter: Emitter) -> None:
        self._limits = settings.limits
        self._catalog = settings.catalog
        self._scope = scope
        self._store = store
        self._failures = failures
        self._emitter = emitter
        # Per tool spec (frozen: a tool registered again is a new spec), its ceilings and
        # lease under this scope's limits.
        self._built: dict[int, tuple[ToolSpec, tuple[Ceiling, ...], float]] = {}

    def request(self, spec: ToolSpec, fingerprint: LazyFingerprint) -> AdmissionRequest:
        """The call's request, from the tool's ceilings and lease (built once per spec)."""
        built = self._built.get(id(spec))
        if built is None or built[0] is not spec:
            built = (spec, ceilings_for(self._limits, spec), max(30.0, 4 * (spec.timeout or 30.0)))
            self._built[id(spec)] = built
        scope = self._scope
        return AdmissionRequest(scope.task_id, scope.turn, fingerprint, spec.cost,
                                lease=built[2], ceilings=built[1])

    def exceeded(self, call: _Call, adm: Admission) -> ToolResult | None:
        """``budget_exceeded`` and an incident (enforce), or a mark in the trace."""
        if adm.over == "calls_per_turn":
            reason = (f"this turn already made {adm.calls_in_turn} tool calls, the limit per "
                      "turn")
        else:
            cost = call.spec.cost if call.spec else 0.0
            reason = (f"this task has spent {adm.spend:g} of its "
                      f"{self._limits.max_spend_per_task:g} budget and {call.name} costs {cost:g}")
        if self._scope.mode != "enforce":
            call.shadow["would_exceed_budget"] = adm.over
            return None
        self._emitter.incident(IncidentKind.BUDGET_EXCEEDED, call.name, "budget_exceeded", reason)
        return self._failures.fail(call, from_entry(self._catalog.get("budget_exceeded"), reason),
                                count=False)

    def refund(self, call: _Call) -> None:
        """Give back the spend of a call that was charged but never dispatched."""
        if call.spec is not None and call.spec.cost and call.admission is not None:
            try:
                self._store.refund(self._scope.task_id, call.spec.cost)
            except Exception:  # noqa: BLE001 - a lost refund over-counts, never under
                pass


def ceilings_for(limits: Limits, spec: ToolSpec) -> tuple[Ceiling, ...]:
    """The ceilings a call of ``spec`` is admitted under, from the guard's limits."""
    ceilings = [Ceiling(Counter.IDENTICAL_RUNNING, float(in_flight_limit(limits, spec)))]
    if limits.max_calls_per_turn is not None:
        ceilings.append(Ceiling(Counter.CALLS_IN_TURN, float(limits.max_calls_per_turn)))
    if limits.max_spend_per_task is not None:
        ceilings.append(Ceiling(Counter.SPEND_IN_TASK, float(limits.max_spend_per_task)))
    return tuple(ceilings)


def in_flight_limit(limits: Limits, spec: ToolSpec) -> int:
    """Identical calls allowed in flight before any failed: the smallest retry limit."""
    if spec.retry_limit is not None:
        return spec.retry_limit
    if limits.retry_limit is not None:
        return limits.retry_limit
    return min((n for c, n in limits.retry_limits.items() if c is not FailureClass.BUDGET),
               default=2)
