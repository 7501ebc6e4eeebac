"""Secrets and internal identifiers never reach a model."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from toolfault import Guard, Limits, Redactor, ToolError
from toolfault._limits import Backoff

SECRET = "s3cr3t-Value-9000"
KEY_SHAPES = [
    "sk-proj-abcdefghijklmnopqrstuv",
    "AKIAIOSFODNN7EXAMPLE",
    "Bearer eyJhbGciOi.eyJzdWIiOiIx.SflKxwRJSMeKKF2QT4",
    "ghp_abcdefghijklmnopqrstuvwxyz0123",
]


def test_known_shapes_and_registered_values_are_redacted() -> None:
    """Registered values and key/token shapes are replaced everywhere in a string."""
    redactor = Redactor([SECRET], scan_env=False)
    text = " ".join([SECRET, *KEY_SHAPES, "api_key=abc123"])
    cleaned = redactor.secrets(text)
    for secret in [SECRET, *KEY_SHAPES, "abc123"]:
        assert secret not in cleaned
    assert cleaned.count("[REDACTED]") >= 5


def test_env_values_with_secret_names_are_redacted(monkeypatch: Any) -> None:
    """Values of secret-looking environment variables are treated as secrets."""
    monkeypatch.setenv("PAYMENTS_API_TOKEN", "tok-from-env-77")
    redactor = Redactor()
    assert "tok-from-env-77" not in redactor.secrets("using tok-from-env-77 now")


def test_prose_drops_paths_hosts_and_addresses_but_keeps_model_terms() -> None:
    """Internal paths/hosts/IPs go; a path the model itself passed stays."""
    redactor = Redactor(scan_env=False)
    text = "cannot open /srv/app/data.db on db1.internal (10.1.2.3:5432) for /home/ada/notes.txt"
    out = redactor.prose(text, allow=["/home/ada/notes.txt"])
    assert "/srv/app" not in out and "db1.internal" not in out and "10.1.2.3" not in out
    assert "/home/ada/notes.txt" in out


def test_secret_argument_names_are_redacted_in_rejected_arguments() -> None:
    """A password or api_key argument is echoed as [REDACTED], key order kept."""
    guard = Guard(scan_env_secrets=False)

    @guard.tool
    def login(user: str, password: str, api_key: str) -> str:
        raise ToolError("unauthenticated", "the password is wrong")

    result = guard.call("login", {"user": "ada", "password": "pw-123456", "api_key": "k-9999"})
    assert 'Rejected arguments: {"user": "ada", "password": "[REDACTED]", "api_key": ' \
        '"[REDACTED]"}' in result.text
    assert "pw-123456" not in json.dumps(result.data)


secret_text = st.sampled_from([SECRET, *KEY_SHAPES])
filler = st.text(alphabet=st.characters(codec="utf-8"), max_size=30)


@settings(max_examples=150, deadline=None)
@given(prefix=filler, secret=secret_text, suffix=filler, where=st.sampled_from(
    ["arg", "reason", "next_action", "raw", "return", "exception", "nested"]))
def test_no_secret_ever_appears_in_text(prefix: str, secret: str, suffix: str,
                                        where: str) -> None:
    """Wherever a registered or well-known secret hides, it never appears in result.text."""
    guard = Guard(secrets=[SECRET], limits=Limits(backoff=Backoff(attempts=1)),
                  scan_env_secrets=False)
    payload = f"{prefix}{secret}{suffix}"

    @guard.tool
    def tool(note: Any) -> Any:
        if where == "reason":
            raise ToolError("invalid_argument", f"bad note {payload}")
        if where == "next_action":
            raise ToolError("invalid_argument", "bad note", next_action=f"use {payload}")
        if where == "return":
            return {"echo": payload}
        if where == "exception":
            raise ValueError(payload)
        raise ToolError("conflict", "note rejected")

    args: Any = {"note": payload}
    if where == "raw":
        args = '{"note": ' + json.dumps(payload) + ", bad json"
    if where == "nested":
        args = {"note": {"deep": [payload, {"x": payload}]}}
    for _ in range(3):
        result = guard.call("tool", args)
        assert secret not in result.text
        assert secret not in json.dumps(result.data, default=str)


def test_env_style_assignments_and_escaped_secrets() -> None:
    """NAME=value secrets in any case and JSON-escaped registered secrets are removed."""
    redactor = Redactor(['pa"ss\\w0rd-XYZ'], scan_env=False)
    for text in ("SECRET=hunter2hunter2", "DB_PASSWORD=hunter2hunter2",
                 "OPENAI_API_KEY=abc123xyz", "client_secret=s3cr3t!"):
        assert "[REDACTED]" in redactor.secrets(text), text
    assert redactor.secrets("max_tokens=5") == "max_tokens=5"
    assert redactor.secrets('{"p": "pa\\"ss\\\\w0rd-XYZ"}') == '{"p": "[REDACTED]"}'


def test_secret_named_values_never_echo_in_prose_or_nested() -> None:
    """A password echoed by the tool's own reason, or a list under api_keys, is redacted."""
    guard = Guard(scan_env_secrets=False)

    @guard.tool
    def signup(user: str, password: str, api_keys: list[str], max_tokens: int) -> str:
        raise ToolError("invalid_argument", f"password {password} is too weak for {user}")

    result = guard.call("signup", {"user": "bob", "password": "hunter2hunter2",
                                   "api_keys": ["Zq81xLpQ0aa"], "max_tokens": 5})
    assert "hunter2hunter2" not in result.text and "Zq81xLpQ0aa" not in result.text
    assert "for bob" in result.text
    assert '"max_tokens": 5' in result.text


