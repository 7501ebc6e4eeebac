"""Token counting: exact with the shipped vocabulary, a slightly high estimate without."""

from __future__ import annotations

from typing import Any

import pytest

from toolfault import Catalog, _tokens, count_tokens
from toolfault._tokens import estimate_tokens, token_counter_name
from toolfault_cli._docs import example_message
from toolfault_cli._lint import lint_catalog


def test_exact_counter_is_used_when_the_vocabulary_is_installed() -> None:
    """With bpe-openai (a test extra) the counter is cl100k_base and counts exactly."""
    assert token_counter_name() == "cl100k_base"
    assert count_tokens("search_flights failed (code: invalid_argument).") == 10


def test_estimate_stays_close_above_the_exact_count() -> None:
    """On every catalog message the estimate is at least the exact count and at most 35% over."""
    catalog = Catalog.default()
    for entry in catalog:
        message = example_message(catalog, entry)
        exact, estimate = count_tokens(message), estimate_tokens(message)
        assert exact <= estimate <= exact * 1.35, (entry.code, exact, estimate)


def test_lint_passes_on_the_builtin_catalog_without_a_vocabulary(monkeypatch: Any) -> None:
    """A fresh install without toolfault[tokens] still passes its own catalog lint."""
    monkeypatch.setattr(_tokens, "_tiktoken_counter", lambda: None)
    assert token_counter_name() == "estimate"
    assert lint_catalog(Catalog.default()) == []


@pytest.mark.parametrize("text", ["Ünïcödé テキスト 中文字符", "{}[]()", "12345678901234"])
def test_estimate_counts_every_kind_of_character(text: str) -> None:
    """Non-ASCII characters, punctuation and digits all cost tokens in the estimate."""
    assert estimate_tokens(text) >= count_tokens(text) * 0.9


@pytest.mark.parametrize("reason", [
    "x" * 5_000, "字" * 3_000, "🙂" * 2_000, "é" * 4_000, "- " * 3_000,
    "the quantity must be " + "very " * 800 + "small",
])
def test_every_failure_message_fits_the_token_budget(reason: str) -> None:
    """Very long reasons, next actions and arguments (repeated characters, CJK, emoji) are
    cut with an ellipsis: the message stays near the catalog's token budget (the code and
    the next action are kept whole up to twice the budget; past that every line is cut)."""
    from toolfault import Guard, ToolError

    guard = Guard(scan_env_secrets=False)

    @guard.tool
    def order(item: str, qty: int) -> str:
        raise ToolError("invalid_argument", reason, next_action=reason)

    @guard.tool
    def crash(item: str) -> str:
        raise ValueError(reason)

    budget = guard.catalog.token_budget
    for name, args in (("order", {"item": reason, "qty": 1}), ("crash", {"item": reason}),
                       ("crash", {reason[:500]: reason}), (reason[:300], {"a": reason})):
        for _ in range(3):  # the terminal message too
            result = guard.call(name, args)
            assert count_tokens(result.text) <= 2 * budget, result.text
            assert result.text.count("\n") >= 2
        guard.new_turn()
    cut = guard.call("order", {"item": "a", "qty": 1})
    assert "…" in cut.text and cut.data["detail"].endswith("….")


def test_a_guard_counts_with_the_tokenizer_it_was_given() -> None:
    """A custom counter decides the budget: one that counts every character cuts harder."""
    from toolfault import ConfigurationError, Guard

    def per_char(text: str) -> int:
        return len(text)

    plain = Guard(scan_env_secrets=False)
    strict = Guard(scan_env_secrets=False, tokenizer=per_char)
    for guard in (plain, strict):

        @guard.tool
        def lookup(query: str) -> str:
            raise ValueError("no match for " + query)

    long = {"query": "word " * 40}
    assert strict.count_tokens is per_char
    assert len(strict.call("lookup", long).text) < len(plain.call("lookup", long).text)
    with pytest.raises(ConfigurationError):
        Guard(scan_env_secrets=False, tokenizer="nonsense")  # type: ignore[arg-type]


