"""The canary matrix: secrets of many kinds, in every form, placed everywhere, per channel.

A canary is a secret the guard knows (registered, or in a secret-named environment
variable).  Each is placed, in one of its travelling forms, in one spot of a call; then every
channel the call reaches is searched for the form as placed and for the plain secret.
"""

from __future__ import annotations

import base64
import io
import json
import logging
import os
import urllib.parse
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from toolfault import Backoff, CallEvent, Guard, Limits, ToolError
from toolfault.stores import SQLiteStore

#: (kind, value, registered?) — registered ones are given to the guard, the others are found
#: by name in the environment.
KINDS: tuple[tuple[str, str, bool], ...] = (
    ("password", "Tr0ub4dor&3-horse", True),
    ("api_token", "tok_live_9f8e7d6c5b4a3210", True),
    ("openai_key", "sk-proj-Qw3rTy8uIoPaSdFgHjKl0987", True),
    ("aws_key", "AKIAQ3EGUCUMBERS2X7Z", True),
    ("jwt", "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJjYW5hcnkifQ.c2lnbmF0dXJlLWNhbmFyeQ", True),
    ("quotes_and_unicode", 'pa"ss\\wörd {x} 9!', True),
    ("env_api_key", "envkey-3b1f9a77c0de42d1", False),
    ("env_password", "EnvPassw0rd!2026#q", False),
    ("env_db_url_secret", "postgres-s3cret-7781aa", False),
)
ENV_NAMES = {"env_api_key": "CANARY_SERVICE_API_KEY", "env_password": "CANARY_DB_PASSWORD",
             "env_db_url_secret": "CANARY_DB_SECRET"}
#: (kind, value placed, the secret part of it) — credential shapes nobody registered: the
#: redactor must know them by their format alone.
#: No "gh" but in its prefix: the gate once looked for "gh" before ``github_pat_``.
_GITHUB_PAT = ("github_pat_u8jzPde0IgxLd6GncfBAep_fJBd0Kh8oOOL8dKLzdocJ2isAjIhKtJ0RlgLKOmxgJTe"
               "KdNnFRIBXuDL7Dx")
SHAPES: tuple[tuple[str, str, str], ...] = (
    ("url_password", "postgres://app:Zq7Pw-url-4411@db.internal/app", "Zq7Pw-url-4411"),
    ("shape_openai_key", "sk-proj-Mn4bVc7xZl2kJh9gFd5sAp0o", "sk-proj-Mn4bVc7xZl2kJh9gFd5sAp0o"),
    ("shape_aws_key", "AKIAZ7Q4LMNB2XCV8RT6", "AKIAZ7Q4LMNB2XCV8RT6"),
    ("shape_bearer", "Bearer 9fQ2-zX81ab.Qr7Tt", "9fQ2-zX81ab.Qr7Tt"),
    ("shape_jwt", "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJzaGFwZSJ9.c2hhcGUtc2lnbmF0dXJl",
     "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJzaGFwZSJ9.c2hhcGUtc2lnbmF0dXJl"),
    ("shape_github_token", "ghp_Ab3dEf6hIj9kLm2nOp5qRs8tUv1wXy4zAb7c",
     "ghp_Ab3dEf6hIj9kLm2nOp5qRs8tUv1wXy4zAb7c"),
    ("shape_github_pat", _GITHUB_PAT, _GITHUB_PAT),
)
#: How the figures name each shape.
SHAPE_LABELS = {"url_password": "URL password", "shape_openai_key": "sk-",
                "shape_aws_key": "AKIA", "shape_bearer": "bearer", "shape_jwt": "JWT",
                "shape_github_token": "ghp_", "shape_github_pat": "github_pat_"}
#: Forms that change a credential's letters: a case-folded key is no longer the key, so
#: shapes are not tried in them (registered and environment secrets are).
CASE_FORMS = ("upper", "lower")


