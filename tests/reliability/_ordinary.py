"""Precision: ordinary values a model sends and a tool returns must reach it intact.

Redaction that mangles slugs, names or ids breaks the task it was meant to protect.  Each
value of the corpus is sent as an argument to a tool that fails (the echo in ``Rejected
arguments``) and returned by a tool that succeeds (the result), with environment-variable
scanning on and an author's name in ``GIT_AUTHOR_NAME``; it counts as intact when it is
spelt exactly as sent in both.  Benign argument names (``token_count``, ``boarding_pass``)
are checked the same way: their values must not be hidden.
"""

from __future__ import annotations

import base64
import json
import os
import uuid
from dataclasses import dataclass, field

from toolfault import Guard, ToolError

_SLUGS = [
    "risk-assessment-2024-final", "task-force-alpha-bravo", "whisk-eggs-thoroughly-first",
    "feature/ask-for-confirmation-dialog", "q3-revenue-forecast-v2", "onboarding-checklist",
    "release-notes-2025-01", "brisk-morning-walk", "basket-weaving-101", "desk-booking-policy",
    "disk-usage-report", "kiosk-mode-settings", "tusk-and-horn-exhibit", "musk-ox-migration",
    "asterisk-handling-notes", "husky-training-plan", "obelisk-restoration-2023",
    "frisk-search-procedure", "dusk-till-dawn-playlist", "mask-mandate-faq",
    "bugfix/risk-score-rounding", "hotfix/task-queue-deadlock", "docs/whisky-tasting-notes",
    "sk-learn-compatible-model", "tokenizer-benchmark-results", "secretary-of-state-visit",
    "password-reset-help-article", "api-keynote-speakers-2024", "pin-the-tail-game",
    "passport-renewal-steps",
]
_KEY_PREFIX_WORDS = [
    "ASIAPACIFICSALESTEAM", "ASIANFUSIONKITCHEN12", "AKIAN-style painting", "xoxo-hugs-and-kisses",
    "xoxo gossip girl", "Bearer bonds of 1923", "bearer of good news", "the bearer shares",
    "ghost_writer_notes", "gho-st-story", "eyJustSaying", "sk-8er-boi", "ASIA PACIFIC REGION",
    "TOKEN RING NETWORK", "token economy essay", "secret garden tour", "Secret Santa 2024",
    "password manager comparison", "auth0 migration guide", "cookie dough recipe",
    "Bearer Brewing Company", "api-key-rotation-runbook", "private key concepts lecture",
    "pin cushion", "OTP vendor shortlist",
]
_NAMES = [
    "Ada Lovelace", "written by Ada Lovelace", "Grace Hopper", "Alan Turing", "Katherine Johnson",
    "Linus Torvalds", "Margaret Hamilton", "Tim Berners-Lee", "Barbara Liskov",
    "Donald Knuth", "Edsger Dijkstra", "Frances Allen", "Ken Thompson", "Dennis Ritchie",
    "Radia Perlman", "José María Olazábal", "Zoë Saldaña", "Søren Kierkegaard",
    "Nguyễn Thị Minh Khai", "李白", "Ōtani Shōhei", "O'Brien", "Jean-Luc Picard",
    "Mary-Kate Smith-Jones", "Dr. Martin Luther King Jr.",
]
_UUIDS = [str(uuid.UUID(int=(i * 0x9E3779B97F4A7C15_F39CC0605CEDC834) % (1 << 128),
                        version=4)) for i in range(1, 21)]
_SHAS = [format((i * 0x9E3779B97F4A7C15F39CC0605CEDC8341234567) % (1 << 160), "040x")
         for i in range(1, 16)] + ["2fd4e1c67a2d28fced849ee1bb76e7391b93eb12", "a94a8fe",
                                   "e83c5163316f89bfbde7d9ab23ca2e25604af290"]
_ISBNS = ["978-0-13-110362-7", "978-0-262-03384-8", "0-201-63361-2", "978-1-4919-5029-2",
          "9780596517748", "978-3-16-148410-0", "0-306-40615-2", "978-0-321-12521-7",
          "978-1-59327-584-6", "978-0-596-00712-6"]
_FLIGHTS = ["UA 837", "BA0287", "LH 400", "AF1680", "NH7", "QF1", "EK 215", "DL 1234",
            "AA100", "SQ 322", "KL0605", "JL 5", "SFO", "JFK", "LHR-JFK", "CDG→NRT"]
_URLS = ["https://example.com/docs/getting-started", "https://en.wikipedia.org/wiki/Ada_Lovelace",
         "http://localhost:8080/health", "https://github.com/org/repo/pull/123",
         "https://api.example.com/v2/orders?status=open&page=2",
         "https://user@example.com/profile", "mailto:ada@example.com",
         "https://maps.example.com/@51.5074,-0.1278,12z", "ftp://files.example.org/pub/README",
         "https://example.com/search?q=bearer+bonds", "https://cdn.example.com/img/logo.png",
         "s3://bucket-name/path/to/object.csv"]
_BASE64_IMAGES = [
    "data:image/png;base64," + base64.b64encode(bytes(range(i, i + 96))).decode()
    for i in range(0, 160, 32)
] + [base64.b64encode(f"ordinary text number {i} for a thumbnail".encode()).decode()
     for i in range(5)]
