"""Keeping secrets and internal identifiers out of what reaches a model provider.

Every string toolfault emits (message text, structured problem, JSONL trace, spans, logs,
ledger) passes through a :class:`Redactor`.  It removes registered secret values and values
of secret-looking environment variables in the forms they travel in (plain, base64,
URL-encoded, JSON-escaped, upper- or lower-cased, split across lines), well-known key and
token shapes, and values under secret-looking argument names, and it replaces file paths,
hosts, addresses and SQL with neutral words.

Every pattern here runs in linear time: each one starts only at the beginning of a run of
the characters it consumes (a one-character lookbehind), consumes possessively, and bounds
any lazy scan, so a hostile 1 MB argument costs a pass over it, not a pass per character.
"""

from __future__ import annotations

import base64
import bisect
import functools
import json
import logging
import os
import re
import urllib.parse
import weakref
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from toolfault._jsontext import quote_text

REDACTED = "[REDACTED]"

def _longest_segment(body: str) -> int:
    """The longest run of letters and digits in ``body`` (between ``-`` and ``_``)."""
    return max(map(len, re.split(r"[-_]", body)), default=0)


def _openai_key(match: str) -> bool:
    """``sk-…`` is a key when its body holds a long unbroken run (a slug of words such as
    ``task-force-alpha`` or ``ask-for-confirmation-dialog`` does not) or is long enough to
    be one whatever it holds."""
    body = match[3:]
    for prefix in ("proj-", "ant-", "svcacct-", "admin-"):
        if body.startswith(prefix):
            body = body[len(prefix):]
            break
    return _longest_segment(body) >= 16 or len(body) >= 40


def _aws_key(match: str) -> bool:
    """AKIA + 16 is an access key id; the other prefixes (``ASIA``: temporary keys) need
    the real body, base32 (``A-Z``, ``2-7``) with a digit in it, so ``ASIAPACIFICSALESTEAM``
    and ``ASIANFUSIONKITCHEN12`` are words, not keys."""
    body = match[4:]
    return match.startswith("AKIA") or (_BASE32.issuperset(body) and _has_digit(body))


_BASE32 = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZ234567")


def _bearer_token(match: str) -> bool:
    """A bearer credential is at least 8 characters and not a plain word ("Bearer bonds")."""
    words = match.split(None, 1)
    token = (words[1] if len(words) == 2 else "").rstrip("=")
    if len(token) < 8:
        return False
    return len(token) >= 24 or _has_digit(token) or not _reads_as_word(token)


def _has_digit(text: str) -> bool:
    """Whether ``text`` holds a digit: words rarely do, keys and ids almost always."""
    return any(c.isdigit() for c in text)


def _reads_as_word(token: str) -> bool:
    """Letters only, lower-case, Capitalised or ALL CAPS (``bonds``, ``Bonds``, ``BONDS``):
    a word of prose, where a token mixes cases inside or holds other characters."""
    letters = [c for c in token if c.isalpha()]
    mixed = any(c.isupper() for c in letters[1:]) and any(c.islower() for c in letters)
    return not mixed and len(letters) == len(token)


def _slack_token(match: str) -> bool:
    """Slack tokens carry digits (workspace and user ids): ``xoxo-hugs-and-kisses`` does not."""
    return sum(c.isdigit() for c in match) >= 4


def _url_password(match: re.Match[str]) -> str:
    """``scheme://user:PASSWORD@host``: the password goes, the rest stays readable."""
    text = match.group(0)
    head, _, authority = text.partition("://")
    at = authority.rfind("@")
    if at <= 0:
        return text
    user, colon, password = authority[:at].partition(":")
    if not colon or not password or password == REDACTED:
        return text
    return f"{head}://{user}:{REDACTED}{authority[at:]}"


#: Shapes of credentials that are secret wherever they appear.  Each follows the provider's
#: real format; where a format alone admits ordinary words, a check in :data:`_CHECKS`
#: decides (``risk-assessment-2024`` holds no ``sk-`` key, ``ASIAPACIFICSALESTEAM`` no AWS
#: key, "Bearer bonds" no bearer token, ``xoxo-hugs`` no Slack token).
SECRET_PATTERNS: tuple[re.Pattern[str], ...] = (
    # No leading word boundary on these: "0sk-…" or "xAKIA…" must not slip through; the
    # format checks in _CHECKS keep "risk-assessment" and "ASIAPACIFIC…" ordinary words.
    re.compile(r"sk-[A-Za-z0-9_\-]{16,}+"),
    re.compile(r"(?:AKIA|ASIA|AGPA|AIDA|AROA|AIPA|ANPA|ANVA)[0-9A-Z]{16}"),
    re.compile(r"(?i:bearer\s++)[A-Za-z0-9._~+/\-]++=*+"),
    re.compile(r"gh[pousr]_[A-Za-z0-9]{20,}+|github_pat_[A-Za-z0-9_]{22,}+"),
    re.compile(r"xox[abposre]-[A-Za-z0-9\-]{10,}+"),
    re.compile(r"(?<![A-Za-z0-9])(?:[sr]k_(?:live|test)_[A-Za-z0-9]{16,}+|"
               r"glpat-[A-Za-z0-9_\-]{20,}+|AIza[0-9A-Za-z_\-]{35})"),
    # The header segment stops at the next "eyJ", so each character is scanned a bounded
    # number of times however many "eyJ" a hostile string repeats.
    re.compile(r"eyJ(?:(?!eyJ)[A-Za-z0-9_\-]){8,}+\.[A-Za-z0-9_\-]{8,}+\.[A-Za-z0-9_\-]{8,}+"),
    re.compile(r"(?i:(?<![A-Za-z0-9])(?:api[_-]?key|access[_-]?key|token|secret|password|"
               r"passwd)=)[^\s&;,]++"),
    # A password in a URL's user information: only the password is replaced.
    re.compile(r"(?<![A-Za-z0-9+.\-])(?i:[a-z][a-z0-9+.\-]*+)://[^\s/?#'\"<>@:]*+:"
               r"[^\s/?#'\"<>@]++@(?:[^\s/?#'\"<>@]*+@)*+"),
    # A key without its END line is redacted to the end of the text.
    re.compile(r"-----BEGIN [A-Z ]{0,40}PRIVATE KEY-----(?:(?!-----END )[\s\S])*+"
               r"(?:-----END [A-Z ]{0,40}PRIVATE KEY-----)?"),
)