def _split(value: str) -> str:
    third = max(1, len(value) // 3)
    return f"{value[:third]}\n{value[third:2 * third]}\r\n  {value[2 * third:]}"


FORMS: dict[str, Callable[[str], str]] = {
    "plain": lambda v: v,
    "base64": lambda v: base64.b64encode(f"user:{v}".encode()).decode(),
    "base64url": lambda v: base64.urlsafe_b64encode(v.encode()).decode().rstrip("="),
    "url_encoded": lambda v: urllib.parse.quote(v, safe=""),
    "json_escaped": lambda v: json.dumps(v)[1:-1],
    "json_slash": lambda v: json.dumps(v)[1:-1].replace("/", "\\/"),
    "unicode_escaped": lambda v: "".join(f"\\u{ord(c):04x}" for c in v),
    "hex": lambda v: v.encode().hex(),
    "repr_escaped": lambda v: repr(json.dumps(_split(v)))[1:-1],
    "upper": lambda v: v.upper(),
    "lower": lambda v: v.lower(),
    "split_lines": _split,
}
PLACEMENTS = ("argument", "secret_named_argument", "nested_argument", "bytes_argument",
              "raw_json", "return_value", "exception_text", "exception_chain",
              "tool_error_reason", "next_action", "unknown_tool_name", "timeout_text",
              "call_id")
CHANNELS = ("text", "data", "trace", "spans", "observers", "logs", "ledger", "store",
            "incidents")


@dataclass
class Matrix:
    """Leaks per channel and per form over every trial of the matrix."""

    trials: int = 0
    leaks: dict[str, int] = field(default_factory=lambda: dict.fromkeys(CHANNELS, 0))
    by_form: dict[str, int] = field(default_factory=lambda: dict.fromkeys(FORMS, 0))
    #: Leaks per (channel, form): the published table (0 is the bar in every cell).
    cells: dict[tuple[str, str], int] = field(default_factory=dict)
    #: Trials per group of kinds: registered, environment, shape.
    groups: dict[str, int] = field(default_factory=lambda: dict.fromkeys(
        ("registered", "environment", "shape"), 0))
    #: Trials in which the channel held anything at all (a silent channel proves nothing).
    seen: dict[str, int] = field(default_factory=lambda: dict.fromkeys(CHANNELS, 0))
    examples: list[str] = field(default_factory=list)


def _needles(secret: str, placed: str) -> list[str]:
    """What counts as a leak: the plain secret and the placed form, also as JSON text."""
    found = {secret, placed, json.dumps(placed)[1:-1], json.dumps(secret)[1:-1]}
    # A split form leaks when any line of it keeps a long piece of the secret? No: pieces
    # shorter than the whole are not the secret; the full form, in any escaping, is.
    return [n for n in found if len(n) >= 6]


class _Capture(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []
        self.setFormatter(logging.Formatter("%(levelname)s %(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(self.format(record))


_EXPORTER = InMemorySpanExporter()
_PROVIDER = TracerProvider()
_PROVIDER.add_span_processor(SimpleSpanProcessor(_EXPORTER))


def _swap_provider(provider: Any) -> Any:
    """Install a tracer provider for the matrix only (the global one can be set only once,
    and other tests set theirs), returning the one it replaced."""
    saved = trace._TRACER_PROVIDER  # type: ignore[attr-defined]
    trace._TRACER_PROVIDER = provider  # type: ignore[attr-defined]
    return saved


def _call_for(placement: str, placed: str) -> tuple[str, Any, Callable[[Guard], None]]:
    """The tool name, arguments and tool registration for one placement."""

    def register(guard: Guard) -> None:
        @guard.tool(side_effect=True, idempotency_key=["note"])
        def book(note: Any = None, password: Any = None, mode: str = "") -> Any:
            if mode == "return":
                return {"note": note, "echo": placed}
            if mode == "exception":
                raise ValueError(f"note {placed} is not valid")
            if mode == "chain":  # a KeyError's text is its argument's repr (backslashes doubled)
                try:
                    raise KeyError(f"note {placed}")
                except KeyError as exc:
                    raise RuntimeError("lookup failed") from exc
            if mode == "reason":
                raise ToolError("invalid_argument", f"note {placed} is not valid")
            if mode == "next":
                raise ToolError("conflict", "note taken", next_action=f"use {placed}")
            if mode == "timeout":
                raise TimeoutError(placed)
            raise ToolError("conflict", "note taken")

    args: Any
    name = "book"
    if placement == "argument":
        args = {"note": placed}
    elif placement == "secret_named_argument":
        args = {"note": "n", "password": placed}
    elif placement == "nested_argument":
        args = {"note": {"deep": [placed, {"k": placed}]}}
    elif placement == "bytes_argument":
        args = {"note": placed.encode()}
    elif placement == "raw_json":
        args = '{"note": ' + json.dumps(placed) + ", broken"
    elif placement == "unknown_tool_name":
        name, args = f"lookup_{placed}", {"note": placed}
    else:
        mode = {"return_value": "return", "exception_text": "exception",
                "tool_error_reason": "reason", "next_action": "next",
                "timeout_text": "timeout", "exception_chain": "chain",
                "call_id": ""}[placement]
        args = {"note": "n", "mode": mode}
    return name, args, register


def _env(matrix_env: dict[str, str]) -> Iterator[None]:
    saved = {k: os.environ.get(k) for k in matrix_env}
    os.environ.update(matrix_env)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def run_matrix(workdir: Path, *, kinds: int = len(KINDS),
               placements: tuple[str, ...] = PLACEMENTS, shapes: bool = True) -> Matrix:
    """Every kind x form x placement, each searched for in every channel."""
    saved_provider = _swap_provider(_PROVIDER)
    matrix = Matrix()
    env = {ENV_NAMES[k]: v for k, v, registered in KINDS if not registered}
    gen = _env(env)
    next(gen)
    logger = logging.getLogger("toolfault")
    capture = _Capture()
    logger.addHandler(capture)
    old_level = logger.level
    logger.setLevel(logging.DEBUG)  # the harshest case: tracebacks kept (redacted)
    try:
        n = 0
        trials = [(kind, secret, secret, registered) for kind, secret, registered
                  in KINDS[:kinds]]
        if shapes:
            trials += [(kind, value, secret, None) for kind, value, secret in SHAPES]
        for kind, value, secret, registered in trials:
            for form_name, form in FORMS.items():
                if registered is None and form_name in CASE_FORMS:
                    continue
                placed = form(value)
                for placement in placements:
                    n += 1
                    matrix.groups["shape" if registered is None else "registered"
                                  if registered else "environment"] += 1
                    _trial(matrix, workdir / f"t{n}", kind, secret, bool(registered),
                           form_name, placed, placement, capture)
    finally:
        _swap_provider(saved_provider)
        logger.setLevel(old_level)
        logger.removeHandler(capture)
        try:
            next(gen)
        except StopIteration:
            pass
    return matrix


def _trial(matrix: Matrix, workdir: Path, kind: str, secret: str, registered: bool,
           form_name: str, placed: str, placement: str, capture: _Capture) -> None:
    workdir.mkdir(parents=True, exist_ok=True)
    trace_out = io.StringIO()
    db = workdir / "state.db"
    store = SQLiteStore(db)
    events: list[CallEvent] = []
    guard = Guard(secrets=[secret] if registered else [], scan_env_secrets=True,
                  store=store, trace=trace_out, capture_content=True, observers=[events.append],
                  limits=Limits(retry_limit=1, backoff=Backoff(attempts=1)))
    name, args, register = _call_for(placement, placed)
    register(guard)
    capture.lines.clear()
    _EXPORTER.clear()
    call_id = placed if placement == "call_id" else None
    # the 2nd hits the cap
    results = [guard.call(name, args, call_id=call_id), guard.call(name, args, call_id=call_id)]
    channels = {
        "text": "\n".join(r.text + "\n" + r.tool for r in results),
        "data": "\n".join(json.dumps(r.data, default=str) for r in results),
        "trace": trace_out.getvalue(),
        "spans": json.dumps([dict(s.attributes or {}) | {"name": s.name}
                             for s in _EXPORTER.get_finished_spans()], default=str),
        "observers": json.dumps([e.to_dict() for e in events], default=str),
        "logs": "\n".join(capture.lines),
        "ledger": json.dumps([e.to_dict() for e in guard.ledger], default=str),
        "incidents": json.dumps([i.to_dict() for i in guard.incidents], default=str),
    }
    guard.close()
    channels["store"] = "\n".join(
        p.read_bytes().decode("utf-8", "replace") for p in workdir.glob("state.db*"))
    matrix.trials += 1
    needles = _needles(secret, placed)
    for channel, text in channels.items():
        matrix.seen[channel] += int(len(text) > 2)
        lowered = text.lower()
        if any(n in text or n.lower() in lowered for n in needles):
            matrix.leaks[channel] += 1
            matrix.by_form[form_name] += 1
            matrix.cells[channel, form_name] = matrix.cells.get((channel, form_name), 0) + 1
            if len(matrix.examples) < 8 or channel not in ("ledger", "store"):
                matrix.examples.append(f"{kind}/{form_name}/{placement} -> {channel}")
