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

    The ladder after the cap, for a model that does not stop on its own (every rung is an
    incident; a halt sets ``ToolResult.halt`` and ``"halt": true`` in ``result.data``, and
    every further call of that turn gets the halt message until ``new_turn()``):

    - ``halt_after_terminal``: the terminal message blocks the fingerprint; the N-th refused
      call after it halts the turn (``1``: block at the cap, halt at cap + 1).  ``None``
      blocks for ever without halting.
    - ``max_tool_failures_per_turn``: the N-th failure of one tool in a turn, whatever its
      arguments, halts the turn.
    - ``no_progress_cycle``: a read-only tool (not ``side_effect``) returning the identical
      result for the identical call again, or a cycle of read-only calls (``A,B,A,B`` up to
      this length) repeating with identical results, gets the ``no_progress`` message;
      ``halt_after_no_progress`` further no-progress calls halt the turn.  ``no_progress_repeats``
      is how many times in a row the call (or cycle) must occur (2: the first repeat).  Tools
      named in ``progress_exempt`` (pollers whose result may legitimately stay the same) are
      never flagged.
    - ``block_seconds``: a block (and a halt) is lifted after this many seconds, and the
      message states the time ("not allowed for the next 60 seconds"); for loops without turn
      boundaries, such as sessionless MCP.  ``success_lifts_blocks``: a successful call to
      another tool lifts the blocks of the scope's other tools.

    The per-tool and no-progress counts live in the guard's process (per task and turn);
    the fingerprint counts live in the store.
    """

    retry_limit: int | None = None
    retry_limits: Mapping[FailureClass, int] = field(
        default_factory=lambda: dict(DEFAULT_RETRY_LIMITS)
    )
    max_calls_per_turn: int | None = None
    max_spend_per_task: float | None = None
    backoff: Backoff = field(default_factory=Backoff)
    halt_after_terminal: int | None = 1
    max_tool_failures_per_turn: int | None = 5
    no_progress_cycle: int | None = 3
    halt_after_no_progress: int | None = 1
    no_progress_repeats: int = 2
    progress_exempt: frozenset[str] = frozenset()
    block_seconds: float | None = None
    success_lifts_blocks: bool = False

    def __post_init__(self) -> None:
        for name in ("halt_after_terminal", "max_tool_failures_per_turn", "no_progress_cycle",
                     "halt_after_no_progress"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ConfigurationError(f"Limits.{name} must be at least 1 (or None)")
        if not isinstance(self.no_progress_repeats, int) or self.no_progress_repeats < 2:
            raise ConfigurationError("Limits.no_progress_repeats must be at least 2")
        if self.block_seconds is not None and not self.block_seconds > 0:
            raise ConfigurationError("Limits.block_seconds must be greater than 0 (or None)")
        if not isinstance(self.progress_exempt, frozenset):
            object.__setattr__(self, "progress_exempt", frozenset(self.progress_exempt))
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
