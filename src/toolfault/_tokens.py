"""Counting the tokens an error adds to the model's context.

An error is re-sent on every later turn, so its size is a cost the bench reports and the
catalog lint caps.  The exact cl100k_base count comes from ``bpe-openai`` (the
``toolfault[tokens]`` extra, which ships its vocabulary) or from tiktoken when its encoding is
already cached on this machine; toolfault never downloads anything.  Otherwise a
conservative estimate that over-counts punctuation-heavy text such as JSON.
"""

from __future__ import annotations

import hashlib
import math
import os
import re
from collections.abc import Callable
from functools import lru_cache
from typing import Any, Literal

#: How a guard counts tokens: exact cl100k_base when installed (``"auto"``), the built-in
#: estimate, exact or nothing, or your own counter.
Tokenizer = Literal["auto", "estimate", "exact"] | Callable[[str], int]

_LETTERS = re.compile(r"[A-Za-z]+")
_DIGITS = re.compile(r"[0-9]+")
#: ASCII characters that are neither whitespace, letters nor digits: punctuation and the
#: control characters Python does not count as whitespace, spelt as ranges (the class
#: "not whitespace, alphanumeric or non-ASCII" says the same but takes 1.5 ms to compile).
_PUNCTUATION = re.compile(r"[\x00-\x08\x0e-\x1b!-/:-@\[-`{-\x7f]+")
_ENCODING_URL = (
    "https://openaipublic.blob.core.windows.net/encodings/cl100k_base.tiktoken"
)


#: The piece rates below over-count toolfault's messages by 5-25% (median 12%, never under,
#: on 338 messages of the test suite against cl100k_base); their ASCII part scaled by this,
#: the estimate is within 7% under and 16% over, median 4% over: a message is cut when it
#: is over budget, not because the estimate is pessimistic.
CALIBRATION = 0.93


def estimate_tokens(text: str) -> int:
    """An estimate of cl100k_base tokens, for machines without a vocabulary (calibrated).

    Words cost one token per 6 letters; irregular letter runs (ids, base64) one per 2; each
    non-ASCII character one per UTF-8 byte (cl100k_base's worst case: rare characters and
    emoji take a token per byte, so the budget holds in every script, at the price of
    over-counting common CJK about 2x); 3-digit groups one; punctuation runs one per 2.
    Calibrated against cl100k_base on toolfault's own messages (about 5-20% high).

    The four kinds of piece never share a character, so each is found by its own scan and
    the non-ASCII characters are counted from the encoded length, not one by one.
    """
    total = 0
    for word in _LETTERS.findall(text):
        regular = word.islower() or word.isupper() or word.istitle()
        total += (len(word) + 5) // 6 if regular else (len(word) + 1) // 2
    for run in _DIGITS.findall(text):
        total += (len(run) + 2) // 3
    for run in _PUNCTUATION.findall(text):
        total += (len(run) + 1) // 2
    total = math.ceil(total * CALIBRATION)
    if not text.isascii():  # not calibrated: a rare character can take a token per byte
        # The UTF-8 bytes of the non-ASCII characters: all bytes less one per ASCII one.
        total += len(text.encode("utf-8", "surrogatepass")) - len(text.encode("ascii", "ignore"))
    return total


class Remembering:
    """A counter that remembers its last answer.

    A guard counts one message several times on its way out (shaped against the budget, sealed,
    reported as the error's tokens); the exact tokenizer is the dearest step of a failure, so
    the same text is counted once.  Only the last text (up to 16,000 characters) is kept; the
    pair is swapped as one tuple, so threads at worst miss, never mix answers.
    """

    __slots__ = ("__name__", "_count", "_last")

    def __init__(self, count: Callable[[str], int], name: str) -> None:
        self._count = count
        self._last: tuple[str, int] = ("", count(""))
        self.__name__ = name

    def __call__(self, text: str) -> int:
        last = self._last
        if last[0] is text or (type(text) is str and last[0] == text):
            return last[1]
        tokens = self._count(text)
        if len(text) <= 16_000:
            self._last = (text, tokens)
        return tokens


#: The estimate, remembering its last answer (what a guard with ``"estimate"`` uses).
estimate_remembering = Remembering(estimate_tokens, "estimate_tokens")


@lru_cache(maxsize=1)
def _tiktoken_counter() -> Callable[[str], int] | None:
    """The exact cl100k_base counter (remembering its last answer), or ``None``."""
    counter = _exact_counter()
    return Remembering(counter, "cl100k_base") if counter is not None else None


