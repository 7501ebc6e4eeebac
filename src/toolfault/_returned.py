"""Errors that tools return instead of raising: ``{"error": "Booking not found"}``, ``"Error: …"``.

Most existing tools were not written for toolfault.  The default detector recognises the two
common shapes so such tools are guarded unmodified; a tool or guard can pass its own
``error_result=`` callable, or ``None`` to switch detection off.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from typing import Any

#: Keys that may sit beside ``error`` without making the value a real payload.
_ENVELOPE_KEYS = frozenset({
    "error", "errors", "message", "msg", "code", "status", "status_code", "detail", "details",
    "success", "ok", "type", "error_code", "error_message", "hint",
})
_ERROR_PREFIX = re.compile(r"^\s*error\s*:\s*", re.IGNORECASE)


def _as_text(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping):
        for key in ("message", "msg", "detail", "error", "reason"):
            if value.get(key):
                return _as_text(value[key])
        return "; ".join(f"{k}: {_as_text(v)}" for k, v in list(value.items())[:3])
    if isinstance(value, (list, tuple)):
        return "; ".join(_as_text(v) for v in value[:3])
    return str(value)


def _mapping_of(value: Any) -> Mapping[str, Any] | None:
    if isinstance(value, Mapping):
        return value
    dump = getattr(value, "model_dump", None)
    if callable(dump) and hasattr(type(value), "model_fields"):
        try:
            dumped = dump()
        except Exception:
            return None
        return dumped if isinstance(dumped, Mapping) else None
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    return None


#: Keys whose value, when ``False`` (or a failure word), says the call did not succeed.
_STATUS_KEYS = frozenset({"success", "ok", "succeeded", "successful", "status"})
_STATUS_SUFFIXES = ("_status", "_success", "_ok", "_succeeded")
_QUICK_KEYS = frozenset({"error", "errors", "success", "ok", "status"})
_FAILED_WORDS = frozenset({"error", "failed", "failure", "fail", "ko"})
#: Keys that carry the words of a failure, in the order they are preferred.
_MESSAGE_KEYS = ("error", "errors", "message", "msg", "detail", "details", "error_message",
                 "reason", "description")


#: Result keys seen without a status suffix: a tool returns the same keys on every call,
#: so after the first result each key costs one set lookup instead of four suffix tests.
_PLAIN_KEYS: set[str] = set()
_PLAIN_KEYS_MAX = 4096


def _status_suffixed(mapping: dict[Any, Any]) -> bool:
    plain = _PLAIN_KEYS
    for key in mapping:
        if type(key) is not str or key in plain:
            continue
        if key.endswith(_STATUS_SUFFIXES):
            return True
        if len(plain) < _PLAIN_KEYS_MAX and len(key) <= 64:
            plain.add(key)
    return False


def _status_key(key: str) -> bool:
    return key in _STATUS_KEYS or key.endswith(_STATUS_SUFFIXES)


def _says_failed(value: Any) -> bool | None:
    """True for a failed status (``False``, ``"failed"``, 4xx/5xx), False for a success."""
    if value is False:
        return True
    if value is True:
        return False
    if type(value) is int and 100 <= value <= 599:
        return value >= 400
    if isinstance(value, str):
        word = value.strip().lower()
        if word in _FAILED_WORDS:
            return True
        if word in ("ok", "success", "succeeded", "true"):
            return False
    return None


def default_error_result(value: Any) -> str | None:
    """The reason carried by a returned error value, or ``None`` when the value is a result.

    A mapping (or pydantic model / dataclass) counts when

    - it has a truthy ``error`` or ``errors`` key and nothing beside it but envelope keys and
      status fields (``{"booking_status": false, "error": "Invalid access token"}``), unless a
      status field says it succeeded (``{"ok": true, "error": …}``); or
    - a status field says it failed (``success``/``ok``/``*_status`` false, or ``"status":
      "error"``) and a message key says why, or nothing but envelope keys is there
      (``{"success": false, "message": "Card declined"}``; ``{"ok": false}``).

    Plain data that merely has a status (``{"service": "db", "ok": false}``,
    ``{"job": 3, "status": "failed"}``) is a result; a string counts when it starts with
    ``Error:``.
    """
    kind = type(value)
    # The common case, decided cheaply: no status or error key, and every key seen before
    # (none with a status suffix), or none with one now.
    if kind is dict and _QUICK_KEYS.isdisjoint(value) and (
            _PLAIN_KEYS.issuperset(value) or not _status_suffixed(value)):
        return None
    if kind in (int, float, bool, list, tuple) or value is None:
        return None
    if isinstance(value, str):
        return _prefixed_error(value)
    mapping = _mapping_of(value)
    return None if mapping is None else _mapping_error(mapping)


def _prefixed_error(text: str) -> str | None:
    """The words after a leading ``Error:`` (a reason of its own when none follow), else
    ``None``: any other string is a result."""
    if not _ERROR_PREFIX.match(text):
        return None
    return _ERROR_PREFIX.sub("", text, count=1).strip() or "the tool reported an error"


def _mapping_error(mapping: Mapping[str, Any]) -> str | None:
    """The reason a returned mapping carries, when it is an error envelope (see above)."""
    keys = {str(k) for k in mapping}
    statuses = _statuses(mapping, keys)
    if any(v is False for v in statuses.values()):
        return None  # a status field says it worked
    others = keys - _ENVELOPE_KEYS - set(statuses)
    said = None if others else _error_field(mapping)
    if said is not None:
        return said
    failed = [k for k, v in statuses.items() if v]
    return _failed_status_reason(mapping, failed, others) if failed else None


def _statuses(mapping: Mapping[str, Any], keys: set[str]) -> dict[str, bool | None]:
    """What each status field says: True failed, False succeeded, None neither."""
    return {k: _says_failed(mapping[k]) for k in keys if _status_key(k)}


def _failed_status_reason(mapping: Mapping[str, Any], failed: list[str],
                          others: set[str]) -> str | None:
    """The reason for a mapping whose ``failed`` status fields say it failed: its message
    key's words, or the status itself when nothing but envelope keys is there.

    Beside payload keys (``others``), a status that is only a word (``"status": "failed"``)
    may describe the payload (a job that failed), not the call: then it is a result.
    """
    said_value = next((mapping[k] for k in _MESSAGE_KEYS if mapping.get(k)), None)
    string_status_only = all(isinstance(mapping[k], str) for k in failed)
    if said_value is not None and (not others or not string_status_only):
        return _as_text(said_value).strip() or "the tool reported an error"
    if not others:
        return f"the tool reported {failed[0]}: {_as_text(mapping[failed[0]]).lower()}"
    return None


def _error_field(mapping: Mapping[str, Any]) -> str | None:
    """An ``error``/``errors`` field's words (with the message beside it), if it is set."""
    for key in ("error", "errors"):
        if mapping.get(key):
            message = mapping.get("message") or mapping.get("detail")
            text = _as_text(mapping[key])
            if isinstance(message, str) and message and message not in text:
                text = f"{text}: {message}" if isinstance(mapping[key], str) else message
            return text.strip() or "the tool reported an error"
    return None
