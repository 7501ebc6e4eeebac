"""Side effects: a cancelled ``acall`` whose tool answered at that very moment.

The race suite's "cancel-retry-check" setting once ran the effect three times in a trial:
the caller cancelled ``acall`` just as the sync tool's answer arrived.  Python 3.11's
``asyncio.wait_for`` then returns the answer and drops the cancellation, so the call went
on, recorded "told ok" in the ledger, and the answer was thrown away (the guard's deadline
``wait_for``) or reached a caller that had cancelled.  A retry read "told ok" as a confirmed
success, a new action, and ran the effect again.  These tests set up that moment exactly:
the tool's answer queued on the loop, not yet seen, when ``cancel()`` is called.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from typing import Any

import pytest

from toolfault import Backoff, Guard, Limits, Outcome

FAST = Backoff(attempts=3, initial=0.001, maximum=0.01, jitter=0.0)
ARGS = {"invoice": "7"}


def capture_futures(guard: Guard, purpose: str) -> list[concurrent.futures.Future[Any]]:
    """The futures of the sync tool runs the guard submits to its ``purpose`` pool."""
    futures: list[concurrent.futures.Future[Any]] = []
    pool = guard._shared.workers.pool(purpose)
    submit = pool.submit

    def capture(*args: Any, **kwargs: Any) -> concurrent.futures.Future[Any]:
        future = submit(*args, **kwargs)
        futures.append(future)
        return future

    pool.submit = capture  # type: ignore[method-assign]
    return futures


async def cancel_as_it_answers(guard: Guard, futures: list[concurrent.futures.Future[Any]],
                               started: threading.Event, release: threading.Event
                               ) -> asyncio.Task[Any]:
    """Start ``acall``, let the tool answer, and cancel the call before the loop saw it."""
    task = asyncio.ensure_future(guard.acall("pay", ARGS))
    while not started.is_set():
        await asyncio.sleep(0.001)
    answered = threading.Event()
    # Registered after the driver's own callback, so when it runs, the answer is queued.
    futures[0].add_done_callback(lambda _: answered.set())
    release.set()
    assert answered.wait(5)  # blocks the loop on purpose: the answer is not seen yet
    task.cancel()
    return task


@pytest.mark.parametrize("check", [True, False], ids=["check", "nocheck"])
@pytest.mark.parametrize("bound", ["deadline", "timeout"])
async def test_a_cancel_that_meets_the_answer_never_runs_the_effect_twice(
        check: bool, bound: str) -> None:
    """The caller gets CancelledError, the ledger does not say the model was told, and the
    retry (at once, or after the thread ended) is not dispatched: one payment."""
    runs: list[str] = []
    started, release = threading.Event(), threading.Event()
    # "deadline": the default guard (acall's own wait_for); "timeout": no deadline, the
    # tool's timeout bounds the attempt (the driver's wait_for, in the caller's task).
    guard = Guard(limits=Limits(backoff=FAST), scan_env_secrets=False,
                  deadline=None if bound == "timeout" else 60.0)

    def landed(args: dict[str, Any]) -> bool:
        return args["invoice"] in runs

    @guard.tool(side_effect=True, timeout=5.0 if bound == "timeout" else None,
                postcondition=landed if check else None)
    def pay(invoice: str) -> str:
        started.set()
        release.wait(5)
        runs.append(invoice)
        return "paid"

    futures = capture_futures(guard, "tools" if bound == "timeout" else "async")
    task = await cancel_as_it_answers(guard, futures, started, release)
    with pytest.raises(asyncio.CancelledError):
        await task
    (entry,) = guard.ledger
    assert entry.told is None  # the answer never reached the caller
    retry = await guard.acall("pay", ARGS)
    assert runs == ["7"]
    assert retry.outcome is Outcome.APPLIED and retry.attempts == 0
    assert retry.code == "already_applied"
    guard.close()
