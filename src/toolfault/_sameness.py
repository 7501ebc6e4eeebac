"""Whether two results of one call say the same thing (for the no-progress rung).

A result that differs only in when it was made (a timestamp, a duration, a request id) is
the same result: peers that detect stuck agents (hermes-agent, OpenHands) strip those before
comparing, or every poll would look like progress.  JSON results lose the keys named in
``Limits.volatile_fields`` at any depth; in any text, ISO-8601 date-times, clock times and
UUIDs are masked.  Only asked when a call's result text changed, so an identical result
costs one string comparison.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Collection
from typing import Any

from toolfault._limits import field_key

_MASKS = re.compile(
    r"\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}(?::\d{2}(?:[.,]\d+)?)?(?:Z|[+-]\d{2}:?\d{2})?"
    r"|\b\d{1,2}:\d{2}:\d{2}(?:[.,]\d+)?\b"
    r"|\b[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\b"
)
#: Results longer than this are compared as they are (no parse, no masks).
MAX_COMPARED_CHARS = 200_000


def digest(text: str, volatile: Collection[str]) -> int:
    """A digest of ``text`` that ignores its volatile parts (equal for "the same result")."""
    if len(text) > MAX_COMPARED_CHARS:
        return _hash(text)
    stripped = text.lstrip()
    if volatile and stripped[:1] in ("{", "["):
        try:
            value = json.loads(text)
        except ValueError:
            pass
        else:
            text = json.dumps(_without(value, volatile), sort_keys=True, ensure_ascii=False,
                              separators=(",", ":"))
    return _hash(_MASKS.sub("#", text))


def _without(value: Any, volatile: Collection[str]) -> Any:
    if isinstance(value, dict):
        return {k: _without(v, volatile) for k, v in value.items()
                if field_key(str(k)) not in volatile}
    if isinstance(value, list):
        return [_without(v, volatile) for v in value]
    return value


def _hash(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode("utf-8", "surrogatepass"),
                                          digest_size=8).digest(), "big")
