"""The guard: the one object between an agent and its tools.

``Guard.call`` validates, fingerprints, counts, dispatches, retries what is transient,
verifies what is uncertain and shapes every failure into the four-part contract.  It never
raises into the agent loop: whatever happens comes back as a :class:`ToolResult`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import copy
import difflib
import hashlib
import inspect
import itertools
import json
import logging
import math
import random
import re
import threading
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import IO, Any, Literal, TypeVar, overload

from tenacity import (
    AsyncRetrying,
    RetryCallState,
    Retrying,
    retry_if_exception_type,
    stop_after_attempt,
    stop_before_delay,
)

from toolfault import _trace
from toolfault._budget import BudgetMixin
from toolfault._call import _Call, _new_call_id, _Retry, _run_coroutine, _Value
from toolfault._catalog import Catalog, fill
from toolfault._classify import Failure, from_entry, from_exception
from toolfault._effects import EffectsMixin
from toolfault._errors import (
    ConfigurationError,
    FailureClass,
    Outcome,
    StateUnavailableError,
    ToolError,
)
from toolfault._fingerprint import NormalizeSpec, fingerprint
from toolfault._jsontext import prebuilt_encoder
from toolfault._limits import Limits
from toolfault._message import (
    echo_args,
    fit_to_budget,
    format_seconds,
    render_error,
    render_terminal,
)
from toolfault._progress import _BREAK, Progress, TurnState, repeats
from toolfault._records import Incident, IncidentKind, LedgerEntry
from toolfault._redact import LOG_FILTER, REDACTED, Redactor
from toolfault._result import FailureInfo, ToolContext, ToolResult
from toolfault._returned import default_error_result
from toolfault._state import Admission, CallKey, DegradingStore, MemoryStore, Store
from toolfault._tokens import Tokenizer, resolve_tokenizer
from toolfault._tool import (
    Alternative,
    ErrorDetector,
    Postcondition,
    ToolSpec,
    build_spec,
)

log = logging.getLogger("toolfault")
log.addHandler(logging.NullHandler())
log.addFilter(LOG_FILTER)  # the single exit of the log channel: redacted, no traceback

#: Seconds a whole call may take by default, retries, waits and checks included.
DEFAULT_DEADLINE = 120.0

F = TypeVar("F", bound=Callable[..., Any])
Mode = Literal["observe", "shape", "enforce"]
_UNSET: Any = object()
#: How long past the deadline ``acall`` waits for the guard's own bookkeeping.
_DEADLINE_GRACE = 1.0
_NOT_JSON = object()
_MAX_JSON_CHARS = 2_000_000
def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a valid JSON number")


class Guard(EffectsMixin, BudgetMixin):
    """Wraps tools so that no failure can loop the agent.

    >>> guard = Guard(limits=Limits(retry_limit=3))
    >>> @guard.tool
    ... def add(a: int, b: int) -> int:
    ...     return a + b
    >>> guard.call("add", '{"a": 1, "b": 2}').text
    '3'
    """

    def __init__(
        self,
        *,
        limits: Limits | None = None,
        catalog: Catalog | str | Path | None = None,
        store: Store | None = None,
        task_id: str = "default",
        secrets: Iterable[str] = (),
        mode: Mode = "enforce",
        trace: str | Path | IO[str] | None = None,
        observers: Iterable[Callable[[_trace.CallEvent], None]] = (),
        capture_content: bool = False,
        error_result: ErrorDetector | None = default_error_result,
        state_failure: Literal["open", "closed"] = "open",
        scan_env_secrets: bool = True,
        sleep: Callable[[float], None] | None = None,
        clock: Callable[[], float] | None = None,
        deadline: float | None = DEFAULT_DEADLINE,
        isolate_sync_tools: bool = False,
        log_tracebacks: bool = False,
        tokenizer: Tokenizer = "auto",
    ) -> None:
        if mode not in ("observe", "shape", "enforce"):
            raise ConfigurationError("mode must be 'observe', 'shape' or 'enforce'")
        if deadline is not None and not deadline > 0:
            raise ConfigurationError("deadline must be a positive number of seconds or None")
        #: No call takes longer than this: retries, backoff, postconditions, async tools,
        #: sync tools given ``timeout=`` and sync tools under :meth:`acall` are all bounded by
        #: it; a tool still running then is abandoned (in its worker thread) and the model is
        #: told it timed out (``Effect: unknown`` for side effects).
        self.deadline = deadline
        #: A sync tool without ``timeout=`` runs on the caller's thread under :meth:`call`
        #: (its thread-locals, e.g. a ``sqlite3`` connection, keep working, and a success
        #: costs no thread hop), so only its own return can end it.  ``True`` runs every
        #: sync tool in a worker thread, so the deadline bounds even a body that never returns.
        self.isolate_sync_tools = isolate_sync_tools
        #: Counts an error's tokens against the catalog budget (loaded here, not per call).
        self.count_tokens = resolve_tokenizer(tokenizer)
        self._cut_to_budget = True
        if log_tracebacks:  # tracebacks are for engineers who ask; still redacted
            LOG_FILTER.tracebacks = True
        self.limits = limits or Limits()
        base = Catalog.default()
        if isinstance(catalog, (str, Path)):
            catalog = Catalog.load(catalog)
        self.catalog = base.merged(catalog) if catalog is not None else base
        self.task_id = task_id
        self.mode: Mode = mode
        self.redactor = Redactor(secrets, scan_env=scan_env_secrets)
        self.capture_content = capture_content
        self.error_result = error_result
        self._store = DegradingStore(
            store or MemoryStore(), policy=state_failure, on_degrade=self._on_degrade
        )
        self._clean_turn_known = self._store.knows_clean_turns
        self._tools: dict[str, ToolSpec] = {}
        self._turn = 0
        self._observers: list[Callable[[_trace.CallEvent], None]] = list(observers)
        self._sink: _trace.JsonlSink | None = None
        if trace is not None:
            self._sink = _trace.JsonlSink(trace, redact=self.redactor.secrets)
            self._observers.append(self._sink)
        self._sleep = sleep or time.sleep
        #: Seconds for expiring blocks (``Limits.block_seconds``); injectable for tests.
        self._clock = clock or time.monotonic
        self._progress = Progress()
        self._cached_state: TurnState | None = None  # this scope's current turn, for speed
        self._cached_for: str | None = None
        self._cached_turn = -1
        # One bounded pool per purpose, so hung tools cannot starve timeouts or checks.
        self._executors: dict[str, concurrent.futures.ThreadPoolExecutor] = {}
        self._executor_lock = threading.Lock()
        self.last_degraded_error: str | None = None

    # -- registration ---------------------------------------------------------------------
    @overload
    def tool(self, fn: F, /) -> F: ...

    @overload
    def tool(
        self,
        fn: None = None,
        /,
        *,
        name: str | None = ...,
        description: str | None = ...,
        alternatives: Sequence[str | Alternative] | Mapping[str, str] = ...,
        normalize: NormalizeSpec | None = ...,
        schema: Mapping[str, Any] | None = ...,
        cost: float = ...,
        side_effect: bool = ...,
        postcondition: Postcondition | None = ...,
        timeout: float | None = ...,
        idempotency_key: Callable[[dict[str, Any]], str] | Sequence[str] | str | None = ...,
        check_with: str | None = ...,
        retry_limit: int | None = ...,
        error_result: ErrorDetector | None = ...,
    ) -> Callable[[F], F]: ...

    def tool(
        self,
        fn: F | None = None,
        /,
        *,
        name: str | None = None,
        description: str | None = None,
        alternatives: Sequence[str | Alternative] | Mapping[str, str] = (),
        normalize: NormalizeSpec | None = None,
        schema: Mapping[str, Any] | None = None,
        cost: float = 0.0,
        side_effect: bool = False,
        postcondition: Postcondition | None = None,
        timeout: float | None = None,
        idempotency_key: Callable[[dict[str, Any]], str] | Sequence[str] | str | None = None,
        check_with: str | None = None,
        retry_limit: int | None = None,
        error_result: ErrorDetector | None = _UNSET,
    ) -> F | Callable[[F], F]:
        """Register a tool (decorator, with or without options); returns the function as is.

        ``side_effect=True`` marks calls that change the world: their timeouts are
        ``Effect: unknown`` and are verified with ``postcondition`` before any retry.
        """

        def register(func: F) -> F:
            spec = build_spec(
                func, name=name, description=description, alternatives=alternatives,
                normalize=normalize, schema=schema, cost=cost, side_effect=side_effect,
                postcondition=postcondition, timeout=timeout, idempotency_key=idempotency_key,
                check_with=check_with, retry_limit=retry_limit,
                error_result=self.error_result if error_result is _UNSET else error_result,
            )
            if spec.side_effect and spec.idempotency_key is None:
                spec.idempotency_key = None  # keyed by fingerprint at call time
            self._tools[spec.name] = spec
            return func

        if fn is not None:
            return register(fn)
        return register

    def register(self, obj: object, *, prefix: str = "", exclude: Iterable[str] = (),
                 **options: Any) -> list[str]:
        """Register every public method of an existing object as a tool, unmodified."""
        skip = set(exclude)
        names = []
        for attr in dir(obj):
            if attr.startswith("_") or attr in skip:
                continue
            method = getattr(obj, attr)
            if not callable(method) or inspect.isclass(method):
                continue
            self.tool(name=f"{prefix}{attr}", **options)(method)
            names.append(f"{prefix}{attr}")
        return names

    @property
    def tools(self) -> Mapping[str, ToolSpec]:
        """Registered tools by name (read-only view)."""
        return dict(self._tools)

    # -- turns, budgets, records ----------------------------------------------------------
    @property
    def turn(self) -> int:
        return self._turn

    def new_turn(self) -> None:
        """Start a new model turn: per-turn counters reset; per-task budgets carry on."""
        self._progress.forget(self.task_id, self._turn)
        self._turn += 1

    def new_task(self, task_id: str) -> None:
        """Switch to another task: budgets, ledger and incidents are scoped per task."""
        self.task_id = task_id
        self._turn = 0

    def scoped(self, task_id: str) -> Guard:
        """A guard sharing this one's tools, store, catalog, secrets, observers and worker
        pool, counting under its own task id and turn (one per MCP session or worker).

        Scopes share resources with their parent: close the parent, not a scope.
        """
        forked = copy.copy(self)
        forked.task_id = task_id
        forked._turn = 0
        return forked

    @property
    def incidents(self) -> list[Incident]:
        """Incidents of the current task (cap hits, budget hits, degraded state, mismatches)."""
        return self._store.incidents(self.task_id)

    @property
    def ledger(self) -> list[LedgerEntry]:
        """Effect-ledger entries of the current task."""
        return self._store.ledger(self.task_id)

    def ledger_for(self, task_id: str) -> list[LedgerEntry]:
        """Effect-ledger entries of any task sharing this guard's store."""
        return self._store.ledger(task_id)

    @property
    def degraded(self) -> bool:
        """True while the store is unreachable and the guard counts locally."""
        return self._store.degraded

    def add_secret(self, *values: str) -> None:
        """Register secret values that must never appear in any message or trace."""
        self.redactor.add(*values)

    def add_observer(self, observer: Callable[[_trace.CallEvent], None]) -> None:
        """Subscribe to a :class:`CallEvent` after every call."""
        self._observers.append(observer)

    def close(self) -> None:
        """Flush the trace and release the store and worker threads."""
        if self._sink is not None:
            self._sink.close()
        with self._executor_lock:
            pools = list(self._executors.values())
            self._executors.clear()
        for pool in pools:
            pool.shutdown(wait=False, cancel_futures=True)
        self._store.close()

    def _on_degrade(self, exc: BaseException) -> None:
        self.last_degraded_error = type(exc).__name__
        log.warning("toolfault state store unavailable (%s); policy=%s",
                    type(exc).__name__, self._store.policy)
        incident = Incident(IncidentKind.STATE_DEGRADED, "*", "state_unavailable",
                            f"store unreachable ({type(exc).__name__}); "
                            f"policy {self._store.policy}", self.task_id, self._turn)
        self._store.fallback.add_incident(incident)
        if self._sink is not None:
            self._sink.write({"type": "incident", **incident.to_dict()})

    def _incident(self, kind: IncidentKind, tool: str, code: str, detail: str) -> None:
        incident = Incident(kind, tool, code, self.redactor.prose(detail), self.task_id,
                            self._turn)
        try:
            self._store.add_incident(incident)
        except Exception:
            self._store.fallback.add_incident(incident)
        if self._sink is not None:
            self._sink.write({"type": "incident", **incident.to_dict()})

    # -- the call ------------------------------------------------------------------------
    def call(self, name: str, args: Any = None, *, call_id: str | None = None) -> ToolResult:
        """Run one tool call (dict or raw JSON string arguments); never raises.

        Only ``KeyboardInterrupt`` and ``SystemExit`` propagate; anything else, whatever the
        tool raised or the guard tripped on, comes back as a shaped result.
        """
        try:
            return self._call(name, args, call_id)
        except BaseException as exc:
            if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                raise
            return self._last_resort(name, args, call_id, exc)

    def _call(self, name: str, args: Any, call_id: str | None) -> ToolResult:
        spec = self._tools.get(name) if type(name) is str else None
        if spec is not None and spec.plain and type(args) is dict and \
                (call_id is None or type(call_id) is str) and self._fast_ready():
            primary = self._store.primary
            if isinstance(primary, MemoryStore) and \
                    primary.fast_enter(self.task_id, self._turn, spec.name, args):
                try:
                    fast = self._fast_call(spec, args, call_id)
                finally:
                    primary.fast_exit()
                if fast is not None:
                    return fast
        call = _Call(None, "unnamed_tool", args, "", time.monotonic())
        try:
            _name_call(call, name, call_id)
            early = self._prepare(call)
            if early is not None:
                return self._emit(call, early)
            return self._emit(call, self._finish(call, self._dispatch_sync(call)))
        except BaseException as exc:
            if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                raise
            return self._safe_emit(call, self._crash(call, exc))
        finally:
            if call.held or call.reserved is not None or call.entered:
                self._quiet_release(call)

    def _fast_ready(self) -> bool:
        """No budgets, local state, enforce mode, and no failure yet in this turn."""
        limits = self.limits
        store = self._store
        return (
            self._clean_turn_known and self.mode == "enforce"
            and limits.max_calls_per_turn is None and limits.max_spend_per_task is None
            and store._down_since is None
            and (not self._progress.halted
                 or (self.task_id, self._turn) not in self._progress.halted)
            and not store.primary.has_failures(self.task_id, self._turn)  # type: ignore[attr-defined]
        )

    def _fast_call(self, spec: ToolSpec, args: dict[str, Any], call_id: str | None
                   ) -> ToolResult | None:
        """The common case in one frame: valid flat arguments, a plain sync tool, a clean turn.

        Anything unusual (a validation problem, an exception, a returned error, an observer)
        hands over to the general path with the same state, so behaviour is identical.
        ``None`` means "not taken, nothing happened".
        """
        if not _flat_simple(args):
            return None
        fast_validate = spec.fast_validate
        if fast_validate is not None:
            try:
                kwargs = fast_validate(args)
            except Exception:  # a validation problem: the general path words it
                return None
        else:
            kwargs, problems = spec.validator.validate(args)
            if problems:
                return None
        started = time.monotonic()
        cid = call_id or _new_call_id()
        try:
            if self.deadline is None or not self.isolate_sync_tools:
                value = spec.fn(**kwargs)
            else:
                value = self._bounded(spec.fn, kwargs, self.deadline, spec.name)
            if hasattr(value, "__await__"):  # an async tool behind a plain decorator
                value = _run_coroutine(value, timeout=self.deadline)
        except Exception as exc:
            return self._fast_fallback(spec, args, kwargs, cid, started, exc=exc)
        except BaseException as exc:
            if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                raise
            call = _Call(spec, spec.name, args, cid, started)
            call.kwargs, call.attempts, call.dispatched = kwargs, 1, True
            call.key = CallKey(self.task_id, self._turn, "")
            return self._safe_emit(call, self._crash(call, exc))
        try:
            detector = spec.error_result
            if detector is not None and detector(value):
                return self._fast_fallback(spec, args, kwargs, cid, started, value=_Value(value))
            text, data = self._success_text(value)
        except Exception:
            return self._fast_fallback(spec, args, kwargs, cid, started, value=_Value(value))
        limits = self.limits
        if limits.no_progress_cycle is not None or limits.success_lifts_blocks:
            cycle = self._note_success(spec, args, text)
            if cycle:
                call = _Call(spec, spec.name, args, cid, started)
                call.kwargs, call.attempts, call.dispatched = kwargs, 1, True
                call.key = CallKey(self.task_id, self._turn, "")
                try:
                    return self._safe_emit(call, self._no_progress(call, cycle))
                except Exception as exc:  # noqa: BLE001 - never raise into the loop
                    return self._safe_emit(call, self._crash(call, exc))
        lazy_fp = _LazyFingerprint(spec, args)
        result = ToolResult(spec.name, True, text, data, 1, cid, None, lazy_fp)
        observers = self._observers
        if observers and not _trace.tracing_active():
            redact = self.redactor.value
            try:
                event = _trace.CallEvent._success(
                    spec.name, cid, self.task_id, self._turn, lazy_fp, self.mode,
                    lambda: redact(args), time.monotonic() - started, time.time(),
                )
            except Exception:  # noqa: BLE001 - observing must never break the call
                return result
            for observer in observers:
                try:
                    observer(event)
                except Exception:  # noqa: BLE001 - observers are user code
                    pass
            return result
        if self._observers or _trace.tracing_active():
            call = _Call(spec, spec.name, args, cid, started)
            call.kwargs, call.attempts, call.dispatched = kwargs, 1, True
            call.key = CallKey(self.task_id, self._turn, "")
            return self._safe_emit(call, result)
        return result

    def _fast_fallback(self, spec: ToolSpec, args: dict[str, Any], kwargs: dict[str, Any],
                       cid: str, started: float, *, exc: Exception | None = None,
                       value: _Value | None = None) -> ToolResult:
        """Continue a fast call on the general path after its first attempt."""
        call = _Call(spec, spec.name, args, cid, started)
        call.kwargs, call.attempts, call.dispatched = kwargs, 1, True
        call.key = CallKey(self.task_id, self._turn, "")
        try:
            done: _Value | Failure
            if exc is not None:
                try:
                    done = self._after_exception_sync(call, exc)
                except _Retry as retry:
                    done = self._retry_loop_sync(call, retry)
            else:
                assert value is not None
                done = self._outcome_of(call, value.value) or value
            return self._emit(call, self._finish(call, done))
        except BaseException as crash:
            if isinstance(crash, (KeyboardInterrupt, SystemExit)):
                raise
            return self._safe_emit(call, self._crash(call, crash))

    async def acall(self, name: str, args: Any = None, *, call_id: str | None = None
                    ) -> ToolResult:
        """Async twin of :meth:`call`; sync tools run in a worker thread.

        Never raises but ``KeyboardInterrupt``, ``SystemExit`` and cancellation of the
        awaiting task (reservations are released on the way out).  Past the guard's
        deadline the call is cancelled and answered as timed out.
        """
        try:
            if self.deadline is None:
                return await self._acall(name, args, call_id)
            return await asyncio.wait_for(self._acall(name, args, call_id),
                                          self.deadline + _DEADLINE_GRACE)
        except BaseException as exc:
            if isinstance(exc, (KeyboardInterrupt, SystemExit, asyncio.CancelledError)):
                raise
            return self._last_resort(name, args, call_id, exc)

    async def _acall(self, name: str, args: Any, call_id: str | None) -> ToolResult:
        call = _Call(None, "unnamed_tool", args, "", time.monotonic())
        try:
            _name_call(call, name, call_id)
            early = await self._aprepare(call)
            if early is not None:
                return self._emit(call, early)
            return self._emit(call, self._finish(call, await self._dispatch_async(call)))
        except BaseException as exc:
            if isinstance(exc, (KeyboardInterrupt, SystemExit, asyncio.CancelledError)):
                raise
            return self._safe_emit(call, self._crash(call, exc))
        finally:
            self._quiet_release(call)

    def _quiet_release(self, call: _Call) -> None:
        """Settle reservations and keys; a store error here must not become a raise."""
        try:
            self._release(call)
        except Exception:  # noqa: BLE001 - leases and key TTLs are the backstop
            log.info("toolfault could not release a reservation for %s", call.name)

    def _last_resort(self, name: object, args: Any, call_id: str | None,
                     exc: BaseException) -> ToolResult:
        """The answer when even the guard's own error path failed: shaped, never raised."""
        timed_out = isinstance(exc, TimeoutError)
        try:
            shown = self._safe_name(name if isinstance(name, str) else str(name))
        except Exception:  # noqa: BLE001 - a hostile name object
            shown = "unnamed_tool"
        spec = self._tools.get(name) if isinstance(name, str) else None
        side_effect = bool(spec and spec.side_effect)
        try:
            args_text = echo_args(self.redactor.value(args if isinstance(args, (dict, list))
                                                      else str(args)[:2_000]))
        except Exception:  # noqa: BLE001
            args_text = "{}"
        code = "timeout" if timed_out else "internal_error"
        outcome = Outcome.UNKNOWN if (side_effect or timed_out) else Outcome.NO_EFFECT
        reason = (f"{shown} did not finish within the deadline of "
                  f"{format_seconds(self.deadline or 0)}" if timed_out
                  else f"{shown} hit an internal error and did not complete")
        log.warning("toolfault answered %s for %s (%s)", code, shown, type(exc).__name__)
        try:
            rendered = render_error(
                tool=shown, code=code, reason=reason, args_text=args_text, outcome=outcome,
                retryable=False, retry_after=None,
                next_action="stop and report this failure to the user",
            )
            text, problem = fit_to_budget(self.redactor.secrets(rendered.text),
                                          self.redactor.value(rendered.problem),
                                          self.catalog.token_budget, self.count_tokens)
        except Exception:  # noqa: BLE001
            text, problem = f"{shown} failed (code: {code}).", {"code": code}
        info = FailureInfo(code=code, outcome=outcome, cause=exc)
        return ToolResult(shown, False, text, problem, 0, call_id or "", info, "")

    def _safe_name(self, name: str) -> str:
        """A tool name safe to echo and trace: identifier characters, no secret in any form."""
        return self.redactor.secrets(_display_name(self.redactor.secrets(name[:4_000])))

    def _left(self, call: _Call) -> float | None:
        """Seconds left before the call's deadline (``None``: no deadline)."""
        if self.deadline is None:
            return None
        return self.deadline - (time.monotonic() - call.started)

    def _out_of_time(self, call: _Call) -> bool:
        left = self._left(call)
        return left is not None and left <= 0.05

    def _limit(self, call: _Call, timeout: float | None) -> float | None:
        """The wait for one attempt: the tool's own timeout within the call's deadline."""
        left = self._left(call)
        if left is None:
            return timeout
        left = max(left, 0.0)
        return left if timeout is None else min(timeout, left)

    def _bounded(self, fn: Callable[..., Any], kwargs: dict[str, Any], limit: float,
                 name: str, call: _Call | None = None) -> Any:
        """Run a sync tool in a worker thread for at most ``limit`` seconds.

        A tool still running then is abandoned in its thread (it may yet finish); the
        caller gets a ``TimeoutError`` and shapes it.
        """
        if limit <= 0:
            raise TimeoutError(f"{name} timed out")
        context = contextvars.copy_context()
        future = self._pool("tools").submit(context.run, _in_thread, fn, kwargs)
        try:
            return future.result(timeout=limit)
        except concurrent.futures.TimeoutError:
            if future.done():  # the tool's own TimeoutError, or an answer just in time
                return future.result()
            if not future.cancel() and call is not None:
                call.orphan = future  # it started and is still running: it may yet land
            raise TimeoutError(f"{name} timed out after {limit:.3g}s") from None

    def shape(self, name: str, args: Any, error: BaseException, *,
              call_id: str | None = None) -> ToolResult:
        """Shape an exception a framework caught outside the guard into the contract.

        Not counted against caps (the guard did not run the call), but traced and redacted
        like any other result.
        """
        call = _Call(self._tools.get(name), str(name), args, call_id or _new_call_id(),
                     time.monotonic())
        try:
            parsed = self._parse(call)
            if parsed is _NOT_JSON:
                return self._emit(call, self._fail_unscoped(call, "invalid_json",
                                                            call.shadow.pop("json_reason")))
            call.args = parsed
            failure = from_exception(error, self.catalog, tool=call.name,
                                     side_effect=bool(call.spec and call.spec.side_effect))
            return self._emit(call, self._fail(call, failure, count=False))
        except Exception as exc:  # noqa: BLE001
            return self._safe_emit(call, self._crash(call, exc))

    def run_tool_calls(self, calls: Iterable[Any]) -> list[ToolResult]:
        """Run a batch of calls from your own loop: ``(name, args)``, dicts or SDK objects.

        Never raises: an item that names no tool gets an ``invalid_call`` result in its place.
        """
        results = []
        for item in self._items(calls):
            try:
                name, args, cid = _unpack_call(item)
            except Exception as exc:  # noqa: BLE001 - a malformed item is answered, not raised
                results.append(self._invalid_call(item, exc))
                continue
            results.append(self.call(name, args, call_id=cid))
        return results

    async def arun_tool_calls(self, calls: Iterable[Any]) -> list[ToolResult]:
        """Run one turn's parallel calls concurrently, results in the order given."""
        async def one(item: Any) -> ToolResult:
            try:
                name, args, cid = _unpack_call(item)
            except Exception as exc:  # noqa: BLE001
                return self._invalid_call(item, exc)
            return await self.acall(name, args, call_id=cid)

        return list(await asyncio.gather(*(one(item) for item in self._items(calls))))

    def _items(self, calls: Any) -> list[Any]:
        if isinstance(calls, (str, bytes, Mapping, tuple)) or calls is None:
            return [calls]  # one call, or nothing usable: answered item by item
        try:
            return list(calls)
        except Exception:  # noqa: BLE001 - not iterable, or it broke while iterating
            return [calls]

    def _invalid_call(self, item: Any, exc: BaseException) -> ToolResult:
        """``invalid_call`` for a batch item that could not be read as a tool call."""
        if isinstance(exc, _Malformed):
            reason, name, cid = exc.reason, exc.name, exc.call_id
        else:
            reason, name, cid = "the tool call could not be read", "tool_call", None
        shown: Any = item if isinstance(item, (dict, list)) else (
            item if isinstance(item, str) else repr(item)[:200])
        if isinstance(item, Mapping) and not isinstance(item, dict):
            shown = repr(item)[:200]
        call = _Call(None, name, shown, cid or _new_call_id(), time.monotonic())
        try:
            return self._safe_emit(call, self._fail_unscoped(call, "invalid_call", reason))
        except Exception as crash:  # noqa: BLE001
            return self._safe_emit(call, self._crash(call, crash))

    # -- preparation (shared by sync and async) ------------------------------------------
    def _prepare(self, call: _Call) -> ToolResult | None:
        early = self._prepare_until_effects(call)
        if early is not None or call.spec is None or not call.spec.side_effect:
            return early
        if self.mode != "enforce":
            self._record_dispatch(call)
            return None
        return self._claim_then_verify_sync(call)

    async def _aprepare(self, call: _Call) -> ToolResult | None:
        early = self._prepare_until_effects(call)
        if early is not None or call.spec is None or not call.spec.side_effect:
            return early
        if self.mode != "enforce":
            self._record_dispatch(call)
            return None
        return await self._claim_then_verify_async(call)

    def _prepare_until_effects(self, call: _Call) -> ToolResult | None:
        spec = self._tools.get(call.name)
        if spec is None:
            call.name = self._safe_name(call.name)
        args = self._parse(call)
        if self._progress.halted and self.mode == "enforce":
            halted = self._still_halted(call, spec, args)
            if halted is not None:
                return halted
        if spec is None:  # the name is the first mistake to report, whatever the arguments
            if args is _NOT_JSON:
                call.shadow.pop("json_reason", None)
                call.args = call.args if isinstance(call.args, str) else repr(call.args)
            else:
                call.args = args
            return self._unknown_tool(call)
        if args is _NOT_JSON:
            return self._fail_unscoped(call, "invalid_json", call.shadow.pop("json_reason"))
        call.args = args
        call.spec = spec
        # Every call is fingerprinted and reserved: identical calls in flight count toward
        # the cap atomically, also before the first failure and for every kind of tool.
        problem = self._ensure_fp(call)
        if problem is not None:
            return self._fail_unscoped(call, "invalid_argument", problem)
        call.key = CallKey(self.task_id, self._turn, call.fp)
        lease = max(30.0, 4 * (spec.timeout or 30.0))
        self._count_fast_call(call, spec, lease)
        if self.limits.block_seconds is not None:
            self._lift_expired(call.key)
        try:
            call.admission = self._store.admit(
                call.key, cost=spec.cost, max_calls=self.limits.max_calls_per_turn,
                max_spend=self.limits.max_spend_per_task, lease=lease,
                limit=self._in_flight_limit(spec),
            )
        except StateUnavailableError:
            return self._fail(call, from_entry(self.catalog.get("state_unavailable"),
                                               "the agent's shared safety state is unreachable"),
                              count=False)
        adm = call.admission
        if adm.admitted:
            call.reserved = call.key  # settled in _release, under the key it was taken with
        if adm.over is not None:
            over = self._budget_exceeded(call, adm)
            if over is not None:
                return over
        if adm.blocked:
            if self.mode == "enforce":
                return self._blocked(call, adm)
            call.shadow["would_block"] = True
        if adm.busy:
            if self.mode == "enforce":
                return self._fail(call, from_entry(
                    self.catalog.get("in_progress"),
                    f"an identical {call.name} call is still running"), count=False)
            call.shadow["would_be_busy"] = True
        return self._validate(call, spec, args)

    def _in_flight_limit(self, spec: ToolSpec) -> int:
        """Identical calls allowed in flight before any failed: the smallest retry limit."""
        limits = self.limits
        if spec.retry_limit is not None:
            return spec.retry_limit
        if limits.retry_limit is not None:
            return limits.retry_limit
        return min((n for c, n in limits.retry_limits.items() if c is not FailureClass.BUDGET),
                   default=2)

    def _count_fast_call(self, call: _Call, spec: ToolSpec, lease: float) -> None:
        """An identical call on the fast path runs unreserved: reserve it before admitting.

        Entering first closes the gap: from then on no fast call starts, and one already
        running is visible here.
        """
        primary = self._store.primary
        if not isinstance(primary, MemoryStore):
            return
        primary.enter()
        call.entered = True
        fast = primary.fast_call(self.task_id, self._turn)
        if fast is None or fast[0] != spec.name or call.key is None:
            return
        try:
            same = fingerprint(spec.name, fast[1], spec.normalizers) == call.fp
        except (ValueError, TypeError, RecursionError):
            same = False
        if same:
            primary.reserve_fast(call.key, lease, fast[1])

    def _validate(self, call: _Call, spec: ToolSpec, args: dict[str, Any]) -> ToolResult | None:
        kwargs, problems = spec.validator.validate(args)
        if problems and self.mode == "observe":
            call.shadow["would_reject"] = problems[0].reason
            call.kwargs = dict(args)
            return None
        if problems:
            self._refund(call)
            first = problems[0]
            reason = "; ".join(p.reason for p in problems[:2])
            failure = from_entry(self.catalog.get("invalid_argument"), reason,
                                 next_action=first.next_action, param=first.param)
            failure.expected = first.expected
            failure.values["first_reason"] = first.reason
            return self._fail(call, failure)
        call.kwargs = kwargs
        return None

    def _ensure_fp(self, call: _Call) -> str | None:
        """Fingerprint the call (once); returns why the arguments are unusable, if they are."""
        if call.fp:
            return None
        assert call.spec is not None
        try:
            call.fp = fingerprint(call.spec.name, call.args, call.spec.normalizers)
        except RecursionError:
            return "the arguments are nested too deeply"
        except (ValueError, TypeError) as exc:
            text = str(exc)
            if "NaN" in text or "Infinity" in text or "nan" in text.lower():
                return "the arguments contain NaN or Infinity, which is not a valid number"
            if "too large" in text:
                return text
            return "the arguments must be plain JSON values"
        if call.key is not None:
            call.key = CallKey(call.key.task, call.key.turn, call.fp)
        return None

    def _lazy_fingerprint(self, call: _Call) -> Callable[[], str]:
        spec, args = call.spec, call.args
        assert spec is not None
        return lambda: fingerprint(spec.name, args, spec.normalizers)

    def _parse(self, call: _Call) -> Any:
        raw = call.args
        if raw is None:
            return {}
        if type(raw) is dict:
            return raw
        if isinstance(raw, (str, bytes, bytearray)):
            text = raw.decode("utf-8", "replace") if not isinstance(raw, str) else raw
            if not text.strip():
                return {}
            if len(text) > _MAX_JSON_CHARS:
                call.shadow["json_reason"] = (f"the arguments are too large ({len(text)} "
                                              f"characters; the limit is {_MAX_JSON_CHARS})")
                return _NOT_JSON
            try:
                parsed = json.loads(text, parse_constant=_reject_constant)
            except RecursionError:
                call.shadow["json_reason"] = "the arguments are nested too deeply"
                return _NOT_JSON
            except ValueError as exc:
                msg = getattr(exc, "msg", str(exc))
                pos = getattr(exc, "pos", None)
                where = f" at character {pos}" if pos is not None else ""
                call.shadow["json_reason"] = f"the arguments are not valid JSON ({msg}{where})"
                return _NOT_JSON
            if not isinstance(parsed, dict):
                call.shadow["json_reason"] = (
                    f"the arguments must be a JSON object, not {type(parsed).__name__}"
                )
                return _NOT_JSON
            return parsed
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
        return _NOT_JSON

    # -- dispatch -------------------------------------------------------------------------
    def _context(self, call: _Call) -> ToolContext:
        return ToolContext(call.name, call.call_id, self.task_id, self._turn, call.attempts,
                           call.idem)

    def _invoke_sync(self, call: _Call) -> Any:
        spec = call.spec
        assert spec is not None
        call.attempts += 1
        call.dispatched = True
        kwargs = call.kwargs
        if spec.context_param is not None:
            kwargs = {**kwargs, spec.context_param: self._context(call)}
        limit = self._limit(call, spec.timeout)
        if limit is not None and limit <= 0:
            raise TimeoutError(f"{spec.name} ran out of time")
        if spec.is_async:
            return _run_coroutine(spec.fn(**kwargs), timeout=limit)
        if limit is None or (spec.timeout is None and not self.isolate_sync_tools):
            value = spec.fn(**kwargs)  # on the caller's thread: see ``isolate_sync_tools``
            if hasattr(value, "__await__"):  # an async tool behind a plain decorator
                value = _run_coroutine(value, timeout=limit)
            return value
        value = self._bounded(spec.fn, kwargs, limit, spec.name, call)
        if hasattr(value, "__await__"):
            value = _run_coroutine(value, timeout=self._limit(call, spec.timeout))
        return value

    async def _invoke_async(self, call: _Call) -> Any:
        spec = call.spec
        assert spec is not None
        call.attempts += 1
        call.dispatched = True
        kwargs = call.kwargs
        if spec.context_param is not None:
            kwargs = {**kwargs, spec.context_param: self._context(call)}
        limit = self._limit(call, spec.timeout)
        if limit is not None and limit <= 0:
            raise TimeoutError(f"{spec.name} ran out of time")
        if spec.is_async:
            try:
                if limit is None:
                    return await spec.fn(**kwargs)
                return await asyncio.wait_for(spec.fn(**kwargs), limit)
            except TimeoutError:
                raise TimeoutError(f"{spec.name} timed out after {limit}s") from None
        context = contextvars.copy_context()
        future = self._pool("tools" if spec.timeout is not None else "async").submit(
            context.run, _in_thread, spec.fn, kwargs)
        try:
            value = await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(future)), limit)
        except TimeoutError:
            if future.done():  # the tool's own TimeoutError
                raise
            if not future.cancel():
                call.orphan = future
            raise TimeoutError(f"{spec.name} timed out after {limit}s") from None
        except asyncio.CancelledError:
            # The caller gave up, the thread did not: the key stays held until it ends.
            if not future.cancel():
                call.orphan = future
            raise
        if hasattr(value, "__await__"):
            value = await asyncio.wait_for(value, self._limit(call, spec.timeout))
        return value

    def _pool(self, purpose: str = "checks") -> concurrent.futures.ThreadPoolExecutor:
        """The bounded worker pool of one purpose: ``tools`` (calls with ``timeout=``),
        ``async`` (sync tools called from :meth:`acall`) or ``checks`` (postconditions)."""
        pool = self._executors.get(purpose)
        if pool is None:
            with self._executor_lock:
                pool = self._executors.get(purpose)
                if pool is None:
                    pool = concurrent.futures.ThreadPoolExecutor(
                        max_workers=_POOL_SIZES.get(purpose, 8),
                        thread_name_prefix=f"toolfault-{purpose}")
                    self._executors[purpose] = pool
        return pool

    def _outcome_of(self, call: _Call, value: Any) -> Failure | None:
        """A returned error value as a failure, else ``None`` (the value is a result)."""
        spec = call.spec
        assert spec is not None
        detector = spec.error_result
        if detector is None:
            return None
        try:
            reason = detector(value)
        except Exception:
            return None
        if not reason:
            return None
        entry = self.catalog.for_text(str(reason), exclude=("internal_error",))
        entry = entry or self.catalog.get("tool_error")
        failure = from_entry(entry, str(reason)[:300], cause=None)
        failure.values["returned"] = self._success_text(value)[0]
        return failure

    def _classify(self, call: _Call, exc: BaseException) -> Failure:
        assert call.spec is not None
        failure = from_exception(exc, self.catalog, tool=call.name,
                                 side_effect=call.spec.side_effect)
        # One quiet line per failure; the traceback only when asked (see RedactingFilter).
        log.info("tool %s raised %s (code %s)", call.name, type(exc).__name__, failure.code,
                 exc_info=exc)
        return failure

    def _wait(self, state: RetryCallState) -> float:
        backoff = self.limits.backoff
        n = max(0, state.attempt_number - 1)
        delay = min(backoff.maximum, backoff.initial * (2 ** n))
        delay += random.uniform(0, backoff.jitter) if backoff.jitter else 0.0
        exc = state.outcome.exception() if state.outcome is not None else None
        after = exc.failure.retry_after if isinstance(exc, _Retry) else None
        return float(max(delay, after or 0.0))

    def _should_retry_failure(self, failure: Failure) -> bool:
        backoff = self.limits.backoff
        if self.mode != "enforce" or backoff.attempts <= 1 or not failure.transient:
            return False
        if failure.outcome is not Outcome.NO_EFFECT:
            return False
        return not (failure.retry_after is not None and failure.retry_after > backoff.max_seconds)

    def _retrying_kwargs(self) -> dict[str, Any]:
        backoff = self.limits.backoff
        return {
            "stop": stop_after_attempt(backoff.attempts - 1)
            | stop_before_delay(backoff.max_seconds),
            "wait": self._wait,
            "retry": retry_if_exception_type(_Retry),
            "reraise": True,
        }

    def _attempt_sync(self, call: _Call) -> Any | Failure:
        try:
            value = self._invoke_sync(call)
        except Exception as exc:
            return self._after_exception_sync(call, exc)
        return self._outcome_of(call, value) or _Value(value)

    def _after_exception_sync(self, call: _Call, exc: Exception) -> Failure:
        """Classify, verify an uncertain effect, and ask for a retry when it is transient."""
        failure = self._classify(call, exc)
        if failure.outcome is Outcome.UNKNOWN and call.spec and call.spec.postcondition \
                and self.mode == "enforce" and not self._out_of_time(call):
            running = _running(call)  # before the check: it may end while the check runs
            failure = self._verified(failure, self._run_postcondition_sync(call), call,
                                     running)
        if self._should_retry_failure(failure) and not self._out_of_time(call):
            raise _Retry(failure) from exc
        return failure

    async def _attempt_async(self, call: _Call) -> Any | Failure:
        try:
            value = await self._invoke_async(call)
        except Exception as exc:
            failure = self._classify(call, exc)
            if failure.outcome is Outcome.UNKNOWN and call.spec and call.spec.postcondition \
                    and self.mode == "enforce" and not self._out_of_time(call):
                running = _running(call)
                failure = self._verified(failure, await self._run_postcondition_async(call),
                                         call, running)
            if self._should_retry_failure(failure) and not self._out_of_time(call):
                raise _Retry(failure) from exc
            return failure
        return self._outcome_of(call, value) or _Value(value)

    def _dispatch_sync(self, call: _Call) -> _Value | Failure:
        try:
            first: _Value | Failure = self._attempt_sync(call)
        except _Retry as retry:
            return self._retry_loop_sync(call, retry)
        return first

    def _retry_loop_sync(self, call: _Call, retry: _Retry) -> _Value | Failure:
        """Further attempts of a transient failure, waiting with tenacity between them."""
        try:
            sleep = self._clamped_sleep(call)
            for attempt in Retrying(sleep=sleep, **self._retrying_kwargs()):
                with attempt:
                    if attempt.retry_state.attempt_number == 1:
                        sleep(self._wait_first(retry.failure))
                    done: _Value | Failure = self._attempt_sync(call)
                    return done
        except _Retry as exhausted:
            return exhausted.failure
        return retry.failure

    async def _dispatch_async(self, call: _Call) -> _Value | Failure:
        try:
            first = await self._attempt_async(call)
        except _Retry as retry:
            try:
                sleep = self._async_clamped_sleep(call)
                async for attempt in AsyncRetrying(sleep=sleep, **self._retrying_kwargs()):
                    with attempt:
                        if attempt.retry_state.attempt_number == 1:
                            await sleep(self._wait_first(retry.failure))
                        return await self._attempt_async(call)
            except _Retry as exhausted:
                return exhausted.failure
            return retry.failure
        return first

    def _clamped_sleep(self, call: _Call) -> Callable[[float], None]:
        """The guard's sleep, never past the call's deadline (the next attempt then times
        out at once and the failure is answered)."""
        base = self._sleep
        if self.deadline is None:
            return base

        def sleep(seconds: float) -> None:
            left = self._left(call) or 0.0
            base(max(0.0, min(seconds, left)))

        return sleep

    def _async_clamped_sleep(self, call: _Call) -> Callable[[float], Awaitable[None]]:
        base = _async_sleep(self._sleep)
        if self.deadline is None:
            return base

        async def sleep(seconds: float) -> None:
            left = self._left(call) or 0.0
            await base(max(0.0, min(seconds, left)))

        return sleep

    def _wait_first(self, failure: Failure) -> float:
        backoff = self.limits.backoff
        delay = backoff.initial + (random.uniform(0, backoff.jitter) if backoff.jitter else 0.0)
        return max(min(delay, backoff.maximum), failure.retry_after or 0.0)

    # -- finishing ------------------------------------------------------------------------
    def _finish(self, call: _Call, done: _Value | Failure) -> ToolResult:
        spec = call.spec
        assert spec is not None and call.key is not None
        if isinstance(done, _Value):
            adm = call.admission
            if adm is not None and adm.failures:
                self._safe_store(self._store.clear_failures, call.key)
            text, data = self._success_text(done.value)
            if call.entry is not None:
                call.entry = replace(call.entry, effect=Outcome.APPLIED, told="ok",
                                     told_effect=Outcome.APPLIED, confirmed_by="return",
                                     attempts=call.attempts, told_text=_told(text))
                self._put_ledger(call.entry)
            limits = self.limits
            if self.mode == "enforce" and (limits.no_progress_cycle is not None
                                           or limits.success_lifts_blocks):
                cycle = self._note_success(spec, call.args, text)
                if cycle:
                    return self._no_progress(call, cycle)
            return ToolResult(spec.name, True, text, data, call.attempts, call.call_id, None,
                              call.fp or self._lazy_fingerprint(call))
        failure = done
        count = failure.outcome is not Outcome.APPLIED
        if not count:
            self._safe_store(self._store.clear_failures, call.key)
        result = self._fail(call, failure, count=count)
        if call.entry is not None:
            effect = failure.outcome
            confirmed = "postcondition" if "confirmed" in failure.values else None
            if effect is Outcome.NO_EFFECT and confirmed is None and failure.failure_class in (
                FailureClass.INTERNAL,
            ):
                effect = Outcome.UNKNOWN
            call.entry = replace(call.entry, effect=effect, told=result.code,
                                 told_effect=result.outcome, confirmed_by=confirmed,
                                 attempts=call.attempts, told_text=_told(result.text))
            self._put_ledger(call.entry)
        return result

    def _success_text(self, value: Any) -> tuple[str, Any]:
        """The model's text for a return value, and the value itself unless it held a secret."""
        if isinstance(value, str):
            text = value
        elif value is None:
            return "null", None
        else:
            try:
                text = _encode_text(value)
            except (TypeError, ValueError, RecursionError):
                try:
                    text = json.dumps(value, ensure_ascii=False, default=_json_default)
                except (TypeError, ValueError):
                    text = str(value)
        clean = self.redactor.secrets(text)
        if clean == text:
            return text, value
        if isinstance(value, str):
            return clean, clean
        try:
            return clean, json.loads(clean)
        except ValueError:
            return clean, clean

    def _safe_store(self, op: Callable[..., Any], *args: Any) -> Any:
        try:
            return op(*args)
        except StateUnavailableError:
            return None

    def _moves(self, call: _Call, failure: Failure, alternatives: Sequence[Alternative]
               ) -> list[str]:
        param = failure.param or self._param_in(call, failure.reason)
        if failure.failure_class is FailureClass.TRANSIENT:
            first = f"call {call.name} later"
        else:
            first = f"call {call.name} with a different {param}" if param else \
                f"call {call.name} with different arguments"
        return [first, *(a.phrase() for a in alternatives)]

    @staticmethod
    def _param_in(call: _Call, reason: str) -> str | None:
        """The argument a reason is about: named in it, or the only one there is."""
        params = list(call.spec.params) if call.spec is not None else []
        arg_keys: list[str] = []
        if isinstance(call.args, dict):
            arg_keys = [k for k in itertools.islice(call.args, 64) if isinstance(k, str) and k]
        keys = params + [k for k in arg_keys if k not in params]
        words = {w.rstrip(".") for w in _WORDS.findall(reason)}
        for key in keys:
            if key in words:
                return key
        lowered = " ".join(reason.lower().split())
        for key in keys:
            phrase = key.lower().replace("_", " ")
            if " " in phrase and phrase in lowered:
                return key
            if phrase in {w.lower() for w in words}:
                return key
        if isinstance(call.args, dict) and len(call.args) == 1 and keys:
            return keys[0]
        return None

    def _alternatives(self, call: _Call, failure: Failure) -> list[Alternative]:
        seen: dict[str, Alternative] = {}
        for alt in (*(Alternative(a) for a in failure.alternatives),
                    *(call.spec.alternatives if call.spec else ()),
                    *((Alternative(failure.entry.alternative),) if failure.entry.alternative
                      else ())):
            if alt.name not in seen and alt.name != call.name:
                seen[alt.name] = alt
        return list(seen.values())

    def _fail(self, call: _Call, failure: Failure, *, count: bool = True) -> ToolResult:
        """Shape a failure; count it for the fingerprint; return terminal at the cap."""
        spec = call.spec
        args_text = echo_args(self.redactor.value(call.args))
        alternatives = self._alternatives(call, failure)
        limit = self.limits.limit_for(failure.failure_class,
                                      failure.entry.retry_limit or (spec.retry_limit
                                                                    if spec else None))
        failures = 0
        if count and call.key is not None and call.spec is not None and not call.fp:
            self._ensure_fp(call)
        if count and call.key is not None:
            try:
                failures = self._store.record_failure(call.key, self._pack(call, failure),
                                                      limit)
            except StateUnavailableError:
                failures = 0
            if failures >= limit and self.mode != "enforce":
                call.shadow["would_be_terminal"] = True
        if count and self.mode == "enforce":
            halted = self._note_failure(call, failure, terminal=failures >= limit)
            if halted is not None:
                return halted
        if count and failures >= limit and self.mode == "enforce":
            self._incident(IncidentKind.RETRY_CAP, call.name, failure.code,
                           f"{failures} identical failing calls (limit {limit})")
            rendered = render_terminal(tool=call.name, code=failure.code, count=failures,
                                       moves=self._moves(call, failure, alternatives),
                                       args_text=args_text,
                                       blocked_for=self.limits.block_seconds)
            return self._error_result(call, failure, rendered.text, rendered.problem,
                                      terminal=True)
        text, problem = self._four_part(call, failure, args_text, alternatives)
        return self._error_result(call, failure, text, problem, terminal=False)

    def _four_part(self, call: _Call, failure: Failure, args_text: str,
                   alternatives: Sequence[Alternative]) -> tuple[str, dict[str, Any]]:
        entry = failure.entry
        hidden = self.redactor.hidden_values(call.args)
        allow = [a for a in _strings_in(call.args) if a not in hidden]
        values: dict[str, object] = {
            "tool": call.name,
            "code": failure.code,
            "param": failure.param or self._param_in(call, failure.reason),
            "expected": failure.expected,
            "alternative": alternatives[0].name if alternatives else None,
            "retry_after": format_seconds(failure.retry_after) if failure.retry_after else None,
            "check_with": (call.spec.check_with if call.spec else None),
            "nearest": failure.values.get("nearest"),
        }
        values["reason"] = failure.reason
        reason = _without(self.redactor.prose(fill(entry.reason, values), allow=allow), hidden)
        if not reason.strip(" ."):
            reason = entry.summary or f"{call.name} failed"
        if failure.next_action:
            next_action = failure.next_action
        else:
            next_action = fill(entry.next_action, values)
        next_action = _without(self.redactor.prose(next_action.rstrip(". "), allow=allow),
                               hidden)
        if not next_action.strip(" .\u2026"):  # a blank next action from the tool: the row's
            next_action = fill(entry.next_action, values).rstrip(". ") or \
                "stop and report this failure to the user"
        mentioned = [a for a in alternatives if a.name in next_action]
        extra = [a for a in alternatives if a not in mentioned]
        if extra and failure.outcome is not Outcome.APPLIED:
            moves = ", or ".join(a.phrase() for a in extra[:2])
            if next_action.startswith("stop"):  # the alternative first, stopping last
                next_action = f"{moves}, or {next_action}"
            else:
                next_action = f"{next_action}, or {moves}"
        retryable = failure.retryable and failure.outcome is Outcome.NO_EFFECT
        def render(reason: str, args_text: str) -> tuple[str, dict[str, Any]]:
            rendered = render_error(
                tool=call.name, code=failure.code, reason=reason, args_text=args_text,
                outcome=failure.outcome, retryable=retryable, retry_after=failure.retry_after,
                next_action=next_action, title=entry.summary,
                failure_class=failure.failure_class.value,
            )
            return rendered.text, rendered.problem

        text, problem = render(reason, args_text)
        budget = self.catalog.token_budget
        if self.count_tokens(text) > budget:
            # Over budget: keep the first problem only, then echo less of the arguments.
            first = failure.values.get("first_reason")
            if isinstance(first, str):
                reason = _without(self.redactor.prose(first, allow=allow), hidden)
                text, problem = render(reason, args_text)
            if self.count_tokens(text) > budget:
                short = echo_args(self.redactor.value(call.args), max_chars=160)
                text, problem = render(reason, short)
        return text, problem

    def _error_result(self, call: _Call, failure: Failure, text: str,
                      problem: dict[str, Any], *, terminal: bool, blocked: bool = False,
                      halt: bool = False) -> ToolResult:
        if self.mode == "observe":
            call.shadow["would_say"] = text
            text = self.redactor.secrets(_unshaped_text(call.name, failure))
        info = FailureInfo(
            code=failure.code, outcome=failure.outcome, terminal=terminal, blocked=blocked,
            halt=halt, retryable=failure.retryable and not terminal,
            failure_class=failure.failure_class,
            error=failure.error or ToolError(
                failure.code, failure.reason, outcome=failure.outcome,
                failure_class=failure.failure_class, retryable=failure.retryable,
            ),
            cause=failure.cause,
        )
        return ToolResult(call.name, False, text, problem, call.attempts, call.call_id, info,
                          call.fp)

    def _fail_unscoped(self, call: _Call, code: str, reason: str) -> ToolResult:
        """A failure before the call could be fingerprinted (bad JSON, absurd arguments)."""
        raw = call.args if isinstance(call.args, (dict, list)) else str(call.args)
        call.args = raw
        if call.spec is None:
            call.spec = self._tools.get(call.name)
        try:
            basis = raw if isinstance(raw, str) else json.dumps(raw, sort_keys=True, default=repr)
        except (TypeError, ValueError, RecursionError):
            basis = echo_args(raw)  # bounded depth: safe for cyclic or absurdly deep values
        call.fp = hashlib.sha256(f"__invalid__\x00{call.name}\x00{basis}".encode(
            "utf-8", "surrogatepass")).hexdigest()
        call.key = CallKey(self.task_id, self._turn, call.fp)
        return self._fail(call, from_entry(self.catalog.get(code), reason))

    def _unknown_tool(self, call: _Call) -> ToolResult:
        names = sorted(self._tools)
        nearest = difflib.get_close_matches(call.name, names, n=3, cutoff=0.4) or names[:5]
        failure = from_entry(
            self.catalog.get("unknown_tool"),
            f"there is no tool named {call.name!r}",
        )
        failure.values["nearest"] = ", ".join(nearest) if nearest else "none are registered"
        try:
            call.fp = fingerprint("__unknown__", {"tool": call.name, "args": call.args})
        except (ValueError, TypeError, RecursionError):
            call.fp = fingerprint("__unknown__", {"tool": call.name})
        call.key = CallKey(self.task_id, self._turn, call.fp)
        return self._fail(call, failure)

    def _pack(self, call: _Call, failure: Failure) -> str:
        param = failure.param or self._param_in(call, failure.reason)
        return f"{failure.code}:{self.redactor.secrets(param)[:200]}" if param else failure.code

    def _blocked(self, call: _Call, adm: Admission) -> ToolResult:
        key = call.key
        assert key is not None
        now = self._clock()
        progress = self._progress
        with progress.lock:
            state = progress.state(self.task_id, self._turn)
            refused = state.refused.get(key, 0) + 1
            state.refused[key] = refused
            since = state.capped.setdefault(key, now)  # capped by another process: from now
            state.failed.setdefault(key, call.name)
        halt_after = self.limits.halt_after_terminal
        if halt_after is not None and refused >= halt_after:
            told = "it would not change anything" if adm.last_code == "no_progress" else \
                "retrying it was not allowed"
            return self._halt(call, f"{call.name} was called again after being told {told}")
        window = self.limits.block_seconds
        blocked_for = None if window is None else float(max(1, math.ceil(window - (now - since))))
        code, _, param = (adm.last_code or "tool_error").partition(":")
        entry = self.catalog.get(code)
        failure = from_entry(entry, "identical call blocked")
        args_text = echo_args(self.redactor.value(call.args))
        alternatives = self._alternatives(call, failure)
        failure.param = param or None
        rendered = render_terminal(tool=call.name, code=entry.code, count=adm.failures,
                                   moves=self._moves(call, failure, alternatives),
                                   args_text=args_text, blocked_for=blocked_for)
        return self._error_result(call, failure, rendered.text,
                                  {**rendered.problem, "blocked": True}, terminal=True,
                                  blocked=True)

    # -- the ladder after the cap: halts, per-tool ceilings, no progress ---------------------
    def _halt(self, call: _Call, clause: str, *, outcome: Outcome = Outcome.NO_EFFECT,
              blocked: bool = True) -> ToolResult:
        """End the turn: an incident, the halt message, and every later call refused."""
        scope = (self.task_id, self._turn)
        progress = self._progress
        now = self._clock()
        with progress.lock:
            state = progress.state(*scope)
            first = state.halted is None
            if first:
                state.halted, state.halted_at = clause, now
                progress.halted.add(scope)
            else:
                clause = state.halted or clause
            since = state.halted_at
        window = self.limits.block_seconds
        left = None if window is None else float(max(1, math.ceil(window - (now - since))))
        over = "this turn is over" if left is None else \
            f"calls are refused for the next {format_seconds(left)}"
        if first:
            self._incident(IncidentKind.HALT, call.name, "halted", clause)
            reason = f"{clause}, so {over}"
        else:
            reason = f"{over} because {clause}"
        failure = from_entry(self.catalog.get("halted"), reason, outcome=outcome)
        text, problem = self._four_part(call, failure, echo_args(self.redactor.value(
            call.args if isinstance(call.args, (dict, list, str)) else repr(call.args))), [])
        problem["terminal"] = True
        problem["halt"] = True
        if left is not None:
            problem["retry_after"] = left
        return self._error_result(call, failure, text, problem, terminal=True,
                                  blocked=blocked, halt=True)

    def _still_halted(self, call: _Call, spec: ToolSpec | None, args: Any) -> ToolResult | None:
        """The halt message while the turn is halted (lifted after ``block_seconds``)."""
        scope = (self.task_id, self._turn)
        progress = self._progress
        if scope not in progress.halted:
            return None
        window = self.limits.block_seconds
        with progress.lock:
            state = progress.get(*scope)
            expired = state is None or (window is not None
                                        and self._clock() - state.halted_at >= window)
            keys: list[CallKey] = []
            if expired:
                progress.halted.discard(scope)
                if state is not None:
                    keys = state.reset()
        if expired:
            for key in keys:
                self._safe_store(self._store.clear_failures, key)
            return None
        call.spec = spec
        call.args = args if args is not _NOT_JSON else (
            call.args if isinstance(call.args, str) else repr(call.args))
        call.shadow.pop("json_reason", None)
        return self._halt(call, "")

    def _lift_expired(self, key: CallKey) -> None:
        """Lift a block older than ``Limits.block_seconds`` (the store forgets the count)."""
        window = self.limits.block_seconds
        progress = self._progress
        with progress.lock:
            state = progress.get(key.task, key.turn)
            since = state.capped.get(key) if state is not None else None
            if state is None or since is None or window is None \
                    or self._clock() - since < window:
                return
            del state.capped[key]
            state.refused.pop(key, None)
            state.failed.pop(key, None)
        self._safe_store(self._store.clear_failures, key)

    def _note_failure(self, call: _Call, failure: Failure, *, terminal: bool
                      ) -> ToolResult | None:
        """Count a genuine failure per tool (each attempt); the halt at the tool's ceiling."""
        key = call.key
        progress = self._progress
        with progress.lock:
            state = progress.state(self.task_id, self._turn)
            # Every failed run of the body counts, retries inside the wrapper included: a
            # transient tool that failed 3 attempts twice has failed 6 times.
            failures = state.tool_failures.get(call.name, 0) + max(1, call.attempts)
            state.tool_failures[call.name] = failures
            history = state.history
            history.append(_BREAK)
            keep = (self.limits.no_progress_cycle or 1) * self.limits.no_progress_repeats
            if len(history) > keep:
                del history[:-keep]
            if key is not None:
                state.failed[key] = call.name
                if terminal:
                    state.capped.setdefault(key, self._clock())
        ceiling = self.limits.max_tool_failures_per_turn
        if ceiling is not None and failures >= ceiling and failure.code != "invalid_call":
            return self._halt(call, f"{call.name} failed {failures} times in this turn "
                                    f"(last: {failure.code})", outcome=failure.outcome,
                              blocked=False)
        return None

    def _note_success(self, spec: ToolSpec, args: Any, text: str) -> int:
        """Record a success; the length of the no-progress cycle it completes, else 0.

        Also lifts the blocks of other tools when ``Limits.success_lifts_blocks`` is set.
        On the hot path: one cached turn state, one append, one or three comparisons.
        """
        limits = self.limits
        longest = limits.no_progress_cycle
        progress = self._progress
        state = self._cached_state
        if state is None or not state.live or self._cached_for is not self.task_id \
                or self._cached_turn != self._turn:
            with progress.lock:
                state = progress.state(self.task_id, self._turn)
            self._cached_state, self._cached_for, self._cached_turn = \
                state, self.task_id, self._turn
        cycle = 0
        if limits.success_lifts_blocks and state.failed:
            with progress.lock:
                lifted = self._lift_others(state, spec.name)
            for key in lifted:
                self._safe_store(self._store.clear_failures, key)
        if longest is not None:
            # No lock: appends are atomic, and a race between two threads of one turn can
            # at worst miss a repeat, never invent one (entries must be equal).
            history = state.history
            if spec.side_effect or spec.name in limits.progress_exempt:
                history.append(_BREAK)
            else:
                # The result's hash first: a different result fails a comparison at once.
                history.append((hash(text), spec.name, args))
                cycle = repeats(history, longest, limits.no_progress_repeats)
            if len(history) > longest * limits.no_progress_repeats:
                del history[0]
        return cycle

    @staticmethod
    def _lift_others(state: TurnState, tool: str) -> list[CallKey]:
        """Forget the blocks of tools other than ``tool``; the keys to clear in the store."""
        lifted = []
        for key, name in list(state.failed.items()):
            if name != tool:
                del state.failed[key]
                state.capped.pop(key, None)
                state.refused.pop(key, None)
                lifted.append(key)
        return lifted

    def _no_progress(self, call: _Call, cycle: int) -> ToolResult:
        """The ``no_progress`` message (the call is blocked from now on), or the halt."""
        if not call.fp:
            self._ensure_fp(call)
        key = CallKey(self.task_id, self._turn, call.fp)
        call.key = key
        progress = self._progress
        with progress.lock:
            state = progress.state(self.task_id, self._turn)
            state.no_progress += 1
            told = state.no_progress
        if cycle == 1:
            reason = (f"{call.name} returned the same result as the identical call before it; "
                      "calling it again will not change anything")
        else:
            reason = (f"the last {cycle} calls repeat the {cycle} before them with identical "
                      "results; repeating them again will not change anything")
        halt_after = self.limits.halt_after_no_progress
        if halt_after is not None and told > halt_after:
            return self._halt(call, "the calls keep returning the same results",
                              blocked=False)
        self._incident(IncidentKind.NO_PROGRESS, call.name, "no_progress", reason)
        failure = from_entry(self.catalog.get("no_progress"), reason)
        self._safe_store(self._store.record_failure, key, "no_progress", 1)
        with progress.lock:
            state.failed[key] = call.name
            state.capped.setdefault(key, self._clock())
        text, problem = self._four_part(call, failure, echo_args(self.redactor.value(call.args)),
                                        self._alternatives(call, failure))
        problem["terminal"] = True
        return self._error_result(call, failure, text, problem, terminal=True)

    def _crash(self, call: _Call, exc: BaseException) -> ToolResult:
        try:
            return self._crash_result(call, exc)
        except Exception:  # noqa: BLE001 - the last line of defence must not raise
            name = _display_name(self.redactor.secrets(call.name))
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
        failure = from_entry(self.catalog.get("internal_error"),
                             f"{call.name} hit an internal error and did not complete",
                             cause=exc)
        if call.spec is not None and call.spec.side_effect and call.dispatched:
            failure.outcome = Outcome.UNKNOWN
        text, problem = self._four_part(call, failure, echo_args(self.redactor.value(
            call.args if isinstance(call.args, (dict, list, str)) else repr(call.args))), [])
        return self._error_result(call, failure, text, problem, terminal=False)

    def _safe_emit(self, call: _Call, result: ToolResult) -> ToolResult:
        try:
            return self._emit(call, result)
        except Exception:  # noqa: BLE001 - tracing must not turn a result into a raise
            try:
                return self._seal(result)
            except Exception:  # noqa: BLE001
                return result

    def _seal(self, result: ToolResult) -> ToolResult:
        """The single exit of a shaped failure: one redaction pass over the name, the text and
        the data (every form of every secret), and the message cut to the token budget."""
        if result.ok:
            return result  # a success's text and data were redacted as one in _success_text
        redactor = self.redactor
        text, data = redactor.secrets(result.text), redactor.value(result.data)
        if not isinstance(data, dict):
            data = {"detail": data}
        if self._cut_to_budget and self.mode != "observe":  # observe passes raw text on
            text, data = fit_to_budget(text, data, self.catalog.token_budget, self.count_tokens)
        tool = redactor.secrets(result.tool)
        if text == result.text and tool == result.tool and data == result.data:
            return result
        return replace(result, tool=tool, text=text, data=data)

    def _emit(self, call: _Call, result: ToolResult) -> ToolResult:
        result = self._seal(result)
        if not self._observers and not _trace.tracing_active():
            return result
        event = _trace.CallEvent(
            tool=result.tool, call_id=result.call_id, task=self.task_id, turn=self._turn,
            fingerprint=lambda: result.fingerprint, ok=result.ok, code=result.code,
            outcome=result.outcome, terminal=result.terminal, blocked=result.blocked,
            attempts=result.attempts, dispatched=call.dispatched,
            error_tokens=0 if result.ok else self.count_tokens(result.text), mode=self.mode,
            args=(lambda: self.redactor.value(call.args)) if isinstance(call.args, dict)
            else None,
            side_effect=bool(call.spec and call.spec.side_effect),
            duration_s=time.monotonic() - call.started,
            shadow=self.redactor.value(dict(call.shadow)) if call.shadow else None,
            at=time.time(),
        )
        if _trace.tracing_active():
            content = self.redactor.secrets(json.dumps(event.args, default=str)) \
                if self.capture_content else None
            span = _trace.start_tool_span(result.tool, result.call_id, content=content)
            adm = call.admission
            budget = {"calls_in_turn": float(adm.calls_in_turn), "spend": adm.spend} \
                if adm is not None else None
            _trace.finish_tool_span(span, event, result=(self.redactor.secrets(result.text)
                                                         if self.capture_content else None),
                                    budget=budget)
        _trace.safe_notify(self._observers, event)
        return result