#: Per SECRET_PATTERNS entry: whether a match is a credential (``None``: always), or, for
#: the URL password, the replacement itself.
_CHECKS: tuple[Any, ...] = (_openai_key, _aws_key, _bearer_token, None, _slack_token, None,
                            None, None, _url_password, None)

# One pass for all shapes, behind a cheap literal gate (_may_hold_secret).
_ANY_SECRET = re.compile("|".join(f"(?P<s{i}>{p.pattern})"
                                  for i, p in enumerate(SECRET_PATTERNS)))


def _checked(check: Callable[[str], bool]) -> Callable[[re.Match[str]], str]:
    def replace(match: re.Match[str]) -> str:
        text: str = match.group(0)
        return REDACTED if check(text) else text
    return replace


#: Per SECRET_PATTERNS entry: literals one of which every match holds (``None``: "bearer",
#: in any case), and the replacement.  Each pattern runs only on text holding its literal,
#: so a text with none of them costs a few substring tests.
_BY_SHAPE: tuple[tuple[re.Pattern[str], tuple[str, ...] | None, Any], ...] = tuple(
    zip(SECRET_PATTERNS, (
        ("sk-",), ("AKIA", "ASIA", "AGPA", "AIDA", "AROA", "AIPA", "ANPA", "ANVA"), None,
        ("ghp_", "gho_", "ghu_", "ghs_", "ghr_", "github_pat_"), ("xox",),
        ("k_live_", "k_test_", "glpat-", "AIza"), ("eyJ",), ("=",), ("://",),
        ("-----BEGIN",)),
        (_checked(_openai_key), _checked(_aws_key), _checked(_bearer_token), REDACTED,
         _checked(_slack_token), REDACTED, REDACTED, REDACTED, _url_password, REDACTED),
        strict=True))


def _shapes_sub(text: str) -> str:
    """Every credential shape in ``text`` replaced (its format check passed)."""
    lowered: str | None = None
    for pattern, gate, replacement in _BY_SHAPE:
        if gate is None:
            if lowered is None:
                lowered = text.lower()
            if "bearer" not in lowered:
                continue
        elif not _holds_any(text, gate):
            continue
        text = pattern.sub(replacement, text)
        lowered = None
    return text


def _shape(match: re.Match[str]) -> str:
    """The replacement for one credential-shaped match (itself when its check says no)."""
    check = _CHECKS[int(match.lastgroup[1:])] if match.lastgroup else None
    if check is None:
        return REDACTED
    if check is _url_password:
        replaced: str = _url_password(match)
        return replaced
    text: str = match.group(0)
    return REDACTED if check(text) else text


#: No shape in SECRET_PATTERNS matches fewer characters than this (``token=x``); a test
#: checks it against the patterns' parsed minimum widths.
SHORTEST_SHAPE = 7

#: Clean strings up to this length are remembered per redactor (at most _CLEAN_ENTRIES of
#: them): argument names, enum values and catalog words recur on every call.
_CLEAN_LEN = 128
_CLEAN_ENTRIES = 4096
#: Fewer opening brackets than this cannot nest to the depth where ``Redactor.value`` stops.
_VERBATIM_BRACKETS = 63


#: The literals one of which every shape in SECRET_PATTERNS holds (but bearer's word, in any
#: case), grouped under a shorter string each literal of its group contains (a test checks
#: it), and that most text lacks: one fast scan for it rules the whole group out.
_SHAPE_LITERALS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("=", ("=",)),  # key=value
    ("@", ("@",)),  # a password in a URL
    ("J", ("eyJ",)),  # a JWT
    ("x", ("xox",)),  # a Slack token
    ("-", ("sk-", "-----BEGIN", "glpat-")),
    ("A", ("AIza", "AKIA", "ASIA", "AGPA", "AIDA", "AROA", "AIPA", "ANPA", "ANVA")),
    ("_", ("k_live_", "k_test_", "github_pat_")),  # "github" holds no "gh"
    ("gh", ("ghp_", "gho_", "ghu_", "ghs_", "ghr_")),
)


def _may_hold_secret(text: str) -> bool:
    """A cheap gate: every shape in SECRET_PATTERNS contains one of the literals of
    :data:`_SHAPE_LITERALS` or, in any case, the word "bearer"."""
    for common, literals in _SHAPE_LITERALS:
        if common not in text:
            continue
        for literal in literals:
            if literal in text:
                return True
    return "bearer" in text.lower()


def _holds_any(text: str, literals: Iterable[str]) -> bool:
    """Whether ``text`` contains one of ``literals`` (the gates in front of each pattern)."""
    return any(literal in text for literal in literals)


_INTERNAL_TLDS = ("internal", "local", "lan", "corp", "svc")


def _dotted(match: re.Match[str]) -> str:
    """A dotted name is a host when it ends in an internal suffix or looks like an FQDN."""
    text = match.group(0)
    labels = text.split(".")
    return "[host]" if _internal_host(labels) or _fqdn(labels) else text


def _internal_host(labels: list[str]) -> bool:
    """``db.internal``, ``printer.local``: a suffix only private networks resolve."""
    return len(labels) >= 2 and labels[-1].lower() in _INTERNAL_TLDS


def _fqdn(labels: list[str]) -> bool:
    """Three or more host labels under an alphabetic top level (``api.example.com``), where
    ``v1.2.3`` and ``notes.txt`` are not hosts."""
    tld = labels[-1]
    return (len(labels) >= 3 and len(tld) >= 2 and tld.isascii() and tld.isalpha()
            and all(map(_host_label, labels)))


def _host_label(label: str) -> bool:
    """A DNS label: ASCII letters, digits and ``-``, not empty."""
    return label != "" and label.isascii() and all(c.isalnum() or c == "-" for c in label)


_SQL_WORDS = r"(?:SELECT|INSERT|UPDATE|DELETE|WITH|CREATE|DROP|ALTER|TRUNCATE|MERGE|REPLACE)"