_MISC = [
    "order-10023", "INV-2024-000187", "SKU-AB-1234", "42", "3.14159", "2024-06-01",
    "2024-06-01T12:30:00Z", "+1 (555) 010-9999", "ada@example.com", "10 Downing Street",
    "SW1A 2AA", "€1,299.00", "50% off", "#general", "@channel", "v1.2.3", "1.0.0-rc.1",
    "C-3PO", "R2-D2", "main", "feature/login-page", "Hello, world!", "naïve café",
    "résumé.pdf", "Q3 report.xlsx", "red", "economy", "business class", "window seat",
    "vegetarian meal", "two adults, one child", "check-in at 15:00", "room 1204",
    "gate B22", "seat 14C", "ticket 0167-2345678901", "PNR ABC123", "booking ref K9X2LM",
    "tracking 1Z999AA10123456784", "user_12345", "customer-9f3a", "tenant_acme_corp",
    "us-east-1", "eu-west-2a", "prod-cluster-blue", "node-pool-gpu", "pipeline #4471",
    "build 2024.06.01.3", "JIRA-1234", "PROJ-42: fix login", "emoji 🙂 ok",
    "select the best option", "drop-off at 5pm", "update me later", "create a summary",
    "temperature 21.5°C", "lat 51.5074, lon -0.1278", "ISO 8601", "RFC 9457",
    "AKIA is not a word", "sk- prefix docs", "the token budget is 4096", "pass the salt",
    "OTP sent by SMS", "PIN pad repair", "Authorization header docs",
]
_BENIGN_NAMES = [
    "token_count", "boarding_pass", "auth_method", "pin_location", "cookie_policy",
    "otp_channel", "max_tokens", "author", "passenger", "password_policy", "token_limit",
    "secret_name", "auth_provider", "pin_color", "cookie_consent", "token_type",
    "passport_number", "compass_heading", "bypass_cache", "keyboard_layout", "monkey_name",
    "session_count", "auth_url", "day_pass", "season_pass",
]

#: Every ordinary value of the corpus (argument values; returned as results too).
VALUES: list[str] = [*_SLUGS, *_KEY_PREFIX_WORDS, *_NAMES, *_UUIDS, *_SHAS, *_ISBNS,
                     *_FLIGHTS, *_URLS, *_BASE64_IMAGES, *_MISC]
BENIGN_NAMES: list[str] = _BENIGN_NAMES


@dataclass
class Precision:
    """Ordinary values intact in the echo and in results, and examples of damage."""

    values: int = 0
    echo_intact: int = 0
    result_intact: int = 0
    names: int = 0
    names_intact: int = 0
    damaged: list[str] = field(default_factory=list)

    @property
    def total(self) -> int:
        return self.values * 2 + self.names

    @property
    def intact(self) -> int:
        return self.echo_intact + self.result_intact + self.names_intact


def measure() -> Precision:
    """Send and return every ordinary value through a guard that scans the environment."""
    saved = os.environ.get("GIT_AUTHOR_NAME")
    os.environ["GIT_AUTHOR_NAME"] = "Ada Lovelace"
    try:
        guard = Guard(scan_env_secrets=True)
    finally:
        if saved is None:
            os.environ.pop("GIT_AUTHOR_NAME", None)
        else:
            os.environ["GIT_AUTHOR_NAME"] = saved

    @guard.tool
    def reject(**kwargs: object) -> str:
        raise ToolError("conflict", "the request conflicts with the current state")

    @guard.tool
    def echo(value: str) -> str:
        return value

    figures = Precision()
    for i, value in enumerate(VALUES):
        figures.values += 1
        guard.new_turn()  # each value its own turn: the ladder is not what is measured
        failed = guard.call("reject", {"value": value, "n": i})
        if _echoed_intact(failed.data, "value", value):
            figures.echo_intact += 1
        else:
            figures.damaged.append(f"echo: {value!r} -> {failed.data.get('rejected_arguments')}")
        returned = guard.call("echo", {"value": value})
        if returned.ok and returned.text == value:
            figures.result_intact += 1
        else:
            figures.damaged.append(f"result: {value!r} -> {returned.text[:120]!r}")
    for i, name in enumerate(BENIGN_NAMES):
        figures.names += 1
        guard.new_turn()
        value = f"ordinary-value-{i}"
        failed = guard.call("reject", {name: value})
        if _echoed_intact(failed.data, name, value):
            figures.names_intact += 1
        else:
            figures.damaged.append(f"name: {name} -> {failed.data.get('rejected_arguments')}")
    guard.close()
    return figures


def _echoed_intact(data: dict[str, object], key: str, value: str) -> bool:
    """Whether the echo spells ``value`` as sent: whole, or (a long value cut to the token
    budget, which is not redaction) its kept beginning exactly."""
    try:
        echoed = json.loads(str(data.get("rejected_arguments")))[key]
    except (ValueError, KeyError, TypeError):
        return False
    if echoed == value:
        return True
    head = echoed.split("…")[0] if isinstance(echoed, str) and "…" in echoed else None
    return bool(head) and value.startswith(head) and "[REDACTED]" not in echoed
