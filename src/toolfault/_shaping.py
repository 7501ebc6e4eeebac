"""Shaping: every failure in the four-part contract, and every success as the model's text.

Pure words: nothing here counts, stores or emits.  The pipeline decides *what* happened
(a :class:`~toolfault._classify.Failure`, a block, a halt); the shaper says it within the
catalog's token budget, redacted, naming one next move.
"""

from __future__ import annotations

import itertools
import json
import logging
import re
import reprlib
from collections.abc import Iterable, Sequence
from dataclasses import replace
from typing import Any, NamedTuple

from pydantic_core import to_json as _to_json

from toolfault._call import _Call
from toolfault._catalog import fill
from toolfault._classify import Failure, from_entry
from toolfault._errors import FailureClass, Outcome, ToolError
from toolfault._jsontext import prebuilt_chunks
from toolfault._message import (
    MAX_ARGS_CHARS,
    cut_echo,
    echo_args,
    fit_to_budget,
    format_seconds,
    parts_of,
    redacted_echo,
    render_error,
    render_terminal,
)
from toolfault._redact import REDACTED, Redactor
from toolfault._result import FailureInfo, ToolResult, new_failure_info, new_result
from toolfault._settings import Scope, Settings
from toolfault._tool import Alternative, ToolSpec

log = logging.getLogger("toolfault")
#: What introduces the result a ``no_progress`` message still carries.
RESULT_LINE = "\nResult (unchanged): "


class _Echo(NamedTuple):
    """A failure's echoed arguments and the values it must not name (see ``Shaper._echo``)."""

    text: str
    #: The echo before it was cut to length (``None``: arguments that are not a dict).
    whole: str | None
    hidden: set[str]


