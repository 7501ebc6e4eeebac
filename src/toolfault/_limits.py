"""Caps that hold when the model does not cooperate: retry limits, backoff and budgets.

Small frozen policy objects (as in tenacity's stop/wait), so they compose by ``replace`` and
can be shared by many guards.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

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


#: Result keys that say when or how fast, not what: ignored when two results are compared.
#: A key matches whatever its case and separators (``request_id``, ``requestId``,
#: ``Request-ID``); ``delivery_date`` or ``updated_at`` are not here: they can be news.
DEFAULT_VOLATILE_FIELDS: frozenset[str] = frozenset({
    "timestamp", "ts", "time", "now", "server_time", "current_time", "as_of",
    "elapsed", "elapsed_ms", "elapsed_seconds", "duration", "duration_ms", "latency",
    "latency_ms", "took", "took_ms", "uptime", "request_id", "trace_id", "span_id",
    "correlation_id", "nonce", "etag", "fetched_at", "retrieved_at", "generated_at",
    "checked_at", "responded_at", "served_at",
})

_UNSET: Any = None.__class__  # a sentinel no user passes (the type of None)


@dataclass(frozen=True, slots=True)
class Limits:
    """Per-turn and per-task ceilings the guard enforces.

    ``retry_limit`` overrides the per-class defaults for every class; a catalog row's own
    ``retry_limit`` overrides both.  ``max_calls_per_turn`` and ``max_spend_per_task`` are
    hard limits: a runaway loop becomes a reported ``budget_exceeded`` incident.

    The ladder stops the smallest thing first and never a model doing good work (the figures
    behind each default: ``toolfault bench --loops`` and docs/bench.md).  Every rung is an
    incident; ``toolfault calibrate TRACE`` replays your own traffic under other values.

    1. The identical failing call: at its class's cap the terminal message names the legal
       moves and the fingerprint is blocked (the same message again, not dispatched).  A
       meaningfully changed call is let through.
    2. One tool failing with varying arguments: ``max_tool_failures_per_turn`` *consecutive*
       failures of that tool (a success of the tool resets the count; one call's retries
       inside the wrapper count once) block the tool for the turn with a four-part
       ``tool_blocked`` naming the alternatives; other tools keep working.
    3. Identical results: the result is always returned, from the second identical one with a
       short note; at ``no_progress_repeats`` identical results of the identical call it is
       ``no_progress`` (the result still included) and the call is blocked.  A call whose
       identical call ever returned something else is a poller and never ``no_progress``;
       so are ``side_effect`` tools and tools named in ``progress_exempt``.  Keys named in
       ``volatile_fields`` (timestamps, durations, request ids: any case and separator) and
       ISO times and UUIDs in text are ignored when results are compared.  ``None`` switches it off.
    4. The halt, last: a turn in which the model has ignored blocks ``halt_after_refusals``
       times (a blocked call, tool or no-progress call made again) ends; every further call
       of it gets the halt message until ``new_turn()``.  ``None`` blocks without halting.

    ``block_seconds`` lifts a block (and a halt) after that many seconds, and the message
    states the time; for loops without turn boundaries, such as sessionless MCP.
    ``success_lifts_blocks``: a successful call to another tool lifts the scope's blocks.

    Deprecated names still accepted, with a ``DeprecationWarning``: ``halt_after_terminal``
    (now ``halt_after_refusals``), ``no_progress_cycle`` (cycles are caught by the repeats of
    their calls; ``None`` still switches no-progress off) and ``halt_after_no_progress``.
    """

    retry_limit: int | None = None
    retry_limits: Mapping[FailureClass, int] = field(
        default_factory=lambda: dict(DEFAULT_RETRY_LIMITS)
    )
    max_calls_per_turn: int | None = None
    max_spend_per_task: float | None = None
    backoff: Backoff = field(default_factory=Backoff)
    halt_after_refusals: int | None = 2
    max_tool_failures_per_turn: int | None = 5
    no_progress_repeats: int | None = 5
    progress_exempt: frozenset[str] = frozenset()
    volatile_fields: frozenset[str] = DEFAULT_VOLATILE_FIELDS
    block_seconds: float | None = None
    success_lifts_blocks: bool = False
    halt_after_terminal: Any = field(default=_UNSET, repr=False, compare=False)
    no_progress_cycle: Any = field(default=_UNSET, repr=False, compare=False)
    halt_after_no_progress: Any = field(default=_UNSET, repr=False, compare=False)

    def __post_init__(self) -> None:
        self._translate_deprecated()
        _check(self, _LADDER_RULES)
        for name in ("progress_exempt", "volatile_fields"):
            object.__setattr__(self, name, _name_set(name, getattr(self, name)))
        object.__setattr__(self, "volatile_fields",
                           frozenset(field_key(str(v)) for v in self.volatile_fields))
        _check(self, _BUDGET_RULES)

    def _translate_deprecated(self) -> None:
        """The ladder's earlier names, mapped onto the rungs that replaced them."""
        old = {name: getattr(self, name) for name in
               ("halt_after_terminal", "no_progress_cycle", "halt_after_no_progress")}
        given = [name for name, value in old.items() if value is not _UNSET]
        if not given:
            return
        warnings.warn(f"Limits({', '.join(given)}=...) is deprecated: see the Limits "
                      "docstring for the rungs that replaced it", DeprecationWarning,
                      stacklevel=4)
        if old["halt_after_terminal"] is not _UNSET:
            object.__setattr__(self, "halt_after_refusals", old["halt_after_terminal"])
        if old["no_progress_cycle"] is None:
            object.__setattr__(self, "no_progress_repeats", None)
        for name in given:
            object.__setattr__(self, name, _UNSET)

    def limit_for(self, failure_class: FailureClass, row_limit: int | None = None) -> int:
        """Consecutive identical failures allowed before the terminal message."""
        if row_limit is not None:
            return row_limit
        if self.retry_limit is not None:
            return self.retry_limit
        return self.retry_limits.get(failure_class, DEFAULT_RETRY_LIMITS[failure_class])