_POOL_SIZES = {"tools": 32, "async": 32, "checks": 8}


_MAX_TOLD_TEXT = 100_000


def _told(text: str) -> str | None:
    """The text kept in the ledger for a replay (none when too large to keep)."""
    return text if len(text) <= _MAX_TOLD_TEXT else None


def _running(call: _Call) -> bool:
    """Whether the call's timed-out attempt still runs."""
    return call.orphan is not None and not call.orphan.done()


def _in_thread(fn: Callable[..., Any], kwargs: dict[str, Any]) -> Any:
    """Run a tool in a worker thread; StopIteration cannot cross a future (it would hang
    an awaiting ``acall``), so it comes back as an ordinary error."""
    try:
        return fn(**kwargs)
    except (StopIteration, StopAsyncIteration) as exc:
        raise RuntimeError(f"the tool raised {type(exc).__name__}") from exc


def _name_call(call: _Call, name: Any, call_id: Any) -> None:
    """Set the call's name and id, inside the caller's ``try``: odd objects may raise."""
    call.name = name if type(name) is str else str(name)
    call.call_id = str(call_id) if call_id else _new_call_id()
    call.replayable = bool(call_id)


class _LazyFingerprint:
    """Computes a result's fingerprint only if someone asks (ToolResult resolves callables)."""

    __slots__ = ("args", "spec")

    def __init__(self, spec: ToolSpec, args: dict[str, Any]) -> None:
        self.spec, self.args = spec, args

    def __call__(self) -> str:
        return fingerprint(self.spec.name, self.args, self.spec.normalizers)


