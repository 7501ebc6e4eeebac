"""What a guarded call gives back: always a result, never an exception."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from toolfault._errors import FailureClass, Outcome, ToolError
from toolfault._tokens import count_tokens


@dataclass(frozen=True, slots=True)
class ToolResult:
    """The outcome of one guarded call, shaped for the model and kept whole for the engineer.

    ``text`` is exactly what the model should see.  ``data`` is the same content as
    structured data: the tool's return value on success, an RFC 9457-style problem dict on
    failure.  ``cause`` keeps the original exception (never shown to the model).
    """

    tool: str
    ok: bool
    text: str
    data: Any = None
    code: str | None = None
    outcome: Outcome = Outcome.NO_EFFECT
    terminal: bool = False
    blocked: bool = False
    retryable: bool = False
    failure_class: FailureClass | None = None
    fingerprint: str = ""
    attempts: int = 0
    call_id: str = ""
    error: ToolError | None = field(default=None, repr=False)
    cause: BaseException | None = field(default=None, repr=False)

    @property
    def is_error(self) -> bool:
        """The model must treat this result as a failure (adapters set ``is_error`` from it)."""
        return not self.ok

    @property
    def value(self) -> Any:
        """The tool's return value (``None`` on failure)."""
        return self.data if self.ok else None

    @property
    def problem(self) -> dict[str, Any] | None:
        """The structured form of the error (``None`` on success)."""
        return None if self.ok else self.data

    @property
    def tokens(self) -> int:
        """Tokens this result adds to the model's context."""
        return count_tokens(self.text)

    def reraise(self) -> None:
        """Raise the original exception, for callers that want it (as tenacity's ``reraise``)."""
        if self.cause is not None:
            raise self.cause
        if self.error is not None:
            raise self.error


@dataclass(slots=True)
class ToolContext:
    """Facts about the current call, injected into a tool parameter annotated ``ToolContext``."""

    tool: str
    call_id: str
    task: str
    turn: int
    attempt: int = 1
    idempotency_key: str | None = None
