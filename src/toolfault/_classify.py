"""Turning whatever a tool raised into a catalogued failure.

``ToolError`` already speaks the contract.  Everything else is mapped by the catalog
(exception class names, HTTP status of an ``httpx``/``requests`` error), or becomes
``internal_error``.  A raw exception's own text never reaches the model unless its row says the
message is the operation's (``ValueError`` → ``invalid_argument``), and even then it is redacted.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from typing import Any

from toolfault._catalog import Catalog, CatalogEntry
from toolfault._errors import FailureClass, Outcome, ToolError

#: Exceptions raised before a request left the machine: the effect surely did not land.
_BEFORE_DISPATCH = {"ConnectError", "ConnectTimeout", "ConnectionRefusedError", "InvalidURL"}
#: Exception texts that speak the infrastructure's language, never the operation's.
#: SQL anywhere in the text counts (bounded scans keep this linear on hostile input).
_INFRA_TEXT = re.compile(
    r"Traceback \(most recent|File \"|(?i:^\s*(?:SELECT|INSERT|UPDATE|DELETE|WITH)\b)|"
    r"\b(?:SELECT|INSERT|UPDATE|DELETE|WITH|CREATE|DROP|ALTER|TRUNCATE|MERGE)\b"
    r"[^\n;]{0,300}?\b(?:FROM|INTO|SET|TABLE|WHERE|VALUES|JOIN)\b|"
    r"(?i:\bselect\s++\*\s++from\b|\binsert\s++into\s|\bdelete\s++from\s|"
    r"\bfrom\s++\w++\s++where\b|\bupdate\s++\w++\s++set\s)")
#: Every match of _INFRA_TEXT holds one of these, lower-cased (ASCII text only: under its
#: case-insensitive parts "ſ", "ı", "İ" and the Kelvin sign match ASCII letters).
_INFRA_WORDS = ("traceback", 'file "', "select", "insert", "update", "delete", "with",
                "create", "drop", "alter", "truncate", "merge", "from")


def _infra_text(text: str) -> bool:
    """Whether an exception's text speaks the infrastructure's language (_INFRA_TEXT), the
    regex run only on text that holds one of its words."""
    if text.isascii():
        low = text.lower()
        for word in _INFRA_WORDS:  # noqa: SIM110 - no generator frame per failure
            if word in low:
                break
        else:
            return False
    return _INFRA_TEXT.search(text) is not None


#: Rows whose exception text is the operation's own words, not the infrastructure's.
_TEXT_IS_REASON = {"invalid_argument", "not_found", "conflict"}


@dataclass(slots=True)
class Failure:
    """A failure on its way to becoming a message: the catalog row plus this call's facts."""

    entry: CatalogEntry
    reason: str
    outcome: Outcome = Outcome.NO_EFFECT
    retryable: bool = False
    retry_after: float | None = None
    next_action: str | None = None
    param: str | None = None
    expected: str | None = None
    alternatives: tuple[str, ...] = ()
    failure_class: FailureClass = FailureClass.PERMANENT
    cause: BaseException | None = None
    error: ToolError | None = None
    values: dict[str, Any] = field(default_factory=dict)

    @property
    def code(self) -> str:
        return self.entry.code

    @property
    def transient(self) -> bool:
        return self.failure_class is FailureClass.TRANSIENT and self.retryable


def from_entry(entry: CatalogEntry, reason: str, **kw: Any) -> Failure:
    """A failure of a catalogued code with the row's defaults."""
    kw.setdefault("failure_class", entry.failure_class)
    kw.setdefault("retryable", entry.retryable)
    kw.setdefault("outcome", entry.outcome)
    return Failure(entry, reason, **kw)


def from_tool_error(err: ToolError, catalog: Catalog) -> Failure:
    """Fill what the tool left unsaid from the catalog row of its code."""
    entry = catalog.get(err.code)
    failure_class = err.failure_class or entry.failure_class
    retryable = err.retryable if err.retryable is not None else entry.retryable
    outcome = err.outcome if err.outcome is not Outcome.NO_EFFECT else entry.outcome
    return Failure(
        entry, err.reason, outcome=outcome, retryable=retryable, retry_after=err.retry_after,
        next_action=err.next_action, param=err.param, alternatives=err.alternatives,
        failure_class=failure_class, cause=err, error=err,
    )