_SIMPLE = (int, bool, type(None))
_WORDS = re.compile(r"(?<![\w.])[\w.\-]+")
_NAME_JUNK = re.compile(r"[^A-Za-z0-9_.\-]+")


def _display_name(name: str) -> str:
    """An unknown tool's name, safe to echo: identifier characters only, bounded length."""
    cleaned = _NAME_JUNK.sub("_", name)[:64].strip("_")
    return cleaned or "unnamed_tool"

_encode_text = prebuilt_encoder(sort_keys=False, separators=(", ", ": "), allow_nan=True)


def _flat_simple(args: dict[str, Any]) -> bool:
    """Flat, short, NaN-free arguments: safe to admit before fingerprinting on a clean turn."""
    for value in args.values():
        kind = type(value)
        if kind is str:
            if len(value) > 10_000:
                return False
        elif kind not in _SIMPLE:
            return False
    return True


def _without(text: str, hidden: set[str]) -> str:
    """Replace values the model passed under secret-named arguments."""
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


class _Malformed(Exception):
    """A tool-call item that names no tool (answered with ``invalid_call``)."""

    def __init__(self, reason: str, name: str = "tool_call", call_id: str | None = None
                 ) -> None:
        super().__init__(reason)
        self.reason, self.name, self.call_id = reason, name, call_id