def test_more_infrastructure_shapes_are_removed_from_reasons() -> None:
    """host:port, FQDNs, IPv6, relative paths and SQL/traceback texts never reach the model."""
    guard = Guard(scan_env_secrets=False)
    texts = iter([
        "could not connect to db-replica-3.prod.acme.io:5432",
        "config file conf/prod/secrets.yaml is malformed",
        "upstream [fd00::12]:8443 refused",
        "SELECT * FROM users WHERE id = 5 failed",
    ])

    @guard.tool
    def op(n: int) -> str:
        raise ValueError(next(texts))

    for leak in ("acme.io", "conf/prod", "fd00", "SELECT"):
        assert leak not in guard.call("op", {"n": 1}).text
        guard.new_turn()


def test_registered_secrets_are_redacted_in_every_travelling_form() -> None:
    """Base64 (any alignment), URL-encoded, JSON-escaped (twice), case-folded and split-line
    forms of a registered secret are all replaced."""
    import base64
    import urllib.parse

    redactor = Redactor([SECRET], scan_env=False)
    forms = [
        base64.b64encode(SECRET.encode()).decode(),
        base64.b64encode(b"user:" + SECRET.encode()).decode(),
        base64.urlsafe_b64encode(b"xy" + SECRET.encode() + b"!").decode(),
        urllib.parse.quote(SECRET, safe=""), urllib.parse.quote_plus(SECRET).lower(),
        json.dumps(json.dumps(SECRET)), SECRET.upper(), SECRET.lower(),
        f"{SECRET[:4]}\n{SECRET[4:9]}\r\n    {SECRET[9:]}", f"{SECRET[:6]}\\n{SECRET[6:]}",
    ]
    for form in forms:
        cleaned = redactor.secrets(f"before {form} after")
        assert form not in cleaned and "[REDACTED]" in cleaned, form
        assert cleaned.startswith("before ") and cleaned.endswith(" after"), cleaned


def test_unknown_tool_names_and_bytes_arguments_are_redacted() -> None:
    """A secret in an unknown tool's name or in a bytes argument reaches no text or data."""
    guard = Guard(secrets=[SECRET], scan_env_secrets=False)

    @guard.tool
    def save(note: Any) -> str:
        raise ToolError("conflict", "note taken")

    for name, args in ((f"get_{SECRET}", {}), ("save", {"note": SECRET.encode()}),
                       ("save", {"note": [b"sk-proj-abcdefghijklmnopqrstuv"]})):
        result = guard.call(name, args)
        blob = result.text + result.tool + json.dumps(result.data, default=str)
        assert SECRET not in blob and "abcdefghijklmnopqrstuv" not in blob, blob


def test_sql_anywhere_in_a_reason_is_removed() -> None:
    """SQL in the middle of an exception or a ToolError reason never reaches the model."""
    guard = Guard(scan_env_secrets=False)
    texts = iter(["failed running SELECT * FROM users", "could not INSERT INTO orders (id)",
                  "query select * from accounts where id = 3 timed out"])

    @guard.tool
    def op(n: int) -> str:
        raise ValueError(next(texts))

    @guard.tool
    def op2(n: int) -> str:
        raise ToolError("invalid_argument", "bad n: UPDATE users SET name = 'x' failed")

    for _ in range(3):
        text = guard.call("op", {"n": 1}).text
        guard.new_turn()
        assert not any(w in text for w in ("SELECT", "INSERT", "select *", "users", "accounts"))
    text = guard.call("op2", {"n": 1}).text
    assert "UPDATE" not in text and "SET name" not in text
    assert "failed" in Redactor(scan_env=False).prose("please select a value from the list; failed")