class Shaper:
    """The guard's words: its catalog and token budget, the redactor, the scope's mode."""

    def __init__(self, settings: Settings, scope: Scope, tools: dict[str, ToolSpec],
                 redactor: Redactor) -> None:
        self._settings = settings
        self._scope = scope
        self._tools = tools
        self._redactor = redactor

    def args_text(self, call: _Call) -> str:
        """The rejected arguments as echoed to the model: redacted, bounded."""
        return self._echo(call).text

    def _echo(self, call: _Call) -> _Echo:
        """The echoed arguments and the values under secret-named keys (one walk for a dict,
        which is what arguments are once parsed)."""
        args, redactor = call.args, self._redactor
        if type(args) is dict:
            whole, hidden = redacted_echo(args, redactor)
            if whole is not None:
                return _Echo(cut_echo(whole, MAX_ARGS_CHARS), whole, hidden)
        else:
            hidden = redactor.hidden_values(args)
        shown = args if isinstance(args, (dict, list, str)) else repr(args)
        return _Echo(echo_args(redactor.value(shown)), None, hidden)

    def terminal(self, call: _Call, failure: Failure, count: int,
                 alternatives: Sequence[Alternative], *, blocked_for: float | None,
                 blocked: bool = False) -> ToolResult:
        """The message after the cap: retrying is not allowed, here are the legal moves."""
        rendered = render_terminal(tool=call.name, code=failure.code, count=count,
                                   moves=self._moves(call, failure, alternatives),
                                   args_text=self._echo(call).text, blocked_for=blocked_for)
        problem = {**rendered.problem, "blocked": True} if blocked else rendered.problem
        return self._error_result(call, failure, rendered.text, problem, terminal=True,
                                  blocked=blocked)

    def four_part(self, call: _Call, failure: Failure,
                  alternatives: Sequence[Alternative] | None = None) -> ToolResult:
        """A first (non-terminal) failure as the four-part message."""
        alts = self.alternatives(call, failure) if alternatives is None else alternatives
        text, problem = self._four_part(call, failure, self._echo(call), alts)
        return self._error_result(call, failure, text, problem, terminal=False)

    def halted(self, call: _Call, failure: Failure, *, retry_after: float | None,
               blocked: bool) -> ToolResult:
        """The halt message: the turn is over (or refused for a while)."""
        text, problem = self._four_part(call, failure, self._echo(call), [])
        problem["terminal"] = True
        problem["halt"] = True
        if retry_after is not None:
            problem["retry_after"] = retry_after
        return self._error_result(call, failure, text, problem, terminal=True,
                                  blocked=blocked, halt=True)

    def no_progress(self, call: _Call, failure: Failure, result_text: str, result: Any
                    ) -> ToolResult:
        """``no_progress``: the four-part message, then the result the model asked for (it
        is never withheld); ``data["result"]`` holds the value."""
        text, problem = self._four_part(call, failure, self._echo(call),
                                        self.alternatives(call, failure))
        problem["terminal"] = True
        problem["result"] = result
        if self._scope.mode != "observe":
            text = f"{text}{RESULT_LINE}{result_text}"
        return self._error_result(call, failure, text, problem, terminal=True)

    def blocked_tool(self, call: _Call, failure: Failure) -> ToolResult:
        """``tool_blocked``: the tool failed too often in a row; the others still work."""
        text, problem = self._four_part(call, failure, self._echo(call),
                                        self.alternatives(call, failure))
        problem["terminal"] = True
        problem["blocked"] = True
        return self._error_result(call, failure, text, problem, terminal=True, blocked=True)

    def pack(self, call: _Call, failure: Failure) -> str:
        """The code (and the parameter it is about) kept with a failure record."""
        param = failure.param or self.param_in(call, failure.reason)
        return f"{failure.code}:{self._redactor.secrets(param)[:200]}" if param \
            else failure.code

    def safe_name(self, name: str) -> str:
        """A tool name safe to echo and trace: identifier characters, no secret in any form."""
        secrets = self._redactor.secrets
        return secrets(_display_name(secrets(name[:4_000])))

    def _four_part(self, call: _Call, failure: Failure, echo: _Echo,
                   alternatives: Sequence[Alternative]) -> tuple[str, dict[str, Any]]:
        """The catalog row's words filled in, redacted (the model's own values allowed,
        those under secret-named arguments hidden) and fitted to the token budget."""
        entry = failure.entry
        hidden = echo.hidden
        allow = [a for a in _strings_in(call.args) if a not in hidden]
        values = self._fill_values(call, failure, alternatives)
        said = (failure.next_action or fill(entry.next_action, values)).rstrip(". ")
        reason, said = _prose_pair(self._redactor, fill(entry.reason, values), said, allow)
        reason = _without(reason, hidden)
        if not reason.strip(" ."):
            reason = entry.summary or f"{call.name} failed"
        next_action = _with_moves(_next_action(failure, values, _without(said, hidden)),
                                  alternatives, failure.outcome)
        return self._within_budget(call, failure, echo, reason, next_action, allow)

    def _fill_values(self, call: _Call, failure: Failure, alternatives: Sequence[Alternative]
                     ) -> dict[str, object]:
        """What a catalog row's placeholders are filled with."""
        return {
            "tool": call.name,
            "code": failure.code,
            "param": failure.param or self.param_in(call, failure.reason),
            "expected": failure.expected,
            "alternative": alternatives[0].name if alternatives else None,
            "retry_after": format_seconds(failure.retry_after) if failure.retry_after else None,
            "check_with": (call.spec.check_with if call.spec else None),
            "nearest": failure.values.get("nearest"),
            "reason": failure.reason,
        }

    def _within_budget(self, call: _Call, failure: Failure, echo: _Echo, reason: str,
                       next_action: str, allow: list[str]) -> tuple[str, dict[str, Any]]:
        """The rendered message; over the token budget, the first problem only, then less
        of the arguments echoed."""
        text, problem = _render(call.name, failure, reason, echo.text, next_action)
        if self._fits(text):
            return text, problem
        first = failure.values.get("first_reason")
        if isinstance(first, str):
            reason = _without(self._redactor.prose(first, allow=allow), echo.hidden)
            text, problem = _render(call.name, failure, reason, echo.text, next_action)
            if self._fits(text):
                return text, problem
        short = cut_echo(echo.whole, 160) if echo.whole is not None else \
            echo_args(self._redactor.value(call.args), max_chars=160)
        return _render(call.name, failure, reason, short, next_action)

    def _fits(self, text: str) -> bool:
        """Whether a message is within the catalog's token budget."""
        return self._settings.count_tokens(text) <= self._settings.catalog.token_budget

    def _error_result(self, call: _Call, failure: Failure, text: str,
                      problem: dict[str, Any], *, terminal: bool, blocked: bool = False,
                      halt: bool = False) -> ToolResult:
        if self._scope.mode == "observe":
            call.shadow["would_say"] = text
            text = self._redactor.secrets(_unshaped_text(call.name, failure))
        code, outcome, failure_class = failure.code, failure.outcome, failure.failure_class
        info = new_failure_info(
            code, outcome, terminal, blocked, failure.retryable and not terminal, halt,
            failure_class,
            failure.error or ToolError(code, failure.reason, outcome=outcome,
                                       failure_class=failure_class,
                                       retryable=failure.retryable),
            failure.cause)
        return new_result(call.name, False, text, problem, call.attempts, call.call_id, info,
                          call.fp)

    def _moves(self, call: _Call, failure: Failure, alternatives: Sequence[Alternative]
               ) -> list[str]:
        param = failure.param or self.param_in(call, failure.reason)
        if failure.failure_class is FailureClass.TRANSIENT:
            first = f"call {call.name} later"
        else:
            first = f"call {call.name} with a different {param}" if param else \
                f"call {call.name} with different arguments"
        return [first, *(a.phrase() for a in alternatives)]

    @staticmethod
    def param_in(call: _Call, reason: str) -> str | None:
        """The argument a reason is about: named in it, or the only one there is."""
        declared = call.spec.params if call.spec is not None else ()
        words = {w.rstrip(".") for w in _WORDS.findall(reason)}
        # The usual answer: a declared parameter named in the reason.
        named = _named_in(declared, words)
        if named is not None:
            return named
        keys = list(declared)
        if isinstance(call.args, dict):
            extra = _undeclared(call.args, keys)
            named = _named_in(extra, words)
            if named is not None:
                return named
            keys += extra
        named = _phrased_in(keys, reason, words)
        if named is not None:
            return named
        if isinstance(call.args, dict) and len(call.args) == 1 and keys:
            return keys[0]  # the only argument there is
        return None

    def alternatives(self, call: _Call, failure: Failure) -> list[Alternative]:
        """The tools the model may call instead: the failure's, the tool's, the row's."""
        declared = call.spec.alternatives if call.spec else ()
        row = failure.entry.alternative
        if not failure.alternatives and not declared and not row:
            return []  # the usual case: nothing to collect
        candidates = [*(Alternative(a) for a in failure.alternatives), *declared]
        if row:
            candidates.append(Alternative(row))
        return _distinct(candidates, call.name)

    def crash(self, call: _Call, exc: BaseException) -> ToolResult:
        try:
            return self._crash_result(call, exc)
        except Exception:  # noqa: BLE001 - the last line of defence must not raise
            name = _display_name(self._redactor.secrets(call.name))
            text = (f"{name} failed (code: internal_error).\n"
                    f"Reason: {name} hit an internal error and did not complete.\n"
                    "Rejected arguments: {}.\n"
                    "Effect: unknown. It is not known whether the action happened; do not "
                    "retry before checking.\n"
                    "Next action: stop and report this failure to the user.")
            info = FailureInfo(code="internal_error", outcome=Outcome.UNKNOWN, cause=exc)
            return ToolResult(name, False, text, {"code": "internal_error"}, call.attempts,
                              call.call_id, info, "")

    def _crash_result(self, call: _Call, exc: BaseException) -> ToolResult:
        log.warning("toolfault internal error while guarding %s (%s)", call.name,
                    type(exc).__name__, exc_info=exc)
        failure = from_entry(self._settings.catalog.get("internal_error"),
                             f"{call.name} hit an internal error and did not complete",
                             cause=exc)
        if call.spec is not None and call.spec.side_effect and call.dispatched:
            failure.outcome = Outcome.UNKNOWN
        text, problem = self._four_part(call, failure, self._echo(call), [])
        return self._error_result(call, failure, text, problem, terminal=False)

    def seal(self, result: ToolResult) -> ToolResult:
        """The single exit of a shaped failure: the name, the text and the data redacted (every
        form of every secret), and the message cut to the token budget."""
        if result.ok:
            return result  # a success's text and data were redacted as one in _success_text
        redactor = self._redactor
        data = redactor.value(result.data)
        text = self._sealed_text(result, data)
        if not isinstance(data, dict):
            data = {"detail": data}
        settings = self._settings
        if self._scope.mode != "observe":  # observe passes raw text on
            # The result a no_progress message carries is what the model asked for: it is
            # shown whole, outside the message's budget.
            text, label, carried = text.partition(RESULT_LINE)
            text, data = fit_to_budget(text, data, settings.catalog.token_budget,
                                       settings.count_tokens)
            text += label + carried
        tool = redactor.secrets(result.tool)
        if text == result.text and tool == result.tool and data == result.data:
            return result
        return replace(result, tool=tool, text=text, data=data)

    def _sealed_text(self, result: ToolResult, data: Any) -> str:
        """A failure's text redacted.  A four-part message (the text its problem renders) is
        joined again from ``data``, the problem as just redacted, so no part of it is redacted
        twice; any other text (or a problem that lost a field to redaction) whole."""
        redactor = self._redactor
        parts = parts_of(result.data)
        redacted = parts_of(data) if parts is not None and parts.text() == result.text \
            else None
        if redacted is None:
            return redactor.secrets(result.text)
        # The verdict is the message's own words and a wait, which may spell a registered number.
        said = redactor.secrets(redacted.said)
        return redactor.joined(redacted._replace(said=said).text())

    def last_resort(self, name: object, args: Any, call_id: str | None,
                    exc: BaseException) -> ToolResult:
        """The answer when even the guard's own error path failed: shaped, never raised."""
        timed_out = isinstance(exc, TimeoutError)
        shown = self._last_resort_name(name)
        spec = self._tools.get(name) if isinstance(name, str) else None
        side_effect = bool(spec and spec.side_effect)
        args_text = self._last_resort_args(args)
        code = "timeout" if timed_out else "internal_error"
        outcome = Outcome.UNKNOWN if (side_effect or timed_out) else Outcome.NO_EFFECT
        reason = (f"{shown} did not finish within the deadline of "
                  f"{format_seconds(self._settings.deadline or 0)}" if timed_out
                  else f"{shown} hit an internal error and did not complete")
        log.warning("toolfault answered %s for %s (%s)", code, shown, type(exc).__name__)
        text, problem = self._last_resort_text(shown, code, reason, args_text, outcome)
        info = FailureInfo(code=code, outcome=outcome, cause=exc)
        return ToolResult(shown, False, text, problem, 0, call_id or "", info, "")

    def _last_resort_name(self, name: object) -> str:
        """The tool's name as the last resort shows it, whatever object it is."""
        try:
            return self.safe_name(name if isinstance(name, str) else str(name))
        except Exception:  # noqa: BLE001 - a hostile name object
            return "unnamed_tool"

    def _last_resort_args(self, args: Any) -> str:
        """The arguments as the last resort echoes them, whatever they are."""
        try:
            return echo_args(self._redactor.value(args if isinstance(args, (dict, list))
                                                  else str(args)[:2_000]))
        except Exception:  # noqa: BLE001
            return "{}"

    def _last_resort_text(self, shown: str, code: str, reason: str, args_text: str,
                          outcome: Outcome) -> tuple[str, dict[str, Any]]:
        """The last resort's four parts, redacted and within budget; a bare line when even
        rendering fails."""
        try:
            rendered = render_error(
                tool=shown, code=code, reason=reason, args_text=args_text, outcome=outcome,
                retryable=False, retry_after=None,
                next_action="stop and report this failure to the user",
            )
            return fit_to_budget(self._redactor.secrets(rendered.text),
                                 self._redactor.value(rendered.problem),
                                 self._settings.catalog.token_budget,
                                 self._settings.count_tokens)
        except Exception:  # noqa: BLE001
            return f"{shown} failed (code: {code}).", {"code": code}

    def success_text(self, value: Any) -> tuple[str, Any]:
        """The model's text for a return value, and the value itself unless it held a secret."""
        if isinstance(value, str):
            text = value
        elif value is None:
            return "null", None
        else:
            try:
                # Compact JSON (fewer tokens for the model), by pydantic-core's encoder:
                # about a third of the standard library's time on a tool's result.
                text = _to_json(value, by_alias=False, fallback=_json_default).decode()
            except (ValueError, RecursionError, UnicodeDecodeError):
                text = _standard_json(value)
        clean = self._redactor.secrets(text)
        if clean == text:
            return text, value
        if isinstance(value, str):
            return clean, clean
        try:
            return clean, json.loads(clean)
        except ValueError:
            return clean, clean