def test_the_estimate_never_undercounts_any_script() -> None:
    """Per character, the estimate is at least cl100k_base's count in every UTF-8 width."""
    from toolfault._tokens import _tiktoken_counter

    exact = _tiktoken_counter()
    if exact is None:
        pytest.skip("no cl100k_base vocabulary here")
    for text in ("🙂" * 20, "中文測試資料" * 5, "é" * 20, "привет мир " * 5, "𝔘𝔫𝔦" * 7,
                 "ሀሁሂ" * 7, "한국어 텍스트" * 4, "مرحبا بالعالم" * 3, "١٢٣٤٥٦" * 4):
        assert estimate_tokens(text) >= exact(text), text


def test_a_guard_counts_one_message_once() -> None:
    """The resolved counter remembers its last answer: the same text is tokenized once."""
    from toolfault._tokens import Remembering

    seen: list[str] = []

    def counting(text: str) -> int:
        seen.append(text)
        return len(text.split())

    counter = Remembering(counting, "words")
    seen.clear()
    message = "search_flights failed (code: invalid_argument)."
    assert counter(message) == counter(message) == counter(str(message)) == 4
    assert counter("two words") == 2
    assert seen == [message, "two words"]
    assert counter.__name__ == "words"


def test_resolved_counters_remember_and_keep_their_names() -> None:
    """'estimate', 'auto' and 'exact' give remembering counters that reports name correctly;
    'auto' is the estimate (a guard never loads a vocabulary unless asked)."""
    from toolfault._tokens import resolve_tokenizer, tokenizer_name

    estimate = resolve_tokenizer("estimate")
    assert tokenizer_name(estimate) == "estimate"
    assert estimate("a b c") == estimate_tokens("a b c")
    assert resolve_tokenizer("auto") is estimate
    exact = resolve_tokenizer("exact")
    assert tokenizer_name(exact) == "cl100k_base"
    assert exact("search_flights failed (code: invalid_argument).") == 10


def test_fit_and_count_reports_the_tokens_of_the_text_it_returns() -> None:
    """The count handed on is that of the final (possibly cut) message, so no recount."""
    from toolfault._errors import Outcome
    from toolfault._message import fit_and_count, render_error

    rendered = render_error(tool="t", code="invalid_argument", reason="word " * 80,
                            args_text="{}", outcome=Outcome.NO_EFFECT, retryable=False,
                            retry_after=None, next_action="change q")
    for budget in (1_000, 60):
        text, problem, tokens = fit_and_count(rendered.text, rendered.problem, budget,
                                              estimate_tokens)
        assert tokens == estimate_tokens(text) and tokens <= budget
        assert problem["detail"].rstrip(".") in text


_COUNTED = [
    "", "x", "search_flights failed (code: invalid_argument).\nReason: max_price must be > 0.",
    "Ünïcödé テキスト 中文字符 😀😀 " * 20, "   \n\n\t  trailing   ", "'s 're 've 'll 'd",
    "1234567",
    '{"origin": "SFO", "max_stops": 1, "airlines": ["UA", "AA"]}' * 30,
    "lone \ud800 surrogate", "<|not special|> but close", "a" * 5_000,
]


@pytest.mark.parametrize("text", _COUNTED)
def test_the_backend_count_is_what_encode_counts(text: str) -> None:
    """The exact counter asks the tokenizer's backend directly: the same number encode's
    length gives, on every kind of text (surrogates and would-be special tokens included)."""
    bpe_openai = pytest.importorskip("bpe_openai")
    bundled = bpe_openai.get_encoding("cl100k_base")
    assert _tokens._bundled_counter(bundled)(text) == len(bundled.encode(text))


def test_a_special_token_is_refused_as_encode_refuses_it() -> None:
    """Text holding a special token goes through encode, which raises as it always did."""
    bpe_openai = pytest.importorskip("bpe_openai")
    bundled = bpe_openai.get_encoding("cl100k_base")
    counter = _tokens._bundled_counter(bundled)
    with pytest.raises(Exception, match="endoftext") as raised:
        bundled.encode("stop <|endoftext|> here")
    with pytest.raises(type(raised.value)):
        counter("stop <|endoftext|> here")


