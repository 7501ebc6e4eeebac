"""Budgets: per-turn call ceilings and per-task spend, as reported incidents.

The counting itself is atomic in the store (:meth:`Store.admit`); this is what the guard does
when a ceiling is reached: a ``budget_exceeded`` message telling the model to stop and report,
and an incident, never a silent stop.  Observe and shape modes only mark it in the trace.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from toolfault._call import _Call
from toolfault._catalog import Catalog
from toolfault._classify import Failure, from_entry
from toolfault._limits import Limits
from toolfault._records import IncidentKind
from toolfault._result import ToolResult
from toolfault._state import Admission, DegradingStore


class BudgetMixin:
    """The guard's budget handling (mixed into :class:`~toolfault.Guard`)."""

    _store: DegradingStore
    task_id: str
    catalog: Catalog
    mode: str
    limits: Limits

    if TYPE_CHECKING:
        def _fail(self, call: _Call, failure: Failure, *, count: bool = True) -> ToolResult:
            ...

        def _incident(self, kind: IncidentKind, tool: str, code: str, detail: str) -> None:
            ...

    def _budget_exceeded(self, call: _Call, adm: Admission) -> ToolResult | None:
        if adm.over == "calls_per_turn":
            reason = (f"this turn already made {adm.calls_in_turn} tool calls, the limit per "
                      "turn")
        else:
            cost = call.spec.cost if call.spec else 0.0
            reason = (f"this task has spent {adm.spend:g} of its {self.limits.max_spend_per_task:g}"
                      f" budget and {call.name} costs {cost:g}")
        if self.mode != "enforce":
            call.shadow["would_exceed_budget"] = adm.over
            return None
        self._incident(IncidentKind.BUDGET_EXCEEDED, call.name, "budget_exceeded", reason)
        return self._fail(call, from_entry(self.catalog.get("budget_exceeded"), reason),
                          count=False)

    def _refund(self, call: _Call) -> None:
        if call.spec is not None and call.spec.cost and call.admission is not None:
            try:
                self._store.refund(self.task_id, call.spec.cost)
            except Exception:
                pass