def parse_retry_after(value: object) -> float | None:
    """Seconds from a ``Retry-After`` header (delta-seconds or an HTTP date)."""
    if value is None:
        return None
    text = str(value).strip()
    try:
        return max(0.0, float(text))
    except ValueError:
        pass
    import email.utils  # only for a Retry-After given as an HTTP date

    try:
        when = email.utils.parsedate_to_datetime(text)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def _http_status(exc: BaseException) -> tuple[int, float | None] | None:
    response = getattr(exc, "response", None)
    status = getattr(response, "status_code", None)
    if not isinstance(status, int):
        return None
    headers = getattr(response, "headers", None) or {}
    try:
        retry_after = parse_retry_after(headers.get("retry-after") or headers.get("Retry-After"))
    except Exception:
        retry_after = None
    return status, retry_after


def _text_of(exc: BaseException) -> str:
    """An exception's text, or nothing when its ``__str__`` is hostile (raises, not a str)."""
    try:
        text = str(exc)
    except Exception:  # noqa: BLE001 - any exception a tool raised may misbehave
        return ""
    return text.strip().strip("'\"") if isinstance(text, str) else ""


def _from_http(exc: BaseException, catalog: Catalog, http: tuple[int, float | None], *,
               tool: str, side_effect: bool) -> Failure:
    """A failure from an HTTP client's error, by its status (429 and 503 say "not now")."""
    status, retry_after = http
    by_status = catalog.for_status(status) or catalog.get("internal_error")
    reason = f"the service behind {tool} answered HTTP {status}"
    if status == 429:
        reason = f"the service behind {tool} is rate limiting requests (HTTP 429)"
    # A 5xx after a side-effecting request may have landed (503 and 429 say "not now").
    outcome = (Outcome.UNKNOWN if side_effect and status >= 500 and status != 503
               else by_status.outcome)
    return from_entry(by_status, reason, retry_after=retry_after, cause=exc, outcome=outcome)


def from_exception(
    exc: BaseException, catalog: Catalog, *, tool: str, side_effect: bool
) -> Failure:
    """Classify a raw exception; the exception itself is kept as ``cause`` for the trace."""
    if isinstance(exc, ToolError):
        return from_tool_error(exc, catalog)
    try:
        http = _http_status(exc)
    except Exception:  # noqa: BLE001 - a hostile ``response`` attribute is no status
        http = None
    if http is not None:
        return _from_http(exc, catalog, http, tool=tool, side_effect=side_effect)
    entry = catalog.for_exception(exc)
    if entry is None:
        return from_entry(catalog.get("internal_error"),
                          f"{tool} hit an internal error and did not complete", cause=exc,
                          outcome=Outcome.UNKNOWN if side_effect else Outcome.NO_EFFECT)
    outcome = _mapped_outcome(entry, exc, side_effect)
    reason = _mapped_reason(entry, _text_of(exc), tool)
    return Failure(entry, reason, outcome, entry.retryable, failure_class=entry.failure_class,
                   cause=exc)


def _mapped_outcome(entry: CatalogEntry, exc: BaseException, side_effect: bool) -> Outcome:
    """The row's outcome, but unknown for a transient failure of a side-effecting call whose
    request may have left the machine (one that failed to connect surely did not)."""
    if entry.failure_class is not FailureClass.TRANSIENT or not side_effect:
        return entry.outcome
    if {k.__name__ for k in type(exc).__mro__} & _BEFORE_DISPATCH:
        return entry.outcome
    return Outcome.UNKNOWN


def _mapped_reason(entry: CatalogEntry, text: str, tool: str) -> str:
    """The reason the model reads: the exception's own text only where the row says it is
    the operation's words (and it is not the infrastructure's), else the row's."""
    if entry.code in _TEXT_IS_REASON and text.strip(" .") and not _infra_text(text):
        return text[:240]
    if entry.code == "timeout":
        return f"{tool} did not answer in time"
    if entry.code == "unavailable":
        return f"the service behind {tool} could not be reached"
    return entry.summary or f"{tool} failed"