def test_failures_log_one_quiet_line_without_traceback_or_arguments(caplog: Any) -> None:
    """A failing call logs one INFO line naming the tool and the exception type only."""
    import logging

    guard = Guard(secrets=[SECRET], scan_env_secrets=False)

    @guard.tool
    def boom(note: str) -> str:
        raise RuntimeError(f"exploded with {note} and {SECRET}")

    with caplog.at_level(logging.INFO, logger="toolfault"):
        guard.call("boom", {"note": "visible-arg-value"})
    records = [r for r in caplog.records if r.name == "toolfault"]
    assert len(records) == 1 and records[0].levelno == logging.INFO
    line = caplog.text
    assert "RuntimeError" in line and "Traceback" not in line
    assert "visible-arg-value" not in line and SECRET not in line


def test_tracebacks_when_asked_are_redacted(caplog: Any) -> None:
    """With the logger at DEBUG a traceback is kept, and secrets in it are still redacted."""
    import logging

    guard = Guard(secrets=[SECRET], scan_env_secrets=False)

    @guard.tool
    def boom(note: str) -> str:
        raise RuntimeError(f"exploded with {SECRET.upper()}")

    with caplog.at_level(logging.DEBUG, logger="toolfault"):
        guard.call("boom", {"note": "x"})
    assert "Traceback" in caplog.text and "RuntimeError" in caplog.text
    assert SECRET.upper() not in caplog.text


def test_ledger_and_store_hold_a_hash_not_the_idempotency_key(tmp_path: Any) -> None:
    """The idempotency key is a stable hash: the key fields' values are not in the ledger or
    the SQLite file."""
    from toolfault.stores import SQLiteStore

    db = tmp_path / "s.db"
    guard = Guard(store=SQLiteStore(db), scan_env_secrets=False)

    @guard.tool(side_effect=True, idempotency_key=["card"])
    def charge(card: str, amount: int) -> str:
        return "ok"

    assert guard.call("charge", {"card": "4111-1111-1111-1111", "amount": 5}).ok
    (entry,) = guard.ledger
    assert entry.idempotency_key is not None and "4111" not in entry.idempotency_key
    assert entry.idempotency_key.startswith("charge:") and len(entry.idempotency_key) == 39
    guard.close()


def test_trace_and_spans_carry_no_secret_in_any_form() -> None:
    """The JSONL trace and OTel span attributes of a call with an upper-cased secret in an
    unknown tool name and an argument hold no form of it."""
    import io

    out = io.StringIO()
    guard = Guard(secrets=[SECRET], scan_env_secrets=False, trace=out, capture_content=True)
    guard.call(f"x_{SECRET.upper()}", {"note": SECRET.lower()})
    assert SECRET.lower() not in out.getvalue().lower()


# -- the fast paths are exact: same answers as the full passes -------------------------------

def _full_prose(redactor: Redactor, text: str) -> str:
    """prose() without its literal gates: every internal pattern, always."""
    from toolfault._redact import INTERNAL_PATTERNS

    text = redactor.secrets(text)
    for pattern, word in INTERNAL_PATTERNS:
        text = pattern.sub(word, text)
    return text


_FRAGMENTS = st.sampled_from([
    "select * from users", "SELECT id FROM t", "ſelect * from t", "ınsert into t", "UPDATE x SET",
    "http://a.b/c", "db1.internal", "10.1.2.3:5432", "fe80::1", "C:\\temp\\x", "~/notes",
    "/srv/app/db", "a/b/c", "api.example.com", "v1.2", "Kelvin", "max_price", ". ", ":", "/",
    " ", "0", "token=abc", "Bearer abcdefgh", "é", "\n",
])


@settings(max_examples=300, deadline=None)
@given(parts=st.lists(_FRAGMENTS, max_size=8))
def test_prose_gates_never_skip_a_pattern_that_would_match(parts: list[str]) -> None:
    """The literal gates in prose() are conservative: the output equals the ungated pass."""
    redactor = Redactor(scan_env=False)
    text = "".join(parts)
    assert redactor.prose(text) == _full_prose(redactor, text)


def test_shortest_shape_is_the_patterns_true_minimum() -> None:
    """No credential shape can match fewer characters than the length skipped as clean."""
    import re

    from toolfault._redact import SECRET_PATTERNS, SHORTEST_SHAPE

    widths = [re._parser.parse(p.pattern, p.flags).getwidth()[0]  # type: ignore[attr-defined]
              for p in SECRET_PATTERNS]
    assert min(widths) == SHORTEST_SHAPE


def test_a_short_registered_secret_is_still_found() -> None:
    """A registered 4-character secret lowers the clean-length floor below the shapes'."""
    redactor = Redactor(["ab12"], scan_env=False)
    assert redactor.secrets("ab12") == "[REDACTED]"
    assert redactor.secrets("AB12") == "[REDACTED]"


