"""What counts as "the same call".

A fingerprint hashes the tool name with a canonical serialisation of the arguments: sorted
keys, compact separators, integral floats as ints, NFC unicode.  Per-tool normalizers then
fold cosmetic differences (case, whitespace, trailing slashes, rounding) so a model that
rewords a string has not made a new call and cannot dodge the retry cap that way.
"""

from __future__ import annotations

import hashlib
import unicodedata
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from pydantic_core import to_json as _to_json

from toolfault._jsontext import prebuilt_encoder

Normalizer = Callable[[Any], Any]

_encode_canonical = prebuilt_encoder(sort_keys=True, separators=(",", ":"), allow_nan=False)

#: Arguments whose canonical form is larger than this are rejected as ``invalid_argument``.
MAX_CANONICAL_BYTES = 2_000_000


def _map_strings(value: Any, fn: Callable[[str], str]) -> Any:
    if isinstance(value, str):
        return fn(value)
    if isinstance(value, list):
        return [_map_strings(v, fn) for v in value]
    return value


def casefold(value: Any) -> Any:
    """Case-insensitive comparison for string values (and lists of strings)."""
    return _map_strings(value, str.casefold)


def collapse_whitespace(value: Any) -> Any:
    """Strip ends and collapse inner runs of whitespace to one space."""
    return _map_strings(value, lambda s: " ".join(s.split()))


def strip_trailing_slash(value: Any) -> Any:
    """``/a/b/`` and ``/a/b`` name the same path (the root ``/`` stays)."""
    return _map_strings(value, lambda s: s.rstrip("/") or s[:1])


def round_to(digits: int) -> Normalizer:
    """Numbers equal to ``digits`` decimals are the same tolerance."""

    def _round(value: Any) -> Any:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return value
        return round(float(value), digits)

    _round.__name__ = f"round_to({digits})"
    return _round


NORMALIZERS: Mapping[str, Normalizer] = {
    "casefold": casefold,
    "lower": casefold,
    "whitespace": collapse_whitespace,
    "strip": collapse_whitespace,
    "trailing_slash": strip_trailing_slash,
}

NormalizeSpec = Mapping[str, "str | Normalizer | Sequence[str | Normalizer]"]


def compile_normalizers(spec: NormalizeSpec | None) -> dict[str, tuple[Normalizer, ...]]:
    """Resolve ``normalize={"query": ["strip", "casefold"], "tol": round_to(2)}`` once per tool.

    The key ``"*"`` applies to every argument.  Names: casefold/lower, whitespace/strip,
    trailing_slash, ``round:N``.
    """
    out: dict[str, tuple[Normalizer, ...]] = {}
    for param, item in (spec or {}).items():
        items: Sequence[str | Normalizer]
        items = [item] if isinstance(item, str) or callable(item) else list(item)
        resolved: list[Normalizer] = []
        for one in items:
            if callable(one):
                resolved.append(one)
            elif one.startswith("round:"):
                resolved.append(round_to(int(one.split(":", 1)[1])))
            elif one in NORMALIZERS:
                resolved.append(NORMALIZERS[one])
            else:
                from toolfault._errors import ConfigurationError

                names = ", ".join(sorted(NORMALIZERS)) + ", round:N"
                raise ConfigurationError(f"unknown normalizer {one!r} for {param!r}; use {names}")
        out[param] = tuple(resolved)
    return out


def _nfc(text: str) -> str:
    return text if unicodedata.is_normalized("NFC", text) else unicodedata.normalize("NFC", text)


def _canonical(value: Any) -> Any:
    """``value`` as the canonical text encodes it (NFC strings, integral floats as ints, any
    mapping a dict with str keys, any sequence a list)."""
    walk = _CANONICAL_BY_TYPE.get(type(value))  # exact types first: no ABC checks
    return _canonical_subclass(value) if walk is None else walk(value)


def _as_it_is(value: Any) -> Any:
    """An int, bool or ``None``: canonical already."""
    return value


def _canonical_float(value: float) -> float | int:
    """``2.0`` is the same argument as ``2``."""
    return int(value) if value.is_integer() else value


def _canonical_key(key: Any) -> str:
    """A dict key as text, NFC (a str already NFC is kept without a copy)."""
    if type(key) is str and unicodedata.is_normalized("NFC", key):
        return key
    return _nfc(str(key))


def _canonical_dict(value: dict[Any, Any]) -> dict[str, Any]:
    """Keys as NFC text, values walked (the encoder sorts the keys)."""
    return {_canonical_key(k): _canonical(v) for k, v in value.items()}


def _canonical_list(value: list[Any] | tuple[Any, ...]) -> list[Any]:
    """A list or a tuple: the same JSON array, so the same call."""
    return [_canonical(v) for v in value]


_CANONICAL_BY_TYPE: dict[type, Callable[[Any], Any]] = {
    str: _nfc, int: _as_it_is, bool: _as_it_is, type(None): _as_it_is,
    float: _canonical_float, dict: _canonical_dict, list: _canonical_list,
    tuple: _canonical_list,
}