def test_a_backend_that_disagrees_is_not_trusted() -> None:
    """Another version of the package whose backend counts differently: encode is used."""

    class Backend:
        def count(self, text: str) -> int:
            return 1

    class Bundled:
        _backend = Backend()

        def encode(self, text: str) -> list[int]:
            return list(range(len(text)))

        def _check_chunk_limit(self, tokens: int) -> None:
            return None

    assert _tokens._bundled_counter(Bundled())("abcd") == 4


def _estimate_piece_by_piece(text: str) -> int:
    """The estimate as first defined: one scan, each piece priced by its first character
    (the ASCII pieces' sum calibrated, the others by their UTF-8 bytes)."""
    import math
    import re

    from toolfault._tokens import CALIBRATION

    total, wide = 0, 0
    pieces = re.findall(r"[A-Za-z]+|[0-9]{1,3}|[^\x00-\x7f]|[^\sA-Za-z0-9\x80-\U0010ffff]+", text)
    for piece in pieces:
        first = piece[0]
        if first.isascii() and first.isalpha():
            regular = piece.islower() or piece.isupper() or piece.istitle()
            total += max(1, math.ceil(len(piece) / (6 if regular else 2)))
        elif first.isascii() and not first.isdigit():
            total += max(1, math.ceil(len(piece) / 2))
        elif first.isascii():
            total += 1
        else:
            wide += len(piece.encode("utf-8", "surrogatepass"))
    return math.ceil(total * CALIBRATION) + wide


def test_the_estimate_is_the_piece_by_piece_count() -> None:
    """Scanning each kind of piece on its own gives the count of one scan over all of them."""
    import random

    rnd = random.Random(7)
    alphabet = "aZ09 _-.,;:!?\t\n\x1c\x1f\x7f\x00\x85\xa0é漢😀\ud800{}[]\"'abcXYZ123"
    texts = ["".join(rnd.choice(alphabet) for _ in range(rnd.randint(0, 40)))
             for _ in range(3_000)]
    texts.append(example_message(Catalog.default(), Catalog.default().get("invalid_argument")))
    for text in texts:
        assert estimate_tokens(text) == _estimate_piece_by_piece(text), repr(text)


def test_the_cut_keeps_the_code_the_named_argument_and_the_next_action() -> None:
    """Over budget, the arguments the reason names stay (the others become an ellipsis) and
    the first line and the next action are never cut."""
    from toolfault._message import fit_to_budget

    text = ("search_flights failed (code: invalid_argument).\n"
            "Reason: max_price should be greater than 0.\n"
            'Rejected arguments: {"origin": "SFO", "destination": "JFK", "max_price": -1}.\n'
            "Effect: none. Retrying the same call will not help.\n"
            "Next action: call search_flights again with max_price as an integer greater "
            "than 0, or call search_flights_any_price if no budget constraint applies.")
    for budget in (50, 70, 85):
        cut, problem = fit_to_budget(text, {"rejected_arguments": "x"}, budget, count_tokens)
        lines = cut.splitlines()
        assert lines[0] == text.splitlines()[0] and lines[-1] == text.splitlines()[-1]
        assert lines[2] == 'Rejected arguments: {"max_price": -1, …}.'
        assert problem["rejected_arguments"] == '{"max_price": -1, …}'


def test_punctuation_runs_are_the_ascii_that_is_not_space_letter_or_digit() -> None:
    """The estimate's punctuation class, spelt as ASCII ranges, holds exactly the characters
    the readable definition names, over every code point."""
    import re

    readable = re.compile(r"[^\sA-Za-z0-9\x80-\U0010ffff]")
    wrong = [hex(c) for c in range(0x110000)
             if bool(readable.match(chr(c))) != bool(_tokens._PUNCTUATION.match(chr(c)))]
    assert wrong == []