def _count_below(floor: int) -> Callable[[Any], bool]:
    """A rule for a rung counted in calls: a whole number of at least ``floor``."""

    def bad(value: Any) -> bool:
        return not isinstance(value, int) or value < floor

    return bad


def _not_positive(value: Any) -> bool:
    """A duration must be more than nothing (NaN is not)."""
    return not value > 0


def _below_one(value: Any) -> bool:
    """A cap below one would refuse every call."""
    return bool(value < 1)


def _negative(value: Any) -> bool:
    """A spend may be zero, never less."""
    return bool(value < 0)


#: ``(field, rule, message)``: ``rule(value)`` true means the value is refused; ``None`` is
#: always allowed.  Checked in order; the ladder's rungs before the name sets, the budgets after.
_Rules = tuple[tuple[str, Callable[[Any], bool], str], ...]
_LADDER_RULES: _Rules = (
    ("halt_after_refusals", _count_below(1),
     "Limits.halt_after_refusals must be at least 1 (or None)"),
    ("max_tool_failures_per_turn", _count_below(1),
     "Limits.max_tool_failures_per_turn must be at least 1 (or None)"),
    ("no_progress_repeats", _count_below(2),
     "Limits.no_progress_repeats must be at least 2 (or None)"),
    ("block_seconds", _not_positive, "Limits.block_seconds must be greater than 0 (or None)"),
)
_BUDGET_RULES: _Rules = (
    ("retry_limit", _below_one, "Limits.retry_limit must be at least 1"),
    ("max_calls_per_turn", _below_one, "Limits.max_calls_per_turn must be at least 1"),
    ("max_spend_per_task", _negative, "Limits.max_spend_per_task must not be negative"),
)


def _check(limits: Limits, rules: _Rules) -> None:
    """Refuse the first field its rule rejects, in the table's words."""
    for name, refused, message in rules:
        value = getattr(limits, name)
        if value is not None and refused(value):
            raise ConfigurationError(message)


def _name_set(name: str, value: Any) -> frozenset[str]:
    """A set of names as given (a frozenset kept as is); one bare string is refused: it would
    read as a set of its letters."""
    if isinstance(value, str):
        raise ConfigurationError(f"Limits.{name} must be a collection of names, not one string")
    return value if isinstance(value, frozenset) else frozenset(value)


def field_key(name: str) -> str:
    """A result key as ``volatile_fields`` compares it: lower case, no separators."""
    return name.lower().replace("_", "").replace("-", "").replace(" ", "")
