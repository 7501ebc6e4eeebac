"""Race trials for side effects (a helper, not a test module).

Each trial is one side-effecting call raced by several workers (threads, asyncio tasks or
processes) over one shared store.  The tool writes its effect, then outlives the guard's
timeout (and finally fails), so every worker faces "it timed out: did it land?" and may
retry as a model would.
Effects are counted in files (one per trial), outside any store, so the count is what
actually happened whatever the store believed.  A trial is *duplicated* when its action ran
more than once.
"""

from __future__ import annotations

import os
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from toolfault import Backoff, Guard, Limits, MemoryStore
from toolfault.stores import Store

FAST = Backoff(attempts=3, initial=0.001, maximum=0.01, jitter=0.0)
TOOL_TIMEOUT = 0.02
TOOL_RUNS = 0.05  # the effect lands at once; the answer comes after the timeout


@dataclass
class Tally:
    """Duplicated trials out of trials for one setting."""

    setting: str
    trials: int
    duplicated: int
    max_effects: int
    what: str = "duplicated"  # "over the cap" for the retry-cap settings

    def line(self) -> str:
        unit = "effects" if self.what == "duplicated" else "dispatches"
        return (f"{self.setting}: {self.duplicated}/{self.trials} trials {self.what} "
                f"(max {self.max_effects} {unit} in one trial)")


@dataclass(frozen=True)
class StoreMaker:
    """Opens a handle on one shared store; picklable, so spawned workers can open their own."""

    kind: str  # "sqlite" (target: a file) or "redis" (target: a URL)
    target: str
    prefix: str = "race"

    def __call__(self) -> Store:
        if self.kind == "sqlite":
            from toolfault.stores import SQLiteStore

            return SQLiteStore(self.target, busy_timeout=10.0)
        from toolfault.stores import RedisStore

        return RedisStore(self.target, prefix=self.prefix, socket_timeout=5.0)


def effects_in(folder: Path, trial: str) -> int:
    """How many times the action of one trial ran."""
    path = folder / trial
    return path.stat().st_size if path.exists() else 0


