"""The two drivers: the only code that runs a tool body, a postcondition or a wait.

:func:`run_sync` and :func:`run_async` walk the same decision pipeline
(:class:`toolfault._pipeline.Pipeline`): ``admit``, a side-effect tool's ``precheck``
steps, the first dispatch, then ``returned`` or, after a raise, the ``raised`` steps.  They
perform each step the pipeline yields: a :class:`~toolfault._call.Dispatch` (the tool,
within its timeout and the call's deadline), a :class:`~toolfault._call.Verify` (the
postcondition, time-bounded) or a :class:`~toolfault._call.Sleep`.  Everything else, every
decision, is in the pipeline, once.
"""

from __future__ import annotations

import concurrent.futures
import contextvars
import inspect
import logging
import time
from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any, TypeVar

from toolfault._call import DISPATCH, VERIFY, Sleep, Step, _Call, _Raised, _run_coroutine, _Value
from toolfault._errors import Outcome
from toolfault._pipeline import Pipeline
from toolfault._result import ToolContext, ToolResult
from toolfault._settings import Scope, Settings
from toolfault._tool import ToolSpec, verdict_of
from toolfault._workers import Workers

log = logging.getLogger("toolfault")

_T = TypeVar("_T")
_monotonic = time.monotonic

@dataclass(frozen=True, slots=True)
class Runtime:
    """What the drivers use: the scope's pipeline and settings, the shared pools and sleep."""

    pipeline: Pipeline
    settings: Settings
    scope: Scope
    workers: Workers
    sleep: Callable[[float], None]


# -- the sync driver ---------------------------------------------------------------------
def run_sync(rt: Runtime, call: _Call) -> ToolResult:
    """Drive one call's pipeline on the caller's thread."""
    pipeline = rt.pipeline
    early = pipeline.admit(call)
    if early is not None:
        return early
    assert call.spec is not None
    if call.spec.side_effect:  # the effect channel first: claim the key, verify what is pending
        answered: ToolResult | None = _steps_sync(rt, call, pipeline.precheck(call))
        if answered is not None:
            return answered
    try:
        value = _invoke_sync(rt, call)
    except Exception as exc:  # the pipeline classifies it
        result: ToolResult = _steps_sync(rt, call, pipeline.raised(call, exc))
        return result
    return pipeline.returned(call, value)


def _steps_sync(rt: Runtime, call: _Call, steps: Generator[Step, Any, Any]) -> Any:
    """Perform the steps the pipeline yields until it returns; what it returns."""
    reply: Any = None
    try:
        while True:
            step = steps.send(reply)
            if step is DISPATCH:
                try:
                    reply = _Value(_invoke_sync(rt, call))
                except Exception as exc:  # the pipeline classifies it
                    reply = _Raised(exc)
            elif step is VERIFY:
                reply = _postcondition_sync(rt, call)
            else:
                assert isinstance(step, Sleep)
                if step.seconds > 0:
                    rt.sleep(step.seconds)
                reply = None
    except StopIteration as done:
        return done.value


def _invoke_sync(rt: Runtime, call: _Call) -> Any:
    """Run one attempt; nobody awaits a sync call, so a ``CancelledError`` is the tool's."""
    try:
        return _attempt_sync(rt, call)
    except BaseException as exc:
        if is_cancelled_error(exc):
            raise as_tool_error(exc) from exc
        raise


def _attempt_sync(rt: Runtime, call: _Call) -> Any:
    spec = call.spec
    assert spec is not None
    call.attempts += 1
    call.dispatched = True
    deadline = rt.settings.deadline
    if spec.direct and not rt.settings.isolate_sync_tools and (
            deadline is None or deadline > _monotonic() - call.started):
        value = spec.fn(**call.kwargs)  # on the caller's thread: see ``isolate_sync_tools``
    else:
        kwargs = call.kwargs if spec.context_param is None else with_context(rt, call)
        value = _invoke_bounded(rt, call, spec, kwargs)
    if hasattr(value, "__await__"):  # an async tool behind a plain decorator
        value = _run_coroutine(value, timeout=rt.pipeline.attempt_limit(call, spec.timeout))
    return value


