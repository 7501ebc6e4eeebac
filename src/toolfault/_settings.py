"""What the guard's parts receive: its settings, the scope a call counts in, the shared parts.

The facade (:class:`~toolfault.Guard`) builds these three and hands each part only what it
uses, so no part reads the guard and each can be built and tested alone:

* :class:`Settings` -- what the guard decides by, fixed at construction (a scope shares it);
* :class:`Scope` -- where calls count: the task, the turn and the mode, which change;
* :class:`Shared` -- what every scope of one guard shares: tools, store, observers, pools.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from toolfault._catalog import Catalog
from toolfault._degrading import DegradingStore
from toolfault._limits import Limits
from toolfault._progress import Progress
from toolfault._redact import Redactor
from toolfault._tool import ErrorDetector, ToolSpec
from toolfault._trace import CallEvent, JsonlSink
from toolfault._workers import Workers

Mode = Literal["observe", "shape", "enforce"]


@dataclass(frozen=True, slots=True)
class Settings:
    """What a guard decides by (see :class:`~toolfault.Guard` for each one's meaning)."""

    limits: Limits
    catalog: Catalog
    #: Seconds a whole call may take, retries, waits and checks included (``None``: no bound).
    deadline: float | None
    #: Run every sync tool in a worker thread, so the deadline bounds even a stuck body.
    isolate_sync_tools: bool
    #: Counts an error message's tokens against the catalog's budget.
    count_tokens: Callable[[str], int]
    capture_content: bool
    error_result: ErrorDetector | None
    #: Seconds a success under an explicit idempotency key is replayed, not run again.
    idempotency_retention: float


class Scope:
    """Where calls count: one per guard or :meth:`~toolfault.Guard.scoped` scope.

    Mutable on purpose: a new turn, a new task or another mode changes it for every part of
    the scope at once (they all hold this object)."""

    __slots__ = ("last_degraded_error", "mode", "task_id", "turn")

    def __init__(self, task_id: str, mode: Mode, turn: int = 0) -> None:
        self.task_id = task_id
        self.mode: Mode = mode
        self.turn = turn
        #: The type name of the last error that made the store unreachable, if any.
        self.last_degraded_error: str | None = None

    def __repr__(self) -> str:
        return f"Scope(task_id={self.task_id!r}, mode={self.mode!r}, turn={self.turn})"


@dataclass(frozen=True, slots=True)
class Shared:
    """What every scope of one guard shares (close the guard, not a scope)."""

    tools: dict[str, ToolSpec]
    store: DegradingStore
    progress: Progress
    observers: list[Callable[[CallEvent], None]]
    sink: JsonlSink | None
    workers: Workers
    redactor: Redactor
    sleep: Callable[[float], None]
    #: Seconds for expiring blocks (``Limits.block_seconds``); injectable for tests.
    clock: Callable[[], float]
