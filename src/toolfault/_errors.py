"""What can go wrong, as data the guard can reason about.

Exception tree (mirrored in ``docs/errors.md`` by ``toolfault docs``)::

    Exception
    ├── ToolError                 raised by *tools*: a failure the model must hear about
    └── ToolfaultError            raised by *toolfault* at configuration time, never in a call
        ├── CatalogError(ValueError)      a catalog file or row is malformed
        ├── ConfigurationError(ValueError) a guard or tool was declared inconsistently
        └── StateUnavailableError(ConnectionError) a shared store could not be reached

Only the first branch ever reaches an agent, and only as text: ``Guard.call`` converts every
``ToolError`` (and every other exception) into a ``ToolResult``.  The second branch exists for
the engineer wiring things up, so it subclasses the matching builtin (``except ValueError``
keeps working).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from typing import Any


class Outcome(enum.Enum):
    """What happened to the world, as far as the guard knows.

    The model is told this in plain words (``Effect: none|unknown|applied``) because a retry is
    only safe when the answer is ``NO_EFFECT``.
    """

    NO_EFFECT = "none"
    UNKNOWN = "unknown"
    APPLIED = "applied"


class FailureClass(enum.Enum):
    """Failure layers that deserve different retry policies.

    Bad input will fail again with the same arguments; transient failures may not; permanent
    failures never succeed as called; an unknown outcome must be verified before any retry.
    """

    BAD_INPUT = "bad_input"
    TRANSIENT = "transient"
    PERMANENT = "permanent"
    UNKNOWN_OUTCOME = "unknown_outcome"
    BUDGET = "budget"
    INTERNAL = "internal"

    @property
    def default_retryable(self) -> bool:
        """Whether retrying the same call can help, absent a more specific verdict."""
        return self is FailureClass.TRANSIENT


class ToolError(Exception):
    """A tool failure phrased for the model.

    Raise it from tool code with a catalog ``code`` and a ``reason`` in the operation's terms.
    Anything left ``None`` is filled from the catalog row for ``code`` when the guard shapes
    the message, so the catalog stays the single source of defaults.
    """

    def __init__(
        self,
        code: str,
        reason: str,
        *,
        next_action: str | None = None,
        retryable: bool | None = None,
        outcome: Outcome = Outcome.NO_EFFECT,
        failure_class: FailureClass | None = None,
        alternatives: Sequence[str] = (),
        retry_after: float | None = None,
        param: str | None = None,
        details: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(f"{code}: {reason}")
        self.code = code
        self.reason = reason
        self.next_action = next_action
        self.retryable = retryable
        self.outcome = outcome
        self.failure_class = failure_class
        self.alternatives = alternatives if type(alternatives) is tuple else tuple(alternatives)
        self.retry_after = retry_after
        self.param = param
        self.details = dict(details) if details else {}

    def __repr__(self) -> str:
        return f"ToolError(code={self.code!r}, reason={self.reason!r})"


class ToolfaultError(Exception):
    """Base class for mistakes in how toolfault itself was configured."""


class CatalogError(ToolfaultError, ValueError):
    """A catalog file or one of its rows is malformed."""


class ConfigurationError(ToolfaultError, ValueError):
    """A guard or a tool was declared inconsistently (unknown store, bad option, …)."""


class StateUnavailableError(ToolfaultError, ConnectionError):
    """A store could not be reached, or cannot yet vouch for a side effect (it just restarted
    empty and its workers are reconciling); the guard degrades or refuses, per its policy.

    ``retry_after``: seconds after which asking again may succeed, when known.
    """

    def __init__(self, message: str = "the state store is unavailable", *,
                 retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after
