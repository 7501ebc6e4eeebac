"""The four-part message, the terminal message and their structured twin.

This is the only place that knows the wording of the contract (see DESIGN.md), so the guard,
the docs generator and the lint all render through it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

from toolfault._errors import Outcome
from toolfault._jsontext import prebuilt_encoder
from toolfault._redact import REDACTED, _is_secret_key

if TYPE_CHECKING:
    from toolfault._redact import Redactor

#: Display limits for echoed arguments: long values are shortened, never the message budget.
MAX_STRING = 64
MAX_ITEMS = 8
MAX_DEPTH = 4
MAX_ARGS_CHARS = 300

EFFECT_WORD = {Outcome.NO_EFFECT: "none", Outcome.UNKNOWN: "unknown", Outcome.APPLIED: "applied"}

_INFINITIES = (float("inf"), float("-inf"))
_SCALARS = frozenset({str, int, float, bool, type(None)})
#: ``json.dumps(value, ensure_ascii=False)`` without building an encoder per message.
_encode_echo = prebuilt_encoder(sort_keys=False, separators=(", ", ": "), allow_nan=True)


def _as_is(value: Any) -> bool:
    """A scalar ``_shrink`` would return unchanged (decided without a call per member)."""
    kind = type(value)
    return kind is int or kind is bool or value is None or (
        kind is str and len(value) <= MAX_STRING)


def _shrink(value: Any, depth: int = 0) -> Any:
    """An argument as the echo shows it: long strings and collections shortened, nesting
    past ``MAX_DEPTH`` elided, floats JSON cannot hold in words, anything else its repr."""
    if _as_is(value):
        return value
    if isinstance(value, str):
        return _short(value)
    if isinstance(value, float):
        return _shrink_float(value)
    if type(value) is dict or isinstance(value, Mapping):
        return "{…}" if depth >= MAX_DEPTH else _shrink_mapping(value, depth)
    if isinstance(value, (list, tuple)):
        return ["…"] if depth >= MAX_DEPTH else _shrink_list(value, depth)
    if isinstance(value, (bool, int)):
        return value
    return repr(value)[:MAX_STRING]


def _shrink_float(value: float) -> float | str:
    """A float as JSON can show it: NaN and the infinities in words, visible, not invalid."""
    if value != value:
        return "NaN"
    if value in _INFINITIES:
        return "Infinity" if value > 0 else "-Infinity"
    return value


def _shrink_list(value: Sequence[Any], depth: int) -> list[Any]:
    """The first ``MAX_ITEMS`` items, shrunk, and how many more there were."""
    shown = [v if _as_is(v) else _shrink(v, depth + 1) for v in value[:MAX_ITEMS]]
    if len(value) > MAX_ITEMS:
        shown.append(f"…(+{len(value) - MAX_ITEMS} items)")
    return shown


def _shrink_mapping(value: Mapping[Any, Any], depth: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for i, (k, v) in enumerate(value.items()):
        if i == MAX_ITEMS:
            out["…"] = f"+{len(value) - MAX_ITEMS} more keys"
            break
        out[k if type(k) is str else str(k)] = v if _as_is(v) else _shrink(v, depth + 1)
    return out


def echo_args(args: Any, *, max_chars: int = MAX_ARGS_CHARS) -> str:
    """Arguments as the model sent them (key order kept), shortened to fit the budget."""
    try:
        text = _encode_echo(_shrink(args))
    except (TypeError, ValueError, RecursionError):
        text = json.dumps(repr(args)[:max_chars])
    return cut_echo(text, max_chars)


def cut_echo(text: str, max_chars: int) -> str:
    """Echoed arguments cut to ``max_chars``, saying how long they were."""
    if len(text) > max_chars:
        note = f"…(truncated, {len(text)} chars in all)"
        if max_chars - len(note) >= 8:
            text = f"{text[:max_chars - len(note)]}{note}"
        else:
            text = f"{text[:max(1, max_chars - 1)]}…"
    return text


def redacted_echo(args: dict[Any, Any], redactor: Redactor) -> tuple[str | None, set[str]]:
    """The whole echo of ``args`` as ``echo_args(redactor.value(args))`` would encode it
    before cutting it to length, and ``redactor.hidden_values(args)``, in one walk.

    A failure needs both; walking the arguments once instead of three times (redact, shrink,
    look for values under secret-named keys) is most of what a first-time failure costs.
    Members the echo leaves out (past the eighth, past depth four) are only searched for
    hidden values, never redacted: nothing of them is shown.  The text is ``None`` when the
    shown value cannot be encoded (an absurdly large int): the caller takes the slow path.
    """
    hidden: set[str] = set()
    shown = _echo_mapping(args, 0, False, redactor, hidden)
    try:
        return _encode_echo(shown), hidden
    except (TypeError, ValueError, RecursionError):
        return None, hidden


def _short(text: str) -> str:
    """A string member as :func:`_shrink` shows it."""
    if len(text) <= MAX_STRING:
        return text
    return f"{text[:MAX_STRING - 20]}…(+{len(text) - (MAX_STRING - 20)} chars)"


def _echo_mapping(value: Mapping[Any, Any], depth: int, secret: bool, redactor: Redactor,
                  hidden: set[str] | None) -> dict[str, Any]:
    """``_shrink_mapping(redactor._mapping(value))``; hidden values into ``hidden``.

    Keys are redacted first, as :meth:`Redactor.value` does, so two keys that redact alike
    collapse into one (the first place, the last value) before the first eight are kept.
    """
    secrets = redactor.secrets
    out: dict[str, Any] = {}
    beyond: set[str] = set()  # keys past the eighth: counted, not shown
    for k, v in value.items():
        name = k if type(k) is str else _name_of(k)
        keyed = _is_secret_key(name)
        below = _hidden_below(name, v, keyed, redactor, hidden)
        key = secrets(name)
        if len(out) >= MAX_ITEMS and key not in out:
            beyond.add(key)
            _hidden_in(v, depth + 1, redactor, below)
            continue
        out[key] = _echo_value(v, depth + 1, secret or keyed, redactor, below)
    if beyond:
        out["…"] = f"+{len(beyond)} more keys"
    return out


def _hidden_below(name: str, value: Any, keyed: bool, redactor: Redactor,
                  hidden: set[str] | None) -> set[str] | None:
    """The set the walk of a member adds its hidden values to: ``hidden``, but none
    (``None``) under a secret name, whose every hidden value is collected here at once."""
    if not keyed or hidden is None:
        return hidden
    hidden |= redactor.hidden_values({name: value})
    return None


_ECHO_SCALARS = frozenset({str, int, float, bool, type(None)})


def _echo_scalar(value: Any, kind: type, hide: bool, secrets: Callable[[str], str]) -> Any:
    """A string, number, bool or ``None`` member as the echo shows it (``hide``: under a
    secret name, so its value is never shown; a bool or ``None`` tells nothing)."""
    if kind is bool or value is None:
        return value
    if hide:
        return REDACTED
    if kind is str:
        shown = secrets(value)
        return _short(shown)
    if kind is int:
        return value
    return value if value - value == 0.0 else _shrink_float(value)  # NaN, infinities: in words


def _name_of(key: Any) -> str:
    """A key that is not a str as the plain str its echo shows (never a str subclass)."""
    text = str(key)
    return text if type(text) is str else str.__str__(text)


def _hidden_in(value: Any, depth: int, redactor: Redactor, hidden: set[str] | None) -> None:
    """Hidden values in a member the echo leaves out (it is searched, never shown), when the
    caller collects them."""
    if hidden is not None and type(value) not in _SCALARS:
        hidden |= redactor.hidden_values(value, _depth=depth)


def _echo_value(value: Any, depth: int, secret: bool, redactor: Redactor,
                hidden: set[str] | None) -> Any:
    """``_shrink(redactor.value(value), depth)`` (no key: the caller decided ``secret``)."""
    kind = type(value)
    if kind in _ECHO_SCALARS:
        return _echo_scalar(value, kind, secret, redactor.secrets)
    if _is_mapping(value, kind):
        if depth < MAX_DEPTH:
            return _echo_mapping(value, depth, secret, redactor, hidden)
        _hidden_in(value, depth, redactor, hidden)
        return "{…}"
    if isinstance(value, (list, tuple)):
        if depth < MAX_DEPTH:
            return _echo_list(value, depth, secret, redactor, hidden)
        _hidden_in(value, depth, redactor, hidden)
        return ["…"]
    return REDACTED if secret else _shrink(redactor.value(value, _depth=depth), depth)


def _is_mapping(value: Any, kind: type) -> bool:
    """A dict or another Mapping; a list or tuple (the usual member) is decided without an
    ABC check."""
    return kind is dict or (kind is not list and kind is not tuple
                            and isinstance(value, Mapping))


def _echo_list(value: Sequence[Any], depth: int, secret: bool, redactor: Redactor,
               hidden: set[str] | None) -> list[Any]:
    items = value if type(value) is list or type(value) is tuple else list(value)
    shown = [_echo_value(v, depth + 1, secret, redactor, hidden) for v in items[:MAX_ITEMS]]
    if len(items) > MAX_ITEMS:
        shown.append(f"…(+{len(items) - MAX_ITEMS} items)")
        if hidden is not None:
            for v in items[MAX_ITEMS:]:
                _hidden_in(v, depth + 1, redactor, hidden)
    return shown


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


class Parts(NamedTuple):
    """What a four-part message is rendered from: joined with :func:`render_error`'s own
    words, its text."""

    tool: str
    code: str
    reason: str
    args_text: str
    effect: str
    said: str
    next_action: str

    def text(self) -> str:
        return (f"{self.tool} failed (code: {self.code}).\n"
                f"Reason: {self.reason}\n"
                f"Rejected arguments: {self.args_text or '{}'}.\n"
                f"Effect: {self.effect}. {self.said}\n"
                f"Next action: {self.next_action}")


#: The outcome each ``Effect:`` word names.
_OUTCOME_OF = {word: outcome for outcome, word in EFFECT_WORD.items()}
#: The problem's fields that hold a four-part message's words, as :func:`render_error` fills them.
_WORD_FIELDS = ("tool", "code", "detail", "rejected_arguments", "effect", "next_action")


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
    # Never an empty part: the shape is the contract even when a tool said nothing.
    reason = sentence(reason) or sentence(f"{tool} failed")
    next_action = sentence(next_action) or "stop and report this failure to the user."
    effect = EFFECT_WORD[outcome]
    text = Parts(tool, code, reason, args_text, effect, said, next_action).text()
    problem: dict[str, Any] = {
        "type": f"urn:toolfault:error:{code}",
        "title": title or code.replace("_", " "),
        "detail": reason,
        "code": code,
        "tool": tool,
        "rejected_arguments": args_text,
        "effect": effect,
        "retryable": retryable,
        "next_action": next_action,
    }
    if failure_class:
        problem["failure_class"] = failure_class
    if retry_after:
        problem["retry_after"] = retry_after
    return Rendered(text, problem)


def parts_of(problem: Any) -> Parts | None:
    """The parts :func:`render_error` rendered ``problem``'s text from, read back from the
    problem (the verdict from its effect, retryability and wait); ``None`` when ``problem``
    has not the fields and types render_error gives it."""
    if type(problem) is not dict:
        return None
    words: list[Any] = [problem.get(field) for field in _WORD_FIELDS]
    retryable, retry_after = problem.get("retryable"), problem.get("retry_after")
    if not all(type(word) is str for word in words) or type(retryable) is not bool or \
            not (retry_after is None or type(retry_after) in (int, float)):
        return None
    tool, code, reason, args_text, effect, next_action = words
    outcome = _OUTCOME_OF.get(effect)
    if outcome is None:
        return None
    return Parts(tool, code, reason, args_text, effect, verdict(outcome, retryable, retry_after),
                 next_action)


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


#: The lines a message may cut, most expendable first: their label, their problem field,
#: whether the arguments the instruction names are kept whole, and the problem field's end.
#: The first line (the code) and the next action are never cut: they are the instruction.
_CUTTABLE = (("Rejected arguments: ", "rejected_arguments", True, ""),
             ("Reason: ", "detail", False, "."))
#: Past this many times the budget (an absurd tool name or verdict), every line is cut.
_ABSURD = 2
ELLIPSIS = "…"


def shorten(text: str, fits: Callable[[str], bool]) -> str:
    """The longest prefix of ``text`` that, ending in an ellipsis, still ``fits``.

    Cut at a word boundary when one is near, counted by the caller (in tokens), so runs of
    one repeated character and CJK text are cut as surely as words.
    """
    if fits(text):
        return text
    text = text[:4_000]
    low, high = 0, len(text)
    while low < high:
        mid = (low + high + 1) // 2
        if fits(text[:mid].rstrip() + ELLIPSIS):
            low = mid
        else:
            high = mid - 1
    head = text[:low]
    space = head.rfind(" ")
    if space >= max(1, low - 12) and fits(head[:space].rstrip() + ELLIPSIS):
        head = head[:space]
    return head.rstrip() + ELLIPSIS


def fit_to_budget(text: str, problem: dict[str, Any], budget: int,
                  count: Callable[[str], int]) -> tuple[str, dict[str, Any]]:
    """A message cut to ``budget`` tokens, line by line, keeping its four-part shape.

    The rejected arguments go first, then the reason, then the next action; each cut line
    ends in an ellipsis and a full stop, and the structured twin carries the same words.
    """
    text, problem, _ = fit_and_count(text, problem, budget, count)
    return text, problem


def fit_and_count(text: str, problem: dict[str, Any], budget: int,
                  count: Callable[[str], int]) -> tuple[str, dict[str, Any], int]:
    """:func:`fit_to_budget`, also returning the message's tokens (the figure a trace
    reports as the error's cost), so the same text is not counted again downstream."""
    tokens = count(text)
    if tokens <= budget:
        return text, problem, tokens
    text, problem = _cut(text, problem, budget, count)
    return text, problem, count(text)