_WORDS = re.compile(r"(?<![\w.])[\w.\-]+")
_NAME_JUNK = re.compile(r"[^A-Za-z0-9_.\-]+")

def _named_in(keys: Iterable[str], words: set[str]) -> str | None:
    """The first key that is one of the reason's words."""
    for key in keys:
        if key in words:
            return key
    return None


def _undeclared(args: dict[Any, Any], declared: list[str]) -> list[str]:
    """The argument names the tool did not declare (of the first 64)."""
    known = set(declared)
    return [k for k in itertools.islice(args, 64)
            if isinstance(k, str) and k and k not in known]


def _phrased_in(keys: list[str], reason: str, words: set[str]) -> str | None:
    """The first key the reason names in other words: any case, underscores as spaces."""
    lowered = " ".join(reason.lower().split())
    lower_words = {w.lower() for w in words}
    for key in keys:
        phrase = key.lower().replace("_", " ")
        if " " in phrase and phrase in lowered:
            return key
        if phrase in lower_words:
            return key
    return None


def _distinct(candidates: Iterable[Alternative], tool: str) -> list[Alternative]:
    """Each alternative once (the first of a name), never the failing tool itself."""
    seen: dict[str, Alternative] = {}
    for alt in candidates:
        if alt.name not in seen and alt.name != tool:
            seen[alt.name] = alt
    return list(seen.values())


