"""Records handed to users: incidents and effect-ledger entries.

Frozen and slotted, serialisable to plain dicts so every store (memory, SQLite, Redis) and the
JSONL trace keep exactly the same shape.
"""

from __future__ import annotations

import enum
import json
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from toolfault._errors import Outcome


class IncidentKind(enum.Enum):
    """Events an operator must hear about: a cap is a reportable incident, not a silent stop."""

    RETRY_CAP = "retry_cap"
    BUDGET_EXCEEDED = "budget_exceeded"
    EFFECT_MISMATCH = "effect_mismatch"
    STATE_DEGRADED = "state_degraded"
    POSTCONDITION_FAILED = "postcondition_failed"
    #: The guard ended a turn (the model kept making calls it had been told were blocked):
    #: ``ToolResult.halt`` was set.
    HALT = "halt"
    #: A read-only call returned the identical result ``Limits.no_progress_repeats`` times.
    NO_PROGRESS = "no_progress"
    #: One tool failed ``Limits.max_tool_failures_per_turn`` times in a row: blocked for the turn.
    TOOL_BLOCKED = "tool_blocked"
    #: ``toolfault proxy`` restarted the MCP server it guards after it died.
    UPSTREAM_RESTART = "upstream_restart"
    #: After a store outage, an idempotency key held locally was found claimed by another
    #: worker in the shared store: the same action may have run twice.
    KEY_CONFLICT = "key_conflict"


@dataclass(frozen=True, slots=True)
class Incident:
    """One reportable event (cap hit, budget hit, degraded store, effect mismatch)."""

    kind: IncidentKind
    tool: str
    code: str
    detail: str
    task: str
    turn: int
    at: float = field(default_factory=time.time)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["kind"] = self.kind.value
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Incident:
        return cls(**{**data, "kind": IncidentKind(data["kind"])})


@dataclass(frozen=True, slots=True)
class LedgerEntry:
    """One side-effecting call, with the two channels kept apart.

    ``told`` is the response channel (what the model was told: ``ok`` or an error code);
    ``effect`` is the effect channel (what happened, as confirmed by the tool's return or a
    postcondition).  ``told`` is ``None`` while the call is in flight, so an entry written
    before a crash still says "dispatched, effect unknown".  ``told_text`` is the text the
    model was given, so a replayed call id gets the same answer without a second dispatch.
    """

    call_id: str
    task: str
    tool: str
    fingerprint: str
    idempotency_key: str | None
    args: dict[str, Any]
    effect: Outcome
    told: str | None = None
    told_effect: Outcome | None = None
    confirmed_by: str | None = None
    attempts: int = 0
    at: float = field(default_factory=time.time)
    told_text: str | None = None

    @property
    def in_flight(self) -> bool:
        """Dispatched and not answered: the process may have died mid-call."""
        return self.told is None

    @property
    def mismatch(self) -> bool:
        """The model was told something other than what happened."""
        if self.told is None:
            return False
        if self.effect is Outcome.APPLIED:
            return self.told != "ok" and self.told_effect is not Outcome.APPLIED
        if self.effect is Outcome.NO_EFFECT:
            return self.told == "ok"
        return False

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["effect"] = self.effect.value
        out["told_effect"] = self.told_effect.value if self.told_effect else None
        return out

    def to_json(self) -> str:
        """The stored form; one spelling per entry, so stores can compare-and-set on it."""
        return json.dumps(self.to_dict(), separators=(",", ":"), default=str)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LedgerEntry:
        told_effect = data.get("told_effect")
        return cls(**{
            **data,
            "effect": Outcome(data["effect"]),
            "told_effect": Outcome(told_effect) if told_effect else None,
        })
