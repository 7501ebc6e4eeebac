"""toolfault: tool errors an LLM agent can act on, and loops it cannot get into.

Every failure becomes a four-part instruction (code, reason, rejected arguments, one next
action); identical retries are capped by a fingerprint of the call; only transient failures
are retried; timed-out side effects are verified before any retry; budgets cap the rest.
"""

from toolfault._catalog import Catalog, CatalogEntry
from toolfault._errors import (
    CatalogError,
    ConfigurationError,
    FailureClass,
    Outcome,
    StateUnavailableError,
    ToolError,
    ToolfaultError,
)
from toolfault._fingerprint import (
    canonical_args,
    casefold,
    collapse_whitespace,
    fingerprint,
    round_to,
    strip_trailing_slash,
)
from toolfault._guard import Guard
from toolfault._limits import Backoff, Limits
from toolfault._records import Incident, IncidentKind, LedgerEntry
from toolfault._redact import Redactor
from toolfault._result import ToolContext, ToolResult
from toolfault._returned import default_error_result
from toolfault._tokens import count_tokens
from toolfault._tool import Alternative, ToolSpec
from toolfault._trace import CallEvent, CallObserver, JsonlSink
from toolfault.stores._memory import MemoryStore

__version__ = "0.1.0"

#: Store protocol types, now in :mod:`toolfault.stores` (kept importable from here).
_MOVED = frozenset({"Admission", "AdmissionRequest", "CallKey", "Ceiling", "Counter",
                    "Counters", "KeyLocks", "LazyFingerprint", "Pollers", "Records", "Store"})


def __getattr__(name: str) -> object:
    if name in _MOVED:
        import warnings

        from toolfault import stores

        warnings.warn(f"toolfault.{name} moved to toolfault.stores.{name}", DeprecationWarning,
                      stacklevel=2)
        return getattr(stores, name)
    raise AttributeError(f"module 'toolfault' has no attribute {name!r}")

__all__ = [
    "Alternative",
    "Backoff",
    "CallEvent",
    "CallObserver",
    "Catalog",
    "CatalogEntry",
    "CatalogError",
    "ConfigurationError",
    "FailureClass",
    "Guard",
    "Incident",
    "IncidentKind",
    "JsonlSink",
    "LedgerEntry",
    "Limits",
    "MemoryStore",
    "Outcome",
    "Redactor",
    "StateUnavailableError",
    "ToolContext",
    "ToolError",
    "ToolResult",
    "ToolSpec",
    "ToolfaultError",
    "__version__",
    "canonical_args",
    "casefold",
    "collapse_whitespace",
    "count_tokens",
    "default_error_result",
    "fingerprint",
    "round_to",
    "strip_trailing_slash",
]
