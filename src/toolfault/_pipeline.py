"""The decision pipeline: one call from raw arguments to a shaped result, written once.

parse -> fingerprint -> admit -> validate -> precheck -> dispatch -> classify -> shape ->
record.  The drivers (:mod:`toolfault._drivers`) walk its phases: :meth:`Pipeline.admit`
(pure), a side-effect tool's :meth:`Pipeline.precheck`, the first dispatch, then
:meth:`Pipeline.returned` or, after a raise, :meth:`Pipeline.raised`.  Where a phase needs
the world it is a generator (the model is tenacity's ``BaseRetrying.iter``): it yields a
step -- :data:`~toolfault._call.DISPATCH` (run the tool), :data:`~toolfault._call.VERIFY`
(run its postcondition) or a :class:`~toolfault._call.Sleep` -- and is sent back what
happened.  Nothing here runs a tool or waits, so both entry points take the same decisions
by construction.

There is no separate fast path: a success is cheap because the pipeline is.  The fingerprint,
the costliest step, is computed lazily: a local store admits a call in a quiet turn without
it, and every failure resolves it.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import logging
import random
import time
from collections.abc import Generator, Mapping
from dataclasses import replace
from typing import Any

from pydantic_core import ValidationError
from pydantic_core import from_json as _from_json

from toolfault._admission import CallKey, LazyFingerprint
from toolfault._budget import Budgets
from toolfault._call import (
    DISPATCH,
    NOT_JSON,
    VERIFY,
    Sleep,
    Step,
    _Call,
    _Raised,
    _Value,
    resolve_fp,
)
from toolfault._classify import Failure, from_entry, from_exception
from toolfault._degrading import DegradingStore, best_effort
from toolfault._effects import Effects
from toolfault._errors import FailureClass, Outcome, StateUnavailableError
from toolfault._failing import Failures
from toolfault._fingerprint import fingerprint, fingerprint_json_values
from toolfault._ladder import REPEAT_NOTE, Ladder, Repeat
from toolfault._message import echo_args
from toolfault._progress import Progress
from toolfault._result import ToolResult, new_result
from toolfault._schema import PLAIN_CHARS, PLAIN_ITEMS, ArgumentProblem, PydanticValidator
from toolfault._settings import Scope, Settings
from toolfault._shaping import Shaper
from toolfault._tool import ToolSpec

log = logging.getLogger("toolfault")

Steps = Generator[Step, Any, ToolResult]
_MAX_JSON_CHARS = 2_000_000
#: Parsed JSON text this short has a canonical form far below MAX_CANONICAL_BYTES.
_LAZY_JSON_CHARS = 10_000
#: ... and with at most this many brackets it is nested no deeper than the walk goes.
_LAZY_JSON_BRACKETS = 100
#: The ledger keeps a success's text for replays up to this size.
_MAX_TOLD_TEXT = 100_000


class Pipeline:
    """The pure steps of one guarded call: the scope's settings, the shared tools, turns and
    store, and the parts it composes."""

    def __init__(self, settings: Settings, scope: Scope, tools: dict[str, ToolSpec],
                 progress: Progress, store: DegradingStore, *, shaper: Shaper,
                 budgets: Budgets, effects: Effects, ladder: Ladder,
                 failures: Failures) -> None:
        self._settings = settings
        self._limits = settings.limits
        self._catalog = settings.catalog
        self._scope = scope
        self._tools = tools
        self._progress = progress
        self._store = store
        self._shaper = shaper
        self._budgets = budgets
        self._effects = effects
        self._ladder = ladder
        self._failures = failures

    # -- the phases the drivers walk ---------------------------------------------------
    # admit -> [precheck: a side-effect tool's steps] -> dispatch (the driver) -> returned,
    # or raised (the retry loop's steps).  Only what needs the world is a generator: a
    # success goes through none.
    def admit(self, call: _Call) -> ToolResult | None:
        """Parse, name, fingerprint, count and validate: the answer a call gets before it
        may run, or ``None`` (dispatch it with ``call.kwargs``)."""
        spec = self._tools.get(call.name)
        args = call.args
        if type(args) is not dict:
            args = self._validated_text(call, spec, args) \
                if type(args) is str and spec is not None else None
            if args is None:
                args = self.parse(call)
        if spec is None or args is NOT_JSON or self._progress.halted:
            early = self._named(call, spec, args)
            if early is not None:
                return early
        assert spec is not None
        call.spec, call.args = spec, args
        # Every call is counted and reserved, so identical calls in flight count toward the
        # cap atomically; the fingerprint is computed now only where a store or a check
        # needs it (see LazyFingerprint).
        if spec.plain and not spec.normalizers and (
                call.plain_json or self._validated_plain(call, spec, args) or _plain(args)):
            fp: LazyFingerprint = _Deferred(spec, args, in_order=call.sorted_args)
        else:
            problem = resolve_fp(call, self._scope)
            if problem is not None:
                return self._failures.fail_unscoped(call, "invalid_argument", problem)
            fp = LazyFingerprint(call.fp)
        call.fingerprint = fp
        return self._counted(call, spec, args, fp)

    @staticmethod
    def _validated_plain(call: _Call, spec: ToolSpec, args: dict[str, Any]) -> bool:
        """Whether ``args`` are plain JSON values, decided by validating them strictly (then
        ``call.kwargs`` holds the result), where the tool's parameters allow that."""
        validate = spec.open_validate
        if validate is None:
            return False
        try:
            kwargs = validate(args)
        except ValidationError:  # not plain, or not valid: decided the usual way
            return False
        # The open twin returns one key per parameter it found and drops the others (see
        # ``_schema._opened``): as many keys as were sent means none was dropped.
        if len(kwargs) != len(args):  # a key that is not a parameter: the usual way says so
            return False
        call.kwargs = kwargs
        call.validated = True
        return True

    @staticmethod
    def _validated_text(call: _Call, spec: ToolSpec, text: str) -> dict[str, Any] | None:
        """JSON text parsed and validated in one pass where the tool's parameters allow it
        (see ``_validated_plain``); ``None``: parse it the usual way.  The tool gets its own
        copy of every list, so what it does to one never changes the call's arguments."""
        validate = spec.plain_validate_json
        if validate is None or len(text) > _LAZY_JSON_CHARS:
            return None
        try:
            args: dict[str, Any] = validate(text)
        except ValidationError:  # not plain, not valid or not JSON: decided the usual way
            return None
        kwargs = dict(args)
        for name in spec.list_params:
            value = kwargs.get(name)
            if value is not None:
                kwargs[name] = value.copy()
        call.kwargs, call.validated, call.plain_json = kwargs, True, True
        call.sorted_args = True  # the twin's fields are in sorted order (see _plain_schema)
        return args

    def precheck(self, call: _Call) -> Generator[Step, Any, ToolResult | None]:
        """A side-effect tool's steps before it runs: claim its key, verify what an earlier
        attempt left (``None``: dispatch)."""
        return self._effects.precheck(call)

    def returned(self, call: _Call, value: Any) -> ToolResult:
        """The first attempt returned: a result, or a returned error (final: not retried)."""
        failure = self._returned_error(call, value)
        if failure is not None:
            return self._finish(call, failure)
        return self._succeeded(call, value)

    def raised(self, call: _Call, exc: Exception) -> Steps:
        """The first attempt raised: classify, verify, retry what is transient (the steps
        the driver performs), then shape what is final."""
        done = yield from self._attempts(call, _Raised(exc))
        return self._finish(call, done)

    # -- parse, fingerprint, admit, validate ----------------------------------------------
    def _named(self, call: _Call, spec: ToolSpec | None, args: Any) -> ToolResult | None:
        """The uncommon starts: a halted turn, an unknown tool, arguments that are not a
        JSON object (their answer; ``None`` when the call goes on)."""
        if spec is None:
            call.name = self._shaper.safe_name(call.name)
        if self._progress.halted:
            halted = self._ladder.still_halted(call, spec, args)
            if halted is not None and self._enforced(call, halted, "would_halt") is not None:
                return halted
        if spec is None:  # the name is the first mistake to report, whatever the arguments
            if args is NOT_JSON:
                call.shadow.pop("json_reason", None)
                call.args = call.args if isinstance(call.args, str) else repr(call.args)
            else:
                call.args = args
            return self._unknown_tool(call)
        if args is NOT_JSON:
            return self._failures.fail_unscoped(call, "invalid_json",
                                                call.shadow.pop("json_reason"))
        return None

    def _counted(self, call: _Call, spec: ToolSpec, args: dict[str, Any],
                 fp: LazyFingerprint) -> ToolResult | None:
        """Admission by the counters, then validation."""
        scope = self._scope
        if self._limits.block_seconds is not None and \
                self._progress.has_capped(scope.task_id, scope.turn):
            resolve_fp(call, scope)
            assert call.key is not None
            self._ladder.lift_expired(call.key)
        self._ladder.started(call)
        request = self._budgets.request(spec, fp)
        try:
            adm = call.admission = self._store.admit(request)
        except StateUnavailableError:
            return self._failures.fail(call, from_entry(self._catalog.get("state_unavailable"),
                                              "the agent's shared safety state is unreachable"),
                             count=False)
        if adm.over is not None or adm.blocked or adm.busy:
            return self._refused(call)
        call.request = request  # settled when the call ends
        if self._progress.has_capped(scope.task_id, scope.turn):  # a tool blocked for the turn?
            refused = self._ladder.tool_refused(call)
            if refused is not None and self._enforced(
                    call, refused, "would_halt" if refused.halt else "would_block_tool"):
                self._budgets.refund(call)  # charged at admission, never dispatched
                return refused
        if not call.fp and fp.resolved:  # the store needed it: the key is free now
            resolve_fp(call, self._scope)
        if call.validated:  # strictly, before admission (see _validated_plain)
            return None
        fast = spec.fast_validate
        if fast is None:
            return self._validate(call, spec, args)
        try:
            call.kwargs = fast(args)
        except ValidationError as exc:  # worded from this error: not validated twice
            validator = spec.validator
            return self._invalid(call, args, validator.problems(exc)
                                 if isinstance(validator, PydanticValidator)
                                 else validator.validate(args)[1])
        return None

    def _refused(self, call: _Call) -> ToolResult | None:
        """A call the counters did not admit: over budget, blocked or busy."""
        adm = call.admission
        assert adm is not None and call.spec is not None
        resolve_fp(call, self._scope)
        if adm.over is not None:
            over = self._budgets.exceeded(call, adm)
            if over is not None:
                return over
        if adm.blocked:
            refused = self._ladder.blocked(call, adm)
            if self._enforced(call, refused, "would_halt" if refused.halt else "would_block"):
                return refused
        if adm.busy:
            if self._scope.mode == "enforce":
                return self._failures.fail(call, from_entry(
                    self._catalog.get("in_progress"),
                    f"an identical {call.name} call is still running"), count=False)
            call.shadow["would_be_busy"] = True
        return self._validate(call, call.spec, call.args)

    def _enforced(self, call: _Call, refused: ToolResult, mark: str) -> ToolResult | None:
        """A refusal the ladder decided: the answer in enforce mode; in the other modes the
        call goes on, marked (``mark`` in the trace's shadow) and counted nowhere, as
        enforce would not have run it: so observe predicts enforce exactly."""
        if self._scope.mode == "enforce":
            return refused
        call.shadow[mark] = True
        call.refused = True
        return None

    def _validate(self, call: _Call, spec: ToolSpec, args: dict[str, Any]) -> ToolResult | None:
        """Validation where the fast validator is not the whole story (any validator)."""
        kwargs, problems = spec.validator.validate(args)
        if not problems:
            call.kwargs = kwargs
            return None
        return self._invalid(call, args, problems)

    def _invalid(self, call: _Call, args: dict[str, Any], problems: list[ArgumentProblem]
                 ) -> ToolResult | None:
        """Arguments the schema rejects: ``invalid_argument`` (observe mode: a mark)."""
        if self._scope.mode == "observe":
            call.shadow["would_reject"] = problems[0].reason
            call.kwargs = dict(args)
            return None
        self._budgets.refund(call)
        first = problems[0]
        reason = "; ".join(p.reason for p in problems[:2])
        failure = from_entry(self._catalog.get("invalid_argument"), reason,
                             next_action=first.next_action, param=first.param)
        failure.expected = first.expected
        failure.values["first_reason"] = first.reason
        return self._failures.fail(call, failure)

    def parse(self, call: _Call) -> Any:
        """The call's arguments as a dict, or :data:`NOT_JSON` (the reason in the shadow)."""
        raw = call.args
        if raw is None:
            return {}
        if type(raw) is dict:
            return raw
        if isinstance(raw, (str, bytes, bytearray)):
            return _parse_json(call, raw)
        if isinstance(raw, Mapping):
            return dict(raw)
        dump = getattr(raw, "model_dump", None)
        if callable(dump):
            dumped = dump()
            if isinstance(dumped, dict):
                return dumped
        call.shadow["json_reason"] = (
            f"the arguments must be a JSON object, not {type(raw).__name__}"
        )
        return NOT_JSON

    # -- dispatch, classify, verify, retry -------------------------------------------------
    def _attempts(self, call: _Call, reply: _Value | _Raised
                  ) -> Generator[Step, Any, _Value | Failure]:
        """From the first attempt's ``reply``: run the tool until it succeeds or its failure
        is final; transient ones retry inside the wrapper (backoff, Retry-After), before the
        model ever sees them."""
        retries = 0
        loop_started = waited = 0.0
        while True:
            if type(reply) is _Value:  # a returned error is final: it is not retried
                returned = self._returned_error(call, reply.value)
                return reply if returned is None else returned
            else:
                assert isinstance(reply, _Raised)
                failure = self._classify(call, reply.exc)
                if failure.outcome is Outcome.UNKNOWN and call.spec and call.spec.postcondition \
                        and self._scope.mode == "enforce" and not self.out_of_time(call):
                    running = call.orphan is not None and not call.orphan.done()
                    verdict = yield VERIFY
                    failure = self._effects.verified(failure, verdict, call, running)
            if not self._retryable(failure) or self.out_of_time(call):
                return failure
            backoff = self._limits.backoff
            if retries == 0:
                delay = _first_wait(backoff, failure)
                loop_started = time.monotonic()
            else:
                delay = _next_wait(backoff, retries, failure)
                # Time spent retrying: the clock's, or what was slept where sleep is injected.
                spent = max(time.monotonic() - loop_started, waited)
                if retries >= backoff.attempts - 1 or spent + delay >= backoff.max_seconds:
                    return failure
            retries += 1
            waited += delay
            left = self.left(call)
            yield Sleep(delay if left is None else max(0.0, min(delay, left)))
            reply = yield DISPATCH

    def _retryable(self, failure: Failure) -> bool:
        backoff = self._limits.backoff
        if self._scope.mode != "enforce" or backoff.attempts <= 1 or not failure.transient:
            return False
        if failure.outcome is not Outcome.NO_EFFECT:
            return False
        return not (failure.retry_after is not None and failure.retry_after > backoff.max_seconds)

    def _returned_error(self, call: _Call, value: Any) -> Failure | None:
        """A returned error value as a failure, else ``None`` (the value is a result)."""
        spec = call.spec
        assert spec is not None
        detector = spec.error_result
        if detector is None:
            return None
        try:
            reason = detector(value)
        except Exception:  # noqa: BLE001 - a broken detector: the value stands
            return None
        return self._returned_failure(reason, value) if reason else None

    def _returned_failure(self, reason: Any, value: Any) -> Failure:
        entry = self._catalog.for_text(str(reason), exclude=("internal_error",))
        entry = entry or self._catalog.get("tool_error")
        failure = from_entry(entry, str(reason)[:300], cause=None)
        failure.values["returned"] = self._shaper.success_text(value)[0]
        return failure

    def _classify(self, call: _Call, exc: BaseException) -> Failure:
        assert call.spec is not None
        failure = from_exception(exc, self._catalog, tool=call.name,
                                 side_effect=call.spec.side_effect)
        # One quiet line per failure; the traceback only when asked (see RedactingFilter).
        if log.isEnabledFor(logging.INFO):  # disabled: not even the arguments are built
            log.info("tool %s raised %s (code %s)", call.name, type(exc).__name__,
                     failure.code, exc_info=exc)
        return failure

    def left(self, call: _Call) -> float | None:
        """Seconds left before the call's deadline (``None``: no deadline)."""
        deadline = self._settings.deadline
        if deadline is None:
            return None
        return deadline - (time.monotonic() - call.started)

    def out_of_time(self, call: _Call) -> bool:
        left = self.left(call)
        return left is not None and left <= 0.05

    def attempt_limit(self, call: _Call, timeout: float | None) -> float | None:
        """The wait for one attempt: the tool's own timeout within the call's deadline."""
        left = self.left(call)
        if left is None:
            return timeout
        left = max(left, 0.0)
        return left if timeout is None else min(timeout, left)

    # -- shape and record --------------------------------------------------------------------
    def _finish(self, call: _Call, done: _Value | Failure) -> ToolResult:
        if isinstance(done, _Value):
            return self._succeeded(call, done.value)
        failure = done
        count = failure.outcome is not Outcome.APPLIED
        resolve_fp(call, self._scope)
        assert call.key is not None
        if not count and not call.refused:
            best_effort(self._store.clear_failures, call.key)
        result = self._failures.fail(call, failure, count=count)
        if call.entry is not None:
            effect = failure.outcome
            confirmed = "postcondition" if "confirmed" in failure.values else None
            if effect is Outcome.NO_EFFECT and confirmed is None and \
                    failure.failure_class is FailureClass.INTERNAL:
                effect = Outcome.UNKNOWN
            call.entry = replace(call.entry, effect=effect, told=result.code,
                                 told_effect=result.outcome, confirmed_by=confirmed,
                                 attempts=call.attempts, told_text=_told(result.text))
            self._effects.put_ledger(call.entry)
        return result

    def _succeeded(self, call: _Call, value: Any) -> ToolResult:
        spec = call.spec
        assert spec is not None
        adm = call.admission
        if adm is not None and adm.failures and call.key is not None and not call.refused:
            best_effort(self._store.clear_failures, call.key)
        text, data = self._shaper.success_text(value)
        note: str | None = None
        if call.entry is not None:
            call.entry = replace(call.entry, effect=Outcome.APPLIED, told="ok",
                                 told_effect=Outcome.APPLIED, confirmed_by="return",
                                 attempts=call.attempts, told_text=_told(text))
            self._effects.put_ledger(call.entry)
        if call.refused:  # observe ran what enforce would not: compared, counted nowhere
            repeat = self._ladder.compared(call, text)
            if repeat is not Repeat.NEW:
                call.shadow["result"] = "changed" if repeat is Repeat.CHANGED else "same"
        else:  # no progress, blocks lifted by a success: see note_success
            repeat = self._ladder.note_success(call, text)
            if repeat is not Repeat.NEW:  # for the trace: what ``toolfault calibrate`` replays
                call.shadow["result"] = "changed" if repeat is Repeat.CHANGED else "same"
            if repeat is Repeat.NO_PROGRESS:
                refused = self._ladder.no_progress(call, text, data)
                if self._scope.mode == "enforce":
                    return refused
                call.shadow["would_no_progress"] = True
            elif repeat is Repeat.SAME and self._scope.mode != "observe":
                note = REPEAT_NOTE
                text = f"{text}\n{note}"
        fp = call.fingerprint
        return new_result(spec.name, True, text, data, call.attempts, call.call_id, None,
                          call.fp or fp or "", note)

    def _unknown_tool(self, call: _Call) -> ToolResult:
        names = sorted(self._tools)
        nearest = difflib.get_close_matches(call.name, names, n=3, cutoff=0.4) or names[:5]
        failure = from_entry(
            self._catalog.get("unknown_tool"),
            f"there is no tool named {call.name!r}",
        )
        failure.values["nearest"] = ", ".join(nearest) if nearest else "none are registered"
        try:
            call.fp = fingerprint("__unknown__", {"tool": call.name, "args": call.args})
        except (ValueError, TypeError, RecursionError):
            call.fp = fingerprint("__unknown__", {"tool": call.name})
        call.key = CallKey(self._scope.task_id, self._scope.turn, call.fp)
        return self._failures.fail(call, failure)

    def shaped(self, call: _Call, error: BaseException) -> ToolResult:
        """An exception raised outside the guard, shaped (not counted against caps)."""
        parsed = self.parse(call)
        if parsed is NOT_JSON:
            return self._failures.fail_unscoped(call, "invalid_json",
                                                call.shadow.pop("json_reason"))
        call.args = parsed
        failure = from_exception(error, self._catalog, tool=call.name,
                                 side_effect=bool(call.spec and call.spec.side_effect))
        return self._failures.fail(call, failure, count=False)


