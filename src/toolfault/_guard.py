"""The guard: the one object between an agent and its tools.

``Guard`` is a facade.  What a call goes through is one decision pipeline
(:mod:`toolfault._pipeline`: parse, fingerprint, admit, validate, precheck, dispatch,
classify, shape, record), driven by :func:`~toolfault._drivers.run_sync` for :meth:`Guard.call`
and :func:`~toolfault._async_driver.run_async` for :meth:`Guard.acall`.  The parts it composes --
words (:mod:`~toolfault._shaping`), budgets (:mod:`~toolfault._budget`), side effects
(:mod:`~toolfault._effects`), the ladder after the cap (:mod:`~toolfault._ladder`) and
emission (:mod:`~toolfault._emission`) -- are objects, not mixins.  It never raises into the
agent loop: whatever happens comes back as a :class:`ToolResult`.
"""

from __future__ import annotations

import inspect
import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import IO, Any, Literal, TypeVar, overload

from toolfault import _trace
from toolfault._batch import IN_ORDER, InOrder, batch_items, unpack_call, unusable_item
from toolfault._budget import Budgets
from toolfault._call import _Call, _new_call_id
from toolfault._catalog import Catalog
from toolfault._degrading import DegradingStore
from toolfault._drivers import Runtime, run_sync
from toolfault._effects import Effects
from toolfault._emission import Emitter
from toolfault._errors import ConfigurationError
from toolfault._failing import Failures
from toolfault._fingerprint import NormalizeSpec
from toolfault._ladder import Ladder
from toolfault._limits import Limits
from toolfault._pipeline import Pipeline
from toolfault._progress import Progress
from toolfault._records import Incident, IncidentKind, LedgerEntry
from toolfault._redact import LOG_FILTER, Redactor
from toolfault._result import ToolResult
from toolfault._returned import default_error_result
from toolfault._settings import Mode, Scope, Settings, Shared
from toolfault._shaping import Shaper
from toolfault._tokens import Tokenizer, resolve_tokenizer
from toolfault._tool import (
    Alternative,
    ErrorDetector,
    Postcondition,
    ToolSpec,
    build_spec,
)
from toolfault._workers import Workers
from toolfault.stores._memory import MemoryStore
from toolfault.stores._protocol import Store

log = logging.getLogger("toolfault")
log.addHandler(logging.NullHandler())
log.addFilter(LOG_FILTER)  # the single exit of the log channel: redacted, no traceback

#: Seconds a whole call may take by default, retries, waits and checks included.
DEFAULT_DEADLINE = 120.0

F = TypeVar("F", bound=Callable[..., Any])
_UNSET: Any = object()
#: How long past the deadline ``acall`` waits for the guard's own bookkeeping.
_DEADLINE_GRACE = 1.0


def _check_arguments(mode: str, idempotency_retention: float, deadline: float | None
                     ) -> None:
    """Refuse a guard misconfigured from the start, before anything is built."""
    if mode not in ("observe", "shape", "enforce"):
        raise ConfigurationError("mode must be 'observe', 'shape' or 'enforce'")
    if not idempotency_retention > 0:
        raise ConfigurationError("idempotency_retention must be a positive number of seconds")
    if deadline is not None and not deadline > 0:
        raise ConfigurationError("deadline must be a positive number of seconds or None")


def _merged_catalog(catalog: Catalog | str | Path | None) -> Catalog:
    """The default catalog with the one given (an object or a file) merged over it."""
    if isinstance(catalog, (str, Path)):
        catalog = Catalog.load(catalog)
    base = Catalog.default()
    return base.merged(catalog) if catalog is not None else base


