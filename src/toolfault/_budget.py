"""Budgets and admission: the request a call makes of the counters, and what a refusal says.

The guard turns :class:`~toolfault.Limits` and a tool's spec into one frozen
:class:`~toolfault._admission.AdmissionRequest`; the store evaluates it atomically.  When a
ceiling is reached the model gets ``budget_exceeded`` (stop and report) and an incident is
recorded, never a silent stop.  Observe and shape modes only mark it in the trace.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from toolfault._admission import (
    Admission,
    AdmissionRequest,
    Ceiling,
    Counter,
    LazyFingerprint,
)
from toolfault._call import _Call
from toolfault._classify import from_entry
from toolfault._errors import FailureClass
from toolfault._limits import Limits
from toolfault._records import IncidentKind
from toolfault._result import ToolResult
from toolfault._tool import ToolSpec

if TYPE_CHECKING:
    from toolfault._guard import Guard




class Budgets:
    """Builds admission requests and answers refused ones (one per guard scope)."""

    def __init__(self, guard: Guard) -> None:
        self._g = guard
        # Per tool spec (a tool registered again is a new spec): the limits they were built
        # for, the ceilings and the lease.
        self._built: dict[int, tuple[ToolSpec, Limits, tuple[Ceiling, ...], float]] = {}

    def request(self, spec: ToolSpec, fingerprint: LazyFingerprint) -> AdmissionRequest:
        """The call's request: built from data cached per tool (rebuilt if limits change)."""
        g = self._g
        built = self._built.get(id(spec))
        if built is None or built[0] is not spec or built[1] is not g.limits:
            built = (spec, g.limits, ceilings_for(g.limits, spec),
                     max(30.0, 4 * (spec.timeout or 30.0)))
            self._built[id(spec)] = built
        return AdmissionRequest(g.task_id, g._turn, fingerprint, spec.cost, lease=built[3],
                                ceilings=built[2])

    def exceeded(self, call: _Call, adm: Admission) -> ToolResult | None:
        """``budget_exceeded`` and an incident (enforce), or a mark in the trace."""
        g = self._g
        if adm.over == "calls_per_turn":
            reason = (f"this turn already made {adm.calls_in_turn} tool calls, the limit per "
                      "turn")
        else:
            cost = call.spec.cost if call.spec else 0.0
            reason = (f"this task has spent {adm.spend:g} of its "
                      f"{g.limits.max_spend_per_task:g} budget and {call.name} costs {cost:g}")
        if g.mode != "enforce":
            call.shadow["would_exceed_budget"] = adm.over
            return None
        g._emitter.incident(IncidentKind.BUDGET_EXCEEDED, call.name, "budget_exceeded", reason)
        return g._pipeline.fail(call, from_entry(g.catalog.get("budget_exceeded"), reason),
                                count=False)

    def refund(self, call: _Call) -> None:
        """Give back the spend of a call that was charged but never dispatched."""
        g = self._g
        if call.spec is not None and call.spec.cost and call.admission is not None:
            try:
                g._store.refund(g.task_id, call.spec.cost)
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
