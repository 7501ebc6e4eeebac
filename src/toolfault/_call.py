"""One call in flight, and the small machinery every stage of a call shares (internal)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import os
import secrets
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import Any

from toolfault._classify import Failure
from toolfault._records import LedgerEntry
from toolfault._state import Admission, CallKey
from toolfault._tool import ToolSpec

_ids = itertools.count(1)
_id_prefix = secrets.token_hex(6)


def _reseed_ids() -> None:
    global _id_prefix
    _id_prefix = secrets.token_hex(6)


os.register_at_fork(after_in_child=_reseed_ids)


def _new_call_id() -> str:
    """Unique across processes and hosts (workers sharing a task share one ledger), cheaply."""
    return f"call_{_id_prefix}_{next(_ids)}"



class _Retry(Exception):
    """Raised inside the retry loop to ask tenacity for another attempt."""

    def __init__(self, failure: Failure) -> None:
        super().__init__(failure.code)
        self.failure = failure



@dataclass(slots=True)
class _Call:
    """One call in progress (internal)."""

    spec: ToolSpec | None
    name: str
    args: Any
    call_id: str
    started: float
    fp: str = ""
    key: CallKey | None = None
    kwargs: dict[str, Any] = field(default_factory=dict)
    admission: Admission | None = None
    idem: str | None = None
    held: bool = False
    reserved: CallKey | None = None
    orphan: concurrent.futures.Future[Any] | None = None
    entry: LedgerEntry | None = None
    attempts: int = 0
    dispatched: bool = False
    entered: bool = False
    replayable: bool = False
    span: Any = None
    shadow: dict[str, Any] = field(default_factory=dict)



@dataclass(frozen=True, slots=True)
class _Value:
    value: Any



def _run_coroutine(awaitable: Awaitable[Any], *, timeout: float | None = None) -> Any:
    """Run a coroutine from sync code, also when this thread already runs an event loop."""

    async def runner() -> Any:
        if timeout is None:
            return await awaitable
        try:
            return await asyncio.wait_for(awaitable, timeout)
        except TimeoutError:
            raise TimeoutError(f"timed out after {timeout}s") from None

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(runner())
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, runner()).result()


