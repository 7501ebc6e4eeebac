"""Shaping: a failure's words are the same however few passes make them."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from toolfault import Redactor, ToolResult
from toolfault._call import _Call
from toolfault._catalog import Catalog
from toolfault._classify import from_entry
from toolfault._limits import Limits
from toolfault._message import fit_to_budget
from toolfault._settings import Scope, Settings
from toolfault._shaping import _PAIR, Shaper, _prose_pair
from toolfault._tokens import estimate_tokens
from toolfault._tool import build_spec

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


# -- the seal: a four-part message redacted by its pieces --------------------------------
#: What render_error writes between a message's parts: a credential the one pass over the
#: whole text finds across a join takes some of these in.
_JOINS = (" failed (code: ", ").\nReason: ", "\nRejected arguments: ", ".\nEffect: ",
          "\nNext action: ")
#: Shapes the pieces below may assemble, some only in a text of 16 characters or more, some
#: encoded, split or completed by a join ("eyJ….x." + "Rejected" reads as a JWT).
_SEAL_PIECES = st.sampled_from([
    "max_price", " must be ", "greater than 0", "/srv/app/data.db", SECRET, "s3cr3t",
    "-Value-9000", "token=", "token=abcd1234", "token%3D", "%3D", "x", "Bearer", " bearer ",
    "abcdefghijklmnop", "sk-", "sk-abcdefghijklmnopqrstu", "-----BEGIN PRIVATE KEY-----",
    "eyJ", "eyJhbGciOiJI", ".", "payload1", "\n", "\r\n", " ", "\\n", "\\u003d", "\\", "0",
    "c2stcHJvai1hYmNkZWZnaGlqa2xtbm9wcXJzdHV2", "QUtJQUlPU0ZPRE5ON0VYQU1QTEU=", "==",
    "736b2d70726f6a2d6162636465666768696a6b6c6d6e6f", "AKIA", "IOSFODNN7EXAMPLE", "ghp_",
    "postgres://app:", "pw", "@db/app", "Reason:", "Rejected", "SFO", "é", "\x00", ":",
])
_SEAL_TEXTS = st.lists(_SEAL_PIECES, max_size=6).map("".join)


def _shaper(redactor: Redactor, tool: str) -> tuple[Shaper, Settings, _Call]:
    """A shaper on the default catalog and one call of ``tool``, as a guard wires them."""
    def search(note: str, password: str, items: list[str]) -> None:
        """Search."""

    spec = build_spec(search, name=tool, description=None, alternatives=(), normalize=None,
                      schema=None, cost=1.0, side_effect=False, postcondition=None,
                      timeout=None, idempotency_key=None, check_with=None, retry_limit=None,
                      error_result=None)
    settings = Settings(limits=Limits(), catalog=Catalog.default(), deadline=None,
                        isolate_sync_tools=False, count_tokens=estimate_tokens,
                        capture_content=False, error_result=None, idempotency_retention=60.0)
    shaper = Shaper(settings, Scope("task-1", "enforce"), {tool: spec}, redactor)
    return shaper, settings, _Call(spec, tool, {}, "call-1", 0.0)


def _one_pass_seal(settings: Settings, redactor: Redactor, result: ToolResult
                   ) -> tuple[str, Any, str]:
    """The seal as it was: one pass of ``secrets`` over the whole text."""
    text, data = redactor.secrets(result.text), redactor.value(result.data)
    text, data = fit_to_budget(text, data, settings.catalog.token_budget,
                               settings.count_tokens)
    return text, data, redactor.secrets(result.tool)


@settings(max_examples=700, deadline=None)
@given(tool=st.sampled_from(["search_flights", "Bearer", "sk-abcdefghijklmnopqrstu", "x", SECRET]),
       code=st.sampled_from(["invalid_argument", "not_found", "rate_limited", "conflict"]),
       reason=_SEAL_TEXTS, said=_SEAL_TEXTS | st.none(), note=_SEAL_TEXTS,
       password=_SEAL_TEXTS, items=st.lists(_SEAL_TEXTS, max_size=3),
       retry_after=st.none() | st.sampled_from([2.0, 9000.0, 0.5]),
       registered=st.sampled_from([(), (SECRET,), (SECRET, "9000")]))
def test_the_seal_redacts_a_message_by_its_pieces_as_one_pass_over_its_text(
        tool: str, code: str, reason: str, said: str | None, note: str, password: str,
        items: list[str], retry_after: float | None, registered: tuple[str, ...]) -> None:
    """A first-time failure's sealed message reads exactly as one pass over its whole text
    would make it, wherever that pass left the message's own words whole.  Where it did not
    (a shape or a registered secret completed by those words), no part of the message and
    nothing across its parts holds a secret: with the words between the parts replaced by a
    join no shape crosses (a quote between spaces), the whole text passes clean."""
    redactor = Redactor(registered, scan_env=False)
    shaper, shaping, call = _shaper(redactor, tool)
    call.args = {"note": note, "password": password, "items": items}
    failure = from_entry(Catalog.default().get(code), reason, next_action=said,
                         retry_after=retry_after)
    result = shaper.four_part(call, failure)
    sealed = shaper.seal(result)
    text, data, name = _one_pass_seal(shaping, redactor, result)
    assert sealed.tool == name
    if all(join in text for join in _JOINS):
        assert (sealed.text, sealed.data) == (text, data)
        return
    neutral = sealed.text
    for join in _JOINS:
        neutral = neutral.replace(join, ' " ')
    assert redactor.secrets(neutral) == neutral