#: Internal identifiers that say nothing useful to a model: paths, URLs, hosts, addresses, SQL.
INTERNAL_PATTERNS: tuple[tuple[re.Pattern[str], Any], ...] = (
    (re.compile(r"(?<![a-z0-9+.\-])[a-z][a-z0-9+.\-]*+://[^\s'\"<>]++", re.I), "[url]"),
    (re.compile(r"\b" + _SQL_WORDS + r"\b[^\n;]{0,300}?\b(?:FROM|INTO|SET|TABLE|WHERE|"
                r"VALUES|JOIN)\b[^\n;]*+"), "[query]"),
    (re.compile(r"(?i:\bselect\s++\*\s++from\b|\b(?:insert\s++into|delete\s++from)\s++\w|"
                r"\bupdate\s++[\w.\"`]++\s++set\s++\w|"
                r"\bselect\s++(?:distinct\s++)?+[\w.\"`*()]++(?:\s++as\s++\w++)?+"
                r"(?:\s*+,\s*+[\w.\"`*()]++(?:\s++as\s++\w++)?+)*+\s++from\s++[\w.\"`]|"
                r"\b(?:create|drop|alter|truncate)\s++(?:table|index|view|database|schema)\b)"
                r"[^\n;]*+"), "[query]"),
    (re.compile(r"\[?\b[0-9a-f]{0,4}(?::[0-9a-f]{0,4}){2,7}\]?(?::\d+)?", re.I), "[address]"),
    (re.compile(r"(?<![\w.\-])(?=[\d._\-]*+[^\W\d_])[\w.\-]++:\d{2,5}\b"), "[host]"),
    (re.compile(r"~/[\w.\-]++(?:/[\w.\-]++)*+"), "[path]"),
    (re.compile(r"(?<![\w.\-/~])[\w.\-]++(?:/[\w.\-]++){2,}+"), "[path]"),
    (re.compile(r"(?<![\w.\-])[\w\-]++(?:\.[\w\-]++)++"), _dotted),
    (re.compile(r"(?<![\w.\-/])(?:/[\w.\-]++){2,}+/?"), "[path]"),
    (re.compile(r"\b[A-Za-z]:\\++(?:[\w.\- ]++\\++)*+[\w.\- ]*+"), "[path]"),
    # UNC paths (\\\\server\\share\\file), also JSON- or repr-escaped (backslashes doubled).
    (re.compile(r"(?<![\w\\])\\{2,}+[\w.$\-]++(?:\\++[\w.$\-]++)++"), "[path]"),
    (re.compile(r"\b[A-Za-z]:/[\w.\-]++(?:/[\w.\-]++)*+"), "[path]"),
    (re.compile(r"\blocalhost\b", re.I), "[host]"),
    (re.compile(r"\b(?:\d{1,3}\.){3}\d{1,3}(?::\d+)?\b"), "[address]"),
)

#: For each INTERNAL_PATTERNS entry, literals one of which every match contains, so a text
#: holding none of them skips that pattern.  ``None``: a case-insensitive shape (SQL,
#: ``localhost``), gated on the lower-cased text (ASCII only; under re.I "ſ", "ı", "İ" and
#: the Kelvin sign match ASCII letters, so non-ASCII text always runs it).
_GATES: tuple[str | tuple[str, ...] | None, ...] = (
    "://",
    ("FROM", "INTO", "SET", "TABLE", "WHERE", "VALUES", "JOIN"),
    None,
    ":",
    ":",
    "~/",
    "/",
    ".",
    "/",
    ":\\",
    "\\\\",
    ":/",
    None,
    ".",
)


#: What a case-insensitive pattern (SQL, ``localhost``) needs in lower-cased ASCII text.
_CASELESS_GATE = ("select", "insert", "delete", "update", "create", "drop", "alter",
                  "truncate", "localhost")


def _gate_open(gate: tuple[str, ...] | None, text: str) -> bool:
    """Whether ``text`` holds one of ``gate``'s literals (``None``: the SQL verbs and
    ``localhost`` gate, always open on non-ASCII text)."""
    if gate is None:
        return not text.isascii() or _holds_any(text.lower(), _CASELESS_GATE)
    return _holds_any(text, gate)

_GATED = tuple(zip(INTERNAL_PATTERNS, _GATES, strict=True))

_SECRET_WORDS = frozenset({
    "password", "passwd", "passphrase", "pwd", "secret", "secrets", "token", "apikey",
    "authorization", "auth", "credential", "credentials", "cookie", "otp", "pin", "bearer",
})
_SECRET_PAIRS = frozenset({("api", "key"), ("private", "key"), ("access", "key"),
                           ("session", "id"), ("client", "secret"), ("secret", "key")})
#: Counters named like tokens ("max_tokens") are numbers of tokens, not credentials.
_TOKEN_COUNTERS = frozenset({"max", "num", "input", "output", "total", "completion", "prompt",
                             "min", "used"})
#: Words that, following a secret word, name something about the secret rather than the
#: secret itself: ``token_count``, ``auth_method``, ``cookie_policy``, ``pin_location``,
#: ``otp_channel``, ``password_policy`` hold no credential.
_ABOUT_SECRET = frozenset({
    "count", "counts", "num", "limit", "limits", "budget", "usage", "used", "type", "types",
    "kind", "method", "methods", "mode", "scheme", "provider", "providers", "policy",
    "policies", "location", "locations", "channel", "channels", "name", "names", "label",
    "field", "fields", "length", "len", "size", "strength", "required", "enabled",
    "expiry", "expires", "expiration", "ttl", "url", "uri", "endpoint", "format", "rotation",
    "consent", "banner", "domain", "path", "window", "status", "level", "style", "color",
    "colour", "icon", "drop", "latitude", "longitude", "lat", "lng", "lon", "position",
    "category", "categories", "description", "title", "rules", "rule", "settings", "version",
})
#: ``pass`` alone names a password only after an account-like word (``db_pass``,
#: ``smtp_pass``) or by itself; ``boarding_pass`` and ``day_pass`` are tickets.
_PASS_OWNERS = frozenset({
    "db", "user", "admin", "root", "smtp", "ftp", "sftp", "mail", "email", "app", "login",
    "wifi", "sql", "mysql", "pg", "postgres", "redis", "ldap", "proxy", "basic", "http",
    "account", "master", "service", "api", "auth", "vpn", "ssh", "imap", "pop", "my", "new",
    "old", "current", "confirm",
})
_CAMEL = re.compile(r"([a-z0-9])([A-Z])")


def is_secret_key(name: str) -> bool:
    """Whether an argument or header name conventionally holds a secret.

    Judged by whole words (``db_password``, ``apiKey``, ``X-Api-Key``), so ``passenger``,
    ``author`` and ``max_tokens`` stay visible to the model, and so do names about a secret
    rather than of one (``token_count``, ``auth_method``, ``boarding_pass``).
    """
    raw = [p for p in re.split(r"[_\-.\s]+", _CAMEL.sub(r"\1_\2", name[:256]).lower()) if p]
    parts = [p[:-1] if len(p) > 3 and p.endswith("s") else p for p in raw]  # plurals
    return any(_names_secret(raw, parts, i) for i in range(len(raw)))


