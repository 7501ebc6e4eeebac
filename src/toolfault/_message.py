"""The four-part message, the terminal message and their structured twin.

This is the only place that knows the wording of the contract (see DESIGN.md), so the guard,
the docs generator and the lint all render through it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from toolfault._errors import Outcome

#: Display limits for echoed arguments: long values are shortened, never the message budget.
MAX_STRING = 64
MAX_ITEMS = 8
MAX_DEPTH = 4
MAX_ARGS_CHARS = 300

EFFECT_WORD = {Outcome.NO_EFFECT: "none", Outcome.UNKNOWN: "unknown", Outcome.APPLIED: "applied"}


def _shrink(value: Any, depth: int = 0) -> Any:
    if isinstance(value, str):
        if len(value) > MAX_STRING:
            return f"{value[:MAX_STRING - 20]}…(+{len(value) - (MAX_STRING - 20)} chars)"
        return value
    if isinstance(value, float) and value != value:  # NaN: keep it visible, not JSON-invalid
        return "NaN"
    if isinstance(value, float) and value in (float("inf"), float("-inf")):
        return "Infinity" if value > 0 else "-Infinity"
    if isinstance(value, Mapping):
        if depth >= MAX_DEPTH:
            return "{…}"
        items = list(value.items())
        out = {str(k): _shrink(v, depth + 1) for k, v in items[:MAX_ITEMS]}
        if len(items) > MAX_ITEMS:
            out["…"] = f"+{len(items) - MAX_ITEMS} more keys"
        return out
    if isinstance(value, (list, tuple)):
        if depth >= MAX_DEPTH:
            return ["…"]
        shown = [_shrink(v, depth + 1) for v in value[:MAX_ITEMS]]
        if len(value) > MAX_ITEMS:
            shown.append(f"…(+{len(value) - MAX_ITEMS} items)")
        return shown
    if value is None or isinstance(value, (bool, int, float)):
        return value
    return repr(value)[:MAX_STRING]


def echo_args(args: Any, *, max_chars: int = MAX_ARGS_CHARS) -> str:
    """Arguments as the model sent them (key order kept), shortened to fit the budget."""
    try:
        text = json.dumps(_shrink(args), ensure_ascii=False)
    except (TypeError, ValueError, RecursionError):
        text = json.dumps(repr(args)[:max_chars])
    if len(text) > max_chars:
        text = f"{text[:max_chars - 40]}…(truncated, {len(text)} chars in all)"
    return text


def sentence(text: str) -> str:
    """One sentence: trimmed, single-line, ending in exactly one full stop."""
    text = " ".join(text.split()).rstrip(". ")
    return f"{text}." if text else ""


def verdict(outcome: Outcome, retryable: bool, retry_after: float | None) -> str:
    """The retry verdict, stated rather than implied."""
    if outcome is Outcome.APPLIED:
        return "The action already happened; do not repeat it."
    if outcome is Outcome.UNKNOWN:
        return "It is not known whether the action happened; do not retry before checking."
    if not retryable:
        return "Retrying the same call will not help."
    if retry_after:
        return f"Retrying after {format_seconds(retry_after)} may help."
    return "Retrying later may help."


def format_seconds(seconds: float) -> str:
    """``2 seconds``, ``1 second``, ``0.5 seconds``."""
    value = round(float(seconds), 1)
    text = str(int(value)) if value.is_integer() else str(value)
    return f"{text} second" if text == "1" else f"{text} seconds"


@dataclass(frozen=True, slots=True)
class Rendered:
    """A rendered failure: what the model reads and the same content as data."""

    text: str
    problem: dict[str, Any]


def render_error(
    *,
    tool: str,
    code: str,
    reason: str,
    args_text: str,
    outcome: Outcome,
    retryable: bool,
    retry_after: float | None,
    next_action: str,
    title: str = "",
    failure_class: str = "",
) -> Rendered:
    """The four-part message (code, reason, rejected arguments, effect + verdict, next action)."""
    said = verdict(outcome, retryable, retry_after)
    text = (
        f"{tool} failed (code: {code}).\n"
        f"Reason: {sentence(reason)}\n"
        f"Rejected arguments: {args_text}.\n"
        f"Effect: {EFFECT_WORD[outcome]}. {said}\n"
        f"Next action: {sentence(next_action)}"
    )
    problem: dict[str, Any] = {
        "type": f"urn:toolfault:error:{code}",
        "title": title or code.replace("_", " "),
        "detail": sentence(reason),
        "code": code,
        "tool": tool,
        "rejected_arguments": args_text,
        "effect": EFFECT_WORD[outcome],
        "retryable": retryable,
        "next_action": sentence(next_action),
    }
    if failure_class:
        problem["failure_class"] = failure_class
    if retry_after:
        problem["retry_after"] = retry_after
    return Rendered(text, problem)


def join_moves(moves: Sequence[str]) -> str:
    """``a``; ``a, or b``; ``a, b, or c`` — always ending with stop-and-report."""
    every = [*moves, "stop and report this failure to the user"]
    if len(every) == 1:
        return every[0]
    return ", ".join(every[:-1]) + ", or " + every[-1]


def render_terminal(
    *, tool: str, code: str, count: int, moves: Sequence[str], args_text: str,
    blocked_for: float | None = None,
) -> Rendered:
    """The message after the cap: retrying is not allowed, here are the only legal moves.

    ``blocked_for`` states how long the block lasts when blocks expire (``Limits.block_seconds``).
    """
    lead = "You must now either " if moves else "You must now "
    window = f" for the next {format_seconds(blocked_for)}" if blocked_for else ""
    text = (
        f"{tool} failed {count} times with identical arguments (code: {code}).\n"
        f"Retrying the same call is not allowed{window}.\n"
        f"{lead}{join_moves(moves)}."
    )
    problem: dict[str, Any] = {
        "type": "urn:toolfault:error:retry_limit",
        "title": "retry limit reached",
        "detail": f"{tool} failed {count} times with identical arguments.",
        "code": code,
        "tool": tool,
        "rejected_arguments": args_text,
        "terminal": True,
        "retryable": False,
        "allowed_moves": [*moves, "stop and report this failure to the user"],
    }
    if blocked_for:
        problem["retry_after"] = blocked_for
    return Rendered(text, problem)