class _Deferred(LazyFingerprint):
    """The fingerprint of one call's arguments, computed only if someone asks: a
    :class:`LazyFingerprint` holding the arguments instead of a closure over them (a
    closure and a call to the base constructor cost a microsecond per call)."""

    __slots__ = ("_args", "_sorted", "_spec")

    def __init__(self, spec: ToolSpec, args: dict[str, Any], *, in_order: bool) -> None:
        self._value: str | None = None  # computed by __call__; no closure to keep
        self._compute = None
        self._spec = spec
        self._args = args
        #: ``args`` has its keys in sorted order already.
        self._sorted = in_order

    def __call__(self) -> str:
        """The fingerprint: the arguments are JSON's own types (parsed from JSON text,
        validated by the tool's strict twin, or checked by ``_plain``) and the tool has no
        normalizers (see ``admit``)."""
        value = self._value
        if value is None:
            try:
                value = fingerprint_json_values(self._spec.name, self._args,
                                                in_order=self._sorted)
            except (ValueError, TypeError, RecursionError):
                # Not reachable for such arguments; a store must never see a raise.
                basis = echo_args(self._args)
                value = hashlib.sha256(f"__invalid__\x00{self._spec.name}\x00{basis}".encode(
                    "utf-8", "surrogatepass")).hexdigest()
            self._value = value
        return value