def _canonical_subclass(value: Any) -> Any:
    """Subclasses and other mappings and sequences (the uncommon path)."""
    if isinstance(value, str):
        return _nfc(value)
    if isinstance(value, float):
        return int(value) if value.is_integer() else value
    if isinstance(value, Mapping):
        return {_canonical(str(k)): _canonical(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_canonical(v) for v in value]
    return value


def canonical_args(
    args: Mapping[str, Any], normalizers: Mapping[str, Sequence[Normalizer]] | None = None
) -> str:
    """The canonical JSON text of ``args`` after per-argument normalizers.

    Raises ``ValueError`` for NaN/Infinity or unserialisable values and ``RecursionError`` for
    absurd nesting; the guard turns both into ``invalid_argument``.
    """
    if normalizers:
        every = normalizers.get("*", ())
        normalized: dict[str, Any] = {}
        for key, value in args.items():
            for fn in (*every, *normalizers.get(key, ())):
                value = fn(value)
            normalized[key] = value
        args = normalized
    if type(args) is dict:
        text = _already_canonical(args)
        if text is not None:
            return text
    return _encode_canonical(_canonical(args))


def _already_canonical(args: dict[str, Any]) -> str | None:
    """``args`` encoded directly, when that is already its canonical text (else ``None``).

    Most arguments are canonical as they come: string keys, NFC strings, no integral floats.
    Then the canonical walk would copy them unchanged, so the C encoder's text is checked
    instead of walked: any key that is not a str, any text that is not NFC and anything that
    could be an integral float (``.0`` or ``e+`` before a delimiter, even inside a string)
    sends the arguments down the walk.  A string that merely looks like one costs the walk,
    never a wrong answer.  (A ``"`` never composes with its neighbours, so the JSON text is
    NFC exactly when each of its strings is.)
    """
    for key in args:
        if type(key) is not str:
            return None
    try:
        text = _encode_canonical(args)
    except (ValueError, TypeError, RecursionError):
        return None  # the walk decides what is wrong, and says so
    if _integral_float_in(text) or (text.count("{") > 1 and not _nested_keys_are_str(args, 0)):
        return None
    return text if _nfc_text(text) else None


def _integral_float_in(text: str) -> bool:
    """Whether JSON text may hold a float with an integral value (``2.0``, ``1e+20``), which
    the canonical text writes as an int (a string that merely looks like one included)."""
    return (".0" in text and (".0," in text or ".0]" in text or ".0}" in text)) or "e+" in text


def _nfc_text(text: str) -> bool:
    """Whether JSON text is NFC, as the canonical text is (ASCII is, without a look)."""
    return text.isascii() or unicodedata.is_normalized("NFC", text)


def _nested_keys_are_str(value: Any, depth: int) -> bool:
    """Every key of every nested dict is an exact ``str`` (top-level keys checked already)."""
    if depth > 100:
        return False
    kind = type(value)
    if kind is dict:
        items: Any = value.values()
        if depth and any(type(key) is not str for key in value):
            return False
    elif kind is list or kind is tuple:
        items = value
    else:
        return not isinstance(value, (Mapping, list, tuple))
    return all(_nested_keys_are_str(item, depth + 1) for item in items
               if type(item) not in _LEAVES)


_LEAVES = frozenset({str, int, float, bool, type(None)})


def fingerprint(
    tool: str,
    args: Mapping[str, Any],
    normalizers: Mapping[str, Sequence[Normalizer]] | None = None,
) -> str:
    """sha256 hex of ``tool`` and the canonical arguments: equal for cosmetically equal calls."""
    canonical = canonical_args(args, normalizers)
    if len(canonical) > MAX_CANONICAL_BYTES:
        raise ValueError(f"arguments are too large ({len(canonical)} characters)")
    digest = _started(tool)
    digest.update(canonical.encode())
    return digest.hexdigest()


def fingerprint_json_values(tool: str, args: dict[str, Any], *, in_order: bool = False) -> str:
    """:func:`fingerprint` of arguments made of JSON's own types only (exact ``dict``,
    ``list``, ``str``, ``int``, finite ``float``, ``bool``, ``None``, as a JSON parser makes
    them), without normalizers: the same hex, sooner.

    pydantic-core writes the sorted arguments (about a third of the standard encoder's time)
    where its text is the canonical text byte for byte: the same string escapes for every
    character, the same float spelling but below 1e-4 (``0.00001`` and ``1e-7`` where Python
    writes ``1e-05`` and ``1e-07``).  Anything else goes to :func:`fingerprint`: a nested
    object (its keys are not sorted here), an integral float, any float below 1e-4 and an
    infinity (a JSON parser makes one of ``1e400``; looked for in the text, so a string that
    merely looks like one costs the slow path, never a wrong hash), text that is not NFC,
    and what pydantic-core refuses (lone surrogates).  ``in_order``: the keys of ``args`` are
    in sorted order already.
    """
    try:
        raw = _to_json(args if in_order else {key: args[key] for key in sorted(args)})
    except (ValueError, TypeError):
        return fingerprint(tool, args)
    text = raw.decode()  # str searches are several times cheaper than bytes ones
    if len(raw) > MAX_CANONICAL_BYTES or _not_canonical(text) or not _nfc_text(text):
        return fingerprint(tool, args)
    digest = _started(tool)
    digest.update(raw)
    return digest.hexdigest()


def _not_canonical(text: str) -> bool:
    """Whether pydantic-core's text of sorted arguments may differ from the canonical text:
    a nested object (its keys unsorted), an infinity, an integral float or a float below 1e-4
    (``e-`` or ``0.0000``: spelt ``1e-7`` and ``0.00001``, not ``1e-07`` and ``1e-05``)."""
    return (text.find("{", 1) != -1 or "Infinity" in text or "e-" in text or "0.0000" in text
            or _integral_float_in(text))


#: sha256 of ``tool + "\0"`` per tool name: copying one costs less than a new hash.
_STARTS: dict[str, hashlib._Hash] = {}
_MAX_STARTS = 1024


def _started(tool: str) -> hashlib._Hash:
    """A sha256 that has hashed ``tool`` and the separator, ready for the arguments."""
    start = _STARTS.get(tool)
    if start is None:
        start = hashlib.sha256(tool.encode() + b"\x00")
        if len(_STARTS) < _MAX_STARTS:
            _STARTS[tool] = start
    return start.copy()