def _exact_counter() -> Callable[[str], int] | None:
    try:
        import warnings

        import bpe_openai

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            bundled = bpe_openai.get_encoding("cl100k_base")
        return _bundled_counter(bundled)
    except Exception:  # not installed: try a cached tiktoken encoding
        pass
    cache_dir = os.environ.get("TIKTOKEN_CACHE_DIR") or os.environ.get("DATA_GYM_CACHE_DIR")
    if cache_dir is None:
        import tempfile  # here: the exact counter is loaded at most once, when asked for

        cache_dir = os.path.join(tempfile.gettempdir(), "data-gym-cache")
    cached = os.path.join(cache_dir, hashlib.sha1(_ENCODING_URL.encode()).hexdigest())
    if not os.path.exists(cached):
        return None
    try:
        import tiktoken

        encoding = tiktoken.get_encoding("cl100k_base")
    except Exception:  # a broken cache or missing package: fall back to the estimate
        return None
    return lambda text: len(encoding.encode(text))


#: Text every backend counter must count as ``encode`` does before it is trusted.
_PROBE = "Reason: 'max_price' must be > 0 \u2014 \u00fcn\u00efcode \u6f22\u5b57 \U0001f600\n  {x}"


def _bundled_counter(bundled: Any) -> Callable[[str], int]:
    """``len(bundled.encode(text))``, counted by the Rust backend where that is the same.

    ``encode`` spends most of a failure message's count around the backend: it compiles a
    special-token regex, times itself and builds a result object on every call.  Text that
    cannot hold a special token (they all start ``<|``) is counted by the backend's own
    ``count``; anything else (special tokens, lone surrogates, absurd lengths) by ``encode``,
    which raises or sanitises exactly as before.
    """
    encode = bundled.encode

    def slow(text: str) -> int:
        return len(encode(text))

    backend_count: Callable[[str], int] = getattr(getattr(bundled, "_backend", None), "count",
                                                  None) or slow
    check: Callable[[int], object] | None = getattr(bundled, "_check_chunk_limit", None)
    try:
        trusted = backend_count is not slow and check is not None and \
            backend_count(_PROBE) == slow(_PROBE) and backend_count("") == slow("")
    except Exception:  # noqa: BLE001 - another version of the package: encode as before
        trusted = False
    if not trusted or check is None:
        return slow

    def fast(text: str) -> int:
        if "<|" in text or len(text) >= 100_000:
            return slow(text)
        try:
            tokens: int = backend_count(text)
        except Exception:  # noqa: BLE001 - lone surrogates: encode sanitises them
            return slow(text)
        check(tokens)  # the package's own limit, raised as encode raises it
        return tokens

    return fast


def count_tokens(text: str) -> int:
    """Tokens in ``text``: exact with a cached tiktoken encoding, else :func:`estimate_tokens`."""
    counter = _tiktoken_counter()
    return counter(text) if counter is not None else estimate_tokens(text)


def token_counter_name() -> str:
    """Which counter :func:`count_tokens` uses here, for reports."""
    return "cl100k_base" if _tiktoken_counter() is not None else "estimate"


def resolve_tokenizer(tokenizer: Tokenizer) -> Callable[[str], int]:
    """The counter a guard uses, loaded now (at construction), never during a call.

    ``"auto"`` (the default) and ``"estimate"`` are the calibrated estimate: a guard is built
    in microseconds and counts the same whatever else the process loaded; ``"exact"`` loads
    the cl100k_base vocabulary here (``toolfault[tokens]``; once per process, a second or
    more) and refuses when it is missing; a callable is yours (an encoding your application
    already loaded: ``lambda text: len(enc.encode(text))``).  Nothing is loaded during a call.
    """
    if callable(tokenizer):
        return tokenizer
    if tokenizer == "auto":
        return estimate_remembering
    if tokenizer == "estimate":
        return estimate_remembering
    if tokenizer == "exact":
        counter = _tiktoken_counter()
        if counter is None:
            from toolfault._errors import ConfigurationError

            raise ConfigurationError("tokenizer='exact' needs the cl100k_base vocabulary: "
                                     "pip install 'toolfault[tokens]'")
        return counter
    from toolfault._errors import ConfigurationError

    raise ConfigurationError("tokenizer must be 'estimate', 'exact' or a callable")


def tokenizer_name(counter: Callable[[str], int]) -> str:
    """How reports name a counter: ``estimate``, ``cl100k_base`` or the callable's name."""
    if counter is estimate_tokens or counter is estimate_remembering:
        return "estimate"
    if counter is _tiktoken_counter():
        return "cl100k_base"
    return getattr(counter, "__name__", "custom")