def test_remembered_clean_strings_are_forgotten_when_a_secret_is_added() -> None:
    """A string found clean, then registered as a secret, is redacted from then on."""
    redactor = Redactor(scan_env=False)
    assert redactor.secrets("hunter22-pw") == "hunter22-pw"
    assert redactor.value({"note": "hunter22-pw"}) == {"note": "hunter22-pw"}
    redactor.add("hunter22-pw")
    assert redactor.secrets("hunter22-pw") == "[REDACTED]"
    assert redactor.value({"note": "hunter22-pw"}) == {"note": "[REDACTED]"}


def test_a_str_subclass_is_never_answered_from_memory() -> None:
    """A str subclass that claims equality with a clean string is still scanned."""

    class Liar(str):
        def __hash__(self) -> int:
            return hash("harmless text")

        def __eq__(self, other: object) -> bool:
            return True

    redactor = Redactor(["s3cr3t-Value"], scan_env=False)
    assert redactor.secrets("harmless text") == "harmless text"
    assert "s3cr3t" not in redactor.secrets(Liar("s3cr3t-Value"))


def test_value_and_hidden_values_keep_their_answers_on_nested_arguments() -> None:
    """Flat members are handled inline, nested ones recursively, with the same results."""
    redactor = Redactor(scan_env=False)
    args: dict[Any, Any] = {"q": "x", "n": 1, "ok": True, "none": None, "password": "pw-1234",
                            "pin": 1234, "tags": ["a", {"apiKey": ["k-1234", 5]}],
                            "nested": {"token": {"deep": "d-5678"}}, 3: "int key"}
    assert redactor.value(args) == {
        "q": "x", "n": 1, "ok": True, "none": None, "password": "[REDACTED]",
        "pin": "[REDACTED]", "tags": ["a", {"apiKey": ["[REDACTED]", "[REDACTED]"]}],
        "nested": {"token": {"deep": "[REDACTED]"}}, "3": "int key"}
    assert redactor.hidden_values(args) == {"pw-1234", "1234", "k-1234", "d-5678"}


def test_a_number_that_spells_a_registered_secret_is_redacted() -> None:
    """A registered PIN or card number given as a JSON number is redacted like a string
    (a JSON string in the trace, so the line stays valid); other numbers stay numbers."""
    redactor = Redactor(["4242424242424242", "2718"], scan_env=False)
    args = {"card": 4242424242424242, "n": [27182, 3.5], "amount": 12, "ok": True}
    assert redactor.value(args) == {"card": "[REDACTED]", "n": ["[REDACTED]", 3.5],
                                    "amount": 12, "ok": True}
    assert redactor.value(2718.5) == "[REDACTED]" and redactor.value(271) == 271
    assert Redactor(["Infinity"], scan_env=False).value(float("-inf")) == "[REDACTED]"


def test_a_secret_is_also_found_in_the_text_that_json_escapes_to_it() -> None:
    """A registered secret holding a JSON escape (``ab\\fcd``) is found in the string that
    JSON-escapes to it, so a field redacted before encoding never spells it in a JSON line."""
    redactor = Redactor(["ab\\fcdef"], scan_env=False)
    raw = "x ab\fcdef y"
    assert "ab\\fcdef" in json.dumps(raw)
    assert "ab\\fcdef" not in json.dumps(redactor.secrets(raw))


def test_the_skeleton_drops_the_same_whitespace_as_the_separator_pattern() -> None:
    """str.split's whitespace (the fast skeleton) is exactly the regex's \\s."""
    from toolfault._redact import _skeleton

    text = "".join(chr(c) for c in range(0x3100) if c != 0x5C) + " A\u2028b\u3000c"
    assert "\\" not in text
    # A trailing backslash escapes nothing but sends _skeleton down the regex: the reference.
    assert _skeleton(text) == _skeleton(text + "\\")[:-1]
    assert len(_skeleton(text)) < len(text) - 20


_SHAPE_PIECES = st.sampled_from([
    "sk-", "sk-proj-", "abcdefghijklmnopqrstuvwxyz", "AKIA", "ASIA", "IOSFODNN7EXAMPLE0123",
    "eyJ", "eyJhbGciOi", ".", "Bearer ", "bEaReR\t", "ghp_", "gho_", "ghu_", "ghs_", "ghr_",
    "gh", "hp_", "g", "xoxb-", "token=",
    "-----BEGIN RSA PRIVATE KEY-----", "_", "-", "=", "IA", " ", "x", "0",
])


@settings(max_examples=400, deadline=None)
@given(parts=st.lists(_SHAPE_PIECES, max_size=8))
def test_the_literal_gate_never_skips_a_credential_shape(parts: list[str]) -> None:
    """Whenever a credential shape matches, the cheap literal gate lets the text through."""
    from toolfault._redact import _ANY_SECRET, _may_hold_secret

    text = "".join(parts)
    if _ANY_SECRET.search(text):
        assert _may_hold_secret(text)