def _names_secret(raw: list[str], parts: list[str], i: int) -> bool:
    """Whether the name's word ``i`` (``raw`` as written, ``parts`` singular) names a
    secret, read with its neighbours: the word before says whose (``max_tokens``,
    ``db_pass``), the word after whether the name is about the secret (``token_count``)."""
    part, after = parts[i], _word(raw, i + 1)
    if part == "token" and _word(parts, i - 1) in _TOKEN_COUNTERS:
        return False
    if raw[i] == "pass":
        before = _word(parts, i - 1)
        return (before is None or before in _PASS_OWNERS) and after not in _ABOUT_SECRET
    if (part in _SECRET_WORDS or raw[i] in _SECRET_WORDS) and after not in _ABOUT_SECRET:
        return True
    return (part, _word(parts, i + 1)) in _SECRET_PAIRS and _word(raw, i + 2) not in _ABOUT_SECRET


def _word(words: list[str], i: int) -> str | None:
    """The word at ``i``, ``None`` before the first and after the last: no word there."""
    return words[i] if 0 <= i < len(words) else None


#: Words of an environment variable's name that say its value may be a credential.
_ENV_SECRET_WORDS = frozenset({"key", "token", "secret", "password", "passwd", "pwd", "pass",
                               "credential", "credentials", "auth", "apikey", "dsn", "url",
                               "uri", "cookie", "session", "signature", "salt", "pat"})
#: Shapes of values that never are credentials however the variable is named.
_ENV_PLAIN = re.compile(r"(?i:true|false|yes|no|on|off|none|null|\d{1,12}|"
                        r"[a-z]++(?:[ ._\-][a-z]++)*+)")


def _credential_like(name: str, value: str) -> bool:
    """Whether an environment variable's value is taken as a secret by the scan.

    A value that is itself a credential shape always is; otherwise the name must hold a
    secret word as a whole word (``GIT_AUTHOR_NAME`` does not) and the value must look like
    a credential: 8+ characters, no spaces, not a path, a plain word or a number, and mixed
    enough (letters with digits or symbols, or long and varied)."""
    if not 8 <= len(value) <= 4096:
        return False
    if _is_shape(value):
        return True
    return _secret_env_name(name) and not _never_credential(value) and _varied(value)


def _is_shape(value: str) -> bool:
    """Whether the whole of ``value`` is a credential shape (its format check passed)."""
    shaped = _ANY_SECRET.fullmatch(value)
    return shaped is not None and _shape(shaped) != value


def _secret_env_name(name: str) -> bool:
    """Whether a variable's name holds a secret word as a whole word (``DB_PASSWORD``,
    ``GITHUB_TOKEN``), where ``GIT_AUTHOR_NAME`` and ``KEYBOARD`` do not."""
    words = [w for w in re.split(r"[_\-.\s]+", name.lower()) if w]
    return any(w in _ENV_SECRET_WORDS or w.endswith(("password", "token", "secret", "key"))
               for w in words)


def _never_credential(value: str) -> bool:
    """A value that is no credential however the variable is named."""
    if any(c.isspace() for c in value) or _ENV_PLAIN.fullmatch(value):
        return True  # prose, a flag, a number, a plain word or slug
    if value.startswith(("/", "~", "./")) or _DRIVE.match(value):
        return True  # a path
    return "://" in value  # a URL: only its password (the shape) is a secret


_DRIVE = re.compile(r"[A-Za-z]:[\\/]")


def _varied(value: str) -> bool:
    """Mixed like a credential: letters with digits or symbols, or 10+ distinct characters."""
    has_alpha = any(c.isalpha() for c in value)
    has_other = any(not c.isalnum() for c in value)
    return (has_alpha and (_has_digit(value) or has_other)) or len(set(value)) >= 10


def _env_secrets() -> list[str]:
    """The values the environment scan takes (see :func:`_credential_like`), and the
    password of every URL with one (``DATABASE_URL=postgres://app:PW@db/app``)."""
    found: list[str] = []
    for name, value in os.environ.items():
        if _credential_like(name, value):
            found.append(value)
        elif "://" in value and "@" in value:
            for match in _URL_USERINFO.finditer(value):
                password = urllib.parse.unquote(match.group(1))
                if len(password) >= 4:
                    found.append(password)
    return found


_URL_USERINFO = re.compile(r"://[^\s/?#@:]*+:([^\s/?#]+)@")


_is_secret_key = functools.lru_cache(maxsize=4096)(is_secret_key)

#: Keys found not secret-named (exact strs; the names decide, whatever secrets are added
#: later): a tool's arguments repeat their keys, so usually one set check decides them all.
_NOT_SECRET_KEYS: set[str] = set()
_EXACT_STR = frozenset({str})
_NOT_SECRET_KEYS_MAX = 4096


def _no_secret_key(obj: dict[Any, Any], parsed: bool = False) -> bool:
    """Whether every key of ``obj`` is an exact ``str`` that does not name a secret.

    The memory of keys found plain is asked only about exact ``str`` keys (``parsed``: a
    JSON parser made ``obj``, so they are): a subclass may hash and compare equal to a plain
    name it does not spell."""
    if (parsed or _EXACT_STR.issuperset(map(type, obj))) and _NOT_SECRET_KEYS.issuperset(obj):
        return True
    for key in obj:
        if type(key) is not str or _is_secret_key(key):
            return False
    if len(_NOT_SECRET_KEYS) < _NOT_SECRET_KEYS_MAX:
        _NOT_SECRET_KEYS.update(obj)
    return True

#: What may sit between the characters of a secret split across lines: whitespace, and the
#: escaped line breaks of JSON text (also repr-escaped, their backslash doubled); and every
#: backslash of a run but the first, so an escape nested any number of times (JSON inside
#: repr inside JSON) reads as escaped once.
_SEPARATORS = re.compile(r"\s++|(?:\\++[nrt])++|(?<=\\)\\++")
_MIN_ENCODED = 8


def _skeleton(text: str) -> str:
    """Lower-cased text without separators: the shape secrets are searched in."""
    lowered = text.lower()
    if len(lowered) != len(text):  # a few characters grow when lower-cased: ASCII only
        lowered = text.translate(_ASCII_LOWER)
    if "\\" not in lowered:  # whitespace runs only: str.split's whitespace is re's \s
        return "".join(lowered.split())
    return _SEPARATORS.sub("", lowered)