_SCALARS = (int, bool, type(None))


def _lazy_json(text: str) -> bool:
    """Whether what the fast parser made of ``text`` surely has a fingerprint (so it may
    wait): it holds only strings without lone surrogates, finite numbers, bools, nulls,
    lists and string-keyed objects; bounded size and bracket count bound its canonical size
    and depth."""
    return len(text) <= _LAZY_JSON_CHARS and \
        text.count("[") + text.count("{") <= _LAZY_JSON_BRACKETS


def _plain(args: dict[str, Any]) -> bool:
    """Arguments the canonical fingerprint surely accepts (so it may be computed later):
    string keys; strings, ints, bools, nulls, finite floats and flat lists of them."""
    budget = PLAIN_CHARS
    for key, value in args.items():
        if type(key) is not str:
            return False
        kind = type(value)
        if kind is str:
            budget -= len(value)
        elif kind is float:
            if value - value != 0.0:  # NaN or infinity
                return False
        elif kind is list:
            if len(value) > PLAIN_ITEMS:
                return False
            for item in value:
                sub = type(item)
                if sub is str:
                    budget -= len(item)
                elif sub is float:
                    if item - item != 0.0:
                        return False
                elif sub not in _SCALARS:
                    return False
        elif kind not in _SCALARS:
            return False
    return budget > 0