def make_guard(store: Store, folder: Path, *, postcondition: bool, task: str = "t",
               policy: str = "open", explicit: bool = False) -> Guard:
    """A worker's guard with one side-effecting tool that lands, then times out.

    ``explicit``: the tool succeeds at once instead, under an explicit idempotency key (the
    trial): a repeat must be replayed, never run again.
    """
    # TOOLFAULT_RACES_LOCAL=1: side effects may run on a local claim during an outage (the
    # opt-in; a control run showing the outage settings can tell a duplicate when one occurs).
    guard = Guard(store=store, task_id=task, limits=Limits(backoff=FAST),
                  scan_env_secrets=False, state_failure=policy,  # type: ignore[arg-type]
                  local_side_effects=os.environ.get("TOOLFAULT_RACES_LOCAL") == "1")
    if explicit:
        @guard.tool(side_effect=True, idempotency_key=["trial"])
        def send_invoice(trial: str, amount: int) -> str:
            fd = os.open(folder / trial, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            try:
                os.write(fd, b"x")
            finally:
                os.close(fd)
            return "sent"

        return guard

    def landed(args: dict[str, Any]) -> bool:
        return effects_in(folder, str(args["trial"])) > 0

    @guard.tool(side_effect=True, timeout=TOOL_TIMEOUT,
                postcondition=landed if postcondition else None)
    def send_invoice(trial: str, amount: int) -> str:
        fd = os.open(folder / trial, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            os.write(fd, b"x")
        finally:
            os.close(fd)
        time.sleep(TOOL_RUNS)
        # Never a success: a success would make an identical call a new action, and the
        # count of effects could no longer tell a duplicate from a second, legitimate one.
        raise ConnectionError("the connection dropped after the request was sent")

    return guard


def worker_calls(guard: Guard, trial: str, calls: int = 3) -> list[str]:
    """Call the tool as a model would: again after an answer that allows it, at most ``calls``."""
    codes = []
    for _ in range(calls):
        guard.task_id = trial
        result = guard.call("send_invoice", {"trial": trial, "amount": 120})
        codes.append(result.code or "ok")
        if result.ok or result.terminal or result.code in ("already_applied",
                                                            "effect_unknown"):
            break
        time.sleep(TOOL_RUNS / 2)
    return codes


def tally(setting: str, folder: Path, trials: list[str]) -> Tally:
    counts = [effects_in(folder, t) for t in trials]
    return Tally(setting, len(trials), sum(1 for c in counts if c > 1), max(counts, default=0))


def thread_trials(setting: str, make_store: Callable[[], Store], folder: Path, *,
                  workers: int, trials: int, postcondition: bool, lanes: int = 8) -> Tally:
    """``trials`` trials, each raced by ``workers`` threads with a guard (store handle) each.

    ``lanes`` trials run side by side (each its own task), so many trials fit in little time.
    """
    names = [f"{setting}-{uuid.uuid4().hex[:6]}-{i}" for i in range(trials)]
    guards = [[make_guard(make_store(), folder, postcondition=postcondition)
               for _ in range(workers)] for _ in range(lanes)]

    def lane(k: int) -> None:
        barrier = threading.Barrier(workers)

        def one(guard: Guard) -> None:
            for trial in names[k::lanes]:
                barrier.wait()
                worker_calls(guard, trial)

        threads = [threading.Thread(target=one, args=(g,)) for g in guards[k]]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    lane_threads = [threading.Thread(target=lane, args=(k,)) for k in range(lanes)]
    for t in lane_threads:
        t.start()
    for t in lane_threads:
        t.join()
    time.sleep(TOOL_RUNS * 2)
    for row in guards:
        for guard in row:
            guard.close()
    return tally(setting, folder, names)


class _Gate:
    """A cross-process start line: each worker arrives, then all go together.

    A counter in shared memory and a short poll, because ``multiprocessing.Barrier`` can
    hang for good in ``notify_all`` once any waiter timed out.
    """

    def __init__(self, ctx: Any, workers: int) -> None:
        self.count = ctx.Value("i", 0)
        self.workers = workers

    def wait(self, round_: int, timeout: float = 120.0) -> None:
        with self.count.get_lock():
            self.count.value += 1
        goal = self.workers * (round_ + 1)
        deadline = time.monotonic() + timeout
        while self.count.value < goal:
            if time.monotonic() > deadline:
                raise RuntimeError("a race worker never reached the start line")
            time.sleep(0.0005)


def _process_worker(make_store: Callable[[], Store], folder: Path, names: list[str],
                    gates: list[_Gate], postcondition: bool, explicit: bool = False) -> None:
    lanes = len(gates)
    failed: list[BaseException] = []

    def lane(k: int) -> None:
        try:
            run_lane(k)
        except BaseException as exc:
            failed.append(exc)

    def run_lane(k: int) -> None:
        guard = make_guard(make_store(), folder, postcondition=postcondition,
                           explicit=explicit)
        for round_, trial in enumerate(names[k::lanes]):
            gates[k].wait(round_)
            worker_calls(guard, trial)
        time.sleep(TOOL_RUNS * 2)
        if guard.last_degraded_error is not None:
            print(f"race worker degraded: {guard.last_degraded_error}", file=sys.stderr)
        guard.close()

    threads = [threading.Thread(target=lane, args=(k,)) for k in range(lanes)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if failed:
        raise failed[0]


def process_trials(setting: str, make_store: Callable[[], Store], folder: Path, *,
                   workers: int, trials: int, postcondition: bool, lanes: int = 8,
                   explicit: bool = False) -> Tally:
    """``trials`` trials, each raced by ``workers`` spawned processes, ``lanes`` at a time.

    A worker killed by a signal (seen once: SIGSEGV in a worker under 8x8 SQLite load, not
    yet explained) says nothing about duplicates: the setting is run once more with fresh
    trials, and the crash is printed so it is not hidden.
    """
    try:
        return _process_trials(setting, make_store, folder, workers=workers, trials=trials,
                               postcondition=postcondition, lanes=lanes, explicit=explicit)
    except _WorkerKilled as killed:
        print(f"race setting {setting}: {killed}; rerunning it once", file=sys.stderr)
        return _process_trials(setting, make_store, folder, workers=workers, trials=trials,
                               postcondition=postcondition, lanes=lanes, explicit=explicit)


class _WorkerKilled(RuntimeError):
    """A race worker died from a signal (not an assertion about effects)."""


def _process_trials(setting: str, make_store: Callable[[], Store], folder: Path, *,
                    workers: int, trials: int, postcondition: bool, lanes: int,
                    explicit: bool = False) -> Tally:
    """Spawned, not forked: a fork of a threaded test process can inherit a held lock."""
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    names = [f"{setting}-{uuid.uuid4().hex[:6]}-{i}" for i in range(trials)]
    gates = [_Gate(ctx, workers) for _ in range(lanes)]
    procs = [ctx.Process(target=_process_worker,
                         args=(make_store, folder, names, gates, postcondition, explicit))
             for _ in range(workers)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(300)
    for p in procs:
        if p.is_alive():  # stuck: end it, and fail the setting below
            p.kill()
            p.join(10)
    codes = [p.exitcode for p in procs]
    if any(code is not None and code < 0 for code in codes):
        raise _WorkerKilled(f"a race worker was killed by a signal: exit codes {codes}")
    if codes != [0] * workers:
        raise RuntimeError(f"a race worker failed: exit codes {codes}")
    return tally(setting, folder, names)


def gather_trials(setting: str, folder: Path, *, workers: int, trials: int,
                  postcondition: bool, lanes: int = 10) -> Tally:
    """Each trial: ``workers`` identical ``acall``s of a sync tool in one ``asyncio.gather``,
    then the same again once the first answers are in (a model retrying)."""
    import asyncio

    names = [f"{setting}-{uuid.uuid4().hex[:6]}-{i}" for i in range(trials)]
    guard = make_guard(MemoryStore(), folder, postcondition=postcondition)

    async def trial(name: str) -> None:
        scoped = guard.scoped(name)
        args = {"trial": name, "amount": 120}
        for _ in range(2):
            await asyncio.gather(*(scoped.acall("send_invoice", args) for _ in range(workers)))
            await asyncio.sleep(TOOL_RUNS / 2)

    async def main() -> None:
        for start in range(0, trials, lanes):
            await asyncio.gather(*(trial(n) for n in names[start:start + lanes]))

    asyncio.run(main())
    time.sleep(TOOL_RUNS * 2)
    guard.close()
    return tally(setting, folder, names)


def cancel_trials(setting: str, folder: Path, *, trials: int, postcondition: bool,
                  lanes: int = 10, stalls: bool = False) -> Tally:
    """Each trial: ``acall`` of a slow sync side effect, cancelled once the tool started (its
    effect lands later), then retried at once and again once it ended (as an agent framework
    that gave up would).

    ``stalls``: the event loop is blocked now and then (up to 80 ms, as a busy CI machine
    does), so a cancel often meets the tool's answer already queued on the loop: the race
    that once ran an effect three times (Python 3.11's ``wait_for`` kept the answer and
    dropped the cancellation).
    """
    import asyncio
    import random

    names = [f"{setting}-{uuid.uuid4().hex[:6]}-{i}" for i in range(trials)]
    guard = Guard(limits=Limits(backoff=FAST), scan_env_secrets=False)

    def landed(args: dict[str, Any]) -> bool:
        return effects_in(folder, str(args["trial"])) > 0

    @guard.tool(side_effect=True, postcondition=landed if postcondition else None)
    def send_invoice(trial: str, amount: int) -> str:
        (folder / f"{trial}.started").touch()
        time.sleep(TOOL_RUNS)  # the effect lands at the end, after the caller gave up
        with (folder / trial).open("a") as f:
            f.write("x")
        return "sent"

    async def trial(name: str) -> None:
        scoped = guard.scoped(name)
        args = {"trial": name, "amount": 120}
        task = asyncio.ensure_future(scoped.acall("send_invoice", args))
        while not (folder / f"{name}.started").exists() and not task.done():
            await asyncio.sleep(0.001)
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            pass
        await scoped.acall("send_invoice", args)
        await asyncio.sleep(TOOL_RUNS * 2)
        await scoped.acall("send_invoice", args)

    async def stall() -> None:
        while True:
            await asyncio.sleep(random.random() * 0.02)
            time.sleep(random.random() * 0.08)  # blocking the loop is the point

    async def main() -> None:
        staller = asyncio.ensure_future(stall()) if stalls else None
        for start in range(0, trials, lanes):
            await asyncio.gather(*(trial(n) for n in names[start:start + lanes]))
        if staller is not None:
            staller.cancel()

    asyncio.run(main())
    time.sleep(TOOL_RUNS * 2)
    guard.close()
    return tally(setting, folder, names)


def cap_gather_trials(setting: str, *, calls: int, trials: int, limit: int = 2) -> Tally:
    """Each trial: ``calls`` identical failing ``acall``s in one ``gather`` with retry limit
    ``limit``; a trial is counted when more than ``limit`` of them were dispatched."""
    import asyncio

    guard = Guard(limits=Limits(retry_limit=limit, backoff=FAST), scan_env_secrets=False)
    runs: dict[str, int] = {}
    lock = threading.Lock()

    @guard.tool
    def charge(card: str) -> str:
        with lock:
            runs[card] = runs.get(card, 0) + 1
        time.sleep(0.005)
        raise ValueError("card must be a valid card number")

    names = [f"card-{i}" for i in range(trials)]

    async def main() -> None:
        for name in names:
            await asyncio.gather(*(guard.acall("charge", {"card": name}) for _ in range(calls)))

    asyncio.run(main())
    guard.close()
    over = [runs.get(n, 0) for n in names]
    return Tally(setting, trials, sum(1 for n in over if n > limit), max(over, default=0),
                 "over the cap")


def cap_thread_trials(setting: str, *, threads: int, trials: int, limit: int = 2) -> Tally:
    """Each trial: ``threads`` threads make one identical failing call each (sync ``call``)."""
    guard = Guard(limits=Limits(retry_limit=limit, backoff=FAST), scan_env_secrets=False)
    runs: dict[str, int] = {}
    lock = threading.Lock()

    @guard.tool
    def charge(card: str) -> str:
        with lock:
            runs[card] = runs.get(card, 0) + 1
        time.sleep(0.001)
        raise ValueError("card must be a valid card number")

    names = [f"card-{i}" for i in range(trials)]
    barrier = threading.Barrier(threads)

    def one() -> None:
        for name in names:
            barrier.wait()
            guard.call("charge", {"card": name})

    pool = [threading.Thread(target=one) for _ in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    guard.close()
    over = [runs.get(n, 0) for n in names]
    return Tally(setting, trials, sum(1 for n in over if n > limit), max(over, default=0),
                 "over the cap")


def sequential_key_trials(setting: str, make_store: Callable[[], Store], folder: Path, *,
                          trials: int, repeats: int = 3) -> Tally:
    """Each trial: the same successful call under an explicit key, ``repeats`` times in a
    row from one worker, and once more from a second worker (another store handle)."""
    names = [f"{setting}-{uuid.uuid4().hex[:6]}-{i}" for i in range(trials)]
    first = make_guard(make_store(), folder, postcondition=False, explicit=True)
    second = make_guard(make_store(), folder, postcondition=False, explicit=True)
    for name in names:
        for _ in range(repeats):
            worker_calls(first, name, 1)
        worker_calls(second, name, 1)
    first.close()
    second.close()
    return tally(setting, folder, names)


def _remote_retrier(url: str, prefix: str, policy: str, folder: Path, lanes: int,
                    inbox: Any, outbox: Any, explicit: bool = False) -> None:
    """Worker B, in a process of its own: one guard per lane; each batch of trial names it
    is sent, it calls as a model would (up to 3 calls per trial), then says so."""
    from toolfault.stores import RedisStore

    guards = [make_guard(RedisStore(url, prefix=prefix, socket_timeout=0.2), folder,
                         postcondition=True, policy=policy, explicit=explicit)
              for _ in range(lanes)]
    outbox.put("ready")
    while (names := inbox.get()) is not None:
        threads = [threading.Thread(target=worker_calls, args=(g, n, 3))
                   for g, n in zip(guards, names, strict=False)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        outbox.put("done")
    for guard in guards:
        guard.close()


def outage_trials(setting: str, url: str, folder: Path, *, down: Callable[[], None],
                  up: Callable[[], None], trials: int, delay: float, policy: str = "open",
                  lanes: int = 50, explicit: bool = False) -> Tally:
    """Rounds of ``lanes`` trials: worker A's call lands, then Redis goes down while the call
    is still in flight (its answer and release meet the outage), or (every other trial) A
    makes its call during the outage; Redis comes back; ``delay``
    seconds later worker B, in another process, retries each trial as a model would; then
    A retries too.  ``policy``: the guards' ``state_failure``.  ``explicit``: the call
    succeeds under an explicit key, and ended before the outage (a repeat after success)."""
    import multiprocessing

    from toolfault.stores import RedisStore

    names = [f"{setting}-{uuid.uuid4().hex[:6]}-{i}" for i in range(trials)]
    prefix = f"race{uuid.uuid4().hex[:8]}"
    ctx = multiprocessing.get_context("spawn")
    inbox, outbox = ctx.Queue(), ctx.Queue()
    remote = ctx.Process(target=_remote_retrier,
                         args=(url, prefix, policy, folder, lanes, inbox, outbox, explicit))
    remote.start()
    try:
        outbox.get(timeout=120)
        guards = [make_guard(RedisStore(url, prefix=prefix, socket_timeout=0.2), folder,
                             postcondition=True, policy=policy, explicit=explicit)
                  for _ in range(lanes)]
        for start in range(0, trials, lanes):
            batch = names[start:start + lanes]
            threads = [threading.Thread(target=worker_calls, args=(a, n, 1))
                       for a, n in zip(guards, batch, strict=False)]
            for t in threads[0::2]:  # in flight when the outage begins
                t.start()
            deadline = time.monotonic() + 2
            while (time.monotonic() < deadline
                   and not all(effects_in(folder, n) for n in batch[0::2])):
                time.sleep(0.001)
            if explicit:  # a repeat after success: the first calls ended
                for t in threads[0::2]:
                    t.join()
            down()  # the effects landed; the calls are still in flight
            for t in threads[1::2]:  # made during the outage
                t.start()
            for t in threads:
                t.join()
            time.sleep(0.3)
            up()  # returns once Redis answers again
            time.sleep(delay)
            inbox.put(batch)
            outbox.get(timeout=300)
            for a, n in zip(guards, batch, strict=False):
                worker_calls(a, n, 1)
        for guard in guards:
            guard.close()
    finally:
        inbox.put(None)
        remote.join(60)
        if remote.is_alive():
            remote.kill()
    return tally(setting, folder, names)