_ASCII_LOWER = {c: c + 32 for c in range(ord("A"), ord("Z") + 1)}
#: The characters of a finite number's JSON text (``-1.5e+16``).
_NUMBER_CHARS = frozenset("0123456789.+-e")
_NON_FINITE = {"nan": "nan", "inf": "infinity", "-inf": "-infinity"}  # lower-cased, as forms


def _base64_cores(value: bytes) -> set[str]:
    """The base64 characters of ``value`` that do not depend on its neighbours.

    Encoded inside a longer byte string, ``value`` starts at one of three alignments; at each
    the characters fully inside its bits are the same whatever surrounds it.
    """
    cores: set[str] = set()
    for shift in range(3):
        encoded = base64.b64encode(b"\x00" * shift + value).decode().rstrip("=")
        first = -(-shift * 8 // 6)
        last = (shift + len(value)) * 8 // 6
        core = encoded[first:last]
        if len(core) >= _MIN_ENCODED:
            cores.add(core)
            cores.add(core.replace("+", "-").replace("/", "_"))
    return cores


def _all_escaped(secret: str) -> str:
    """Every character as a JSON ``\\uXXXX`` escape (UTF-16 surrogate pairs beyond the BMP)."""
    units = secret.encode("utf-16-be", "surrogatepass")
    return "".join(f"\\u{units[i]:02x}{units[i + 1]:02x}" for i in range(0, len(units), 2))


def secret_forms(secret: str) -> set[str]:
    """The forms a secret travels in: plain, JSON-escaped (``\\/`` and ``\\uXXXX`` too),
    URL-encoded, base64 and base64url, hex, and any of those repr-escaped (as a traceback or
    an exception chain prints them, every backslash doubled)."""
    forms = {secret}
    # JSON-escaped, also twice (a JSON string inside a JSON text, as in a returned payload).
    for _ in range(2):
        forms |= {json.dumps(form, ensure_ascii=flag)[1:-1] for form in list(forms)
                  for flag in (False, True)}
    # JSON may escape "/" (PHP does by default) and any character as \uXXXX.
    forms |= {form.replace("/", "\\/") for form in forms if "/" in form}
    forms.add(_all_escaped(secret))
    for quoted in (urllib.parse.quote(secret, safe=""), urllib.parse.quote(secret),
                   urllib.parse.quote_plus(secret)):
        forms.add(quoted)
    # JSON-unescaped: a string that JSON-escapes to the secret spells it in JSON text.
    try:
        forms.add(json.loads(f'"{secret}"'))
    except ValueError:
        pass
    raw = secret.encode("utf-8", "surrogatepass")
    forms |= _base64_cores(raw)
    forms.add(raw.hex())
    # repr-escaped: Python's repr doubles each backslash (and escapes the quote it uses).
    forms |= {form.replace("\\", "\\\\") for form in forms if "\\" in form}
    forms.add(repr(secret)[1:-1])
    return forms


def _holds_shape(text: str) -> bool:
    """Whether a credential shape (its format check passed) occurs in ``text``."""
    return _may_hold_secret(text) and _shapes_sub(text) != text


_B64_RUN = re.compile(r"(?<![A-Za-z0-9+/_\-])[A-Za-z0-9+/_\-]{16,}+=*+")
#: What joins a name and the base64url run after it (``lookup_QUtJQ…``).
_NAME_JOIN = re.compile(r"[_\-]")
#: A hex run starts with a digit that no digit precedes: matched first, the digit lets the
#: search skip to the next one without trying every character in between.
_HEX_RUN = re.compile(r"[0-9A-Fa-f](?<![0-9A-Fa-f]{2})[0-9A-Fa-f]{31,}+")
#: A run of text between spaces and quotes: what URL-decoding or unescaping is tried on.
_TOKEN_RUN = re.compile(r"(?<![^\s\"'<>])[^\s\"'<>]{8,}+")
#: One or more characters of a run (none a space, quote, bracket or escaped line break): the
#: plain ones a block at a time, a backslash one by one.
_RUN = r"(?:[^\s\"'<>\\]++|\\(?![nr]))++"
_BREAK = r"[ \t]*+(?:(?:\r?+\n|\r)++|(?:\\++[nr])++)[ \t]*+"
#: Runs joined across line breaks (also JSON- and repr-escaped ones), spaces around them,
#: with the word "Bearer" before one (its token is the run).
_SPLIT_RUN = re.compile(
    r"(?<![^\s\"'<>])(?:(?i:bearer)" + _BREAK + _RUN + r"(?:" + _BREAK + _RUN
    + r")*+|(?i:bearer)[ \t]++" + _RUN + r"(?:" + _BREAK + _RUN + r")++|"
    + _RUN + r"(?:" + _BREAK + _RUN + r")++)")
#: A line break and the indent after it (the space before it stays: "Bearer" and its token).
_LINE_BREAKS = re.compile(r"(?:(?:\r?+\n|\r)++|(?:\\++[nr])++)[ \t]*+")
_U_ESCAPE = re.compile(r"\\++u([0-9a-fA-F]{4})")
_SLASH_ESCAPE = re.compile(r"\\++/")


def _unescaped(token: str) -> str:
    """A token's JSON (and repr-doubled) escapes undone: ``\\/``, ``\\uXXXX``, ``\\\\``."""
    if "\\" in token:  # no escape to undo without one
        token = _U_ESCAPE.sub(lambda m: chr(int(m.group(1), 16)), token)
        token = _SLASH_ESCAPE.sub("/", token)
    return token.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


def _b64_decoded(run: str) -> str:
    """A base64 or base64url run decoded as text (``""`` when it is neither)."""
    body = run.rstrip("=")
    body = body + "=" * (-len(body) % 4)
    try:
        raw = base64.b64decode(body.replace("-", "+").replace("_", "/"), validate=True)
    except ValueError:
        return ""
    return raw.decode("utf-8", "replace")


def _encoded_run(match: re.Match[str], decode: Callable[[str], str]) -> str:
    """The run whole, or redacted whole when its decoding holds a credential shape."""
    run = match.group(0)
    decoded = decode(run)
    return REDACTED if decoded and decoded != run and _holds_shape(decoded) else run


def _b64_run(match: re.Match[str]) -> str:
    """A base64 run, decoded from its start and, as base64url may follow a name joined by
    ``_`` or ``-`` (``lookup_QUtJQ…``), from after each of its first few joins."""
    run = match.group(0)
    starts = [0]
    if len(run) <= 4096:
        starts += [join.end() for join in _NAME_JOIN.finditer(run, 0, 64)][:8]
    for start in starts:
        piece = run[start:]
        if len(piece) >= 16:
            decoded = _b64_decoded(piece)
            if decoded and _holds_shape(decoded):
                return run[:start] + REDACTED
    return run


def _hex_decoded(run: str) -> str:
    """A hex run decoded as text (an odd last digit dropped)."""
    return bytes.fromhex(run[:len(run) // 2 * 2]).decode("utf-8", "replace")


def _marked_run(match: re.Match[str], mark: str, decode: Callable[[str], str]) -> str:
    """A run is decoded only when it holds its encoding's mark (``%``, ``\\``)."""
    if mark not in match.group(0):
        return match.group(0)
    return _encoded_run(match, decode)


#: The encodings a run's mark gives away: (mark, what replaces a run of the text holding it).
_MARKED_RUNS: tuple[tuple[str, Callable[[re.Match[str]], str]], ...] = (
    ("%", functools.partial(_marked_run, mark="%", decode=urllib.parse.unquote_plus)),
    ("\\", functools.partial(_marked_run, mark="\\", decode=_unescaped)),
)


def _encoded_shapes(text: str) -> str:
    """Credential shapes that travel encoded: base64 or base64url, hex, URL-encoded,
    JSON- or repr-escaped, or split across lines; each such run is replaced whole.

    A registered secret is found in these forms by its precomputed forms; a key no one
    registered is found here, by decoding what could hold one and looking for its shape.
    """
    runs = _B64_RUN.search(text) is not None
    if runs:
        text = _B64_RUN.sub(_b64_run, text)
    for mark, replace in _MARKED_RUNS:
        if mark in text:
            text = _TOKEN_RUN.sub(replace, text)
    if runs and _HEX_RUN.search(text):  # a hex run of 32 is a base64 run of 16 too
        text = _HEX_RUN.sub(functools.partial(_encoded_run, decode=_hex_decoded), text)
    if _may_be_split(text):
        text = _SPLIT_RUN.sub(functools.partial(_encoded_run, decode=_joined), text)
    return text


#: A real line break with a base64 character (or ``=``) right before it and, past the indent,
#: right after it: each join of a run that decodes as base64 is one.
_BASE64_JOIN = re.compile(r"[\r\n](?<=[A-Za-z0-9+/=_\-][\r\n])[\r\n]*+[ \t]*+[A-Za-z0-9+/=_\-]")


def _may_be_split(text: str) -> bool:
    """Whether a credential may be split across a line break in ``text``: where this is
    false, :func:`_joined` finds none in any run of it.

    A backslash (escaped line breaks, escapes to undo) or a ``%`` may always hide one.
    Without them a run's joined and spaced forms (its ``+`` read as spaces too) are its
    text less some whitespace, so they pass the literal gate only where the whole text
    without its whitespace does; and a run decodes as base64 only where each of its joins
    stands between base64 characters.
    """
    if "\\" in text:
        return True
    if "\n" not in text and "\r" not in text:
        return False
    return ("%" in text or _BASE64_JOIN.search(text) is not None
            or _may_hold_secret("".join(text.split())))


def _joined(run: str) -> str:
    """A run split across lines, joined again (and decoded, as one token may be).

    The spaced form passes the literal gate only where the joined one does (no literal holds
    a space), and a decoding that changed nothing reveals nothing the joined form did not.
    """
    joined = _LINE_BREAKS.sub("", run)
    if _may_hold_secret(joined):
        if _shapes_sub(joined) != joined:
            return joined
        spaced = _LINE_BREAKS.sub(" ", run)  # "Bearer" and its token on lines of their own
        if _holds_shape(spaced):
            return spaced
    for decode in (_b64_decoded, urllib.parse.unquote_plus, _unescaped):
        decoded = decode(joined)
        if decoded and decoded != joined and _holds_shape(decoded):
            return decoded
    return joined


#: Characters that continue an identifier (a path, host, address, URL, key): an allowed
#: value next to one of them is part of something longer than what the model sent.
_IDENTIFIER = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
                        "_.-/\\:@~%+=$#")
#: Sentence punctuation that may follow a value without joining it ("read notes.txt.").
_CLOSING = frozenset(".,:;!?")


def _stands_alone(text: str, start: int, stop: int) -> bool:
    """Whether ``text[start:stop]`` is a whole token: no identifier character touches it,
    but for sentence punctuation followed by the end or a non-identifier character."""
    if start > 0 and (text[start - 1] in _IDENTIFIER or text[start - 1].isalnum()):
        return False
    if stop >= len(text):
        return True
    after = text[stop]
    if after in _CLOSING:
        return stop + 1 >= len(text) or not (text[stop + 1] in _IDENTIFIER
                                              or text[stop + 1].isalnum())
    return not (after in _IDENTIFIER or after.isalnum())


def _keep_whole(text: str, value: str, mark: str) -> str:
    """``text`` with each occurrence of ``value`` that stands alone replaced by ``mark``."""
    out: list[str] = []
    at = 0
    start = text.find(value)
    while start != -1:
        stop = start + len(value)
        if _stands_alone(text, start, stop):
            out.append(text[at:start])
            out.append(mark)
            at = stop
            start = text.find(value, stop)
        else:
            start = text.find(value, start + 1)
    out.append(text[at:])
    return "".join(out)


def _searchable_forms(secrets: Iterable[str]) -> set[str]:
    """The skeletons (see :func:`_skeleton`) of every form of ``secrets``, but those under
    four characters: too short to tell a secret from ordinary text."""
    forms: set[str] = set()
    for secret in secrets:
        skeletons = map(_skeleton, secret_forms(secret))
        forms.update(skeleton for skeleton in skeletons if len(skeleton) >= 4)
    return forms


class Redactor:
    """Removes secrets (always) and internal identifiers (in prose) from outgoing text."""

    __slots__ = ("__weakref__", "_clean", "_forms", "_numeric", "_quoted",
                 "_secrets", "_shortest")

    def __init__(self, secrets: Iterable[str] = (), *, scan_env: bool = True) -> None:
        self._secrets: set[str] = set()
        self._forms: tuple[str, ...] = ()
        #: The forms a number's JSON text could hold (see :meth:`_number_holds`).
        self._numeric: tuple[str, ...] = ()
        #: Below this length no registered form and no shape can occur.
        self._shortest = SHORTEST_SHAPE
        #: Short strings already found clean under the current forms (replaced, never
        #: mutated, by :meth:`add`, so a check racing an ``add`` fills a set no one reads).
        self._clean: set[str] = set()
        #: :meth:`quoted`'s memory, kept and replaced as ``_clean`` is.
        self._quoted: dict[str, str] = {}
        values = list(secrets)
        if scan_env:
            values.extend(_env_secrets())
        self.add(*values)
        _LIVE.add(self)

    def add(self, *secrets: str) -> None:
        """Register secret values that must never appear in any emitted text, in any form."""
        fresh = {s for s in secrets if isinstance(s, str) and len(s) >= 4} - self._secrets
        if not fresh:
            return
        self._secrets |= fresh
        forms = set(self._forms) | _searchable_forms(fresh)
        # Longest first, so a longer form is replaced before a shorter one inside it.
        self._forms = tuple(sorted(forms, key=len, reverse=True))
        self._shortest = min(SHORTEST_SHAPE, len(self._forms[-1])) if self._forms \
            else SHORTEST_SHAPE
        self._numeric = tuple(f for f in self._forms if _NUMBER_CHARS.issuperset(f)
                              or f in "-infinity")
        # After the forms: whoever sees the new memories sees the new forms.
        self._clean = set()
        self._quoted = {}

    def _registered(self, text: str) -> str:
        """Replace registered secrets in any of their forms (see :func:`secret_forms`)."""
        skeleton = _skeleton(text)
        spans: list[tuple[int, int]] = []
        for form in self._forms:
            start = skeleton.find(form)
            while start != -1:
                spans.append((start, start + len(form)))
                start = skeleton.find(form, start + len(form))
        if not spans:
            return text
        # Map skeleton offsets back to the text: removed separators shift everything after.
        cuts: list[int] = []  # skeleton offsets where separators were removed
        widths: list[int] = []  # cumulative characters removed up to that cut
        removed = 0
        for sep in _SEPARATORS.finditer(text.lower() if len(text.lower()) == len(text)
                                        else text.translate(_ASCII_LOWER)):
            cuts.append(sep.start() - removed)
            removed += sep.end() - sep.start()
            widths.append(removed)

        def to_text(offset: int, *, end: bool) -> int:
            # A cut at offset k means the separator sits before skeleton char k.
            i = bisect.bisect_left(cuts, offset) if end else bisect.bisect_right(cuts, offset)
            return offset + (widths[i - 1] if i else 0)

        merged: list[tuple[int, int]] = []
        for start, stop in sorted(spans):
            if merged and start <= merged[-1][1]:
                merged[-1] = (merged[-1][0], max(merged[-1][1], stop))
            else:
                merged.append((start, stop))
        out: list[str] = []
        at = 0
        for start, stop in merged:
            begin, finish = to_text(start, end=False), to_text(stop, end=True)
            out.append(text[at:begin])
            out.append(REDACTED)
            at = finish
        out.append(text[at:])
        return "".join(out)

    def secrets(self, text: str) -> str:
        """Replace secret values (in every form) and credential shapes in ``text``.

        Cheap on the strings a call is made of: one shorter than every registered form and
        every shape cannot hold either, and a short string found clean once is remembered
        (exactly: the memory is dropped whenever a secret is added).
        """
        if len(text) < self._shortest:
            return text
        clean = self._clean
        exact = type(text) is str  # a str subclass may redefine equality: never remembered
        if exact and text in clean:
            return text
        out = self._scrub(text)
        if exact and len(text) <= _CLEAN_LEN and out == text:
            if len(clean) >= _CLEAN_ENTRIES:
                clean.clear()
            clean.add(text)
        return out

    def joined(self, text: str) -> str:
        """A text its caller joined of pieces each already redacted and words of its own (a
        four-part message), redacted: what :meth:`secrets` finds in the whole beyond what it
        found in each piece, registered secrets, whose forms may span pieces.

        A credential shape or an encoded run spanning a join would take in some of the
        caller's words, which hold none: the secret it names is the piece's part, redacted.
        """
        return self._registered(text) if self._forms else text

    def quoted(self, text: str) -> str:
        """``text`` redacted, as a JSON string (quoted and escaped): a trace line's text field.

        Remembered for short strings under the current forms, as :meth:`secrets` remembers
        clean ones: a tool's name, a task id and a mode recur on every line.
        """
        memory = self._quoted
        exact = type(text) is str  # a str subclass may redefine equality: never remembered
        found = memory.get(text) if exact else None
        if found is not None:
            return found
        out = quote_text(self.secrets(text))
        if exact and len(text) <= _CLEAN_LEN:
            if len(memory) >= _CLEAN_ENTRIES:
                memory.clear()
            memory[text] = out
        return out

    def _scrub(self, text: str) -> str:
        """:meth:`secrets` itself, remembering nothing."""
        out = self._registered(text) if self._forms else text
        if _may_hold_secret(out):
            out = _shapes_sub(out)
        if len(out) > SHORTEST_SHAPE:  # an encoded shape is longer than the shape itself
            out = _encoded_shapes(out)
        return out

    def verbatim(self, text: str, obj: dict[str, Any], *, parsed: bool = False) -> bool:
        """Whether ``text``, JSON text of the object ``obj``, may stand for ``value(obj)``
        in the trace: found clean whole, it is what the walk would encode to, once parsed.

        Sound when every string of ``obj`` is spelt in ``text`` as it is (no backslash: no
        escape for a secret to hide behind), each between quotes, so a form or shape the
        walk would find in one is found in the whole text (``"`` neither joins a shape nor
        changes how a neighbour lower-cases); when no key is secret-named (the walk hides
        those by name: one object, the only one with keys); when no registered form could
        hide in a number's own spelling (``1.2345e4`` is ``12345.0``); when nesting cannot
        reach the walk's depth limit; and when the text is one line.  ``parsed``: ``obj``
        is what a JSON parser made of ``text`` (its keys are exact ``str``).
        """
        if self._numeric or "\\" in text or "\n" in text or "\r" in text \
                or text.count("{") != 1 or text.count("[") > _VERBATIM_BRACKETS:
            return False
        if not text.isascii() and len(text.lower()) != len(text):
            return False  # a character that grows lower-cased: skeletons would differ
        return _no_secret_key(obj, parsed) and self._scrub(text) == text

    def _number_holds(self, number: int | float) -> bool:
        """Whether a number's JSON text holds a registered secret (a PIN, a card number)."""
        text = repr(number)
        if text in _NON_FINITE:  # as JSON writes them: NaN, Infinity, -Infinity
            text = _NON_FINITE[text]
        return any(form in text for form in self._numeric)

    def prose(self, text: str, *, allow: Iterable[str] = ()) -> str:
        """Redact secrets, then paths, URLs, hosts, addresses and SQL: for reasons.

        Strings in ``allow`` (the model's own argument values) are the operation's terms, not
        the infrastructure's, so a path the model passed may be named back to it: exactly
        that value, standing alone, never a longer identifier that merely contains it
        (``customer="etc"`` does not keep ``/etc/shadow``).
        """
        text = self.secrets(text)
        kept = sorted((a for a in allow if len(a) >= 2 and a in text), key=len, reverse=True)
        for i, original in enumerate(kept):
            text = _keep_whole(text, original, f"\x00{i}\x00")
        for (pattern, word), gate in _GATED:
            if isinstance(gate, str):
                if gate not in text:
                    continue
            elif not _gate_open(gate, text):
                continue
            text = pattern.sub(word, text)
        for i, original in enumerate(kept):
            text = text.replace(f"\x00{i}\x00", self.secrets(original))
        return text

    def value(self, value: Any, *, key: str | None = None, _depth: int = 0,
              _secret: bool = False) -> Any:
        """A copy of a JSON-like value with secrets removed (key order kept).

        Everything under a secret-named key is redacted, nested lists and objects included;
        bytes are shown as redacted text and other objects by their redacted ``repr``.
        """
        return self._walk(value, key, _depth, _secret)

    def _walk(self, value: Any, key: str | None, depth: int, secret: bool) -> Any:
        """:meth:`value` itself (positional arguments: it runs once per member)."""
        kind = type(value)
        if kind is bool or value is None:
            return value
        secret = secret or (key is not None and _is_secret_key(key))
        if kind is str:
            return REDACTED if secret else self.secrets(value)
        if kind is int or kind is float:
            return REDACTED if secret or (self._numeric and self._number_holds(value)) else value
        if depth > 64:
            return "…"
        return self._nested(value, depth, secret)

    def _nested(self, value: Any, depth: int, secret: bool) -> Any:
        """:meth:`value` of mappings and sequences (exact types first: the common ones), and
        of any other object."""
        kind = type(value)
        if kind is dict:
            return self._mapping(value, depth, secret)
        if kind is list or kind is tuple:
            return self._sequence(value, depth, secret)
        if isinstance(value, Mapping):
            return self._mapping(value, depth, secret)
        if isinstance(value, (list, tuple)):
            return self._sequence(value, depth, secret)
        return REDACTED if secret else self._other(value)

    def _sequence(self, value: Iterable[Any], depth: int, secret: bool) -> list[Any]:
        """:meth:`value` of a list or tuple (members at ``depth + 1``)."""
        walk = self._walk
        return [walk(v, None, depth + 1, secret) for v in value]

    def _other(self, value: Any) -> Any:
        """Subclasses of scalars, bytes, and any other object (by its redacted ``repr``)."""
        if isinstance(value, str):
            return self.secrets(value)
        if isinstance(value, (bytes, bytearray, memoryview)):
            return self.secrets(bytes(value).decode("utf-8", "replace"))
        if isinstance(value, (int, float)):
            return value
        try:
            shown = repr(value)
        except Exception:  # noqa: BLE001 - a hostile __repr__
            shown = f"<{type(value).__name__}>"
        return self.secrets(shown[:2_000])

    def _mapping(self, value: Mapping[Any, Any], depth: int, secret: bool) -> dict[str, Any]:
        """:meth:`value` of a mapping: keys as redacted text, each member under its key's name
        (a secret-named key redacts all below it)."""
        secrets, walk = self.secrets, self._walk
        out: dict[str, Any] = {}
        for k, v in value.items():
            name = k if type(k) is str else str(k)  # str() may return a subclass: secrets() copes
            out[secrets(name)] = walk(v, name, depth + 1, secret)
        return out

    def hidden_values(self, value: Any, *, key: str | None = None, _depth: int = 0) -> set[str]:
        """Strings under secret-named keys: never to be echoed in prose either."""
        found: set[str] = set()
        _hidden_into(value, found, _depth)
        return found


_SCALARS = frozenset({str, int, float, bool, type(None)})


def _hidden_into(value: Any, found: set[str], depth: int) -> None:
    """Add the strings under secret-named keys in ``value`` to ``found``."""
    if depth > 64:
        return
    if type(value) is dict or isinstance(value, Mapping):
        _hidden_in_mapping(value, found, depth)
    elif isinstance(value, (list, tuple)):
        for v in value:
            if type(v) not in _SCALARS:
                _hidden_into(v, found, depth + 1)


def _hidden_in_mapping(value: Mapping[Any, Any], found: set[str], depth: int) -> None:
    """:func:`_hidden_into` of a mapping: every leaf under a secret name, the others walked."""
    for k, v in value.items():
        if _is_secret_key(k if type(k) is str else str(k)):
            found |= _leaf_strings(v)
        elif type(v) not in _SCALARS:
            _hidden_into(v, found, depth + 1)


def _leaf_strings(value: Any, depth: int = 0) -> set[str]:
    if isinstance(value, (str, int, float)) and not isinstance(value, bool):
        text = str(value)
        return {text} if len(text) >= 4 else set()
    if depth > 64:
        return set()
    if isinstance(value, Mapping):
        return set().union(*(_leaf_strings(v, depth + 1) for v in value.values()))
    if isinstance(value, (list, tuple)):
        return set().union(*(_leaf_strings(v, depth + 1) for v in value))
    return set()


#: Every live redactor, so log records are redacted with every guard's secrets.
_LIVE: weakref.WeakSet[Redactor] = weakref.WeakSet()


class RedactingFilter(logging.Filter):
    """Redacts toolfault's log records: message, arguments and any traceback text.

    Tracebacks are dropped unless the logger is at DEBUG or a guard asked for them
    (``Guard(log_tracebacks=True)``); kept ones are redacted like the message.
    """

    tracebacks = False

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # noqa: BLE001 - a record whose arguments do not format
            message = str(record.msg)
        for redactor in list(_LIVE):
            message = redactor.secrets(message)
        if not _LIVE:
            message = Redactor(scan_env=True).secrets(message)
        record.msg, record.args = message, None
        keep = self.tracebacks or logging.getLogger("toolfault").isEnabledFor(logging.DEBUG)
        if record.exc_info and keep:
            import traceback

            text = "".join(traceback.format_exception(*record.exc_info))
            for redactor in list(_LIVE):
                text = redactor.secrets(text)
            record.exc_text = text.rstrip("\n")
        elif not keep:
            record.exc_text = None
        record.exc_info = None
        record.stack_info = None
        return True


LOG_FILTER = RedactingFilter()