def test_short_registered_secrets_in_arguments_are_redacted_after_an_add() -> None:
    """Values shorter than every shape are skipped only while no registered form is as
    short: a four-character secret added later is caught in a mapping and a list alike."""
    from toolfault._redact import Redactor

    redactor = Redactor(scan_env=False)
    args = {"code": "9a8b", "codes": ["9a8b", "x"], "ok": "abc"}
    assert redactor.value(args) == args
    redactor.add("9a8b")
    assert redactor.value(args) == {"code": "[REDACTED]", "codes": ["[REDACTED]", "x"],
                                    "ok": "abc"}


def test_quoted_text_is_redacted_json_and_forgotten_when_a_secret_is_added() -> None:
    """``quoted`` is the JSON string of the redacted text; what it remembered is dropped by
    ``add``, so a name registered later is hidden from the next line on."""
    redactor = Redactor(scan_env=False)
    assert redactor.quoted('tab\t"q"') == json.dumps('tab\t"q"')
    assert redactor.quoted("orders-db-7") == '"orders-db-7"'
    assert redactor.quoted("orders-db-7") == '"orders-db-7"'  # from memory
    redactor.add("orders-db-7")
    assert redactor.quoted("orders-db-7") == '"[REDACTED]"'
    assert json.loads(redactor.quoted("key sk-" + "a" * 20)) == "key [REDACTED]"


# -- issue 28: every form out, ordinary words intact -------------------------------------

_ENCODED_FORMS = {
    "hex": lambda v: v.encode().hex(),
    "hex_upper": lambda v: v.encode().hex().upper(),
    "json_slash": lambda v: json.dumps(v)[1:-1].replace("/", "\\/"),
    "unicode_escaped": lambda v: "".join(f"\\u{ord(c):04x}" for c in v),
    "repr_of_json": lambda v: repr(json.dumps(v))[1:-1],
    "base64url": lambda v: __import__("base64").urlsafe_b64encode(v.encode()).decode(),
}


def test_a_registered_secret_is_found_in_hex_slash_escaped_unicode_escaped_and_repr_forms(
) -> None:
    """Hex (either case), JSON with \\/ escapes, all-\\uXXXX JSON and repr-doubled
    backslashes all spell the secret: each is redacted."""
    secret = 'pa"ss/w\\ord-7781'
    redactor = Redactor([secret], scan_env=False)
    for name, form in _ENCODED_FORMS.items():
        placed = form(secret)
        assert placed not in redactor.secrets(f"x {placed} y"), name


def test_a_json_escaped_secret_in_a_raise_from_chain_is_redacted_in_the_logs() -> None:
    """A KeyError's text is the repr of its argument (backslashes doubled): the chained
    traceback kept at DEBUG is still redacted."""
    import logging

    from toolfault._redact import LOG_FILTER

    secret = 'q"uote/Secret-4411'
    live = Redactor([secret], scan_env=False)  # the filter uses every live redactor
    escaped = json.dumps(secret)[1:-1]
    try:
        try:
            raise KeyError(f"note {escaped}")
        except KeyError as exc:
            raise RuntimeError("lookup failed") from exc
    except RuntimeError as exc:
        record = logging.LogRecord("toolfault", logging.DEBUG, __file__, 1, "failed", None,
                                   (type(exc), exc, exc.__traceback__))
    LOG_FILTER.tracebacks = True
    try:
        LOG_FILTER.filter(record)
    finally:
        LOG_FILTER.tracebacks = False
    assert live.secrets(secret) == "[REDACTED]"
    assert record.exc_text is not None and "KeyError" in record.exc_text
    for needle in (secret, escaped, escaped.replace("\\", "\\\\")):
        assert needle not in record.exc_text


@pytest.mark.parametrize("key", [
    "sk-proj-Mn4bVc7xZl2kJh9gFd5sAp0o", "AKIAZ7Q4LMNB2XCV8RT6",
    "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJzaGFwZSJ9.c2hhcGUtc2lnbmF0dXJl",
])
def test_an_unregistered_key_shape_is_found_encoded_or_split(key: str) -> None:
    """Nobody registered the key: base64, base64url, URL-encoding, hex, \\uXXXX and line
    splits (plain, JSON- or repr-escaped) still give it away by its shape."""
    import base64
    import urllib.parse

    third = len(key) // 3
    split = f"{key[:third]}\n{key[third:2 * third]}\r\n  {key[2 * third:]}"
    redactor = Redactor(scan_env=False)
    forms = [base64.b64encode(f"user:{key}".encode()).decode(),
             base64.urlsafe_b64encode(key.encode()).decode().rstrip("="),
             urllib.parse.quote(key, safe=""), key.encode().hex(),
             "".join(f"\\u{ord(c):04x}" for c in key), split, json.dumps(split)[1:-1],
             repr(json.dumps(split))[1:-1], "lookup_" + base64.urlsafe_b64encode(
                 key.encode()).decode().rstrip("=")]
    for placed in forms:
        out = redactor.secrets(f"note: {placed} end")
        assert placed not in out and "[REDACTED]" in out, placed


