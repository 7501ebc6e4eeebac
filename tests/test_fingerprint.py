"""Fingerprints: cosmetic differences collapse, meaningful ones do not."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from toolfault import ConfigurationError, canonical_args, fingerprint, round_to
from toolfault._fingerprint import compile_normalizers

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=20)
    | st.floats(allow_nan=False, allow_infinity=False),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                 max_size=4),
    max_leaves=20,
)


def test_canonical_form_sorts_keys_and_uses_compact_separators() -> None:
    """Keys are sorted and separators compact, so key order never changes the fingerprint."""
    assert canonical_args({"b": 1, "a": [1, 2]}) == '{"a":[1,2],"b":1}'
    assert fingerprint("t", {"b": 1, "a": 2}) == fingerprint("t", {"a": 2, "b": 1})


def test_integral_floats_are_ints_and_unicode_is_nfc() -> None:
    """5.0 equals 5 and a decomposed é equals the composed one."""
    assert fingerprint("t", {"n": 5.0}) == fingerprint("t", {"n": 5})
    assert fingerprint("t", {"n": 5.5}) != fingerprint("t", {"n": 5})
    assert fingerprint("t", {"city": "Cafe\u0301"}) == fingerprint("t", {"city": "Caf\u00e9"})


def test_tool_name_is_part_of_the_fingerprint() -> None:
    """The same arguments to another tool are another call."""
    assert fingerprint("a", {"x": 1}) != fingerprint("b", {"x": 1})


def test_normalizers_fold_cosmetic_rewording() -> None:
    """Case, whitespace, trailing slashes and rounding are folded per declared parameter."""
    norm = compile_normalizers({
        "query": ["whitespace", "casefold"], "path": "trailing_slash", "tol": round_to(2),
        "tags": "casefold",
    })
    a = {"query": "Cheap  Flights ", "path": "/data/in/", "tol": 0.1234, "tags": ["A", "b"]}
    b = {"query": "cheap flights", "path": "/data/in", "tol": 0.12, "tags": ["a", "B"]}
    assert fingerprint("s", a, norm) == fingerprint("s", b, norm)
    c = {**b, "query": "expensive flights"}
    assert fingerprint("s", c, norm) != fingerprint("s", b, norm)
    assert fingerprint("s", a) != fingerprint("s", b)


def test_star_normalizer_applies_to_every_argument() -> None:
    """The "*" key applies a normalizer to all arguments."""
    norm = compile_normalizers({"*": "casefold"})
    assert fingerprint("s", {"a": "X", "b": "Y"}, norm) == fingerprint("s", {"a": "x", "b": "y"},
                                                                       norm)


def test_unknown_normalizer_is_a_configuration_error() -> None:
    """A typo in normalize= fails at registration, not at call time."""
    with pytest.raises(ConfigurationError, match="unknown normalizer"):
        compile_normalizers({"q": "lowercase-ish"})
    assert compile_normalizers({"q": "round:1"})["q"][0](1.26) == 1.3


def test_nan_is_rejected() -> None:
    """NaN has no canonical form and is refused."""
    with pytest.raises(ValueError, match="Out of range float values"):
        fingerprint("t", {"x": float("nan")})


@given(st.dictionaries(st.text(max_size=8), json_values, max_size=6))
def test_fingerprint_ignores_key_order(args: dict[str, Any]) -> None:
    """Any permutation of the same keys gives the same fingerprint."""
    reversed_args = dict(reversed(list(args.items())))
    assert fingerprint("t", args) == fingerprint("t", reversed_args)


@given(st.dictionaries(st.text(min_size=1, max_size=8), json_values, min_size=1, max_size=6),
       st.data())
def test_changing_a_value_changes_the_fingerprint(args: dict[str, Any], data: Any) -> None:
    """Replacing one value with a different canonical value yields a different fingerprint."""
    key = data.draw(st.sampled_from(sorted(args)))
    new = data.draw(json_values)
    changed = {**args, key: new}
    if canonical_args(changed) != canonical_args(args):
        assert fingerprint("t", changed) != fingerprint("t", args)


_texts = st.text(max_size=6) | st.sampled_from(
    ["e\u0301", "\u0301", "\u0301a", '"', "\u00c5", "\u212b", "\u1100\u1161", "\u1161",
     "<\u0338", "1.0,", "e+", "{"])
_leaves = (st.none() | st.booleans() | st.integers() | _texts
           | st.floats(allow_nan=False, allow_infinity=False)
           | st.sampled_from([1.0, -0.0, 1e16, 1e22, 5e-324, 2.5]))
_odd_values = st.recursive(
    _leaves,
    lambda inner: st.lists(inner, max_size=4) | st.lists(inner, max_size=3).map(tuple)
    | st.dictionaries(_texts | st.integers() | st.booleans(), inner, max_size=4),
    max_leaves=20,
)


def _walked(args: Any) -> Any:
    """The canonical text by the full walk, or the type of what it raised."""
    from toolfault._fingerprint import _canonical, _encode_canonical

    try:
        return _encode_canonical(_canonical(args))
    except (ValueError, TypeError, RecursionError) as exc:
        return type(exc)


@settings(max_examples=1500, deadline=None)
@given(st.dictionaries(_texts, _odd_values, max_size=6))
def test_arguments_encoded_directly_give_the_walks_canonical_text(args: dict[str, Any]) -> None:
    """The direct encoding of already-canonical arguments is exactly the walk's text, for
    unicode (NFC or not, combining marks at string edges), integral floats, bools and ints,
    non-string keys and nested values; anything else falls back to the walk."""
    try:
        got: Any = canonical_args(args)
    except (ValueError, TypeError, RecursionError) as exc:
        got = type(exc)
    assert got == _walked(args)


@pytest.mark.parametrize("args", [
    {"n": 5.0}, {"n": [1e16]}, {"n": {"m": -0.0}}, {"d": {1: "a"}}, {"d": {True: "a"}},
    {"d": [{None: 1}]}, {"s": "Cafe\u0301"}, {"Cafe\u0301": 1}, {"s": "v1.0, v2.0"},
])
def test_arguments_that_are_not_canonical_as_given_take_the_walk(args: dict[str, Any]) -> None:
    """Integral floats, non-string keys and non-NFC text are never encoded as given."""
    from toolfault._fingerprint import _already_canonical

    assert _already_canonical(args) is None
    assert canonical_args(args) == _walked(args)


def test_plain_arguments_are_encoded_directly() -> None:
    """A tool's usual arguments (ASCII or NFC text, ints, fractional floats, lists, nested
    objects with string keys) skip the walk and still give the canonical text."""
    from toolfault._fingerprint import _already_canonical

    args = {"origin": "Z\u00fcrich", "max_stops": 1, "max_price": 420.5,
            "airlines": ["UA", "AA"], "filter": {"cabin": "economy", "ok": True, "n": None}}
    assert _already_canonical(args) == _walked(args)


@settings(max_examples=500, deadline=None)
@given(st.dictionaries(_texts, _odd_values, max_size=6))
def test_a_fingerprint_hashes_the_walks_canonical_text(args: dict[str, Any]) -> None:
    """fingerprint() of a plain dict (which skips canonical_args) hashes exactly the walk's
    canonical text, and refuses what the walk refuses."""
    import hashlib

    walked = _walked(args)
    if isinstance(walked, str):
        expected = hashlib.sha256(f"t\x00{walked}".encode()).hexdigest()
        assert fingerprint("t", args) == expected
    else:
        with pytest.raises((ValueError, TypeError, RecursionError)):
            fingerprint("t", args)


_json_leaves = (st.none() | st.booleans() | st.integers() | _texts | st.text(max_size=6)
                | st.floats(allow_nan=False, allow_infinity=False)
                | st.sampled_from([1.0, -0.0, 0.0, 1e16, 1e22, 5e-324, 2.5, 1e-5, 9.99e-5,
                                   1e-4, 0.00012, 1.5e15, 123456789012345.6, -1e-7]))
_json_values = st.recursive(
    _json_leaves,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_texts, inner, max_size=4),
    max_leaves=20,
)


@settings(max_examples=2000, deadline=None)
@given(st.dictionaries(_texts | st.text(max_size=6), _json_values, max_size=6))
def test_json_values_get_the_fingerprint_of_the_walk(args: dict[str, Any]) -> None:
    """fingerprint_json_values (pydantic-core's encoder, for JSON's own types) gives exactly
    fingerprint()'s hex: control characters and every escape, tiny and huge floats, integral
    floats, NFC or not, nested objects, surrogates; it raises where fingerprint() raises."""
    from toolfault._fingerprint import fingerprint_json_values

    try:
        expected: Any = fingerprint("t", args)
    except (ValueError, TypeError, RecursionError) as exc:
        expected = type(exc)
    try:
        got: Any = fingerprint_json_values("t", args)
    except (ValueError, TypeError, RecursionError) as exc:
        got = type(exc)
    assert got == expected


def test_json_values_as_a_model_sends_them_take_the_fast_encoder() -> None:
    """The usual arguments are written by pydantic-core (no fall-back to the walk)."""
    from unittest import mock

    import toolfault._fingerprint as fp_module

    args = {"origin": "SFO", "max_stops": 1, "max_price": 420.5, "airlines": ["UA", "AA"],
            "cabin": "economy", "note": "Zürich"}
    with mock.patch.object(fp_module, "fingerprint", side_effect=AssertionError("slow path")):
        got = fp_module.fingerprint_json_values("search_flights", args)
    assert got == fingerprint("search_flights", args)


def test_an_infinity_a_json_parser_made_is_refused_as_by_the_walk() -> None:
    """``1e400`` parses to infinity: both fingerprints refuse it (ValueError)."""
    from pydantic_core import from_json

    from toolfault._fingerprint import fingerprint_json_values

    args = from_json('{"x": 1e400, "y": [-1e400]}', allow_inf_nan=False)
    with pytest.raises(ValueError, match="JSON compliant"):
        fingerprint("t", args)
    with pytest.raises(ValueError, match="JSON compliant"):
        fingerprint_json_values("t", args)
