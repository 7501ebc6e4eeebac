"""Caps that hold when the model does not cooperate: retry limits, backoff and budgets.

Small frozen policy objects (as in tenacity's stop/wait), so they compose by ``replace`` and
can be shared by many guards.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from toolfault._errors import ConfigurationError, FailureClass

#: Consecutive identical failures allowed per turn, by failure class (the practical range 2–3).
DEFAULT_RETRY_LIMITS: Mapping[FailureClass, int] = MappingProxyType({
    FailureClass.BAD_INPUT: 2,
    FailureClass.PERMANENT: 2,
    FailureClass.INTERNAL: 2,
    FailureClass.UNKNOWN_OUTCOME: 2,
    FailureClass.TRANSIENT: 3,
    FailureClass.BUDGET: 1,
})


@dataclass(frozen=True, slots=True)
class Backoff:
    """Automatic retries of transient failures inside the wrapper, before the model sees them.

    Jittered exponential waits (``initial * 2**n`` up to ``maximum``, plus up to ``jitter``),
    a server's ``Retry-After`` honoured when it is larger, bounded by ``attempts`` in all and
    ``max_seconds`` of waiting.
    """

    attempts: int = 3
    initial: float = 0.2
    maximum: float = 5.0
    jitter: float = 0.2
    max_seconds: float = 10.0

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ConfigurationError("Backoff.attempts must be at least 1 (1 = no retry)")
        if min(self.initial, self.maximum, self.jitter, self.max_seconds) < 0:
            raise ConfigurationError("Backoff times must not be negative")


NO_BACKOFF = Backoff(attempts=1)


@dataclass(frozen=True, slots=True)
class Limits:
    """Per-turn and per-task ceilings the guard enforces.

    ``retry_limit`` overrides the per-class defaults for every class; a catalog row's own
    ``retry_limit`` overrides both.  ``max_calls_per_turn`` and ``max_spend_per_task`` turn a
    runaway loop into a reported ``budget_exceeded`` incident.
    """

    retry_limit: int | None = None
    retry_limits: Mapping[FailureClass, int] = field(
        default_factory=lambda: dict(DEFAULT_RETRY_LIMITS)
    )
    max_calls_per_turn: int | None = None
    max_spend_per_task: float | None = None
    backoff: Backoff = field(default_factory=Backoff)

    def __post_init__(self) -> None:
        if self.retry_limit is not None and self.retry_limit < 1:
            raise ConfigurationError("Limits.retry_limit must be at least 1")
        if self.max_calls_per_turn is not None and self.max_calls_per_turn < 1:
            raise ConfigurationError("Limits.max_calls_per_turn must be at least 1")
        if self.max_spend_per_task is not None and self.max_spend_per_task < 0:
            raise ConfigurationError("Limits.max_spend_per_task must not be negative")

    def limit_for(self, failure_class: FailureClass, row_limit: int | None = None) -> int:
        """Consecutive identical failures allowed before the terminal message."""
        if row_limit is not None:
            return row_limit
        if self.retry_limit is not None:
            return self.retry_limit
        return self.retry_limits.get(failure_class, DEFAULT_RETRY_LIMITS[failure_class])
