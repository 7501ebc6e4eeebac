"""A call line's arguments and clocks: written as sent when that is as safe as the walk."""

from __future__ import annotations

import io
import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from toolfault import Guard
from toolfault._redact import Redactor
from toolfault._trace import args_json, micros

_SECRET = "s3cr3t-Value-9000"
_words = st.sampled_from(["", "SFO", _SECRET, _SECRET.upper(), "sk-proj-abcdefghijklmnopqrstuv",
                          "token=abc123", 'q"uote', "Bearer\tabcdefgh", "caf\u00e9", "\u0130x",
                          "\u03a3\u03a3", "a\nb", "{", "[", "x\\y", "9000"])
_scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | _words
_values = st.recursive(_scalars, lambda inner: st.lists(inner, max_size=3)
                       | st.dictionaries(_words, inner, max_size=2), max_leaves=6)
_keys = st.sampled_from(["q", "note", "password", "api_key", "max_tokens", _SECRET, "pin"])


def _walked(redactor: Redactor, args: dict[str, Any]) -> Any:
    return json.loads(json.dumps(redactor.value(args), ensure_ascii=False, default=str))


@settings(max_examples=300, deadline=None)
@given(args=st.dictionaries(_keys | _words, _values, max_size=4),
       separators=st.sampled_from([(", ", ": "), (",", ":"), (" , ", " :\t")]),
       numeric=st.booleans())
def test_the_line_holds_what_the_walk_would_whichever_text_it_takes(
        args: dict[str, Any], separators: tuple[str, str], numeric: bool) -> None:
    """Sent text, the arguments' own text or the walk: the line's arguments parse to the
    redacted copy, and no secret in any form survives."""
    redactor = Redactor([_SECRET, "9000"] if numeric else [_SECRET], scan_env=False)
    for sent in (json.dumps(args, separators=separators), json.dumps(args, indent=1),
                 json.dumps(args, ensure_ascii=False), None):
        text = args_json(redactor, args, sent)
        assert "\n" not in text
        assert json.loads(text) == _walked(redactor, args)
        assert _SECRET.lower() not in text.lower() and "abcdefghijklmnopqrstuv" not in text


def test_clean_text_as_sent_is_written_as_sent() -> None:
    """Compact text from a model is the line's text, spacing and number spelling kept."""
    redactor = Redactor(["s3cr3t-Value-9000"], scan_env=False)
    sent = '{"origin":"SFO","stops":[1,2],"price":4.20e2}'
    assert args_json(redactor, json.loads(sent), sent) == sent
    assert args_json(redactor, json.loads(sent), None) == \
        '{"origin": "SFO", "stops": [1, 2], "price": 420.0}'


def test_text_a_secret_could_hide_in_is_walked() -> None:
    """An escaped secret, a secret-named key, a number spelling a numeric secret, a nested
    object and a line break all send the arguments through the walk."""
    redactor = Redactor(["s3cr3t-Value-9000", "12345"], scan_env=False)
    cases = {
        '{"q": "\\u0073\\u0033cr3t-Value-9000"}': {"q": "[REDACTED]"},
        '{"password": "hunter22"}': {"password": "[REDACTED]"},
        '{"n": 1.2345e4}': {"n": "[REDACTED]"},
        '{"a": {"token": "x1"}}': {"a": {"token": "[REDACTED]"}},
        '{"q":\n"sk-proj-abcdefghijklmnopqrstuv"}': {"q": "[REDACTED]"},
    }
    for sent, expected in cases.items():
        text = args_json(redactor, json.loads(sent), sent)
        assert text != sent and json.loads(text) == expected


def test_a_guard_traces_json_text_as_sent_and_redacts_what_it_must() -> None:
    out = io.StringIO()
    guard = Guard(trace=out, scan_env_secrets=False, secrets=["tok_live_123456"])

    @guard.tool
    def charge(card: str, amount: int) -> str:
        return "charged"

    guard.call("charge", '{"card":"4242","amount":5}')
    guard.call("charge", '{"card":"tok_live_123456","amount":5}')
    guard.close()
    first, second = out.getvalue().splitlines()
    assert '"args": {"card":"4242","amount":5}, ' in first
    assert json.loads(second)["args"] == {"card": "[REDACTED]", "amount": 5}
    assert "tok_live" not in second


@given(st.integers(min_value=-(10**15), max_value=10**15))
def test_microseconds_are_written_as_the_float_they_make(count: int) -> None:
    """``micros`` writes a JSON number equal to ``count / 1e6``, to six decimals."""
    text = micros(count)
    assert json.loads(text) == count / 1e6
    assert len(text.partition(".")[2]) == 6


def test_the_clocks_of_a_line_are_microseconds() -> None:
    out = io.StringIO()
    seen: list[Any] = []
    for observers in ([], [seen.append]):
        guard = Guard(trace=out, observers=observers, scan_env_secrets=False)

        @guard.tool
        def echo(n: int) -> int:
            return n

        guard.call("echo", {"n": 1})
        guard.close()
    for line in out.getvalue().splitlines():
        record = json.loads(line)
        for field in ("at", "duration_s"):
            assert round(record[field], 6) == record[field]
    assert seen[0].at == round(seen[0].at, 6) and seen[0].duration_s == round(
        seen[0].duration_s, 6)


class _Disguised(str):
    """A key spelt ``password`` that hashes and compares as ``q`` (only code can build one)."""

    def __hash__(self) -> int:
        return hash("q")

    def __eq__(self, other: object) -> bool:
        return other == "q" or str.__eq__(self, other)

    def __ne__(self, other: object) -> bool:
        return not self.__eq__(other)


def test_a_key_that_passes_for_a_plain_name_is_still_hidden_by_its_own() -> None:
    """The memory of plain key names is not fooled by a str subclass that compares equal to
    one: its value is hidden by the name it spells, as the walk hides it."""
    redactor = Redactor([], scan_env=False)
    assert json.loads(args_json(redactor, {"q": "flights"}, None)) == {"q": "flights"}
    line = args_json(redactor, {_Disguised("password"): "hunter2-value"}, None)
    assert "hunter2-value" not in line and json.loads(line) == {"password": "[REDACTED]"}
