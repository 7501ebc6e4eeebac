"""What stands between the model and the tools: toolfault, and the baselines it replaces.

Every policy runs the same tool functions on the same seeded worlds and writes one trace
record per model call in the shape of ``CallEvent.to_dict()``, so one set of metric
functions reads them all.  Baselines reproduce what teams actually ship:

- ``traceback``   the model sees ``traceback.format_exc()`` (file paths shortened to
  ``/srv/app/<file>`` so the token counts do not depend on where the bench is installed).
- ``error_failed`` the model sees ``Error: failed``.
- ``blind_retry`` tenacity retries *everything* with exponential backoff (including the
  timed-out booking whose effect already landed); after the last attempt the model sees
  ``Error: <exception text>``.
- ``langchain``   LangGraph ``ToolNode``'s default ``handle_tool_errors``: argument validation
  errors become its ``TOOL_INVOCATION_ERROR_TEMPLATE``; every other exception is re-raised and
  ends the run (recorded as a crash).
"""

from __future__ import annotations

import json
import re
import time
import traceback
import typing
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import pydantic
from tenacity import Retrying, retry_if_exception_type, stop_after_attempt, wait_exponential

from toolfault._fingerprint import fingerprint
from toolfault._guard import Guard
from toolfault._limits import Backoff, Limits
from toolfault._tokens import Tokenizer, count_tokens, token_counter_name
from toolfault._trace import CallEvent
from toolfault_cli.bench._tasks import ToolCall, ToolDef

#: The limits a team would start with: the per-class retry caps (2 or 3), a per-turn call
#: ceiling below the harness's step cap, and quick in-wrapper backoff (slept virtually).
BENCH_LIMITS = Limits(
    max_calls_per_turn=20,
    backoff=Backoff(attempts=3, initial=0.5, maximum=4.0, jitter=0.0, max_seconds=10.0),
)

# LangGraph 1.x ``langgraph/prebuilt/tool_node.py``, verbatim.
TOOL_INVOCATION_ERROR_TEMPLATE = (
    "Error invoking tool '{tool_name}' with kwargs {tool_kwargs} with error:\n"
    " {error}\n"
    " Please fix the error and try again."
)
INVALID_TOOL_NAME_ERROR_TEMPLATE = (
    "Error: {requested_tool} is not a valid tool, try one of [{available_tools}]."
)

_FILE = re.compile(r'File "([^"]+)"')


@dataclass(frozen=True, slots=True)
class CallOutcome:
    """What the model is shown, and the trace record of the call."""

    text: str
    ok: bool
    record: dict[str, Any]
    crashed: bool = False
    halt: bool = False
    #: The halt was a budget refusal (the per-turn ceiling), not the ladder halting the turn.
    budget: bool = False


class PolicyRun(Protocol):
    """A policy bound to one scenario's tools; ``start`` scopes it to one episode."""

    waited: float

    def start(self, task: str) -> None: ...

    def call(self, call: ToolCall) -> CallOutcome: ...

    def finish(self) -> list[dict[str, Any]]: ...


@dataclass(frozen=True, slots=True)
class Policy:
    """A named way of handling tool failures, and how to bind it to a scenario's tools."""

    name: str
    label: str
    description: str
    bind: Callable[[Sequence[ToolDef]], PolicyRun]


# -- toolfault ---------------------------------------------------------------------------------
class ToolfaultRun:
    """A real ``Guard`` with the tools registered as a team would declare them."""

    def __init__(self, tools: Sequence[ToolDef], limits: Limits = BENCH_LIMITS) -> None:
        self.waited = 0.0
        self._events: list[dict[str, Any]] = []
        # The guard counts tokens with the counter the baselines' figures use (exact
        # cl100k_base where installed), whatever the process happened to import first.
        tokenizer: Tokenizer = "exact" if token_counter_name() == "cl100k_base" else "estimate"
        self.guard = Guard(limits=limits, sleep=self._sleep, scan_env_secrets=False,
                           observers=[self._observe], tokenizer=tokenizer)
        for tool in tools:
            self.guard.tool(name=tool.name, side_effect=tool.side_effect,
                            postcondition=tool.postcondition, alternatives=tool.alternatives,
                            normalize=tool.normalize, check_with=tool.check_with)(tool.fn)

    def _sleep(self, seconds: float) -> None:
        self.waited += seconds

    def _observe(self, event: CallEvent) -> None:
        self._events.append(event.to_dict())

    def start(self, task: str) -> None:
        self.waited = 0.0
        self.guard.new_task(task)

    def call(self, call: ToolCall) -> CallOutcome:
        result = self.guard.call(call.name, call.arguments, call_id=call.id)
        # A budget refusal or a halt is the guard ending the turn: the loop stops and reports
        # the incident, as an adopter wires it (see docs/bench.md).
        budget = result.code == "budget_exceeded"
        return CallOutcome(result.text, result.ok, self._events.pop(),
                           halt=result.halt or budget, budget=budget)

    def finish(self) -> list[dict[str, Any]]:
        return [{"type": "incident", **incident.to_dict()} for incident in self.guard.incidents]


