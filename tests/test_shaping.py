"""Shaping: a failure's words are the same however few passes make them."""

from __future__ import annotations

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

