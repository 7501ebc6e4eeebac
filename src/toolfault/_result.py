"""What a guarded call gives back: always a result, never an exception."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from toolfault._errors import FailureClass, Outcome, ToolError
from toolfault._tokens import count_tokens


@dataclass(frozen=True, slots=True)
class FailureInfo:
    """Why a call failed, kept beside the message (``None`` on success)."""

    code: str
    outcome: Outcome = Outcome.NO_EFFECT
    terminal: bool = False
    blocked: bool = False
    retryable: bool = False
    halt: bool = False
    failure_class: FailureClass | None = None
    error: ToolError | None = field(default=None, repr=False)
    cause: BaseException | None = field(default=None, repr=False)


@dataclass(frozen=True, slots=True)
class ToolResult:
    """The outcome of one guarded call, shaped for the model and kept whole for the engineer.

    ``text`` is exactly what the model should see.  ``data`` is the same content as
    structured data: the tool's return value on success, an RFC 9457-style problem dict on
    failure.  ``cause`` keeps the original exception (never shown to the model).  ``note``
    is what the guard added to ``text`` beside the tool's value, kept apart so an adapter that
    hands the model the value itself can still show it.
    """

    tool: str
    ok: bool
    text: str
    data: Any = None
    attempts: int = 0
    call_id: str = ""
    failure: FailureInfo | None = None
    _fingerprint: Any = field(default="", repr=False, compare=False)
    #: The recorded answer of an earlier call with the same explicit idempotency key: this
    #: call did not run the tool (``Effect: applied``, by that earlier call).
    replayed: bool = False
    #: ``"(Note: same result as your previous identical call.)"`` when this success repeats the
    #: identical call's result before it in the turn (not in observe mode); ``text`` ends with
    #: it.  ``None`` otherwise.
    note: str | None = None

    @property
    def fingerprint(self) -> str:
        """The call's fingerprint (computed on first use on the fast success path)."""
        fp = self._fingerprint
        if callable(fp):
            fp = fp()
            object.__setattr__(self, "_fingerprint", fp)
        return str(fp)

    @property
    def is_error(self) -> bool:
        """The model must treat this result as a failure (adapters set ``is_error`` from it)."""
        return not self.ok

    @property
    def code(self) -> str | None:
        """The catalog code of the failure (``None`` on success)."""
        return self.failure.code if self.failure else None

    @property
    def outcome(self) -> Outcome:
        """What happened to the world: a success applied its effect, a failure says."""
        if self.failure is None:  # a replay: applied, by the earlier call with its key
            return Outcome.APPLIED if self.replayed else Outcome.NO_EFFECT
        return self.failure.outcome

    @property
    def terminal(self) -> bool:
        """The retry cap was reached: the model was told retrying is not allowed."""
        return self.failure.terminal if self.failure else False

    @property
    def halt(self) -> bool:
        """The guard ended the turn: the loop must stop calling tools and report.

        Set after a refused call following the terminal message, the per-tool failure
        ceiling, or repeated no-progress calls (see :class:`~toolfault.Limits`); every
        further call of the turn gets the halt message until ``new_turn()``.
        """
        return self.failure.halt if self.failure else False

    @property
    def blocked(self) -> bool:
        """The call was refused at the cap without reaching the tool."""
        return self.failure.blocked if self.failure else False

    @property
    def retryable(self) -> bool:
        """Retrying the same call later may help (the verdict the text states)."""
        return self.failure.retryable if self.failure else False

    @property
    def failure_class(self) -> FailureClass | None:
        return self.failure.failure_class if self.failure else None

    @property
    def error(self) -> ToolError | None:
        """The failure as a ``ToolError`` (raised by the tool, or synthesised)."""
        return self.failure.error if self.failure else None

    @property
    def cause(self) -> BaseException | None:
        """The original exception, for logs and traces (never shown to the model)."""
        return self.failure.cause if self.failure else None

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


class _Unsealed:
    """A :class:`ToolResult` under construction: the same slots, in the same order, without
    the frozen ``__setattr__``, so each field is one plain slot store."""

    __slots__ = ToolResult.__slots__


class _UnsealedInfo:
    """A :class:`FailureInfo` under construction (as :class:`_Unsealed` for a result)."""

    __slots__ = FailureInfo.__slots__


def new_failure_info(code: str, outcome: Outcome, terminal: bool, blocked: bool,
                     retryable: bool, halt: bool, failure_class: FailureClass | None,
                     error: ToolError | None, cause: BaseException | None) -> FailureInfo:
    """``FailureInfo(...)`` (positional, in field order), built as :func:`new_result` builds
    a result: filled in unsealed, then made a ``FailureInfo``."""
    info: Any = _UnsealedInfo()
    info.code = code
    info.outcome = outcome
    info.terminal = terminal
    info.blocked = blocked
    info.retryable = retryable
    info.halt = halt
    info.failure_class = failure_class
    info.error = error
    info.cause = cause
    info.__class__ = FailureInfo
    sealed: FailureInfo = info
    return sealed


def new_result(tool: str, ok: bool, text: str, data: Any, attempts: int, call_id: str,
               failure: FailureInfo | None, fingerprint: Any, note: str | None = None
               ) -> ToolResult:
    """``ToolResult(...)``, built the way the guard builds one per call: filled in as an
    :class:`_Unsealed` and then made a ``ToolResult`` (Python allows ``__class__``
    assignment between classes of identical layout).  A frozen dataclass's ``__init__``
    spends an ``object.__setattr__`` per field; this costs half as much for the same object,
    fields and immutability."""
    result: Any = _Unsealed()
    result.tool = tool
    result.ok = ok
    result.text = text
    result.data = data
    result.attempts = attempts
    result.call_id = call_id
    result.failure = failure
    result._fingerprint = fingerprint
    result.replayed = False
    result.note = note
    result.__class__ = ToolResult
    sealed: ToolResult = result
    return sealed


@dataclass(slots=True)
class ToolContext:
    """Facts about the current call, injected into a tool parameter annotated ``ToolContext``."""

    tool: str
    call_id: str
    task: str
    turn: int
    attempt: int = 1
    idempotency_key: str | None = None