def _display_name(name: str) -> str:
    """An unknown tool's name, safe to echo: identifier characters only, bounded length."""
    cleaned = _NAME_JUNK.sub("_", name)[:64].strip("_")
    return cleaned or "unnamed_tool"

_encode_chunks = prebuilt_chunks(sort_keys=False, separators=(",", ":"), allow_nan=True)


def _standard_json(value: Any) -> str:
    """What pydantic-core refused (lone surrogates, cycles, absurd depth), by the standard
    library's rules, or the value's ``str``."""
    try:
        return "".join(_encode_chunks(value, 0))
    except (TypeError, ValueError, RecursionError):
        try:
            return json.dumps(value, ensure_ascii=False, separators=(",", ":"),
                              default=_json_default)
        except (TypeError, ValueError, RecursionError):
            try:
                return str(value)
            except RecursionError:  # nested past any printer's depth: a bounded sketch
                return reprlib.repr(value)


def _render(tool: str, failure: Failure, reason: str, args_text: str, next_action: str
            ) -> tuple[str, dict[str, Any]]:
    """The four-part text and its problem dict (a function, not a closure made per failure)."""
    outcome = failure.outcome
    rendered = render_error(
        tool=tool, code=failure.code, reason=reason, args_text=args_text, outcome=outcome,
        retryable=failure.retryable and outcome is Outcome.NO_EFFECT,
        retry_after=failure.retry_after, next_action=next_action, title=failure.entry.summary,
        # ``_value_`` is what Enum's ``value`` property returns, without its two Python calls.
        failure_class=failure.failure_class._value_,
    )
    return rendered.text, rendered.problem