def test_url_passwords_are_redacted_everywhere_not_only_in_reasons() -> None:
    """The password of a URL goes from arguments and results; the URL stays readable."""
    guard = Guard(scan_env_secrets=False)

    @guard.tool
    def connect(dsn: str) -> str:
        return f"connected to {dsn}"

    result = guard.call("connect", {"dsn": "postgres://app:Pw-7781@db.internal/app"})
    assert result.text == "connected to postgres://app:[REDACTED]@db.internal/app"
    redactor = Redactor(scan_env=False)
    assert redactor.value({"u": "redis://:p@ss:w0rd@cache:6379/0"}) == \
        {"u": "redis://:[REDACTED]@cache:6379/0"}
    for plain in ("https://user@example.com/a", "mailto:ada@example.com",
                  "https://maps.example.com/@51.5,-0.12,12z"):
        assert redactor.secrets(plain) == plain


@pytest.mark.parametrize("word", [
    "risk-assessment-2024-final", "task-force-alpha-bravo", "whisk-eggs-thoroughly-first",
    "feature/ask-for-confirmation-dialog", "Bearer bonds of 1923", "ASIAPACIFICSALESTEAM",
    "ASIANFUSIONKITCHEN12", "xoxo-hugs-and-kisses", "sk-learn-compatible-model",
    "2fd4e1c67a2d28fced849ee1bb76e7391b93eb12", "123e4567-e89b-12d3-a456-426614174000",
])
def test_ordinary_words_holding_key_prefixes_stay_intact(word: str) -> None:
    """A key prefix inside an ordinary word or slug is not a key."""
    assert Redactor(scan_env=False).secrets(word) == word


@pytest.mark.parametrize(("name", "secret"), [
    ("token_count", False), ("boarding_pass", False), ("auth_method", False),
    ("pin_location", False), ("cookie_policy", False), ("otp_channel", False),
    ("day_pass", False), ("secret_name", False), ("max_tokens", False), ("author", False),
    ("password", True), ("db_pass", True), ("pass", True), ("api_key", True),
    ("X-Api-Key", True), ("auth_token", True), ("session_id", True), ("pin", True),
    ("pin_code", True), ("otp", True), ("session_cookie", True), ("Authorization", True),
    ("password_confirmation", True),
])
def test_argument_names_are_judged_by_whole_words(name: str, secret: bool) -> None:
    """A secret word followed by what it describes (count, method, policy) names no secret."""
    from toolfault._redact import is_secret_key

    assert is_secret_key(name) is secret


def test_the_env_scan_takes_credential_like_values_only(monkeypatch: Any) -> None:
    """GIT_AUTHOR_NAME="Ada Lovelace" is no secret; a key under any name and the password of
    a DATABASE_URL are."""
    monkeypatch.setenv("GIT_AUTHOR_NAME", "Ada Lovelace")
    monkeypatch.setenv("KEYBOARD_LAYOUT", "us-intl")
    monkeypatch.setenv("SOME_SETTING", "sk-proj-Mn4bVc7xZl2kJh9gFd5sAp0o")
    monkeypatch.setenv("DATABASE_URL", "postgres://app:Db-Pw-55xq@db/app")
    monkeypatch.setenv("STRIPE_API_KEY", "rk-house-7781-a")
    redactor = Redactor()
    assert redactor.secrets("written by Ada Lovelace") == "written by Ada Lovelace"
    assert redactor.secrets("layout us-intl") == "layout us-intl"
    for value in ("sk-proj-Mn4bVc7xZl2kJh9gFd5sAp0o", "Db-Pw-55xq", "rk-house-7781-a"):
        assert value not in redactor.secrets(f"x {value} y")
        assert value.encode().hex() not in redactor.secrets(f"x {value.encode().hex()} y")


def test_reasons_drop_lowercase_sql_unc_paths_and_localhost() -> None:
    """SQL without * in any case, UNC and escaped Windows paths and localhost become
    neutral words in a reason."""
    redactor = Redactor(scan_env=False)
    assert redactor.prose("select id, pw_hash from accounts where id = 7") == "[query]"
    assert redactor.prose("drop table users") == "[query]"
    assert redactor.prose(r"cannot open \\fileserver01\finance\q3.xlsx now") == \
        "cannot open [path] now"
    assert redactor.prose(r"cannot open C:\\Users\\ada\\x.txt") == "cannot open [path]"
    assert redactor.prose("connect to localhost failed") == "connect to [host] failed"
    assert redactor.prose("Please select a date from the calendar") == \
        "Please select a date from the calendar"