def _named(name: Any, call_id: Any) -> str:
    if isinstance(name, str) and name.strip():
        return name
    cid = str(call_id) if isinstance(call_id, (str, int)) else None
    if name is None:
        raise _Malformed("the tool call has no tool name", call_id=cid)
    raise _Malformed(f"the tool name must be a non-empty string, not {type(name).__name__}",
                     call_id=cid)


def _unpack_call(item: Any) -> tuple[str, Any, str | None]:
    """Accept ``(name, args)``, ``{"name", "arguments", "id"}`` and SDK tool-call objects.

    Anything else raises :class:`_Malformed`, which the batch answers with ``invalid_call``.
    """
    if isinstance(item, tuple):
        if len(item) not in (2, 3):
            raise _Malformed(f"a tool call tuple must be (name, arguments) or (name, arguments, "
                             f"id), not {len(item)} items")
        cid = item[2] if len(item) == 3 else None
        return _named(item[0], cid), item[1], (str(cid) if cid is not None else None)
    if isinstance(item, Mapping):
        fn = item.get("function")
        if isinstance(fn, Mapping):
            return _named(fn.get("name"), item.get("id")), fn.get("arguments"), item.get("id")
        args = item.get("arguments", item.get("args", item.get("input")))
        cid = item.get("call_id") or item.get("id")
        return _named(item.get("name"), cid), args, cid
    if item is None or isinstance(item, (str, bytes, int, float, list, set)):
        raise _Malformed(f"a tool call must be a (name, arguments) pair, a dict or a tool-call "
                         f"object, not {type(item).__name__}")
    fn = getattr(item, "function", None)
    if fn is not None:
        cid = getattr(item, "id", None)
        return _named(getattr(fn, "name", None), cid), getattr(fn, "arguments", None), cid
    name = getattr(item, "name", None)
    args = getattr(item, "arguments", getattr(item, "input", getattr(item, "args", None)))
    cid = getattr(item, "call_id", None) or getattr(item, "id", None)
    return _named(name, cid), args, cid


def _async_sleep(sleep: Callable[[float], None]) -> Callable[[float], Awaitable[None]]:
    if sleep is time.sleep:
        return asyncio.sleep

    async def fake(seconds: float) -> None:
        sleep(seconds)

    return fake