def _invoke_bounded(rt: Runtime, call: _Call, spec: ToolSpec, kwargs: dict[str, Any]) -> Any:
    """A tool with a timeout, a deadline, or a coroutine body: within its time limit."""
    limit = rt.pipeline.attempt_limit(call, spec.timeout)
    if limit is not None and limit <= 0:
        raise TimeoutError(f"{spec.name} ran out of time")
    if spec.is_async:
        return _run_coroutine(spec.fn(**kwargs), timeout=limit)
    if limit is None or (spec.timeout is None and not rt.settings.isolate_sync_tools):
        return spec.fn(**kwargs)  # on the caller's thread: see ``isolate_sync_tools``
    return _bounded(rt, spec.fn, kwargs, limit, spec.name, call)


def _bounded(rt: Runtime, fn: Callable[..., Any], kwargs: dict[str, Any], limit: float,
             name: str, call: _Call) -> Any:
    """Run a sync tool in a worker thread for at most ``limit`` seconds.

    A tool still running then is abandoned in its thread (it may yet finish: the call keeps
    it as ``orphan`` so its idempotency key stays held); the caller gets a ``TimeoutError``.
    """
    context = contextvars.copy_context()
    future = rt.workers.pool("tools").submit(context.run, in_thread, fn, kwargs)
    try:
        return future.result(timeout=limit)
    except concurrent.futures.TimeoutError:
        if future.done():  # the tool's own TimeoutError, or an answer just in time
            return future.result()
        orphan_unless_cancelled(call, future)  # still running, it may yet land
        raise TimeoutError(f"{name} timed out after {limit:.3g}s") from None


def _postcondition_sync(rt: Runtime, call: _Call) -> Outcome | None:
    assert call.spec is not None and call.spec.postcondition is not None
    check, args = call.spec.postcondition, dict(call.kwargs or call.args)
    limit = check_limit(call.spec.timeout)
    try:
        future = rt.workers.pool("checks").submit(check_in_thread, check, args)
        value = future.result(timeout=limit)
        if inspect.isawaitable(value):
            value = _run_coroutine(value, timeout=limit)
        return verdict_of(value)
    except Exception as exc:  # a failing or hanging check: the effect stays unknown
        log.info("postcondition of %s failed: %r", call.name, exc)
        return None


def is_cancelled_error(exc: BaseException) -> bool:
    """Whether ``exc`` is asyncio's ``CancelledError``.  asyncio is imported here, not with
    the guard, so a sync agent never loads it (a tool that raised one already did)."""
    if isinstance(exc, Exception):  # a CancelledError is a BaseException only
        return False
    import asyncio

    return isinstance(exc, asyncio.CancelledError)


def as_tool_error(exc: BaseException) -> RuntimeError:
    """What a tool raised that must not travel as itself (``StopIteration`` across a future,
    its own ``CancelledError``), as an ordinary error the pipeline classifies."""
    return RuntimeError(f"the tool raised {type(exc).__name__}")


def orphan_unless_cancelled(call: _Call, future: concurrent.futures.Future[Any]) -> None:
    """A thread that already started cannot be cancelled: it becomes the call's orphan,
    and its idempotency key stays held until it ends."""
    if not future.cancel():
        call.orphan = future


# -- shared by both ----------------------------------------------------------------------
def with_context(rt: Runtime, call: _Call) -> dict[str, Any]:
    spec = call.spec
    assert spec is not None
    if spec.context_param is None:
        return call.kwargs
    context = ToolContext(call.name, call.call_id, rt.scope.task_id, rt.scope.turn, call.attempts,
                          call.idem)
    return {**call.kwargs, spec.context_param: context}


def check_limit(timeout: float | None) -> float:
    """How long a postcondition may take: the tool's own timeout, at least 1 s, default 10 s."""
    return max(1.0, timeout) if timeout is not None else 10.0


def in_thread(fn: Callable[..., Any], kwargs: dict[str, Any]) -> Any:
    """Run a tool in a worker thread; StopIteration cannot cross a future (it would hang
    an awaiting ``acall``) and a CancelledError raised there is the tool's own, so each
    comes back as an ordinary error."""
    try:
        return fn(**kwargs)
    except BaseException as exc:
        if isinstance(exc, (StopIteration, StopAsyncIteration)) or is_cancelled_error(exc):
            raise as_tool_error(exc) from exc
        raise


def check_in_thread(check: Callable[[dict[str, Any]], Any], args: dict[str, Any]) -> Any:
    try:
        return check(args)
    except (StopIteration, StopAsyncIteration) as exc:
        raise RuntimeError(f"the check raised {type(exc).__name__}") from exc
