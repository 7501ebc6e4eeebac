"""Classifying what a tool raised: the exception's own words only where they are the operation's."""

from __future__ import annotations

import pytest

from toolfault import Catalog
from toolfault._classify import _INFRA_TEXT, _infra_text, from_exception

_TEXTS = [
    "max_price must be greater than 0", "", "   ", "origin must be one of SFO, LAX",
    "failed running SELECT * FROM users WHERE name = 'bob'", "select * from users",
    "  with recursive t as (values 1) select 1", "WITH x", "insert into orders (id) values (1)",
    "could not UPDATE accounts SET balance = 0", "update t set x = 1", "delete from t",
    "the rows from the table where it failed", "from accounts where id = 4",
    'Traceback (most recent call last):\n  File "/srv/app.py", line 3', 'File "x.py"',
    "DROP TABLE users", "Merge conflict", "cannot alter the deal", "TRUNCATE it",
    "ſelect * from users", "SELECT * FROM t WHERE x = 'ü'", "\u212aey from where",
    "İnsert ınto t", "values for the origin", "create the user first",
]


@pytest.mark.parametrize("text", _TEXTS)
def test_the_literal_gate_never_changes_the_verdict(text: str) -> None:
    """The cheap word gate in front of the infrastructure regex decides as the regex does."""
    assert _infra_text(text) == (_INFRA_TEXT.search(text) is not None)


def test_an_exception_in_the_operations_words_is_its_reason() -> None:
    failure = from_exception(ValueError("max_price must be greater than 0"), Catalog.default(),
                             tool="search", side_effect=False)
    assert failure.code == "invalid_argument"
    assert failure.reason == "max_price must be greater than 0"


def test_an_exception_in_the_infrastructures_words_is_not_repeated() -> None:
    failure = from_exception(ValueError("failed running select * from users"),
                             Catalog.default(), tool="search", side_effect=False)
    assert failure.code == "invalid_argument"
    assert "select" not in failure.reason.lower()
