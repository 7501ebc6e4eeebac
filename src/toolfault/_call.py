"""One call in flight, and the steps the pipeline asks its driver to perform (internal).

The decision pipeline (:mod:`toolfault._pipeline`) is a generator: it yields a
:class:`Dispatch`, :class:`Verify` or :class:`Sleep` step whenever it needs the outside world
and is sent back what happened.  The two drivers (:mod:`toolfault._drivers`) are the only code
that runs a tool, a postcondition or a wait, one with threads, one with ``await``.
"""

from __future__ import annotations

import concurrent.futures
import itertools
import os
import secrets
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Any

from toolfault._admission import Admission, AdmissionRequest, CallKey, LazyFingerprint
from toolfault._fingerprint import fingerprint
from toolfault._records import LedgerEntry
from toolfault._settings import Scope
from toolfault._tool import ToolSpec

#: What the parser returns for arguments that are not a JSON object (the reason is kept).
NOT_JSON: Any = object()

_ids = itertools.count(1)
#: ``call_``, 12 random hex digits and ``_``: what every id this process makes starts with
#: (the random part keeps ids unique across processes and hosts).
_id_head = f"call_{secrets.token_hex(6)}_"


def _reseed_ids() -> None:
    global _id_head
    _id_head = f"call_{secrets.token_hex(6)}_"


os.register_at_fork(after_in_child=_reseed_ids)


def _new_call_id() -> str:
    """Unique across processes and hosts (workers sharing a task share one ledger), cheaply."""
    return f"{_id_head}{next(_ids)}"


def own_call_id(call_id: str) -> bool:
    """Whether ``call_id`` is one :func:`_new_call_id` made in this process: its random head
    and a counter's ASCII digits, none of a caller's text, so no secret can be in it (the
    trace and spans write it unredacted).  A framework's or provider's id (``call_…``,
    ``toolu_…``) never has this process's head, and one that only starts with it is not
    one."""
    if type(call_id) is not str or not call_id.startswith(_id_head):
        return False
    tail = call_id[len(_id_head):]
    return tail.isascii() and tail.isdecimal()


@dataclass(frozen=True, slots=True)
class Dispatch:
    """Run the tool's body once; send back a :class:`_Value` or a :class:`_Raised`."""


@dataclass(frozen=True, slots=True)
class Verify:
    """Run the tool's postcondition; send back its verdict (``Outcome`` or ``None``)."""


@dataclass(frozen=True, slots=True)
class Sleep:
    """Wait before the next attempt (already clamped to the call's deadline)."""

    seconds: float


DISPATCH = Dispatch()
VERIFY = Verify()
Step = Dispatch | Verify | Sleep


class _Call:
    """One call in progress (internal).

    A plain class on purpose: the fields most calls never read are class-level defaults, so
    building one sets eleven attributes and two dicts, not twenty (one is built per call).
    """

    #: The fingerprint, once computed ("" until then).
    fp: str = ""
    #: The fingerprint as admitted (perhaps not computed yet: see ``LazyFingerprint``).
    fingerprint: LazyFingerprint | None = None
    key: CallKey | None = None
    admission: Admission | None = None
    #: The request the call was admitted with: it settles the reservation.
    request: AdmissionRequest | None = None
    idem: str | None = None
    held: bool = False
    #: Who claimed the idempotency key (one random token per claim): only it may release it.
    holder: str = ""
    orphan: concurrent.futures.Future[Any] | None = None
    entry: LedgerEntry | None = None
    attempts: int = 0
    dispatched: bool = False
    replayable: bool = False
    #: Enforce would have refused this call (observe and shape modes run it anyway): its
    #: outcome is counted nowhere, so the counts stay what enforce would have.
    refused: bool = False
    #: The call's place among the calls of its turn admitted so far, and that turn's state
    #: (see ``Ladder.started``); ``None`` once it has been recorded.
    ticket: int | None = None
    running_in: Any = None
    #: ``kwargs`` are the validated arguments already (see ``Pipeline.admit``).
    validated: bool = False
    #: ``args`` has its keys in sorted order (validated from JSON text by the tool's twin).
    sorted_args: bool = False
    #: The arguments were JSON text the fast parser took whole (see ``_lazy_json``).
    plain_json: bool = False

    def __init__(self, spec: ToolSpec | None, name: str, args: Any, call_id: str,
                 started: float) -> None:
        self.spec = spec
        self.name = name
        self.args = args
        self.call_id = call_id
        self.started = started
        self.kwargs: dict[str, Any] = {}
        self.shadow: dict[str, Any] = {}

    def __repr__(self) -> str:
        return f"_Call(name={self.name!r}, call_id={self.call_id!r}, attempts={self.attempts})"


def resolve_fp(call: _Call, scope: Scope) -> str | None:
    """Fingerprint the call (once) and set its counter key in ``scope``; returns why the
    arguments are unusable, if they are.  A lazy fingerprint is resolved (and cached for the
    store)."""
    if call.fp:
        return None
    fp = call.fingerprint
    if fp is not None:  # only plain arguments are fingerprinted lazily: it cannot fail
        call.fp = fp()
    else:
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
    call.key = CallKey(scope.task_id, scope.turn, call.fp)
    return None


class _Value:
    """What a tool returned (wrapped: ``None`` is a value too).  Read-only by convention:
    a plain slotted class, one per attempt (a frozen dataclass costs a setattr per field)."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value


class _Raised:
    """What a tool raised."""

    __slots__ = ("exc",)

    def __init__(self, exc: Exception) -> None:
        self.exc = exc


def _run_coroutine(awaitable: Awaitable[Any], *, timeout: float | None = None) -> Any:
    """Run a coroutine from sync code, also when this thread already runs an event loop."""
    import asyncio  # only an async tool called from sync code needs it

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


