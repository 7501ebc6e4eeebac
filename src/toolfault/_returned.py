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


def default_error_result(value: Any) -> str | None:
    """The reason carried by a returned error value, or ``None`` when the value is a result.

    A mapping (or pydantic model / dataclass) counts when it has a truthy ``error`` or
    ``errors`` key and nothing but envelope keys beside it; a string counts when it starts with
    ``Error:``.
    """
    kind = type(value)
    if kind is dict and "error" not in value and "errors" not in value:
        return None  # the common case, decided without walking anything
    if kind in (int, float, bool, list, tuple) or value is None:
        return None
    if isinstance(value, str):
        if _ERROR_PREFIX.match(value):
            return _ERROR_PREFIX.sub("", value, count=1).strip() or "the tool reported an error"
        return None
    mapping = _mapping_of(value)
    if mapping is None:
        return None
    for key in ("error", "errors"):
        if key in mapping and mapping[key] and set(map(str, mapping)) <= _ENVELOPE_KEYS:
            if mapping.get("success") is True or mapping.get("ok") is True:
                return None
            message = mapping.get("message") or mapping.get("detail")
            text = _as_text(mapping[key])
            if isinstance(message, str) and message and message not in text:
                text = f"{text}: {message}" if isinstance(mapping[key], str) else message
            return text.strip() or "the tool reported an error"
    return None
