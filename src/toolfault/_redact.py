"""Keeping secrets and internal identifiers out of what reaches a model provider.

Every string toolfault emits (message text, structured problem, JSONL trace) passes through
a :class:`Redactor`.  It removes registered secret values, values of secret-looking
environment variables, well-known key and token shapes, and values under secret-looking
argument names, and it replaces file paths, hosts and addresses with neutral words.
"""

from __future__ import annotations

import functools
import json
import os
import re
from collections.abc import Iterable, Mapping
from typing import Any

REDACTED = "[REDACTED]"

#: Shapes of credentials that are secret wherever they appear.
SECRET_PATTERNS: tuple[re.Pattern[str], ...] = (
    # No leading word boundary on purpose: "0sk-…" or "xAKIA…" must not slip through.
    re.compile(r"sk-(?:proj-|ant-)?[A-Za-z0-9_\-]{16,}"),
    re.compile(r"(?:AKIA|ASIA)[0-9A-Z]{16}"),
    re.compile(r"(?i:bearer\s+)[A-Za-z0-9._~+/\-]+=*"),
    re.compile(r"gh[pousr]_[A-Za-z0-9]{20,}"),
    re.compile(r"xox[abposr]-[A-Za-z0-9\-]{10,}"),
    re.compile(r"eyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}"),
    re.compile(r"(?i:(?<![A-Za-z0-9])(?:[A-Za-z0-9]+[_\-.])*(?:api[_-]?key|access[_-]?key|"
               r"token|secret|password|passwd)=)[^\s&;,]+"),
    re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----[\s\S]*?-----END [A-Z ]*PRIVATE KEY-----"),
)

# One pass for all shapes, behind a cheap literal gate (_may_hold_secret).
_ANY_SECRET = re.compile("|".join(f"(?:{p.pattern})" for p in SECRET_PATTERNS))

def _may_hold_secret(text: str) -> bool:
    """A cheap gate: every shape in SECRET_PATTERNS contains one of these literals."""
    return (
        "sk-" in text or "AKIA" in text or "ASIA" in text or "eyJ" in text or "=" in text
        or "xox" in text or "-----BEGIN" in text or "hp_" in text or "ho_" in text
        or "hu_" in text or "hs_" in text or "hr_" in text or "bearer" in text.lower()
    )


#: Internal identifiers that say nothing useful to a model: paths, URLs with hosts, addresses.
INTERNAL_PATTERNS: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"\b[a-z][a-z0-9+.\-]*://[^\s'\"<>]+"), "[url]"),
    (re.compile(r"\[?\b[0-9a-f]{0,4}(?::[0-9a-f]{0,4}){2,7}\]?(?::\d+)?", re.I), "[address]"),
    (re.compile(r"\b(?=[\w.\-]*[A-Za-z])[\w\-]+(?:\.[\w\-]+)*:\d{2,5}\b"), "[host]"),
    (re.compile(r"~/(?:[\w.\-]+/)*[\w.\-]+"), "[path]"),
    (re.compile(r"(?<![\w/~])(?:[\w.\-]+/){2,}[\w.\-]+"), "[path]"),
    (re.compile(r"\b(?:[a-z0-9\-]+\.){2,}[a-z]{2,}\b", re.I), "[host]"),
    (re.compile(r"(?<![\w.])(?:/[\w.\-]+){2,}/?"), "[path]"),
    (re.compile(r"\b[A-Za-z]:\\(?:[\w.\- ]+\\)*[\w.\- ]*"), "[path]"),
    (re.compile(r"\b(?:\d{1,3}\.){3}\d{1,3}(?::\d+)?\b"), "[address]"),
    (re.compile(r"\b[\w\-]+(?:\.[\w\-]+)*\.(?:internal|local|lan|corp|svc|cluster\.local)\b"),
     "[host]"),
)

_SECRET_WORDS = frozenset({
    "password", "passwd", "passphrase", "pass", "pwd", "secret", "secrets", "token", "apikey",
    "authorization", "auth", "credential", "credentials", "cookie", "otp", "pin", "bearer",
})
_SECRET_PAIRS = frozenset({("api", "key"), ("private", "key"), ("access", "key"),
                           ("session", "id"), ("client", "secret"), ("secret", "key")})
#: Counters named like tokens ("max_tokens") are numbers of tokens, not credentials.
_TOKEN_COUNTERS = frozenset({"max", "num", "input", "output", "total", "completion", "prompt",
                             "min", "used"})
_CAMEL = re.compile(r"([a-z0-9])([A-Z])")
_SECRET_ENV_RE = re.compile(r"(?i)(KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL|AUTH)")