def _parse_json(call: _Call, raw: str | bytes | bytearray) -> Any:
    text = raw.decode("utf-8", "replace") if not isinstance(raw, str) else raw
    if len(text) > _MAX_JSON_CHARS:
        call.shadow["json_reason"] = (f"the arguments are too large ({len(text)} "
                                      f"characters; the limit is {_MAX_JSON_CHARS})")
        return NOT_JSON
    try:
        # pydantic-core's parser: about three times json.loads on a tool's arguments, and
        # the same values wherever it accepts the text.  What it refuses (NaN, lone
        # surrogates, depth, bad JSON) the standard parser decides and words, as before.
        parsed = _from_json(text, allow_inf_nan=False)
        call.plain_json = _lazy_json(text)
    except ValueError:
        parsed = _parse_json_slowly(call, text)
    if type(parsed) is dict or parsed is NOT_JSON:
        return parsed
    call.shadow["json_reason"] = (
        f"the arguments must be a JSON object, not {type(parsed).__name__}"
    )
    return NOT_JSON


def _parse_json_slowly(call: _Call, text: str) -> Any:
    """The standard library's verdict and words, for text the fast parser refused."""
    if not text.strip():
        return {}
    try:
        return _DECODER.decode(text)
    except RecursionError:
        call.shadow["json_reason"] = "the arguments are nested too deeply"
    except ValueError as exc:
        msg = getattr(exc, "msg", str(exc))
        pos = getattr(exc, "pos", None)
        where = f" at character {pos}" if pos is not None else ""
        call.shadow["json_reason"] = f"the arguments are not valid JSON ({msg}{where})"
    return NOT_JSON


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a valid JSON number")


_DECODER = json.JSONDecoder(parse_constant=_reject_constant)


def _first_wait(backoff: Any, failure: Failure) -> float:
    delay = backoff.initial + (random.uniform(0, backoff.jitter) if backoff.jitter else 0.0)
    return float(max(min(delay, backoff.maximum), failure.retry_after or 0.0))


def _next_wait(backoff: Any, retries: int, failure: Failure) -> float:
    """Exponential backoff after the ``retries``-th retry failed, honouring Retry-After."""
    delay = min(backoff.maximum, backoff.initial * (2 ** max(0, retries - 1)))
    delay += random.uniform(0, backoff.jitter) if backoff.jitter else 0.0
    return float(max(delay, failure.retry_after or 0.0))


def _told(text: str) -> str | None:
    """The text kept in the ledger for a replay (none when too large to keep)."""
    return text if len(text) <= _MAX_TOLD_TEXT else None
