"""The async driver: :func:`run_async` walks the pipeline as :func:`~toolfault._drivers.run_sync`
does, with ``await`` (sync tools in a worker thread).  Its own module so that asyncio is
imported by the first :meth:`~toolfault.Guard.acall`, not by ``import toolfault``.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import logging
import time
from collections.abc import Awaitable, Callable, Generator
from typing import Any, TypeVar

from toolfault._batch import after_earlier, take_slot
from toolfault._call import DISPATCH, VERIFY, Sleep, Step, _Call, _Raised, _Value
from toolfault._drivers import (
    Runtime,
    as_tool_error,
    check_in_thread,
    check_limit,
    in_thread,
    orphan_unless_cancelled,
    with_context,
)
from toolfault._errors import Outcome
from toolfault._result import ToolResult
from toolfault._tool import ToolSpec, verdict_of

log = logging.getLogger("toolfault")

_T = TypeVar("_T")


async def run_async(rt: Runtime, call: _Call) -> ToolResult:
    """Drive one call's pipeline in the running event loop; sync tools run in a thread."""
    pipeline = rt.pipeline
    slot = take_slot()
    early = pipeline.admit(call)
    if early is not None:
        return early
    assert call.spec is not None
    if call.spec.side_effect:  # the effect channel first: claim the key, verify what is pending
        answered: ToolResult | None = await _steps_async(rt, call, pipeline.precheck(call))
        if answered is not None:
            return answered
    try:
        value = await _invoke_async(rt, call)
    except Exception as exc:  # the pipeline classifies it
        await after_earlier(slot)
        result: ToolResult = await _steps_async(rt, call, pipeline.raised(call, exc))
        return result
    await after_earlier(slot)
    return pipeline.returned(call, value)


async def _steps_async(rt: Runtime, call: _Call, steps: Generator[Step, Any, Any]) -> Any:
    """Perform the steps the pipeline yields until it returns; what it returns."""
    reply: Any = None
    try:
        while True:
            step = steps.send(reply)
            if step is DISPATCH:
                try:
                    reply = _Value(await _invoke_async(rt, call))
                except Exception as exc:
                    reply = _Raised(exc)
            elif step is VERIFY:
                reply = await _postcondition_async(rt, call)
            else:
                assert isinstance(step, Sleep)
                if step.seconds > 0:
                    await _async_sleep(rt.sleep)(step.seconds)
                reply = None
    except StopIteration as done:
        return done.value


async def _invoke_async(rt: Runtime, call: _Call) -> Any:
    """Run one attempt; a ``CancelledError`` the tool raised itself (nobody cancelled the
    awaiting task) is the tool's failure, shaped like any other, as under :meth:`Guard.call`.
    """
    task = asyncio.current_task()
    before = task.cancelling() if task is not None else 0
    try:
        return await _attempt_async(rt, call)
    except asyncio.CancelledError as exc:
        if task is None or task.cancelling() > before:
            raise  # the caller's cancellation: it propagates
        raise as_tool_error(exc) from exc


async def _attempt_async(rt: Runtime, call: _Call) -> Any:
    """One attempt within the call's time left: an async tool awaited here, a sync one in a
    worker thread (and an awaitable it returns awaited after it)."""
    spec = call.spec
    assert spec is not None
    call.attempts += 1
    call.dispatched = True
    kwargs = with_context(rt, call)
    limit = rt.pipeline.attempt_limit(call, spec.timeout)
    if limit is not None and limit <= 0:
        raise TimeoutError(f"{spec.name} ran out of time")
    if spec.is_async:
        return await _await_tool(spec, kwargs, limit)
    value = await _await_thread(rt, call, kwargs, limit)
    if hasattr(value, "__await__"):
        value = await _wait_for(value, rt.pipeline.attempt_limit(call, spec.timeout))
    return value


async def _await_tool(spec: ToolSpec, kwargs: dict[str, Any], limit: float | None) -> Any:
    """An async tool's body, awaited on the caller's task within ``limit``."""
    try:
        if limit is None:
            return await spec.fn(**kwargs)
        return await _wait_for(spec.fn(**kwargs), limit)
    except TimeoutError:
        raise TimeoutError(f"{spec.name} timed out after {limit}s") from None


async def _await_thread(rt: Runtime, call: _Call, kwargs: dict[str, Any],
                        limit: float | None) -> Any:
    """A sync tool's body in a worker thread, awaited within ``limit``; a thread that
    cannot be stopped is left to run as the call's orphan."""
    spec = call.spec
    assert spec is not None
    context = contextvars.copy_context()
    future = rt.workers.pool("tools" if spec.timeout is not None else "async").submit(
        context.run, in_thread, spec.fn, kwargs)
    try:
        return await _wait_for(asyncio.shield(asyncio.wrap_future(future)), limit)
    except TimeoutError:
        if future.done():  # the tool's own TimeoutError
            raise
        orphan_unless_cancelled(call, future)
        raise TimeoutError(f"{spec.name} timed out after {limit}s") from None
    except asyncio.CancelledError:
        # The caller gave up, the thread did not: the key stays held until it ends.
        orphan_unless_cancelled(call, future)
        raise


async def _postcondition_async(rt: Runtime, call: _Call) -> Outcome | None:
    assert call.spec is not None and call.spec.postcondition is not None
    check, args = call.spec.postcondition, dict(call.kwargs or call.args)
    limit = check_limit(call.spec.timeout)
    try:
        if inspect.iscoroutinefunction(inspect.unwrap(check)):
            value = await _wait_for(check(args), limit)
        else:
            value = await _wait_for(asyncio.wrap_future(
                rt.workers.pool("checks").submit(check_in_thread, check, args)), limit)
        if inspect.isawaitable(value):
            value = await _wait_for(value, limit)
        return verdict_of(value)
    except Exception as exc:
        log.info("postcondition of %s failed: %r", call.name, exc)
        return None


async def _wait_for(awaitable: Awaitable[_T], limit: float | None) -> _T:
    """``asyncio.wait_for`` that never drops a cancellation of the awaiting task.

    On Python 3.11 ``wait_for`` returns the inner result when a cancellation arrives with
    it: the call would go on and record "told ok" for an answer its caller never gets (a
    retry would then run the side effect again, as a new action).
    """
    task = asyncio.current_task()
    before = task.cancelling() if task is not None else 0
    value = await asyncio.wait_for(awaitable, limit)
    if task is not None and task.cancelling() > before:
        raise asyncio.CancelledError
    return value


def _async_sleep(sleep: Callable[[float], None]) -> Callable[[float], Awaitable[None]]:
    """The guard's sleep in async code: ``asyncio.sleep`` unless a fake one was injected."""
    if sleep is time.sleep:
        return asyncio.sleep

    async def fake(seconds: float) -> None:
        sleep(seconds)

    return fake
