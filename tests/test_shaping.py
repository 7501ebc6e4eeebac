"""Shaping: a failure's words are the same however few passes make them."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from toolfault import Redactor
from toolfault._shaping import _PAIR, _prose_pair

SECRET = "s3cr3t-Value-9000"
_PIECES = st.sampled_from([
    "max_price", " must be ", "greater than 0", "/srv/app/data.db", "db1.internal:5432",
    "SELECT * FROM users WHERE id = 1", "select * from t", "insert into", "delete from",
    "update t set", "https://example.com/x?y=1", "10.0.0.1", "::1", "fe80::1", "C:\\x\\y",
    "~/notes.txt", "a.b.example.com", SECRET, "s3cr3t", "-Value-9000", "token=abcd1234",
    "Bearer", " bearer ", "abcdefghijklmnop", "sk-", "sk-abcdefghijklmnopqrstu",
    "-----BEGIN PRIVATE KEY-----", "-----END PRIVATE KEY-----", "eyJ", "\n", " ", ".", ":",
    "\x00", "0", "12", "SFO", "ſelect * from t", "ınsert into t", "é", "\u212a", "e",
    "call search again", "/", "\\n", "WITH", "FROM",
])
_TEXTS = st.lists(_PIECES, max_size=8).map("".join)
_ALLOW = st.lists(_PIECES | st.text(max_size=5), max_size=4)


@settings(max_examples=600, deadline=None)
@given(reason=_TEXTS, said=_TEXTS, allow=_ALLOW)
def test_one_prose_pass_gives_the_words_of_two(reason: str, said: str,
                                                allow: list[str]) -> None:
    """Reason and next action redacted together read exactly as redacted apart."""
    redactor = Redactor([SECRET], scan_env=False)
    apart = (redactor.prose(reason, allow=allow), redactor.prose(said, allow=allow))
    assert _prose_pair(redactor, reason, said, allow) == apart


def test_a_redaction_that_swallows_the_join_falls_back_to_two_passes() -> None:
    """A private key runs to the end of its text: the next action keeps its own words."""
    redactor = Redactor(scan_env=False)
    reason, said = _prose_pair(redactor, "-----BEGIN PRIVATE KEY-----abc", "call it again", [])
    assert said == "call it again" and "abc" not in reason
    assert _PAIR not in reason + said



# -- a success's text ------------------------------------------------------------------
def _success_text(value: object) -> str:
    from toolfault import Guard

    guard = Guard(scan_env_secrets=False)

    @guard.tool
    def give() -> object:
        """Return the value under test."""
        return value

    result = guard.call("give", {})
    assert result.ok, result.text
    return result.text


def test_a_success_is_compact_json_that_parses_back_to_the_value() -> None:
    value = {"origin": "SFO", "price": 420.5, "tiny": 1e-7, "huge": 10**30, "stops": [0, 1],
             "name": "Zürich ✈", "ok": True, "none": None, "line": "a\nb\t\"q\""}
    text = _success_text(value)
    assert ", " not in text.replace("\", \"", "") and "\": " not in text
    assert json.loads(text) == value


def test_values_json_lacks_are_written_readably() -> None:
    import dataclasses
    import datetime
    import enum

    from pydantic import BaseModel

    class Cabin(enum.Enum):
        ECONOMY = "economy"

    @dataclasses.dataclass
    class Seat:
        row: int

    class Fare(BaseModel):
        amount: float

    class Opaque:
        def __str__(self) -> str:
            return "opaque thing"

    text = _success_text({"cabin": Cabin.ECONOMY, "seat": Seat(3), "fare": Fare(amount=9.5),
                          "at": datetime.date(2026, 12, 4), "tags": ("a", "b"),
                          "thing": Opaque()})
    assert json.loads(text) == {"cabin": "economy", "seat": {"row": 3}, "fare": {"amount": 9.5},
                                "at": "2026-12-04", "tags": ["a", "b"], "thing": "opaque thing"}


def test_what_the_fast_encoder_refuses_is_still_answered() -> None:
    """Lone surrogates, cycles and absurd depth: pydantic-core refuses them; the standard
    library's encoder (or the value's ``str``) answers, and the call still succeeds."""
    assert json.loads(_success_text({"s": "\ud800x"})) == {"s": "\ud800x"}
    cyclic: list[object] = []
    cyclic.append(cyclic)
    assert _success_text(cyclic) == "[[...]]"
    deep: list[object] = []
    node = deep
    for _ in range(5000):
        node.append([])
        node = node[0]  # type: ignore[assignment]
    assert _success_text(deep).startswith("[[[[")  # a bounded sketch, not a crash


def test_a_model_result_keeps_its_field_names() -> None:
    """A pydantic model is written by field name (as ``model_dump(mode="json")``), not alias."""
    from pydantic import BaseModel, Field

    class Flight(BaseModel):
        flight_no: str = Field(alias="flightNo")

    assert json.loads(_success_text(Flight(flightNo="UA1"))) == {"flight_no": "UA1"}