# -- baselines ---------------------------------------------------------------------------------
class _Crash(Exception):
    """The framework re-raised the tool's exception: the agent run is over."""


class DirectRun:
    """Calls the tool function itself; subclasses decide what the model is shown."""

    mode = "baseline"

    def __init__(self, tools: Sequence[ToolDef]) -> None:
        self.tools = {tool.name: tool for tool in tools}
        self.waited = 0.0
        self.task = ""
        self.dispatches = 0  # how often the last call ran the tool (retries included)

    def start(self, task: str) -> None:
        self.task = task
        self.waited = 0.0

    def finish(self) -> list[dict[str, Any]]:
        return []

    def execute(self, tool: ToolDef, args: dict[str, Any]) -> Any:
        """Run the tool and return its value; ``self.dispatches`` says how often it ran."""
        self.dispatches = 1
        return tool.fn(**args)

    def shown(self, exc: BaseException, tool: ToolDef | None, args: Any) -> str:
        raise NotImplementedError

    def call(self, call: ToolCall) -> CallOutcome:
        started = time.monotonic()
        tool = self.tools.get(call.name)
        args: Any = None
        self.dispatches = 0
        try:
            args = _parse(call.arguments)
            if tool is None:
                raise KeyError(call.name)
            args = self.validate(tool, args)
            value = self.execute(tool, args)
        except _Crash as crash:
            cause = crash.__cause__ or crash
            return self._outcome(call, tool, args, str(cause), ok=False, code=type(cause).__name__,
                                 started=started, crashed=True)
        except Exception as exc:  # noqa: BLE001 - a baseline shows whatever the tool raised
            return self._outcome(call, tool, args, self.shown(exc, tool, args), ok=False,
                                 code=type(exc).__name__, started=started)
        text = json.dumps(value, ensure_ascii=False, default=str)
        return self._outcome(call, tool, args, text, ok=True, code=None, started=started)

    def validate(self, tool: ToolDef, args: dict[str, Any]) -> dict[str, Any]:
        return args

    def _outcome(self, call: ToolCall, tool: ToolDef | None, args: Any, text: str, *, ok: bool,
                 code: str | None, started: float, crashed: bool = False) -> CallOutcome:
        side_effect = bool(tool and tool.side_effect)
        attempts = self.dispatches
        dispatched = attempts > 0
        record = {
            "tool": call.name,
            "call_id": call.id,
            "task": self.task,
            "turn": 0,
            "fingerprint": _fingerprint(call.name, args, tool),
            "ok": ok,
            "code": code,
            "outcome": "unknown" if (side_effect and dispatched and not ok) else "none",
            "terminal": False,
            "blocked": False,
            "attempts": attempts,
            "dispatched": dispatched,
            "error_tokens": 0 if ok or crashed else count_tokens(text),
            "mode": self.mode,
            "args": args if isinstance(args, dict) else None,
            "side_effect": side_effect,
            "duration_s": time.monotonic() - started,
            "shadow": {},
            "at": time.time(),
            "type": "call",
        }
        return CallOutcome(text, ok, record, crashed=crashed)


class TracebackRun(DirectRun):
    def shown(self, exc: BaseException, tool: ToolDef | None, args: Any) -> str:
        text = "".join(traceback.format_exception(exc))
        return _FILE.sub(lambda m: f'File "/srv/app/{m.group(1).rsplit("/", 1)[-1]}"', text)


class ErrorFailedRun(DirectRun):
    def shown(self, exc: BaseException, tool: ToolDef | None, args: Any) -> str:
        return "Error: failed"


class BlindRetryRun(DirectRun):
    """``tenacity.Retrying`` around every call, retrying every exception."""

    attempts = 5

    def _sleep(self, seconds: float) -> None:
        self.waited += seconds

    def execute(self, tool: ToolDef, args: dict[str, Any]) -> Any:
        retrying = Retrying(stop=stop_after_attempt(self.attempts),
                            wait=wait_exponential(multiplier=0.5, max=8),
                            retry=retry_if_exception_type(Exception), sleep=self._sleep,
                            reraise=True)

        def attempt() -> Any:
            self.dispatches += 1
            return tool.fn(**args)

        return retrying(attempt)

    def shown(self, exc: BaseException, tool: ToolDef | None, args: Any) -> str:
        return f"Error: {exc}"