def test_the_allow_list_keeps_only_the_value_the_model_sent_standing_alone() -> None:
    """customer="etc" does not keep /etc/shadow, "10.0" does not keep 10.0.0.5:5432; a path
    the model sent is kept, also before a full stop."""
    redactor = Redactor(scan_env=False)
    assert redactor.prose("cannot read /etc/shadow for etc", allow=["etc"]) == \
        "cannot read [path] for etc"
    assert redactor.prose("cannot reach 10.0.0.5:5432 (10.0)", allow=["10.0"]) == \
        "cannot reach [address] (10.0)"
    assert redactor.prose("cannot open /home/ada/notes.txt.", allow=["/home/ada/notes.txt"]) \
        == "cannot open /home/ada/notes.txt."


def _nested_under_k(levels: int, leaf: Any) -> Any:
    """``leaf`` under ``levels`` mappings, each with the one key ``k``."""
    for _ in range(levels):
        leaf = {"k": leaf}
    return leaf


def _under_k(value: Any) -> Any:
    """What the innermost ``k`` of :func:`_nested_under_k` holds."""
    while isinstance(value, dict) and "k" in value:
        value = value["k"]
    return value


@pytest.mark.parametrize(("levels", "expected"), [
    (64, [["s3"], 5, "text", {"a": 1}, ["t"], ["[REDACTED]"]]),
    (65, ["…", 5, "text", "…", "…", "…"]),
    (66, ["…", "…", "…", "…", "…", "…"]),
])
def test_members_meet_the_depth_limit_where_the_recursive_walk_does(
        levels: int, expected: list[Any]) -> None:
    """A mapping's members, handled without a recursive call, stop at the same depth as
    :meth:`Redactor.value` would: containers past 64 levels read "…", scalars one level
    deeper still show (or hide) themselves."""
    redactor = Redactor(scan_env=False)
    leaves: list[Any] = [["s3"], 5, "text", {"a": 1}, ("t",)]
    shown = [_under_k(redactor.value(_nested_under_k(levels, leaf))) for leaf in leaves]
    shown.append(_under_k(redactor.value(_nested_under_k(levels, ["x"]), key="password")))
    assert shown == expected


#: One credential of each shape in SECRET_PATTERNS and each literal its gate looks for, in
#: text that holds no other literal (no "gh" beside ``github_pat_``, which has none).
ONE_OF_EACH_SHAPE = [
    "sk-proj-Qw3rTy8uIoPaSdFgHjKl0987", "AKIAQ3EGUCUMBERS2X7Z", "ASIAY34FZKBOKMUTVV7A",
    "AGPAY34FZKBOKMUTVV7A", "AIDAY34FZKBOKMUTVV7A", "AROAY34FZKBOKMUTVV7A",
    "AIPAY34FZKBOKMUTVV7A", "ANPAY34FZKBOKMUTVV7A", "ANVAY34FZKBOKMUTVV7A",
    "Bearer 9fQ2-zX81ab.Qr7Tt", "ghp_Zq81xLpQ0aaKw9Zq81xLpQ", "gho_Zq81xLpQ0aaKw9Zq81xLpQ",
    "ghu_Zq81xLpQ0aaKw9Zq81xLpQ", "ghs_Zq81xLpQ0aaKw9Zq81xLpQ", "ghr_Zq81xLpQ0aaKw9Zq81xLpQ",
    "github_pat_11AXQZ7RY0Jt3mNc2LpWv9_8KdQe4sTzR1uYbV6nMx0PqLw3ZcJ5hFtG7aE2rKiU9oDs4Ny",
    "xoxb-1234-5678-Zq81xLpQ0a", "sk_live_Zq81xLpQ0aaKw9Zq81", "rk_test_Zq81xLpQ0aaKw9Zq81",
    "glpat-Zq81xLpQ0aaKw9Zq81xL", "AIzaSyZq81xLpQ0aaKw9Zq81xLpQ0aaKw9Zq81x",
    "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJzaGFwZSJ9.c2hhcGUtc2lnbmF0dXJl", "token=Zq81xLpQ",
    "postgres://app:Zq81xLpQ@db/app", "-----BEGIN RSA PRIVATE KEY-----\nMIIBZq81xLpQ",
]


