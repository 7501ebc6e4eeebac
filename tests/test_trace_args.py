"""A call line's arguments and clocks: the redacted arguments, written by the one renderer."""

from __future__ import annotations

import io
import json
from typing import Any

from hypothesis import assume, given, settings
from hypothesis import strategies as st

from toolfault import Guard
from toolfault._redact import Redactor

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


def _traced_args(args: Any, secrets: list[str]) -> tuple[str, Any]:
    """The trace line of one call with ``args`` (dict or JSON text), and its arguments."""
    out = io.StringIO()
    guard = Guard(trace=out, scan_env_secrets=False, secrets=secrets)
    guard.tool(name="anything", schema={"type": "object"})(lambda **kw: "ok")
    guard.call("anything", args)
    guard.close()
    line = out.getvalue().splitlines()[0]
    return line, json.loads(line)["args"]


@settings(max_examples=200, deadline=None)
@given(args=st.dictionaries(_keys | _words, _values, max_size=4), numeric=st.booleans(),
       as_text=st.booleans())
def test_the_line_holds_the_redacted_arguments_and_no_secret(
        args: dict[str, Any], numeric: bool, as_text: bool) -> None:
    """Sent as a dict or as JSON text, the line's arguments are the redacted copy, and no
    secret in any form survives."""
    secrets = [_SECRET, "9000"] if numeric else [_SECRET]
    text = json.dumps(args)
    assume(not as_text or "Infinity" not in text)  # not JSON: the call is invalid_json
    line, traced = _traced_args(text if as_text else args, secrets)
    assert traced == _walked(Redactor(secrets, scan_env=False), args)
    assert _SECRET.lower() not in line.lower() and "abcdefghijklmnopqrstuv" not in line


def test_a_guard_traces_arguments_and_redacts_what_it_must() -> None:
    out = io.StringIO()
    guard = Guard(trace=out, scan_env_secrets=False, secrets=["tok_live_123456"])

    @guard.tool
    def charge(card: str, amount: int) -> str:
        return "charged"

    guard.call("charge", '{"card":"4242","amount":5}')
    guard.call("charge", '{"card":"tok_live_123456","amount":5}')
    guard.close()
    first, second = out.getvalue().splitlines()
    assert json.loads(first)["args"] == {"card": "4242", "amount": 5}
    assert json.loads(second)["args"] == {"card": "[REDACTED]", "amount": 5}
    assert "tok_live" not in second


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
    """A str subclass that compares equal to a plain key name: its value is hidden by the
    name it spells."""
    line, traced = _traced_args({_Disguised("password"): "hunter2-value"}, [])
    assert "hunter2-value" not in line and traced == {"password": "[REDACTED]"}