def _with_moves(next_action: str, alternatives: Sequence[Alternative], outcome: Outcome) -> str:
    """The next action plus up to two alternative tools it does not mention yet."""
    extra = [a for a in alternatives if a.name not in next_action]
    if not extra or outcome is Outcome.APPLIED:
        return next_action
    moves = ", or ".join(a.phrase() for a in extra[:2])
    if next_action.startswith("stop"):  # the alternative first, stopping last
        return f"{moves}, or {next_action}"
    return f"{next_action}, or {moves}"


def _next_action(failure: Failure, values: dict[str, object], said: str) -> str:
    """The one next move: the tool's own words (``said``, redacted), else the catalog row's."""
    if said.strip(" .\u2026"):
        return said
    # A blank next action from the tool: the row's.
    return fill(failure.entry.next_action, values).rstrip(". ") or \
        "stop and report this failure to the user"


#: Joins a reason and a next action for one pass of :meth:`Redactor.prose`: no pattern or
#: registered form reaches across a NUL between line breaks without consuming it.
_PAIR = "\n\x00\n"


def _prose_pair(redactor: Redactor, reason: str, said: str, allow: list[str]
                ) -> tuple[str, str]:
    """``prose`` of the reason and of the next action, in one pass when that is certain to
    give the same words: a failure's prose is mostly fixed cost, paid once instead of twice.

    Two passes when either text holds a NUL or an allowed value spans lines (it could reach
    across the join), or when a redaction consumed the join (a private key runs to the end).
    """
    if "\x00" not in reason and "\x00" not in said and \
            not any("\n" in a or "\x00" in a for a in allow):
        joined = redactor.prose(f"{reason}{_PAIR}{said}", allow=allow)
        if joined.count(_PAIR) == 1:
            first, second = joined.split(_PAIR)
            return first, second
    return redactor.prose(reason, allow=allow), redactor.prose(said, allow=allow)


def _without(text: str, hidden: set[str]) -> str:
    """Replace values the model passed under secret-named arguments."""
    if not hidden:
        return text
    for value in sorted(hidden, key=len, reverse=True):
        if value in text:
            text = text.replace(value, REDACTED)
    return text


def _strings_in(args: Any) -> list[str]:
    if isinstance(args, dict):
        return [v for v in args.values() if isinstance(v, str)][:32]
    return []


def _unshaped_text(tool: str, failure: Failure) -> str:
    """What the model would have seen without toolfault (observe mode)."""
    returned = failure.values.get("returned")
    if isinstance(returned, str):
        return returned
    cause = failure.cause
    if cause is not None:
        return f"Error: {type(cause).__name__}: {cause}"
    return f"Error: {failure.reason}"


def _json_default(value: Any) -> Any:
    dump = getattr(value, "model_dump", None)
    if callable(dump):
        return dump(mode="json")
    if hasattr(value, "__dataclass_fields__"):
        import dataclasses

        return dataclasses.asdict(value)
    return str(value)


