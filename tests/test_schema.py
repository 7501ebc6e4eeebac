"""The strict twin of a tool's validator (``_schema._plain_schema``): where it accepts
arguments, the guard validates once and defers the fingerprint; it must accept only plain
JSON values and return exactly what the tool's own validator returns."""

from __future__ import annotations

import enum
import math
from typing import Annotated, Any, Literal

import pydantic
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import AfterValidator, Field

from toolfault import Guard
from toolfault._call import _Call
from toolfault._fingerprint import fingerprint, fingerprint_json_values
from toolfault._pipeline import Pipeline


def _rich(origin: str, stops: int, price: Annotated[float, Field(ge=0)], tags: list[str],
          weights: list[float], cabin: Literal["economy", "first"] = "economy",
          note: str | None = None, direct: bool = False, rank: Literal[1, 2] = 1) -> str:
    return "ok"


def _guard() -> Guard:
    guard = Guard(scan_env_secrets=False)
    guard.tool(_rich)
    return guard


class _Text(str):
    pass


_odd = st.one_of(  # what a caller's code may pass where JSON has no such value
    st.binary(max_size=4), st.decimals(allow_nan=False, places=2, max_value=10**6),
    st.builds(_Text, st.text(max_size=4)), st.none(), st.booleans(),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=4))
_ints = st.one_of(st.integers(min_value=-(2**60), max_value=2**60),
                  st.sampled_from([2**53, 2**53 + 1, 2**60, -(2**60), 2**63]))
_numbers = st.one_of(_ints, st.floats(allow_nan=False, allow_infinity=False))