def _cut(text: str, problem: dict[str, Any], budget: int,
         count: Callable[[str], int]) -> tuple[str, dict[str, Any]]:
    """Cut the rejected arguments (keeping the ones the reason or the next action names),
    then the reason; the code and the next action stay whole (the message may then stay a
    little over budget: the instruction matters more than its size)."""
    lines = text.split("\n")
    problem = dict(problem)
    named = _instruction_words(lines)
    for label, field, keeps_named, end in _CUTTABLE:
        index = _line_index(lines, label)
        if index is None:
            continue
        new = _cut_line(lines, index, label, named if keeps_named else "", budget, count)
        if isinstance(problem.get(field), str):
            problem[field] = f"{new}{end}"
        if count("\n".join(lines)) <= budget:
            break
    text = "\n".join(lines)
    if count(text) > _ABSURD * budget:
        text = _cut_every_line(lines, budget, count)
    return text, problem


def _cut_every_line(lines: list[str], budget: int, count: Callable[[str], int]) -> str:
    """Every line cut to its share of the budget, each still ending in a full stop: for a
    message whose uncuttable lines alone are far over it (a very long tool name or verdict)."""
    per = max(4, budget // max(1, len(lines)))
    lines = [shorten(line, _within(count, per, "")) for line in lines]
    return "\n".join(line if line.endswith(".") else line + "." for line in lines)


def _line_index(lines: list[str], label: str) -> int | None:
    """The index of the line that starts with ``label`` (``None`` when none does)."""
    return next((i for i, line in enumerate(lines) if line.startswith(label)), None)


def _line(lines: list[str], label: str) -> str:
    """The text after ``label`` on the line that starts with it ("" when none does)."""
    return next((line[len(label):] for line in lines if line.startswith(label)), "")


def _instruction_words(lines: list[str]) -> str:
    """The words that say which arguments the message is about: the next action's when it
    names an argument (it names the one to change), else the reason's."""
    body = _line(lines, "Rejected arguments: ").rstrip(".")
    for label in ("Next action: ", "Reason: "):
        words = _line(lines, label)
        if _names_any(body, words):
            return words
    return ""


def _cut_line(lines: list[str], index: int, label: str, named: str, budget: int,
              count: Callable[[str], int]) -> str:
    """Shorten ``lines[index]`` (in place) to what the budget leaves it; its new body.

    Arguments that ``named`` mentions are kept whole, the others dropped (never cut below).
    """
    body = lines[index][len(label):].rstrip(".")
    if named and _names_any(body, named):
        new = _named_only(body, named)
        lines[index] = f"{label}{new}."
        return new
    room = budget - count("\n".join(lines[:index] + lines[index + 1:])) - count(label) - 1
    new = body
    for _ in range(3):  # token counts of joined lines differ a little from the parts
        new = ELLIPSIS if room <= 0 else shorten(body, _within(count, room, "."))
        lines[index] = f"{label}{new}."
        over = count("\n".join(lines)) - budget
        if over <= 0 or room <= 0:
            break
        room -= over
    return new


def _names_any(args_text: str, named: str) -> bool:
    """Whether ``named`` mentions a key of the echoed arguments."""
    try:
        args = json.loads(args_text)
    except ValueError:
        return False
    words = set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", named))
    return isinstance(args, dict) and any(k in words for k in args)


def _named_only(args_text: str, named: str) -> str:
    """The echoed arguments with only the keys ``named`` mentions, in the order sent, and an
    ellipsis for the rest (``{"max_price": -1, …}``); as they are when none is named."""
    try:
        args = json.loads(args_text)
    except ValueError:
        return args_text
    if not isinstance(args, dict):
        return args_text
    words = set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", named))
    kept = {k: v for k, v in args.items() if k in words}
    if not kept or len(kept) == len(args):
        return args_text
    inner = ", ".join(f"{json.dumps(k, ensure_ascii=False)}: "
                      f"{json.dumps(v, ensure_ascii=False)}" for k, v in kept.items())
    return f"{{{inner}, {ELLIPSIS}}}"


def _within(count: Callable[[str], int], room: int, tail: str) -> Callable[[str], bool]:
    return lambda body: count(body + tail) <= room