def test_one_of_each_shape_covers_every_pattern() -> None:
    """The examples below exercise every credential shape (a new shape needs one)."""
    from toolfault._redact import _ANY_SECRET, SECRET_PATTERNS

    matched = set()
    for shape in ONE_OF_EACH_SHAPE:
        match = _ANY_SECRET.search(shape)
        assert match is not None and match.lastgroup is not None, shape
        matched.add(match.lastgroup)
    assert matched == {f"s{i}" for i in range(len(SECRET_PATTERNS))}


@pytest.mark.parametrize("shape", ONE_OF_EACH_SHAPE)
def test_each_shape_passes_the_literal_gate_and_is_redacted(shape: str) -> None:
    """Each credential shape opens the cheap gate and is redacted wherever it travels: in
    text, as an argument, base64-encoded.  (``github_pat_`` tokens, whose "github" holds no
    "gh", were let through unless "gh" occurred elsewhere in the text.)"""
    import base64

    from toolfault._redact import _may_hold_secret

    secret = "Zq81xLpQ" if shape.startswith("postgres:") else shape[-8:]  # the password
    assert _may_hold_secret(shape)
    redactor = Redactor(scan_env=False)
    assert secret not in redactor.secrets(f"the value is {shape} ok")
    assert secret not in json.dumps(redactor.value({"note": shape}))
    encoded = base64.b64encode(shape.encode()).decode()
    assert encoded not in redactor.secrets(f"the value is {encoded} ok")


def test_each_literal_of_the_gate_holds_its_group_string() -> None:
    """A group of the gate is skipped when its shorter string is absent, which is sound only
    if each literal of the group contains that string."""
    from toolfault._redact import _SHAPE_LITERALS

    for common, literals in _SHAPE_LITERALS:
        for literal in literals:
            assert common in literal, (common, literal)


_SPLIT_PIECES = st.sampled_from([
    "sk-proj-", "abcdefghijklmnopqrstuv", "AKIA", "IOSFODNN7EXAMPLE", "eyJ", "hbGciOi", "be",
    "arer", "Bearer", "to", "ken=", "Zq81xLpQ", "c2stcHJvai1hYmNkZWZnaGlqa2xtbm9wcXJzdHV2", "==",
    "postgres://app:", "pw", "@db/app", "-----BEGIN RSA", "PRIVATE KEY-----", "invalid_argument).",
    "Reason:", "help.", "Next", "0.", "a+b", "%3D", "\\u0073k-", "\\", "\n", "\r\n", "\n    ",
    " \n", "\\n", " ", ".", ":", "(", ")",
])


@settings(max_examples=400, deadline=None)
@given(parts=st.lists(_SPLIT_PIECES, max_size=10))
def test_the_split_run_gate_never_skips_a_run_that_would_be_redacted(parts: list[str]) -> None:
    """Where the cheap gate skips the split-run pass, that pass would have changed nothing."""
    import functools

    from toolfault._redact import _SPLIT_RUN, _encoded_run, _joined, _may_be_split

    text = "".join(parts)
    if not _may_be_split(text):
        assert _SPLIT_RUN.sub(functools.partial(_encoded_run, decode=_joined), text) == text


def test_a_four_part_message_skips_the_split_run_pass_but_a_split_key_does_not() -> None:
    """Line breaks between sentences join nothing a credential could be made of; a key, a
    ``key=value``, a "Bearer" token or base64 split across lines still goes through."""
    from toolfault._redact import _may_be_split

    message = ("search_flights failed (code: invalid_argument).\nReason: max_price must be "
               "greater than 0.\nEffect: none.\nNext action: call search_flights again.")
    assert not _may_be_split(message)
    redactor = Redactor(scan_env=False)
    assert redactor.secrets(message) == message
    for split in ("sk-proj-abcdefgh\nijklmnopqrstuv", "token=\nZq81xLpQ", "Bearer\n  Zq81xLpQ0a",
                  "c2stcHJvai1hYmNkZWZn\naGlqa2xtbm9wcXJzdHV2"):
        assert _may_be_split(f"x {split} y")
        assert "[REDACTED]" in redactor.secrets(f"x {split} y"), split


@pytest.mark.parametrize("short", ["token%3Dx", "token=\nx", "token=\r\nx", "token%3Dxy."])
def test_a_short_text_is_searched_for_encoded_shapes_as_a_long_one_is(short: str) -> None:
    """The shortest shape (``token=x``) is 7 characters, so 8 encoded (one ``%XX``, one line
    break): a short reason, name or member is searched as the whole message holding it is,
    where only texts of 16 characters or more were."""
    redactor = Redactor(scan_env=False)
    assert redactor.secrets(short) == "[REDACTED]"
    assert redactor.secrets(f"note: {short} end") == "note: [REDACTED] end"
    for plain in ("economy", "hello%20world", "a\nb\nc\nd\ne", "search_flights"):
        assert redactor.secrets(plain) == plain