def _mostly(valid: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """Valid values three times in four, so whole argument sets are often valid."""
    return st.one_of(valid, valid, valid, _odd)


_args = st.fixed_dictionaries(
    {"origin": _mostly(st.text(max_size=8)),
     "stops": _mostly(_ints),
     "price": _mostly(_numbers),
     "tags": _mostly(st.one_of(st.lists(_mostly(st.text(max_size=4)), max_size=3),
                               st.tuples(st.text(max_size=4)))),
     "weights": _mostly(st.lists(_mostly(_numbers), max_size=3))},
    optional={"cabin": _mostly(st.sampled_from(["economy", "first", "coach"])),
              "note": _mostly(st.one_of(st.none(), st.text(max_size=4))),
              "direct": _mostly(st.booleans()),
              "rank": _mostly(st.sampled_from([1, 2, 3, 1.0])),
              "extra": _odd})


def _typed(value: Any) -> Any:
    """A value with every type spelled out (``1 == 1.0 == True`` would hide a difference)."""
    if isinstance(value, list):
        return ("list", [_typed(item) for item in value])
    return (type(value).__name__, repr(value))


@settings(max_examples=1500, deadline=None)
@given(_args)
def test_the_strict_twin_accepts_only_what_the_validator_accepts_and_returns_the_same(
        args: dict[str, Any]) -> None:
    spec = _guard()._shared.tools["_rich"]
    assert spec.plain_validate is not None and spec.fast_validate is not None
    try:
        strict = spec.plain_validate(args)
    except pydantic.ValidationError:
        return  # undecided: the usual path validates these
    usual = spec.fast_validate(args)
    assert {k: _typed(v) for k, v in strict.items()} == {k: _typed(v) for k, v in usual.items()}
    # What it accepts are plain JSON values: the deferred fingerprint is the usual one.
    assert fingerprint_json_values("_rich", args) == fingerprint("_rich", args)
    for value in args.values():
        assert type(value) in (str, _Text, int, float, bool, type(None), list)
        for item in value if type(value) is list else [value]:
            assert type(item) in (str, _Text, int, float, bool, type(None))
            assert not (isinstance(item, float) and not math.isfinite(item))


_valid_args = st.fixed_dictionaries(
    {"origin": st.text(max_size=8), "stops": st.integers(-5, 5),
     "price": st.one_of(st.integers(0, 10**6), st.floats(0, 1e6)),
     "tags": st.lists(st.text(max_size=4), max_size=3),
     "weights": st.lists(st.floats(-1, 1), max_size=3)},
    optional={"cabin": st.sampled_from(["economy", "first"]), "note": st.none(),
              "direct": st.booleans(), "rank": st.sampled_from([1, 2])})
_keys = st.one_of(st.sampled_from(["origin", "stops", "cabin", "extra", "Origin", "origin "]),
                  st.builds(_Text, st.sampled_from(["origin", "extra"])), st.integers(0, 2))


@settings(max_examples=1000, deadline=None)
@given(st.one_of(_args, _valid_args, _valid_args),
       st.one_of(st.just({}), st.dictionaries(_keys, st.one_of(_odd, st.just("economy")),
                                              max_size=2)),
       st.sets(st.sampled_from(["origin", "stops", "cabin", "note"]), max_size=1))
def test_the_open_twin_with_its_count_decides_as_the_strict_twin(
        args: dict[str, Any], more: dict[Any, Any], dropped: set[str]) -> None:
    """The pipeline validates dict arguments with the twin that ignores unknown keys and
    compares counts (``Pipeline._validated_plain``): it must take exactly the arguments the
    strict twin takes (extra keys, str subclass and non-str keys, missing parameters), and
    give the tool the same values."""
    spec = _guard()._shared.tools["_rich"]
    assert spec.plain_validate is not None
    sent = {k: v for k, v in {**args, **more}.items() if k not in dropped}
    call = _Call(None, "_rich", sent, "call_1", 0.0)
    took = Pipeline._validated_plain(call, spec, sent)
    try:
        strict = spec.plain_validate(sent)
    except pydantic.ValidationError:
        assert not took and not call.validated
        return
    assert took and call.validated
    assert {k: _typed(v) for k, v in call.kwargs.items()} == \
        {k: _typed(v) for k, v in strict.items()}


def test_a_key_that_is_no_parameter_is_named_whichever_twin_saw_it() -> None:
    """The open twin drops an unknown key; the guard still refuses the call and names it."""
    guard = _guard()
    args = {"origin": "SFO", "stops": 0, "price": 1.5, "tags": [], "weights": [],
            "airline": "UA"}
    result = guard.call("_rich", args)
    assert not result.ok and result.code == "invalid_argument"
    assert "airline is not a parameter of _rich" in result.text


def test_an_int_sent_for_a_float_stays_an_int_and_bounds_still_apply() -> None:
    guard = _guard()
    spec = guard._shared.tools["_rich"]
    assert spec.plain_validate is not None
    base = {"origin": "SFO", "stops": 0, "tags": [], "weights": [1, 0.5]}
    kept = spec.plain_validate({**base, "price": 420})
    assert type(kept["price"]) is int and [type(w) for w in kept["weights"]] == [int, float]
    # Beyond 2**53 whether a float holds an int exactly depends on the int: undecided.
    for refused in (-1, True, float("nan"), "420", 2**60, 2**53 + 1, 1e300):
        with pytest.raises(pydantic.ValidationError):
            spec.plain_validate({**base, "price": refused})
    # Refused by the twin is not refused by the guard: the usual validation decides.
    assert guard.call("_rich", {**base, "price": "420"}).ok
    assert guard.call("_rich", {**base, "price": 2**60}).ok
    assert guard.call("_rich", {**base, "price": -1}).code == "invalid_argument"


def test_long_text_is_left_to_the_usual_validation() -> None:
    guard = _guard()
    spec = guard._shared.tools["_rich"]
    assert spec.plain_validate is not None
    long_args = {"origin": "x" * 300_000, "stops": 0, "price": 1.5, "tags": ["y" * 200],
                 "weights": []}
    with pytest.raises(pydantic.ValidationError):
        spec.plain_validate(long_args)
    assert guard.call("_rich", long_args).ok
    with pytest.raises(pydantic.ValidationError):
        spec.plain_validate({**long_args, "origin": "x", "tags": ["t"] * 1001})


class _Cabin(enum.Enum):
    ECONOMY = "economy"


def test_no_twin_where_a_parameter_could_hold_more_than_plain_json() -> None:
    guard = Guard(scan_env_secrets=False)

    @guard.tool
    def anything(blob: Any) -> str:
        return "ok"

    @guard.tool
    def checked(name: Annotated[str, AfterValidator(str.upper)]) -> str:
        return name

    @guard.tool
    def open_ended(name: str, **extra: Any) -> str:
        return name

    @guard.tool
    def nested(rows: list[dict[str, int]]) -> str:
        return "ok"

    @guard.tool
    def by_enum(cabin: _Cabin) -> str:
        return cabin.value

    @guard.tool
    def plain(name: str, count: int = 1) -> str:
        return name

    @guard.tool(normalize={"name": "casefold"})
    def normalized(name: str) -> str:
        return name

    twins = {name: spec.plain_validate is not None for name, spec in guard._shared.tools.items()}
    assert twins == {"anything": False, "checked": False, "open_ended": False,
                     "nested": False, "by_enum": False, "plain": True, "normalized": False}
    assert guard.call("checked", {"name": "ada"}).text == "ADA"
    assert guard.call("by_enum", {"cabin": "economy"}).text == "economy"


@pytest.mark.parametrize("price", [0, 1, 7, 2**53 - 1, 2**53, 2**53 + 1, 2**60, -(2**60), 2**64,
                                   0.5, 420.5, 1e16, 2.0**53, 1e300, 5e-324])
def test_numbers_at_the_edges_are_the_validators_own_or_left_to_it(price: Any) -> None:
    spec = _guard()._shared.tools["_rich"]
    assert spec.plain_validate is not None and spec.fast_validate is not None
    args = {"origin": "SFO", "stops": 0, "tags": [], "weights": [price], "price": price}
    try:
        strict = spec.plain_validate(args)
    except pydantic.ValidationError:
        return
    usual = spec.fast_validate(args)
    assert _typed(strict["price"]) == _typed(usual["price"])
    assert _typed(strict["weights"]) == _typed(usual["weights"])


_json_args = st.fixed_dictionaries(
    {"origin": _mostly(st.text(max_size=8)),
     "stops": _mostly(_ints),
     "price": _mostly(_numbers),
     "tags": _mostly(st.lists(_mostly(st.text(max_size=4)), max_size=3)),
     "weights": _mostly(st.lists(_mostly(_numbers), max_size=3))},
    optional={"cabin": _mostly(st.sampled_from(["economy", "first", "coach"])),
              "note": _mostly(st.one_of(st.none(), st.text(max_size=4))),
              "rank": _mostly(st.sampled_from([1, 2, 3, 1.0])), "extra": _odd})


@settings(max_examples=1500, deadline=None)
@given(_json_args, st.booleans())
def test_json_text_the_twin_takes_is_what_parsing_then_validating_gives(
        args: dict[str, Any], spaced: bool) -> None:
    """Arguments as the model sends them: where the twin validates the text in one pass, the
    values (and the tool's) are those of parsing the text and validating the result."""
    import json

    spec = _guard()._shared.tools["_rich"]
    assert spec.plain_validate_json is not None and spec.fast_validate is not None
    try:
        text = json.dumps(args, default=repr, separators=(", ", ": ") if spaced else (",", ":"))
    except ValueError:
        return
    try:
        strict = spec.plain_validate_json(text)
    except pydantic.ValidationError:
        return
    parsed = json.loads(text)
    usual = spec.fast_validate(parsed)
    assert {k: _typed(v) for k, v in strict.items()} == {k: _typed(v) for k, v in usual.items()}
    assert list(strict) == sorted(strict)  # what the deferred fingerprint relies on
    assert fingerprint_json_values("_rich", strict, in_order=True) == fingerprint("_rich", parsed)


def test_a_tool_changing_its_list_never_changes_the_call() -> None:
    """The guard keeps the arguments it validated from JSON text: the tool gets its own lists,
    so identical failing calls keep one fingerprint and reach the cap together."""
    guard = Guard(scan_env_secrets=False)
    seen: list[list[str]] = []

    @guard.tool
    def tag(names: list[str], label: str) -> str:
        names.append("added by the tool")
        seen.append(names)
        raise ValueError("the label is not known")

    text = '{"names": ["a", "b"], "label": "x"}'
    first, second = guard.call("tag", text), guard.call("tag", text)
    assert spec_took_the_text(guard, "tag", text)
    assert seen == [["a", "b", "added by the tool"]] * 2
    assert first.fingerprint == second.fingerprint == fingerprint(
        "tag", {"names": ["a", "b"], "label": "x"})
    assert first.failure is not None and second.failure is not None
    assert not first.failure.terminal and second.failure.terminal  # the cap counted both


def spec_took_the_text(guard: Guard, name: str, text: str) -> bool:
    """Whether the tool's twin validates ``text`` (so the test runs the path it means to)."""
    validate = guard._shared.tools[name].plain_validate_json
    return validate is not None and validate(text) == {"names": ["a", "b"], "label": "x"}


def test_the_strict_twin_takes_no_decimal_where_a_float_is_declared() -> None:
    """pydantic-core's strict float takes a ``Decimal`` from Python; the twin must not (a
    Decimal is no JSON value, so its fingerprint is decided the usual way)."""
    from decimal import Decimal

    spec = _guard()._shared.tools["_rich"]
    assert spec.plain_validate is not None
    valid = {"origin": "SFO", "stops": 1, "price": 10.5, "tags": [], "weights": [0.5]}
    assert spec.plain_validate(valid)["price"] == 10.5
    for odd in ({**valid, "price": Decimal("0.00")}, {**valid, "weights": [Decimal("1.5")]}):
        with pytest.raises(pydantic.ValidationError):
            spec.plain_validate(odd)
