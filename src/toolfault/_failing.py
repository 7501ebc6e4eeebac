"""Failures: how a failure is counted against its fingerprint's cap and worded.

Every part that refuses or fails a call -- the pipeline, budgets, side effects -- answers
through :meth:`Failures.fail`: the identical-failure count in the store, the ladder's note
of the tool's failures in a row, and at the cap the terminal message and an incident.
"""

from __future__ import annotations

import hashlib
import json

from toolfault._admission import CallKey
from toolfault._call import _Call, resolve_fp
from toolfault._catalog import Catalog
from toolfault._classify import Failure, from_entry
from toolfault._degrading import DegradingStore, best_effort
from toolfault._emission import Emitter
from toolfault._errors import StateUnavailableError
from toolfault._ladder import Ladder
from toolfault._limits import Limits
from toolfault._message import echo_args
from toolfault._records import IncidentKind
from toolfault._result import ToolResult
from toolfault._settings import Scope, Settings
from toolfault._shaping import Shaper
from toolfault._tool import ToolSpec


class Failures:
    """Counts and words one scope's failures (the store keeps the counts)."""

    def __init__(self, settings: Settings, scope: Scope, tools: dict[str, ToolSpec],
                 store: DegradingStore, shaper: Shaper, ladder: Ladder,
                 emitter: Emitter) -> None:
        self._limits: Limits = settings.limits
        self._catalog: Catalog = settings.catalog
        self._scope = scope
        self._tools = tools
        self._store = store
        self._shaper = shaper
        self._ladder = ladder
        self._emitter = emitter

    def fail(self, call: _Call, failure: Failure, *, count: bool = True) -> ToolResult:
        """Shape a failure; count it for the fingerprint; the terminal message at the cap."""
        if failure.param is None:  # inferred once: the record, the words and the moves use it
            failure.param = self._shaper.param_in(call, failure.reason)
        if not count or call.refused:  # a refusal: worded, never counted
            return self._shaper.four_part(call, failure, self._shaper.alternatives(call, failure))
        limit = self._limit(call, failure)
        failures = self._count(call, failure, limit)
        blocked = self._ladder.note_failure(call, failure, terminal=failures >= limit)
        if blocked is not None:
            if self._scope.mode == "enforce":
                return blocked
            call.shadow["would_block_tool"] = True
        alternatives = self._shaper.alternatives(call, failure)
        if failures >= limit and self._scope.mode == "enforce":
            self._emitter.incident(IncidentKind.RETRY_CAP, call.name, failure.code,
                                   f"{failures} identical failing calls (limit {limit})")
            return self._shaper.terminal(call, failure, failures, alternatives,
                                         blocked_for=self._limits.block_seconds)
        return self._shaper.four_part(call, failure, alternatives)

    def _limit(self, call: _Call, failure: Failure) -> int:
        """The cap of identical failures: the catalog row's, the tool's, else the limits'."""
        spec = call.spec
        row_limit = failure.entry.retry_limit or (spec.retry_limit if spec else None)
        return self._limits.limit_for(failure.failure_class, row_limit)

    def _count(self, call: _Call, failure: Failure, limit: int) -> int:
        """Record one more identical failure in the store; how many there are now (0 when
        the call has no key or the store cannot count)."""
        if call.spec is not None and not call.fp:
            resolve_fp(call, self._scope)
        if call.key is None:
            return 0
        # A failure worded differently than last time is progress: its count starts over.
        if self._ladder.failure_changed(call, failure):
            best_effort(self._store.clear_failures, call.key)
        try:
            failures = self._store.record_failure(call.key, self._shaper.pack(call, failure),
                                                  limit)
        except StateUnavailableError:
            failures = 0
        if failures >= limit and self._scope.mode != "enforce":
            call.shadow["would_be_terminal"] = True
        return failures

    def fail_unscoped(self, call: _Call, code: str, reason: str) -> ToolResult:
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
        call.key = CallKey(self._scope.task_id, self._scope.turn, call.fp)
        return self.fail(call, from_entry(self._catalog.get(code), reason))

