"""JSON text on the hot path: encoders built once instead of on every call.

``json.JSONEncoder.encode`` builds its C encoder again for every call; building it once saves
about a microsecond per message, which matters when every guarded call encodes a result.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

#: ``json.dumps(text, ensure_ascii=False)`` for a ``str``: the C escaper the encoder uses.
quote_text: Callable[[str], str] = json.encoder.encode_basestring


def _not_json(value: Any) -> Any:
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def prebuilt_chunks(*, sort_keys: bool, separators: tuple[str, str], allow_nan: bool,
                    default: Callable[[Any], Any] = _not_json
                    ) -> Callable[[Any, int], Sequence[str]]:
    """The C encoder itself: ``"".join(chunks(value, 0))`` is the text, with no Python frame
    in between, for callers that never pass a top-level ``str`` (the C encoder expects a
    container or a scalar).  Other arguments as :func:`prebuilt_encoder`."""
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:  # pragma: no cover - CPython without the _json accelerator
        fallback = json.JSONEncoder(sort_keys=sort_keys, separators=separators,
                                    ensure_ascii=False, allow_nan=allow_nan, default=default)
        return lambda value, _level: (fallback.encode(value),)
    item_sep, key_sep = separators
    chunks: Callable[[Any, int], Sequence[str]] = make(
        None, default, quote_text, None, key_sep, item_sep, sort_keys,
        False, allow_nan)
    return chunks


def prebuilt_encoder(*, sort_keys: bool, separators: tuple[str, str], allow_nan: bool,
                     default: Callable[[Any], Any] = _not_json) -> Callable[[Any], str]:
    """An ``ensure_ascii=False`` encoder; no cycle markers (they would be shared across
    threads), so a cycle raises ``RecursionError`` and callers take their slow path.
    ``default`` is ``json.dumps``'s: what to make of a value JSON has no form for."""
    fallback = json.JSONEncoder(sort_keys=sort_keys, separators=separators, ensure_ascii=False,
                                allow_nan=allow_nan, default=default)
    chunks = prebuilt_chunks(sort_keys=sort_keys, separators=separators, allow_nan=allow_nan,
                             default=default)

    def encode(value: Any) -> str:
        if isinstance(value, str):  # the C encoder expects a container or scalar, not top str
            return fallback.encode(value)
        return "".join(chunks(value, 0))

    return encode
