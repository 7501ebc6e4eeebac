"""The failure message's echoed arguments: one walk, the same words as redact-then-shrink."""

from __future__ import annotations

import math
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from toolfault import Redactor
from toolfault._errors import Outcome
from toolfault._message import (
    _encode_echo,
    _shrink,
    echo_args,
    parts_of,
    redacted_echo,
    render_error,
    render_terminal,
)

SECRET = "s3cr3t-Value-9000"


class _Key(str):
    """A str subclass: never answered from the redactor's memory."""


class _Shown:
    def __repr__(self) -> str:
        return f"<shown {SECRET} at /srv/app/x.py>"


_KEYS = st.sampled_from(["origin", "q", "password", "api_key", "token", "max_tokens", "a", "b",
                         "sk-abcdefghijklmnopqrstuvwx", "sk-zyxwvutsrqponmlkjihgfedc", SECRET,
                         "author", "nested", "1"]) | st.integers(-3, 3) | st.text(max_size=6)
_LEAVES = (st.none() | st.booleans() | st.integers() | st.floats()
           | st.text(max_size=80) | st.sampled_from([SECRET, "hunter2hunter2", "x" * 70,
                                                     "/etc/app/conf.yaml", _Key("sub"),
                                                     _Key(SECRET), b"bytes " + SECRET.encode(),
                                                     _Shown(), 10**20, -0.0]))
_VALUES = st.recursive(
    _LEAVES,
    lambda inner: (st.lists(inner, max_size=11) | st.lists(inner, max_size=3).map(tuple)
                   | st.dictionaries(_KEYS, inner, max_size=11)),
    max_leaves=40,
)


def _reference(args: dict[Any, Any], redactor: Redactor) -> tuple[str, set[str]]:
    """The three walks the one walk replaces: redact, shrink, look for hidden values."""
    return _encode_echo(_shrink(redactor.value(args))), redactor.hidden_values(args)


@settings(max_examples=400, deadline=None)
@given(args=st.dictionaries(_KEYS, _VALUES, max_size=12))
def test_one_walk_matches_redact_then_shrink(args: dict[Any, Any]) -> None:
    """Echo and hidden values equal what redacting, shrinking and searching separately give."""
    redactor = Redactor([SECRET], scan_env=False)
    assert redacted_echo(args, redactor) == _reference(args, redactor)


def test_collapsed_keys_and_members_past_the_eighth_still_hide_their_values() -> None:
    """Values under secret names are found in members the echo leaves out."""
    redactor = Redactor([SECRET], scan_env=False)
    args: dict[Any, Any] = {f"k{i}": i for i in range(10)}
    args["extra"] = {"password": "hidden-beyond-eight"}
    args["sk-abcdefghijklmnopqrstuvwx"] = {"secret": "collapsed-away-1"}
    args["sk-zyxwvutsrqponmlkjihgfedc"] = 1
    text, hidden = redacted_echo(args, redactor)
    assert {"hidden-beyond-eight", "collapsed-away-1"} <= hidden
    assert text is not None and "+4 more keys" in text
    assert (text, hidden) == _reference(args, redactor)


def test_deep_members_are_cut_but_searched() -> None:
    """Past depth four a member is shown as an ellipsis; its secrets are still hidden."""
    redactor = Redactor(scan_env=False)
    args = {"a": {"b": {"c": {"d": {"e": {"pin": "98765"}}}}}, "l": [[[[["x"]]]]]}
    text, hidden = redacted_echo(args, redactor)
    assert text == '{"a": {"b": {"c": {"d": "{…}"}}}, "l": [[[["…"]]]]}'
    assert hidden == {"98765"}


def test_unencodable_numbers_take_the_slow_path() -> None:
    """An int too long to print gives no text, so the caller echoes the old way."""
    redactor = Redactor(scan_env=False)
    text, _ = redacted_echo({"n": 10**5000}, redactor)
    assert text is None


def test_floats_echo_as_the_model_can_read_them() -> None:
    """NaN and infinities are words in the echo, not invalid JSON."""
    assert echo_args({"a": math.nan, "b": -math.inf, "c": 1.5}) == \
        '{"a": "NaN", "b": "-Infinity", "c": 1.5}'


_WORDS = st.text(max_size=12)


@settings(max_examples=300, deadline=None)
@given(tool=_WORDS, code=_WORDS, reason=_WORDS, args_text=_WORDS, next_action=_WORDS,
       outcome=st.sampled_from(list(Outcome)), retryable=st.booleans(),
       retry_after=st.none() | st.floats(0, 1e6) | st.integers(0, 10**9))
def test_a_rendered_problem_gives_back_the_parts_of_its_text(
        tool: str, code: str, reason: str, args_text: str, next_action: str, outcome: Outcome,
        retryable: bool, retry_after: float | None) -> None:
    """The seal reads a message's parts back from its problem: joined, they are its text."""
    rendered = render_error(tool=tool, code=code, reason=reason, args_text=args_text,
                            outcome=outcome, retryable=retryable, retry_after=retry_after,
                            next_action=next_action)
    parts = parts_of(rendered.problem)
    assert parts is not None and parts.text() == rendered.text


def test_a_problem_render_error_did_not_make_gives_no_parts() -> None:
    """The terminal message, a changed field or a foreign value: no parts, no four-part text."""
    terminal = render_terminal(tool="t", code="c", count=3, moves=[], args_text="{}")
    problem = render_error(tool="t", code="c", reason="r", args_text="{}",
                           outcome=Outcome.NO_EFFECT, retryable=False, retry_after=None,
                           next_action="n").problem
    assert parts_of(problem) is not None
    for changed in ({"effect": "maybe"}, {"tool": 1}, {"retryable": None},
                    {"retry_after": "soon"}, {"retry_after": True}):
        assert parts_of({**problem, **changed}) is None
    assert parts_of(terminal.problem) is None
    assert parts_of(["not", "a", "dict"]) is None