class LangChainRun(DirectRun):
    """LangGraph ``ToolNode`` defaults: validation errors are shown, the rest crash the run."""

    def __init__(self, tools: Sequence[ToolDef]) -> None:
        super().__init__(tools)
        self._schemas = {tool.name: _schema_model(tool) for tool in tools}

    def validate(self, tool: ToolDef, args: dict[str, Any]) -> dict[str, Any]:
        try:
            model = self._schemas[tool.name].model_validate(args)
        except pydantic.ValidationError as exc:
            raise _InvocationError(tool.name, args, exc) from None
        return {name: getattr(model, name) for name in type(model).model_fields}

    def execute(self, tool: ToolDef, args: dict[str, Any]) -> Any:
        self.dispatches = 1
        try:
            return tool.fn(**args)
        except Exception as exc:
            raise _Crash() from exc

    def shown(self, exc: BaseException, tool: ToolDef | None, args: Any) -> str:
        if isinstance(exc, _InvocationError):
            return exc.message
        if isinstance(exc, KeyError) and tool is None:
            return INVALID_TOOL_NAME_ERROR_TEMPLATE.format(
                requested_tool=exc.args[0], available_tools=", ".join(self.tools))
        return TOOL_INVOCATION_ERROR_TEMPLATE.format(tool_name=getattr(tool, "name", "?"),
                                                     tool_kwargs={}, error=str(exc))


class _InvocationError(Exception):
    """LangGraph's ``ToolInvocationError``: the message lists ``loc: msg`` per problem."""

    def __init__(self, tool: str, kwargs: dict[str, Any], source: pydantic.ValidationError
                 ) -> None:
        lines = [f"{'.'.join(str(p) for p in e.get('loc', ()))}: {e.get('msg', 'Unknown error')}"
                 for e in source.errors()]
        self.message = TOOL_INVOCATION_ERROR_TEMPLATE.format(
            tool_name=tool, tool_kwargs=kwargs, error="\n".join(lines))
        super().__init__(self.message)


def _schema_model(tool: ToolDef) -> type[pydantic.BaseModel]:
    """The args schema LangChain infers from a function signature."""
    import inspect

    hints = typing.get_type_hints(tool.fn)
    fields: dict[str, Any] = {}
    for name, param in inspect.signature(tool.fn).parameters.items():
        default = ... if param.default is inspect.Parameter.empty else param.default
        fields[name] = (hints.get(name, Any), default)
    model: type[pydantic.BaseModel] = pydantic.create_model(f"{tool.name}_args", **fields)
    return model


def _parse(arguments: str) -> dict[str, Any]:
    value = json.loads(arguments) if arguments.strip() else {}
    if not isinstance(value, dict):
        raise TypeError(f"arguments must be a JSON object, not {type(value).__name__}")
    return value


def _fingerprint(name: str, args: Any, tool: ToolDef | None) -> str:
    """The guard's fingerprint (same normalizers), so "identical" means one thing everywhere."""
    try:
        if isinstance(args, dict):
            if tool is None:
                return fingerprint("__unknown__", {"tool": name, "args": args})
            return fingerprint(name, args, tool.normalize)
        return fingerprint("__invalid__", {"tool": name, "raw": repr(args)})
    except (ValueError, TypeError, RecursionError):
        return fingerprint("__invalid__", {"tool": name, "raw": repr(args)[:500]})


POLICIES: Mapping[str, Policy] = {
    policy.name: policy
    for policy in (
        Policy("toolfault", "toolfault",
               "Guard with per-class retry caps, a per-turn ceiling, postconditions and "
               "in-wrapper backoff", ToolfaultRun),
        Policy("traceback", "raw traceback", "the model sees traceback.format_exc()",
               TracebackRun),
        Policy("error_failed", "Error: failed", "the model sees 'Error: failed'",
               ErrorFailedRun),
        Policy("blind_retry", "blind retry", "tenacity retries every exception 5 times with "
               "exponential backoff, then 'Error: <exception>'", BlindRetryRun),
        Policy("langchain", "LangChain default", "LangGraph ToolNode default "
               "handle_tool_errors: validation errors shown, everything else crashes the run",
               LangChainRun),
    )
}
POLICY_NAMES: tuple[str, ...] = tuple(POLICIES)


#: The guard's modes, in rollout order, as a trace's policy names spell them.
MODE_POLICIES: Mapping[str, str] = {"toolfault (observe)": "observe",
                                    "toolfault (shape)": "shape", "toolfault": "enforce"}


def policy_labels(names: Iterable[str]) -> dict[str, str]:
    """Display labels for policy names (unknown names, e.g. from a user's trace, as they are).

    Beside a trace's other modes, plain ``toolfault`` reads ``toolfault (enforce)``: every mode
    is named, none is implied.
    """
    names = list(names)
    modes = any(n in MODE_POLICIES and n != "toolfault" for n in names)
    return {name: "toolfault (enforce)" if modes and name == "toolfault" else
            POLICIES[name].label if name in POLICIES else name for name in names}
