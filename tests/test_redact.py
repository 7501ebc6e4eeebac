"""Secrets and internal identifiers never reach a model."""

from __future__ import annotations

import json
from typing import Any

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