class Guard:
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
        local_side_effects: bool | Iterable[str] = False,
        idempotency_retention: float = 86400.0,
        scan_env_secrets: bool = True,
        sleep: Callable[[float], None] | None = None,
        clock: Callable[[], float] | None = None,
        deadline: float | None = DEFAULT_DEADLINE,
        isolate_sync_tools: bool = False,
        log_tracebacks: bool = False,
        tokenizer: Tokenizer = "auto",
    ) -> None:
        _check_arguments(mode, idempotency_retention, deadline)
        if log_tracebacks:  # tracebacks are for engineers who ask; still redacted
            LOG_FILTER.tracebacks = True
        self._settings = Settings(
            limits=limits or Limits(),
            catalog=_merged_catalog(catalog),
            deadline=deadline, isolate_sync_tools=isolate_sync_tools,
            count_tokens=resolve_tokenizer(tokenizer), capture_content=capture_content,
            error_result=error_result, idempotency_retention=float(idempotency_retention))
        self._scope = Scope(task_id, mode)
        redactor = Redactor(secrets, scan_env=scan_env_secrets)
        sink = None if trace is None else _trace.JsonlSink(trace, redact=redactor.secrets,
                                                           redacted_calls=True)
        self._shared = Shared(
            tools={},
            store=DegradingStore(store or MemoryStore(), policy=state_failure,
                                 local_side_effects=local_side_effects,
                                 on_degrade=lambda exc: self._emitter.degraded(exc)),
            progress=Progress(),
            observers=[*observers, *((sink,) if sink is not None else ())],
            sink=sink, workers=Workers(), redactor=redactor, sleep=sleep or time.sleep,
            clock=clock or time.monotonic)
        self._compose()

    def _compose(self) -> None:
        """The parts that act for this scope, each given what it uses."""
        settings, scope, shared = self._settings, self._scope, self._shared
        store, redactor = shared.store, shared.redactor
        self._shaper = shaper = Shaper(settings, scope, shared.tools, redactor)
        self._emitter = emitter = Emitter(settings, scope, shaper, store, redactor,
                                          shared.observers, shared.sink)
        ladder = Ladder(settings, scope, shared.progress, store, shaper, emitter, shared.clock)
        self._failures = failures = Failures(settings, scope, shared.tools, store, shaper,
                                             ladder, emitter)
        budgets = Budgets(settings, scope, store, failures=failures, emitter=emitter)
        self._effects = Effects(settings, scope, store, redactor, budgets=budgets,
                                failures=failures, emitter=emitter)
        self._ladder = ladder
        self._pipeline = Pipeline(settings, scope, shared.tools, shared.progress, store,
                                  shaper=shaper, budgets=budgets, effects=self._effects,
                                  ladder=ladder, failures=failures)
        self._runtime = Runtime(self._pipeline, settings, scope, shared.workers, shared.sleep)

    # -- settings (fixed at construction) and the scope ------------------------------------
    @property
    def limits(self) -> Limits:
        """The rungs and caps every call is counted against."""
        return self._settings.limits

    @property
    def catalog(self) -> Catalog:
        """The error catalog: the default merged with the one given."""
        return self._settings.catalog

    @property
    def deadline(self) -> float | None:
        """No call takes longer than this: retries, backoff, postconditions, async tools,
        sync tools given ``timeout=`` and sync tools under :meth:`acall` are all bounded by
        it; a tool still running then is abandoned (in its worker thread) and the model is
        told it timed out (``Effect: unknown`` for side effects)."""
        return self._settings.deadline

    @property
    def isolate_sync_tools(self) -> bool:
        """A sync tool without ``timeout=`` runs on the caller's thread under :meth:`call`
        (its thread-locals, e.g. a ``sqlite3`` connection, keep working, and a success
        costs no thread hop), so only its own return can end it.  ``True`` runs every
        sync tool in a worker thread, so the deadline bounds even a body that never returns."""
        return self._settings.isolate_sync_tools

    @property
    def count_tokens(self) -> Callable[[str], int]:
        """Counts an error's tokens against the catalog budget (resolved here, not per call)."""
        return self._settings.count_tokens

    @property
    def capture_content(self) -> bool:
        """Whether spans carry the (redacted) arguments and result."""
        return self._settings.capture_content

    @property
    def error_result(self) -> ErrorDetector | None:
        """The default detector of errors a tool returns instead of raising."""
        return self._settings.error_result

    @property
    def idempotency_retention(self) -> float:
        """Seconds a success under an explicit idempotency key is replayed instead of run
        again (Stripe's 24 hours by default; the store's own TTL bounds it too)."""
        return self._settings.idempotency_retention

    @property
    def redactor(self) -> Redactor:
        """The redactor every message, trace line, span and log record passes through."""
        return self._shared.redactor

    @property
    def mode(self) -> Mode:
        """``enforce``, ``shape`` or ``observe``; settable, for this scope only."""
        return self._scope.mode

    @mode.setter
    def mode(self, mode: Mode) -> None:
        if mode not in ("observe", "shape", "enforce"):
            raise ConfigurationError("mode must be 'observe', 'shape' or 'enforce'")
        self._scope.mode = mode

    @property
    def task_id(self) -> str:
        """The task calls count under (see :meth:`new_task`)."""
        return self._scope.task_id

    @task_id.setter
    def task_id(self, task_id: str) -> None:
        self._scope.task_id = task_id

    @property
    def last_degraded_error(self) -> str | None:
        """The type name of the last error that made the store unreachable, if any."""
        return self._scope.last_degraded_error

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
            self.add_spec(spec)
            return func

        if fn is not None:
            return register(fn)
        return register

    def add_spec(self, spec: ToolSpec) -> None:
        """Register a built :class:`ToolSpec` (a changed copy of one, from
        ``dataclasses.replace``), replacing the tool of that name."""
        if not isinstance(spec, ToolSpec):
            raise ConfigurationError("add_spec takes a ToolSpec (see Guard.tool to build one)")
        self._shared.tools[spec.name] = spec

    def remove_tool(self, name: str) -> ToolSpec | None:
        """Unregister a tool (the spec it had, or ``None``): a later call to it is answered
        ``unknown_tool``, naming the tools there are.  What the guard counted for it (its
        failures, blocks, ledger) stays, so registering it again does not wipe the turn."""
        return self._shared.tools.pop(name, None)

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
        return dict(self._shared.tools)

    # -- turns, scopes, records ------------------------------------------------------------
    @property
    def turn(self) -> int:
        """The model turn calls count in (see :meth:`new_turn`)."""
        return self._scope.turn

    def new_turn(self) -> None:
        """Start a new model turn: per-turn counters reset; per-task budgets carry on."""
        scope = self._scope
        self._shared.progress.forget(scope.task_id, scope.turn)
        scope.turn += 1

    def new_task(self, task_id: str) -> None:
        """Switch to another task: budgets, ledger and incidents are scoped per task."""
        self._scope.task_id = task_id
        self._scope.turn = 0

    def scoped(self, task_id: str) -> Guard:
        """A guard sharing this one's tools, store, catalog, secrets, observers and worker
        pools, counting under its own task id and turn (one per MCP session or worker).

        Scopes share resources with their parent: close the parent, not a scope.
        """
        scope = Guard.__new__(Guard)
        scope._settings, scope._shared = self._settings, self._shared
        scope._scope = Scope(task_id, self._scope.mode)
        scope._compose()
        return scope

    @property
    def incidents(self) -> list[Incident]:
        """Incidents of the current task (cap hits, budget hits, degraded state, mismatches)."""
        return self._shared.store.incidents(self.task_id)

    def record_incident(self, kind: IncidentKind, tool: str, code: str, detail: str) -> None:
        """Record an incident of your own (what wraps the guard saw: a restarted server),
        redacted, in the store and the trace, beside the guard's own."""
        self._emitter.incident(kind, tool, code, detail)

    @property
    def ledger(self) -> list[LedgerEntry]:
        """Effect-ledger entries of the current task."""
        return self._shared.store.ledger(self.task_id)

    def ledger_for(self, task_id: str) -> list[LedgerEntry]:
        """Effect-ledger entries of any task sharing this guard's store."""
        return self._shared.store.ledger(task_id)

    @property
    def degraded(self) -> bool:
        """True while the store is unreachable and the guard counts locally."""
        return self._shared.store.degraded

    def add_secret(self, *values: str) -> None:
        """Register secret values that must never appear in any message or trace."""
        self._shared.redactor.add(*values)

    def add_observer(self, observer: Callable[[_trace.CallEvent], None]) -> None:
        """Subscribe to a :class:`CallEvent` after every call."""
        self._shared.observers.append(observer)

    def close(self) -> None:
        """Flush the trace and release the store and worker threads."""
        shared = self._shared
        if shared.sink is not None:
            shared.sink.close()
        shared.workers.shutdown()
        self._shared.store.close()

    # -- calls -------------------------------------------------------------------------------
    def call(self, name: str, args: Any = None, *, call_id: str | None = None) -> ToolResult:
        """Run one tool call (dict or raw JSON string arguments); never raises.

        Only ``KeyboardInterrupt`` and ``SystemExit`` propagate; anything else, whatever the
        tool raised or the guard tripped on, comes back as a shaped result.
        """
        call = _Call(None, "unnamed_tool", args, "", time.monotonic())
        try:
            try:
                _name_call(call, name, call_id)
                result = run_sync(self._runtime, call)
            except Exception as exc:  # the guard's own bug, or a BaseException of the tool
                result = self._shaper.crash(call, exc)
            return self._emitter.emit(call, result)
        except BaseException as exc:
            if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                raise
            return self._shaper.last_resort(name, args, call_id, exc)
        finally:
            self._release(call)

    async def acall(self, name: str, args: Any = None, *, call_id: str | None = None
                    ) -> ToolResult:
        """Async twin of :meth:`call`; sync tools run in a worker thread.

        Never raises but ``KeyboardInterrupt``, ``SystemExit`` and cancellation of the
        awaiting task (reservations are released on the way out); a ``CancelledError`` the
        tool raised itself is its failure, shaped as under :meth:`call`.  Past the guard's
        deadline the call is cancelled and answered as timed out.
        """
        import asyncio  # here, not at import: a sync agent never loads asyncio

        try:
            if self.deadline is None:
                return await self._acall(name, args, call_id)
            return await asyncio.wait_for(self._acall(name, args, call_id),
                                          self.deadline + _DEADLINE_GRACE)
        except BaseException as exc:
            if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                raise
            if isinstance(exc, asyncio.CancelledError):
                task = asyncio.current_task()
                if task is None or task.cancelling() > 0:
                    raise  # the awaiting task's cancellation
            return self._shaper.last_resort(name, args, call_id, exc)

    async def _acall(self, name: str, args: Any, call_id: str | None) -> ToolResult:
        from toolfault._async_driver import run_async  # with asyncio, at the first acall

        call = _Call(None, "unnamed_tool", args, "", time.monotonic())
        try:
            try:
                _name_call(call, name, call_id)
                result = await run_async(self._runtime, call)
            except Exception as exc:
                result = self._shaper.crash(call, exc)
            return self._emitter.emit(call, result)
        finally:
            self._release(call)

    def shape(self, name: str, args: Any, error: BaseException, *,
              call_id: str | None = None) -> ToolResult:
        """Shape an exception a framework caught outside the guard into the contract.

        Not counted against caps (the guard did not run the call), but traced and redacted
        like any other result.
        """
        call = _Call(self._shared.tools.get(name), str(name), args, call_id or _new_call_id(),
                     time.monotonic())
        try:
            return self._emitter.emit(call, self._pipeline.shaped(call, error))
        except Exception as exc:  # noqa: BLE001
            return self._emitter.emit(call, self._shaper.crash(call, exc))

    def run_tool_calls(self, calls: Iterable[Any]) -> list[ToolResult]:
        """Run a batch of calls from your own loop: ``(name, args)``, dicts or SDK objects.

        Never raises: an item that names no tool gets an ``invalid_call`` result in its place.
        """
        results = []
        for item in batch_items(calls):
            try:
                name, args, cid = unpack_call(item)
            except Exception as exc:  # noqa: BLE001 - a malformed item is answered, not raised
                results.append(self._invalid_call(item, exc))
                continue
            results.append(self.call(name, args, call_id=cid))
        return results

    async def arun_tool_calls(self, calls: Iterable[Any]) -> list[ToolResult]:
        """Run one turn's parallel calls concurrently, results in the order given.

        The bodies run at once; the ladder records their outcomes in the order given, so
        the batch gets the decisions the same calls would get one after another."""
        import asyncio

        async def one(item: Any, slot: InOrder) -> ToolResult:
            IN_ORDER.set(slot)
            try:
                try:
                    name, args, cid = unpack_call(item)
                except Exception as exc:  # noqa: BLE001
                    return self._invalid_call(item, exc)
                return await self.acall(name, args, call_id=cid)
            finally:
                slot.done.set()

        items = batch_items(calls)
        slots: list[InOrder] = []
        for _ in items:
            slots.append(InOrder(slots[-1] if slots else None))
        return list(await asyncio.gather(*(one(item, slot)
                                           for item, slot in zip(items, slots, strict=True))))

    def _invalid_call(self, item: Any, exc: BaseException) -> ToolResult:
        """``invalid_call`` for a batch item that could not be read as a tool call."""
        name, shown, cid, reason = unusable_item(item, exc)
        call = _Call(None, name, shown, cid or _new_call_id(), time.monotonic())
        try:
            return self._emitter.emit(call, self._failures.fail_unscoped(call, "invalid_call",
                                                                         reason))
        except Exception as crash:  # noqa: BLE001
            return self._emitter.emit(call, self._shaper.crash(call, crash))

    def _release(self, call: _Call) -> None:
        """Settle reservations and keys; a store error here must not become a raise."""
        if call.ticket is not None:
            self._ladder.finished(call)
        try:
            self._effects.release(call)
        except Exception:  # noqa: BLE001 - leases and key TTLs are the backstop
            pass


def _name_call(call: _Call, name: Any, call_id: Any) -> None:
    """Set the call's name and id, inside the caller's ``try``: odd objects may raise."""
    call.name = name if type(name) is str else str(name)
    call.call_id = str(call_id) if call_id else _new_call_id()
    call.replayable = bool(call_id)