def is_secret_key(name: str) -> bool:
    """Whether an argument or header name conventionally holds a secret.

    Matched by name segment (``db_password``, ``apiKey``, ``X-Api-Key``), so ``passenger``,
    ``author`` and ``max_tokens`` stay visible to the model.
    """
    raw = [p for p in re.split(r"[_\-.\s]+", _CAMEL.sub(r"\1_\2", name).lower()) if p]
    parts = [p[:-1] if len(p) > 3 and p.endswith("s") else p for p in raw]  # plurals
    for i, part in enumerate(parts):
        if part == "token" and i > 0 and parts[i - 1] in _TOKEN_COUNTERS:
            continue
        if part in _SECRET_WORDS or raw[i] in _SECRET_WORDS:
            return True
        if i + 1 < len(parts) and (part, parts[i + 1]) in _SECRET_PAIRS:
            return True
    return False


_is_secret_key = functools.lru_cache(maxsize=4096)(is_secret_key)


class Redactor:
    """Removes secrets (always) and internal identifiers (in prose) from outgoing text."""

    __slots__ = ("_secrets", "_secrets_re")

    def __init__(self, secrets: Iterable[str] = (), *, scan_env: bool = True) -> None:
        self._secrets: set[str] = set()
        self._secrets_re: re.Pattern[str] | None = None
        values = list(secrets)
        if scan_env:
            values.extend(
                v for k, v in os.environ.items() if _SECRET_ENV_RE.search(k) and len(v) >= 8
            )
        self.add(*values)

    def add(self, *secrets: str) -> None:
        """Register secret values that must never appear in any emitted text."""
        fresh = {s for s in secrets if isinstance(s, str) and len(s) >= 4}
        # The forms a value takes inside JSON text too, since results are redacted as text.
        fresh |= {json.dumps(s, ensure_ascii=ascii_only)[1:-1] for s in fresh
                  for ascii_only in (False, True)}
        if not fresh - self._secrets:
            return
        self._secrets |= fresh
        ordered = sorted(self._secrets, key=len, reverse=True)
        self._secrets_re = re.compile("|".join(re.escape(s) for s in ordered))

    def secrets(self, text: str) -> str:
        """Replace secret values and credential shapes in ``text``."""
        if self._secrets_re is not None:
            text = self._secrets_re.sub(REDACTED, text)
        return _ANY_SECRET.sub(REDACTED, text) if _may_hold_secret(text) else text

    def prose(self, text: str, *, allow: Iterable[str] = ()) -> str:
        """Redact secrets, then paths, URLs, hosts and addresses: for reasons and next actions.

        Strings in ``allow`` (the model's own argument values) are the operation's terms, not
        the infrastructure's, so a path the model passed may be named back to it.
        """
        text = self.secrets(text)
        kept = sorted((a for a in allow if len(a) >= 2 and a in text), key=len, reverse=True)
        for i, original in enumerate(kept):
            text = text.replace(original, f"\x00{i}\x00")
        for pattern, word in INTERNAL_PATTERNS:
            text = pattern.sub(word, text)
        for i, original in enumerate(kept):
            text = text.replace(f"\x00{i}\x00", self.secrets(original))
        return text

    def value(self, value: Any, *, key: str | None = None, _depth: int = 0,
              _secret: bool = False) -> Any:
        """A copy of a JSON-like value with secrets removed (key order kept).

        Everything under a secret-named key is redacted, nested lists and objects included.
        """
        kind = type(value)
        if not _secret and key is not None and kind is not bool and value is not None:
            _secret = _is_secret_key(key)
        if kind is str:
            return REDACTED if _secret else self.secrets(value)
        if kind is bool or value is None:
            return value
        if kind is int or kind is float:
            return REDACTED if _secret else value
        if _depth > 64:
            return "…"
        if isinstance(value, Mapping):
            return {
                self.secrets(str(k)): self.value(v, key=str(k), _depth=_depth + 1,
                                                 _secret=_secret)
                for k, v in value.items()
            }
        if isinstance(value, (list, tuple)):
            return [self.value(v, _depth=_depth + 1, _secret=_secret) for v in value]
        if _secret:
            return REDACTED
        if isinstance(value, str):
            return self.secrets(value)
        return value

    def hidden_values(self, value: Any, *, key: str | None = None, _depth: int = 0) -> set[str]:
        """Strings under secret-named keys: never to be echoed in prose either."""
        found: set[str] = set()
        if _depth > 64:
            return found
        if isinstance(value, Mapping):
            for k, v in value.items():
                if _is_secret_key(str(k)):
                    found |= _leaf_strings(v)
                else:
                    found |= self.hidden_values(v, key=str(k), _depth=_depth + 1)
        elif isinstance(value, (list, tuple)):
            for v in value:
                found |= self.hidden_values(v, _depth=_depth + 1)
        return found


def _leaf_strings(value: Any, depth: int = 0) -> set[str]:
    if isinstance(value, (str, int, float)) and not isinstance(value, bool):
        text = str(value)
        return {text} if len(text) >= 4 else set()
    if depth > 64:
        return set()
    if isinstance(value, Mapping):
        return set().union(*(_leaf_strings(v, depth + 1) for v in value.values()))
    if isinstance(value, (list, tuple)):
        return set().union(*(_leaf_strings(v, depth + 1) for v in value))
    return set()
